"""The WAMP meta API on one in-memory router: its tables, and its queries to other nodes on fake links."""

from __future__ import annotations

from typing import Any

from autobahn.wamp import message
from autobahn.wamp.role import RoleCalleeFeatures, RoleCallerFeatures, RoleSubscriberFeatures
from twisted.internet.task import Clock

from pubsubclub.core.hub import Hub
from pubsubclub.frontends.wamp import WampRouter
from pubsubclub.frontends.wamp.meta import QUERY_PROCEDURE, MetaLimits
from pubsubclub.testing import MemoryWampTransport


class FakeLink:
    """A stand-in for another node's callees (federation/rpc.py's ``_CalleeLink``): records what it is sent."""

    def __init__(self) -> None:
        self.session = object()
        self.sent: list[message.Message] = []

    def send_if_fits(self, msg: message.Message) -> None:
        """Record an INVOCATION (the query)."""
        self.sent.append(msg)

    def send_message(self, msg: message.Message) -> None:
        """Record anything else."""
        self.sent.append(msg)


class FakeRPC:
    """The cluster's RPC as the meta API sees it: other nodes by name, with their links."""

    def __init__(self, peers: list[tuple[str, FakeLink]]) -> None:
        self.meta: Any = None
        self._peers = peers

    def peers(self) -> list[tuple[str, FakeLink]]:
        """Every other node."""
        return self._peers


def joined(router: WampRouter) -> tuple[Any, MemoryWampTransport]:
    """An anonymous session on a fake transport, WELCOME taken off."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    roles = {"caller": RoleCallerFeatures(), "callee": RoleCalleeFeatures(), "subscriber": RoleSubscriberFeatures()}
    session.onMessage(message.Hello("realm1", roles))
    assert isinstance(transport.sent.pop(), message.Welcome)
    return session, transport


def clustered(limits: MetaLimits = MetaLimits()) -> tuple[WampRouter, Clock, FakeLink]:  # noqa: B008 - frozen
    """A router whose meta API has one other node, ``node2``, behind a fake link."""
    clock = Clock()
    router = WampRouter(Hub("node1"), call_later=clock.callLater)
    router.meta.limits = limits
    link = FakeLink()
    router.meta.attach(FakeRPC([("node2", link)]), lambda topic: False)
    return router, clock, link


def test_meta_tables_are_empty_once_sessions_leave() -> None:
    """A session's entry and its subscription's leave the meta API's tables with it; meta URIs map to $meta topics."""
    router = WampRouter(Hub())
    session, transport = joined(router)
    session.onMessage(message.Subscribe(1, "com.example.t"))
    session.onMessage(message.Register(2, "com.example.p"))
    assert router.meta.stats() == {"sessions": 1, "subscriptions": 1, "queries": 0}
    session.onClose(True)
    assert router.meta.stats() == {"sessions": 0, "subscriptions": 0, "queries": 0}
    assert router.hub_topic("realm1", "wamp.session.on_join") == "$meta.realm1#wamp.session.on_join"


def test_a_silent_node_is_named_once_the_timeout_passes() -> None:
    """wamp.session.count asks node 2 with a PSC403 meta query; no answer within the timeout: ERROR naming node 2."""
    router, clock, link = clustered()
    session, transport = joined(router)
    session.onMessage(message.Call(5, "wamp.session.count"))
    [query] = link.sent
    assert isinstance(query, message.Invocation) and query.procedure == QUERY_PROCEDURE
    assert query.args == ["count", {"realm": "realm1", "roles": None}]
    assert transport.sent == []
    clock.advance(5.0)
    [error] = transport.sent
    assert isinstance(error, message.Error) and error.error == "pubsubclub.error.meta_incomplete"
    assert error.kwargs == {"nodes": ["node2"]}
    assert clock.getDelayedCalls() == [] and router.meta.stats()["queries"] == 0


def test_answers_are_merged_and_a_lost_link_ends_the_wait_at_once() -> None:
    """Node 2's answer adds to this node's count (null: a node without WAMP); a query whose link drops is answered
    ERROR without waiting."""
    router, clock, link = clustered()
    session, transport = joined(router)
    session.onMessage(message.Call(5, "wamp.session.count"))
    assert router.meta.answered(link.session, link.sent[0].request, [3], None)
    [result] = transport.sent
    assert isinstance(result, message.Result) and result.args == [4]
    assert not router.meta.answered(link.session, link.sent[0].request, [3], None), "a late answer is nobody's"
    session.onMessage(message.Call(6, "wamp.session.count"))
    assert router.meta.answered(link.session, link.sent[1].request, [None], None), "a node without WAMP"
    assert transport.sent[-1].args == [1]
    session.onMessage(message.Call(7, "wamp.session.list"))
    router.meta.link_closed(link.session)
    error = transport.sent[-1]
    assert isinstance(error, message.Error) and error.error == "pubsubclub.error.meta_incomplete"
    assert clock.getDelayedCalls() == []


def test_queries_in_flight_are_capped() -> None:
    """Past meta-max-queries in flight a meta call that needs other nodes is refused naming the limit."""
    router, clock, link = clustered(MetaLimits(max_queries=1))
    session, transport = joined(router)
    session.onMessage(message.Call(5, "wamp.session.count"))
    session.onMessage(message.Call(6, "wamp.session.count"))
    [error] = transport.sent
    assert isinstance(error, message.Error) and error.error == "pubsubclub.error.too_many_meta_queries"
    assert error.kwargs == {"limit": "wamp.meta-max-queries", "max": 1}
    clock.advance(5.0)


def test_a_query_from_another_node_is_answered_or_refused() -> None:
    """A peer's meta query gets its answer (RESULT), and one this node cannot take an ERROR, never an exception."""
    router, _, _ = clustered()
    session, _ = joined(router)
    party = FakeLink()
    router.meta.serve(party, 7, ["sessions", {"realm": "realm1", "roles": None}])
    router.meta.serve(party, 8, ["no-such-query", {"realm": "realm1"}])
    router.meta.serve(party, 9, ["session", {"realm": "realm1", "id": [1]}])
    router.meta.serve(party, 10, "not a list")
    result, *errors = party.sent
    assert isinstance(result, message.Result) and result.args == [[session.session_id]]
    assert [(e.request, e.error) for e in errors] == [(r, "wamp.error.invalid_argument") for r in (8, 9, 10)]


def test_the_node_to_node_query_is_not_callable_by_clients() -> None:
    """A client's CALL of the reserved query procedure is refused as a reserved URI; a PUBLISH on a meta URI too."""
    router, _, link = clustered()
    session, transport = joined(router)
    session.onMessage(message.Call(5, QUERY_PROCEDURE, args=["count", {"realm": "realm1"}]))
    session.onMessage(message.Publish(6, "wamp.session.on_join", args=[{}], acknowledge=True))
    assert [(m.request, m.error) for m in transport.sent] == [
        (5, "wamp.error.invalid_uri"),
        (6, "wamp.error.invalid_uri"),
    ]
    assert link.sent == []


def meta_node(net: Any, name: str, port: int) -> tuple[Any, WampRouter]:
    """A 0.7 in-memory node with a WAMP router whose dealer and meta API are attached as node.py attaches them."""
    from test_rpc_memory import REPLAY

    federation = net.node(name, port, replay=REPLAY)
    router = WampRouter(federation.hub, call_later=net.reactor.callLater)
    federation.rpc.attach(router.dealer)
    router.meta.attach(federation.rpc, federation.forwards, federation.unasked_nodes)
    return federation, router


def test_a_node_not_linked_yet_or_down_is_named_never_left_out() -> None:
    """wamp.session.count on a node whose peer is still being dialled, refused, linked only one way, or down
    ends with meta_incomplete naming it (its URL until a first handshake, then its node id); linked both
    ways, it is asked and counted."""
    from pubsubclub.testing import MemoryNetwork, psc_url

    net = MemoryNetwork()
    a, router_a = meta_node(net, "a", 9301)
    session, transport = joined(router_a)
    a.add_server(psc_url(9302))

    def answer(request: int) -> Any:
        transport.sent.clear()
        session.onMessage(message.Call(request, "wamp.session.count"))
        net.flush()
        [msg] = transport.sent
        return msg

    # Being dialled, then refused: named by its URL (no node id heard yet), at once.
    for request in (1, 2):
        error = answer(request)
        assert isinstance(error, message.Error) and error.error == "pubsubclub.error.meta_incomplete"
        assert error.kwargs == {"nodes": [psc_url(9302)]}
        assert net.refuse(9302) == (1 if request == 1 else 0)
    assert "not linked yet" in error.args[0]
    # b starts and dials a; a's retry reaches b: linked both ways, b is asked and its session counted.
    b, router_b = meta_node(net, "b", 9302)
    joined(router_b)
    b.add_server(psc_url(9301))
    net.answer()
    assert [link["peer_node"] for link in a.links() if link["state"] == "open"] == ["b"]  # b's dial only
    error = answer(3)  # b linked one way, and b's URL (a's dial, its node id not heard yet)
    assert isinstance(error, message.Error) and error.kwargs == {"nodes": ["b", psc_url(9302)]}
    assert "no open link where it answers" in error.args[0]
    net.advance(net.retry.max_delay * 2)  # a's retry of b
    net.answer()
    result = answer(4)
    assert isinstance(result, message.Result) and result.args == [2]
    # b's links drop: named by its node id now, not left out.
    for link in list(a._links.values()):
        link.close(1000, "gone")
    net.flush()
    error = answer(5)
    assert isinstance(error, message.Error) and error.kwargs == {"nodes": ["b"]}
    net.stop()


def test_names_relayed_in_a_meta_incomplete_are_taken_only_when_well_formed() -> None:
    """A peer's PSC405 meta_incomplete naming nodes (kwargs.nodes) puts those names in the caller's ERROR; a list
    that is too long, holds a non-string or an over-long name, or comes with another error, names the peer."""
    incomplete = "pubsubclub.error.meta_incomplete: node2 could not answer for n3"
    cases = [
        (incomplete, {"nodes": ["n3", "n4"]}, ["n3", "n4"]),
        (incomplete, {"nodes": ["n3", 7]}, ["node2"]),
        (incomplete, {"nodes": ["x" * 513]}, ["node2"]),
        (incomplete, {"nodes": ["n"] * 1025}, ["node2"]),
        (incomplete, {"nodes": []}, ["node2"]),
        ("wamp.error.invalid_argument: no", {"nodes": ["n3"]}, ["node2"]),
    ]
    for request, (error, kwargs, named) in enumerate(cases, start=1):
        router, _clock, link = clustered()
        session, transport = joined(router)
        session.onMessage(message.Call(request, "wamp.session.count"))
        assert router.meta.answered(link.session, link.sent[0].request, None, error, kwargs)
        [answer] = transport.sent
        assert isinstance(answer, message.Error) and answer.error == "pubsubclub.error.meta_incomplete"
        assert answer.kwargs == {"nodes": named}, (error, kwargs)
