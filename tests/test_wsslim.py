"""An idle WAMP WebSocket connection keeps little, and a turn's frames reach the transport as one write.

In memory: the node's own WAMP factory (``wamp_resource``) on a string
transport, past a real upgrade and HELLO/WELCOME, with the turn writer on a
memory clock.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from pubsubclub.core.hub import Hub
from pubsubclub.federation.transport import _bind_timers
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.frontends.wamp.transport import wamp_resource
from pubsubclub.net.turnwrite import TurnWriter

HELLO = b'[1,"realm1",{"roles":{"subscriber":{}}}]'


def _client_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked client frame (short payload)."""
    mask = b"abcd"
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + body


def _server_frames(data: bytes) -> list[bytes]:
    """The payloads of the unmasked server frames in ``data`` (short and 16-bit lengths)."""
    out = []
    while data:
        length, start = data[1] & 0x7F, 2
        if length == 126:
            length, start = int.from_bytes(data[2:4], "big"), 4
        out.append(data[start : start + length])
        data = data[start + length :]
    return out


class Wire(StringTransport):
    """A string transport that counts its writes."""

    writes = 0

    def write(self, data: bytes) -> None:
        """Count, then keep the bytes."""
        self.writes += 1
        super().write(data)

    def unregisterProducer(self) -> None:  # noqa: N802 - Twisted API
        """Forget the producer, if any."""
        self.producer = None


def joined() -> tuple[Any, Wire, MemoryReactorClock]:
    """A WAMP connection of the node's factory past the upgrade and WELCOME, its wire cleared."""
    clock = MemoryReactorClock()
    router = WampRouter(Hub("n1"), call_later=clock.callLater)
    factory = wamp_resource(router)._factory
    factory.turn_writer = TurnWriter(clock.callLater)
    _bind_timers(factory, clock)
    protocol = factory.buildProtocol(None)
    wire = Wire()
    protocol.makeConnection(wire)
    protocol.dataReceived(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
    )
    assert protocol.state == WebSocketProtocol.STATE_OPEN, wire.value()
    protocol.dataReceived(_client_frame(HELLO))
    clock.advance(0)
    assert _server_frames(wire.value().split(b"\r\n\r\n", 1)[1])[0].startswith(b"[2,"), wire.value()
    wire.clear()
    wire.writes = 0
    return protocol, wire, clock


def test_idle_connection_keeps_little() -> None:
    """Open and joined: no copied factory options, no send deque, no handshake text, a small instance dictionary."""
    protocol, _, clock = joined()
    state = vars(protocol)
    assert "maxFramePayloadSize" not in state and "autoPingInterval" not in state
    assert protocol.maxMessagePayloadSize == 1024 * 1024  # still readable, from the class
    assert not isinstance(protocol.send_queue, deque) and len(protocol.send_queue) == 0
    assert "http_headers" not in state and "http_request_data" not in state and "http_response_data" not in state
    assert "utf8validator" not in state and protocol._slim_validator is None
    # Autobahn's own connection holds about 90 attributes here: a 3.3 KB dictionary.
    assert sys.getsizeof(state) < 600, sorted(state)
    protocol.dropConnection(abort=True)
    protocol.connectionLost(Failure(ConnectionDone()))


def test_turn_frames_are_one_write_in_order() -> None:
    """Frames sent in one turn reach the transport once, at the end of the turn; anything else flushes them first."""
    protocol, wire, clock = joined()
    protocol.send_encoded(b"[36,1,1,{},[1]]")
    protocol.send_encoded(b"[36,1,2,{},[2]]")
    assert wire.value() == b""
    assert protocol.unsent_bytes() >= 2 * (2 + 15)  # queued counts as unsent
    clock.advance(0)
    assert wire.writes == 1
    assert _server_frames(wire.value()) == [b"[36,1,1,{},[1]]", b"[36,1,2,{},[2]]"]
    wire.clear()
    # A ping written through Autobahn in the same turn goes after the frames queued before it.
    protocol.send_encoded(b"[36,1,3,{},[3]]")
    protocol.sendPing(b"p")
    frames = wire.value()
    assert frames[0] == 0x81 and _server_frames(frames)[0] == b"[36,1,3,{},[3]]"
    assert frames.endswith(b"\x89\x01p")
    clock.advance(0)
    protocol.dropConnection(abort=True)
    protocol.connectionLost(Failure(ConnectionDone()))


def test_dropped_connection_writes_nothing_queued() -> None:
    """A connection dropped (or lost) with frames queued writes none of them afterwards."""
    protocol, wire, clock = joined()
    protocol.send_encoded(b"[36,1,1,{},[1]]")
    protocol.drop("test")
    protocol.connectionLost(Failure(ConnectionDone()))
    clock.advance(0)
    assert wire.value() == b""


def test_chopped_send_gets_a_real_queue() -> None:
    """Autobahn's queued sending (chopsize) still works: the queue is made when first needed."""
    from twisted.internet import reactor as global_reactor

    protocol, wire, clock = joined()
    before = set(global_reactor.getDelayedCalls())
    protocol.sendData(b"abcdef", chopsize=2)
    # The first chunk at once, the rest queued for Autobahn's timer (txaio's, on the global reactor).
    assert wire.value() == b"ab"
    assert isinstance(protocol.send_queue, deque)
    assert list(protocol.send_queue) == [(b"cd", True), (b"ef", True)]
    for call in set(global_reactor.getDelayedCalls()) - before:
        call.cancel()
    protocol.dropConnection(abort=True)
    protocol.connectionLost(Failure(ConnectionDone()))
