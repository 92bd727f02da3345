"""The stream front-end (docs/specs/stream-protocol.md): Kafka-style clients on port 7878, over the node's durable log.

Wire handling is :mod:`pubsubclub.frontends.stream.codec` (sans-IO); storage is
:mod:`pubsubclub.frontends.stream.log`. This module joins them to the hub:

- **Retained topics.** A node keeps a topic in its log from the first stream
  publish or subscription on that topic on this node, and for as long as the
  log's retention keeps it; the retained set lives in the log's metadata, so
  it survives restarts. For each retained topic the service subscribes one
  sink on the hub: messages from other nodes and other front-ends on that
  topic are appended to this node's log, so a message's sequence is its place
  in this node's log, the same for every subscriber here and unchanged across
  restarts.
- **Durable acks, group commit.** A Publish is appended (and published on the
  hub) at once; its Status OK waits for the log's ``sync``, which runs once
  per reactor turn for everything that arrived in it (``[stream] fsync``:
  fsync, or only ``write`` when relaxed). Answers leave a connection in the
  order of its requests, so an ack that waits holds back the answers queued
  behind it.
- **Pull, not push.** Each subscription is a cursor into the log. A
  connection sends Message frames only while its transport takes them (it
  is a streaming producer of its TCP transport); a reader that stops reading
  stops the cursor, not the node's memory. Subscribers only see what is
  durable (read up to the last sync).

- **Bounded.** No file stays open for an idle topic (the log's LRU,
  ``[stream] max-open-files``); topics (``max-topics``) and the log's disk
  (``max-disk-bytes``) have node-wide caps, answered with ERROR 429 and 507;
  half-received requests of all connections together stay within
  ``max-pending-bytes``. A Publish whose PSC301 would not fit the cluster's
  links (``max-message-size``) is refused with ERROR 413 before it is stored
  or acknowledged: nothing acknowledged is lost across nodes (docs/stream.md).

Payload bytes on the hub (docs/protocol-mapping.md): UTF-8 text becomes a JSON
string; other bytes (and text starting with NUL) become WAMP's binary-in-JSON
form, ``"\\u0000" + base64``, which Autobahn JSON clients decode to bytes.
Back to bytes: a string is its UTF-8 (the binary form decoded), any other
JSON value its compact JSON text.

Why one long module: the stream service and its connection protocol are one front-end.
"""

from __future__ import annotations

import base64
import os
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from twisted.internet import task
from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.config import NodeConfig
from pubsubclub.core import binaryjson
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.federation import psc
from pubsubclub.frontends.base import Frontend, json_bounds
from pubsubclub.frontends.stream import codec
from pubsubclub.frontends.stream.log import (
    DiskFullError,
    LogSettings,
    OffsetStore,
    StreamLog,
    StreamLogError,
    TopicLimitError,
)
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
from pubsubclub.net.edge import handshake_done
from pubsubclub.net.nodelay import set_no_delay

log = Logger()

#: Records read from the log per step of one cursor (and at most this many bytes).
READ_BATCH_COUNT = 256
READ_BATCH_BYTES = 1024 * 1024
#: Seconds between retention passes over the log.
RETENTION_INTERVAL = 60.0
#: The front-end's name in metrics and URLs.
SOURCE = "stream"


def to_hub_payload(data: bytes) -> str:
    """Payload bytes as a cluster payload: UTF-8 text as is, anything else in WAMP's binary-in-JSON form."""
    if not data.startswith(b"\x00"):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return "\x00" + base64.b64encode(data).decode("ascii")


#: Bytes that JSON (orjson) writes as themselves inside a string: everything but controls, '"' and backslash.
_PLAIN_IN_JSON = bytes(b for b in range(0x20, 0x100) if b not in b'"\\')
#: Bytes with a two-character escape (\b \t \n \f \r \" \\); other controls take six (\u00XX).
_SHORT_ESCAPES = b'\b\t\n\f\r"\\'


def hub_payload_json_bytes(data: bytes, text: bool) -> int:
    """Bytes of the JSON string that :func:`to_hub_payload` of ``data`` becomes on a PSC link.

    ``text``: whether it took the UTF-8 form (else ``"\\u0000" + base64``). Exact, without encoding.
    """
    if not text:
        return 2 + 6 + 4 * ((len(data) + 2) // 3)
    escaped = data.translate(None, _PLAIN_IN_JSON)
    if not escaped:
        return 2 + len(data)
    return 2 + len(data) + len(escaped) + 4 * len(escaped.translate(None, _SHORT_ESCAPES))


class TooLargeForLinks(Exception):
    """A stream payload whose PSC301 would not fit the cluster's links (refused before it is stored)."""


def from_hub_payload(payload: Any) -> bytes:
    """A cluster payload as stream bytes (the inverse of :func:`to_hub_payload` for strings)."""
    if isinstance(payload, str):
        if payload.startswith("\x00"):
            try:
                return base64.b64decode(payload[1:], validate=True)
            except ValueError:
                return payload.encode("utf-8", "surrogatepass")
        return payload.encode("utf-8", "surrogatepass")
    if isinstance(payload, (bytes, bytearray)):
        return bytes(payload)
    return binaryjson.dumps(payload)  # bytes inside as WAMP JSON's "\u0000" + base64 strings


class _TopicSink:
    """The hub sink of one retained topic: appends what others publish to this node's log."""

    def __init__(self, service: StreamService, topic: str) -> None:
        self._service = service
        self.topic = topic

    def deliver(self, envelope: Envelope) -> None:
        self._service.append_foreign(self.topic, envelope)


@dataclass
class _Cursor:
    """One subscription: the next sequence to send."""

    topic: str
    next: int


class StreamService:
    """The node's stream state: the log, committed offsets, topic sinks, group commit, connections."""

    def __init__(self, hub: Hub, config: NodeConfig, auth: AuthPolicy | None, reactor: Any) -> None:
        section = config.stream
        self.hub = hub
        self.reactor = reactor
        self.prefix = section.prefix
        #: The largest PSC frame a link carries; every stream publish must fit one as a PSC301.
        self.link_limit = config.node.max_message_size
        self.limits = codec.Limits(
            max_header_bytes=section.max_header_bytes,
            # A payload of more bytes than a link frame can never fit one: refused at its header.
            max_payload_bytes=min(section.max_payload_bytes, self.link_limit),
            # A topic is a log folder name too: 256 characters stay within the log's 1024 bytes.
            max_topic_length=256,
            json=json_bounds(config),
        )
        directory = os.path.join(config.node.data_dir, "stream")
        os.makedirs(directory, exist_ok=True)
        self.log = StreamLog(
            directory,
            LogSettings(
                segment_bytes=section.segment_bytes,
                retention_bytes=section.retention_bytes,
                retention_seconds=section.retention_seconds,
                max_payload_bytes=section.max_payload_bytes,
                fsync=section.fsync,
                max_open_files=section.max_open_files,
                max_topics=section.max_topics,
                max_disk_bytes=section.max_disk_bytes,
            ),
        )
        #: Half-received headers and payloads of all connections together, and their cap.
        self.pending_bytes = 0
        self.max_pending_bytes = section.max_pending_bytes
        # The PSC301 of a stream publish, less its topic and payload, with the longest metadata a link
        # may add (0.3: origin, time, message id, sequence; see Federation.local_published).
        probe = hub.envelope("", "")
        self._psc_overhead = len(
            psc.encode_publish_meta(
                "", "", probe.origin, -1.7976931348623157e308, f"{probe.message_id}{2**64}", False, psc.MAX_SEQ
            )
        ) - 4  # fmt: skip
        #: Appends from the hub refused since the last one that went in (logged once per run of failures).
        self._foreign_refused = 0
        if self.log.recovered_bytes:
            log.warn("stream log: cut {n} bytes of torn tail on open", n=self.log.recovered_bytes)
        self.offsets = OffsetStore(os.path.join(directory, "offsets.sqlite3"))
        #: The role of every stream client (no credentials in the protocol); None: no policy, all allowed.
        self.role: Role | None = None if auth is None else auth.anonymous_role
        self.refuse_clients = auth is not None and self.role is None
        self._sinks: dict[str, _TopicSink] = {}
        #: Topic -> one past the last sequence made durable (what subscribers may read).
        self._durable: dict[str, int] = {}
        self._flush_call: Any = None
        self.connections: set[StreamProtocol] = set()
        self._retention = task.LoopingCall(self._enforce_retention)
        self._retention.clock = reactor
        for topic in self.log.retained_topics():
            self._durable[topic] = self.log.next_sequence(topic)
            self._sink_for(topic)

    def start(self) -> None:
        """Start the retention passes."""
        self._retention.start(RETENTION_INTERVAL, now=False)

    def stop(self) -> None:
        """Sync and close the log and the offsets (after the connections are gone)."""
        if self._retention.running:
            self._retention.stop()
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        for topic, sink in self._sinks.items():
            self.hub.unsubscribe(self.hub_topic(topic), sink)
        self._sinks.clear()
        self.log.close()
        self.offsets.close()

    def hub_topic(self, topic: str) -> str:
        """The hub topic of stream topic ``topic``."""
        return self.prefix + topic

    def topic_problem(self, topic: str, publish: bool) -> tuple[codec.ErrorCode, str] | None:
        """Why a client may not use ``topic`` (reserved, or its role), or None."""
        hub_topic = self.hub_topic(topic)
        if hub_topic.startswith("$"):
            return codec.ErrorCode.BAD_REQUEST, "topics starting with '$' are reserved for the cluster"
        role = self.role
        if role is not None and not (role.may_publish(hub_topic) if publish else role.may_subscribe(hub_topic)):
            verb = "publish to" if publish else "subscribe to"
            return codec.ErrorCode.NOT_AUTHORIZED, f"not authorized: role {role.name!r} may not {verb} {topic!r}"
        return None

    # -- the log -------------------------------------------------------------

    def retain(self, topic: str) -> None:
        """Keep ``topic`` in this node's log from now on (first stream publish or subscription)."""
        if not self.log.retained(topic):
            self.log.retain(topic)
            self._durable.setdefault(topic, self.log.next_sequence(topic))
            log.info("stream log: retaining topic {topic}", topic=topic)
        self._sink_for(topic)

    def _sink_for(self, topic: str) -> _TopicSink:
        sink = self._sinks.get(topic)
        if sink is None:
            sink = self._sinks[topic] = _TopicSink(self, topic)
            self.hub.subscribe(self.hub_topic(topic), sink)
        return sink

    def publish(self, topic: str, payload: bytes) -> None:
        """A stream client's message: into the log, then to the hub (other front-ends, other nodes).

        Raises :class:`TooLargeForLinks` (before storing anything) when its PSC301 would not fit a link,
        :class:`StreamLogError` when the log refuses it.
        """
        hub_topic = self.hub_topic(topic)
        hub_payload = to_hub_payload(payload)
        self.check_fits_links(hub_topic, payload, hub_payload)
        self.retain(topic)
        self.log.append(topic, payload)
        self.schedule_flush()
        self.hub.metrics.count(hub_topic, SOURCE, "published", 1, len(payload))
        envelope = self.hub.envelope(hub_topic, hub_payload, size=len(payload))
        self.hub.publish(envelope, exclude=self._sinks[topic])

    def check_fits_links(self, hub_topic: str, payload: bytes, hub_payload: str) -> None:
        """Raise :class:`TooLargeForLinks` when the PSC301 of this message would be over the link limit."""
        room = self.link_limit - self._psc_overhead
        # Cheap first: every topic character and payload byte takes at most six bytes in JSON.
        if 6 * (len(hub_topic) + len(payload)) + 4 <= room:
            return
        text = not hub_payload.startswith("\x00")
        size = self._psc_overhead + len(orjson.dumps(hub_topic)) + hub_payload_json_bytes(payload, text)
        if size > self.link_limit:
            raise TooLargeForLinks(
                f"payload of {len(payload)} bytes is too large for the cluster's links: its PSC301 would be "
                f"{size} bytes, max-message-size is {self.link_limit}"
            )

    def append_foreign(self, topic: str, envelope: Envelope) -> None:
        """A message on a retained topic from another front-end or node: into this node's log.

        A refusal (disk cap, I/O error) is counted per message and logged once per run of refusals.
        """
        try:
            self.log.append(topic, from_hub_payload(envelope.payload))
        except StreamLogError as e:
            reason = "disk_full" if isinstance(e, DiskFullError) else "log_error"
            self.hub.metrics.count(envelope.topic, SOURCE, "dropped", 1, 0, reason=reason)
            if not self._foreign_refused:
                log.error("stream log: cannot append to {topic}: {error}", topic=topic, error=str(e))
            self._foreign_refused += 1
            return
        if self._foreign_refused:
            log.info("stream log: appending again after {n} refused", n=self._foreign_refused)
            self._foreign_refused = 0
        self.schedule_flush()

    def readable(self, topic: str) -> int:
        """One past the last durable sequence of ``topic`` (what subscribers may read)."""
        return self._durable.get(topic, self.log.next_sequence(topic))

    def schedule_flush(self) -> None:
        """Sync at the end of this reactor turn (once, however many appends and acks wait for it)."""
        if self._flush_call is None:
            # Group commit: one sync at the end of this reactor turn covers every append made in it.
            self._flush_call = self.reactor.callLater(0, self._flush)

    def _flush(self) -> None:
        self._flush_call = None
        failed: str | None = None
        try:
            self.log.sync()
        except (OSError, StreamLogError) as e:
            failed = str(e)
            log.error("stream log: sync failed: {error}", error=failed)
        else:
            for topic in self.log.retained_topics():
                self._durable[topic] = self.log.next_sequence(topic)
        for connection in list(self.connections):
            connection.synced(failed)

    def _enforce_retention(self) -> None:
        try:
            self.log.enforce_retention()
        except (OSError, StreamLogError) as e:
            log.error("stream log: retention pass failed: {error}", error=str(e))

    def stats(self) -> dict[str, Any]:
        """Connections, retained topics, bytes cut at open."""
        return {
            "connections": len(self.connections),
            "retained_topics": len(self.log.retained_topics()),
            "recovered_bytes": self.log.recovered_bytes,
            "open_files": self.log.open_files,
            "disk_bytes": self.log.disk_bytes,
            "pending_bytes": self.pending_bytes,
        }


class StreamProtocol(Protocol):
    """One stream client connection."""

    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.decoder = codec.ServerDecoder(service.limits)
        self.client_name: str | None = None
        self.group_id: str | None = None
        self.cursors: dict[str, _Cursor] = {}
        #: Answers in request order: [bytes, durable?]; an undurable ack holds back those behind it.
        self._answers: deque[list[Any]] = deque()
        #: An open batch: (Count's n or None for Start..End, publishes accepted so far, publishes seen).
        self._batch: list[Any] | None = None
        self._paused = False
        self._closing = False
        #: Bytes of this connection's half-received request counted in the service's ``pending_bytes``.
        self._held = 0

    # -- connection ------------------------------------------------------------------

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Register as the transport's producer (pull delivery), refuse when the policy admits nobody."""
        set_no_delay(self.transport)
        self.service.connections.add(self)
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        if self.service.refuse_clients:
            self._error(codec.ErrorCode.NOT_AUTHORIZED, "not authorized: this node admits only authenticated clients")
            self._close()

    def connectionLost(self, reason: Failure = connectionDone) -> None:  # noqa: N802 - Twisted API
        """Forget the connection."""
        self.service.connections.discard(self)
        self._hold(0)
        self.cursors.clear()
        self._answers.clear()

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted API
        """The transport is full: stop reading the log and stop reading requests."""
        self._paused = True
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def resumeProducing(self) -> None:  # noqa: N802 - Twisted API
        """The transport drained: go on."""
        self._paused = False
        self.transport.resumeProducing()  # type: ignore[union-attr]
        self._pump()

    def stopProducing(self) -> None:  # noqa: N802 - Twisted API
        """The connection is going away."""
        self._paused = True

    # -- requests ----------------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Decode and handle every complete request."""
        if self._closing:
            return
        self.decoder.receive(data)
        try:
            for request in self.decoder.events():
                self._handle(request)
                if self._closing:
                    return
        except codec.StreamFramingError as e:
            log.info("stream client {peer}: {problem}; closing", peer=self._peer(), problem=e.message)
            self._error(e.code, e.message)
            self._close()
            return
        held = self.decoder.buffered
        if held != self._held:
            self._hold(held)
            service = self.service
            if held and service.pending_bytes > service.max_pending_bytes:
                self._error(
                    codec.ErrorCode.UNAVAILABLE,
                    f"node busy: half-received requests of all stream connections are over "
                    f"max-pending-bytes ({service.max_pending_bytes}); try again",
                )
                self._close()
                return
        self._drain()

    def _hold(self, held: int) -> None:
        """Count ``held`` bytes of half-received request for this connection (instead of the last count)."""
        self.service.pending_bytes += held - self._held
        self._held = held

    def _handle(self, request: codec.ClientRequest) -> None:
        if isinstance(request, codec.Close):
            self._close()
            return
        if isinstance(request, codec.Connect):
            if self.client_name is not None:
                self._error(codec.ErrorCode.NOT_CONNECTED, "already connected: Connect comes once, first")
                return
            self.client_name, self.group_id = request.client_name, request.group_id
            # Connected: the connection layer's handshake deadline is over (pubsubclub.net.edge).
            handshake_done(self.transport)
            self._ok()
            return
        if self.client_name is None:
            if isinstance(request, codec.Rejected) and request.topic is not None:
                self._count_dropped(request.topic, "not_connected")
            self._error(codec.ErrorCode.NOT_CONNECTED, "send Connect first")
            return
        if isinstance(request, codec.Rejected):
            if request.topic is not None:
                self._count_dropped(request.topic, "checksum" if request.code is codec.ErrorCode.CHECKSUM_MISMATCH
                                    else "rejected")  # fmt: skip
                self._batch_saw()
            self._error(request.code, request.message)
            return
        if isinstance(request, codec.Publish):
            self._publish(request)
        elif isinstance(request, codec.Batch):
            self._batch_header(request)
        elif isinstance(request, codec.Subscribe):
            self._subscribe(request)
        elif isinstance(request, codec.Unsubscribe):
            if self.cursors.pop(request.topic, None) is None:
                self._error(codec.ErrorCode.NOT_SUBSCRIBED, f"not subscribed to {request.topic!r}")
            else:
                self._ok()
        elif isinstance(request, codec.Commit):
            self._commit(request)

    def _publish(self, request: codec.Publish) -> None:
        service = self.service
        problem = service.topic_problem(request.topic, publish=True)
        if problem is not None:
            self._count_dropped(request.topic, "not_authorized")
            self._batch_saw()
            self._error(*problem)
            return
        try:
            service.publish(request.topic, request.payload)
        except TooLargeForLinks as e:
            self._refuse(request.topic, "too_large", codec.ErrorCode.TOO_LARGE, str(e))
            return
        except TopicLimitError as e:
            self._refuse(request.topic, "topic_limit", codec.ErrorCode.TOO_MANY_TOPICS, str(e))
            return
        except DiskFullError as e:
            self._refuse(request.topic, "disk_full", codec.ErrorCode.DISK_FULL, f"not stored: {e}")
            return
        except StreamLogError as e:
            self._refuse(request.topic, "log_error", codec.ErrorCode.UNAVAILABLE, f"not stored: {e}")
            return
        batch = self._batch
        if batch is None:
            self._answers.append([codec.encode(codec.Status(True)), False])
            return
        batch[1] += 1
        self._batch_saw()

    def _refuse(self, topic: str, reason: str, code: codec.ErrorCode, message: str) -> None:
        """A Publish that goes nowhere: counted as dropped, answered with an ERROR in its place."""
        self._count_dropped(topic, reason)
        self._batch_saw()
        self._error(code, message)

    def _batch_saw(self) -> None:
        batch = self._batch
        if batch is None:
            return
        batch[2] += 1
        if batch[0] is not None and batch[2] >= batch[0]:
            self._end_batch()

    def _batch_header(self, request: codec.Batch) -> None:
        if request.batch_type is codec.BatchType.END:
            if self._batch is None or self._batch[0] is not None:
                self._error(codec.ErrorCode.BAD_REQUEST, "Batch End without Batch Start")
                return
            self._end_batch()
            return
        if self._batch is not None:
            self._error(codec.ErrorCode.BAD_REQUEST, "a batch is already open")
            return
        self._batch = [request.count, 0, 0]

    def _end_batch(self) -> None:
        assert self._batch is not None
        accepted = self._batch[1]
        self._batch = None
        self._answers.append([codec.encode(codec.Status(True, count=accepted)), False])
        # Its publishes may have been synced in an earlier turn: a sync with nothing new is cheap.
        self.service.schedule_flush()

    def _subscribe(self, request: codec.Subscribe) -> None:
        service = self.service
        topic = request.topic
        problem = service.topic_problem(topic, publish=False)
        if problem is not None:
            self._error(*problem)
            return
        try:
            service.retain(topic)
        except TopicLimitError as e:
            self._error(codec.ErrorCode.TOO_MANY_TOPICS, str(e))
            return
        except StreamLogError as e:
            self._error(codec.ErrorCode.UNAVAILABLE, str(e))
            return
        first, end = service.log.first_sequence(topic), service.readable(topic)
        if request.position is codec.Position.EARLIEST:
            start = first
        elif request.position is codec.Position.LATEST:
            start = end
        elif request.position is codec.Position.CURRENT:
            assert self.group_id is not None
            committed = service.offsets.get(self.group_id, topic)
            start = first if committed is None else max(committed + 1, first)
        else:
            assert request.offset is not None
            start = max(request.offset, first)
        self.cursors[topic] = _Cursor(topic, start)
        self._ok()

    def _commit(self, request: codec.Commit) -> None:
        assert self.group_id is not None
        try:
            self.service.offsets.commit(self.group_id, request.topic, request.offset)
        except (ValueError, OSError) as e:
            self._error(codec.ErrorCode.BAD_REQUEST, f"Commit: {e}")
            return
        self._answer(codec.CommitAck(request.topic, request.offset, request.partition))

    # -- answers and messages ----------------------------------------------------------

    def _ok(self) -> None:
        self._answer(codec.Status(True))

    def _error(self, code: int, message: str) -> None:
        self._answer(codec.Status(False, code=int(code), message=message))

    def _answer(self, event: codec.ServerEvent) -> None:
        self._answers.append([codec.encode(event), True])

    def _count_dropped(self, topic: str, reason: str) -> None:
        self.service.hub.metrics.count(self.service.hub_topic(topic), SOURCE, "dropped", 1, 0, reason=reason)

    def synced(self, failed: str | None) -> None:
        """The log synced (or failed to): acks waiting for it may go, then new messages."""
        for answer in self._answers:
            if not answer[1]:
                if failed is not None:
                    answer[0] = codec.encode(codec.Status(False, code=int(codec.ErrorCode.UNAVAILABLE),
                                                          message=f"not durable: {failed}"))  # fmt: skip
                answer[1] = True
        self._drain()

    def _drain(self) -> None:
        """Send the answers that are ready, in order, then messages."""
        transport = self.transport
        if transport is None:
            return
        answers = self._answers
        while answers and answers[0][1]:
            transport.write(answers.popleft()[0])
        if self._closing and not answers:
            transport.loseConnection()
            return
        self._pump()

    def _pump(self) -> None:
        """Send messages from the cursors while the transport takes them."""
        if self._paused or self._closing or self.transport is None:
            return
        service = self.service
        metrics = service.hub.metrics
        progress = True
        while progress and not self._paused:
            progress = False
            for cursor in list(self.cursors.values()):
                end = service.readable(cursor.topic)
                if cursor.next >= end:
                    continue
                try:
                    records = service.log.read(cursor.topic, cursor.next, READ_BATCH_COUNT, READ_BATCH_BYTES)
                except StreamLogError as e:
                    log.error("stream log: cannot read {topic}: {error}", topic=cursor.topic, error=str(e))
                    continue
                hub_topic = service.hub_topic(cursor.topic)
                for record in records:
                    if record.sequence >= end:
                        break
                    self.transport.write(codec.encode(codec.Message(cursor.topic, record.sequence, record.payload)))
                    metrics.count(hub_topic, SOURCE, "delivered", 1, len(record.payload))
                    cursor.next = record.sequence + 1
                    progress = True
                    if self._paused:
                        break

    def _close(self) -> None:
        self._closing = True
        if self._batch is not None:
            self._batch = None
        self.cursors.clear()
        self.decoder.discard()
        self._hold(0)
        self._drain()

    def _peer(self) -> str:
        return str(self.transport.getPeer()) if self.transport is not None else "?"


class StreamFactory(Factory):
    """Builds :class:`StreamProtocol` for one :class:`StreamService`."""

    noisy = False

    def __init__(self, service: StreamService) -> None:
        self.service = service

    def buildProtocol(self, addr: Any) -> StreamProtocol:  # noqa: N802 - Twisted API
        """One connection."""
        protocol = StreamProtocol(self.service)
        protocol.factory = self
        return protocol


class StreamFrontend(Frontend):
    """``--stream ENDPOINT``: the stream protocol over TCP, backed by the node's log under data-dir/stream."""

    name = SOURCE

    def __init__(self, hub: Hub, config: NodeConfig, auth: AuthPolicy | None, reactor: Any) -> None:
        super().__init__()
        self._hub, self._config, self._auth, self._reactor = hub, config, auth, reactor
        self.service: StreamService | None = None

    async def listen(self) -> dict[str, str]:
        """Open the log, serve the stream protocol; its URL as ``stream``."""
        endpoint = self._config.stream.listen
        assert endpoint is not None
        self.service = StreamService(self._hub, self._config, self._auth, self._reactor)
        self.service.start()
        refusal = codec.encode(
            codec.Status(False, code=int(codec.ErrorCode.UNAVAILABLE), message="too many connections")
        )
        factory = self.guarded(self._config, "stream", StreamFactory(self.service), refusal)
        port = await serverFromString(self._reactor, endpoint).listen(factory)
        self._ports.append(port)
        host = port.getHost()
        return {"stream": f"tcp://{getattr(host, 'host', '127.0.0.1')}:{host.port}"}  # type: ignore[attr-defined]

    def close(self, reason: str) -> None:
        """Close every client connection (after the answers already queued)."""
        if self.service is not None:
            for connection in list(self.service.connections):
                connection.transport.loseConnection()  # type: ignore[union-attr]

    def finish(self) -> None:
        """Sync and close the log."""
        if self.service is not None:
            self.service.stop()

    def stats(self) -> dict[str, Any]:
        """Connections and the log."""
        return {} if self.service is None else self.service.stats()
