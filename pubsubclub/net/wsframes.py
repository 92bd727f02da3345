"""WebSocket data frames without Autobahn's per-frame overhead, both directions.

Sending: Autobahn's ``sendMessage`` -> ``sendFrame`` -> ``sendData`` checks
assertions, builds the header with ``struct`` and a join, and formats the
arguments of a debug log line on every frame whether or not debug logging is
on (``hltype``/``hlval``, which call :mod:`inspect`): about a fifth of a
node's CPU when it writes one EVENT per message (docs/benchmarks.md,
"Hot-path CPU"). :func:`send_message` writes the same bytes (RFC 6455,
section 5.2: one unmasked, unfragmented frame) and keeps Autobahn's traffic
counters, in the one case a node's frames are in: server side, connection
open, no compression negotiated, no masking, fragmentation, frame logging or
timing asked for, nothing queued. In every other case it is Autobahn's
``sendMessage``. Unlike Autobahn it sends a message over the connection's
``maxMessagePayloadSize``: that is the most the node accepts, and an EVENT
for a PUBLISH just under it is a few bytes longer (docs/protocol.md,
"Message sizes"); what the node sends is bounded where it is accepted.
``tests/test_wsframes.py`` holds the two to the same bytes.

Receiving: Autobahn's ``processData`` walks every frame through a dozen
hooks, builds an XOR masker object per masked frame and a Deferred per
message (``fire("message")``). :func:`receive_data` takes the frames a node
actually gets -- whole, unfragmented text or binary frames, masked as the
side requires, within the size limits, valid UTF-8 for text -- straight from
the receive buffer to ``onMessage``, and hands everything else (control
frames, fragments, frames still arriving, any violation, a closing
connection, compression) to ``processData`` one step at a time, so every
close code, reason and state change stays Autobahn's.
``tests/test_wsread.py`` feeds random byte streams to both and compares.
"""

from __future__ import annotations

import struct
from typing import Any

from autobahn.twisted.websocket import WebSocketAdapterProtocol
from autobahn.websocket import USES_NVX
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.xormasker import create_xor_masker

_OPEN = WebSocketProtocol.STATE_OPEN
_CLOSED = WebSocketProtocol.STATE_CLOSED
#: First header byte: FIN plus the opcode (1 text, 2 binary).
_FIN_TEXT, _FIN_BINARY = 0x81, 0x82
_MEDIUM = struct.Struct("!BBH").pack
_LONG = struct.Struct("!BBQ").pack


#: While a batch of remote messages is delivered (:func:`hold_writes` .. :func:`release_writes`):
#: connection -> ``[bytes held, frames]`` written by :func:`send_held`, in order; else None.
_held: dict[Any, list[Any]] | None = None


def hold_writes() -> bool:
    """Begin holding :func:`send_held` frames per connection; False when a hold is already on (nested)."""
    global _held
    if _held is not None:
        return False
    _held = {}
    return True


def release_writes() -> None:
    """End the hold: each connection's held frames go to its transport in one write, in order."""
    global _held
    held, _held = _held, None
    if held:
        for protocol, (_, frames) in held.items():
            transport = protocol.transport
            if transport is not None:
                transport.write(frames[0] if len(frames) == 1 else b"".join(frames))


def held_bytes(protocol: Any) -> int:
    """Bytes held for ``protocol`` by the current hold (0 without one): part of what it has unsent."""
    held = _held
    if held:
        cell = held.get(protocol)
        if cell is not None:
            return cell[0]  # type: ignore[no-any-return]
    return 0


def send_held(protocol: Any, payload: bytes, binary: bool) -> None:
    """:func:`send_message`, but during a hold the frame joins the connection's held frames.

    One ``transport.write`` per connection and batch instead of one per frame
    (Twisted's write chain is about seven calls). The same bytes in the same
    order: the hold ends within the batch's own reactor step, and any other
    frame for the connection written meanwhile (:func:`send_message`) first
    releases what is held for it. Outside a hold, or where :func:`send_message`
    would hand the frame to Autobahn, it is :func:`send_message`.
    """
    held = _held
    length = len(payload)
    if (
        held is None
        or protocol.state != _OPEN
        or not protocol.factory.isServer
        or protocol.maskServerFrames
        or protocol._perMessageCompress is not None
        or protocol.trackedTimings
        or protocol.logFrames
        or protocol.send_queue
        or 0 < protocol.autoFragmentSize < length
    ):
        send_message(protocol, payload, binary)
        return
    first = _FIN_BINARY if binary else _FIN_TEXT
    if length <= 125:
        header = bytes((first, length))
    elif length <= 0xFFFF:
        header = _MEDIUM(first, 126, length)
    else:
        header = _LONG(first, 127, length)
    frame = header + payload
    stats = protocol.trafficStats
    stats.outgoingWebSocketMessages += 1
    stats.outgoingOctetsAppLevel += length
    stats.outgoingOctetsWebSocketLevel += length
    stats.outgoingWebSocketFrames += 1
    stats.outgoingOctetsWireLevel += len(frame)
    cell = held.get(protocol)
    if cell is None:
        held[protocol] = [len(frame), [frame]]
    else:
        cell[0] += len(frame)
        cell[1].append(frame)


def _release_one(protocol: Any) -> None:
    """Write what the current hold keeps for ``protocol`` now (another frame must follow it)."""
    cell = _held.pop(protocol, None) if _held else None
    if cell is not None and protocol.transport is not None:
        frames = cell[1]
        protocol.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))


def send_message(protocol: Any, payload: bytes, binary: bool) -> None:
    """``protocol.sendMessage(payload, binary)``, written directly when nothing but the frame is needed."""
    if _held:
        _release_one(protocol)  # frames held for it go first
    length = len(payload)
    if (
        protocol.state != _OPEN
        or not protocol.factory.isServer
        or protocol.maskServerFrames
        or protocol._perMessageCompress is not None
        or protocol.trackedTimings
        or protocol.logFrames
        or protocol.send_queue
        or 0 < protocol.autoFragmentSize < length
    ):
        protocol.sendMessage(payload, binary)
        return
    first = _FIN_BINARY if binary else _FIN_TEXT
    if length <= 125:
        header = bytes((first, length))
    elif length <= 0xFFFF:
        header = _MEDIUM(first, 126, length)
    else:
        header = _LONG(first, 127, length)
    frame = header + payload
    stats = protocol.trafficStats
    stats.outgoingWebSocketMessages += 1
    stats.outgoingOctetsAppLevel += length
    stats.outgoingOctetsWebSocketLevel += length
    stats.outgoingWebSocketFrames += 1
    protocol.transport.write(frame)
    stats.outgoingOctetsWireLevel += len(frame)


#: RFC 6455 caps a 64-bit payload length at 2**63 - 1 (Autobahn refuses more).
_MAX_LENGTH = 0x7FFFFFFFFFFFFFFF
_LENGTH16 = struct.Struct("!H").unpack_from
_LENGTH64 = struct.Struct("!Q").unpack_from
#: Below this many octets a masked payload is unmasked as one big-integer XOR (about 1 us for
#: 100 octets); from here on Autobahn's own masker (NVX's SIMD loop) wins despite the ~5 us it
#: takes to build. Without NVX Autobahn's masker is pure Python and the integer XOR always wins.
MASK_WITH_INT_BELOW = 2048 if USES_NVX else _MAX_LENGTH
#: Autobahn's per-frame and per-message hooks. A protocol overriding any of them wants frames
#: streamed to it and is left wholly to Autobahn; the fast path calls ``onMessage`` itself.
_HOOKS = (
    "onFrameBegin",
    "onFrameData",
    "onFrameEnd",
    "onMessageBegin",
    "onMessageFrameBegin",
    "onMessageFrameData",
    "onMessageFrameEnd",
    "onMessageFrame",
    "onMessageEnd",
)
_whole_message_classes: dict[type, bool] = {}


def _takes_whole_messages(cls: Any) -> bool:
    """Whether ``cls`` keeps Autobahn's message hooks, so its messages can skip them."""
    known = _whole_message_classes.get(cls)
    if known is None:
        known = all(getattr(cls, name) is getattr(WebSocketProtocol, name) for name in _HOOKS) and (
            cls._onMessage is WebSocketAdapterProtocol._onMessage
        )
        _whole_message_classes[cls] = known
    return known


def unmask(mask: bytes, payload: bytes) -> bytes:
    """``payload`` XOR the repeated 4-octet ``mask`` (RFC 6455, section 5.3)."""
    length = len(payload)
    if length >= MASK_WITH_INT_BELOW:
        return create_xor_masker(mask, length).process(payload)  # type: ignore[no-any-return]
    key = (mask * ((length >> 2) + 1))[:length]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(length, "little")


def reads_directly(protocol: Any) -> bool:
    """Whether :func:`receive_data` may take ordinary frames of this open connection past Autobahn.

    Not when the connection is not open, permessage-deflate was negotiated,
    Autobahn logs octets or frames, someone listens to the ``"message"`` event,
    a server was told not to unmask, or the class streams frames through
    Autobahn's hooks.
    """
    return (
        protocol.state == _OPEN
        and protocol._perMessageCompress is None
        and not protocol.logOctets
        and not protocol.logFrames
        and protocol._listeners is None
        and (protocol.applyMask or not protocol.factory.isServer)
        and _takes_whole_messages(type(protocol))
    )


def receive_data(protocol: Any, data: bytes) -> None:
    """``protocol.dataReceived(data)``: whole ordinary frames straight to ``onMessage``, the rest through Autobahn.

    An ordinary frame is what Autobahn would pass through unchanged: FIN set,
    no RSV bits, opcode text or binary, masked if and only if the peer is a
    client, minimal length encoding, within ``maxFramePayloadSize`` and
    ``maxMessagePayloadSize``, valid UTF-8 if text (when Autobahn validates),
    and no fragmented message in progress. Its effects are Autobahn's for that
    frame: the traffic counters, the auto-ping timeout restarted by incoming
    traffic, then ``onMessage(payload, isBinary)``; without the masker object,
    the hook calls and the ``"message"`` event's Deferred (no listener is
    registered, or this path is not taken). Anything else, including a frame
    whose end has not arrived yet, is one ``processData`` step at a time, as
    Autobahn's own ``consumeData`` loop would run it. Like Autobahn, this is
    not reentrant: Twisted never calls ``dataReceived`` from inside it.
    """
    p = protocol
    server = p.factory.isServer
    # reads_directly(p), without its two calls (this runs once per read of every connection).
    whole = _whole_message_classes.get(type(p))
    if (
        p.state != _OPEN
        or p._perMessageCompress is not None
        or p.logOctets
        or p.logFrames
        or p._listeners is not None
        or not (p.applyMask or not server)
        or not (_takes_whole_messages(type(p)) if whole is None else whole)
    ):
        p._dataReceived(data)
        return
    stats = p.trafficStats
    stats.incomingOctetsWireLevel += len(data)
    buf = p.data + data if p.data else data
    p.data = b""
    mask_bit = 0x80 if server else 0
    frame_limit, message_limit = p.maxFramePayloadSize, p.maxMessagePayloadSize
    if frame_limit > 0:
        # min(), without its call (a builtin's argument parsing, about 800 instructions per read)
        limit = message_limit if 0 < message_limit < frame_limit else frame_limit
    else:
        limit = message_limit if message_limit > 0 else _MAX_LENGTH
    validate = p.utf8validateIncoming
    on_message = p.onMessage
    pos, end = 0, len(buf)
    holding = True  # whether ``buf[pos:]`` (not ``p.data``) is the unread input
    try:
        while True:
            if (
                p.state == _OPEN
                and p.current_frame is None
                and not p.inside_message
                and not p.failedByMe
                and not p.trackedTimings
            ):
                available = end - pos
                if available < 2:
                    break  # Autobahn waits for two octets too
                first = buf[pos]
                second = buf[pos + 1]
                if (first == _FIN_TEXT or first == _FIN_BINARY) and second & 0x80 == mask_bit:
                    length = second & 0x7F
                    start = pos + 2
                    if length == 126:
                        start += 2
                        if available >= 4:
                            length = _LENGTH16(buf, pos + 2)[0]
                            if length < 126:
                                length = -1  # not minimal: Autobahn's protocol error
                    elif length == 127:
                        start += 8
                        if available >= 10:
                            length = _LENGTH64(buf, pos + 2)[0]
                            if length < 0x10000 or length > _MAX_LENGTH:
                                length = -1
                    if server:
                        start += 4
                    if start > end:
                        break  # the rest of the header is still on its way, as Autobahn would wait
                    stop = start + length
                    if 0 <= length <= limit and stop <= end:
                        if not server:
                            payload = buf[start:stop]
                        elif length < MASK_WITH_INT_BELOW:
                            # unmask, without its call (a client's usual message, once per frame read)
                            key = (buf[start - 4 : start] * ((length >> 2) + 1))[:length]
                            payload = (
                                int.from_bytes(buf[start:stop], "little") ^ int.from_bytes(key, "little")
                            ).to_bytes(length, "little")
                        else:
                            payload = unmask(buf[start - 4 : start], buf[start:stop])
                        if first == _FIN_TEXT and validate and not payload.isascii():
                            try:
                                payload.decode("utf-8")
                            except UnicodeDecodeError:
                                stop = -1  # Autobahn closes with 1007 and its own reason
                        if stop >= 0:
                            pos = stop
                            stats.incomingOctetsWebSocketLevel += length
                            stats.incomingOctetsAppLevel += length
                            stats.incomingWebSocketFrames += 1
                            stats.incomingWebSocketMessages += 1
                            if p.autoPingTimeoutCall and p.autoPingRestartOnAnyTraffic:
                                p._cancelAutoPingTimeoutCall()
                            on_message(payload, first == _FIN_BINARY)
                            if pos == end:
                                # The read's last frame (a paced read's only one): what the loop's next pass would
                                # come to in every state (no octet left: Autobahn's processData waits for two, and
                                # only processData starts a frame), without that pass's checks.
                                break
                            continue
            elif p.state == _CLOSED:
                break
            # Not an ordinary whole frame: one step of Autobahn's consumeData loop.
            p.data = buf[pos:]
            holding = False
            more = p.processData()
            buf, pos = p.data, 0
            end = len(buf)
            p.data = b""
            holding = True
            if not more or p.state == _CLOSED:
                break
    finally:
        if holding:
            p.data = buf[pos:]
