"""Knowing how far behind a connection is, to drop slow consumers.

Part of the connection layer (:mod:`pubsubclub.net`): the guard every
listener stands on reads a connection's unsent bytes through
:func:`write_buffer_of` after every write (control frames included). The
WAMP (WebSocket and RawSocket) and TEP front-ends and the PSC links also get
a :class:`SendBacklog` from :func:`watch_send_buffer` and check
:meth:`SendBacklog.unsent` before sending, which is what guards connections
that do not come through a guarded listener (links this node dials, servers
built on the library without a node).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from zope.interface import implementer

from pubsubclub.net import writethrough

log = Logger()


def write_buffer_of(transport: Any) -> FileDescriptor | None:
    """The Twisted TCP transport holding ``transport``'s unsent bytes, if it can be read.

    A plain TCP connection is its own; TLS (``TLSMemoryBIOProtocol``) writes
    the encrypted bytes to the TCP transport beneath it, and the connection
    layer's guard (:class:`pubsubclub.net.edge.EdgeConnection`) to the one
    beneath it: up to three wrappers are looked through.
    """
    candidate = transport
    for _ in range(4):
        if candidate is None:
            return None
        if isinstance(candidate, FileDescriptor) and all(
            hasattr(candidate, name) for name in ("dataBuffer", "offset", "_tempDataLen")
        ):
            return candidate
        candidate = getattr(candidate, "transport", None)
    return None


@implementer(IPushProducer)
class SendBacklog:
    """How many bytes a connection has queued in the node but not yet sent.

    Where the connection runs on a Twisted TCP transport (plain or under
    TLS), that transport's write buffer is read directly: exact, and free of
    history. Otherwise it is estimated from Twisted's public producer API:
    registered as the streaming producer, it is paused when the write buffer
    grows past ``bufferSize`` and resumed only once that buffer has fully
    drained, so while paused the backlog is at most the buffer size plus
    everything written since the pause.

    The estimate alone is not enough for a busy link: a peer that reads
    steadily but never lets the buffer drain to empty looks, to it, like a
    stuck one, and a steady 500,000-message link run crossed the 32 MiB cap
    every ~200,000 messages and dropped a healthy link.
    """

    #: Twisted's default write buffer size (``FileDescriptor.bufferSize``).
    BUFFER_SIZE = 2**16

    def __init__(self, buffer: FileDescriptor | None = None) -> None:
        self.paused = False
        self.since_pause = 0
        self._buffer = buffer

    def written(self, nbytes: int) -> None:
        """Account for ``nbytes`` just written to the transport."""
        if self.paused:
            self.since_pause += nbytes

    def unsent(self) -> int:
        """Bytes written but still in the node (an upper bound where estimated)."""
        buffer = self._buffer
        if buffer is not None:
            return len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen  # type: ignore[attr-defined]
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
    buffer = write_buffer_of(transport)
    if buffer is not None:
        writethrough.install(buffer)
    backlog = SendBacklog(buffer)
    try:
        # Twisted Web's HTTPChannel is still registered from before the
        # WebSocket takeover; after it, nothing else produces here.
        transport.unregisterProducer()
        if buffer is None:
            # Only the estimate needs the producer calls. A registered producer
            # also holds loseConnection open: Twisted resumes a paused producer
            # when its buffer drains instead of closing.
            transport.registerProducer(backlog, True)
    except Exception:  # a transport without producer support: keep serving, unguarded
        log.failure("cannot watch the send buffer; slow {what} consumers will not be dropped", what=what)
        return None
    return backlog
