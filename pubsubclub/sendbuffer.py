"""Knowing how far behind a WebSocket client is, to drop slow consumers.

Shared by the WAMP and TEP front-ends: both register a :class:`SendBacklog`
as the TCP transport's streaming producer and check :meth:`SendBacklog.unsent`
before sending, so one stuck client cannot grow the node's memory without
bound.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

log = Logger()


@implementer(IPushProducer)
class SendBacklog:
    """Estimates how many bytes a connection has queued but not yet sent.

    Registered as the streaming producer of the TCP transport, it is paused
    when Twisted's write buffer grows past its ``bufferSize`` and resumed only
    once that buffer has fully drained. So while paused, the backlog is at
    most the buffer size plus everything written since the pause; while
    running it is small. This uses only Twisted's public producer API.
    """

    #: Twisted's default write buffer size (``FileDescriptor.bufferSize``).
    BUFFER_SIZE = 2**16

    def __init__(self) -> None:
        self.paused = False
        self.since_pause = 0

    def written(self, nbytes: int) -> None:
        """Account for ``nbytes`` just written to the transport."""
        if self.paused:
            self.since_pause += nbytes

    def unsent(self) -> int:
        """Upper bound on the bytes not yet taken by the peer."""
        return self.BUFFER_SIZE + self.since_pause if self.paused else 0

    def pauseProducing(self) -> None:  # noqa: N802 - IPushProducer
        """The transport's buffer is full.

        Twisted calls this on *every* write while its buffer is over
        ``bufferSize``, not only on the first: counting restarts only when a
        pause begins, or the backlog would never appear to pass 64 KiB.
        """
        if not self.paused:
            self.paused = True
            self.since_pause = 0

    def resumeProducing(self) -> None:  # noqa: N802 - IPushProducer
        """The transport's buffer has drained."""
        self.paused = False
        self.since_pause = 0

    def stopProducing(self) -> None:  # noqa: N802 - IPushProducer
        """The connection is closing; nothing to stop."""


def watch_send_buffer(transport: Any, what: str) -> SendBacklog | None:
    """Register a :class:`SendBacklog` on ``transport``; None (and a log line) if that is impossible."""
    if transport is None:
        return None
    backlog = SendBacklog()
    try:
        # Twisted Web's HTTPChannel is still registered from before the
        # WebSocket takeover; after it, nothing else produces here.
        transport.unregisterProducer()
        transport.registerProducer(backlog, True)
    except Exception:  # a transport without producer support: keep serving, unguarded
        log.failure("cannot watch the send buffer; slow {what} consumers will not be dropped", what=what)
        return None
    return backlog
