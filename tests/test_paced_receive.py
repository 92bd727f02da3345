"""Node B's paced path, narrower (docs/benchmarks.md, "Node B's paced path, narrower"): each step against the old."""

from __future__ import annotations

import socket
import sys
from typing import Any

import orjson
import pytest
import pytest_twisted
from helpers.linkowner import open_consumer, outcome
from helpers.rawsocketclient import read_exactly
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import epollreactor, interfaces, protocol
from zope.interface import implementer

from pubsubclub.core.jsonbounds import text_within
from pubsubclub.federation import psc
from pubsubclub.federation.session import LinkSession, LinkState, Role
from pubsubclub.net import writethrough
from pubsubclub.net.reactor import TurnReactor

# -- the lone PSC301 read in LinkSession.receive ------------------------------------------------------------------


#: (version spoken, PSC104 heard, a link whose owner takes lone messages as fields)
_LINKS = [(psc.V0_8, True, True), (psc.V0_8, False, True), (psc.V0_3, True, True), (psc.V0_2, False, True),
          (psc.V0_1, False, True), (psc.V0_8, True, False), (psc.V0_2, False, False)]  # fmt: skip


def _original_receive(session: LinkSession, data: bytes) -> None:
    """LinkSession.receive of a frame without a batch's newline as it was (eeb8bca): bounds scan, batch reader."""
    if data and session.role is Role.CONSUMER and session.state is LinkState.OPEN:
        session.last_size = len(data)
        bounded = (session.batched or psc.BATCH_SEPARATOR not in data) and text_within(
            data, session._limits.json, wrapper_depth=1
        )
        session._receive_publishes((data,), bounded)
        return
    session._receive_one(data)


def _same_as_the_original(frame: bytes, version: psc.Version, position: bool, plain: bool) -> None:
    if version >= psc.V0_4 and psc.BATCH_SEPARATOR in frame:
        return  # a batch frame: receive's other branch, unchanged
    new_session, new_owner = open_consumer(version, position, plain)
    old_session, old_owner = open_consumer(version, position, plain)
    new = outcome(new_session, new_owner, new_session.receive, frame)
    old = outcome(old_session, old_owner, lambda data: _original_receive(old_session, data), frame)
    assert new == old, frame


_META = b'{"o":"n1","t":1.5,"i":"n1-b-1","s":1}'
_HOSTILE = [
    b'[301,"t","x",' + _META + b"]",  # the usual one
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"w":1}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"w":0}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"w":2}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"w":true}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"w":1.0}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1"}]',  # no sequence number
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":null}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":0}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":9007199254740992}]',  # past 2**53-1
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1.0}]',
    b'[301,"t","x",{"t":1.5,"i":"n1-b-1","s":1}]',  # no origin
    b'[301,"t","x",{"o":"n1","i":"n1-b-1","s":1}]',  # no time
    b'[301,"t","x",{"o":"n1","t":1.5,"s":1}]',  # no id
    b'[301,"t","x",{"o":null,"t":1.5,"i":"n1-b-1","s":1}]',
    b'[301,"t","x",{"o":"n1","t":"1.5","i":"n1-b-1","s":1}]',
    b'[301,"t","x",{"o":"n1","t":1,"i":"n1-b-1","s":1}]',  # an integer time
    b'[301,"t","x",{"o":"n1","t":-0.5,"i":"n1-b-1","s":1}]',
    b'[301,"t","x",{"o":"n1","t":1e11,"i":"n1-b-1","s":1}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":7,"s":1}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"b":1}]',
    b'[301,"t","AAE=",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"b":2}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"b":null}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"p":{"e":[7]}}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"p":{"zz":1}}]',
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"s":2}]',  # a repeated key
    b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":1,"extra":[1]}]',
    b'[301,"t","x",[1,2]]',  # metadata not an object
    b'[301,"t","x",null]',
    b'[301,"t","x"]',  # no metadata
    b'[301,"t"]',
    b'[301,"t","x",' + _META + b",5]",
    b'[301,"","x",' + _META + b"]",  # an empty topic
    b'[301,"' + b"t" * 512 + b'","x",' + _META + b"]",  # the longest topic
    b'[301,"' + b"t" * 513 + b'","x",' + _META + b"]",
    b'[301,7,"x",' + _META + b"]",
    b'[301.0,"t","x",' + _META + b"]",
    b'[true,"t","x",' + _META + b"]",
    b'["301","t","x",' + _META + b"]",
    b'[302,"t","x",' + _META + b"]",
    b'[301,"t",' + b"[" * 63 + b"1" + b"]" * 63 + b"," + _META + b"]",  # at the depth bound (64 with the wrapper)
    b'[301,"t",' + b"[" * 64 + b"1" + b"]" * 64 + b"," + _META + b"]",  # one past it: dropped
    b'[301,"t","' + b"[" * 70 + b'",' + _META + b"]",  # brackets in a string: the scan is cautious, decode tells
    b'[301,"t",' + b'{"a":' * 31 + b"[" * 32 + b"1" + b"]" * 32 + b"}" * 31 + b"," + _META + b"]",  # 65 openers, mixed
    b'[301,"t",' + b'{"a":' * 32 + b"[" * 32 + b"1" + b"]" * 32 + b"}" * 32 + b"," + _META + b"]",  # 66 openers
    b'[301,"t","1234567890123456789",' + _META + b"]",  # 19 digits in a string: cautious, decode tells
    b'[301,"t",123456789012345678,' + _META + b"]",  # 18 digits
    b'[301,"t",1234567890123456789,' + _META + b"]",  # 19 digits within 64 bits
    b'[301,"t",12345678901234567890123,' + _META + b"]",  # beyond 64 bits: dropped
    b'[301,"t","1234567890123456789012",' + _META + b"]",  # the digits in a string
    b'[301,"t",1e400,' + _META + b"]",
    b'[301,"t","\xff",' + _META + b"]",  # not UTF-8
    b'[301,"t","\\ud800",' + _META + b"]",  # a lone surrogate
    b'[301,"t","x",' + _META + b"]   ",  # trailing blanks
    b' [301,"t","x",' + _META + b"]",
    b'[301,"t","x",' + _META + b"]]",
    b'[301,"t","x",' + _META,  # cut short
    b'[301,"t",\n"x",' + _META + b"]",  # a newline: one message before 0.4, a batch from 0.4
    b'[301,"t","x",' + _META + b"]" + b" " * 1_200_000,  # over the frame limit
    b'[104,"e",5,0]',
    b'[104,"e",0,0]',
    b'[201,"t"]',
    b"[402,1,{},[1]]",
    b'[501,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1"}]',
    b"[]",
    b"{}",
    b"null",
    b"301",
    b"not json",
    b"",
]


@pytest.mark.parametrize("frame", _HOSTILE)
@pytest.mark.parametrize(("version", "position", "plain"), _LINKS)
def test_a_lone_frame_ends_as_the_original_receive_ended_it(
    frame: bytes, version: psc.Version, position: bool, plain: bool
) -> None:
    """receive's in-place PSC301 read: every lone frame (hostile ones too) has the original's errors, calls, state."""
    _same_as_the_original(frame, version, position, plain)


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.text(max_size=5), st.just("n1"), st.just(1.5), st.just(1), st.just([1]), st.just({"e": [7]}),
)  # fmt: skip
_KEYS = st.sampled_from(["o", "t", "i", "w", "s", "b", "p", "x"])


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(_KEYS, _VALUES, max_size=7),
    base=st.booleans(),
    topic=st.one_of(st.just("t"), st.just(""), st.integers(), st.text(max_size=3)),
    payload=st.recursive(st.integers() | st.text(max_size=3), lambda inner: st.lists(inner, max_size=2), max_leaves=8),
    cut=st.integers(min_value=0, max_value=3),
    link=st.sampled_from(_LINKS),
)
def test_any_lone_psc301_ends_as_the_original_receive_ended_it(
    fields: dict[str, Any], base: bool, topic: Any, payload: Any, cut: int, link: tuple[psc.Version, bool, bool]
) -> None:
    """PSC301s with any metadata, topic and payload (also cut short) end as the original receive ended them."""
    meta = {"o": "n1", "t": 1.5, "i": "n1-b-1", "s": 1, **fields} if base else fields
    try:
        frame = orjson.dumps([301, topic, payload, meta])
    except TypeError:
        return  # not JSON (an integer past 64 bits)
    if cut:
        frame = frame[: len(frame) - cut]
    _same_as_the_original(frame, *link)


def test_a_lone_plain_psc301_reaches_the_owner_without_the_batch_reader() -> None:
    """The usual paced frame goes from receive to link_received_plain; others reach the batch reader read once."""
    session, owner = open_consumer(psc.V0_8, True, True)
    handed: list[tuple[Any, ...]] = []
    session._receive_publishes = lambda *args: handed.append(args)  # type: ignore[method-assign]
    usual = b'[301,"t","x",' + _META + b"]"
    session.receive(usual)
    assert handed == []
    assert owner.calls == [("received", psc.Publish("t", "x", psc.Meta("n1", 1.5, "n1-b-1", False, 1)), len(usual))]
    routed = b'[301,"t","x",{"o":"n1","t":1.5,"i":"n1-b-1","s":2,"p":{"e":[7]}}]'
    session.receive(routed)
    assert handed == [((routed,), True, orjson.loads(routed))]  # decoded here, handed on, not read again


# -- the reactor's TCP read -----------------------------------------------------------------------------------------


class _Server(protocol.Protocol):
    """Records what it is handed; raises on b"raise"."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        self.events.append(("data", data))
        if data.endswith(b"raise"):
            raise RuntimeError("a protocol bug")

    def connectionLost(self, reason: Any) -> None:  # noqa: N802 - Twisted API
        self.events.append(("lost", type(reason.value).__name__))


@implementer(interfaces.IHalfCloseableProtocol)
class _HalfServer(_Server):
    """A protocol that takes a half-close (the peer's FIN) as readConnectionLost."""

    def readConnectionLost(self) -> None:  # noqa: N802 - Twisted API
        self.events.append(("read lost",))
        self.transport.loseConnection()  # type: ignore[union-attr]

    def writeConnectionLost(self) -> None:  # noqa: N802 - Twisted API
        self.events.append(("write lost",))


def _spin(r: Any, until: Any) -> None:
    for _ in range(500):
        if until():
            return
        r.runUntilCurrent()
        r.doIteration(0.01)
    raise AssertionError("the reactor never got there")


def _recording_factory(server_class: type, events: list[Any], made: list[Any]) -> protocol.Factory:
    """A factory whose protocols are ``server_class(events)``, each appended to ``made`` as it is built."""

    def build() -> Any:
        server = server_class(events)
        made.append(server)
        return server

    factory = protocol.Factory()
    factory.protocol = build  # type: ignore[assignment]
    return factory


def _serve(r: Any, server_class: type, events: list[Any]) -> tuple[Any, socket.socket, list[Any]]:
    """A listening port on ``r``, a client socket connected to it, and the server protocol once accepted."""
    made: list[Any] = []
    port = r.listenTCP(0, _recording_factory(server_class, events, made), interface="127.0.0.1")
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    _spin(r, lambda: made and made[0].transport is not None)
    return port, client, made


def _close(r: Any, port: Any, client: socket.socket) -> None:
    """Close the client, the port and what a hand-driven reactor holds open (its epoll and waker)."""
    client.close()
    port.stopListening()
    r.removeAll()
    if r.waker is not None:
        r.waker.connectionLost(None)
    r._poller.close()


def _tcp_story(reactor_class: type, server_class: type, act: Any, logged: list[dict[str, Any]]) -> list[Any]:
    """What a TCP server protocol on a hand-driven ``reactor_class`` saw while a client socket did ``act``."""
    r = reactor_class()
    events: list[Any] = []
    port, client, _ = _serve(r, server_class, events)
    try:
        act(client, r, events)
        _spin(r, lambda: events and events[-1][0] == "lost")
        r.runUntilCurrent()
        r.doIteration(0)
    finally:
        _close(r, port, client)
    errors = [str(e.get("log_failure") or e.get("failure")) for e in logged]
    logged.clear()
    return [*events, ("logged", len(errors), any("a protocol bug" in e for e in errors))]


def _data_then_fin(client: socket.socket, r: Any, events: list[Any]) -> None:
    client.sendall(b"hello")
    _spin(r, lambda: events)
    client.shutdown(socket.SHUT_WR)


def _raising(client: socket.socket, r: Any, events: list[Any]) -> None:
    client.sendall(b"raise")


def _reset(client: socket.socket, r: Any, events: list[Any]) -> None:
    client.sendall(b"bye")
    _spin(r, lambda: events)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()


@pytest.mark.parametrize("server_class", [_Server, _HalfServer])
@pytest.mark.parametrize("act", [_data_then_fin, _raising, _reset])
def test_the_turn_reactor_reads_tcp_as_twisted_does(server_class: type, act: Any, logged_errors: list[Any]) -> None:
    """A TCP read made by the reactor itself: the same data, the same close (done, lost, half) and logged errors."""
    ours = _tcp_story(TurnReactor, server_class, act, logged_errors)
    twisteds = _tcp_story(epollreactor.EPollReactor, server_class, act, logged_errors)
    assert ours == twisteds
    assert ours[0][0] == "data"


def test_the_turn_reactor_reads_tcp_without_twisteds_read_calls() -> None:
    """A readable TCP connection's bytes reach its protocol with no _doReadOrWrite, doRead or _dataReceived call."""
    r = TurnReactor()
    events: list[Any] = []
    port, client, _ = _serve(r, _Server, events)
    called: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            called.append(frame.f_code.co_name)

    try:
        client.sendall(b"hello")
        sys.setprofile(profile)
        try:
            _spin(r, lambda: events)
        finally:
            sys.setprofile(None)
        assert events == [("data", b"hello")]
        assert "dataReceived" in called
        assert not {"_doReadOrWrite", "doRead", "_dataReceived"} & set(called), called
    finally:
        _close(r, port, client)


# -- write-through: a turn's first write, and no flush when nothing gathered ----------------------------------------


async def _pair() -> tuple[Any, socket.socket, Any]:
    from twisted.internet import defer, reactor

    class _Keep(protocol.Protocol):
        def connectionMade(self) -> None:  # noqa: N802 - Twisted API
            connected.callback(self)

    connected: defer.Deferred[Any] = defer.Deferred()
    port = reactor.listenTCP(0, protocol.Factory.forProtocol(_Keep), interface="127.0.0.1")  # type: ignore[attr-defined]
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    server = await connected
    return server, client, port


@pytest_twisted.ensureDeferred
async def test_a_turn_with_one_write_per_connection_asks_for_no_flush() -> None:
    """One write in a turn leaves in the call and asks only for the C uncork; a second gathers, then one flush."""
    from twisted.internet import reactor, task

    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        server.transport.write(b"one")
        assert read_exactly(client, 3, 5.0) == b"one"
        assert writethrough._turn.due is False and writethrough._turn.corked == []
        assert server.transport.write in writethrough._through
        await task.deferLater(reactor, 0, lambda: None)
        assert not writethrough._through  # uncorked at the turn's end
        server.transport.write(b"two")
        server.transport.write(b"three")  # the same turn: gathered
        assert writethrough._turn.due is True and server.transport._tempDataLen == 5
        await task.deferLater(reactor, 0, lambda: None)
        assert read_exactly(client, 8, 5.0) == b"twothree"
        assert not writethrough._through and writethrough._turn.due is False
        assert server.transport not in reactor.getWriters()  # type: ignore[attr-defined]
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()


def test_writes_after_the_uncork_still_gather_until_the_flush() -> None:
    """On the node's reactor, a connection that gathered keeps gathering until its flush, in order, in one send."""
    r = TurnReactor()
    events: list[Any] = []
    port, client, made = _serve(r, _Server, events)
    try:
        conn = made[0].transport
        assert writethrough.install(conn)
        sends: list[bytes] = []
        real = conn.socket

        class _Counting:
            def send(self, data: bytes) -> int:
                sends.append(data)
                return real.send(data)  # type: ignore[no-any-return]

        conn.write._sock = _Counting()
        writethrough._through.clear()  # what another test's reactor may have left for its next turn
        conn.write(b"a")  # through; the uncork asked for
        r.at_turn_end(lambda: conn.write(b"c"))  # runs after the uncork, before the flush
        conn.write(b"b")  # gathered; the flush asked for
        r.doIteration(0)
        assert read_exactly(client, 3, 5.0) == b"abc"
        assert sends == [b"a", b"bc"]
        assert not writethrough._through and conn not in r.getWriters()
    finally:
        _close(r, port, client)


# -- the EVENT's unsent count: EdgeConnection.unsent read in place --------------------------------------------------


class _Buffer:
    """What the guard reads of a TCP connection's buffer."""

    def __init__(self, data: list[bytes], offset: int, temp: int) -> None:
        self.dataBuffer, self.offset, self._tempDataLen = b"".join(data), offset, temp


@pytest.mark.parametrize("buffer", [None, _Buffer([], 0, 0), _Buffer([b"abcdef"], 2, 0), _Buffer([b"ab"], 0, 9)])
@pytest.mark.parametrize("closing", [False, True])
@pytest.mark.parametrize("held", [None, 0, 17])
def test_a_wamp_connections_unsent_count_is_the_guards_plus_what_is_held(buffer: Any, closing: bool, held: Any) -> None:
    """WebSocket and RawSocket unsent_bytes read the guard's count in place: EdgeConnection.unsent's, plus held."""
    from twisted.internet.address import IPv4Address
    from twisted.internet.task import Clock

    from pubsubclub.frontends.wamp.rawsocket import WampRawSocketProtocol
    from pubsubclub.frontends.wamp.transport import WampServerProtocol
    from pubsubclub.net import wsframes
    from pubsubclub.net.edge import Edge, EdgeLimits

    clock = Clock()
    edge = Edge(clock, lambda *a: None, lambda *a: None)
    guard = edge.guard("wamp", protocol.Factory.forProtocol(protocol.Protocol), EdgeLimits())
    conn = guard.buildProtocol(IPv4Address("TCP", "127.0.0.1", 5555))
    conn._buffer = buffer
    conn.closing = closing
    websocket = WampServerProtocol.__new__(WampServerProtocol)
    rawsocket = WampRawSocketProtocol.__new__(WampRawSocketProtocol)
    websocket.transport = rawsocket.transport = conn
    try:
        if held is not None:
            wsframes._held = {websocket: [held, [b"x" * held]]} if held else {}
        assert websocket.unsent_bytes() == conn.unsent() + (held or 0)
        assert rawsocket.unsent_bytes() == conn.unsent()
    finally:
        wsframes._held = None


# -- the guard's write is the write-through: one call, the same rules -----------------------------------------------


def _guarded_story(merged: bool) -> list[Any]:
    """Writes to a guarded TCP connection whose client never reads, past the cap: what the guard did after each."""
    from pubsubclub.net.edge import Edge, EdgeLimits

    r = TurnReactor()
    drops: list[tuple[str, str]] = []
    edge = Edge(r, lambda *a: None, lambda *a: drops.append(a))
    events: list[Any] = []
    made: list[Any] = []
    limits = EdgeLimits(max_pending_bytes=300_000, handshake_timeout=0, idle_timeout=0, ping_interval=0)
    listener = edge.guard("wamp", _recording_factory(_Server, events, made), limits)
    port = r.listenTCP(0, listener, interface="127.0.0.1")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port.getHost().port))
    try:
        _spin(r, lambda: made and made[0].transport is not None)
        guard = made[0].transport
        guard._buffer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        assert guard.write is guard._buffer.write  # one call per write
        if not merged:
            del guard.write  # the guard's own method, around the write-through
        story: list[Any] = []
        for size in (10, 20, 100_000, 100_000, 100_000, 100_000, 30, 30):
            guard.write(b"w" * size)
            story.append((guard.closing, list(drops), guard._buffer._tempDataLen > 0 or guard.unsent() > 0))
            r.runUntilCurrent()
            r.doIteration(0)
        return story
    finally:
        _close(r, port, client)


def test_the_guards_write_is_the_write_through_with_the_guards_rules() -> None:
    """Plain TCP: the guard's write is the write-through itself; past the cap it drops once, then writes nothing."""
    merged = _guarded_story(True)
    assert merged == _guarded_story(False)
    assert merged[-1][:2] == (True, [("wamp", "slow_consumer")])
    assert merged[0] == (False, [], False)
