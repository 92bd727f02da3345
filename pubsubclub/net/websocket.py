"""The connection layer's hooks for Autobahn WebSocket server protocols (WAMP, TEP, PSC).

Each protocol class defines ``keepalive()`` and ``pending_input()`` by calling
these, so :class:`pubsubclub.net.edge.EdgeConnection` can ping a quiet client
and see how much unfinished input it holds.
"""

from __future__ import annotations

from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol


def ping_if_open(protocol: Any) -> None:
    """A WebSocket ping on an open connection; browsers and WebSocket libraries answer it by themselves."""
    if protocol.state == WebSocketProtocol.STATE_OPEN:
        protocol.sendPing()


def unfinished_input(protocol: Any) -> int:
    """Bytes of an unfinished HTTP request, frame or fragmented message Autobahn holds for ``protocol``."""
    held = len(getattr(protocol, "data", b"") or b"")
    for name in ("frame_data", "message_data"):
        parts = getattr(protocol, name, None)
        if isinstance(parts, list):
            held += sum(len(part) for part in parts)
    return held
