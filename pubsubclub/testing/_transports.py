"""In-memory transports for the front-ends' sessions: what a session sent, and how it ended.

:class:`MemoryWampTransport` is a :class:`~pubsubclub.wamp.broker.WampTransport`
for driving a ``BrokerSession`` (or a session of a server built on the mixin)
message by message: ``session.onOpen(transport)``, then ``session.onMessage(...)``
and assertions on ``transport.sent``. :class:`MemoryTEPTransport` does the same
for a ``TEPClient``.
"""

from __future__ import annotations

import json
from typing import Any


class MemoryWampTransport:
    """An in-memory WampTransport recording the WAMP messages a session sends."""

    def __init__(self) -> None:
        #: Every message sent, oldest first (Autobahn ``Message`` objects, not bytes).
        self.sent: list[Any] = []
        self.open = True
        #: What :meth:`unsent_bytes` reports; set it to play a slow client.
        self.unsent = 0
        #: The reason given to :meth:`drop`, if the session dropped the transport.
        self.dropped: str | None = None

    def send(self, msg: Any) -> None:
        """Record ``msg``."""
        self.sent.append(msg)

    def close(self) -> None:
        """Mark closed."""
        self.open = False

    def isOpen(self) -> bool:  # noqa: N802 - Autobahn's ITransport name
        """Open until closed or dropped."""
        return self.open

    def unsent_bytes(self) -> int:
        """Whatever the test set in :attr:`unsent`."""
        return self.unsent

    def drop(self, reason: str) -> None:
        """Record the reason and close."""
        self.dropped = reason
        self.open = False


class MemoryTEPTransport:
    """An in-memory TEPTransport recording the frames (as JSON values) a client sends, and how it ended."""

    def __init__(self) -> None:
        #: Every frame sent, decoded from JSON, oldest first.
        self.sent: list[Any] = []
        #: ``(code, reason)`` once closed.
        self.closed: tuple[int, str] | None = None
        #: The reason given to :meth:`drop`, if the client dropped the transport.
        self.dropped: str | None = None
        #: What :meth:`unsent_bytes` reports; set it to play a slow client.
        self.unsent = 0

    def send_text(self, data: bytes) -> None:
        """Record the frame ``data``, decoded."""
        self.sent.append(json.loads(data))

    def unsent_bytes(self) -> int:
        """Whatever the test set in :attr:`unsent`."""
        return self.unsent

    def close(self, code: int, reason: str) -> None:
        """Record the close."""
        self.closed = (code, reason)

    def drop(self, reason: str) -> None:
        """Record the reason."""
        self.dropped = reason
