"""An idle WAMP RawSocket connection keeps little, and still works and refuses as before.

In memory: the node's own RawSocket factory on string transports (some
behind the connection layer's guard), timers on a memory clock. Then one
node in this process, on the real reactor, for what only a real TCP
connection shows (the guard reads the TCP buffer, so no send backlog).
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from helpers.polling import until
from helpers.ports import free_port
from helpers.rawsocketclient import read_exactly
from twisted.internet import reactor, threads
from twisted.internet.testing import MemoryReactorClock, StringTransport

from pubsubclub.config.load import add_node_flags, node_config
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.wamp.rawsocket import WampRawSocketFactory, WampRawSocketProtocol
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.net.edge import Edge, EdgeLimits
from pubsubclub.node.node import Node

HELLO = [1, "realm1", {"roles": {"subscriber": {}, "publisher": {}, "caller": {}, "callee": {}}}]
#: The client's handshake: messages up to 16 MiB (LENGTH 15), JSON (1).
HANDSHAKE = bytes([0x7F, 0xF1, 0, 0])


def frame(message: Any, kind: int = 0) -> bytes:
    """One RawSocket frame: a WAMP message (a list, as JSON) or raw bytes."""
    payload = message if isinstance(message, bytes) else json.dumps(message).encode()
    return struct.pack("!I", (kind << 24) | len(payload)) + payload


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The (type, payload) of every whole frame in ``data`` (a server's output after its handshake)."""
    out = []
    while len(data) >= 4:
        (word,) = struct.unpack("!I", data[:4])
        out.append((word >> 24, data[4 : 4 + (word & 0xFFFFFF)]))
        data = data[4 + (word & 0xFFFFFF) :]
    return out


def messages(wire: StringTransport) -> list[Any]:
    """The WAMP messages the server wrote since the wire was last cleared (PING/PONG left out); clears it."""
    out = [json.loads(payload) for kind, payload in frames(wire.value()) if kind == 0]
    wire.clear()
    return out


class Wire(StringTransport):
    """A string transport that lets the protocol unregister a producer it never registered."""

    def unregisterProducer(self) -> None:  # noqa: N802 - Twisted API
        """Forget the producer, if any."""
        self.producer = None


def connection(factory: WampRawSocketFactory) -> tuple[WampRawSocketProtocol, Wire]:
    """A connection of ``factory`` on a string transport, before its handshake."""
    protocol = factory.buildProtocol(None)
    wire = Wire()
    protocol.makeConnection(wire)
    return protocol, wire


def joined(factory: WampRawSocketFactory, clock: MemoryReactorClock) -> tuple[WampRawSocketProtocol, Wire]:
    """A connection of ``factory`` past the handshake and HELLO/WELCOME, its wire cleared."""
    protocol, wire = connection(factory)
    protocol.dataReceived(HANDSHAKE + frame(HELLO))
    clock.advance(0)
    assert wire.value()[:2] == bytes([0x7F, (11 << 4) | 1]), wire.value()
    wire.io.seek(4)
    assert frames(wire.io.read())[0][1].startswith(b"[2,")
    wire.clear()
    return protocol, wire


@pytest.fixture
def setup() -> tuple[WampRawSocketFactory, MemoryReactorClock]:
    """The node's RawSocket factory for one router on a memory clock."""
    clock = MemoryReactorClock()
    return WampRawSocketFactory(WampRouter(Hub("n1"), call_later=clock.callLater)), clock


def test_idle_connection_keeps_little(setup: tuple[WampRawSocketFactory, MemoryReactorClock]) -> None:
    """Joined and subscribed: no instance dictionary content, the factory's serializer, nothing held between frames."""
    factory, clock = setup
    protocol, wire = joined(factory, clock)
    protocol.dataReceived(frame([32, 1, {}, "slim.topic"]))
    assert messages(wire)[0][0] == 33
    # Router, serializers, limits and factory live on the factory's class; the state in slots.
    assert vars(protocol) == {}, sorted(vars(protocol))
    assert protocol.factory is factory and protocol._router is factory.router
    assert protocol._serializer is factory.serializers[1]  # shared, not a copy per connection
    assert protocol._buffer is None and protocol.pending_input() == 0
    assert protocol._max_send == 2**24 and protocol.max_send_size == 2**24
    assert sys.getsizeof(protocol) <= 160
    protocol.connectionLost()


def test_unfinished_frame_is_held_until_complete_then_let_go(
    setup: tuple[WampRawSocketFactory, MemoryReactorClock],
) -> None:
    """Half a frame is held (and reported to the guard); completed, it is answered and nothing stays held."""
    factory, clock = setup
    protocol, wire = joined(factory, clock)
    data = frame([32, 7, {}, "slim.half"])
    protocol.dataReceived(data[:3])
    assert protocol.pending_input() == 3
    protocol.dataReceived(data[3:10])
    assert protocol.pending_input() == 10 and wire.value() == b""
    protocol.dataReceived(data[10:] + frame(b"ping", kind=1)[:5])
    assert messages(wire) == [[33, 7, messages_id(protocol, "slim.half")]]
    assert protocol.pending_input() == 5
    protocol.dataReceived(frame(b"ping", kind=1)[5:])
    assert frames(wire.value()) == [(2, b"ping")]
    assert protocol._buffer is None and protocol.pending_input() == 0
    protocol.connectionLost()


def messages_id(protocol: WampRawSocketProtocol, topic: str) -> int:
    """The subscription id ``protocol``'s session has for ``topic``."""
    return protocol._session._topics[topic]  # type: ignore[no-any-return]


def test_any_split_of_the_input_gets_the_same_answers(
    setup: tuple[WampRawSocketFactory, MemoryReactorClock],
) -> None:
    """Handshake, PING, HELLO, SUBSCRIBE and junk fed whole, octet by octet or in odd chunks: the same output."""
    factory, clock = setup
    data = HANDSHAKE + frame(b"p1", kind=1) + frame(HELLO) + frame([32, 1, {}, "slim.split"]) + frame(b"{nope")
    outputs = []
    for size in (len(data), 1, 3, 7, 64):
        factory.router.new_id = iter(range(1000, 2000)).__next__  # the same ids every time
        protocol, wire = connection(factory)
        for at in range(0, len(data), size):
            protocol.dataReceived(data[at : at + size])
            clock.advance(0)
        outputs.append((wire.value(), wire.disconnecting))
        protocol.connectionLost()
    assert all(out == outputs[0] for out in outputs), outputs
    kinds = [(kind, payload[:3]) for kind, payload in frames(outputs[0][0][4:])]
    assert kinds == [(2, b"p1"), (0, b"[2,"), (0, b"[33"), (0, b"[3,")]  # PONG, WELCOME, SUBSCRIBED, ABORT


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"GET / HTTP/1.1\r\n", b""),  # not RawSocket: dropped with no answer
        (bytes([0x7F, 0xF4, 0, 0]), bytes([0x7F, 1 << 4, 0, 0])),  # serializer 4: error 1
        (bytes([0x7F, 0xF1, 1, 0]), bytes([0x7F, 3 << 4, 0, 0])),  # reserved bits: error 3
    ],
)
def test_bad_handshakes_get_the_same_answers(
    setup: tuple[WampRawSocketFactory, MemoryReactorClock], data: bytes, answer: bytes
) -> None:
    """A first octet other than 0x7F is dropped unanswered; a bad serializer or reserved bits get their error."""
    factory, _ = setup
    protocol, wire = connection(factory)
    protocol.dataReceived(data)
    assert wire.value() == answer and wire.disconnecting
    assert protocol._session is None
    protocol.connectionLost()


@pytest.mark.parametrize(
    "bad",
    [
        struct.pack("!I", 2**20 + 1),  # longer than the server's announced 1 MiB
        struct.pack("!I", 7 << 24),  # unknown frame type
        struct.pack("!I", 0x08 << 24),  # a reserved bit
    ],
)
def test_bad_frames_close_the_connection(setup: tuple[WampRawSocketFactory, MemoryReactorClock], bad: bytes) -> None:
    """An oversize frame, an unknown type or a reserved bit (after a good frame in the same read) closes it."""
    factory, clock = setup
    protocol, wire = joined(factory, clock)
    protocol.dataReceived(frame(b"ok", kind=1) + bad + b"xx")
    assert frames(wire.value()) == [(2, b"ok")]
    assert wire.disconnecting and not protocol.isOpen()
    assert protocol.pending_input() == len(bad) + 2  # what it held when it gave up, as before
    protocol.connectionLost()


def test_a_peer_that_stops_mid_frame_is_closed_by_the_guard() -> None:
    """Behind the guard: a peer that stops mid-frame is dropped for partial input; an idle one is pinged."""
    clock = MemoryReactorClock()
    factory = WampRawSocketFactory(WampRouter(Hub("n1"), call_later=clock.callLater))
    drops: list[tuple[str, str]] = []
    edge = Edge(clock, lambda *_: None, lambda listener, reason: drops.append((listener, reason)))
    limits = EdgeLimits(handshake_timeout=5, idle_timeout=0, ping_interval=2)
    listener = edge.guard("rawsocket", factory, limits)
    guarded = []
    for _ in range(2):
        connection = listener.buildProtocol(None)
        wire = Wire()
        connection.makeConnection(wire)
        connection.dataReceived(HANDSHAKE + frame(HELLO))
        clock.advance(0)
        wire.clear()
        guarded.append((connection, wire))
    (half, half_wire), (idle, idle_wire) = guarded
    half.dataReceived(frame([32, 1, {}, "slim.mid"])[:6])
    clock.pump([0.5] * 6)  # the guard's sweeps: quiet for 2 s after the first
    assert frames(idle_wire.value()) == [(1, b"")]  # the keepalive PING
    assert frames(half_wire.value()) == [(1, b"")] and not drops
    clock.pump([0.5] * 6)  # quiet for 5 s with half a frame held
    assert drops == [("rawsocket", "partial_input_timeout")]
    assert half_wire.disconnecting and not idle_wire.disconnecting
    for connection, _ in guarded:
        connection.connectionLost()
    edge.stop()


def test_slimmed_connections_subscribe_publish_call_and_close(
    setup: tuple[WampRawSocketFactory, MemoryReactorClock],
) -> None:
    """Two slimmed connections: an EVENT reaches the subscriber, a CALL its callee and back, GOODBYE closes."""
    factory, clock = setup
    (a, wire_a), (b, wire_b) = joined(factory, clock), joined(factory, clock)
    a.dataReceived(frame([32, 1, {}, "slim.events"]))
    b.dataReceived(frame([64, 2, {}, "slim.proc"]))
    clock.advance(0)
    subscribed, registered = messages(wire_a)[0], messages(wire_b)[0]
    assert subscribed[0] == 33 and registered[0] == 65
    b.dataReceived(frame([16, 3, {"acknowledge": True}, "slim.events", ["hello"], {"n": 1}]))
    clock.advance(0)
    assert messages(wire_b)[0][0] == 17  # PUBLISHED
    event = messages(wire_a)[0]
    assert event[0] == 36 and event[1] == subscribed[2] and event[4:] == [["hello"], {"n": 1}]
    a.dataReceived(frame([48, 4, {}, "slim.proc", [2, 3]]))
    clock.advance(0)
    invocation = messages(wire_b)[0]
    assert invocation[0] == 68 and invocation[2] == registered[2] and invocation[4] == [2, 3]
    b.dataReceived(frame([70, invocation[1], {}, [5]]))
    clock.advance(0)
    result = messages(wire_a)[0]
    assert result[:2] == [50, 4] and result[3] == [5]
    a.dataReceived(frame([6, {}, "wamp.close.normal"]))
    clock.advance(0)
    assert messages(wire_a)[0][0] == 6 and wire_a.disconnecting and not a.isOpen()
    for protocol in (a, b):
        protocol.connectionLost()


# -- on a real node ------------------------------------------------------------------------------


def _subscribed_session(port: int) -> socket.socket:
    """A RawSocket (JSON) session past HELLO/WELCOME and SUBSCRIBE/SUBSCRIBED, left open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(HANDSHAKE)
    assert read_exactly(sock, 4)[0] == 0x7F
    for message, answer in ((HELLO, b"[2,"), ([32, 1, {}, "slim.node"], b"[33,")):
        sock.sendall(frame(message))
        (word,) = struct.unpack("!I", read_exactly(sock, 4))
        assert read_exactly(sock, word & 0xFFFFFF).startswith(answer)
    return sock


@pytest_twisted.async_yield_fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    """One node in this process, on the real reactor, with a RawSocket listener."""
    parser = argparse.ArgumentParser()
    add_node_flags(parser)
    local = "tcp:{}:interface=127.0.0.1"
    flags = ["--wamp", local.format(free_port()), "--rawsocket", local.format(free_port()), "--psc", local.format(0)]
    flags += ["--data-dir", str(tmp_path_factory.mktemp("rsslim")), "--log-level", "warn"]
    n = Node(node_config(parser.parse_args(flags)), reactor)
    await n.start()
    yield n
    await n.stop()


@pytest_twisted.ensureDeferred
async def test_idle_session_on_a_node_has_no_send_backlog(node: Node) -> None:
    """On a node's guarded TCP connection: no backlog of its own (the guard reads the TCP buffer), nothing held."""
    port = int(node.urls["rawsocket"].split(":")[2])
    sock = await threads.deferToThread(_subscribed_session, port)
    try:
        (listener,) = [listener for listener in node.edge.listeners if listener.name == "rawsocket"]
        (guarded,) = listener.connections
        protocol = guarded.wrappedProtocol
        assert isinstance(protocol, WampRawSocketProtocol)
        assert protocol._backlog is None and protocol._buffer is None and vars(protocol) == {}
        assert protocol.unsent_bytes() == 0  # the guard's count
    finally:
        await threads.deferToThread(sock.close)
    await until(lambda: node.edge.connections() == 0, what="the node to see the connection closed")
