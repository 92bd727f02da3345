"""The node-local Dealer driven message by message on fake transports: Advanced Profile edges of RPC."""

from __future__ import annotations

from typing import Any

import pytest
from autobahn.wamp import message
from autobahn.wamp.role import RoleCalleeFeatures, RoleCallerFeatures
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from pubsubclub.core.hub import Hub
from pubsubclub.frontends.wamp import WampRouter
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
from pubsubclub.frontends.wamp.router import WampLimits
from pubsubclub.testing import MemoryWampTransport


def joined(router: WampRouter, interruptible: bool = False) -> tuple[Any, MemoryWampTransport]:
    """A caller-and-callee session on a fake transport; ``interruptible``: it announces call canceling."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    roles = {
        "caller": RoleCallerFeatures(call_canceling=True),
        "callee": RoleCalleeFeatures(call_canceling=interruptible),
    }
    session.onMessage(message.Hello("realm1", roles))
    assert isinstance(transport.sent[-1], message.Welcome)
    transport.sent.clear()
    return session, transport


def registered(session: Any, transport: MemoryWampTransport, procedure: str) -> int:
    """REGISTER ``procedure``; the registration id."""
    session.onMessage(message.Register(1, procedure))
    answer = transport.sent.pop()
    assert isinstance(answer, message.Registered)
    return int(answer.registration)


def invoked(
    session: Any,
    caller_transport: MemoryWampTransport,
    callee_transport: MemoryWampTransport,
    request: int,
    procedure: str,
    **options: Any,
) -> message.Invocation:
    """CALL ``procedure`` as request ``request``; the INVOCATION the callee got."""
    session.onMessage(message.Call(request, procedure, **options))
    assert caller_transport.sent == []
    invocation = callee_transport.sent.pop()
    assert isinstance(invocation, message.Invocation)
    return invocation


def test_welcome_announces_call_canceling() -> None:
    """The dealer offers call canceling (Autobahn's Deferred.cancel sends CANCEL whatever the dealer offers)."""
    router = WampRouter(Hub())
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    session.onMessage(message.Hello("realm1", {"caller": RoleCallerFeatures()}))
    assert transport.sent[-1].roles["dealer"].call_canceling is True


@pytest.mark.parametrize("mode", [None, "skip", "kill", "killnowait"])
def test_cancel_answers_the_caller_and_keeps_its_session(mode: str | None) -> None:
    """CANCEL of a pending call: the caller gets ERROR wamp.error.canceled at once and stays joined;
    a callee that announced call canceling gets INTERRUPT (not in mode skip); a late YIELD goes nowhere."""
    router = WampRouter(Hub())
    callee, callee_t = joined(router, interruptible=True)
    caller, caller_t = joined(router)
    registered(callee, callee_t, "com.example.slow")
    invocation = invoked(caller, caller_t, callee_t, 7, "com.example.slow")
    caller.onMessage(message.Cancel(7, mode=mode))
    assert [(type(m), m.request, m.error) for m in caller_t.sent] == [(message.Error, 7, "wamp.error.canceled")]
    assert caller_t.sent[0].request_type == message.Call.MESSAGE_TYPE
    caller_t.sent.clear()
    if mode == "skip":
        assert callee_t.sent == []
    else:
        assert [(type(m), m.request, m.mode) for m in callee_t.sent] == [
            (message.Interrupt, invocation.request, "killnowait")
        ]
    callee.onMessage(message.Yield(invocation.request, args=["late"]))
    callee.onMessage(message.Error(message.Invocation.MESSAGE_TYPE, invocation.request, "wamp.error.canceled"))
    assert caller_t.sent == []
    assert router.dealer.calls_in_flight() == 0
    caller.onMessage(message.Cancel(7))  # already over: ignored, as the spec asks
    assert caller_t.sent == [] and caller_t.open


def test_cancel_of_a_callee_without_call_canceling_skips() -> None:
    """A callee that did not announce call canceling never gets INTERRUPT (mode skip), whatever the caller asks."""
    router = WampRouter(Hub())
    callee, callee_t = joined(router, interruptible=False)
    caller, caller_t = joined(router)
    registered(callee, callee_t, "com.example.slow")
    invoked(caller, caller_t, callee_t, 3, "com.example.slow")
    caller.onMessage(message.Cancel(3, mode="kill"))
    assert [m.error for m in caller_t.sent] == ["wamp.error.canceled"]
    assert callee_t.sent == []


def test_cancel_of_another_sessions_call_is_ignored() -> None:
    """CANCEL names a request id of the caller's own session: another session's id cancels nothing."""
    router = WampRouter(Hub())
    callee, callee_t = joined(router, interruptible=True)
    caller, caller_t = joined(router)
    other, other_t = joined(router)
    registered(callee, callee_t, "com.example.slow")
    invocation = invoked(caller, caller_t, callee_t, 5, "com.example.slow")
    other.onMessage(message.Cancel(5))
    assert other_t.sent == [] and callee_t.sent == []
    callee.onMessage(message.Yield(invocation.request, args=["done"]))
    assert [(type(m), m.request, m.args) for m in caller_t.sent] == [(message.Result, 5, ["done"])]


def test_a_timed_out_call_interrupts_its_callee() -> None:
    """CALL timeout (ms): the caller gets wamp.error.timeout, an interruptible callee INTERRUPT; no timer left."""
    clock = Clock()
    router = WampRouter(Hub(), call_later=clock.callLater)
    callee, callee_t = joined(router, interruptible=True)
    caller, caller_t = joined(router)
    registered(callee, callee_t, "com.example.slow")
    invocation = invoked(caller, caller_t, callee_t, 9, "com.example.slow", timeout=250)
    assert invocation.timeout == 250
    clock.advance(0.249)
    assert caller_t.sent == []
    clock.advance(0.001)
    assert [m.error for m in caller_t.sent] == ["wamp.error.timeout"]
    assert [(type(m), m.request) for m in callee_t.sent] == [(message.Interrupt, invocation.request)]
    assert clock.getDelayedCalls() == []


def test_pattern_registrations_exact_then_longest_prefix_then_wildcard() -> None:
    """A CALL goes to the exact registration, else the longest matching prefix, else a matching wildcard; a
    pattern's INVOCATION names the procedure called (details.procedure)."""
    router = WampRouter(Hub())
    caller, caller_t = joined(router)
    callee, callee_t = joined(router)
    regs = {}
    for request, (uri, match) in enumerate(
        [("com.app.add", None), ("com.app.", "prefix"), ("com.", "prefix"), ("com..add", "wildcard")], 1
    ):
        callee.onMessage(message.Register(request, uri, match=match))
        answer = callee_t.sent.pop()
        assert isinstance(answer, message.Registered)
        regs[uri] = answer.registration
    got = []
    for request, uri in enumerate(["com.app.add", "com.app.sub", "com.x.y", "org.x.add"], 10):
        caller.onMessage(message.Call(request, uri))
        if uri == "org.x.add":
            assert [m.error for m in caller_t.sent] == ["wamp.error.no_such_procedure"]
            continue
        invocation = callee_t.sent.pop()
        got.append((uri, invocation.registration, invocation.procedure))
    assert got == [
        ("com.app.add", regs["com.app.add"], None),
        ("com.app.sub", regs["com.app."], "com.app.sub"),
        ("com.x.y", regs["com."], "com.x.y"),
    ]
    callee.onMessage(message.Unregister(20, regs["com."]))
    caller.onMessage(message.Call(21, "com.x.add"))
    assert callee_t.sent[-1].registration == regs["com..add"]


@pytest.mark.parametrize(
    ("invoke", "order"),
    [("roundrobin", [0, 1, 2, 0]), ("first", [0, 0, 0, 0]), ("last", [2, 2, 2, 2])],
)
def test_shared_registration_policies(invoke: str, order: list[int]) -> None:
    """Shared registrations of one policy spread calls as the policy says; another policy, or single, is
    refused with procedure_already_exists."""
    ticks = iter(range(100))
    router = WampRouter(Hub())
    router.dealer.clock = lambda: float(next(ticks))
    caller, caller_t = joined(router)
    callees = [joined(router) for _ in range(3)]
    for session, transport in callees:
        session.onMessage(message.Register(4, "com.example.add", invoke=invoke))
        assert isinstance(transport.sent.pop(), message.Registered)
    other, other_t = joined(router)
    for policy in ("single", "random" if invoke != "random" else "first"):
        other.onMessage(message.Register(5, "com.example.add", invoke=policy))
        answer = other_t.sent.pop()
        assert isinstance(answer, message.Error) and answer.error == "wamp.error.procedure_already_exists"
    got = []
    for request in range(4):
        caller.onMessage(message.Call(10 + request, "com.example.add"))
        got.append(next(i for i, (_, t) in enumerate(callees) if t.sent and t.sent.pop()))
    assert got == order


def test_yield_from_a_session_that_was_not_invoked_is_dropped() -> None:
    """A YIELD or ERROR for another callee's invocation id reaches nobody; the real callee still answers."""
    router = WampRouter(Hub())
    callee, callee_t = joined(router)
    caller, caller_t = joined(router)
    stranger, _ = joined(router)
    registered(callee, callee_t, "com.example.add")
    invocation = invoked(caller, caller_t, callee_t, 2, "com.example.add")
    stranger.onMessage(message.Yield(invocation.request, args=["forged"]))
    stranger.onMessage(message.Error(message.Invocation.MESSAGE_TYPE, invocation.request, "com.example.forged"))
    assert caller_t.sent == []
    callee.onMessage(message.Yield(invocation.request, args=[3]))
    assert [(m.request, m.args) for m in caller_t.sent] == [(2, [3])]


def test_rpc_permissions_are_checked_on_hub_topics_like_publish() -> None:
    """With --auth, REGISTER and CALL in a further realm are checked on ``$realm.<realm>#<uri>``, as a PUBLISH is:
    realm2's own role allowed ``com.`` gets RPC there; a realm2 role allowed only ``other.`` does not, even though
    the plain realm's role of the same name is allowed ``com.``."""
    for role, allowed in (("one", False), ("two", True)):
        realm2 = AuthPolicy(roles=(Role("one", publish=("other.",)), Role("two", publish=("com.",))), anonymous=role)
        plain = (Role("one", publish=("com.",)), Role("two"))
        auth = AuthPolicy(roles=plain, anonymous=role, realms={"realm2": realm2})
        router = WampRouter(Hub(), ("realm1", "realm2"), auth=auth)
        session = router.session_factory()
        transport = MemoryWampTransport()
        session.onOpen(transport)
        session.onMessage(message.Hello("realm2", {"callee": RoleCalleeFeatures()}))
        session.onMessage(message.Register(1, "com.example.add"))
        session.onMessage(message.Call(2, "com.example.add"))
        session.onMessage(message.Publish(3, "com.example.t", acknowledge=True))
        answers = [(type(m).__name__, getattr(m, "error", None)) for m in transport.sent[1:]]
        if allowed:
            assert [a for a, _ in answers] == ["Registered", "Invocation", "Published"], answers
        else:
            assert answers == [("Error", "wamp.error.not_authorized")] * 3


def _brute_force(keys: list[tuple[str, str, str]], realm: str, procedure: str) -> tuple[str, str, str] | None:
    """The dealer's rule by a scan of every pattern: longest matching prefix, else the best matching wildcard."""
    from pubsubclub.frontends.wamp.registrations import _wildcard

    best: tuple[int, int, str] | None = None
    found = None
    for key in keys:
        if key[0] != realm:
            continue
        if key[1] == "prefix" and procedure.startswith(key[2]):
            rank = (1, len(key[2]), key[2])
        elif key[1] == "wildcard" and _wildcard(key[2], procedure):
            rank = (0, sum(1 for p in key[2].split(".") if p), key[2])
        else:
            continue
        if best is None or rank > best:
            best, found = rank, key
    return found


_part = st.sampled_from(["a", "b", "c", ""])


@settings(max_examples=150, deadline=None)
@given(
    patterns=st.lists(
        st.tuples(
            st.sampled_from(["r1", "r2"]),
            st.sampled_from(["prefix", "wildcard"]),
            st.lists(_part, min_size=1, max_size=4),
        ),
        max_size=12,
    ),
    removed=st.lists(st.integers(0, 11), max_size=4),
    called=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4),
)
def test_pattern_index_picks_what_a_scan_picks(patterns: list[Any], removed: list[int], called: list[str]) -> None:
    """PatternIndex (no scan of all patterns) finds the registration a scan of every pattern finds."""
    from pubsubclub.frontends.wamp.registrations import PatternIndex

    index = PatternIndex()
    groups: dict[Any, list[Any]] = {}
    for realm, match, parts in patterns:
        key = (realm, match, ".".join(parts) if match == "wildcard" else "".join(parts) or "a")
        if key not in groups:
            groups[key] = [object()]
            index.add(key)
    for i in removed:
        keys = list(groups)
        if i < len(keys):
            del groups[keys[i]]
            index.remove(keys[i])
    procedure = ".".join(called)
    for realm in ("r1", "r2"):
        assert index.find(realm, procedure, groups) == _brute_force(list(groups), realm, procedure)


def test_a_call_tries_only_wildcards_of_its_part_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 5,000 wildcard and 5,000 prefix registrations, a CALL matches a handful, not all of them."""
    from pubsubclub.frontends.wamp import dealer, registrations

    router = WampRouter(Hub(), limits=WampLimits(max_registrations_per_session=20_000, max_registrations=20_000))
    caller, caller_t = joined(router)
    callee, callee_t = joined(router)
    request = 0
    for i in range(5000):
        request += 1
        callee.onMessage(message.Register(request, f"com.w{i}..x.y", match="wildcard"))
        request += 1
        callee.onMessage(message.Register(request, f"org.p{i}.", match="prefix"))
    callee.onMessage(message.Register(request + 1, "com..x", match="wildcard"))
    assert all(isinstance(m, message.Registered) for m in callee_t.sent)
    tried: list[str] = []
    real = registrations._wildcard
    counting = lambda p, c: tried.append(p) or real(p, c)  # noqa: E731
    monkeypatch.setattr(registrations, "_wildcard", counting)
    monkeypatch.setattr(dealer, "_wildcard", counting, raising=False)  # where a scan would call it
    caller.onMessage(message.Call(1, "com.any.x"))
    caller.onMessage(message.Call(2, "org.p4999.z"))
    invocations = [m for m in callee_t.sent if isinstance(m, message.Invocation)]
    assert [m.procedure for m in invocations] == ["com.any.x", "org.p4999.z"]
    assert tried == ["com..x"]
