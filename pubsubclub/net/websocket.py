"""The connection layer's hooks for Autobahn WebSocket server protocols (WAMP, TEP, PSC).

Each protocol class defines ``keepalive()`` and ``pending_input()`` by calling
these, so :class:`pubsubclub.net.edge.EdgeConnection` can ping a quiet client
and see how much unfinished input it holds.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.resource import WebSocketResource
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


def forget_closed(protocol: Any) -> None:
    """A closed Autobahn protocol stops referring to itself: its ``is_closed`` fired with it as the result.

    Whoever waited on ``is_closed`` has had the protocol by then; a later
    waiter gets None. Left as it is, the protocol is a reference cycle that
    only a full cyclic collection frees. Anything else: nothing done.
    """
    closed = getattr(protocol, "is_closed", None)
    if getattr(closed, "called", False) and getattr(closed, "result", None) is protocol:
        closed.result = None  # type: ignore[union-attr]


class TakeoverResource(WebSocketResource):  # type: ignore[misc]
    """Autobahn's WebSocket resource, leaving no reference cycle behind its takeover of the connection.

    Autobahn takes the connection from Twisted Web's ``HTTPChannel`` midway
    through the upgrade request, which is never finished: the channel's
    ``requests`` list and the request's ``channel`` keep each other (and,
    through the channel, the connection) for a full cyclic collection. The
    channel serves nothing more once its transport is taken: it lets go of
    the request.
    """

    def render(self, request: Any) -> Any:
        """Autobahn's takeover; then the channel, left without a transport, forgets the request."""
        try:
            return super().render(request)
        finally:
            channel = request.channel
            if channel is not None and channel.transport is None and request in channel.requests:
                channel.requests.remove(request)
