"""Sending a WebSocket data message from a server without Autobahn's per-frame overhead.

Autobahn's ``sendMessage`` -> ``sendFrame`` -> ``sendData`` checks
assertions, builds the header with ``struct`` and a join, and formats the
arguments of a debug log line on every frame whether or not debug logging is
on (``hltype``/``hlval``, which call :mod:`inspect`): about a fifth of a
node's CPU when it writes one EVENT per message (docs/benchmarks.md,
"Hot-path CPU"). :func:`send_message` writes the same bytes (RFC 6455,
section 5.2: one unmasked, unfragmented frame) and keeps Autobahn's traffic
counters, in the one case a node's frames are in: server side, connection
open, no compression negotiated, no masking, fragmentation, frame logging or
timing asked for, nothing queued. In every other case it is Autobahn's
``sendMessage``. ``tests/test_wsframes.py`` holds the two to the same bytes.
"""

from __future__ import annotations

import struct
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol

_OPEN = WebSocketProtocol.STATE_OPEN
#: First header byte: FIN plus the opcode (1 text, 2 binary).
_FIN_TEXT, _FIN_BINARY = 0x81, 0x82
_MEDIUM = struct.Struct("!BBH").pack
_LONG = struct.Struct("!BBQ").pack


def send_message(protocol: Any, payload: bytes, binary: bool) -> None:
    """``protocol.sendMessage(payload, binary)``, written directly when nothing but the frame is needed."""
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
        or 0 < protocol.maxMessagePayloadSize < length
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
