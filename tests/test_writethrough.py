"""Write-through (pubsubclub.net.writethrough): a turn's first write leaves in the call, the rest at its end."""

from __future__ import annotations

import socket
from typing import Any

import pytest_twisted
from helpers.rawsocketclient import read_exactly
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


def _queued(conn: Any) -> int:
    return len(conn.dataBuffer) - conn.offset + conn._tempDataLen  # type: ignore[no-any-return]


async def _next_turn() -> None:
    """Let the reactor finish this turn (the corked connections' sends run at its end)."""
    from twisted.internet import task

    await task.deferLater(reactor, 0, lambda: None)


def _nothing_yet(sock: socket.socket) -> bool:
    sock.settimeout(0.0)
    try:
        return sock.recv(16) == b""
    except BlockingIOError:
        return True


@pytest_twisted.ensureDeferred
async def test_the_first_write_of_a_turn_leaves_in_the_call_the_rest_at_the_turns_end() -> None:
    """The first write to an idle connection is sent in the call; the turn's later ones leave in one send, no epoll."""
    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        sends: list[bytes] = []
        real = server.transport.socket

        class _Counting:
            def send(self, data: bytes) -> int:
                sends.append(data)
                return real.send(data)  # type: ignore[no-any-return]

        server.transport.write._sock = _Counting()
        server.transport.write(b"hello ")
        # No reactor turn between the write and this blocking read: only a send in the call delivers.
        assert read_exactly(client, 6, 2.0) == b"hello "
        server.transport.write(b"wor")
        server.transport.write(b"ld")
        assert _nothing_yet(client)  # corked until the end of the turn
        assert server.transport not in reactor.getWriters()  # type: ignore[attr-defined]
        await _next_turn()
        assert read_exactly(client, 5, 2.0) == b"world"
        assert sends == [b"hello ", b"world"]  # the turn's later writes in one send
        # Twisted never asked epoll for writability, and nothing is left queued.
        assert server.transport not in reactor.getWriters()  # type: ignore[attr-defined]
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
        assert 0 < _queued(server.transport) < len(big)  # part went in the call, the rest waits in Twisted
        assert server.transport in reactor.getWriters()  # type: ignore[attr-defined]  # epoll takes over
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

    data: bytes = await threads.deferToThread(read_exactly, sock, n, 20.0)
    return data


@pytest_twisted.ensureDeferred
async def test_a_closing_connection_is_left_to_twisted() -> None:
    """After loseConnection nothing is written directly (Twisted decides what a closing connection still sends)."""
    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        server.transport.loseConnection()
        server.transport.write(b"late")
        assert not server.transport.write.corked  # Twisted's own write took it
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
        assert read_exactly(client, 17, 2.0) == b"through the guard"  # in the call
        tcp_connection = server.transport.transport
        assert tcp_connection.write in writethrough._through  # written through in this turn: later writes gather
        assert tcp_connection not in reactor.getWriters()  # type: ignore[attr-defined]
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_connection_with_a_producer_is_left_to_twisted() -> None:
    """A registered producer (a file served by Twisted Web) is resumed by Twisted's doWrite: no write-through there."""
    from twisted.internet.interfaces import IPullProducer
    from zope.interface import implementer

    @implementer(IPullProducer)
    class _Pull:
        resumed = 0

        def resumeProducing(self) -> None:  # noqa: N802 - Twisted API
            self.resumed += 1

        def stopProducing(self) -> None:  # noqa: N802 - Twisted API
            pass

    server, client, port = await _pair()
    try:
        assert writethrough.install(server.transport)
        producer = _Pull()
        server.transport.registerProducer(producer, False)
        resumed_before = producer.resumed
        server.transport.write(b"chunk")
        assert server.transport in reactor.getWriters()  # type: ignore[attr-defined]  # Twisted's own path
        await _next_turn()
        await _next_turn()
        assert read_exactly(client, 5, 2.0) == b"chunk"
        assert producer.resumed > resumed_before  # Twisted asked for more once its buffer drained
    finally:
        client.close()
        server.transport.abortConnection()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_producer_failing_at_the_turns_end_leaves_no_other_connection_corked() -> None:
    """One corked connection whose producer raises on resume is logged; the turn's other connection still sends."""
    from twisted.logger import globalLogPublisher

    first, first_client, first_port = await _pair()
    second, second_client, second_port = await _pair()
    failures: list[Any] = []

    def observer(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None:
            failures.append(event["log_failure"])

    class Failing:
        calls = 0

        def resumeProducing(self) -> None:  # noqa: N802 - Twisted API
            self.calls += 1
            if self.calls > 1:  # the first is registerProducer's own
                raise RuntimeError("producer boom")

        def stopProducing(self) -> None:  # noqa: N802 - Twisted API
            pass

    globalLogPublisher.addObserver(observer)
    try:
        assert writethrough.install(first.transport) and writethrough.install(second.transport)
        first.transport.write(b"a")  # sent in the call: both connections corked for the turn
        second.transport.write(b"b")
        first.transport.registerProducer(Failing(), False)
        first.transport.write(b"c")
        second.transport.write(b"d")
        await _next_turn()
        assert read_exactly(first_client, 2, 5.0) == b"ac" and read_exactly(second_client, 2, 5.0) == b"bd"
        assert not first.transport.write.corked and not second.transport.write.corked
        assert any("producer boom" in repr(f) for f in failures)
        second.transport.write(b"e")  # not stuck behind a cork nobody flushes
        assert read_exactly(second_client, 1, 5.0) == b"e"
    finally:
        globalLogPublisher.removeObserver(observer)
        first.transport.unregisterProducer()
        for client, server, port in ((first_client, first, first_port), (second_client, second, second_port)):
            client.close()
            server.transport.abortConnection()
            await port.stopListening()
