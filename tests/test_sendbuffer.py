"""SendBacklog: what a connection has queued in the node, measured on Twisted's own write buffer.

The buffer is a real ``FileDescriptor`` (Twisted's buffering and producer
calls, unchanged) whose socket accepts only what the test allows, so the
peer's reading pace is exact; the last checks real TCP and TLS connections.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from helpers.certs import make_ca
from twisted.internet import defer, endpoints, protocol, reactor
from twisted.internet.abstract import FileDescriptor
from twisted.internet.testing import MemoryReactor

from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer

MESSAGE = b"x" * 1000


class MeteredSocket(FileDescriptor):
    """A connected descriptor whose peer takes ``allowance`` bytes at the next ``doWrite``."""

    def __init__(self) -> None:
        super().__init__(reactor=MemoryReactor())
        self.connected = 1
        self.allowance = 0
        self.taken = 0

    def writeSomeData(self, data: bytes) -> int:  # noqa: N802 - Twisted's name
        n = min(len(data), self.allowance)
        self.allowance -= n
        self.taken += n
        return n

    def drain(self, nbytes: int) -> None:
        self.allowance = nbytes
        self.doWrite()


def watched() -> tuple[MeteredSocket, SendBacklog]:
    """A metered socket and the backlog the node would register on it."""
    sock = MeteredSocket()
    backlog = watch_send_buffer(sock, "test")
    assert backlog is not None
    return sock, backlog


def test_a_peer_reading_steadily_behind_a_full_buffer_shows_only_what_is_queued() -> None:
    """Twisted's buffer stays over bufferSize and never drains to empty; the backlog must not grow."""
    sock, backlog = watched()
    written = 0
    for _ in range(100):  # 100 KB queued: over Twisted's 64 KiB buffer
        sock.write(MESSAGE)
        backlog.written(len(MESSAGE))
        written += len(MESSAGE)
    assert backlog.unsent() == written
    peak = 0
    for _ in range(5000):  # 5 MB more, read as fast as it is written
        sock.write(MESSAGE)
        backlog.written(len(MESSAGE))
        written += len(MESSAGE)
        assert backlog.unsent() == written - sock.taken
        peak = max(peak, backlog.unsent())
        sock.drain(len(MESSAGE))
    # Counting since the pause said 5 MB here, and a 32 MiB cap fell after ~33,000 messages.
    assert peak == 101 * len(MESSAGE)


def test_a_stuck_peer_shows_everything_written() -> None:
    """A peer that reads nothing: every byte written is counted, and none once it all drained."""
    sock, backlog = watched()
    for i in range(1, 3001):
        sock.write(MESSAGE)
        backlog.written(len(MESSAGE))
        assert backlog.unsent() == i * len(MESSAGE)
    sock.drain(10**9)
    assert backlog.unsent() == 0


def test_without_a_readable_buffer_the_estimate_since_the_pause_is_kept() -> None:
    """A transport whose buffer cannot be read falls back to the producer-call estimate."""
    backlog = SendBacklog()
    backlog.written(10_000)
    assert backlog.unsent() == 0
    backlog.pauseProducing()
    backlog.written(500)
    backlog.pauseProducing()  # Twisted pauses again on every write over its buffer
    backlog.written(700)
    assert backlog.unsent() == SendBacklog.BUFFER_SIZE + 1200
    backlog.resumeProducing()
    assert backlog.unsent() == 0


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest_twisted.ensureDeferred
async def test_a_real_connection_is_measured_on_its_tcp_buffer(tmp_path: Path, tls: bool) -> None:
    """On the transports the node really gets (plain TCP, TLS over TCP), Twisted's buffer is read."""
    got: defer.Deferred[tuple[SendBacklog | None, int, object]] = defer.Deferred()

    class Server(protocol.Protocol):
        def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
            # The client's first bytes: TLS is set up, as before any WebSocket handshake.
            backlog = watch_send_buffer(self.transport, "test")
            # More than the kernel takes at once (tcp_wmem's largest send buffer is 4 MiB): write-through
            # (net/writethrough.py) hands the socket what it takes, the rest waits in Twisted's buffer.
            self.transport.write(b"y" * 8_000_000)
            got.callback((backlog, backlog.unsent() if backlog else -1, self.transport))
            self.transport.loseConnection()

    if tls:
        pem = make_ca(tmp_path, "ca").issue(tmp_path, "node", ips=("127.0.0.1",))
        server = f"ssl:0:interface=127.0.0.1:privateKey={pem}:certKey={pem}"
    else:
        server = "tcp:0:interface=127.0.0.1"
    port = await endpoints.serverFromString(reactor, server).listen(protocol.Factory.forProtocol(Server))
    closed: defer.Deferred[int] = defer.Deferred()

    class Client(protocol.Protocol):
        received = 0

        def connectionMade(self) -> None:  # noqa: N802 - Twisted's name
            self.transport.write(b"go")

        def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted's name
            self.received += len(data)

        def connectionLost(self, reason: object = None) -> None:  # noqa: N802 - Twisted's name
            closed.callback(self.received)

    kind = "ssl" if tls else "tcp"
    try:
        await endpoints.clientFromString(reactor, f"{kind}:host=127.0.0.1:port={port.getHost().port}").connect(
            protocol.Factory.forProtocol(Client)
        )
        backlog, queued, transport = await got
        assert backlog is not None
        assert backlog._buffer is (transport.transport if tls else transport)  # type: ignore[attr-defined]
        assert queued >= 8_000_000 - 4 * 1024 * 1024
        # Closes once the 8 MB are out: no paused producer holds loseConnection open.
        assert await closed == 8_000_000
        assert backlog.unsent() == 0
    finally:
        await defer.maybeDeferred(port.stopListening)
