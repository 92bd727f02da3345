"""RPC across the cluster (PSC 0.7) between Federations over in-memory links, each with a Dealer.

Two (or three) nodes on one :class:`pubsubclub.testing.MemoryNetwork`, each
with a WAMP :class:`Dealer` attached to its federation's RPC; the WAMP
sessions are recording parties. Time moves only when a test advances the
clock, so timeouts and ping bounds are exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from autobahn.wamp import message

from pubsubclub.federation import Federation, psc, psc_rpc
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.federation.session import CLOSE_BAD_MESSAGE
from pubsubclub.frontends.wamp.dealer import Dealer
from pubsubclub.testing import MemoryNetwork, no_logged_errors, psc_url
from pubsubclub.testing._links import partition

REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)
PING = MemoryNetwork.ping_interval
_ids = itertools.count(1)


class Party:
    """A WAMP session as the dealer sees it: remembers what it was sent."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.sent: list[Any] = []
        self.limit = limit

    def send_message(self, msg: Any) -> None:
        """Remember ``msg``."""
        self.sent.append(msg)

    def send_if_fits(self, msg: Any) -> tuple[int, int] | None:
        """Remember ``msg`` (everything fits)."""
        self.sent.append(msg)
        return None

    def take(self) -> list[Any]:
        """What was sent since the last take."""
        sent, self.sent = self.sent, []
        return sent


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An empty in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


def node(net: MemoryNetwork, name: str, port: int, clock: list[float] | None = None, **kw: Any) -> Dealer:
    """A 0.7 node with a dealer attached; its dealer's clock reads ``clock[0]`` (or the network's)."""
    federation = net.node(name, port, replay=REPLAY, **kw)
    read = (lambda: clock[0]) if clock is not None else net.reactor.seconds
    dealer = Dealer(lambda: next(_ids), call_later=net.reactor.callLater, clock=read)
    federation.rpc.attach(dealer)
    dealer.federation = federation  # type: ignore[attr-defined]
    return dealer


def mesh(net: MemoryNetwork, *ports: int) -> None:
    """Every node dials every other."""
    for federation in net.nodes:
        for port in ports:
            if psc_url(port) != federation.advertise_url:
                federation.add_server(psc_url(port))
    net.answer()


def register(dealer: Dealer, procedure: str, request: int = 1, **options: Any) -> Party:
    """A callee session with one registration; asserts REGISTERED."""
    callee = Party()
    dealer.register(callee, "realm1", message.Register(request, procedure, **options), interruptible=True)
    [answer] = callee.take()
    assert isinstance(answer, message.Registered), answer
    return callee


def test_call_result_error_and_progress_across_nodes(net: MemoryNetwork) -> None:
    """A CALL on node a reaches the callee on node b; progressive RESULTs, the final one, and a callee ERROR
    (URI, args, kwargs) come back to the caller as from one router."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    mesh(net, 9001, 9002)
    assert {r["version"] for r in a.federation.links()} == {"0.8"}  # type: ignore[attr-defined]
    callee = register(b, "com.add")
    net.flush()
    caller = Party()
    a.call(caller, "realm1", message.Call(7, "com.add", args=[1, b"\x00bin"], kwargs={"k": 1}, receive_progress=True))
    net.flush()
    [invocation] = callee.take()
    assert isinstance(invocation, message.Invocation)
    assert (invocation.args, invocation.kwargs, invocation.receive_progress) == ([1, b"\x00bin"], {"k": 1}, True)
    b.yielded(callee, message.Yield(invocation.request, args=["half"], progress=True))
    b.yielded(callee, message.Yield(invocation.request, args=[3, b"\x01"]))
    net.flush()
    got = caller.take()
    assert [(type(m), m.request, m.args, m.progress) for m in got] == [
        (message.Result, 7, ["half"], True),
        (message.Result, 7, [3, b"\x01"], False),
    ]
    a.call(caller, "realm1", message.Call(8, "com.add"))
    net.flush()
    [invocation] = callee.take()
    error = message.Error(message.Invocation.MESSAGE_TYPE, invocation.request, "app.oops", args=["no"], kwargs={"x": 2})
    b.invocation_error(callee, error)
    net.flush()
    [answer] = caller.take()
    assert isinstance(answer, message.Error)
    assert (answer.request_type, answer.request, answer.error, answer.args, answer.kwargs) == (
        message.Call.MESSAGE_TYPE,
        8,
        "app.oops",
        ["no"],
        {"x": 2},
    )
    assert a.tables()["calls"] == 0 and b.tables()["calls"] == 0


def test_registrations_announced_on_link_up_and_unregister_removes(net: MemoryNetwork) -> None:
    """A registration made before the link is up is announced with the whole set; UNREGISTER removes it on
    the other node (CALL then gets no_such_procedure)."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    callee = register(b, "com.early")
    mesh(net, 9001, 9002)
    assert a.tables()["remote_registrations"] == 1
    [reg_id] = [r.id for r in b.local_registrations()]
    b.unregister(callee, message.Unregister(2, reg_id))
    net.flush()
    assert a.tables()["remote_registrations"] == 0
    caller = Party()
    a.call(caller, "realm1", message.Call(1, "com.early"))
    assert [m.error for m in caller.take()] == ["wamp.error.no_such_procedure"]


def test_timeout_and_cancel_interrupt_the_remote_callee(net: MemoryNetwork) -> None:
    """The call ``timeout`` ends a cross-node call with wamp.error.timeout and INTERRUPTs the callee on its
    node; CANCEL kill does the same with wamp.error.canceled, CANCEL skip leaves the callee alone."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    mesh(net, 9001, 9002)
    callee = register(b, "com.slow")
    net.flush()
    caller = Party()
    a.call(caller, "realm1", message.Call(1, "com.slow", timeout=500))
    net.flush()
    [invocation] = callee.take()
    net.advance(0.499)
    assert caller.take() == []
    net.advance(0.001)
    assert [m.error for m in caller.take()] == ["wamp.error.timeout"]
    assert [(type(m), m.request) for m in callee.take()] == [(message.Interrupt, invocation.request)]
    for request, mode, interrupted in ((2, "kill", True), (3, "skip", False)):
        a.call(caller, "realm1", message.Call(request, "com.slow"))
        net.flush()
        [invocation] = callee.take()
        a.cancel(caller, message.Cancel(request, mode=mode))
        net.flush()
        assert [m.error for m in caller.take()] == ["wamp.error.canceled"]
        assert [type(m) for m in callee.take()] == ([message.Interrupt] if interrupted else [])
        b.yielded(callee, message.Yield(invocation.request, args=["late"]))
        net.flush()
        assert caller.take() == []  # a late answer reaches nobody
    assert a.tables()["calls"] == 0 and b.tables()["calls"] == 0


def test_link_loss_ends_calls_in_flight_and_registrations_come_back(net: MemoryNetwork) -> None:
    """A partition: the callee's node is unreachable; within the ping bound the caller gets ERROR
    node_unreachable, never a hang; the registrations vanish and come back with the link."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    mesh(net, 9001, 9002)
    register(b, "com.slow")
    net.flush()
    caller = Party()
    a.call(caller, "realm1", message.Call(1, "com.slow"))
    net.flush()
    for link in list(net.links):
        partition(link)
    net.advance(PING)
    net.advance(PING)
    [answer] = caller.take()
    assert answer.error == "pubsubclub.error.node_unreachable" and "node b" in answer.args[0]
    assert a.tables()["remote_registrations"] == 0 and a.tables()["calls"] == 0
    assert b.tables()["calls"] == 0
    a.call(caller, "realm1", message.Call(2, "com.slow"))
    assert [m.error for m in caller.take()] == ["wamp.error.no_such_procedure"]
    for _ in range(40):
        net.advance(0.5)
        net.answer()
        if a.tables()["remote_registrations"] == 1:
            break
    assert a.tables()["remote_registrations"] == 1


def test_single_registration_exists_cluster_wide_and_the_race_is_settled(net: MemoryNetwork) -> None:
    """A REGISTER of a procedure registered on another node gets procedure_already_exists; two made at once on
    two nodes: the earlier (created, node) keeps it everywhere, the other is revoked with UNREGISTERED."""
    clock = [100.0]
    a, b = node(net, "a", 9001, clock), node(net, "b", 9002, clock)
    mesh(net, 9001, 9002)
    register(a, "com.one")
    net.flush()
    late = Party()
    b.register(late, "realm1", message.Register(1, "com.one"))
    assert [m.error for m in late.take()] == ["wamp.error.procedure_already_exists"]
    # The race: both register before either hears of the other (same clock: node id decides, a < b).
    b_callee = register(b, "com.race")
    a_callee = register(a, "com.race")
    net.flush()
    [revoked] = b_callee.take()
    assert isinstance(revoked, message.Unregistered) and revoked.reason == "wamp.error.procedure_already_exists"
    assert a_callee.take() == []
    caller = Party()
    b.call(caller, "realm1", message.Call(5, "com.race"))
    net.flush()
    assert [type(m) for m in a_callee.take()] == [message.Invocation]
    assert b.tables()["registrations"] == 0 and a.tables()["remote_registrations"] == 0
    assert b.tables()["remote_registrations"] == 2


def test_shared_roundrobin_spreads_calls_over_callees_on_three_nodes(net: MemoryNetwork) -> None:
    """A shared roundrobin procedure with callees on three nodes: calls from one node go to each in turn,
    in the cluster-wide order of registration; another policy is refused."""
    clock = [1.0]
    dealers = [node(net, name, port, clock) for name, port in (("a", 9001), ("b", 9002), ("c", 9003))]
    mesh(net, 9001, 9002, 9003)
    callees = []
    for dealer in dealers:
        clock[0] += 1
        callees.append(register(dealer, "com.rr", invoke="roundrobin"))
        net.flush()
    other = Party()
    dealers[1].register(other, "realm1", message.Register(9, "com.rr", invoke="random"))
    assert [m.error for m in other.take()] == ["wamp.error.procedure_already_exists"]
    caller = Party()
    got = []
    for request in range(1, 7):
        dealers[2].call(caller, "realm1", message.Call(request, "com.rr"))
        net.flush()
        got.append(next(i for i, c in enumerate(callees) if c.take()))
    assert got == [0, 1, 2, 0, 1, 2]


def test_pattern_registration_on_another_node_gets_details_procedure(net: MemoryNetwork) -> None:
    """A prefix registration on node b answers a CALL on node a, and its INVOCATION names the procedure."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    mesh(net, 9001, 9002)
    callee = register(b, "com.app.", match="prefix")
    net.flush()
    a.call(Party(), "realm1", message.Call(1, "com.app.x.y"))
    net.flush()
    [invocation] = callee.take()
    assert invocation.procedure == "com.app.x.y"


def test_invocation_over_the_link_limit_is_an_error_to_the_caller(net: MemoryNetwork) -> None:
    """An INVOCATION that would not fit a link frame is never sent: the caller gets payload_size_exceeded."""
    limits = psc.Limits(max_message_size=4096, link_headroom=1024)
    a, b = node(net, "a", 9001, limits=limits), node(net, "b", 9002, limits=limits)
    mesh(net, 9001, 9002)
    callee = register(b, "com.big")
    net.flush()
    caller = Party()
    a.call(caller, "realm1", message.Call(1, "com.big", args=["x" * 6000]))
    [answer] = caller.take()
    assert answer.error == "wamp.error.payload_size_exceeded"
    assert callee.take() == [] and a.tables()["calls"] == 0


def test_older_peer_gets_no_procedures_and_pub_sub_still_works(net: MemoryNetwork) -> None:
    """A node speaking 0.6 links at 0.6: it is sent no PSC401, and its callers see no remote procedures."""
    a = node(net, "a", 9001)
    old: Federation = net.node("old", 9002, replay=REPLAY)
    old.versions = tuple(v for v in old.versions if v < psc.V0_7)
    register(a, "com.add")
    mesh(net, 9001, 9002)
    assert {r["version"] for r in a.federation.links()} == {"0.6"}  # type: ignore[attr-defined]
    assert all(b"[401," not in payload for link in net.links for _, payload in link.server_wire.frames())


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b'[401,1,"realm1","p","regex","single",1.0]', "PSC401 match must be one of"),
        (b'[404,0,null,null,{}]', "PSC404 call must be an integer"),
        (b'[403,1,1,"p",null,null,{}]', "unexpected Call"),
    ],
)
def test_bad_rpc_message_closes_the_link(net: MemoryNetwork, frame: bytes, reason: str) -> None:
    """A malformed PSC4xx, or one the sender's role may not send, closes the link 4400 naming the problem."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    a.federation.add_server(psc_url(9002))  # type: ignore[attr-defined]
    [link] = net.answer()
    # The producer (b's end) sends it to the consumer (a).
    [session] = [s for s in b.federation._links if s.with_rpc]  # type: ignore[attr-defined]
    session.send_raw(frame)
    net.flush()
    closed = link.client_wire.close()
    assert closed is not None and closed[0] == CLOSE_BAD_MESSAGE and reason in closed[1], closed


def test_codec_round_trips() -> None:
    """Every PSC4xx decodes to what was encoded, binary values included."""
    for msg in (
        psc_rpc.Register(1, "r", "p.", "prefix", "roundrobin", 12.5),
        psc_rpc.Unregister(3),
        psc_rpc.Call(4, 5, "p.x", [1, b"\x00"], {"a": "\x00s"}, 1000, True, 77, "joe", "user"),
        psc_rpc.Result(4, None, None, True),
        psc_rpc.Error(4, "app.e", ["x"], {"k": [1]}),
        psc_rpc.Cancel(4, "skip"),
    ):
        assert psc.decode(psc.encode(msg)) == msg


def test_caller_disclosure_across_nodes_as_the_callers_node_decides(net: MemoryNetwork) -> None:
    """The caller's identity reaches a callee on another node when the caller's node discloses it (disclose_me or
    ``always``) or the registration asked ``disclose_caller``; otherwise the INVOCATION names nobody."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    mesh(net, 9001, 9002)
    plain = register(b, "com.plain")
    asks = Party()
    b.register(asks, "realm1", message.Register(2, "com.asks"), interruptible=True, disclose_caller=True)
    local = Party()
    a.register(local, "realm1", message.Register(3, "com.local"), disclose_caller=True)
    net.flush()
    who = (41, "alice", "writer")
    cases = [
        (plain, "com.plain", who, False, (None, None, None)),
        (plain, "com.plain", who, True, who),
        (asks, "com.asks", who, False, who),
        # [wamp] disclose-caller = never: the caller's node hands no identity over.
        (asks, "com.asks", (None, None, None), False, (None, None, None)),
        (local, "com.local", who, False, who),
    ]
    for i, (callee, procedure, identity, disclose, expected) in enumerate(cases):
        callee.take()
        a.call(Party(), "realm1", message.Call(10 + i, procedure), identity=identity, disclose=disclose)
        net.flush()
        [invocation] = [m for m in callee.take() if isinstance(m, message.Invocation)]
        assert (invocation.caller, invocation.caller_authid, invocation.caller_authrole) == expected, (procedure, i)


def test_disclosure_options_survive_autobahns_parser() -> None:
    """CALL ``disclose_me`` and REGISTER ``disclose_caller`` (dropped by Autobahn's parse) are kept by the codec."""
    from autobahn.wamp.serializer import JsonSerializer

    from pubsubclub.frontends.wamp.codec import DisclosingCall, DisclosingRegister, decode

    serializer = JsonSerializer()
    raw = b'[48,1,{"disclose_me":true},"com.x",[1]]'
    [call] = decode(serializer, raw, False)
    assert type(call) is DisclosingCall and call.args == [1] and isinstance(call, message.Call)
    [call] = decode(serializer, b'[48,2,{},"com.x"]', False)
    assert type(call) is message.Call
    [reg] = decode(serializer, b'[64,3,{"disclose_caller":true},"com.x"]', False)
    assert type(reg) is DisclosingRegister
    [reg] = decode(serializer, b'[64,4,{"disclose_caller":false},"com.x"]', False)
    assert type(reg) is message.Register
    disclosed = psc_rpc.Call(4, 5, "p.x", None, None, None, False, 77, "joe", "user", True)
    assert psc.decode(psc.encode(disclosed)) == disclosed


def test_calls_from_one_node_have_their_own_cap(net: MemoryNetwork) -> None:
    """``[wamp] max-calls-per-link`` bounds the calls in flight from one other node apart from the node's own cap."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    b.max_link_calls = 2
    mesh(net, 9001, 9002)
    callee = register(b, "com.slow")
    net.flush()
    caller = Party()
    for request in (1, 2, 3):
        a.call(caller, "realm1", message.Call(request, "com.slow"))
    net.flush()
    assert len(callee.take()) == 2
    [refused] = caller.take()
    assert (refused.request, refused.error) == (3, "pubsubclub.error.too_many_calls")
    assert refused.kwargs == {"limit": "wamp.max-calls-per-link", "max": 2}
    # Local callers are held to the node's cap only.
    local = Party()
    for request in (4, 5, 6):
        b.call(local, "realm1", message.Call(request, "com.slow"))
    assert len(callee.take()) == 3 and local.take() == []


def test_rpc_payload_over_the_json_bounds_fails_that_call_only(net: MemoryNetwork) -> None:
    """A PSC404 or PSC403 whose args break the JSON bounds ends that one call with wamp.error.invalid_payload;
    the link stays open and the next call goes through."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    a.federation.add_server(psc_url(9002))  # type: ignore[attr-defined]
    [link] = net.answer()
    callee = register(b, "com.deep")
    net.flush()
    [producer] = [s for s in b.federation._links if s.with_rpc]  # type: ignore[attr-defined]
    [consumer] = [s for s in a.federation._links if s.with_rpc]  # type: ignore[attr-defined]
    deep = b"[" * 70 + b"]" * 70
    caller = Party()
    for request, inject in ((1, "result"), (2, "call")):
        a.call(caller, "realm1", message.Call(request, "com.deep"))
        net.flush()
        [call_id] = list(a._calls)
        [registration] = list(b._by_id)
        if inject == "result":
            producer.send_raw(b"[404,%d,%s,null,{}]" % (call_id, deep))
        else:
            consumer.send_raw(b'[403,%d,%d,"com.deep",%s,null,{}]' % (call_id, registration, deep))
        net.flush()
        [answer] = caller.take()
        assert (answer.request, answer.error) == (request, "wamp.error.invalid_payload"), answer.args
        assert "nested deeper than" in answer.args[0]
        assert link.client_wire.close() is None
        for m in callee.take():
            if isinstance(m, message.Invocation):
                b.yielded(callee, message.Yield(m.request, args=["late"]))
        net.flush()
    a.call(caller, "realm1", message.Call(3, "com.deep"))
    net.flush()
    [invocation] = [m for m in callee.take() if isinstance(m, message.Invocation)]
    b.yielded(callee, message.Yield(invocation.request, args=["ok"]))
    net.flush()
    assert [(m.request, m.args) for m in caller.take()] == [(3, ["ok"])]
