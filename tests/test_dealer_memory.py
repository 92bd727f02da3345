"""The node-local Dealer driven message by message on fake transports: Advanced Profile edges of RPC."""

from __future__ import annotations

from typing import Any

import pytest
from autobahn.wamp import message
from autobahn.wamp.role import RoleCalleeFeatures, RoleCallerFeatures
from twisted.internet.task import Clock

from pubsubclub.core.hub import Hub
from pubsubclub.frontends.wamp import WampRouter
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
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
