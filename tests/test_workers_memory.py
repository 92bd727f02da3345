"""The primary's relay of RPC and retained events (federation/rpc.py, retained.py) over in-memory links.

A primary ``p`` with two workers ``p.w1`` and ``p.w2`` and a plain node ``b``,
linked as a node with ``--workers 3`` is (each worker to the primary both
ways, ``b`` to the primary both ways), on one :class:`MemoryNetwork`. Worker
links are Unix-socket links in a real node; here the relay is told which links
are workers' by name (``mark_worker`` is replaced), everything else is real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from autobahn.wamp import message
from test_rpc_memory import Party, node, register
from test_wamp_meta_memory import FakeLink, FakeRPC, joined

from pubsubclub.core.hub import GAP_TOPIC, Hub
from pubsubclub.core.retained import RetainedEvent, RetainedStore
from pubsubclub.federation import psc_rpc
from pubsubclub.federation.relay import Relay
from pubsubclub.federation.replay import Gap
from pubsubclub.federation.session import LinkSession
from pubsubclub.frontends.wamp import WampRouter
from pubsubclub.frontends.wamp.dealer import Dealer
from pubsubclub.testing import MemoryNetwork, RecordingSink, no_logged_errors, psc_url

PORTS = {"p": 9101, "p.w1": 9102, "p.w2": 9103, "b": 9104}


@pytest.fixture
def net(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryNetwork]:
    """An empty in-memory network whose relays take a worker's name for a worker link."""

    def mark_worker(self: Relay, session: LinkSession, transport: Any) -> bool:
        session.worker = self.is_worker_name(session.peer_node)
        return True

    monkeypatch.setattr(Relay, "mark_worker", mark_worker)
    with no_logged_errors():
        yield MemoryNetwork()


def cluster(net: MemoryNetwork) -> dict[str, Dealer]:
    """The primary, its two workers and ``b``, linked as a node with workers is, each with a dealer."""
    dealers = {name: node(net, name, port) for name, port in PORTS.items()}
    primary = dealers["p"].federation  # type: ignore[attr-defined]
    primary.enable_relay("p.w", set())
    for name in ("p.w1", "p.w2"):
        dealers[name].federation.asks_gaps = True  # type: ignore[attr-defined]  # as node.py sets it
    for name in ("p.w1", "p.w2", "b"):
        primary.add_server(psc_url(PORTS[name]))
        dealers[name].federation.add_server(psc_url(PORTS["p"]))  # type: ignore[attr-defined]
    net.answer()
    return dealers


def call(dealer: Dealer, procedure: str, request: int = 1) -> Party:
    """A caller session on ``dealer`` with one CALL of ``procedure`` made."""
    caller = Party()
    dealer.call(caller, "realm1", message.Call(request, procedure))
    return caller


def answer(net: MemoryNetwork, callee: Party, dealer: Dealer, value: str) -> None:
    """``callee`` (on ``dealer``) answers its one INVOCATION with ``value``."""
    net.flush()
    [invocation] = callee.take()
    assert isinstance(invocation, message.Invocation)
    dealer.yielded(callee, message.Yield(invocation.request, args=[value]))
    net.flush()


def test_a_workers_procedure_is_called_from_the_other_worker_and_another_node(net: MemoryNetwork) -> None:
    """Worker 1's registration reaches worker 2 and node b (re-announced by the primary, never back to worker 1);
    their calls go through the primary and the answers come back."""
    d = cluster(net)
    callee = register(d["p.w1"], "com.w1")
    net.flush()
    # Once everywhere, and worker 1 is not told of its own registration.
    tables = {name: dealer.tables()["remote_registrations"] for name, dealer in d.items()}
    assert tables == {"p": 1, "p.w1": 0, "p.w2": 1, "b": 1}
    for name in ("p.w2", "b", "p"):
        caller = call(d[name], "com.w1")
        answer(net, callee, d["p.w1"], name)
        assert [(type(m), m.args) for m in caller.take()] == [(message.Result, [name])]
    assert all(dealer.tables()["calls"] == 0 for dealer in d.values())
    # A single registration is single cluster-wide.
    other = Party()
    d["b"].register(other, "realm1", message.Register(5, "com.w1"))
    assert [m.error for m in other.take()] == ["wamp.error.procedure_already_exists"]
    # Unregistered: gone everywhere.
    [reg_id] = [r.id for r in d["p.w1"].local_registrations()]
    d["p.w1"].unregister(callee, message.Unregister(2, reg_id))
    net.flush()
    assert all(dealer.tables()["remote_registrations"] == 0 for dealer in d.values())


def test_another_nodes_procedure_reaches_each_worker_but_no_other_node(net: MemoryNetwork) -> None:
    """Node b's registration is re-announced to the workers only; worker 2 calls it through the primary."""
    d = cluster(net)
    callee = register(d["b"], "com.b")
    net.flush()
    tables = {name: dealer.tables()["remote_registrations"] for name, dealer in d.items()}
    assert tables == {"p": 1, "p.w1": 1, "p.w2": 1, "b": 0}
    caller = call(d["p.w2"], "com.b")
    answer(net, callee, d["b"], "from b")
    assert [m.args for m in caller.take()] == [["from b"]]


def test_a_worker_link_lost_ends_the_relayed_calls_with_node_unreachable(net: MemoryNetwork) -> None:
    """Worker 1's links dropping: node b's call in flight to its callee ends with node_unreachable, and the
    registration leaves every table."""
    d = cluster(net)
    register(d["p.w1"], "com.w1")
    net.flush()
    caller = call(d["b"], "com.w1")
    net.flush()
    for session, link in list(d["p"].federation._links.items()):  # type: ignore[attr-defined]
        if session.peer_node == "p.w1":
            link.close(1000, "worker gone")
    net.flush()
    assert [m.error for m in caller.take()] == ["pubsubclub.error.node_unreachable"]
    assert d["b"].tables()["remote_registrations"] == 0 and d["p.w2"].tables()["remote_registrations"] == 0


def test_roundrobin_over_two_workers_and_another_node(net: MemoryNetwork) -> None:
    """A roundrobin procedure with callees on worker 1, worker 2 and node b: callers on b and on worker 2
    reach each in turn."""
    d = cluster(net)
    callees = {}
    for name in ("p.w1", "p.w2", "b"):
        callees[name] = register(d[name], "com.rr", invoke="roundrobin")
        net.flush()
    for where in ("b", "p.w2"):
        got = []
        for request in range(6):
            caller = call(d[where], "com.rr", request)
            net.flush()
            [name] = [name for name, callee in callees.items() if callee.sent]
            answer(net, callees[name], d[name], name)
            assert [m.args for m in caller.take()] == [[name]]
            got.append(name)
        assert sorted(got) == ["b", "b", "p.w1", "p.w1", "p.w2", "p.w2"] and got[:3] == got[3:]


def test_retained_events_reach_every_worker_and_node_once(net: MemoryNetwork) -> None:
    """A retained event of worker 1 reaches the primary, worker 2 and b; one of b reaches every worker;
    none goes back to where it came from twice (last-writer-wins keeps each table at one event)."""
    d = cluster(net)
    stores = {}
    for name, dealer in d.items():
        stores[name] = RetainedStore()
        dealer.federation.retained.attach(stores[name])  # type: ignore[attr-defined]
    net.flush()
    received: dict[str, list[str]] = {name: [] for name in d}
    for name, dealer in d.items():
        retained = dealer.federation.retained  # type: ignore[attr-defined]

        def receive(session: Any, msg: Any, name: str = name, inner: Any = retained.receive) -> None:
            received[name].append(msg.event.topic)
            inner(session, msg)

        retained.receive = receive

    def event(topic: str, origin: str) -> RetainedEvent:
        return RetainedEvent(topic, [origin], False, None, 1.0, origin, "m1", 10)

    stores["p.w1"].retain(event("t.w1", "p.w1"))
    stores["b"].retain(event("t.b", "b"))
    net.flush()
    assert all(sorted(e.topic for e in store.events()) == ["t.b", "t.w1"] for store in stores.values())
    assert {name: sorted(topics) for name, topics in received.items()} == {
        "p": ["t.b", "t.w1"],
        "p.w1": ["t.b"],
        "p.w2": ["t.b", "t.w1"],
        "b": ["t.w1"],
    }


def test_the_primary_announces_no_more_registrations_than_a_node_may_hold(net: MemoryNetwork) -> None:
    """Past max-registrations-per-node the primary re-announces no more (logged), so no node closes its link
    for holding too many from one node; the registration is still callable from the primary."""
    d = cluster(net)
    for dealer in d.values():
        dealer.max_node_registrations = 2
    callees = [register(d["p.w1"], f"com.w1.{i}") for i in range(2)]
    callees.append(register(d["p.w2"], "com.w2"))
    net.flush()
    assert d["b"].tables()["remote_registrations"] == 2 and d["p"].tables()["remote_registrations"] == 3
    assert all(link["state"] == "open" for link in d["b"].federation.links())  # type: ignore[attr-defined]
    caller = call(d["p"], "com.w2")
    answer(net, callees[2], d["p.w2"], "w2")
    assert [m.args for m in caller.take()] == [["w2"]]


def test_a_gap_the_primary_sees_reaches_the_workers_clients_but_no_other_node(net: MemoryNetwork) -> None:
    """A gap in node b's stream, seen by the primary, is told to the gap subscribers of a worker too, and never
    to another node (which does not ask for gap reports)."""
    d = cluster(net)
    sinks = {name: RecordingSink() for name in d}
    for name, dealer in d.items():
        dealer.federation.hub.subscribe(GAP_TOPIC, sinks[name])  # type: ignore[attr-defined]
    net.flush()
    primary = d["p"].federation  # type: ignore[attr-defined]
    assert sorted(primary.remote_interest().get(GAP_TOPIC, [])) == ["p.w1", "p.w2"]
    primary._report_gap(Gap("b", 3, "window"))
    net.flush()
    got = {name: [e.payload for e in sink.got] for name, sink in sinks.items()}
    report = {"origin": "b", "lost": 3, "reason": "window"}
    assert got == {"p": [report], "p.w1": [report], "p.w2": [report], "b": []}


def test_caller_disclosure_crosses_the_primary(net: MemoryNetwork) -> None:
    """A callee on worker 1 that asked disclose_caller learns the identity of a caller on node b; one that did
    not, does not (the callee's process decides, as between two nodes)."""
    d = cluster(net)
    asked, silent = Party(), Party()
    d["p.w1"].register(asked, "realm1", message.Register(1, "com.asked"), disclose_caller=True)
    d["p.w1"].register(silent, "realm1", message.Register(2, "com.silent"))
    net.flush()
    for procedure in ("com.asked", "com.silent"):
        d["b"].call(Party(), "realm1", message.Call(1, procedure), identity=(77, "alice", "user"))
    net.flush()
    [_, invocation] = asked.take()
    assert (invocation.caller, invocation.caller_authid, invocation.caller_authrole) == (77, "alice", "user")
    [_, invocation] = silent.take()
    assert invocation.caller is None


def test_another_node_lost_ends_a_workers_relayed_calls_with_node_unreachable(net: MemoryNetwork) -> None:
    """Node b's links dropping: worker 2's call in flight to b's callee ends with node_unreachable, and b's
    registration leaves the workers' tables."""
    d = cluster(net)
    register(d["b"], "com.b")
    net.flush()
    caller = call(d["p.w2"], "com.b")
    net.flush()
    for session, link in list(d["p"].federation._links.items()):  # type: ignore[attr-defined]
        if session.peer_node == "b":
            link.close(1000, "node gone")
    net.flush()
    assert [m.error for m in caller.take()] == ["pubsubclub.error.node_unreachable"]
    assert d["p.w1"].tables()["remote_registrations"] == 0 and d["p.w2"].tables()["remote_registrations"] == 0


def test_a_re_announced_id_called_back_from_its_own_side_is_refused(net: MemoryNetwork) -> None:
    """Node b sends a PSC403 for the primary's id of b's own registration (never announced to b): the primary
    answers no_such_procedure and invokes nobody, so no call goes round in a loop."""
    d = cluster(net)
    callee = register(d["b"], "com.b")
    net.flush()
    rpc = d["p"].federation.rpc  # type: ignore[attr-defined]
    [relayed_id] = list(rpc._relayed)
    b_rpc = d["b"].federation.rpc  # type: ignore[attr-defined]
    [(_, link)] = b_rpc.peers()
    answers: list[Any] = []
    original = b_rpc.receive
    b_rpc.receive = lambda session, msg: answers.append(msg) or original(session, msg)
    link.session.send_raw(psc_rpc.Call(5, relayed_id, "com.b").encode())
    net.flush()
    assert [(type(m).__name__, m.error) for m in answers] == [("Error", "wamp.error.no_such_procedure")]
    assert callee.take() == [] and d["p"].tables()["calls"] == 0


def test_a_worker_without_its_primary_answers_meta_incomplete_not_a_smaller_count() -> None:
    """A worker whose link to the primary is down (the primary restarting) answers wamp.session.count with ERROR
    meta_incomplete naming the primary, never with its own sessions alone; with the link up it asks the primary."""
    router = WampRouter(Hub("p.w1"))
    rpc = FakeRPC([])
    rpc.required_peer = "p"  # type: ignore[attr-defined]  # as node.py sets it in a worker
    router.meta.attach(rpc, lambda topic: False)
    session, transport = joined(router)
    session.onMessage(message.Call(5, "wamp.session.count"))
    [error] = transport.sent
    assert isinstance(error, message.Error) and error.error == "pubsubclub.error.meta_incomplete"
    assert error.kwargs == {"nodes": ["p"]}
    link = FakeLink()
    rpc._peers = [("p", link)]
    session.onMessage(message.Call(6, "wamp.session.count"))
    [query] = link.sent
    assert isinstance(query, message.Invocation) and query.args == ["count", {"realm": "realm1", "roles": None}]


def test_a_node_the_primary_has_not_linked_yet_is_named_to_a_workers_meta_call(net: MemoryNetwork) -> None:
    """A client of worker 1 asks wamp.session.count while the primary still dials a peer: ERROR meta_incomplete
    names that peer (relayed in the primary's PSC405), not the primary; with the peer gone from the primary's
    list the count answers, the primary's and worker 2's sessions included."""
    from test_wamp_meta_memory import meta_node

    p, router_p = meta_node(net, "p", PORTS["p"])
    p.enable_relay("p.w", set())
    workers = {name: meta_node(net, name, PORTS[name]) for name in ("p.w1", "p.w2")}
    for name, (federation, _router) in workers.items():
        federation.rpc.required_peer = "p"  # as node.py sets it in a worker
        p.add_server(psc_url(PORTS[name]))
        federation.add_server(psc_url(PORTS["p"]))
    net.answer()
    joined(router_p)
    joined(workers["p.w2"][1])
    session, transport = joined(workers["p.w1"][1])
    down = psc_url(9199)  # nothing listens there
    p.add_server(down)
    session.onMessage(message.Call(1, "wamp.session.count"))
    net.flush()
    [error] = transport.sent
    assert isinstance(error, message.Error) and error.error == "pubsubclub.error.meta_incomplete"
    assert error.kwargs == {"nodes": [down]}
    p.remove_server(down)
    transport.sent.clear()
    session.onMessage(message.Call(2, "wamp.session.count"))
    net.flush()
    [result] = transport.sent
    assert isinstance(result, message.Result) and result.args == [3]
    net.stop()
