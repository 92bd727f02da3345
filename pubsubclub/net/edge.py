"""The guard every listener of a node stands on: deadlines, connection caps, bounded input, pending bytes.

One :class:`Edge` per node holds every guarded listener (:meth:`Edge.guard`
wraps a listener's factory). Each accepted connection is an
:class:`EdgeConnection`, a Twisted :class:`~twisted.protocols.policies.ProtocolWrapper`
between the transport (TCP, or TLS over it) and the listener's own protocol:

* **caps**: a connection past ``max_per_address`` open connections from its
  address, or past ``max_connections`` on its listener, is answered with the
  listener's refusal (HTTP 503, the RawSocket "maximum connection count
  reached" handshake error, an NSD ``ErrorResponse``, a stream error status)
  and closed; refusals are counted (``pubsubclub_refused_connections_total``)
  and logged as one line per listener and interval, not one per connection;
* **deadlines**: a connection must complete its protocol's handshake (the
  protocol says so with :func:`handshake_done`) within ``handshake_timeout``;
  after it, one quiet (no byte received) for ``idle_timeout`` is closed. A
  protocol with a keepalive gets its ``keepalive()`` called once it has been
  quiet for ``ping_interval`` (a WebSocket ping, a RawSocket PING), so a
  peer that answers is never quiet for long: idle subscribers stay;
* **partial input**: a protocol that reports ``pending_input()`` (bytes of an
  unfinished line, frame or header) is closed when it holds some and has been
  quiet for ``handshake_timeout``, and the node's guarded connections together
  hold at most ``max_partial_input`` bytes: past it, the largest holders are
  closed first;
* **pending bytes** (the slow-consumer rule, as nats-server's): after every
  write, control frames (pongs) included, the bytes the connection has queued
  in the node are read from the TCP transport's own buffer; past
  ``max_pending_bytes`` the connection is aborted as a slow consumer.

Deadlines are checked by one sweep over all guarded connections (a
:class:`~twisted.internet.task.LoopingCall` that runs only while there are
any), not by a timer per connection; the per-byte cost is one attribute store
per read and one buffer-size check per write. Closes are counted as
``pubsubclub_disconnects_total{frontend=<listener>, reason}`` with the reasons
of :class:`DropReason`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet import task
from twisted.internet.interfaces import IReactorTime, ISSLTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from zope.interface import directlyProvides, providedBy

from pubsubclub.net import writethrough
from pubsubclub.net.reactor import read_past
from pubsubclub.net.sendbuffer import write_buffer_of
from pubsubclub.net.websocket import forget_closed

log = Logger()


class DropReason(enum.StrEnum):
    """Why the guard closed a connection: the ``reason`` label of ``pubsubclub_disconnects_total``."""

    #: More than ``max_pending_bytes`` queued for a peer that does not read.
    SLOW_CONSUMER = "slow_consumer"
    #: The protocol's handshake was not completed in time.
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    #: Nothing received for ``idle_timeout`` after the handshake.
    IDLE_TIMEOUT = "idle_timeout"
    #: An unfinished line/frame/header held while nothing arrived.
    PARTIAL_INPUT_TIMEOUT = "partial_input_timeout"
    #: The node's budget for unfinished input was exceeded; this connection held the most.
    PARTIAL_INPUT_BUDGET = "partial_input_budget"


class RefusalReason(enum.StrEnum):
    """Why a connection was refused: the ``reason`` label of ``pubsubclub_refused_connections_total``."""

    #: Its address already has ``max_per_address`` open connections on this listener.
    ADDRESS_CAP = "address_cap"
    #: The listener already has ``max_connections`` open connections.
    LISTENER_CAP = "listener_cap"


@dataclass(frozen=True)
class EdgeLimits:
    """One listener's limits (0 turns a limit off)."""

    #: Seconds from accept to the protocol's handshake being done.
    handshake_timeout: float = 10.0
    #: Seconds without a byte received, after the handshake, before the connection is closed.
    idle_timeout: float = 30.0
    #: Seconds of quiet after which the protocol's ``keepalive()`` is asked to ping.
    ping_interval: float = 10.0
    #: Open connections from one address on this listener.
    max_per_address: int = 1000
    #: Open connections on this listener.
    max_connections: int = 10_000
    #: Bytes queued for one connection before it is dropped as a slow consumer.
    max_pending_bytes: int = 16 * 1024 * 1024


#: ``protocol.pending_input()``: bytes of unfinished input a protocol holds (optional hook).
PendingInput = Callable[[], int]


def handshake_done(transport: Any) -> None:
    """Tell the guard under ``transport`` (a protocol's ``self.transport``) that the handshake is complete.

    A no-op on a transport that is not guarded (library use, tests).
    """
    if isinstance(transport, EdgeConnection):
        transport.handshake_done()


def unsent_bytes(transport: Any, backlog: Any) -> int:
    """Bytes queued for a protocol's peer: its guard's count (0 once the guard closed it), else ``backlog``'s.

    Front-ends check this before sending, to count the message that found a
    client over its cap; the guard itself drops it on the write that crossed.
    """
    if isinstance(transport, EdgeConnection):
        return transport.unsent()
    return backlog.unsent() if backlog is not None else 0  # type: ignore[no-any-return]


def reads_send_buffer(transport: Any) -> bool:
    """True if ``transport`` is a guarded connection reading its TCP buffer: it drops a slow consumer itself.

    A protocol on such a transport needs no :class:`~pubsubclub.net.sendbuffer.SendBacklog` of its own:
    :func:`unsent_bytes` asks the guard, which checks the cap after every write.
    """
    return isinstance(transport, EdgeConnection) and transport._buffer is not None


def http_refusal(text: str) -> bytes:
    """An HTTP 503 answer that closes the connection (WebSocket and HTTP listeners, before any upgrade)."""
    body = text.encode() + b"\n"
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


class EdgeConnection(ProtocolWrapper):
    """One guarded connection (see the module docstring)."""

    factory: EdgeListener

    # The guard's own state in slots: one per connection, and an instance dictionary whose
    # keys arrive in varying order is a large unshared one (memory per idle session).
    __slots__ = ("heard", "handshaken", "closing", "pinged", "address", "connected_at", "heard_at", "_buffer", "_cap")

    def __init__(self, factory: EdgeListener, wrapped: Protocol, address: str, now: float) -> None:
        super().__init__(factory, wrapped)  # type: ignore[arg-type]
        #: Bytes arrived since the last sweep (one store per read: the whole per-read cost).
        self.heard = False
        #: The protocol said its handshake is complete.
        self.handshaken = False
        #: The guard (or an abort) has ended this connection; nothing more is written.
        self.closing = False
        #: ``keepalive()`` was called in this quiet period.
        self.pinged = False
        self.address = address
        self.connected_at = now
        #: When bytes were last seen (to the sweep period).
        self.heard_at = now
        self._buffer: Any = None
        self._cap = factory.limits.max_pending_bytes

    def makeConnection(self, transport: Any) -> None:  # noqa: N802 - Twisted API
        """Find the TCP buffer to read pending bytes from, then connect the protocol."""
        self._buffer = write_buffer_of(transport)
        if self._buffer is not None:
            writethrough.install(self._buffer)
            if transport is self._buffer:
                # Plain TCP: the write-through is this guard's write too, with write()'s rules (one call per write).
                through = writethrough.guard(transport, self)
                if through is not None:
                    self.write = through  # type: ignore[method-assign]
        super().makeConnection(transport)
        # ProtocolWrapper claims every interface of the transport. Not ISSLTransport: Autobahn
        # then asks for a TLS channel id, which only the TLS protocol itself can give (it is
        # beneath us), and fails the connection; the TLS protocol still does TLS. Worked out once
        # per kind of transport (``directlyProvidedBy`` made a declaration per connection, each a
        # reference cycle left to the cyclic collector).
        spec = providedBy(transport)
        kept = _KEPT_INTERFACES.get(spec)
        if kept is None:
            kept = tuple(i for i in spec.flattened() if not i.isOrExtends(ISSLTransport))
            if len(_KEPT_INTERFACES) < _MAX_KEPT_KINDS:  # a few kinds of transport; never one entry per connection
                _KEPT_INTERFACES[spec] = kept
        directlyProvides(self, *kept)

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Note that the peer spoke; pass the bytes on (the node's reactor does the same itself: read_past)."""
        self.heard = True
        self.wrappedProtocol.dataReceived(data)

    def write(self, data: bytes) -> None:
        """Queue ``data``; past the pending-bytes cap, drop the connection as a slow consumer."""
        if self.closing:
            return
        self.transport.write(data)  # type: ignore[union-attr]
        self.check_cap()

    def check_cap(self) -> None:
        """The pending-bytes rule (every write to the peer, the write-through's included): past the cap, drop it."""
        buffer = self._buffer
        if buffer is not None and self._cap and (
            len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen > self._cap
        ):
            self._slow_consumer()

    def writeSequence(self, data: Any) -> None:  # noqa: N802 - Twisted API
        """As :meth:`write`, for several pieces."""
        self.write(b"".join(data))

    def unsent(self) -> int:
        """Bytes queued for the peer and not yet taken (0 where the transport cannot tell, or once closing)."""
        buffer = self._buffer
        if buffer is None or self.closing:
            return 0
        return len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen  # type: ignore[no-any-return]

    def abortConnection(self) -> None:  # noqa: N802 - Twisted API
        """Drop the connection now; later writes are discarded."""
        if self.closing and self.disconnecting:
            return
        self.closing = True
        self.disconnecting = True
        self.transport.abortConnection()  # type: ignore[union-attr]

    def handshake_done(self) -> None:
        """The protocol's handshake is complete: from now on only the idle rules apply."""
        if not self.handshaken:
            self.handshaken = True
            self.factory.handshakes += 1

    def connectionLost(self, reason: Failure = connectionDone) -> None:  # noqa: N802 - Twisted API
        """Forget the connection, tell the protocol, then let go of it (no reference cycle outlives a connection)."""
        self.closing = True
        self.factory.forget(self)
        try:
            self.wrappedProtocol.connectionLost(reason)
        finally:
            self._let_go()

    def _let_go(self) -> None:
        # The protocol and this wrapper refer to each other (``transport`` and ``wrappedProtocol``),
        # and so do the TCP connection and its write-through, and an Autobahn protocol and its
        # fired ``is_closed``: left alone, every closed connection would wait for a full cyclic
        # collection, whose walk over a node's many sessions stalls the reactor
        # (docs/architecture.md, "Closed connections and the cyclic collector").
        wrapped = self.wrappedProtocol
        self.wrappedProtocol = _CLOSED
        forget_closed(wrapped)
        if self._buffer is not None:
            writethrough.uninstall(self._buffer)
        vars(self).pop("write", None)  # the write-through made this guard's (it refers to the guard)

    def pending_input(self) -> int:
        """Unfinished input the protocol holds (0 when it does not say)."""
        hook = getattr(self.wrappedProtocol, "pending_input", None)
        return int(hook()) if hook is not None else 0

    def drop(self, reason: DropReason, detail: str) -> None:
        """Abort the connection for ``reason``, counted and logged (rate-limited)."""
        if self.closing:
            return
        self.factory.dropped(self, reason, detail)
        self.abortConnection()

    def _slow_consumer(self) -> None:
        self.drop(DropReason.SLOW_CONSUMER, f"{self.unsent()} bytes unsent, limit is {self._cap}")

    def check(self, now: float) -> None:
        """The sweep's look at this connection: deadlines and keepalives."""
        if self.closing:
            return
        if self.heard:
            self.heard = False
            self.heard_at = now
            self.pinged = False
        limits = self.factory.limits
        if not self.handshaken:
            if limits.handshake_timeout and now - self.connected_at >= limits.handshake_timeout:
                self.drop(DropReason.HANDSHAKE_TIMEOUT, f"no handshake within {limits.handshake_timeout:g} s")
            return
        quiet = now - self.heard_at
        if limits.idle_timeout and quiet >= limits.idle_timeout:
            self.drop(DropReason.IDLE_TIMEOUT, f"nothing received for {limits.idle_timeout:g} s")
            return
        if limits.handshake_timeout and quiet >= limits.handshake_timeout and self.pending_input():
            self.drop(
                DropReason.PARTIAL_INPUT_TIMEOUT,
                f"an unfinished message held with nothing received for {limits.handshake_timeout:g} s",
            )
            return
        if limits.ping_interval and quiet >= limits.ping_interval and not self.pinged:
            self.pinged = True
            keepalive = getattr(self.wrappedProtocol, "keepalive", None)
            if keepalive is not None:
                keepalive()


# The node's reactor reads a guarded TCP connection past dataReceived (its two lines done there, no call between).
read_past(EdgeConnection)
#: What a closed :class:`EdgeConnection` wraps: nothing of the protocol it carried.
_CLOSED = Protocol()
#: The interfaces an :class:`EdgeConnection` provides, by its transport's (see ``makeConnection``).
_KEPT_INTERFACES: dict[Any, tuple[Any, ...]] = {}
_MAX_KEPT_KINDS = 64


class _Refused(Protocol):
    """Answers a refused connection with the listener's refusal bytes and closes it."""

    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Refuse."""
        assert self.transport is not None
        if self._answer:
            self.transport.write(self._answer)
        self.transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Whatever the peer sent is ignored."""


class EdgeListener(WrappingFactory):
    """A listener's factory, wrapped: every connection it accepts is an :class:`EdgeConnection`."""

    protocol = EdgeConnection
    noisy = False

    def __init__(self, edge: Edge, name: str, wrapped: Any, limits: EdgeLimits, refusal: bytes) -> None:
        super().__init__(wrapped)
        self.edge = edge
        #: The ``frontend`` label of its counts: wamp, rawsocket, psc, nsd, tep, stream, ops.
        self.name = name
        self.limits = limits
        self.refusal = refusal
        self.connections: set[EdgeConnection] = set()
        self.by_address: dict[str, int] = {}
        #: Connections that completed their handshake (cumulative).
        self.handshakes = 0

    def logPrefix(self) -> str:  # noqa: N802 - Twisted API
        """The wrapped factory's log prefix."""
        return f"{self.name}-edge"

    def buildProtocol(self, addr: Any) -> Any:  # noqa: N802 - Twisted API
        """A guarded connection, or a refusal past a cap."""
        address = str(getattr(addr, "host", addr))
        limits = self.limits
        if limits.max_connections and len(self.connections) >= limits.max_connections:
            return self._refuse(address, RefusalReason.LISTENER_CAP)
        held = self.by_address.get(address, 0)
        if limits.max_per_address and held >= limits.max_per_address:
            return self._refuse(address, RefusalReason.ADDRESS_CAP)
        inner = self.wrappedFactory.buildProtocol(addr)
        if inner is None:
            return None
        connection = EdgeConnection(self, inner, address, self.edge.clock.seconds())
        self.connections.add(connection)
        self.by_address[address] = held + 1
        self.edge.opened()
        return connection

    def registerProtocol(self, p: Any) -> None:  # noqa: N802 - Twisted API
        """Kept in :attr:`connections` instead (WrappingFactory's dict is not used)."""

    def unregisterProtocol(self, p: Any) -> None:  # noqa: N802 - Twisted API
        """See :meth:`registerProtocol`."""

    def forget(self, connection: EdgeConnection) -> None:
        """``connection`` is gone."""
        if connection in self.connections:
            self.connections.discard(connection)
            n = self.by_address.get(connection.address, 0) - 1
            if n > 0:
                self.by_address[connection.address] = n
            else:
                self.by_address.pop(connection.address, None)

    def _refuse(self, address: str, reason: RefusalReason) -> Protocol:
        self.edge.refused(self, address, reason)
        return _Refused(self.refusal)

    def dropped(self, connection: EdgeConnection, reason: DropReason, detail: str) -> None:
        """Count and log (rate-limited) one connection closed by the guard."""
        self.edge.dropped(self, connection, reason, detail)


class _Tally:
    """Counts per (listener, reason) for one log line per interval."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.example: dict[tuple[str, str], str] = {}
        self.timer: Any = None


@dataclass(frozen=True)
class EdgeSettings:
    """Node-wide settings of the connection layer."""

    #: Bytes of unfinished input all guarded connections together may hold (0: no budget).
    max_partial_input: int = 64 * 1024 * 1024
    #: Seconds between log lines about refused or dropped connections (each line sums the interval).
    log_interval: float = 10.0


class Edge:
    """The node's connection layer: every guarded listener, one sweep, one set of counts."""

    def __init__(
        self,
        clock: IReactorTime,
        count_refusal: Callable[[str, str], None],
        count_drop: Callable[[str, str], None],
        settings: EdgeSettings = EdgeSettings(),
    ) -> None:
        self.clock = clock
        self.settings = settings
        self._count_refusal = count_refusal
        self._count_drop = count_drop
        self.listeners: list[EdgeListener] = []
        self._sweep: task.LoopingCall | None = None
        self._period = 1.0
        self._refusals = _Tally()
        self._drops = _Tally()

    def guard(self, name: str, factory: Any, limits: EdgeLimits, refusal: bytes = b"") -> EdgeListener:
        """``factory`` behind the guard, for ``listen()``; ``refusal`` is written to a refused connection."""
        listener = EdgeListener(self, name, factory, limits, refusal)
        self.listeners.append(listener)
        shortest = min(
            (t for t in (limits.handshake_timeout, limits.idle_timeout, limits.ping_interval) if t),
            default=4.0,
        )
        # Deadlines are met to within a quarter of the shortest (and at most a second).
        self._period = max(0.02, min(self._period, 1.0, shortest / 4))
        return listener

    def connections(self) -> int:
        """Open guarded connections."""
        return sum(len(listener.connections) for listener in self.listeners)

    def stats(self) -> dict[str, Any]:
        """Per listener: open connections, distinct addresses, completed handshakes (/stats)."""
        return {
            listener.name: {
                "connections": len(listener.connections),
                "addresses": len(listener.by_address),
                "handshakes": listener.handshakes,
            }
            for listener in self.listeners
        }

    def opened(self) -> None:
        """A connection was accepted: make sure the sweep runs."""
        if self._sweep is None:
            self._sweep = task.LoopingCall(self.sweep)
            self._sweep.clock = self.clock
            self._sweep.start(self._period, now=False)

    def sweep(self) -> None:
        """Deadlines and keepalives of every connection; the partial-input budget; stop when none are left."""
        now = self.clock.seconds()
        any_left = False
        for listener in self.listeners:
            for connection in list(listener.connections):
                connection.check(now)
            any_left = any_left or bool(listener.connections)
        if self.settings.max_partial_input:
            self._hold_to_budget()
        if not any_left and self._sweep is not None:
            sweep, self._sweep = self._sweep, None
            if sweep.running:
                sweep.stop()

    def _hold_to_budget(self) -> None:
        holders = [
            (n, c)
            for listener in self.listeners
            for c in listener.connections
            if not c.closing and (n := c.pending_input())
        ]
        total = sum(n for n, _ in holders)
        budget = self.settings.max_partial_input
        if total <= budget:
            return
        holders.sort(key=lambda item: item[0], reverse=True)
        for n, connection in holders:
            if total <= budget:
                break
            connection.drop(
                DropReason.PARTIAL_INPUT_BUDGET,
                f"{n} bytes of unfinished input while the node's connections held {total} (budget {budget})",
            )
            total -= n

    def stop(self) -> None:
        """Stop the sweep and the pending log lines (the node is stopping)."""
        if self._sweep is not None and self._sweep.running:
            self._sweep.stop()
        self._sweep = None
        for tally in (self._refusals, self._drops):
            if tally.timer is not None and tally.timer.active():
                tally.timer.cancel()
            tally.timer = None
            self._flush(tally, "")

    def refused(self, listener: EdgeListener, address: str, reason: RefusalReason) -> None:
        """One refusal: counted now, logged with the others of its interval."""
        self._count_refusal(listener.name, reason.value)
        self._note(self._refusals, listener.name, reason.value, address)

    def dropped(self, listener: EdgeListener, connection: EdgeConnection, reason: DropReason, detail: str) -> None:
        """One connection closed by the guard: counted now, logged with the others of its interval."""
        self._count_drop(listener.name, reason.value)
        self._note(self._drops, listener.name, reason.value, f"{connection.address}: {detail}")

    def _note(self, tally: _Tally, listener: str, reason: str, example: str) -> None:
        key = (listener, reason)
        first = not tally.counts and tally.timer is None
        tally.counts[key] = tally.counts.get(key, 0) + 1
        tally.example.setdefault(key, example)
        if first:
            # The first of a quiet spell is logged at once; the rest are summed for one line per interval.
            self._flush(tally, "")
            tally.timer = self.clock.callLater(self.settings.log_interval, self._interval_over, tally)

    def _interval_over(self, tally: _Tally) -> None:
        tally.timer = None
        if tally.counts:
            self._flush(tally, f" in the last {self.settings.log_interval:g} s")
            tally.timer = self.clock.callLater(self.settings.log_interval, self._interval_over, tally)

    def _flush(self, tally: _Tally, span: str) -> None:
        what = "refused" if tally is self._refusals else "closed"
        for (listener, reason), n in sorted(tally.counts.items()):
            log.warn(
                "{listener} listener: {what} {n} connection(s){span} ({reason}; e.g. {example})",
                listener=listener,
                what=what,
                n=n,
                span=span,
                reason=reason,
                example=tally.example.get((listener, reason), ""),
            )
        tally.counts.clear()
        tally.example.clear()
