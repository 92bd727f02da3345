"""The stream front-end's node-wide state: the log, retained topics and their hub sinks, group commit.

:class:`StreamService` is what every stream connection
(:class:`~pubsubclub.frontends.stream.protocol.StreamProtocol`) shares: the
durable log and committed offsets, one hub sink per retained topic (appending what
others publish to this node's log), the group commit (one ``sync`` per reactor
turn, then each waiting connection's ``synced``), the retention timer and the
node-wide caps. docs/stream.md and :mod:`pubsubclub.frontends.stream.protocol`
say how they behave.

Payload bytes on the hub (docs/protocol-mapping.md): UTF-8 text becomes a JSON
string; other bytes (and text starting with NUL) become WAMP's binary-in-JSON
form, ``"\\u0000" + base64``, which Autobahn JSON clients decode to bytes.
Back to bytes: a string is its UTF-8 (the binary form decoded), any other
JSON value its compact JSON text.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING, Any

import orjson
from twisted.internet import task
from twisted.logger import Logger

from pubsubclub.config import StreamSection
from pubsubclub.core import binaryjson
from pubsubclub.core.counters import DropReason, Kind, Source
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.federation import psc
from pubsubclub.frontends.registry import FrontendContext
from pubsubclub.frontends.stream import codec
from pubsubclub.frontends.stream.log import (
    DiskFullError,
    LogSettings,
    OffsetStore,
    StreamLog,
    StreamLogError,
)
from pubsubclub.frontends.wamp.auth import Role

if TYPE_CHECKING:
    from pubsubclub.frontends.stream.protocol import StreamProtocol

log = Logger()


#: Seconds between retention passes over the log.
RETENTION_INTERVAL = 60.0
#: The front-end's name in metrics and URLs.
SOURCE = Source.STREAM


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


class StreamService:
    """The node's stream state: the log, committed offsets, topic sinks, group commit, connections."""

    def __init__(self, hub: Hub, section: StreamSection, context: FrontendContext) -> None:
        reactor = context.reactor
        self.hub = hub
        self.reactor = reactor
        self.prefix = section.prefix
        #: The largest PSC frame a link carries; every stream publish must fit one as a PSC301.
        self.link_limit = context.max_message_size
        self.limits = codec.Limits(
            max_header_bytes=section.max_header_bytes,
            # A payload of more bytes than a link frame can never fit one: refused at its header.
            max_payload_bytes=min(section.max_payload_bytes, self.link_limit),
            # A topic is a log folder name too: 256 characters stay within the log's 1024 bytes.
            max_topic_length=256,
            json=context.json,
        )
        directory = os.path.join(context.data_dir, "stream")
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
        auth = context.auth
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
        self.hub.metrics.count(hub_topic, SOURCE, Kind.PUBLISHED, 1, len(payload))
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
            reason = DropReason.DISK_FULL if isinstance(e, DiskFullError) else DropReason.LOG_ERROR
            self.hub.metrics.count(envelope.topic, SOURCE, Kind.DROPPED, 1, 0, reason=reason)
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
