"""RouterRPC (pubsubclub/frontends/bridge/rpc.py) in memory: a router session double, a real Dealer, a Clock."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallResult
from twisted.internet import defer, task

from pubsubclub.frontends.bridge.rpc import RouterRPC
from pubsubclub.frontends.wamp.dealer import TOO_MANY_CALLS, Dealer

OWN = 1
ROLE = "pubsubclub-bridge"


class Party:
    """A dealer party that remembers what it was sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_message(self, msg: Any) -> None:
        """Remember ``msg``."""
        self.sent.append(msg)

    def send_if_fits(self, msg: Any) -> tuple[int, int] | None:
        """Remember ``msg``."""
        self.sent.append(msg)
        return None


class _Registration:
    def __init__(self) -> None:
        self.active = True

    def unregister(self) -> defer.Deferred[None]:
        self.active = False
        return defer.succeed(None)


class RouterSession:
    """The bridge's router session: a registration meta API over ``registrations``, calls kept pending."""

    _session_id = OWN

    def __init__(self, registrations: dict[int, tuple[dict[str, Any], list[int]]], roles: dict[int, str]) -> None:
        self.registrations = registrations
        self.roles = roles
        self.calls: list[tuple[str, tuple[Any, ...], defer.Deferred[Any]]] = []
        self.registered: dict[str, Any] = {}

    def subscribe(self, handler: Any, topic: str) -> defer.Deferred[None]:
        return defer.succeed(None)

    def register(self, endpoint: Any, uri: str, options: Any = None) -> defer.Deferred[Any]:
        self.registered[uri] = endpoint
        return defer.succeed(_Registration())

    def call(self, procedure: str, *args: Any, options: Any = None, **kwargs: Any) -> defer.Deferred[Any]:
        if procedure == "wamp.registration.list":
            return defer.succeed({"exact": list(self.registrations), "prefix": [], "wildcard": []})
        if procedure == "wamp.registration.get":
            return defer.succeed(self.registrations[args[0]][0])
        if procedure == "wamp.registration.list_callees":
            return defer.succeed(self.registrations[args[0]][1])
        if procedure == "wamp.session.get":
            return defer.succeed({"authrole": self.roles[args[0]]})
        d: defer.Deferred[Any] = defer.Deferred()
        self.calls.append((procedure, args, d))
        return d


def bridge(registrations: dict[int, tuple[dict[str, Any], list[int]]], max_calls: int = 10) -> tuple[Any, ...]:
    """A started RouterRPC on a router whose client session 5 has the role ``app`` and session 6 the bridge role."""
    clock = task.Clock()
    ids = itertools.count(1)
    dealer = Dealer(lambda: next(ids), call_later=clock.callLater)
    events: list[Any] = []
    rpc = RouterRPC(dealer, "realm1", ROLE, max_calls, clock, events.append)
    session = RouterSession(registrations, {5: "app", 6: ROLE})
    done = defer.ensureDeferred(rpc.start(session))
    assert done.called
    clock.advance(0)
    return rpc, dealer, session, clock, events


def reg(reg_id: int, uri: str, invoke: str = "single") -> dict[str, Any]:
    """A registration as ``wamp.registration.get`` describes it."""
    return {"id": reg_id, "uri": uri, "match": "exact", "invoke": invoke, "created": "now"}


def test_only_non_bridge_callees_are_mirrored_and_calls_are_bounded() -> None:
    """A client's registration is mirrored (the bridge's own and another bridge's are not); past max-calls a call
    into the router gets too_many_calls; RESULT and ERROR come back."""
    rpc, dealer, session, clock, events = bridge(
        {10: (reg(10, "app.p"), [5]), 11: (reg(11, "pubsubclub.bridge.active"), [OWN]), 12: (reg(12, "b.q"), [6])},
        max_calls=1,
    )
    assert rpc.stats()["mirrored"] == [["exact", "app.p"]]
    assert dealer.registrations() == 1
    caller = Party()
    dealer.call(caller, "realm1", message.Call(1, "app.p", args=[2]))
    dealer.call(caller, "realm1", message.Call(2, "app.p"))
    clock.advance(0)
    [(procedure, args, d)] = session.calls
    assert (procedure, args) == ("app.p", (2,))
    [refused] = caller.sent
    assert (refused.request, refused.error, refused.kwargs) == (
        2,
        TOO_MANY_CALLS,
        {"limit": "bridge.max-calls", "max": 1},
    )
    d.callback(CallResult(1, 2, k=3))
    [_, result] = caller.sent
    assert (result.request, result.args, result.kwargs) == (1, [1, 2], {"k": 3})
    dealer.call(caller, "realm1", message.Call(3, "app.p"))
    session.calls[-1][2].errback(ApplicationError("app.error", "no", n=1))
    error = caller.sent[-1]
    assert (error.request, error.error, error.args, error.kwargs) == (3, "app.error", ["no"], {"n": 1})
    assert "calls_refused" in events


def test_cluster_procedures_forwarded_and_router_calls_never_loop_back() -> None:
    """Another node's procedure is registered on the router; a router call of a procedure shared by the router and
    the cluster goes to the other node every time, never back into the router through the mirror."""
    rpc, dealer, session, clock, _ = bridge({10: (reg(10, "shared.p", "roundrobin"), [5])}, max_calls=2)
    link = Party()
    dealer.remote_registered(link, 99, "realm1", "shared.p", "exact", "roundrobin", 1.0, "node1")
    dealer.remote_registered(link, 98, "realm1", "node.only", "exact", "single", 1.0, "node1")
    clock.advance(0)
    assert sorted(session.registered) == ["node.only", "shared.p"]
    assert rpc.stats()["forwarding"] == [["exact", "node.only"], ["exact", "shared.p"]]
    endpoint = session.registered["shared.p"]
    answers = [endpoint("x", details=None) for _ in range(2)]
    invocations = [m for m in link.sent if isinstance(m, message.Invocation)]
    assert len(invocations) == 2 and session.calls == []
    with pytest.raises(ApplicationError) as refused:
        endpoint("y", details=None)
    assert refused.value.error == TOO_MANY_CALLS
    for inv in invocations:
        dealer.yielded(link, message.Yield(inv.request, args=["ok"]))
    assert [a.result.results for a in answers] == [("ok",), ("ok",)]
    # The node's registration goes: so does the forward on the router.
    dealer.remote_unregistered(link, 98)
    clock.advance(0)
    assert rpc.stats()["forwarding"] == [["exact", "shared.p"]]


def test_leaving_the_router_ends_calls_both_ways_and_withdraws_mirrors() -> None:
    """When the router session ends, calls through the bridge end with an ERROR each way (no hang) and the
    router's procedures leave the cluster."""
    rpc, dealer, session, clock, _ = bridge({10: (reg(10, "app.p"), [5])})
    link = Party()
    dealer.remote_registered(link, 99, "realm1", "node.q", "exact", "single", 1.0, "node1")
    clock.advance(0)
    caller = Party()
    dealer.call(caller, "realm1", message.Call(1, "app.p"))
    into_router = session.calls[-1][2]
    from_router = session.registered["node.q"]("x", details=None)
    failures: list[Any] = []
    from_router.addErrback(failures.append)
    rpc.stop()
    [ended] = caller.sent
    assert (ended.request, ended.error) == (1, "wamp.error.canceled")
    assert [f.value.error for f in failures] == ["pubsubclub.error.router_unreachable"]
    assert dealer.registrations() == 0 and dealer.calls_in_flight() == 0
    assert any(isinstance(m, message.Interrupt) for m in link.sent)
    into_router.errback(ApplicationError("wamp.error.canceled"))  # the late answer is dropped
    assert caller.sent == [ended]
    assert rpc.stats() == {"mirrored": [], "forwarding": [], "calls_from_router": 0, "calls_into_router": 0}


def test_a_router_refusing_the_registration_meta_api_leaves_rpc_off() -> None:
    """Without the registration meta API the bridge carries no RPC, and says so; it does not fail its session."""

    class Narrow(RouterSession):
        def call(self, procedure: str, *args: Any, options: Any = None, **kwargs: Any) -> defer.Deferred[Any]:
            if procedure.startswith("wamp.registration."):
                return defer.fail(ApplicationError("wamp.error.not_authorized", "no"))
            return super().call(procedure, *args, **kwargs)

    clock = task.Clock()
    ids = itertools.count(1)
    dealer = Dealer(lambda: next(ids), call_later=clock.callLater)
    rpc = RouterRPC(dealer, "realm1", ROLE, 10, clock, lambda event: None)
    done = defer.ensureDeferred(rpc.start(Narrow({}, {})))
    assert done.called and done.result is None
    dealer.remote_registered(Party(), 99, "realm1", "node.q", "exact", "single", 1.0, "node1")
    clock.advance(0)
    assert rpc.session is None and rpc.stats()["forwarding"] == []
