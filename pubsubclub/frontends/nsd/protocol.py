"""The NSD front-end: TCP, one JSON object per line, bridged onto the cluster.

State and how it is shared
    Channels, per-identity subscriptions and history live in an
    :class:`~pubsubclub.frontends.nsd.store.NSDStore` on every node and are
    replicated to every NSD node, so what a client sees never depends on the
    node it talks to (a channel opened on node 1 is subscribable on node 3; a
    client that moves keeps its subscriptions and its ``after`` cursor):

    * ``$nsd.control`` carries channel creations and (un)subscriptions, and
      state transfers: when another node starts listening to this node's
      control topic (a link came up), this node sends it its whole state, so a
      node that joined later, or was down, catches up;
    * ``$nsd.log`` carries every message published by an NSD client, so every
      NSD node stores it whatever its interest in the channel topic;
    * the channel's own topic (``<prefix><channel>``) carries the same message
      to subscribers of every front-end, and brings WAMP/TEP publishes on that
      topic into NSD history.

    Every message is stored under its cluster-wide message id, so the same
    message arriving twice (log + channel topic, or a state transfer) is
    stored once.

Authorization
    NSD carries no credentials (``identity`` is a channel name anyone may
    claim), so with an auth policy every NSD client has the policy's
    anonymous role, checked on the hub topic of each channel it touches:
    Open needs publish or subscribe on its own channel (and subscribes only
    if the role may subscribe), Publish needs publish, Subscribe needs
    subscribe, and Get returns only channels the role may subscribe to.
    Refusals are ``ErrorResponse`` ``NOT AUTHORIZED: ...``. When the policy
    refuses anonymous clients, the first request is answered that way and
    the connection is closed.
Payloads are data
    Only NSD writes ``from`` and ``when``. A genuine NSD message reaches other
    nodes on ``$nsd.log`` (or in a state transfer on ``$nsd.control``): ``$``
    topics are the cluster's own and no front-end lets a client publish there.
    Whatever arrives on a channel topic is a *foreign* message, whatever its
    shape (a WAMP or TEP client can publish a complete Message object): it is
    stored wrapped, with ``from`` = ``$foreign@<origin node>`` (no NSD identity
    can start with ``$``) and ``when`` from the origin node's publish time.
    The channel-topic copy of a genuine message is recognised by its message
    id, already stored from the log. Every record from another node or from
    disk is validated and, if bad, skipped and counted, never raised.

The ``when`` clock
    ``when`` is a hybrid logical clock in microseconds since the epoch: the
    origin node issues ``max(now_us, last + 1)`` and every node raises its
    ``last`` past every ``when`` it sees. The origin's ``when`` travels with the
    message, so every node stores the same value and ``after`` means the same
    thing on every node. A ``when`` (or subscription stamp) more than
    ``max_clock_skew`` ahead of this node's clock is refused: one absurd value
    would otherwise drag every later ``when`` past it, up to SQLite's 64-bit
    limit.

Why one long module: the NSD service, its cluster replication and its Twisted
protocol are one front-end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from pubsubclub.core import binaryjson, jsonbounds
from pubsubclub.core.counters import Kind, NSDEvent, Source
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.frontends.nsd import codec
from pubsubclub.frontends.nsd.store import NSDStore
from pubsubclub.frontends.wamp.auth import AuthPolicy
from pubsubclub.net.edge import handshake_done
from pubsubclub.net.nodelay import set_no_delay

log = Logger()

#: Why every NSD client is refused when the auth policy refuses anonymous clients.
ANONYMOUS_REFUSED = "this node admits only authenticated clients, and NSD has no credentials"

CONTROL_TOPIC = "$nsd.control"
LOG_TOPIC = "$nsd.log"
#: ``from`` of a message another front-end published on a channel's topic (``$foreign@<origin node>``).
FOREIGN_FROM = "$foreign"
#: Longest message id accepted from another node or from disk.
MAX_MESSAGE_ID_CHARS = 256


class HybridClock:
    """``when`` values: microseconds, strictly increasing, never behind what was seen, never far ahead of now."""

    def __init__(self, now: Callable[[], float], max_skew: float = 3600.0) -> None:
        self._now = now
        self._max_skew = max_skew
        self.last = 0

    def horizon(self) -> int:
        """The largest ``when`` accepted now: this node's clock plus the allowed skew."""
        return int((self._now() + self._max_skew) * 1_000_000)

    def valid(self, when: Any) -> bool:
        """Whether ``when`` (from another node, a client's cursor aside) is in range."""
        return type(when) is int and 0 < when <= self.horizon()

    def tick(self) -> int:
        """A new ``when`` for a message published here."""
        self.last = max(int(self._now() * 1_000_000), self.last + 1)
        return self.last

    def observe(self, when: int) -> bool:
        """Move past a ``when`` issued elsewhere; False (and no move) if it is out of range."""
        if not self.valid(when):
            return False
        if when > self.last:
            self.last = when
        return True


@dataclass(frozen=True)
class NSDSettings:
    """NSD front-end settings."""

    limits: codec.NSDLimits = codec.NSDLimits()
    #: Hub topic of channel ``c`` is ``prefix + c``.
    prefix: str = ""
    #: Keep at most this many messages per channel (None: no limit).
    retention_count: int | None = 10_000
    #: Drop messages older than this many seconds (None: no limit).
    retention_seconds: float | None = None
    #: Most messages per state-transfer chunk.
    transfer_chunk: int = 500
    #: Auth policy (``--auth``): NSD clients get its anonymous role; None: everything allowed.
    auth: AuthPolicy | None = None
    #: A state-transfer chunk is closed once its messages reach this many bytes (stay under the PSC limit).
    transfer_chunk_bytes: int = 256 * 1024
    #: Seconds a ``when`` or stamp from elsewhere may be ahead of this node's clock.
    max_clock_skew: float = 3600.0


class _Sink:
    """A hub sink that hands envelopes to one method."""

    def __init__(self, handler: Callable[[Envelope], None]) -> None:
        self._handler = handler

    def deliver(self, envelope: Envelope) -> None:
        self._handler(envelope)


class NSDService:
    """Protocol logic of the NSD front-end; one per node."""

    def __init__(self, hub: Hub, store: NSDStore, clock: Callable[[], float], settings: NSDSettings) -> None:
        self.hub = hub
        self.store = store
        self.settings = settings
        self.clock = HybridClock(clock, settings.max_clock_skew)
        self._history = _Sink(self._on_channel_message)
        self._log = _Sink(self._on_log)
        self._control = _Sink(self._on_control)
        self._since_retention = 0
        auth = settings.auth
        #: The role of every NSD client (the anonymous role); None: no policy, all allowed.
        self.role = None if auth is None else auth.anonymous_role
        #: The policy refuses anonymous clients, so every NSD client is turned away.
        self.refuse_clients = auth is not None and self.role is None

    @property
    def stats(self) -> dict[str, int]:
        """NSD's event counters (a view of the hub's metrics)."""
        return self.hub.metrics.view("nsd")

    def start(self) -> None:
        """Repair the store, then subscribe to the replication topics and every known channel."""
        repaired = self.store.quarantine_bad_rows(self.clock.horizon(), self._row_problem)
        if repaired:
            self.hub.metrics.event(NSDEvent.REPAIRED, repaired)
            self.hub.metrics.error(Source.NSD, "store_row_quarantined", repaired)
            log.warn(
                "NSD store {path}: {n} bad row(s) moved to the quarantine table",
                path=self.store.path,
                n=repaired,
            )
        self.clock.observe(self.store.max_when())
        self.hub.subscribe(CONTROL_TOPIC, self._control)
        self.hub.subscribe(LOG_TOPIC, self._log)
        for channel in self.store.channels():
            self.hub.subscribe(self._topic(channel), self._history)
        self.hub.add_remote_interest_listener(self)

    def stop(self) -> None:
        """Leave the hub and close the store."""
        self.hub.unsubscribe_all(self._control)
        self.hub.unsubscribe_all(self._log)
        self.hub.unsubscribe_all(self._history)
        self.store.close()

    def _topic(self, channel: str) -> str:
        return self.settings.prefix + channel

    # -- validation ---------------------------------------------------------------------

    def _name_ok(self, value: Any) -> bool:
        return codec.name_problem(value, "name", self.settings.limits) is None

    def _row_problem(self, table: str, row: tuple[Any, ...]) -> str | None:
        """Why a channels/subscriptions row loaded from disk is bad, or None (see NSDStore)."""
        limits = self.settings.limits
        if table == "channels":
            return codec.name_problem(row[0], "channel", limits)
        identity, channel, _active, stamp = row
        return (
            codec.name_problem(identity, "identity", limits)
            or codec.name_problem(channel, "channel", limits)
            or (None if self.clock.valid(stamp) else "stamp out of range")
        )

    def _reject(self, source: str, problem: str, origin: str | None) -> None:
        """Skip a bad record from another node (or a bad foreign message): log and count, never raise."""
        self.hub.metrics.event(NSDEvent.REJECTED)
        self.hub.metrics.error(Source.NSD, f"{source}_rejected")
        log.warn(
            "NSD: skipped a bad {source} record from {origin}: {problem}", source=source, origin=origin, problem=problem
        )

    def _record_problem(self, channel: Any, when: Any, message_id: Any, message: Any) -> str | None:
        """Why a replicated message record is bad, or None."""
        if not self._name_ok(channel):
            return "bad channel name"
        if not isinstance(message_id, str) or not 0 < len(message_id) <= MAX_MESSAGE_ID_CHARS:
            return "bad message id"
        if not self.clock.valid(when):
            return "when out of range"
        return codec.stored_message_problem(message, when, self.settings.limits)

    # -- requests -------------------------------------------------------------------

    def handle(self, request: codec.Request) -> bytes:
        """Answer one request with one response line."""
        self.hub.metrics.event(NSDEvent.REQUESTS)
        role = self.role
        if role is not None:
            refused = self._refusal(request)
            if refused is not None:
                self.hub.metrics.event(NSDEvent.NOT_AUTHORIZED)
                return self._error(codec.not_authorized(refused))
        if isinstance(request, codec.OpenRequest):
            topic = self._topic(request.identity)
            if not self.hub.room_for(topic) and not self.store.has_channel(request.identity):
                # A new channel is a new hub topic (its history sink): refused past the node's topic cap.
                self.hub.metrics.error(Source.NSD, "too_many_topics")
                limit = self.hub.max_topics
                return self._error(
                    codec.too_many_channels(f"this node has subscribers on {limit} topics (max-subscribed-topics)")
                )
            self._ensure_channel(request.identity, announce=True)
            if role is None or role.may_subscribe(self._topic(request.identity)):
                self._subscribe(request.identity, request.identity, True)
            return codec.encode_success()
        if isinstance(request, codec.GetRequest):
            channels = self.store.subscribed(request.identity)
            if role is not None:
                channels = [c for c in channels if role.may_subscribe(self._topic(c))]
            found = self.store.messages_after(channels, request.after, self.settings.limits.max_get_messages)
            count = self.hub.metrics.count
            for channel, message in found:
                count(self._topic(channel), Source.NSD, Kind.DELIVERED, 1, len(message))
            return codec.encode_message_list([message for _, message in found])
        if isinstance(request, codec.PublishRequest):
            if not self.store.has_channel(request.identity):
                return self._error(codec.no_such_channel(request.identity))
            size = codec.message_chars(request.message)
            if size > self.settings.limits.max_message_chars:
                return self._error(codec.message_too_big(size))
            too_large = self._publish(request.identity, request.message, size)
            if too_large is not None:
                return self._error(too_large)
            return codec.encode_success()
        channel = request.channel
        if not self.store.has_channel(channel):
            return self._error(codec.no_such_channel(channel))
        self._subscribe(request.identity, channel, isinstance(request, codec.SubscribeRequest))
        return codec.encode_success()

    def _refusal(self, request: codec.Request) -> str | None:
        """Why the role may not make ``request`` (checked before anything else), or None."""
        role = self.role
        assert role is not None
        if isinstance(request, codec.OpenRequest):
            topic = self._topic(request.identity)
            if not (role.may_publish(topic) or role.may_subscribe(topic)):
                return f"role {role.name!r} may neither publish nor subscribe to channel {request.identity}"
        elif isinstance(request, codec.PublishRequest):
            if not role.may_publish(self._topic(request.identity)):
                return f"role {role.name!r} may not publish to channel {request.identity}"
        elif isinstance(request, codec.SubscribeRequest):
            if not role.may_subscribe(self._topic(request.channel)):
                return f"role {role.name!r} may not subscribe to channel {request.channel}"
        return None

    def _error(self, text: str) -> bytes:
        self.hub.metrics.event(NSDEvent.ERRORS)
        return codec.encode_error(text)

    def _publish(self, channel: str, message: dict[str, Any], chars: int) -> str | None:
        """Store and publish; or, for a message that could not reach other nodes, why not (nothing done)."""
        when = self.clock.tick()
        # NSD assigns from (the publishing identity) and when; the client's are ignored.
        stored = {**message, "_class": codec.MESSAGE_CLASS, "from": channel, "when": when}
        envelope = self.hub.envelope(self._topic(channel), stored)
        # Only with an --nsd-max-message-chars far above the default can a message be too large.
        too_large = self.hub.refusal(envelope, chars)
        if too_large is not None:
            return too_large
        self.hub.metrics.count(envelope.topic, Source.NSD, Kind.PUBLISHED, 1, payload_size(envelope))
        message_id = envelope.message_id or uuid.uuid4().hex
        self._store(channel, when, message_id, stored)
        # The log reaches every NSD node; the channel topic reaches everyone else.
        self._send(LOG_TOPIC, {"channel": channel, "id": message_id, "message": stored})
        self.hub.publish(envelope, exclude=self._history)
        return None

    def _subscribe(self, identity: str, channel: str, active: bool) -> None:
        stamp = self.clock.tick()
        self.store.set_subscription(identity, channel, active, stamp)
        self._send(
            CONTROL_TOPIC, {"op": "sub", "identity": identity, "channel": channel, "active": active, "stamp": stamp}
        )

    def _ensure_channel(self, channel: str, announce: bool) -> None:
        if self.store.add_channel(channel, self.clock.tick()):
            self.hub.subscribe(self._topic(channel), self._history)
            if announce:
                self._send(CONTROL_TOPIC, {"op": "channel", "channel": channel})

    def _send(self, topic: str, payload: Any) -> None:
        sink = self._control if topic == CONTROL_TOPIC else self._log
        self.hub.publish(self.hub.envelope(topic, payload), exclude=sink)

    def _store(self, channel: str, when: int, message_id: str, message: dict[str, Any]) -> None:
        """Store a message whose fields were validated (or assigned here)."""
        self.clock.observe(when)
        self.store.add_message(channel, when, message_id, orjson.dumps(message))
        self._since_retention += 1
        if self._since_retention >= 1000:
            self._since_retention = 0
            self.store.apply_retention(self.settings.retention_count, self.settings.retention_seconds)

    # -- replication --------------------------------------------------------------------

    def _on_log(self, envelope: Envelope) -> None:
        """A genuine NSD message published on another node."""
        payload = envelope.payload
        if not isinstance(payload, dict):
            self._reject("log", "not an object", envelope.origin)
            return
        channel, message_id, message = payload.get("channel"), payload.get("id"), payload.get("message")
        when = message.get("when") if isinstance(message, dict) else None
        problem = self._record_problem(channel, when, message_id, message)
        if problem is not None:
            self._reject("log", problem, envelope.origin)
            return
        assert isinstance(channel, str) and isinstance(message_id, str) and isinstance(message, dict)
        assert isinstance(when, int)
        self._ensure_channel(channel, announce=False)
        self._store(channel, when, message_id, message)

    def _on_channel_message(self, envelope: Envelope) -> None:
        """A message on a channel topic: the copy of a logged NSD message, or a foreign one.

        Its content decides nothing: a WAMP or TEP client can publish a
        complete Message object. Only the message id, which nodes assign,
        tells the channel copy of a genuine NSD message (stored from
        ``$nsd.log`` just before) from a foreign message.
        """
        topic = envelope.topic
        prefix = self.settings.prefix
        if not topic.startswith(prefix):
            return
        channel = topic[len(prefix) :]
        message_id = envelope.message_id
        if message_id is not None and self.store.has_message(message_id):
            return
        if message_id is None or not 0 < len(message_id) <= MAX_MESSAGE_ID_CHARS:
            message_id = f"local-{uuid.uuid4().hex}"
        when = self._foreign_when(envelope)
        try:
            message = render_foreign(envelope.payload, envelope.origin, when, self.settings.limits)
        except ValueError as e:
            self._reject("foreign", str(e), envelope.origin)
            return
        self.hub.metrics.event(NSDEvent.FOREIGN_STORED)
        self._store(channel, when, message_id, message)

    def _foreign_when(self, envelope: Envelope) -> int:
        """The origin's publish time, the same on every node, if in range; else this node's clock."""
        published = envelope.published_at
        if published is not None:
            # Compared as a float first: a huge time (or NaN) never reaches int(), which would overflow.
            when = published * 1_000_000
            if 1 <= when <= self.clock.horizon():
                return int(when)
        return self.clock.tick()

    def _on_control(self, envelope: Envelope) -> None:
        payload = envelope.payload
        op = payload.get("op") if isinstance(payload, dict) else None
        if op == "channel":
            channel = payload.get("channel")
            if self._name_ok(channel):
                self._ensure_channel(channel, announce=False)
            else:
                self._reject("control", "bad channel name", envelope.origin)
        elif op == "sub":
            problem = self._subscription_problem(
                payload.get("identity"), payload.get("channel"), payload.get("active"), payload.get("stamp")
            )
            if problem is not None:
                self._reject("control", problem, envelope.origin)
                return
            self.clock.observe(payload["stamp"])
            self.store.set_subscription(
                payload["identity"], payload["channel"], bool(payload["active"]), payload["stamp"]
            )
        elif op == "state":
            if payload.get("to") == self.hub.node_id:
                self._apply_state(payload, envelope.origin)
        else:
            self._reject("control", f"unknown op {str(op)[:40]!r}", envelope.origin)

    def _subscription_problem(self, identity: Any, channel: Any, active: Any, stamp: Any) -> str | None:
        if not (self._name_ok(identity) and self._name_ok(channel)):
            return "bad identity or channel name"
        if type(active) is not bool and active not in (0, 1):
            return "active must be a boolean"
        if not self.clock.valid(stamp):
            return "stamp out of range"
        return None

    def remote_subscribed(self, topic: str, peer: str) -> None:
        """A node started listening to our control topic: send it our whole state, in bounded chunks."""
        if topic != CONTROL_TOPIC:
            return
        self.hub.metrics.event(NSDEvent.TRANSFERS_SENT)
        channels = [c for c in self.store.channels() if self._name_ok(c)]
        subs = [list(s) for s in self.store.subscriptions() if self._subscription_problem(*s) is None]
        chunk, budget = self.settings.transfer_chunk, self.settings.transfer_chunk_bytes
        part: list[list[Any]] = []
        size = 0
        first = True
        for channel, when, message_id, data in self.store.history():
            try:
                message = orjson.loads(data)
            except orjson.JSONDecodeError:
                message = None
            problem = self._record_problem(channel, when, message_id, message)
            if problem is not None:
                # Stored by an older version, or the clock moved: not sent, counted.
                self._reject("stored", f"{message_id!r:.80}: {problem}", self.hub.node_id)
                continue
            part.append([channel, when, message_id, message])
            size += len(data)
            if len(part) >= chunk or size >= budget:
                self._send_state(peer, part, channels, subs, first)
                part, size, first = [], 0, False
        if part or first:
            self._send_state(peer, part, channels, subs, first)

    def _send_state(
        self, peer: str, messages: list[list[Any]], channels: list[str], subs: list[list[Any]], first: bool
    ) -> None:
        payload: dict[str, Any] = {"op": "state", "to": peer, "messages": messages}
        if first:
            payload["channels"] = channels
            payload["subscriptions"] = subs
        self._send(CONTROL_TOPIC, payload)

    def _apply_state(self, payload: dict[str, Any], origin: str | None) -> None:
        """Apply a state-transfer chunk; every bad record is skipped and counted, the rest applied."""
        self.hub.metrics.event(NSDEvent.TRANSFERS_APPLIED)
        channels, subs, messages = (payload.get(k, []) for k in ("channels", "subscriptions", "messages"))
        if not (isinstance(channels, list) and isinstance(subs, list) and isinstance(messages, list)):
            self._reject("transfer", "channels, subscriptions and messages must be arrays", origin)
            return
        for channel in channels:
            if self._name_ok(channel):
                self._ensure_channel(channel, announce=False)
            else:
                self._reject("transfer", "bad channel name", origin)
        for record in subs:
            if not (isinstance(record, list) and len(record) == 4):
                self._reject("transfer", "subscription is not [identity, channel, active, stamp]", origin)
                continue
            identity, channel, active, stamp = record
            problem = self._subscription_problem(identity, channel, active, stamp)
            if problem is not None:
                self._reject("transfer", problem, origin)
                continue
            self.clock.observe(stamp)
            self.store.set_subscription(identity, channel, bool(active), stamp)
        for record in messages:
            if not (isinstance(record, list) and len(record) == 4):
                self._reject("transfer", "message is not [channel, when, id, message]", origin)
                continue
            channel, when, message_id, message = record
            problem = self._record_problem(channel, when, message_id, message)
            if problem is not None:
                self._reject("transfer", problem, origin)
                continue
            self._ensure_channel(channel, announce=False)
            self._store(channel, when, message_id, message)


def render_foreign(payload: Any, origin: str | None, when: int, limits: codec.NSDLimits) -> dict[str, Any]:
    """A message another front-end published, as an NSD Message object (docs/protocol-mapping.md).

    ``from`` and ``when`` are NSD's, whatever the payload holds; the payload is
    only ever ``body`` (a string as it is, anything else as JSON text) and, when
    it is not a string and the result stays within ``max_message_chars``, a
    ``payload`` copy. Raises ValueError for a payload NSD cannot store (not
    JSON, beyond the bounds, too big).
    """
    sender = FOREIGN_FROM if not origin else f"{FOREIGN_FROM}@{origin[:128]}"
    message: dict[str, Any] = {"_class": codec.MESSAGE_CLASS, "from": sender, "when": when}
    try:
        jsonbounds.check(payload, limits.json, binary=True)
        if not isinstance(payload, str):
            try:
                text = orjson.dumps(payload).decode()
            except TypeError:  # bytes (a WAMP binary payload): NSD keeps WAMP JSON's "\u0000" + base64 strings
                payload = binaryjson.rendered(payload)
                text = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
        else:
            text = payload
    except (jsonbounds.BoundsError, TypeError) as e:
        raise ValueError(f"payload NSD cannot store: {e}") from None
    message["body"] = text
    if not isinstance(payload, str):
        message["payload"] = payload
        if codec.message_chars(message) > limits.max_message_chars:
            del message["payload"]  # the body alone still carries it
    size = codec.message_chars(message)
    if size > limits.max_message_chars:
        raise ValueError(f"foreign message of {size} characters is over the NSD limit of {limits.max_message_chars}")
    return message


class NSDProtocol(Protocol):
    """One NSD client connection."""

    def __init__(self, service: NSDService) -> None:
        self._service = service
        self._framer = codec.LineFramer(service.settings.limits.max_line_bytes)

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """No Nagle delay on answers and pushed messages."""
        set_no_delay(self.transport)

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Answer every complete line, in order."""
        for item in self._framer.feed(data):
            if isinstance(item, codec.OversizeLine):
                self.transport.write(codec.encode_error(codec.message_too_big(item.chars)))  # type: ignore[union-attr]
                continue
            if not item.data.strip():
                continue
            if self._service.refuse_clients:
                self._service.hub.metrics.event(NSDEvent.NOT_AUTHORIZED)
                self.transport.write(codec.encode_error(codec.not_authorized(ANONYMOUS_REFUSED)))  # type: ignore[union-attr]
                self.transport.loseConnection()  # type: ignore[union-attr]
                return
            try:
                request = codec.decode_request(item.data, self._service.settings.limits)
            except codec.NSDRequestError as e:
                self._service.hub.metrics.event(NSDEvent.ERRORS)
                self.transport.write(codec.encode_error(e.error))  # type: ignore[union-attr]
                continue
            # A first valid request: the connection layer's handshake deadline is over (pubsubclub.net.edge).
            handshake_done(self.transport)
            try:
                response = self._service.handle(request)
            except Exception:  # a store failure must not kill the node; the client gets an answer
                log.failure("NSD request failed: {request}", request=request)
                response = codec.encode_error("INTERNAL ERROR")
            self.transport.write(response)  # type: ignore[union-attr]

    def pending_input(self) -> int:
        """Bytes of an unfinished request line held (the connection layer's hook)."""
        return self._framer.pending


class NSDFactory(Factory):
    """Builds :class:`NSDProtocol` for each connection."""

    noisy = False

    def __init__(self, service: NSDService) -> None:
        self.service = service

    def buildProtocol(self, addr: Any) -> NSDProtocol:  # noqa: N802 - Twisted API
        """A protocol for a new client."""
        return NSDProtocol(self.service)
