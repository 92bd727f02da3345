"""WAMP over WebSocket for the broker: the Twisted protocol, resource and site.

Autobahn does the WebSocket framing and the WAMP (de)serialization (PUBLISH
in and EVENT out on the faster path of :mod:`pubsubclub.frontends.wamp.codec`); this
module adds what a public-facing router needs on top:

* malformed WAMP (bad JSON/MessagePack, not a list, unknown message type,
  wrong fields) is answered with ABORT ``wamp.error.protocol_violation``
  naming the problem, instead of Autobahn's bare 1002 close;
* frames and messages above ``WampLimits.max_message_size`` close with 1009
  (Autobahn's own check; we turn off ``failByDrop`` so the close frame is
  actually sent);
* the bytes a client has not yet taken are tracked, so the broker can drop
  a slow consumer (see :class:`SendBacklog`);
* every decoded message, JSON, MessagePack or CBOR, is held to the router's
  :class:`~pubsubclub.core.jsonbounds.JSONBounds` (depth, 64-bit integers, finite
  floats, no lone surrogates, no MessagePack extension types, no CBOR tags)
  before the broker sees it; a message beyond them is answered with ABORT
  ``wamp.error.protocol_violation`` naming the problem.

CBOR (``wamp.2.cbor``, RawSocket serializer 3) is Autobahn's serializer on the
``cbor2`` package, decoding with ``cbor2``'s own depth limit and every tag
refused but tag 64 (RFC 8746's uint8 typed array, which Autobahn|JS writes for
a ``Uint8Array``: its bytes): a tag is never JSON, and the value-sharing (28/29) and
string-reference (25/256) tags would let a small message decode into a
structure far larger than its bytes (each reference re-encoded in full for a
JSON subscriber).
"""

from __future__ import annotations

import base64
import functools
from typing import Any, Protocol

import cbor2
import orjson
from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import (
    WampWebSocketServerFactory,
    WampWebSocketServerProtocol,
)
from autobahn.wamp.exception import InvalidUriError, ProtocolError
from autobahn.wamp.message import Message
from autobahn.wamp.serializer import (
    CBORObjectSerializer,
    CBORSerializer,
    JsonObjectSerializer,
    JsonSerializer,
    MsgPackObjectSerializer,
    MsgPackSerializer,
    Serializer,
)
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import File

from pubsubclub.core import jsonbounds
from pubsubclub.core.counters import Source
from pubsubclub.core.jsonbounds import _DIGIT_MASK, _LONG_RUN, JSONBounds, check
from pubsubclub.frontends.wamp.broker import BrokerSession
from pubsubclub.frontends.wamp.codec import _LOOSE_URI, _MAX_ID, PUBLISH, PublishRequest, decode, decoded
from pubsubclub.frontends.wamp.publishing import DISCLOSE_ALWAYS, publish
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.frontends.wamp.session import _ESTABLISHED
from pubsubclub.net import wsframes
from pubsubclub.net.edge import EdgeConnection, unsent_bytes
from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer
from pubsubclub.net.websocket import TakeoverResource, ping_if_open, unfinished_input
from pubsubclub.net.wsframes import _FIN_BINARY, _FIN_TEXT, _LONG, _MEDIUM, receive_data, send_held, send_message
from pubsubclub.net.wsslim import SlimServerProtocol, slim_protocol

__all__ = ["WampServerProtocol", "wamp_resource", "wamp_site"]

log = Logger()
# _NUL_ESCAPE: a bytes search here is ``payload.find(...) >= 0``, not ``... in payload``: ``in`` on bytes first tries
# its operand as an integer (a byte value), which for bytes raises and clears a formatted TypeError every time,
# about 1,800 machine instructions per check (callgrind; docs/benchmarks.md, slice pacedA); ``find`` does not.
#: jsonbounds' _DIGIT_MASK (ASCII digits to "1", other bytes to "0"), and "[" and "{" to "[": a payload's 19-digit
#: runs and its openers (what bounds its depth) from one translate.
_SHAPE_MASK = bytes(91 if b in (91, 123) else v for b, v in enumerate(_DIGIT_MASK))
#: The published count's front-end, bound once (read per plain PUBLISH).
_WAMP = Source.WAMP
_OPEN = WampWebSocketServerProtocol.STATE_OPEN


class WampServerProtocol(SlimServerProtocol, WampWebSocketServerProtocol):  # type: ignore[misc]
    """A WAMP-over-WebSocket server connection driving one BrokerSession (slimmed while idle: net/wsslim.py)."""

    _session: Any
    _backlog: SendBacklog | None = None

    def onOpen(self) -> None:  # noqa: N802 - Autobahn API
        """Create the session, then start watching the send buffer."""
        super().onOpen()
        self._watch_send_buffer()

    def _watch_send_buffer(self) -> None:
        self._backlog = watch_send_buffer(self.transport, "WAMP")

    #: Twisted's ``dataReceived(data)``: whole ordinary frames straight to ``onMessage``, everything else through
    #: Autobahn (see wsframes); the function itself, without a method calling it.
    dataReceived = receive_data  # noqa: N815 - Twisted API

    # onMessage(payload, isBinary): feed_message itself (assigned below it): decode WAMP messages, answer
    # undecodable input with ABORT.

    def isOpen(self) -> bool:  # noqa: N802 - Autobahn's ITransport name
        """True while the session is attached and the WebSocket open, not once a closing handshake began.

        Autobahn's own answer stays True until the connection is gone, while
        its ``sendMessage`` refuses ("Attempt to send on a closed protocol")
        from the moment either side sent a close frame.
        """
        return self._session is not None and self.state == _OPEN

    def send(self, msg: Message) -> None:
        """Serialize ``msg`` (cached per message and wire format) and send it; nothing once closing."""
        if self.state != _OPEN:
            return
        data, is_binary = self._serializer.serialize(msg)
        send_message(self, data, is_binary)
        if self._backlog is not None:
            self._backlog.written(len(data))

    @property
    def object_serializer(self) -> Any:
        """This connection's object serializer (negotiated at the WebSocket handshake)."""
        return self._serializer._serializer

    def send_encoded(self, data: bytes) -> None:
        """Send one message already encoded with :attr:`object_serializer` (binary frame for MessagePack).

        Nothing once a closing handshake began: the hub's delivery loop calls
        this for every subscriber, one of which may be closing (a close frame
        from either side) until its connection is gone.
        """
        if self.state != _OPEN:
            return
        held = wsframes._held
        length = len(data)
        options: Any = self  # Autobahn's options, class attributes (net/wsslim.py)
        if (
            held is None
            or options.maskServerFrames
            or self._perMessageCompress is not None
            or self.trackedTimings
            or options.logFrames
            or self._slim_queue  # send_queue (net/wsslim.py), without the property's call
            or 0 < options.autoFragmentSize < length
        ):
            send_held(self, data, self._serializer._serializer.BINARY)
        else:
            # Held to the end of a remote batch's delivery (wsframes.hold_writes): what send_held does
            # for an open server connection, without its call and its checks that always pass here.
            binary = self._serializer._serializer.BINARY
            first = _FIN_BINARY if binary else _FIN_TEXT
            if length <= 125:
                frame = bytes((first, length)) + data
            elif length <= 0xFFFF:
                frame = _MEDIUM(first, 126, length) + data
            else:
                frame = _LONG(first, 127, length) + data
            stats = self.trafficStats
            stats.outgoingWebSocketMessages += 1
            stats.outgoingOctetsAppLevel += length
            stats.outgoingOctetsWebSocketLevel += length
            stats.outgoingWebSocketFrames += 1
            stats.outgoingOctetsWireLevel += len(frame)
            cell = held.get(self)
            if cell is None:
                held[self] = [len(frame), [frame]]
            else:
                cell[0] += len(frame)
                cell[1].append(frame)
        backlog = self._backlog
        if backlog is not None and backlog.paused:  # SendBacklog.written, without its call
            backlog.since_pause += len(data)

    def unsent_bytes(self) -> int:
        """Upper bound on bytes written but not yet taken by the client (held frames included)."""
        transport = self.transport
        if type(transport) is EdgeConnection:
            # EdgeConnection.unsent, without its call (a guarded connection: every listener's; once per EVENT).
            buffer = transport._buffer
            if buffer is None or transport.closing:
                unsent = 0
            else:
                unsent = len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen
        else:
            unsent = unsent_bytes(transport, self._backlog)
        held = wsframes._held
        if held:
            cell = held.get(self)  # wsframes.held_bytes, without its call
            if cell is not None:
                return unsent + cell[0]  # type: ignore[no-any-return]
        return unsent  # type: ignore[no-any-return]

    def drop(self, reason: str) -> None:
        """Abort the TCP connection now (a close frame would queue behind the backlog)."""
        self.wasClean = False
        self.wasNotCleanReason = reason
        self.dropConnection(abort=True)

    def keepalive(self) -> None:
        """Quiet for a while: ping (the connection layer's hook), so a client that answers is not idle."""
        ping_if_open(self)

    def pending_input(self) -> int:
        """Unfinished input held (the connection layer's hook)."""
        return unfinished_input(self)


class SessionOwner(Protocol):
    """A transport connection: its current session (None before it opened and once it closed)."""

    _session: Any


def feed_session(owner: SessionOwner, serializer: Any, payload: bytes, is_binary: bool | None) -> None:
    """Decode one transport message with ``serializer`` and hand each WAMP message to ``owner``'s session.

    :func:`feed_message` with the serializer given.
    """
    feed_message(owner, payload, is_binary, serializer)


def feed_message(owner: SessionOwner, payload: bytes, is_binary: bool | None, serializer: Any = None) -> None:
    """Decode one transport message and hand each WAMP message to ``owner``'s session.

    ``serializer``: the connection's Autobahn serializer, ``owner._serializer``
    when None (so this is :meth:`WampServerProtocol.onMessage` itself, without
    a call in between).

    Undecodable input is the peer's fault: ABORT (``protocol_violation``), or
    an ERROR for a refused URI (``invalid_uri``) or an unknown SUBSCRIBE match
    policy (``unparsable``). Shared by the WebSocket and RawSocket transports,
    so both treat bad input alike. A plainly valid PUBLISH arrives as a
    :class:`~pubsubclub.frontends.wamp.codec.PublishRequest` (see
    :func:`~pubsubclub.frontends.wamp.codec.decode`); the plainest one (JSON
    ``[16, request, {}, topic, [value]]`` to an established broker session)
    does what :func:`~pubsubclub.frontends.wamp.publishing.publish_plain` does
    without it (inline: its checks, then ``Hub.publish_plain`` or ``publish``),
    the JSON decoded here without the serializer's and decode's calls.
    """
    session = owner._session
    if session is None:
        return
    if serializer is None:
        serializer = owner._serializer  # type: ignore[attr-defined]
    plain = False
    try:
        objects = serializer._serializer
        if (
            type(objects) is not _BoundedJsonObjectSerializer
            or is_binary
            or type(payload) is not bytes
            or payload.find(b"\\u0000") >= 0  # not ``in``: see _NUL_ESCAPE
        ):
            messages = decode(serializer, payload, is_binary)
        else:
            # JSON without binary values: the serializer's unserialize without its call (and decode's).
            try:
                value = orjson.loads(payload)
                # jsonbounds.check_decoded, without its call when it has nothing to check: no 19-digit run
                # (an integer that may be outside 64 bits) and fewer brackets than the depth allowed.
                # One pass maps digits to "1" and both openers to "[" (see _SHAPE_MASK): a 19-digit run is one find,
                # the openers one count (two counts of the payload before).
                shape = payload.translate(_SHAPE_MASK)
                if shape.find(_LONG_RUN) >= 0 or shape.count(b"[") > objects._bounds.max_depth:
                    jsonbounds.check_decoded(payload, value, objects._bounds)
            except Exception:
                value = None  # not JSON to orjson, or beyond the bounds: decode words the refusal
            if value is None:
                messages = decode(serializer, payload, is_binary)
            else:
                if type(value) is list and len(value) == 5 and type(session) is BrokerSession:
                    # A plain PUBLISH ([16, request, {}, topic, [value]]): straight to the broker, without a
                    # PublishRequest or the dispatch; a strict subset of what publish_request takes plainly.
                    kind, request, options, topic, args = value
                    if (
                        kind == PUBLISH
                        and type(kind) is int
                        and type(request) is int
                        and 0 <= request <= _MAX_ID
                        and type(options) is dict
                        and not options
                        and type(args) is list
                        and len(args) == 1
                        and type(topic) is str
                        and session._state is _ESTABLISHED
                    ):
                        # A topic the router remembers passed its URI check (uris.uri_problem: the same loose
                        # URI expression and more), so it needs no match here: the usual PUBLISH makes none.
                        hub_topic = session._router.publish_topics.get((session._realm, topic))
                        plain = hub_topic is not None or _LOOSE_URI.fullmatch(topic) is not None
                if not plain:
                    messages = decoded(serializer, [value], len(payload))
    except ProtocolError as e:
        session.unparsable(_raw_message(serializer, payload), str(e))
        return
    except InvalidUriError as e:
        session.invalid_uri(_raw_message(serializer, payload), str(e))
        return
    except Exception as e:
        # Any other decoder failure is still the peer's bad input.
        log.debug("undecodable WAMP message: {error!r}", error=e)
        session.protocol_violation(f"undecodable WAMP message: {type(e).__name__}")
        return
    if plain:
        try:
            # publish_plain(session, request, topic, args[0], len(payload)), without its call: the same
            # checks (topic known good: hub_topic, looked up above; role, disclosure, size); anything
            # else is publish's, refusals too.
            router = session._router
            role = session._role
            hub = router.hub
            size = len(payload)
            if (
                hub_topic is None
                or (role is not None and not role.may_publish(hub_topic))
                or router.disclose_publisher == DISCLOSE_ALWAYS
                or size >= hub.checked_from
            ):
                publish(session, PublishRequest(request, topic, args, None, None, None, None, size))
            else:
                hub.publish_plain(hub_topic, args[0], size, session, _WAMP)
        except Exception:
            session.internal_error("PublishRequest")  # as onMessage answers a raise
        return
    for msg in messages:
        if owner._session is None:
            return
        session.onMessage(msg)


#: Autobahn's ``onMessage(payload, isBinary)``: feed_message with the connection's serializer, without a call between.
WampServerProtocol.onMessage = feed_message  # type: ignore[method-assign,assignment]


def _raw_message(serializer: Any, payload: bytes) -> Any:
    """The message as a plain list, for replying to a refused URI."""
    try:
        # Autobahn's object serializer (JSON or MessagePack) for this
        # connection; only the first (and only, unbatched) message.
        return serializer._serializer.unserialize(payload)[0]
    except Exception:
        return None


class _BoundedJsonObjectSerializer(JsonObjectSerializer):  # type: ignore[misc]
    """WAMP JSON with orjson instead of Autobahn's pure-Python scanner, and the bounds check on every message.

    The same wire format as Autobahn's ``JsonObjectSerializer`` (compact, UTF-8,
    key order kept; binary values as ``"\0"`` + base64 strings both ways), which
    ``tests/test_wamp_codec.py`` checks against Autobahn's on random messages.
    Autobahn decodes with ``json``'s pure-Python scanner (to hook strings for
    the binary convention); orjson reads in C and the few ``"\0"`` strings are
    turned into bytes afterwards, within the bounded depth.
    """

    def __init__(self, bounds: JSONBounds) -> None:
        super().__init__()
        self._bounds = bounds
        if type(self).serialize is _BoundedJsonObjectSerializer.serialize:
            # serialize() itself, as a C callable: every EVENT is serialized through it, and a call of the
            # method would cost a Python frame per message around the one C call it makes.
            self.serialize = functools.partial(orjson.dumps, default=_json_default)  # type: ignore[method-assign]

    def serialize(self, obj: Any) -> bytes:
        """One WAMP message as compact UTF-8 JSON (the instance's C callable does the same)."""
        return orjson.dumps(obj, default=_json_default)

    def unserialize(self, payload: bytes) -> list[Any]:
        """Decode and check (Autobahn turns what we raise into a ProtocolError naming it)."""
        try:
            value = orjson.loads(payload)  # jsonbounds.loads, without its call
            jsonbounds.check_decoded(payload, value, self._bounds)
        except orjson.JSONDecodeError:
            # Not JSON to orjson (lone surrogates, NaN, ...): decode as Autobahn does, so the
            # peer's ABORT names the problem exactly (the bounds check words it); rare, and hostile.
            messages = super().unserialize(payload)
            for raw in messages:
                check(raw, self._bounds, binary=True)
            return list(messages)
        # A string starting with NUL can only be written "\u0000..." in JSON text: without that
        # escape there is no binary value to convert, and the walk over the message is skipped.
        return [_binary_values(value) if payload.find(b"\\u0000") >= 0 else value]


class _BoundedMsgPackObjectSerializer(MsgPackObjectSerializer):  # type: ignore[misc]
    """Autobahn's MessagePack object serializer, then the bounds check on every message."""

    def __init__(self, bounds: JSONBounds) -> None:
        super().__init__()
        self._bounds = bounds

    def unserialize(self, payload: bytes) -> list[Any]:
        """Decode, then check; extension types (timestamps, ...) are refused as not JSON."""
        messages = super().unserialize(payload)
        for raw in messages:
            check(raw, self._bounds, binary=True)
        return list(messages)


def _refuse_tag(*_: Any) -> Any:
    raise ValueError("CBOR tags are not accepted (a tagged value is not JSON)")


#: RFC 8746's "uint8 typed array": a byte string under tag 64, which Autobahn|JS's CBOR
#: (node-cbor) writes for every ``Uint8Array`` that is not a Node ``Buffer``.
_UINT8_ARRAY = 64


def _tag_hook(tag: Any, _immutable: bool) -> Any:
    """A tag cbor2 does not decode itself: a uint8 typed array is its bytes, any other is refused."""
    if tag.tag == _UINT8_ARRAY and type(tag.value) is bytes:
        return tag.value
    return _refuse_tag()


#: The tags cbor2 decodes by itself (the rest reach ``tag_hook``): each refused.
_CBOR_NATIVE_TAGS = (0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004, 43000, 55799)
_CBOR_REFUSALS = {tag: _refuse_tag for tag in _CBOR_NATIVE_TAGS}


class _BoundedCBORObjectSerializer(CBORObjectSerializer):  # type: ignore[misc]
    """Autobahn's CBOR object serializer, decoding within the bounds and without tags (see module docstring)."""

    def __init__(self, bounds: JSONBounds) -> None:
        super().__init__()
        self._bounds = bounds

    def unserialize(self, payload: bytes) -> list[Any]:
        """Decode (depth-limited, tags refused), then check as MessagePack is checked."""
        try:
            raw = cbor2.loads(
                payload, max_depth=self._bounds.max_depth, semantic_decoders=_CBOR_REFUSALS, tag_hook=_tag_hook
            )
        except cbor2.CBORDecodeError as e:
            cause = e.__cause__ or e.__context__
            raise ValueError(str(cause) if isinstance(cause, ValueError) else str(e)) from None
        check(raw, self._bounds, binary=True)
        return [raw]


def _json_default(value: Any) -> Any:
    """What orjson cannot encode by itself: bytes, as WAMP's ``"\0"`` + base64 string."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\x00" + base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _binary_values(value: Any) -> Any:
    """``value`` with every string value that starts with NUL decoded from base64 to bytes (keys untouched)."""
    if type(value) is str:
        return base64.b64decode(value[1:]) if value.startswith("\x00") else value
    if type(value) is list:
        return [_binary_values(v) for v in value]
    if type(value) is dict:
        return {k: _binary_values(v) for k, v in value.items()}
    return value


def bounded_serializers(bounds: JSONBounds) -> list[Serializer]:
    """WAMP MessagePack, JSON and CBOR serializers whose decoding holds every message to ``bounds``."""
    msgpack, json, cbor = MsgPackSerializer(), JsonSerializer(), CBORSerializer()
    # Each connection copies its serializer (copy.copy), sharing this object serializer.
    msgpack._serializer = _BoundedMsgPackObjectSerializer(bounds)
    json._serializer = _BoundedJsonObjectSerializer(bounds)
    cbor._serializer = _BoundedCBORObjectSerializer(bounds)
    return [msgpack, json, cbor]


def wamp_resource(router: WampRouter, url: str | None = None) -> WebSocketResource:
    """A Twisted Web resource speaking WAMP (JSON, MessagePack and CBOR) for ``router``."""
    factory = WampWebSocketServerFactory(
        router.session_factory,
        url=url,
        serializers=bounded_serializers(router.limits.json),
    )
    factory.protocol = WampServerProtocol
    limit = router.limits.max_message_size
    factory.setProtocolOptions(
        maxFramePayloadSize=limit,
        maxMessagePayloadSize=limit,
        # Send the close frame (1009, 1002, ...) rather than just dropping TCP.
        failByDrop=False,
        # No timer per connection: the connection layer pings a client once it has been quiet
        # for [edge] ping-interval (keepalive above) and closes it after [edge] idle-timeout.
        autoPingInterval=0,
        # No HTML status page (with version) on a plain GET.
        webStatus=False,
        # A client that never finishes the upgrade is closed (the session then has its own join timeout).
        openHandshakeTimeout=router.limits.join_timeout,
    )
    # The options as class attributes, not copied into every connection (memory per idle session).
    factory.protocol = slim_protocol(WampServerProtocol, factory)
    return TakeoverResource(factory)


def wamp_site(router: WampRouter, static_dir: str | None = None) -> Site:
    """A site serving WAMP at ``/ws`` and, optionally, ``static_dir`` at ``/``."""
    root: Resource = File(static_dir) if static_dir is not None else Resource()
    # Autobahn declares IResource with zope, which mypy cannot see.
    root.putChild(b"ws", wamp_resource(router))  # type: ignore[arg-type]
    # An HTTP connection idle this long (no request yet, or between keep-alive
    # requests) is closed; a connection upgraded to WebSocket is not timed by it.
    return Site(root, timeout=router.limits.join_timeout)
