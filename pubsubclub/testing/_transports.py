"""In-memory transports for the front-ends' sessions: what a session sent, and how it ended.

:class:`MemoryWampTransport` is a :class:`~pubsubclub.frontends.wamp.broker.WampTransport`
for driving a ``BrokerSession`` (or a session of a server built on the mixin)
message by message: ``session.onOpen(transport)``, then ``session.onMessage(...)``
and assertions on ``transport.sent``. :class:`MemoryTEPTransport` does the same
for a ``TEPClient``.
"""

from __future__ import annotations

import json
from typing import Any

from autobahn.wamp.interfaces import ISerializer
from autobahn.wamp.serializer import JsonSerializer


class MemoryWampTransport:
    """An in-memory WampTransport recording the WAMP messages a session sends.

    Messages the broker sends already encoded (EVENTs) are decoded back with
    Autobahn's serializer, so :attr:`sent` holds Autobahn ``Message`` objects
    either way; :attr:`encoded` keeps those bytes as they were handed over.
    """

    def __init__(self, serializer: ISerializer | None = None) -> None:
        #: The wire format the session encodes EVENTs for (Autobahn's JSON by default).
        self.serializer: Any = serializer if serializer is not None else JsonSerializer()
        #: Every message sent, oldest first (Autobahn ``Message`` objects, not bytes).
        self.sent: list[Any] = []
        #: The bytes of every message sent already encoded, oldest first.
        self.encoded: list[bytes] = []
        self.open = True
        #: What :meth:`unsent_bytes` reports; set it to play a slow client.
        self.unsent = 0
        #: The reason given to :meth:`drop`, if the session dropped the transport.
        self.dropped: str | None = None

    def send(self, msg: Any) -> None:
        """Record ``msg``."""
        self.sent.append(msg)

    @property
    def object_serializer(self) -> Any:
        """The object serializer of :attr:`serializer`."""
        return self.serializer._serializer

    def send_encoded(self, data: bytes) -> None:
        """Record ``data`` and the message it decodes to."""
        self.encoded.append(data)
        (msg,) = self.serializer.unserialize(data)
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
