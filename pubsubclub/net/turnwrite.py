"""Frames of one reactor turn handed to each connection's transport once, at the end of the turn.

Why: a node that receives a PSC batch of N messages for one subscriber
wrote N EVENT frames to that subscriber one ``transport.write`` at a time,
each through the connection guard, Twisted's TLS-capable wrapper and
``FileDescriptor.write`` (buffer append, ``startWriting``, the reactor's
writer registration): about seven Python calls per frame for bytes that
leave in the same ``send`` anyway. Queued here, they cost a list append each
and reach the transport as one write.

No latency is added: Twisted writes a transport's buffer when the reactor
next polls the socket as writable, which is after the ``callLater(0)`` that
flushes here has run (the same step of the reactor loop the PSC link's
batch flush uses, docs/architecture.md). Order is kept: a connection's
frames leave in the order they were queued, and whatever else it writes
(Autobahn's pongs and close frames, any frame not on the direct path)
flushes its queue first (:class:`~pubsubclub.net.wsslim.SlimServerProtocol`).
What is queued counts as unsent for the slow-consumer checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.logger import Logger

__all__ = ["TurnWriter", "turn_writer"]


class Flushable(Protocol):
    """A connection with frames queued for this turn."""

    def flush_frames(self) -> None:
        """Hand the queued frames to the transport."""


class TurnWriter:
    """The connections with frames queued in this reactor turn, flushed by one ``callLater(0)``."""

    __slots__ = ("_call_later", "_waiting")

    def __init__(self, call_later: Callable[..., Any]) -> None:
        self._call_later = call_later
        self._waiting: list[Flushable] | None = None

    def queue(self, connection: Flushable) -> None:
        """``connection`` queued its first frame of this turn: flush it at the end of the turn."""
        waiting = self._waiting
        if waiting is None:
            waiting = self._waiting = []
            self._call_later(0, self.flush)
        waiting.append(connection)

    def flush(self) -> None:
        """Hand every waiting connection's frames to its transport."""
        waiting, self._waiting = self._waiting, None
        for connection in waiting or ():
            try:
                connection.flush_frames()
            except Exception:
                # One connection's failure must not keep the others' frames back.
                log.failure("cannot flush a connection's frames")


log = Logger()
_writer: TurnWriter | None = None


def turn_writer() -> TurnWriter:
    """The process's turn writer, on the global reactor (installed by then: a connection exists)."""
    global _writer
    if _writer is None:
        from twisted.internet import reactor

        _writer = TurnWriter(reactor.callLater)  # type: ignore[attr-defined]
    return _writer
