"""The direct WebSocket send writes exactly what Autobahn's sendMessage writes, and defers to it otherwise."""

from __future__ import annotations

from typing import Any

import pytest
import txaio
from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.protocol import WebSocketProtocol
from twisted.internet.testing import MemoryReactorClock, StringTransport

from pubsubclub.net.wsframes import send_message

STATS = (
    "outgoingWebSocketMessages",
    "outgoingOctetsAppLevel",
    "outgoingOctetsWebSocketLevel",
    "outgoingWebSocketFrames",
    "outgoingOctetsWireLevel",
)


@pytest.fixture(autouse=True)
def private_clock() -> Any:
    """Autobahn's queued writes (txaio.call_later) land on a clock of this test's, not the global reactor."""
    before = txaio.config.loop
    txaio.config.loop = MemoryReactorClock()
    yield
    txaio.config.loop = before


def open_protocol(factory: Any) -> tuple[Any, StringTransport]:
    """A protocol of ``factory`` on a string transport, past its handshake."""
    factory.protocol = WebSocketServerProtocol if factory.isServer else WebSocketClientProtocol
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.state = WebSocketProtocol.STATE_OPEN
    transport.clear()
    return protocol, transport


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 70000])
@pytest.mark.parametrize("binary", [False, True])
def test_same_bytes_and_counters_as_autobahn(length: int, binary: bool) -> None:
    """Every header size (7-bit, 16-bit, 64-bit length), text and binary: byte for byte, counter for counter."""
    payload = bytes(i % 251 for i in range(length))
    theirs, their_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    ours, our_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    theirs.sendMessage(payload, binary)
    send_message(ours, payload, binary)
    assert our_wire.value() == their_wire.value()
    for name in STATS:
        assert getattr(ours.trafficStats, name) == getattr(theirs.trafficStats, name), name


def test_client_side_frames_stay_masked() -> None:
    """A client must mask its frames: that case is Autobahn's (mask bit set)."""
    client, wire = open_protocol(WebSocketClientFactory(reactor=MemoryReactorClock()))
    send_message(client, b"[1]", False)
    frame = wire.value()
    assert frame[0] == 0x81 and frame[1] & 0x80


def test_closed_connection_raises_as_autobahn_does() -> None:
    """Sending on a connection that is not open is Autobahn's Disconnected, not a silent write."""
    protocol, wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    protocol.state = WebSocketProtocol.STATE_CLOSING
    with pytest.raises(Exception, match="closed protocol"):
        send_message(protocol, b"x", False)
    assert wire.value() == b""


def test_fragmentation_and_queued_writes_are_left_to_autobahn() -> None:
    """An auto-fragment size below the payload gives Autobahn's fragments; a send queue keeps its order."""
    theirs, their_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    ours, our_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    for protocol in (theirs, ours):
        protocol.autoFragmentSize = 4
    theirs.sendMessage(b"0123456789", False)
    send_message(ours, b"0123456789", False)
    assert our_wire.value() == their_wire.value() and len(our_wire.value()) > 12
    theirs, their_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    ours, our_wire = open_protocol(WebSocketServerFactory(reactor=MemoryReactorClock()))
    for protocol in (theirs, ours):
        protocol.send_queue.append((b"earlier", False))
    theirs.sendMessage(b"later", False)
    send_message(ours, b"later", False)
    # Autobahn's queue order: what was queued first goes first, never overtaken by a direct write.
    assert our_wire.value() == their_wire.value() and our_wire.value().startswith(b"earlier")
    assert list(ours.send_queue) == list(theirs.send_queue) and ours.send_queue
