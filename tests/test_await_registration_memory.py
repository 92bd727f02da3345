"""REGISTERED held until every linked node (and worker) has the registration (``[wamp] await-interest``), in memory.

Nodes on one :class:`pubsubclub.testing.MemoryNetwork` with real PSC
transports over iosim: the network moves bytes only when a test flushes it,
so "the moment REGISTERED arrives" is exact, and a caller on another node
calls in that very moment.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from autobahn.wamp import message
from test_rpc_memory import Party, mesh, node
from test_workers_memory import PORTS

from pubsubclub.federation.relay import Relay
from pubsubclub.federation.session import LinkSession
from pubsubclub.frontends.wamp.dealer import NO_SUCH_PROCEDURE, REGISTERED_UNCONFIRMED, Dealer
from pubsubclub.testing import MemoryNetwork, no_logged_errors, psc_url
from pubsubclub.testing._links import partition


class CallsWhenRegistered(Party):
    """A callee session that, the moment its REGISTERED arrives, has a caller on each other node call it."""

    def __init__(self, callers: dict[str, Dealer]) -> None:
        super().__init__()
        self.callers = callers
        #: Per calling node, its caller's answers so far (none yet: the INVOCATION went out).
        self.answers: dict[str, Party] = {}
        #: The procedure it registers.
        self.procedure = ""

    def send_message(self, msg: Any) -> None:
        """Remember ``msg``; on REGISTERED, call the procedure from every other node at once."""
        super().send_message(msg)
        if isinstance(msg, message.Registered):
            for name, dealer in self.callers.items():
                caller = self.answers[name] = Party()
                dealer.call(caller, "realm1", message.Call(1, self.procedure))


def register(dealer: Dealer, callee: CallsWhenRegistered, procedure: str, request: int) -> None:
    """``callee`` REGISTERs ``procedure`` on ``dealer``."""
    callee.procedure = procedure
    dealer.register(callee, "realm1", message.Register(request, procedure))


def refused(dealer: Dealer) -> list[str]:
    """Record the dealer's counted reasons in the returned list."""
    reasons: list[str] = []
    dealer.refused = reasons.append
    return reasons


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An empty in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


@pytest.mark.parametrize("await_seconds", [5.0, 0.0])
def test_a_call_from_another_node_the_moment_registered_arrives(net: MemoryNetwork, await_seconds: float) -> None:
    """With await-interest the callee's REGISTERED comes only once node b has the registration, so b's call made
    then reaches the callee (20 fresh procedures); without it REGISTERED comes first and b's call finds nothing.
    Before any link is up REGISTERED is not held."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    a.await_seconds = await_seconds
    reasons = refused(a)
    alone = Party()
    a.register(alone, "realm1", message.Register(100, "com.alone"))
    assert [type(m) for m in alone.take()] == [message.Registered]  # no link: nobody to wait for
    mesh(net, 9001, 9002)
    for i in range(20):
        callee = CallsWhenRegistered({"b": b})
        register(a, callee, f"com.p{i}", i + 1)
        net.flush()
        answers = callee.answers["b"].take()
        if await_seconds:
            assert answers == [], answers  # the call is with the callee, not refused
            assert [type(m) for m in callee.take()] == [message.Registered, message.Invocation]
        else:
            assert [m.error for m in answers] == [NO_SUCH_PROCEDURE]
    assert reasons == [] and a.tables()["registered_held"] == 0


def test_a_node_that_never_acknowledges_holds_registered_only_for_the_bound(net: MemoryNetwork) -> None:
    """Node b stops reading (its link cut silently): REGISTERED comes after await-interest-timeout, not before,
    logged and counted as registered_unconfirmed; a local call meanwhile releases it first."""
    a = node(net, "a", 9001)
    node(net, "b", 9002)
    mesh(net, 9001, 9002)
    a.await_seconds = 1.0
    reasons = refused(a)
    [link] = [link for link in net.links if link.server_wire.getHost().port == 9001]  # a is the producer
    partition(link)
    callee = Party()
    a.register(callee, "realm1", message.Register(1, "com.stuck"))
    net.advance(0.9)
    assert callee.take() == [] and a.tables()["registered_held"] == 1
    net.advance(0.1)
    assert [type(m) for m in callee.take()] == [message.Registered]
    assert reasons == [REGISTERED_UNCONFIRMED] and a.tables()["registered_held"] == 0
    # A call on the callee's own node goes to it at once: REGISTERED first, never an INVOCATION before it.
    other = Party()
    a.register(other, "realm1", message.Register(2, "com.stuck2"))
    a.call(Party(), "realm1", message.Call(1, "com.stuck2"))
    assert [type(m) for m in other.take()] == [message.Registered, message.Invocation]
    net.advance(1.0)
    assert other.take() == [] and reasons == [REGISTERED_UNCONFIRMED]


@pytest.fixture
def workers_net(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryNetwork]:
    """An in-memory network whose relays take a worker's name for a worker link (as test_workers_memory.py)."""

    def mark_worker(self: Relay, session: LinkSession, transport: Any) -> bool:
        session.worker = self.is_worker_name(session.peer_node)
        return True

    monkeypatch.setattr(Relay, "mark_worker", mark_worker)
    with no_logged_errors():
        yield MemoryNetwork()


def workers_cluster(net: MemoryNetwork, await_seconds: float) -> dict[str, Dealer]:
    """Primary ``p`` relaying for workers ``p.w1`` and ``p.w2``, and node ``b``, all with await-interest."""
    dealers = {name: node(net, name, port) for name, port in PORTS.items()}
    for dealer in dealers.values():
        dealer.await_seconds = await_seconds
    primary = dealers["p"].federation  # type: ignore[attr-defined]
    primary.enable_relay("p.w", set())
    for name in ("p.w1", "p.w2", "b"):
        primary.add_server(psc_url(PORTS[name]))
        dealers[name].federation.add_server(psc_url(PORTS["p"]))  # type: ignore[attr-defined]
    net.answer()
    return dealers


@pytest.mark.parametrize(
    ("where", "callers"),
    [("p.w1", ("p.w2", "b", "p")), ("b", ("p.w1", "p.w2", "p"))],
)
def test_registered_waits_for_the_primarys_relay(
    workers_net: MemoryNetwork, where: str, callers: tuple[str, ...]
) -> None:
    """A worker's REGISTERED waits until the other worker and node b have it (the primary answers the worker's
    ping only after its own round trips for the relayed announcement); node b's until every worker has it."""
    d = workers_cluster(workers_net, 5.0)
    for i in range(5):
        callee = CallsWhenRegistered({name: d[name] for name in callers})
        register(d[where], callee, f"com.{where}.p{i}", i + 1)
        workers_net.flush()
        assert {name: party.take() for name, party in callee.answers.items()} == {name: [] for name in callers}
        assert [type(m) for m in callee.take()] == [message.Registered] + [message.Invocation] * len(callers)
