"""The NSD front-end: TCP, one JSON object per line, bridged onto the cluster.

State and how it is shared
    Channels, per-identity subscriptions and history live in an
    :class:`~pubsubclub.adapters.nsd_store.NSDStore` on every node and are
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

The ``when`` clock
    ``when`` is a hybrid logical clock in microseconds since the epoch: the
    origin node issues ``max(now_us, last + 1)`` and every node raises its
    ``last`` past every ``when`` it sees. The origin's ``when`` travels with the
    message, so every node stores the same value and ``after`` means the same
    thing on every node. Messages from other front-ends get ``when`` from the
    origin's publish time (PSC 0.2 metadata) when known.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger

from pubsubclub.adapters import nsd_codec as codec
from pubsubclub.adapters.nsd_store import NSDStore
from pubsubclub.hub import Envelope, Hub
from pubsubclub.metrics import payload_size

log = Logger()

CONTROL_TOPIC = "$nsd.control"
LOG_TOPIC = "$nsd.log"


class HybridClock:
    """``when`` values: microseconds, strictly increasing, never behind what was seen."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self.last = 0

    def tick(self) -> int:
        """A new ``when`` for a message published here."""
        self.last = max(int(self._now() * 1_000_000), self.last + 1)
        return self.last

    def observe(self, when: int) -> None:
        """Move past a ``when`` issued elsewhere."""
        if when > self.last:
            self.last = when


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
    #: Messages per state-transfer chunk.
    transfer_chunk: int = 500


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
        self.clock = HybridClock(clock)
        self._history = _Sink(self._on_channel_message)
        self._log = _Sink(self._on_log)
        self._control = _Sink(self._on_control)
        self._since_retention = 0
        self.stats = {"requests": 0, "errors": 0, "transfers_sent": 0, "transfers_applied": 0}

    def start(self) -> None:
        """Subscribe to the replication topics and every known channel."""
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

    # -- requests -------------------------------------------------------------------

    def handle(self, request: codec.Request) -> bytes:
        """Answer one request with one response line."""
        self.stats["requests"] += 1
        if isinstance(request, codec.OpenRequest):
            self._ensure_channel(request.identity, announce=True)
            self._subscribe(request.identity, request.identity, True)
            return codec.encode_success()
        if isinstance(request, codec.GetRequest):
            channels = self.store.subscribed(request.identity)
            found = self.store.messages_after(channels, request.after, self.settings.limits.max_get_messages)
            count = self.hub.metrics.count
            for channel, message in found:
                count(self._topic(channel), "nsd", "delivered", 1, len(message))
            return codec.encode_message_list([message for _, message in found])
        if isinstance(request, codec.PublishRequest):
            if not self.store.has_channel(request.identity):
                return self._error(codec.no_such_channel(request.identity))
            size = codec.message_chars(request.message)
            if size > self.settings.limits.max_message_chars:
                return self._error(codec.message_too_big(size))
            self._publish(request.identity, request.message)
            return codec.encode_success()
        channel = request.channel
        if not self.store.has_channel(channel):
            return self._error(codec.no_such_channel(channel))
        self._subscribe(request.identity, channel, isinstance(request, codec.SubscribeRequest))
        return codec.encode_success()

    def _error(self, text: str) -> bytes:
        self.stats["errors"] += 1
        return codec.encode_error(text)

    def _publish(self, channel: str, message: dict[str, Any]) -> None:
        when = self.clock.tick()
        stored = {**message, "from": message.get("from", channel), "when": when}
        stored["_class"] = codec.MESSAGE_CLASS
        envelope = self.hub.envelope(self._topic(channel), stored)
        self.hub.metrics.count(envelope.topic, "nsd", "published", 1, payload_size(envelope))
        message_id = envelope.message_id or uuid.uuid4().hex
        self._store(channel, when, message_id, stored)
        # The log reaches every NSD node; the channel topic reaches everyone else.
        self._send(LOG_TOPIC, {"channel": channel, "id": message_id, "message": stored})
        self.hub.publish(envelope, exclude=self._history)

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
        self.clock.observe(when)
        self.store.add_message(channel, when, message_id, orjson.dumps(message))
        self._since_retention += 1
        if self._since_retention >= 1000:
            self._since_retention = 0
            self.store.apply_retention(self.settings.retention_count, self.settings.retention_seconds)

    # -- replication --------------------------------------------------------------------

    def _on_log(self, envelope: Envelope) -> None:
        payload = envelope.payload
        try:
            channel, message_id, message = payload["channel"], payload["id"], payload["message"]
            when = message["when"]
        except (TypeError, KeyError):
            log.warn("ignoring a malformed {topic} message from {origin}", topic=LOG_TOPIC, origin=envelope.origin)
            return
        if not (isinstance(channel, str) and isinstance(message_id, str) and type(when) is int):
            log.warn("ignoring a malformed {topic} message from {origin}", topic=LOG_TOPIC, origin=envelope.origin)
            return
        self._ensure_channel(channel, announce=False)
        self._store(channel, when, message_id, message)

    def _on_channel_message(self, envelope: Envelope) -> None:
        """A message on a channel topic: from NSD elsewhere (already logged) or another front-end."""
        topic = envelope.topic
        prefix = self.settings.prefix
        if not topic.startswith(prefix):
            return
        channel = topic[len(prefix) :]
        payload = envelope.payload
        message_id = envelope.message_id or f"local-{uuid.uuid4().hex}"
        if (
            isinstance(payload, dict)
            and payload.get("_class") == codec.MESSAGE_CLASS
            and type(payload.get("when")) is int
        ):
            self._store(channel, payload["when"], message_id, payload)
            return
        if envelope.published_at is not None:
            when = max(int(envelope.published_at * 1_000_000), 1)
        else:
            when = self.clock.tick()
        self._store(channel, when, message_id, render_foreign(payload, envelope, when))

    def _on_control(self, envelope: Envelope) -> None:
        payload = envelope.payload
        op = payload.get("op") if isinstance(payload, dict) else None
        try:
            if op == "channel":
                self._ensure_channel(_str(payload["channel"]), announce=False)
            elif op == "sub":
                stamp = payload["stamp"]
                if type(stamp) is not int:
                    raise TypeError("stamp")
                self.clock.observe(stamp)
                self.store.set_subscription(
                    _str(payload["identity"]), _str(payload["channel"]), bool(payload["active"]), stamp
                )
            elif op == "state":
                if payload.get("to") == self.hub.node_id:
                    self._apply_state(payload)
            else:
                raise KeyError(op)
        except (KeyError, TypeError):
            log.warn(
                "ignoring a malformed {topic} message from {origin}: {op}",
                topic=CONTROL_TOPIC,
                origin=envelope.origin,
                op=op,
            )

    def remote_subscribed(self, topic: str, peer: str) -> None:
        """A node started listening to our control topic: send it our whole state."""
        if topic != CONTROL_TOPIC:
            return
        self.stats["transfers_sent"] += 1
        channels = self.store.channels()
        subs = [list(s) for s in self.store.subscriptions()]
        history = self.store.history()
        chunk = self.settings.transfer_chunk
        first = True
        for start in range(0, max(len(history), 1), chunk):
            part = [[c, w, i, orjson.loads(m)] for c, w, i, m in history[start : start + chunk]]
            payload: dict[str, Any] = {"op": "state", "to": peer, "messages": part}
            if first:
                payload["channels"] = channels
                payload["subscriptions"] = subs
                first = False
            self._send(CONTROL_TOPIC, payload)

    def _apply_state(self, payload: dict[str, Any]) -> None:
        self.stats["transfers_applied"] += 1
        for channel in payload.get("channels", []):
            self._ensure_channel(_str(channel), announce=False)
        for identity, channel, active, stamp in payload.get("subscriptions", []):
            self.clock.observe(stamp)
            self.store.set_subscription(_str(identity), _str(channel), bool(active), int(stamp))
        for channel, when, message_id, message in payload.get("messages", []):
            self._ensure_channel(_str(channel), announce=False)
            self._store(channel, int(when), _str(message_id), message)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def render_foreign(payload: Any, envelope: Envelope, when: int) -> dict[str, Any]:
    """A message from another front-end as an NSD Message object (docs/protocol-mapping.md)."""
    message: dict[str, Any] = {"_class": codec.MESSAGE_CLASS, "from": envelope.origin or "cluster", "when": when}
    if isinstance(payload, str):
        message["body"] = payload
    else:
        message["body"] = orjson.dumps(payload).decode()
        message["payload"] = payload
    return message


class NSDProtocol(Protocol):
    """One NSD client connection."""

    def __init__(self, service: NSDService) -> None:
        self._service = service
        self._framer = codec.LineFramer(service.settings.limits.max_line_bytes)

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Answer every complete line, in order."""
        for item in self._framer.feed(data):
            if isinstance(item, codec.OversizeLine):
                self.transport.write(codec.encode_error(codec.message_too_big(item.chars)))  # type: ignore[union-attr]
                continue
            if not item.data.strip():
                continue
            try:
                request = codec.decode_request(item.data, self._service.settings.limits)
            except codec.NSDRequestError as e:
                self._service.stats["errors"] += 1
                self.transport.write(codec.encode_error(e.error))  # type: ignore[union-attr]
                continue
            try:
                response = self._service.handle(request)
            except Exception:  # a store failure must not kill the node; the client gets an answer
                log.failure("NSD request failed: {request}", request=request)
                response = codec.encode_error("INTERNAL ERROR")
            self.transport.write(response)  # type: ignore[union-attr]


class NSDFactory(Factory):
    """Builds :class:`NSDProtocol` for each connection."""

    noisy = False

    def __init__(self, service: NSDService) -> None:
        self.service = service

    def buildProtocol(self, addr: Any) -> NSDProtocol:  # noqa: N802 - Twisted API
        """A protocol for a new client."""
        return NSDProtocol(self.service)
