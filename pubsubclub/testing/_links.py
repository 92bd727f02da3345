"""PSC links between Federations in memory: real Autobahn protocols, no sockets, time only when told.

Every node of a :class:`MemoryNetwork` runs on one ``MemoryReactorClock``:
its ``connectTCP`` calls are recorded, and :meth:`MemoryNetwork.answer` joins
each to the server factory of the node listening on the dialled port with
``iosim`` transports that keep a copy of what they carry
(:class:`RecordingWire`). Pings, time-outs and retries happen exactly when a
test advances the clock. :func:`partition` cuts a link silently, as a network
that drops packets does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.test import iosim

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import Federation, Role, psc
from pubsubclub.federation.auth import PROOF_PREFIX
from pubsubclub.federation.linkclient import PSCClientProtocol
from pubsubclub.federation.linkserver import PSCServerProtocol
from pubsubclub.federation.retry import RetryPolicy

# WebSocket opcodes (RFC 6455, section 5.2) that the wire's readers look for.
_OPCODE_TEXT = 1
_OPCODE_CLOSE = 8


def psc_url(port: int, host: str = "127.0.0.1") -> str:
    """The PSC URL of the node listening on ``port``."""
    return f"ws://{host}:{port}/psc"


class RecordingWire(iosim.FakeTransport):
    """An in-memory transport that keeps a copy of everything written, and can go mute."""

    #: When true, writes are dropped: the peer hears nothing (not even pongs).
    muted = False

    def __init__(self, protocol: Any, isServer: bool, host: IPv4Address, peer: IPv4Address) -> None:
        super().__init__(protocol, isServer, hostAddress=host, peerAddress=peer)
        #: Every byte written while not muted, the HTTP handshake included.
        self.written = bytearray()

    def write(self, data: bytes) -> None:
        """Record and send ``data``, unless muted or closing."""
        if self.muted or self.disconnecting:
            return
        self.written += data
        super().write(data)

    def frames(self) -> list[tuple[int, bytes]]:
        """Every WebSocket frame written after the HTTP upgrade, as (opcode, unmasked payload)."""
        data = bytes(self.written)
        data = data[data.index(b"\r\n\r\n") + 4 :]
        frames = []
        while data:
            opcode, length, masked = data[0] & 0x0F, data[1] & 0x7F, data[1] & 0x80
            pos = 2
            if length == 126:
                (length,) = struct.unpack("!H", data[2:4])
                pos = 4
            elif length == 127:
                (length,) = struct.unpack("!Q", data[2:10])
                pos = 10
            mask = data[pos : pos + 4] if masked else b"\0\0\0\0"
            pos += 4 if masked else 0
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(data[pos : pos + length]))
            frames.append((opcode, payload))
            data = data[pos + length :]
        return frames

    def texts(self) -> list[bytes]:
        """Every text frame written, including a link's cluster-secret proof (``PSC-AUTH ...``)."""
        return [payload for opcode, payload in self.frames() if opcode == _OPCODE_TEXT]

    def messages(self) -> list[psc.Message]:
        """The PSC messages written, decoded, a 0.4 batch frame split into its lines (the proof frame is not one)."""
        return [
            psc.decode(line)
            for text in self.texts()
            if not text.startswith(PROOF_PREFIX)
            for line in text.split(psc.BATCH_SEPARATOR)
        ]

    def close(self) -> tuple[int, str] | None:
        """The close frame written, as (code, reason), if any."""
        for opcode, payload in self.frames():
            if opcode == _OPCODE_CLOSE:
                return struct.unpack("!H", payload[:2])[0], payload[2:].decode()
        return None


@dataclass
class MemoryLink:
    """One dialled connection: both Autobahn protocols, both wires and their pump."""

    client: PSCClientProtocol
    server: PSCServerProtocol
    client_wire: RecordingWire
    server_wire: RecordingWire
    #: What moves bytes between the wires: an ``iosim.IOPump``, or a :class:`Cut` while partitioned.
    pump: Any


class RecordingSink:
    """A local hub subscriber (of topics or patterns) that remembers what it was given."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []
        #: ``(topic, pattern)`` of each delivery for a pattern, in order.
        self.matched: list[tuple[str, Pattern]] = []

    def deliver(self, envelope: Envelope) -> None:
        """Remember ``envelope``."""
        self.got.append(envelope)

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> None:
        """Remember ``envelope`` and the pattern it matched."""
        self.got.append(envelope)
        self.matched.append((envelope.topic, pattern))


def _unwrap(protocol: Any) -> Any:
    # The endpoint and ClientService wrap our protocol; walk down to it.
    while not isinstance(protocol, PSCClientProtocol):
        protocol = getattr(protocol, "_wrappedProtocol", None) or protocol._protocol
    return protocol


class MemoryNetwork:
    """Nodes on one MemoryReactorClock; each connectTCP is answered by the node listening on that port."""

    #: Seconds between pings on a node's links, unless given to :meth:`node`.
    ping_interval = 5.0
    #: How every node retries its dials.
    retry = RetryPolicy(initial=1.0, factor=2.0, max_delay=8.0, jitter=0.25)

    def __init__(self, *, ping_interval: float | None = None, retry: RetryPolicy | None = None) -> None:
        if ping_interval is not None:
            self.ping_interval = ping_interval
        if retry is not None:
            self.retry = retry
        self.reactor = MemoryReactorClock()
        #: Port -> the server factory of the node listening there.
        self.listeners: dict[int, Any] = {}
        self.nodes: list[Federation] = []
        #: Every connection answered so far, oldest first.
        self.links: list[MemoryLink] = []
        self._answered = 0

    def node(
        self,
        node_id: str,
        port: int,
        *,
        rand: Callable[[], float] = lambda: 0.5,
        listen_role: Role = Role.PRODUCER,
        ping_interval: float | None = None,
        learn_peers: bool = False,
        **kwargs: Any,
    ) -> Federation:
        """A Federation for a new node with hub ``node_id``, listening on ``port``.

        Peer learning is off unless asked for, so each test dials exactly the
        links it names. Other keyword arguments go to :class:`Federation`.
        """
        federation = Federation(
            Hub(node_id),
            reactor=self.reactor,
            listen_role=listen_role,
            ping_interval=self.ping_interval if ping_interval is None else ping_interval,
            learn_peers=learn_peers,
            retry=self.retry,
            rand=rand,
            advertise_url=psc_url(port),
            **kwargs,
        )
        self.listeners[port] = federation.server_factory()
        self.nodes.append(federation)
        return federation

    def dials(self) -> int:
        """How many connectTCP calls were made so far."""
        return len(self.reactor.tcpClients)

    def unanswered(self) -> list[tuple[Any, ...]]:
        """The connectTCP calls not answered yet, as ``(host, port, factory, timeout, bind)``."""
        return list(self.reactor.tcpClients[self._answered :])

    def answer(self) -> list[MemoryLink]:
        """Connect every dial not yet answered to its listener, then pump until quiet."""
        new = []
        for host, port, factory, _timeout, _bind in self.reactor.tcpClients[self._answered :]:
            client_addr = IPv4Address("TCP", "127.0.0.1", 40000 + len(self.links))
            server_addr = IPv4Address("TCP", host, port)
            client = factory.buildProtocol(server_addr)
            server = self.listeners[port].buildProtocol(client_addr)
            client_wire = RecordingWire(client, False, client_addr, server_addr)
            server_wire = RecordingWire(server, True, server_addr, client_addr)
            pump = iosim.connect(server, server_wire, client, client_wire, greet=False, clock=self.reactor)
            link = MemoryLink(_unwrap(client), server, client_wire, server_wire, pump)
            self.links.append(link)
            new.append(link)
        self._answered = self.dials()
        self.flush()
        return new

    def refuse(self, port: int) -> int:
        """Fail every unanswered dial to ``port`` as connection refused (nothing listens there); how many."""
        pending = self.reactor.tcpClients[self._answered :]
        refused = [entry for entry in pending if entry[1] == port]
        self.reactor.tcpClients[self._answered :] = [entry for entry in pending if entry[1] != port]
        for _host, _port, factory, _timeout, _bind in refused:
            # MemoryReactor keeps no connector; the endpoints' factories do not read it.
            factory.clientConnectionFailed(None, Failure(ConnectionRefusedError()))  # type: ignore[arg-type]
        return len(refused)

    def flush(self) -> None:
        """Move bytes on every link (and run due calls) until nothing moves."""
        while sum(link.pump.flush() for link in self.links):
            pass

    def advance(self, seconds: float) -> None:
        """Move the clock, then let the links react."""
        self.reactor.advance(seconds)
        self.flush()

    def stop(self) -> None:
        """Stop every node and pump the closes through."""
        for federation in self.nodes:
            federation.stop()
        self.flush()


class Cut:
    """Stands in for a link's pump while the network between its ends drops every packet.

    Nothing crosses. Each end learns of it only from its own ping timeout
    (its transport then closes, locally); an end that has not timed out hears
    nothing at all until :meth:`heal` delivers the RST its next
    retransmission would get.
    """

    def __init__(self, link: MemoryLink) -> None:
        self.link = link
        link.client_wire.muted = True
        link.server_wire.muted = True

    def flush(self) -> int:
        """Report each end's own close to that end only."""
        moved = 0
        for wire in (self.link.client_wire, self.link.server_wire):
            if wire.disconnecting and not wire.disconnected:
                wire.disconnected = True
                wire.reportDisconnect()
                moved += 1
        return moved

    def heal(self) -> None:
        """The network is back: the listener's ghost connection is reset."""
        wire = self.link.server_wire
        if not wire.disconnected:
            wire.disconnected = True
            wire.reportDisconnect()


def partition(link: MemoryLink) -> Cut:
    """Cut ``link`` silently (see :class:`Cut`); the network's flushes then go through the cut."""
    cut = Cut(link)
    link.pump = cut
    return cut
