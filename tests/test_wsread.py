"""The direct WebSocket receive path does exactly what Autobahn's processData does, and is taken.

Two copies of one Autobahn protocol -- one reading through
:func:`pubsubclub.net.wsframes.receive_data`, one through Autobahn alone -- get the
same random byte stream in the same random TCP chunks: ordinary messages of
every header size, fragments, pings, pongs and closes between them, and
every kind of bad frame. They must call back the same things in the same
order, write the same bytes, end in the same state with the same counters
and timers, and log no error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.protocol import WebSocketProtocol
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from pubsubclub.core.hub import Hub
from pubsubclub.federation.transport import PSCClientProtocol, PSCServerProtocol, _bind_timers
from pubsubclub.frontends.wamp.broker import WampLimits, WampRouter
from pubsubclub.frontends.wamp.transport import WampServerProtocol, wamp_resource
from pubsubclub.net import wsframes
from pubsubclub.net.wsframes import reads_directly, receive_data, unmask
from pubsubclub.testing import MemoryNetwork, no_logged_errors, psc_url

TEXT, BINARY, CONTINUATION, CLOSE, PING, PONG = 1, 2, 0, 8, 9, 10
#: Payload sizes on each side of every header-size boundary (7-bit, 16-bit, 64-bit lengths).
EDGE_SIZES = (0, 1, 125, 126, 127, 65535, 65536, 70000)
#: What a test connection is told about sizes: (maxFramePayloadSize, maxMessagePayloadSize); 0 is no limit.
LIMITS = ((0, 0), (100, 0), (0, 100), (65536, 70000), (200, 100))
#: The auto-ping interval and timeout on every test connection, so received traffic has timers to move.
PING_INTERVAL, PING_TIMEOUT = 10.0, 5.0
STATE_FIELDS = (
    "state",
    "wasClean",
    "wasNotCleanReason",
    "closedByMe",
    "failedByMe",
    "droppedByMe",
    "localCloseCode",
    "localCloseReason",
    "remoteCloseCode",
    "remoteCloseReason",
    "inside_message",
    "data",
)


class Wire(StringTransport):
    """A string transport that, like a TCP transport, lets Autobahn unregister a producer it never registered."""

    def unregisterProducer(self) -> None:  # noqa: N802 - Twisted API
        """Forget the producer, if any."""
        self.producer = None
        self.streaming = None


class Recording:
    """Records every callback in order and counts Autobahn's processData steps."""

    events: list[tuple[Any, ...]]
    steps = 0

    def onOpen(self) -> None:  # noqa: N802 - Autobahn API
        """Start recording."""
        self.events = []

    def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802, N803
        """Record a message."""
        self.events.append(("message", payload, isBinary))

    def onPing(self, payload: bytes) -> None:  # noqa: N802
        """Record a ping; Autobahn answers it."""
        self.events.append(("ping", payload))
        super().onPing(payload)  # type: ignore[misc]

    def onPong(self, payload: bytes) -> None:  # noqa: N802
        """Record a pong."""
        self.events.append(("pong", payload))

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:  # noqa: N802, N803
        """Record how the connection closed."""
        self.events.append(("close", wasClean, code, reason))

    def processData(self) -> bool:  # noqa: N802
        """Count one of Autobahn's frame-processing steps."""
        self.steps += 1
        return super().processData()  # type: ignore[misc, no-any-return]


class Direct:
    """Reads through the direct path."""

    def dataReceived(self, data: bytes) -> None:  # noqa: N802
        """The code under test."""
        receive_data(self, data)


class PlainServer(Recording, WebSocketServerProtocol):  # type: ignore[misc]
    """Autobahn's server, reading as Autobahn does."""


class DirectServer(Direct, Recording, WebSocketServerProtocol):  # type: ignore[misc]
    """Autobahn's server, reading through the direct path."""


class PlainClient(Recording, WebSocketClientProtocol):  # type: ignore[misc]
    """Autobahn's client, reading as Autobahn does."""


class DirectClient(Direct, Recording, WebSocketClientProtocol):  # type: ignore[misc]
    """Autobahn's client, reading through the direct path."""


def _options(factory: Any, limits: tuple[int, int], clock: MemoryReactorClock) -> None:
    _bind_timers(factory, clock)
    factory.setProtocolOptions(
        maxFramePayloadSize=limits[0],
        maxMessagePayloadSize=limits[1],
        autoPingInterval=PING_INTERVAL,
        autoPingTimeout=PING_TIMEOUT,
        failByDrop=False,
    )


def upgrade_request(path: str, extra: bytes = b"") -> bytes:
    """A client's opening handshake (RFC 6455, section 1.3's example key), with ``extra`` header lines."""
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        + extra
        + b"\r\n"
    )


def open_server(cls: type, limits: tuple[int, int] = (0, 0)) -> tuple[Any, StringTransport, MemoryReactorClock]:
    """A server protocol of ``cls`` past a real opening handshake, its wire cleared."""
    clock = MemoryReactorClock()
    factory = WebSocketServerFactory("ws://127.0.0.1:9000")
    factory.protocol = cls
    _options(factory, limits, clock)
    protocol = factory.buildProtocol(None)
    wire = Wire()
    protocol.makeConnection(wire)
    protocol.dataReceived(upgrade_request("/"))
    assert protocol.state == WebSocketProtocol.STATE_OPEN, wire.value()
    wire.clear()
    return protocol, wire, clock


def open_client(cls: type, limits: tuple[int, int] = (0, 0)) -> tuple[Any, StringTransport, MemoryReactorClock]:
    """A client protocol of ``cls`` past a real opening handshake with an Autobahn server, its wire cleared."""
    clock = MemoryReactorClock()
    factory = WebSocketClientFactory("ws://127.0.0.1:9000")
    factory.protocol = cls
    _options(factory, limits, clock)
    # Unmasked client frames: the pongs and closes it writes are then the same bytes for both copies.
    factory.setProtocolOptions(maskClientFrames=False)
    protocol = factory.buildProtocol(None)
    wire = Wire()
    protocol.makeConnection(wire)
    server_factory = WebSocketServerFactory("ws://127.0.0.1:9000")
    server_factory.protocol = WebSocketServerProtocol
    _bind_timers(server_factory, clock)
    server = server_factory.buildProtocol(None)
    server_wire = Wire()
    server.makeConnection(server_wire)
    server.dataReceived(wire.value())
    protocol.dataReceived(server_wire.value())
    assert protocol.state == WebSocketProtocol.STATE_OPEN, server_wire.value()
    server.dropConnection(abort=True)
    server.connectionLost(Failure(ConnectionDone()))
    wire.clear()
    return protocol, wire, clock


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bytes | None = None, wide: int = 0
) -> bytes:
    """One frame written from RFC 6455 section 5.2; ``wide`` forces a 16-bit (126) or 64-bit (127) length."""
    length = len(payload)
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    mask_bit = 0x80 if mask is not None else 0
    if wide == 127 or length > 0xFFFF:
        head += bytes([mask_bit | 127]) + length.to_bytes(8, "big")
    elif wide == 126 or length > 125:
        head += bytes([mask_bit | 126]) + length.to_bytes(2, "big")
    else:
        head += bytes([mask_bit | length])
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@st.composite
def payloads(draw: st.DrawFn, text: bool) -> bytes:
    """A message body: short random data, or filler of an edge size; text is UTF-8 unless drawn invalid."""
    if draw(st.integers(0, 5)) == 0:
        size = draw(st.sampled_from(EDGE_SIZES))
        return b"a" * size if text else bytes(i % 251 for i in range(size))
    if not text or draw(st.integers(0, 7)) == 0:
        return draw(st.binary(max_size=300))  # invalid UTF-8 in a text message, mostly
    return draw(st.text(max_size=100)).encode("utf-8", "surrogatepass")


@st.composite
def streams(draw: st.DrawFn, masked: bool) -> bytes:
    """A byte stream of ordinary and unusual frames, masked as the sending side should (mostly)."""

    def key() -> bytes | None:
        right = masked if draw(st.integers(0, 15)) else not masked
        return draw(st.binary(min_size=4, max_size=4)) if right else None

    def control() -> bytes:
        kind = draw(st.sampled_from(("ping", "pong", "close", "close-empty")))
        if kind == "close":
            code = draw(st.sampled_from((1000, 1001, 3000, 1002)))
            body = code.to_bytes(2, "big") + draw(st.text(max_size=20)).encode()
            return frame(CLOSE, body, mask=key())
        if kind == "close-empty":
            return frame(CLOSE, b"", mask=key())
        return frame(PING if kind == "ping" else PONG, draw(st.binary(max_size=125)), mask=key())

    out = b""
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(("message", "message", "message", "fragmented", "control", "odd")))
        if kind == "control":
            out += control()
            continue
        opcode = draw(st.sampled_from((TEXT, BINARY)))
        body = draw(payloads(opcode == TEXT))
        if kind == "message":
            out += frame(opcode, body, mask=key())
        elif kind == "fragmented":
            cuts = sorted(draw(st.lists(st.integers(0, len(body)), min_size=1, max_size=3)))
            pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
            for i, piece in enumerate(pieces):
                if i and draw(st.booleans()):
                    out += control()
                out += frame(opcode if i == 0 else CONTINUATION, piece, fin=i == len(pieces) - 1, mask=key())
        else:
            odd = draw(st.sampled_from(("rsv", "opcode", "wide", "stray-continuation")))
            if odd == "rsv":
                out += frame(opcode, body, rsv=draw(st.integers(1, 7)), mask=key())
            elif odd == "opcode":
                out += frame(draw(st.sampled_from((3, 4, 5, 6, 7, 11, 12, 13, 14, 15))), body[:100], mask=key())
            elif odd == "wide":
                out += frame(opcode, body[:125], mask=key(), wide=draw(st.sampled_from((126, 127))))
            else:
                out += frame(CONTINUATION, body, mask=key())
    return out


@st.composite
def chunked(draw: st.DrawFn, masked: bool) -> list[bytes]:
    """A stream cut into the pieces TCP might deliver."""
    data = draw(streams(masked))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=12))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if a < b]


@pytest.fixture
def no_errors() -> Iterator[None]:
    """Fail the test if anything logged an error."""
    with no_logged_errors():
        yield


def _pending(clock: MemoryReactorClock) -> list[float]:
    return sorted(call.getTime() for call in clock.getDelayedCalls())


Opened = tuple[Any, StringTransport, MemoryReactorClock]


def _compare(theirs: Opened, ours: Opened, chunks: list[bytes]) -> None:
    """Feed both, then hold them to the same callbacks, bytes, state, counters and timers."""
    with no_logged_errors():
        _feed_both(theirs, ours, chunks)


def _feed_both(theirs: Opened, ours: Opened, chunks: list[bytes]) -> None:
    (plain, plain_wire, plain_clock), (direct, direct_wire, direct_clock) = theirs, ours
    # One auto-ping each, so a pending ping timeout is there for incoming traffic to restart.
    plain_clock.advance(PING_INTERVAL)
    direct_clock.advance(PING_INTERVAL)
    plain_wire.clear()
    direct_wire.clear()
    for chunk in chunks:
        plain.dataReceived(chunk)
        direct.dataReceived(chunk)
        assert direct.events == plain.events
        assert direct_wire.value() == plain_wire.value()
        assert _pending(direct_clock) == _pending(plain_clock)
    for name in STATE_FIELDS:
        assert getattr(direct, name) == getattr(plain, name), name
    assert direct_wire.disconnecting == plain_wire.disconnecting
    assert direct.trafficStats.__json__() == plain.trafficStats.__json__()
    plain.connectionLost(Failure(ConnectionDone()))
    direct.connectionLost(Failure(ConnectionDone()))
    assert direct.events == plain.events
    assert _pending(direct_clock) == _pending(plain_clock)
    # Autobahn leaves a close-handshake timer behind a connection it failed; let both run out alike.
    plain_clock.advance(100)
    direct_clock.advance(100)
    assert direct.events == plain.events
    assert _pending(direct_clock) == _pending(plain_clock) == []


SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@SETTINGS
@given(chunks=chunked(masked=True), limits=st.sampled_from(LIMITS))
def test_server_reads_what_autobahn_reads(chunks: list[bytes], limits: tuple[int, int]) -> None:
    """Client-to-server streams: the same messages, control frames, closes (1002, 1007, 1009), bytes and timers."""
    _compare(open_server(PlainServer, limits), open_server(DirectServer, limits), chunks)


@SETTINGS
@given(chunks=chunked(masked=False), limits=st.sampled_from(LIMITS))
def test_client_reads_what_autobahn_reads(chunks: list[bytes], limits: tuple[int, int]) -> None:
    """Server-to-client streams (unmasked): the same as Autobahn too."""
    _compare(open_client(PlainClient, limits), open_client(DirectClient, limits), chunks)


@pytest.mark.parametrize(
    "text",
    [
        b"\xed\xa0\x80",  # an encoded surrogate
        b"\xf4\x90\x80\x80",  # beyond U+10FFFF
        b"\xc0\xaf",  # overlong
        b"\xf0\x9f\x98",  # cut inside a character
        b"ok \xef\xbf\xbe",  # U+FFFE: a noncharacter, but valid UTF-8
        "Grüße \U0001f600".encode(),
    ],
)
def test_utf8_edges_as_autobahn(text: bytes) -> None:
    """Python's strict UTF-8 decoder and Autobahn's validator agree on the classic edge cases, whole or cut."""
    stream = frame(TEXT, text, mask=b"\x01\x02\x03\x04") + frame(TEXT, b"[1]", mask=b"\x05\x06\x07\x08")
    _compare(open_server(PlainServer), open_server(DirectServer), [stream])
    _compare(open_server(PlainServer), open_server(DirectServer), [stream[:7], stream[7:]])


def test_ordinary_frames_skip_processdata(no_errors: None) -> None:
    """Whole text and binary frames of every header size, a header cut between reads too, skip processData."""
    direct, wire, clock = open_server(DirectServer)
    messages = [(bytes(i % 251 for i in range(size)), True) for size in EDGE_SIZES]
    # Text of two-octet characters where the size is even (UTF-8 checked the slow way), ASCII where odd.
    messages += [(("é" * size).encode()[:size] if size % 2 == 0 else b"a" * size, False) for size in EDGE_SIZES]
    stream = b"".join(frame(BINARY if binary else TEXT, body, mask=os.urandom(4)) for body, binary in messages)
    # The first read holds one octet: a header cut short waits in the buffer, as in Autobahn, not in processData.
    stream_start, rest = stream[:1], stream[1:]
    direct.dataReceived(stream_start)
    direct.dataReceived(rest)
    assert direct.events == [("message", body, binary) for body, binary in messages]
    assert direct.steps == 0
    assert direct.trafficStats.incomingWebSocketMessages == len(messages)
    # A ping between messages is Autobahn's (one step for the header, one for the body), and then direct again.
    direct.events.clear()
    direct.dataReceived(frame(PING, b"p", mask=b"abcd") + frame(TEXT, b"[1]", mask=b"abcd"))
    assert direct.events == [("ping", b"p"), ("message", b"[1]", False)]
    assert direct.steps == 2
    direct.dropConnection(abort=True)
    direct.connectionLost(Failure(ConnectionDone()))
    assert clock.getDelayedCalls() == []


def test_direct_reading_is_on_for_the_node_protocols() -> None:
    """The WAMP and PSC protocols read through the direct path and keep Autobahn's message hooks."""
    for cls in (WampServerProtocol, PSCServerProtocol, PSCClientProtocol):
        assert cls.dataReceived is not WebSocketServerProtocol.dataReceived
        assert wsframes._takes_whole_messages(cls), cls


def test_streaming_protocols_are_left_to_autobahn(no_errors: None) -> None:
    """A class that overrides a frame hook gets every frame through Autobahn, hooks called."""

    class Streaming(DirectServer):
        def onMessageFrameBegin(self, length: int) -> None:  # noqa: N802
            self.events.append(("frame", length))
            super().onMessageFrameBegin(length)

    direct, _, clock = open_server(Streaming)
    assert not reads_directly(direct)
    direct.dataReceived(frame(TEXT, b"[1]", mask=b"abcd"))
    assert direct.events == [("frame", 3), ("message", b"[1]", False)]
    direct.dropConnection(abort=True)
    direct.connectionLost(Failure(ConnectionDone()))
    assert clock.getDelayedCalls() == []


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 100, 2047, 2048, 4099, 65536])
def test_unmask_is_rfc_xor(size: int) -> None:
    """Both unmasking methods (integer XOR below the threshold, Autobahn's masker above) give the RFC's XOR."""
    payload, mask = os.urandom(size), os.urandom(4)
    assert unmask(mask, payload) == bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_node_connections_read_directly(no_errors: None) -> None:
    """A real WAMP connection (the node's factory and options) and both ends of a PSC link qualify once open."""
    from twisted.internet import reactor as global_reactor

    before = set(global_reactor.getDelayedCalls())
    router = WampRouter(Hub(node_id="test"), ("realm1",), WampLimits())
    factory = wamp_resource(router)._factory
    clock = MemoryReactorClock()
    _bind_timers(factory, clock)
    wamp = factory.buildProtocol(None)
    wire = Wire()
    wamp.makeConnection(wire)
    wamp.dataReceived(upgrade_request("/ws", b"Sec-WebSocket-Protocol: wamp.2.json\r\n"))
    assert wamp.state == WebSocketProtocol.STATE_OPEN and reads_directly(wamp)
    wamp.dropConnection(abort=True)
    wamp.connectionLost(Failure(ConnectionDone()))
    assert clock.getDelayedCalls() == []

    net = MemoryNetwork()
    a = net.node("a", 9001)
    net.node("b", 9002)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    link.pump.flush()
    assert reads_directly(link.client) and reads_directly(link.server)
    net.stop()
    assert net.reactor.getDelayedCalls() == []
    assert set(global_reactor.getDelayedCalls()) <= before


@pytest.mark.parametrize("limits", [(200, 100), (100, 200), (0, 100), (100, 0), (0, 0)])
@pytest.mark.parametrize("size", [99, 100, 101, 150, 199, 200, 201])
def test_the_smaller_of_the_two_limits_bounds_a_message_as_in_autobahn(limits: tuple[int, int], size: int) -> None:
    """A whole frame between the message and the frame limit (either way round) ends as Autobahn ends it."""
    body = b"a" * size
    chunks = [frame(TEXT, body, mask=b"abcd") + frame(TEXT, b"[1]", mask=b"abcd")]
    _compare(open_server(PlainServer, limits), open_server(DirectServer, limits), chunks)
