"""Write-through (pubsubclub.net.writethrough): an idle connection's bytes reach its socket within the write call."""

from __future__ import annotations

import socket
from typing import Any

import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.testing import StringTransport

from pubsubclub.net import writethrough


class _Keep(protocol.Protocol):
    """Server side: hands its connected self to a Deferred."""

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        self.factory.connected.callback(self)  # type: ignore[attr-defined]


async def _pair() -> tuple[Any, socket.socket, Any]:
    """A Twisted server connection, the blocking client socket at its other end, and the listening port."""
    factory = protocol.Factory.forProtocol(_Keep)
    factory.connected = defer.Deferred()  # type: ignore[attr-defined]
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")  # type: ignore[attr-defined]
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    server = await factory.connected  # type: ignore[attr-defined]
    return server, client, port


def _recv_exactly(sock: socket.socket, n: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _queued(conn: Any) -> int:
    return len(conn.dataBuffer) - conn.offset + conn._tempDataLen  # type: ignore[no-any-return]


@pytest_twisted.ensureDeferred
async def test_an_idle_connection_sends_inside_the_write_call() -> None:
    """With write-through the peer can read the bytes before the reactor runs again; without, nothing is sent yet."""
    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        server.transport.write(b"hello")
        # No reactor turn between the write and this blocking read: only a direct send can deliver.
        assert _recv_exactly(client, 5, timeout=2.0) == b"hello"
        assert _queued(server.transport) == 0
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_what_the_socket_does_not_take_queues_in_twisted_and_order_holds() -> None:
    """A write larger than the socket takes leaves the rest in Twisted's buffer; later writes go behind it, in order."""
    server, client, port = await _pair()
    try:
        server.transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
        assert writethrough.install(server.transport)
        big = bytes(range(256)) * 2048  # 512 KiB: more than the kernel buffers hold
        server.transport.write(big)
        assert 0 < _queued(server.transport) < len(big)  # part went directly, the rest waits in Twisted
        server.transport.write(b"tail")  # while something is queued: behind it, never before
        assert _queued(server.transport) > 0
        received = await _read_in_thread(client, len(big) + 4)
        assert received == big + b"tail"
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()


async def _read_in_thread(sock: socket.socket, n: int) -> bytes:
    """Read ``n`` bytes in a thread while the reactor drains Twisted's buffer."""
    from twisted.internet import threads

    data: bytes = await threads.deferToThread(_recv_exactly, sock, n, 20.0)
    return data


@pytest_twisted.ensureDeferred
async def test_a_closing_connection_is_left_to_twisted() -> None:
    """After loseConnection nothing is written directly (Twisted decides what a closing connection still sends)."""
    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        server.transport.loseConnection()
        server.transport.write(b"late")
        client.settimeout(0.0)
        try:
            early = client.recv(16)
        except BlockingIOError:
            early = b""
        assert early == b""  # not sent inside the call
    finally:
        client.close()
        await port.stopListening()


def test_only_tcp_and_unix_connections_are_written_through() -> None:
    """A transport that is not a Twisted TCP/Unix connection keeps its own write."""
    transport = StringTransport()
    assert not writethrough.install(transport)
    transport.write(b"x")
    assert transport.value() == b"x"


@pytest_twisted.ensureDeferred
async def test_every_guarded_listener_writes_through() -> None:
    """A connection accepted by the guard every listener stands on (net.edge) sends inside its protocol's write."""
    from pubsubclub.net.edge import Edge, EdgeLimits

    edge = Edge(reactor, lambda *_: None, lambda *_: None)  # type: ignore[arg-type]
    factory = protocol.Factory.forProtocol(_Keep)
    factory.connected = defer.Deferred()  # type: ignore[attr-defined]
    limits = EdgeLimits(handshake_timeout=0, idle_timeout=0, ping_interval=0)
    port = reactor.listenTCP(0, edge.guard("test", factory, limits), interface="127.0.0.1")  # type: ignore[attr-defined]
    client = socket.create_connection(("127.0.0.1", port.getHost().port))
    server = await factory.connected  # type: ignore[attr-defined]
    try:
        server.transport.write(b"through the guard")  # the guard's write, then the TCP connection's
        assert _recv_exactly(client, 17, timeout=2.0) == b"through the guard"
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()
