"""What an idle Autobahn server connection keeps, made smaller (memory per idle session).

An Autobahn ``WebSocketServerProtocol`` keeps about 90 attributes in its
instance dictionary once open (3.3 KB of dictionary alone past 85 entries),
plus objects an idle connection never uses. Measured with ``tracemalloc``
over 2,000 idle WAMP sessions (docs/benchmarks.md, "Per message, per
session, tail"), this module takes off:

* **the 29 configuration attributes** Autobahn copies from its factory into
  every connection (``CONFIG_ATTRS``, in ``_connectionMade``: "only copy if
  not already set on protocol instance"). :func:`slim_protocol` makes one
  subclass per factory holding them as class attributes, so the copy finds
  them set and each connection's dictionary stays under 85 entries (half
  the size). A factory's options are set once, before it listens; a
  protocol that changes one for itself still gets an instance attribute.
  With them all set, Autobahn's connect-time loop over the options has
  nothing to copy; the subclass gives it an empty list, which also spares
  the pretty-printed debug line it formats for every connection whether or
  not debug logging is on (0.4 ms of CPU per connection).
* **the send queue**: a ``deque`` (760 bytes, a block of 64 slots) that only
  ever holds frames when a caller asks Autobahn to send synchronously or in
  chops (``sendData(sync=True)`` / ``chopsize``). It is created on such a
  call; until then ``send_queue`` reads as an empty tuple.
* **the UTF-8 validator** (a cffi object), created when the first non-ASCII
  text frame is validated instead of at connect.
* **the opening handshake's text** (request bytes, response text, parsed
  headers: about 1.4 KB), dropped once the connection is open. Nothing reads
  them afterwards (Autobahn reads them while the handshake runs).
* **the instance dictionary itself**: the per-connection state Autobahn sets
  (``state``, ``wasClean``, the timers' handles, ...; :data:`CONNECTION_STATE`)
  lives in slots of the subclass (8 bytes each) instead. Only names no base
  class defines are slotted (a slot would hide a class-level default); any
  other attribute still goes to the dictionary, so nothing can fail for it.
"""

from __future__ import annotations

from collections import deque
from types import FunctionType, MappingProxyType
from typing import Any, TypeVar

from autobahn.websocket.utf8validator import Utf8Validator

__all__ = ["SlimServerProtocol", "slim_protocol"]

#: ``send_queue`` of a connection that never queued a frame: empty, and refuses ``append`` loudly.
_NOTHING_QUEUED: tuple[()] = ()
#: Per-connection attributes Autobahn (and Twisted) set on an open server connection, as slots when no base
#: class defines the name (:func:`slim_protocol`); one missing here just lands in the instance dictionary.
CONNECTION_STATE = (
    "_backlog", "_perMessageCompress", "_results", "_serializer", "_session", "_slim_queue", "_slim_validator",
    "_transport_details", "_valid_events", "_wskey", "autoPingPending", "autoPingPendingCall", "autoPingPendingSent",
    "autoPingPendingSeq", "autoPingTimeoutCall", "closeHandshakeTimeoutCall", "closedByMe", "current_frame", "data",
    "droppedByMe", "failedByMe", "http_request_host", "http_request_params", "http_request_path",
    "http_request_uri", "http_status_line", "inside_message", "is_closed", "is_open", "localCloseCode",
    "localCloseReason", "openHandshakeTimeoutCall", "peer", "remoteCloseCode", "remoteCloseReason", "send_state",
    "state", "trackedTimings", "trafficStats", "triggered", "wasClean", "wasCloseHandshakeTimeout",
    "wasMaxFramePayloadSizeExceeded", "wasMaxMessagePayloadSizeExceeded", "wasNotCleanReason",
    "wasOpenHandshakeTimeout", "wasServerConnectionDropTimeout", "wasServingFlashSocketPolicyFile",
    "websocket_extensions", "websocket_extensions_in_use", "websocket_origin", "websocket_protocol_in_use",
    "websocket_protocols", "websocket_version", "current_frame_masker", "message_data", "message_data_total_length",
    "message_is_binary", "message_opcode", "utf8validateLast", "frame_length", "closeHandshakeTimeoutCall",
    "serverConnectionDropTimeoutCall", "_perMessageCompress",
)  # fmt: skip
#: The handshake leftovers dropped at open, read as these shared empty values afterwards.
_HANDSHAKE_LEFTOVERS = ("http_headers", "http_request_data", "http_response_data")


class SlimServerProtocol:
    """Mixin (before the Autobahn server protocol in the bases): lazy send queue and validator, no handshake text."""

    _slim_queue: deque[Any] | None
    _slim_validator: Any
    http_headers: Any = MappingProxyType({})
    http_request_data = b""
    http_response_data = ""

    def __init__(self) -> None:
        # Set here, not as class defaults, so the subclass can keep them in slots.
        self._slim_queue = None
        self._slim_validator = None
        super().__init__()

    @property
    def send_queue(self) -> Any:
        """Autobahn's queue of frames to send: an empty tuple until a frame is queued."""
        queue = self._slim_queue
        return _NOTHING_QUEUED if queue is None else queue

    @send_queue.setter
    def send_queue(self, queue: Any) -> None:
        # Autobahn sets a new empty deque at connect: nothing to keep until something is queued.
        self._slim_queue = queue if len(queue) else None

    def sendData(self, data: bytes, sync: bool = False, chopsize: int | None = None) -> None:  # noqa: N802
        """Autobahn's ``sendData``, with a real queue made first when it will queue (``sync`` or ``chopsize``)."""
        if (sync or (chopsize and chopsize > 0)) and self._slim_queue is None:
            self._slim_queue = deque()
        super().sendData(data, sync, chopsize)  # type: ignore[misc]

    @property
    def utf8validator(self) -> Any:
        """Autobahn's incremental UTF-8 validator, made on first use."""
        validator = self._slim_validator
        if validator is None:
            validator = self._slim_validator = Utf8Validator()
        return validator

    @utf8validator.setter
    def utf8validator(self, validator: Any) -> None:
        # Set once at connect: left unmade until a non-ASCII text frame needs it.
        self._slim_validator = None

    def _onOpen(self) -> None:  # noqa: N802 - Autobahn's internal hook, called once the handshake is done
        """Autobahn's (``onOpen`` may still read the handshake), then the handshake's text is let go."""
        try:
            super()._onOpen()  # type: ignore[misc]
        finally:
            for name in _HANDSHAKE_LEFTOVERS:
                self.__dict__.pop(name, None)


P = TypeVar("P")


def slim_protocol(base: type[P], factory: Any) -> type[P]:
    """A subclass of ``base`` (a :class:`SlimServerProtocol`) holding ``factory``'s options as class attributes.

    Call it after ``factory.setProtocolOptions``; set the result as ``factory.protocol``.
    """
    options: dict[str, Any] = {}
    defined = {name for cls in base.__mro__ for name in vars(cls)}
    options["__slots__"] = tuple(sorted({name for name in CONNECTION_STATE if name not in defined}))
    for name in base.CONFIG_ATTRS:  # type: ignore[attr-defined]
        value = getattr(factory, name)
        # A function stored on the class would become a method: keep it a plain callable.
        options[name] = staticmethod(value) if isinstance(value, FunctionType) else value
    # Autobahn's connect-time loop over the options would copy none of them (all are set now) but
    # still pretty-print them all for a debug line, logged or not: 0.4 ms of CPU per connection.
    options["CONFIG_ATTRS"] = ()
    return type(base.__name__, (base,), {**options, "__module__": base.__module__, "__qualname__": base.__qualname__})
