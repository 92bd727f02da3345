"""The connection layer's guard (pubsubclub.net.edge) in memory: deadlines, keepalives, caps, pending bytes."""

from __future__ import annotations

from typing import Any

from twisted.internet.abstract import FileDescriptor
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock

from pubsubclub.net.edge import Edge, EdgeConnection, EdgeLimits, EdgeSettings, handshake_done


class _Buffered(FileDescriptor):
    """A transport with Twisted's real write buffer that never sends (a peer that does not read)."""

    def __init__(self, reactor: MemoryReactorClock) -> None:
        super().__init__(reactor)
        self.connected = 1
        self.aborted = False
        self.lost = False

    def writeSomeData(self, data: Any) -> int:  # noqa: N802 - Twisted API
        return 0

    def getPeer(self) -> IPv4Address:  # noqa: N802 - Twisted API
        return IPv4Address("TCP", "10.0.0.1", 5555)

    def getHost(self) -> IPv4Address:  # noqa: N802 - Twisted API
        return IPv4Address("TCP", "127.0.0.1", 80)

    def abortConnection(self) -> None:  # noqa: N802 - Twisted API
        self.aborted = True

    def loseConnection(self, _reason: Any = None) -> None:  # noqa: N802 - Twisted API
        self.lost = True


class _App(Protocol):
    """A protocol with the guard's optional hooks."""

    def __init__(self) -> None:
        self.pings = 0
        self.partial = 0

    def keepalive(self) -> None:
        self.pings += 1

    def pending_input(self) -> int:
        return self.partial


class _World:
    def __init__(self, limits: EdgeLimits, budget: int = 0) -> None:
        self.clock = MemoryReactorClock()
        self.refused: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str]] = []
        self.edge = Edge(
            self.clock,
            lambda *k: self.refused.append(k),
            lambda *k: self.dropped.append(k),
            EdgeSettings(max_partial_input=budget, log_interval=5),
        )
        self.listener = self.edge.guard("nsd", Factory.forProtocol(_App), limits, b"REFUSED\n")

    def connect(self, host: str = "10.0.0.1") -> tuple[Any, _Buffered]:
        protocol = self.listener.buildProtocol(IPv4Address("TCP", host, 5555))
        transport = _Buffered(self.clock)
        protocol.makeConnection(transport)
        return protocol, transport

    def lose(self, protocol: EdgeConnection) -> None:
        protocol.connectionLost(None)  # type: ignore[arg-type]

    def finish(self) -> None:
        self.edge.stop()
        assert not self.clock.getDelayedCalls()


def test_handshake_deadline_closes_only_the_unfinished() -> None:
    """A connection without a handshake is aborted at the deadline and counted; one that finished stays."""
    world = _World(EdgeLimits(handshake_timeout=2, idle_timeout=0, ping_interval=0))
    slow, slow_t = world.connect()
    done, done_t = world.connect()
    handshake_done(done)
    world.clock.advance(1.9)
    assert not slow_t.aborted
    for _ in range(3):
        world.clock.advance(0.5)
    assert slow_t.aborted and not done_t.aborted
    assert world.dropped == [("nsd", "handshake_timeout")]
    world.lose(slow)
    world.lose(done)
    world.finish()


def test_quiet_connection_is_pinged_and_kept_while_it_answers() -> None:
    """After the handshake a quiet connection gets keepalive(); answering keeps it, silence ends it."""
    world = _World(EdgeLimits(handshake_timeout=1, idle_timeout=4, ping_interval=1))
    conn, transport = world.connect()
    handshake_done(conn)
    answered = 0
    for _ in range(40):  # 10 s, answering every ping
        world.clock.advance(0.25)
        if conn.wrappedProtocol.pings > answered:  # a new ping: answer it
            answered += 1
            conn.dataReceived(b"pong")
    assert conn.wrappedProtocol.pings >= 5 and not transport.aborted
    for _ in range(20):  # 5 s without answering
        world.clock.advance(0.25)
    assert transport.aborted
    assert world.dropped == [("nsd", "idle_timeout")]
    world.lose(conn)
    world.finish()


def test_per_address_cap_refuses_with_the_protocols_answer() -> None:
    """Past max-per-address the next connection from that address gets the refusal bytes; others still connect."""
    world = _World(EdgeLimits(max_per_address=2, handshake_timeout=0, idle_timeout=0, ping_interval=0))
    a, _ = world.connect()
    b, _ = world.connect()
    refused, refused_t = world.connect()
    assert not isinstance(refused, EdgeConnection)
    assert refused_t.lost and b"".join(refused_t._tempDataBuffer) == b"REFUSED\n"
    other, _ = world.connect("10.0.0.2")
    assert isinstance(other, EdgeConnection)
    world.lose(a)
    again, _ = world.connect()
    assert isinstance(again, EdgeConnection)
    assert world.refused == [("nsd", "address_cap")]
    for conn in (b, other, again):
        world.lose(conn)
    world.finish()


def test_pending_bytes_past_the_cap_drop_once() -> None:
    """Every write counts, whatever it is (a pong too): past the cap the connection is aborted, counted once."""
    world = _World(EdgeLimits(max_pending_bytes=1000, handshake_timeout=0, idle_timeout=0, ping_interval=0))
    conn, transport = world.connect()
    for _ in range(9):
        conn.write(b"p" * 100)
    assert not transport.aborted
    conn.write(b"p" * 200)
    conn.write(b"p" * 200)
    assert transport.aborted and conn.unsent() == 0
    assert world.dropped == [("nsd", "slow_consumer")]
    world.lose(conn)
    world.finish()


def test_partial_input_budget_closes_the_largest_holder() -> None:
    """The node's budget for unfinished input: past it, the largest holder goes first."""
    world = _World(EdgeLimits(handshake_timeout=0, idle_timeout=0, ping_interval=0), budget=1000)
    small, small_t = world.connect()
    big, big_t = world.connect()
    small.wrappedProtocol.partial = 400
    big.wrappedProtocol.partial = 700
    small.dataReceived(b"x")
    world.clock.advance(1.0)
    assert big_t.aborted and not small_t.aborted
    assert world.dropped == [("nsd", "partial_input_budget")]
    world.lose(small)
    world.lose(big)
    world.finish()


def test_partial_input_held_in_silence_is_closed() -> None:
    """After the handshake, an unfinished message with nothing arriving is closed after the handshake timeout."""
    world = _World(EdgeLimits(handshake_timeout=2, idle_timeout=0, ping_interval=0))
    conn, transport = world.connect()
    handshake_done(conn)
    conn.wrappedProtocol.partial = 10
    for _ in range(12):
        world.clock.advance(0.25)
    assert transport.aborted
    assert world.dropped == [("nsd", "partial_input_timeout")]
    world.lose(conn)
    world.finish()
