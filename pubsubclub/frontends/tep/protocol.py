"""The TEP front-end: Transport Exchange Protocol clients on the node's hub.

* :class:`TEPServer` is the front-end of one node: its settings (limits,
  topic prefix, whether clients may publish), its connected clients, the
  server API (:meth:`~TEPServer.emit`, :meth:`~TEPServer.broadcast`) and the
  WebSocket resource served at ``/tep``.
* :class:`TEPClient` is one client: the channels it joined, what it may
  do, and its hub sink. It only sees a small :class:`TEPTransport`, so it is
  tested in memory.
* :class:`TEPServerProtocol` is the Autobahn WebSocket connection: frames in
  and out, limits, close codes; it parses nothing itself (``tep_codec`` does).

Channels and hub topics
    TEP channel ``c`` is hub topic ``prefix + c`` (``tep_prefix``, default
    ``""``), so TEP, WAMP and the other front-ends share one topic space.

Broadcasts
    A broadcast is published on the reserved hub topic :data:`BROADCAST_TOPIC`
    (never prefixed). While a node has TEP clients, its TEP server subscribes
    one sink to it, so the federation carries a broadcast to every such node,
    where it goes to every TEP client as ``{"payload": ...}``. ``$`` cannot start a TEP channel, so
    no TEP client can publish there; hub topics starting with ``$`` are meant
    to be node-internal for every front-end (docs/tep.md).

Authorization
    TEP carries no credentials, so with an auth policy (``--auth``) every
    TEP client has the policy's anonymous role: it may join only channels
    whose hub topic the role may subscribe to (others come back in
    ``#join``) and publish only where the role may publish (else ``#error``).
    When the policy refuses anonymous sessions, a TEP client gets one
    ``#error`` frame and the close code :data:`UNAUTHORIZED_CLOSE`.
    Broadcasts are the operator's messages, not a topic a client chose: they
    reach every admitted client.

Payloads
    Sent as they are in the envelope. A WAMP publication with several
    arguments or keyword arguments arrives as its ``{"args": [...],
    "kwargs": {...}}`` wrapper object (docs/protocol-mapping.md).

Why one long module: the TEP server, its clients and its operator API are one front-end.
"""

from __future__ import annotations

import hmac
import math
from typing import Any, Protocol

import orjson
from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet import defer
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request

from pubsubclub.core import jsonbounds
from pubsubclub.core.counters import DropReason, Kind, Source, TEPEvent
from pubsubclub.core.hub import Envelope, Hub, LimitExceeded
from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.core.metrics import payload_size
from pubsubclub.frontends.tep.codec import (
    DEFAULT_LIMITS,
    Broadcast,
    ClientChannels,
    ClientPublish,
    ErrorFrame,
    Event,
    Join,
    JoinReply,
    Leave,
    ServerFrame,
    TEPDecodeError,
    TEPLimits,
    channel_problem,
    decode_client,
    echo_of,
    encode_server,
)
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
from pubsubclub.net.edge import handshake_done, unsent_bytes
from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer
from pubsubclub.net.websocket import TakeoverResource, ping_if_open, unfinished_input
from pubsubclub.net.wsframes import send_message

__all__ = [
    "BROADCAST_TOPIC",
    "TEPClient",
    "TEPOperationsResource",
    "TEPServer",
    "TEPServerProtocol",
    "TEPTransport",
]

log = Logger()
#: A size that makes :meth:`Hub.refusal` measure the message whatever it is.
_ALWAYS_CHECK = 1 << 62

#: The hub topic that carries TEP broadcasts across the cluster.
BROADCAST_TOPIC = "$tep.broadcast"

#: Close code for a server-initiated close (Autobahn lets an application send
#: only 1000 or 3000-4999; the reason says why).
NORMAL_CLOSE = 1000
#: Close code for a client the auth policy refuses (IANA's 3000, "Unauthorized").
UNAUTHORIZED_CLOSE = 3000
#: What a refused client is told, in its ``#error`` frame and the close reason.
ANONYMOUS_REFUSED = "not authorized: this node admits only authenticated clients, and TEP has no credentials"


class TEPTransport(Protocol):
    """What a :class:`TEPClient` needs from its connection."""

    def send_text(self, data: bytes) -> None:
        """Send one text frame (``data`` is UTF-8 JSON)."""

    def unsent_bytes(self) -> int:
        """Bytes handed to the transport that the peer has not yet taken."""

    def close(self, code: int, reason: str) -> None:
        """Close the WebSocket with ``code`` and ``reason``."""

    def drop(self, reason: str) -> None:
        """Abort the connection at once, logging ``reason``."""


class TEPServer:
    """The TEP front-end of one node, on top of its :class:`Hub`."""

    def __init__(
        self,
        hub: Hub,
        limits: TEPLimits = DEFAULT_LIMITS,
        *,
        prefix: str = "",
        client_publish: bool = True,
        auth: AuthPolicy | None = None,
    ) -> None:
        if prefix.startswith("$"):
            raise ValueError(f"TEP prefix {prefix!r} must not start with '$' (reserved hub topics)")
        self.hub = hub
        self.limits = limits
        self.prefix = prefix
        self.client_publish = client_publish
        #: The role of every TEP client (the policy's anonymous role); None: no policy, all allowed.
        self.role: Role | None = None if auth is None else auth.anonymous_role
        #: The policy refuses anonymous clients, so every TEP client is turned away.
        self.refuse_clients = auth is not None and self.role is None
        #: Connected clients.
        self.clients: dict[TEPClient, None] = {}
        self._broadcast_sink = _BroadcastSink(self)
        self._wire_key = f"tep|{prefix}"

    # -- lifecycle ---------------------------------------------------------------

    @property
    def stats(self) -> dict[str, int]:
        """TEP's event counters (a view of the hub's metrics)."""
        return self.hub.metrics.view("tep")

    def add_client(self, client: TEPClient) -> None:
        """Count ``client`` in; the first one subscribes the node to broadcasts."""
        if not self.clients:
            self.hub.subscribe(BROADCAST_TOPIC, self._broadcast_sink)
        self.clients[client] = None

    def remove_client(self, client: TEPClient) -> None:
        """Count ``client`` out; after the last one the node stops asking for broadcasts."""
        if client not in self.clients:
            return
        del self.clients[client]
        if not self.clients:
            self.hub.unsubscribe(BROADCAST_TOPIC, self._broadcast_sink)

    def stop(self, reason: str = "node shutting down") -> defer.Deferred[int]:
        """Close every client with 1000 ``reason`` (so broadcasts stop too).

        Fires with the number of clients once every connection is gone
        (Autobahn drops a client that does not answer the close within
        ``closeHandshakeTimeout``).
        """
        closed = [client.close(NORMAL_CLOSE, reason) for client in list(self.clients)]
        return defer.gatherResults(closed).addCallback(lambda _: len(closed))

    def resource(self, url: str | None = None) -> WebSocketResource:
        """A Twisted Web resource speaking TEP, to serve at ``/tep``."""
        factory = WebSocketServerFactory(url=url)
        factory.protocol = TEPServerProtocol
        factory.tep_server = self  # type: ignore[attr-defined]
        limit = self.limits.max_frame_bytes
        factory.setProtocolOptions(
            maxFramePayloadSize=limit,
            maxMessagePayloadSize=limit,
            # Send the close frame (1009, 1007, ...) rather than just dropping TCP.
            failByDrop=False,
            # No timer per connection: the connection layer pings quiet clients (keepalive).
            autoPingInterval=0,
            # Bounds how long a server-initiated close (shutdown) waits for the client.
            closeHandshakeTimeout=1,
            # No HTML status page (with version) on a plain GET.
            webStatus=False,
        )
        return TakeoverResource(factory)

    # -- topics ------------------------------------------------------------------

    def hub_topic(self, channel: str) -> str:
        """The hub topic of TEP ``channel``."""
        return self.prefix + channel

    def channel(self, topic: str) -> str:
        """The TEP channel of hub ``topic`` (one this server subscribed)."""
        return topic[len(self.prefix) :]

    # -- the server API ----------------------------------------------------------

    def emit(self, channel: str, payload: Any) -> int:
        """Publish ``payload`` to ``channel`` cluster-wide; local deliveries returned.

        Raises ValueError for a name that cannot be a channel, or a message that could not reach other nodes.
        """
        problem = channel_problem(channel, self.limits)
        if problem is not None:
            raise ValueError(problem)
        return self._publish_fitting(self.hub.envelope(self.hub_topic(channel), payload))

    def broadcast(self, payload: Any) -> int:
        """Send ``payload`` (without topic) to every TEP client on every node; ValueError if it cannot reach them."""
        return self._publish_fitting(self.hub.envelope(BROADCAST_TOPIC, payload))

    def _publish_fitting(self, envelope: Envelope) -> int:
        # The operator API is rare: every message is measured (no size from a client frame to go by).
        too_large = self.hub.refusal(envelope, _ALWAYS_CHECK)
        if too_large is not None:
            raise ValueError(too_large)
        return self.hub.publish(envelope)

    # -- encoding once per message -------------------------------------------------

    def event_bytes(self, envelope: Envelope) -> bytes | None:
        """The event frame for ``envelope``, built once; None if it is not JSON."""
        data = envelope.wire.get(self._wire_key)
        if data is None:
            if envelope.topic == BROADCAST_TOPIC:
                frame: ServerFrame = Broadcast(envelope.payload)
            else:
                frame = Event(self.channel(envelope.topic), envelope.payload)
            try:
                data = encode_server(frame)[0]
            except TypeError as e:
                # e.g. MessagePack bytes from a WAMP publisher.
                log.info("TEP cannot carry message {message_id}: {error}", message_id=envelope.message_id, error=str(e))
                data = b""
            envelope.wire[self._wire_key] = data
        return data or None


class _BroadcastSink:
    """The one hub sink of a :class:`TEPServer` for :data:`BROADCAST_TOPIC`."""

    def __init__(self, server: TEPServer) -> None:
        self._server = server

    def deliver(self, envelope: Envelope) -> None:
        """Send a broadcast to every connected client."""
        server = self._server
        data = server.event_bytes(envelope)
        if data is None:
            server.hub.metrics.event(TEPEvent.UNDELIVERABLE)
            return
        for client in list(server.clients):
            if client.send(data):
                server.hub.metrics.event(TEPEvent.BROADCASTS_SENT)


class TEPClient:
    """One TEP client: its channels, its requests and its hub sink."""

    def __init__(self, server: TEPServer, transport: TEPTransport, peer: str = "?") -> None:
        self._server = server
        self._hub = server.hub
        self._limits = server.limits
        self._transport: TEPTransport | None = transport
        self.peer = peer
        self.channels = ClientChannels(server.limits)
        #: Fired once the connection is gone (see :meth:`close`).
        self._closed_waiters: list[defer.Deferred[None]] = []
        self._lost = False
        server.add_client(self)

    # -- input -------------------------------------------------------------------

    def frame_received(self, data: bytes) -> None:
        """Handle one text frame from the client; never raises."""
        if self._transport is None:
            return
        server = self._server
        server.hub.metrics.event(TEPEvent.FRAMES_RECEIVED)
        try:
            frame = decode_client(data, self._limits)
        except TEPDecodeError as e:
            self.refuse(str(e), data)
            return
        try:
            if isinstance(frame, Join):
                self._join(frame)
            elif isinstance(frame, Leave):
                self._leave(frame)
            else:
                self._publish(frame, data)
        except Exception:
            log.failure("TEP client {peer}: internal error handling a frame", peer=self.peer)
            self.refuse("internal error while handling the frame", data)

    def binary_received(self, data: bytes) -> None:
        """A binary frame: TEP is JSON in text frames only."""
        if self._transport is not None:
            self._server.hub.metrics.event(TEPEvent.FRAMES_RECEIVED)
            self.refuse("binary frames are not supported; send one JSON object per text frame", None)

    def refuse(self, problem: str, data: bytes | None) -> None:
        """Answer a bad frame with ``#error``; the connection stays open."""
        self._server.hub.metrics.event(TEPEvent.BAD_FRAMES)
        log.debug("TEP client {peer}: bad frame: {problem}", peer=self.peer, problem=problem)
        self._send_frame(ErrorFrame(problem, None if data is None else echo_of(data)))

    def _join(self, frame: Join) -> None:
        server = self._server
        role = server.role
        allowed = None if role is None else (lambda channel: role.may_subscribe(server.hub_topic(channel)))
        reply, new = self.channels.join(frame.channels, allowed)
        if role is not None and reply.rejected:
            log.debug(
                "TEP client {peer}: role {role} may not join some of {channels}",
                peer=self.peer,
                role=role.name,
                channels=reply.rejected,
            )
        refused: LimitExceeded | None = None
        for channel in new:
            try:
                self._hub.subscribe(self._server.hub_topic(channel), self, limited=True)
            except LimitExceeded as e:
                # The node's topic table is full: the channel is refused like any other (``#join``).
                refused = e
                self.channels.leave([channel])
                reply = JoinReply(tuple(c for c in reply.accepted if c != channel), (*reply.rejected, channel))
        self._send_frame(reply)
        if refused is not None:
            server.hub.metrics.error(Source.TEP, "too_many_topics")
            self._send_frame(ErrorFrame(f"{refused.text} ({refused.limit})", None))

    def _leave(self, frame: Leave) -> None:
        reply = self.channels.leave(frame.channels)
        for channel in reply.accepted:
            self._hub.unsubscribe(self._server.hub_topic(channel), self)
        self._send_frame(reply)

    def _publish(self, frame: ClientPublish, data: bytes) -> None:
        server = self._server
        if not server.client_publish:
            self.refuse("client publishing is disabled on this node", data)
            return
        role = server.role
        if role is not None and not role.may_publish(server.hub_topic(frame.topic)):
            server.hub.metrics.event(TEPEvent.NOT_AUTHORIZED)
            self.refuse(f"not authorized: role {role.name!r} may not publish to channel {frame.topic!r}", data)
            return
        envelope = self._hub.envelope(server.hub_topic(frame.topic), frame.payload, size=len(data))
        too_large = self._hub.refusal(envelope, len(data))
        if too_large is not None:
            # Refused before anyone gets it, here or on other nodes (docs/protocol.md, "Message sizes").
            server.hub.metrics.count(
                envelope.topic, Source.TEP, Kind.DROPPED, 1, len(data), reason=DropReason.TOO_LARGE_FOR_LINKS
            )
            self.refuse(too_large, data)
            return
        server.hub.metrics.event(TEPEvent.PUBLISHED)
        server.hub.metrics.count(envelope.topic, Source.TEP, Kind.PUBLISHED, 1, payload_size(envelope))
        # Like WAMP's default: the publisher does not get its own message.
        self._hub.publish(envelope, exclude=self)

    # -- output ------------------------------------------------------------------

    #: The hub counts what this sink delivers under the ``tep`` front-end, once per message.
    counts_as = Source.TEP

    def deliver(self, envelope: Envelope) -> bool:
        """The hub sink: send ``envelope`` as an event; True if sent."""
        server = self._server
        data = server.event_bytes(envelope)
        if data is None:
            server.hub.metrics.event(TEPEvent.UNDELIVERABLE)
            server.hub.metrics.count(
                envelope.topic, Source.TEP, Kind.DROPPED, 1, payload_size(envelope), reason=DropReason.NOT_JSON
            )
            return False
        if self.send(data):
            server.hub.metrics.event(TEPEvent.EVENTS_SENT)
            return True
        return False

    def send(self, data: bytes) -> bool:
        """Send one text frame, or drop this client if it lags too far; True if sent."""
        transport = self._transport
        if transport is None:
            return False
        unsent = transport.unsent_bytes()
        limit = self._limits.max_send_buffer
        if unsent > limit:
            reason = f"slow consumer: {unsent} bytes unsent, limit is {limit}"
            log.warn("dropping TEP client {peer}: {reason}", peer=self.peer, reason=reason)
            self._server.hub.metrics.event(TEPEvent.DROPPED_SLOW)
            self._server.hub.metrics.disconnect(Source.TEP, "slow_consumer")
            self._detach()
            transport.drop(reason)
            return False
        transport.send_text(data)
        return True

    def _send_frame(self, frame: ServerFrame) -> None:
        for data in encode_server(frame):
            self.send(data)

    # -- closing -------------------------------------------------------------------

    def close(self, code: int, reason: str) -> defer.Deferred[None]:
        """Close the connection with ``code`` and ``reason``; fires once it is gone."""
        if self._lost:
            return defer.succeed(None)
        gone: defer.Deferred[None] = defer.Deferred()
        self._closed_waiters.append(gone)
        transport = self._transport
        self._detach()
        if transport is not None:
            transport.close(code, reason)
        return gone

    def connection_lost(self) -> None:
        """The connection is gone: leave every channel; idempotent."""
        self._detach()
        self._lost = True
        waiters, self._closed_waiters = self._closed_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _detach(self) -> None:
        """Stop sending: leave every channel and the server's client list."""
        if self._transport is None:
            return
        self._transport = None
        self._hub.unsubscribe_all(self)
        self._server.remove_client(self)


class TEPServerProtocol(WebSocketServerProtocol):
    """One TEP WebSocket connection, driving one :class:`TEPClient`."""

    _client: TEPClient | None = None
    _backlog: SendBacklog | None = None

    def onOpen(self) -> None:  # noqa: N802 - Autobahn API
        """The handshake is done: create the client and watch the send buffer."""
        server: TEPServer = self.factory.tep_server
        if server.refuse_clients:
            server.hub.metrics.event(TEPEvent.REFUSED_CLIENTS)
            log.info("TEP client {peer} refused: anonymous clients are not allowed", peer=self.peer)
            for data in encode_server(ErrorFrame(ANONYMOUS_REFUSED)):
                self.sendMessage(data, False)
            self.sendClose(UNAUTHORIZED_CLOSE, "not authorized: anonymous clients are refused")
            return
        self._client = TEPClient(server, self, peer=str(self.peer))
        self._watch_send_buffer()
        # Upgraded: the connection layer's handshake deadline no longer applies (pubsubclub.net.edge).
        handshake_done(self.transport)

    def keepalive(self) -> None:
        """Quiet for a while: ping (the connection layer's hook), so a client that answers is not idle."""
        ping_if_open(self)

    def pending_input(self) -> int:
        """Unfinished input held (the connection layer's hook)."""
        return unfinished_input(self)

    def _watch_send_buffer(self) -> None:
        self._backlog = watch_send_buffer(self.transport, "TEP")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802, N803 - Autobahn API
        """Hand one complete message to the client (Autobahn checked size and UTF-8)."""
        client = self._client
        if client is None:
            return
        if isBinary:
            client.binary_received(payload)
        else:
            client.frame_received(payload)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:  # noqa: N802, N803
        """The connection is gone: the client leaves every channel."""
        client = self._client
        if client is not None:
            log.debug("TEP client {peer} closed: {code} {reason}", peer=client.peer, code=code, reason=reason)
            client.connection_lost()

    # -- TEPTransport ----------------------------------------------------------------

    def send_text(self, data: bytes) -> None:
        """Send one text frame; nothing once the closing handshake has begun."""
        # Autobahn raises Disconnected after the peer's close frame, and this
        # runs inside the hub's delivery loop.
        if self.state != WebSocketServerProtocol.STATE_OPEN:
            return
        # Not Autobahn's sendMessage: it refuses an event over our receive limit, as an event for a
        # frame just under it from another front-end can be (wsframes, docs/protocol.md "Message sizes").
        send_message(self, data, False)
        if self._backlog is not None:
            self._backlog.written(len(data))

    def unsent_bytes(self) -> int:
        """Upper bound on bytes written but not yet taken by the client."""
        return unsent_bytes(self.transport, self._backlog)

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake."""
        self.sendClose(code, reason)

    def drop(self, reason: str) -> None:
        """Abort the TCP connection now (a close frame would queue behind the backlog)."""
        self.wasClean = False
        self.wasNotCleanReason = reason
        self.dropConnection(abort=True)


class TEPOperationsResource(Resource):
    """``/tep`` of the operations listener: the server API over HTTP, behind a bearer token.

    ``POST /tep/broadcast`` with ``{"payload": X}`` and ``POST /tep/emit``
    with ``{"channel": C, "payload": X}``, each with ``Authorization: Bearer
    <token>``; the answer is ``{"delivered_locally": N}``, or 400/413 with
    ``{"error": ...}``, or 401 without the token.
    """

    def __init__(self, server: TEPServer, token: bytes, login_throttle: LoginThrottle | None = None) -> None:
        super().__init__()
        self.putChild(b"broadcast", _OperationResource(server, "broadcast", token, login_throttle))
        self.putChild(b"emit", _OperationResource(server, "emit", token, login_throttle))


def _client_host(request: Request) -> str:
    """The address an HTTP request came from ("?" when the transport has none)."""
    host = getattr(request.getClientAddress(), "host", None)
    return host if isinstance(host, str) else "?"


class _OperationResource(Resource):
    """One server API call over ``POST``."""

    isLeaf = True

    def __init__(
        self, server: TEPServer, operation: str, token: bytes, login_throttle: LoginThrottle | None = None
    ) -> None:
        super().__init__()
        self._server = server
        self._operation = operation
        self._expected = b"Bearer " + token
        self._throttle = login_throttle

    def render_POST(self, request: Request) -> bytes:  # noqa: N802 - Twisted Web API
        """Run the call with the JSON body's fields, for a caller holding the token."""
        request.setHeader(b"content-type", b"application/json")
        given = request.getHeader(b"authorization") or b""
        throttle, source = self._throttle, _client_host(request)
        left = 0.0 if throttle is None else throttle.locked(source)
        if left > 0.0:
            request.setResponseCode(429)
            request.setHeader(b"retry-after", str(math.ceil(left)).encode())
            return orjson.dumps({"error": f"too many failed logins from {source}: try again in {left:.1f} s"})
        if not hmac.compare_digest(given.strip(), self._expected):
            if throttle is not None:
                throttle.failed(source)
            request.setResponseCode(401)
            request.setHeader(b"www-authenticate", b'Bearer realm="pubsubclub-tep"')
            return orjson.dumps({"error": "the TEP operator API needs Authorization: Bearer <token>"})
        limit = self._server.limits.max_frame_bytes
        assert request.content is not None
        body = request.content.read(limit + 1)
        if len(body) > limit:
            request.setResponseCode(413)
            return orjson.dumps({"error": f"body over the limit of {limit} bytes"})
        try:
            value = jsonbounds.loads(body, self._server.limits.json)
            if not isinstance(value, dict) or "payload" not in value:
                raise ValueError('the body must be a JSON object with a "payload"')
            if self._operation == "broadcast":
                delivered = self._server.broadcast(value["payload"])
            else:
                channel = value.get("channel")
                if not isinstance(channel, str):
                    raise ValueError('the body needs a string "channel"')
                delivered = self._server.emit(channel, value["payload"])
        except ValueError as e:  # orjson.JSONDecodeError and jsonbounds.BoundsError are ValueErrors
            request.setResponseCode(400)
            return orjson.dumps({"error": str(e)})
        return orjson.dumps({"delivered_locally": delivered})
