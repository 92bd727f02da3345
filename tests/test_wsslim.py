"""An idle WAMP WebSocket connection keeps little, and still works as Autobahn's does.

In memory: the node's own WAMP factory (``wamp_resource``) on a string
transport, past a real upgrade and HELLO/WELCOME, timers on a memory clock.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import pytest
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from pubsubclub.core.hub import Hub
from pubsubclub.federation.transport import _bind_timers
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.frontends.wamp.transport import wamp_resource

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
    """A string transport that lets Autobahn unregister a producer it never registered."""

    def unregisterProducer(self) -> None:  # noqa: N802 - Twisted API
        """Forget the producer, if any."""
        self.producer = None


def joined() -> tuple[Any, Wire, MemoryReactorClock]:
    """A WAMP connection of the node's factory past the upgrade and WELCOME, its wire cleared."""
    clock = MemoryReactorClock()
    router = WampRouter(Hub("n1"), call_later=clock.callLater)
    factory = wamp_resource(router)._factory
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


def test_connecting_formats_no_option_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a connection pretty-prints no list of options for Autobahn's debug line (CPU per connection)."""
    import autobahn.websocket.protocol as autobahn_protocol

    formatted: list[Any] = []
    real = autobahn_protocol.pformat
    monkeypatch.setattr(autobahn_protocol, "pformat", lambda value: formatted.append(value) or real(value))
    protocol, _, _ = joined()
    assert formatted == [[]]
    assert protocol.openHandshakeTimeout == 10.0  # every option still there, from the class
    protocol.dropConnection(abort=True)
    protocol.connectionLost(Failure(ConnectionDone()))


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


def test_fragmented_text_is_validated_with_a_validator_made_on_use() -> None:
    """A fragmented non-ASCII text message goes through Autobahn's validator, made then, and is answered."""
    protocol, wire, clock = joined()
    message = '[32,7,{},"café.news"]'.encode()
    cut = message.index(b"\xc3") + 1  # a fragment boundary inside the two-octet character
    mask = b"abcd"

    def fragment(opcode: int, fin: bool, payload: bytes) -> bytes:
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + mask + body

    protocol.dataReceived(fragment(1, False, message[:cut]) + fragment(0, True, message[cut:]))
    clock.advance(0)
    assert protocol._slim_validator is not None
    assert _server_frames(wire.value())[0].startswith(b"[33,7,"), wire.value()
    protocol.dropConnection(abort=True)
    protocol.connectionLost(Failure(ConnectionDone()))
