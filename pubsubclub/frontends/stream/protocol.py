"""The stream front-end (docs/specs/stream-protocol.md): Kafka-style clients on port 7878, over the node's durable log.

Wire handling is :mod:`pubsubclub.frontends.stream.codec` (sans-IO); storage is
:mod:`pubsubclub.frontends.stream.log`. The service and this module join them to the hub:

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

The node-wide part (log, retained topics and their hub sinks, group commit,
payloads on the hub) is :class:`~pubsubclub.frontends.stream.service.StreamService`
in :mod:`pubsubclub.frontends.stream.service`; here are one connection
(:class:`StreamProtocol`), its factory and the front-end. The service's names
(``StreamService``, ``TooLargeForLinks``, ``to_hub_payload``...) stay importable
from here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.config import StreamSection
from pubsubclub.core.counters import DropReason, Kind
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import FrontendBase, tcp_url
from pubsubclub.frontends.registry import FrontendContext
from pubsubclub.frontends.stream import codec
from pubsubclub.frontends.stream.log import (
    DiskFullError,
    StreamLogError,
    TopicLimitError,
)
from pubsubclub.frontends.stream.service import (  # noqa: F401 (re-exported: the service's names, by their old path)
    RETENTION_INTERVAL,
    SOURCE,
    StreamService,
    TooLargeForLinks,
    from_hub_payload,
    hub_payload_json_bytes,
    to_hub_payload,
)
from pubsubclub.net.edge import handshake_done
from pubsubclub.net.nodelay import set_no_delay

log = Logger()

#: Records read from the log per step of one cursor (and at most this many bytes).
READ_BATCH_COUNT = 256
READ_BATCH_BYTES = 1024 * 1024


@dataclass
class _Cursor:
    """One subscription: the next sequence to send."""

    topic: str
    next: int


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
                self._count_dropped(request.topic, DropReason.NOT_CONNECTED)
            self._error(codec.ErrorCode.NOT_CONNECTED, "send Connect first")
            return
        if isinstance(request, codec.Rejected):
            if request.topic is not None:
                self._count_dropped(
                    request.topic,
                    DropReason.CHECKSUM if request.code is codec.ErrorCode.CHECKSUM_MISMATCH else DropReason.REJECTED,
                )
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
            self._count_dropped(request.topic, DropReason.NOT_AUTHORIZED)
            self._batch_saw()
            self._error(*problem)
            return
        try:
            service.publish(request.topic, request.payload)
        except TooLargeForLinks as e:
            self._refuse(request.topic, DropReason.TOO_LARGE, codec.ErrorCode.TOO_LARGE, str(e))
            return
        except TopicLimitError as e:
            self._refuse(request.topic, DropReason.TOPIC_LIMIT, codec.ErrorCode.TOO_MANY_TOPICS, str(e))
            return
        except DiskFullError as e:
            self._refuse(request.topic, DropReason.DISK_FULL, codec.ErrorCode.DISK_FULL, f"not stored: {e}")
            return
        except StreamLogError as e:
            self._refuse(request.topic, DropReason.LOG_ERROR, codec.ErrorCode.UNAVAILABLE, f"not stored: {e}")
            return
        batch = self._batch
        if batch is None:
            self._answers.append([codec.encode(codec.Status(True)), False])
            return
        batch[1] += 1
        self._batch_saw()

    def _refuse(self, topic: str, reason: DropReason, code: codec.ErrorCode, message: str) -> None:
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

    def _count_dropped(self, topic: str, reason: DropReason) -> None:
        self.service.hub.metrics.count(self.service.hub_topic(topic), SOURCE, Kind.DROPPED, 1, 0, reason=reason)

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
                    metrics.count(hub_topic, SOURCE, Kind.DELIVERED, 1, len(record.payload))
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


class StreamFrontend(FrontendBase):
    """``--stream ENDPOINT``: the stream protocol over TCP, backed by the node's log under data-dir/stream."""

    name: str = SOURCE

    def __init__(self, hub: Hub, section: StreamSection, context: FrontendContext) -> None:
        super().__init__(context)
        self._hub, self.section, self._reactor = hub, section, context.reactor
        self.service: StreamService | None = None

    async def listen(self) -> dict[str, str]:
        """Open the log, serve the stream protocol; its URL as ``stream``."""
        endpoint = self.section.listen
        assert endpoint is not None and self.context is not None
        self.service = StreamService(self._hub, self.section, self.context)
        self.service.start()
        refusal = codec.encode(
            codec.Status(False, code=int(codec.ErrorCode.UNAVAILABLE), message="too many connections")
        )
        factory = self.guarded("stream", StreamFactory(self.service), refusal)
        port = await serverFromString(self._reactor, endpoint).listen(factory)
        self._ports.append(port)
        return {"stream": tcp_url(port)}

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
