"""WAMP over RawSocket (the WAMP spec's "RawSocket Transport"), for ``--rawsocket ENDPOINT``.

Written from the spec rather than on Autobahn's server protocol, because
Autobahn's drops the connection where the spec asks for an error reply
(an unsupported serializer, reserved bits) and treats every decoding problem
as fatal without an ABORT. What it does:

- **Handshake.** The client sends 4 octets: ``0x7F``, then ``LENGTH << 4 |
  SERIALIZER`` (it accepts messages up to ``2 ** (9 + LENGTH)`` bytes;
  serializer 1 is JSON, 2 MessagePack, 3 CBOR), then two reserved zero octets. The
  server answers ``0x7F``, ``its LENGTH << 4 | SERIALIZER``, ``0``, ``0``; or
  ``0x7F``, ``ERROR << 4``, ``0``, ``0`` and closes, with ERROR 1 for an
  unsupported serializer and 3 for reserved bits that are set. A first octet
  other than ``0x7F`` is not RawSocket: the connection is dropped with no
  answer. Nothing else may be sent before the handshake completes.
- **Frames.** A 4-octet header: 5 reserved bits (zero) and a 3-bit type (0 a
  WAMP message, 1 PING, 2 PONG), then a 24-bit length. PING is answered with
  a PONG carrying its payload. A frame longer than the server's announced
  maximum, a reserved bit, or an unknown type closes the connection.
- **WAMP.** Each regular frame is one WAMP message for the same
  :class:`~pubsubclub.frontends.wamp.broker.BrokerSession` the WebSocket transport
  drives, decoded by the same bounded serializers; undecodable input gets
  ABORT like over WebSocket. A message larger than the client's announced
  maximum cannot be sent: the client is dropped and the drop counted.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from autobahn.wamp.message import Message
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.core.counters import Source
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.frontends.wamp.transport import bounded_serializers, feed_message
from pubsubclub.net.edge import EdgeConnection, reads_send_buffer, unsent_bytes
from pubsubclub.net.nodelay import set_no_delay
from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer

log = Logger()

MAGIC = 0x7F
#: Handshake error codes (the spec's table).
ERROR_SERIALIZER_UNSUPPORTED = 1
ERROR_MAX_LENGTH_UNACCEPTABLE = 2
ERROR_RESERVED_BITS = 3
ERROR_MAX_CONNECTIONS = 4
#: Frame types.
FRAME_MESSAGE = 0
FRAME_PING = 1
FRAME_PONG = 2
_HEADER = struct.Struct("!I")
#: The handshake error reply a listener past its connection caps sends (pubsubclub.net.edge).
REFUSAL_MAX_CONNECTIONS = bytes([MAGIC, ERROR_MAX_CONNECTIONS << 4, 0, 0])


def length_exponent(max_bytes: int) -> int:
    """The handshake's LENGTH nibble for a maximum of ``max_bytes`` (at least 512, at most 16 MiB)."""
    return max(0, min(15, math.ceil(math.log2(max(max_bytes, 512))) - 9))


#: The maximum message size of each handshake LENGTH nibble (``2 ** (9 + LENGTH)``): one shared int per value.
_SIZES = tuple(2 ** (9 + exponent) for exponent in range(16))


class WampRawSocketProtocol(Protocol):
    """One RawSocket connection driving one BrokerSession.

    Built by :class:`WampRawSocketFactory` as its own subclass (:meth:`for_factory`),
    which holds what every connection of the listener shares as class attributes;
    each connection keeps only its own state, in slots (memory per idle session,
    docs/architecture.md "Idle RawSocket connections slimmed").
    """

    # Per factory (class attributes of the subclass for_factory makes, ``factory`` too), not per connection:
    _router: WampRouter
    _serializers: dict[int, Any]
    #: What we accept from the client (announced in our handshake).
    _max_receive: int
    #: The largest frame we take: what we announce (a power of two), worked out once, not per frame.
    _max_frame: int

    # Per connection. ``transport`` and ``connected`` hide Twisted's class defaults: __init__ sets them.
    __slots__ = ("transport", "connected", "_max_send", "_buffer", "_serializer", "_session", "_backlog", "_open",
                 "_handshake_timer")  # fmt: skip

    def __init__(self) -> None:
        self.transport: Any = None
        self.connected = 0
        #: What the client accepts from us (from its handshake).
        self._max_send = 0
        #: Unfinished input (a handshake or frame still arriving); None while nothing is held.
        self._buffer: bytearray | None = None
        #: The factory's serializer of the handshake's format (shared: no per-connection copy).
        self._serializer: Any | None = None
        self._session: Any = None
        #: Only where the connection layer does not read the TCP buffer itself (see ``_handshake``).
        self._backlog: SendBacklog | None = None
        self._open = False
        #: Closes a connection that sends no handshake within the join timeout.
        self._handshake_timer: Any = None

    @classmethod
    def for_factory(cls, factory: WampRawSocketFactory) -> type[WampRawSocketProtocol]:
        """A subclass holding ``factory``'s router, serializers and limits as class attributes."""
        max_receive = factory.router.limits.max_message_size
        shared = {
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "factory": factory,
            "_router": factory.router,
            "_serializers": factory.serializers,
            "_max_receive": max_receive,
            "_max_frame": _SIZES[length_exponent(max_receive)],
        }
        return type(cls.__name__, (cls,), shared)

    # -- Twisted -------------------------------------------------------------------

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """No Nagle delay on replies and events; start the handshake clock (the session has its own later)."""
        set_no_delay(self.transport)
        call_later = self._router.call_later
        if call_later is not None:
            self._handshake_timer = call_later(self._router.limits.join_timeout, self._handshake_timed_out)

    def _handshake_timed_out(self) -> None:
        self._handshake_timer = None
        if self._serializer is None and self.transport is not None:
            log.info("RawSocket client {peer}: no handshake within {seconds:g} s, closing", peer=self._peer(),
                     seconds=self._router.limits.join_timeout)  # fmt: skip
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def _stop_handshake_timer(self) -> None:
        timer, self._handshake_timer = self._handshake_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Handshake first, then frames, each WAMP message straight to :func:`feed_message`.

        Whole frames are read from ``data`` itself; only an unfinished rest is held (``_buffer``).
        """
        held = self._buffer
        if held is not None:
            held += data
            buffer: bytes | bytearray = held
        else:
            buffer = data
        end = len(buffer)
        at = 0  # the first octet not yet taken
        serializer = self._serializer
        if serializer is None:
            if end < 4 or not self._handshake(bytes(buffer[:4])):
                self._hold(buffer, 0)
                return
            at = 4
            serializer = self._serializer
        problem = None
        max_frame = self._max_frame
        while end - at >= 4 and self._open:
            (header,) = _HEADER.unpack_from(buffer, at)
            kind, length = header >> 24, header & 0xFFFFFF
            if kind & 0xF8 or kind > FRAME_PONG:
                problem = f"RawSocket frame with reserved bits or unknown type {kind}"
                break
            if length > max_frame:
                problem = f"RawSocket frame of {length} bytes over the announced maximum"
                break
            start = at + 4
            if end - start < length:
                break
            at = start + length
            payload = buffer[start:at] if held is None else bytes(buffer[start:at])
            if kind == FRAME_MESSAGE:  # the serializer is chosen once, in the handshake, and kept
                feed_message(self, payload, None, serializer)  # type: ignore[arg-type]
            elif kind == FRAME_PING:
                self._write(FRAME_PONG, payload)  # type: ignore[arg-type]
        if held is not None or at < end:  # _hold(buffer, at), without its call when a read held whole frames only
            self._hold(buffer, at)
        if problem is not None:
            self._fail(problem)

    def _hold(self, buffer: bytes | bytearray, taken: int) -> None:
        """Keep what follows the first ``taken`` octets of ``buffer`` (the held input, or a read); nothing: None."""
        held = self._buffer
        if held is not None and buffer is held:
            del held[:taken]
            if not held:
                self._buffer = None
        elif taken < len(buffer):
            self._buffer = bytearray(memoryview(buffer)[taken:])

    def connectionLost(self, reason: Failure = connectionDone) -> None:  # noqa: N802 - Twisted API
        """Tell the session."""
        self._stop_handshake_timer()
        self._open = False
        session, self._session = self._session, None
        if session is not None:
            session.onClose(False)

    # -- handshake -------------------------------------------------------------------

    def _handshake(self, octets: bytes) -> bool:
        self._stop_handshake_timer()
        transport = self.transport
        assert transport is not None
        if octets[0] != MAGIC:
            log.info("RawSocket client {peer}: not RawSocket (first octet {octet:#x})", peer=self._peer(),
                     octet=octets[0])  # fmt: skip
            transport.abortConnection()  # type: ignore[attr-defined]
            return False
        if octets[2] or octets[3]:
            self._refuse(ERROR_RESERVED_BITS)
            return False
        serializer = self._serializers.get(octets[1] & 0x0F)
        if serializer is None:
            self._refuse(ERROR_SERIALIZER_UNSUPPORTED)
            return False
        self._serializer = serializer
        self._max_send = _SIZES[octets[1] >> 4]
        ours = length_exponent(self._max_receive)
        transport.write(bytes([MAGIC, (ours << 4) | (octets[1] & 0x0F), 0, 0]))
        self._open = True
        # Under a connection guard that reads the TCP buffer (every listener of a node), the guard drops a slow
        # consumer on the write that crosses its cap and gives unsent_bytes(): a backlog would only duplicate it.
        if not reads_send_buffer(transport):
            self._backlog = watch_send_buffer(transport, "WAMP")
        self._session = self._router.session_factory()
        self._session.onOpen(self)
        return True

    def _refuse(self, code: int) -> None:
        log.info("RawSocket client {peer}: handshake refused with error {code}", peer=self._peer(), code=code)
        transport = self.transport
        assert transport is not None
        transport.write(bytes([MAGIC, code << 4, 0, 0]))
        transport.loseConnection()

    # -- frames ------------------------------------------------------------------------

    def _fail(self, problem: str) -> None:
        log.info("RawSocket client {peer}: {problem}; closing", peer=self._peer(), problem=problem)
        self._open = False
        if self.transport is not None:
            self.transport.loseConnection()

    def _write(self, kind: int, payload: bytes) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(_HEADER.pack((kind << 24) | len(payload)) + payload)
        if self._backlog is not None:
            self._backlog.written(len(payload) + 4)

    def _peer(self) -> str:
        return str(self.transport.getPeer()) if self.transport is not None else "?"

    # -- the connection layer's hooks (pubsubclub.net.edge) -------------------------------------

    def keepalive(self) -> None:
        """Quiet for a while: PING, so a client that answers (PONG) is not idle."""
        if self._open:
            self._write(FRAME_PING, b"")

    def pending_input(self) -> int:
        """Bytes of an unfinished handshake or frame held."""
        held = self._buffer
        return len(held) if held is not None else 0

    # -- the broker's transport contract -----------------------------------------------------

    def send(self, msg: Message) -> None:
        """Serialize ``msg`` (Autobahn caches it per message and format) and send it as one frame."""
        serializer = self._serializer
        if not self._open or serializer is None:
            return
        data, _binary = serializer.serialize(msg)
        self.send_encoded(data)

    @property
    def max_send_size(self) -> int:
        """The largest message the client said it takes (its handshake); 0 before the handshake."""
        return self._max_send

    @property
    def object_serializer(self) -> Any:
        """This connection's object serializer (chosen in the handshake)."""
        assert self._serializer is not None
        return self._serializer._serializer

    def send_encoded(self, data: bytes) -> None:
        """Send one message already encoded with :attr:`object_serializer` as one frame."""
        if not self._open:
            return
        length = len(data)
        if length > self._max_send:
            self._router.hub.metrics.disconnect(Source.WAMP, "message_too_large_for_client")
            self.drop(f"a message of {length} bytes is over the client's maximum of {self._max_send}")
            return
        # _write(FRAME_MESSAGE, data), without its call (FRAME_MESSAGE is 0: the header is the length).
        transport = self.transport
        if transport is None:
            return
        transport.write(_HEADER.pack(length) + data)
        backlog = self._backlog
        if backlog is not None and backlog.paused:  # SendBacklog.written, without its call
            backlog.since_pause += length + 4

    def isOpen(self) -> bool:  # noqa: N802 - Autobahn's ITransport name
        """True while messages can still be sent."""
        return self._open

    def close(self) -> None:
        """Close gracefully (after what is queued)."""
        self._open = False
        if self.transport is not None:
            self.transport.loseConnection()

    def abort(self) -> None:
        """Drop the connection now."""
        self.drop("aborted")

    def unsent_bytes(self) -> int:
        """Upper bound on bytes written but not yet taken by the client."""
        transport = self.transport
        if type(transport) is EdgeConnection:
            # EdgeConnection.unsent, without its call (a guarded connection: every listener's; once per EVENT).
            buffer = transport._buffer
            if buffer is None or transport.closing:
                return 0
            return len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen  # type: ignore[no-any-return]
        return unsent_bytes(transport, self._backlog)

    def drop(self, reason: str) -> None:
        """Abort the TCP connection now."""
        log.info("RawSocket client {peer}: dropped: {reason}", peer=self._peer(), reason=reason)
        self._open = False
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]


class WampRawSocketFactory(Factory):
    """RawSocket connections for one router: JSON, MessagePack and CBOR."""

    noisy = False

    def __init__(self, router: WampRouter) -> None:
        self.router = router
        # Autobahn's Serializer classes carry RAWSOCKET_SERIALIZER_ID (1 JSON, 2 MessagePack, 3 CBOR) untyped.
        self.serializers: dict[int, Any] = {
            getattr(s, "RAWSOCKET_SERIALIZER_ID"): s for s in bounded_serializers(router.limits.json)  # noqa: B009
        }

        #: This factory's connections' class: it holds the factory, router, serializers and limits.
        self.connection_class = WampRawSocketProtocol.for_factory(self)

    def buildProtocol(self, addr: Any) -> WampRawSocketProtocol:  # noqa: N802 - Twisted API
        """One connection."""
        return self.connection_class()
