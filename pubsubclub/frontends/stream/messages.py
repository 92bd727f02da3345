"""The stream protocol's messages: limits, error codes, requests and answers, and their encoder.

Frozen dataclasses, one per header: the client's requests (:data:`ClientRequest`)
and the server's answers (:data:`ServerEvent`); :func:`encode` writes either as
bytes. The decoders are in :mod:`pubsubclub.frontends.stream.codec`, which
re-exports every name here.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.core import jsonbounds
from pubsubclub.core.jsonbounds import JSONBounds

#: The port the spec names as the default.
DEFAULT_PORT = 7878


@dataclass(frozen=True)
class Limits:
    """Named limits on what a client may send."""

    #: Longest JSON header, in bytes.
    max_header_bytes: int = 16 * 1024
    #: Largest payload of one Publish, in bytes.
    max_payload_bytes: int = 1024 * 1024
    #: Longest topic, in characters.
    max_topic_length: int = 512
    #: Longest client_name or group_id, in characters.
    max_name_length: int = 256
    #: Most messages announced by one ``Batch`` of type ``Count``.
    max_batch_count: int = 100_000
    #: Depth, integers, floats and strings of every header (docs/security.md).
    json: JSONBounds = jsonbounds.DEFAULT_BOUNDS

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_payload_bytes", "max_topic_length", "max_name_length", "max_batch_count"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"stream Limits.{name} must be a positive int, not {value!r}")


DEFAULT_LIMITS = Limits()


class ErrorCode(enum.IntEnum):
    """The ``code`` of an ERROR status (the spec leaves the numbers open; docs/stream.md lists them)."""

    #: Not a valid header, a missing or wrong field.
    BAD_REQUEST = 400
    #: Anything before ``Connect``, or a second ``Connect``.
    NOT_CONNECTED = 401
    #: The role may not publish or subscribe to this topic.
    NOT_AUTHORIZED = 403
    #: ``Unsubscribe`` of a topic not subscribed, ``Current`` with nothing committed is fine (not this).
    NOT_SUBSCRIBED = 404
    #: A header or payload over its limit, or a payload too large for the cluster's links.
    TOO_LARGE = 413
    #: The payload's sha1 is not the header's ``checksum``.
    CHECKSUM_MISMATCH = 422
    #: A new topic past the node's topic cap (``[stream] max-topics``).
    TOO_MANY_TOPICS = 429
    #: The server could not store the message (an I/O error), or the node is busy (half-received requests).
    UNAVAILABLE = 503
    #: The node's stream log is at its disk cap (``[stream] max-disk-bytes``) and retention cannot free space.
    DISK_FULL = 507


class StreamFramingError(ValueError):
    """The client's byte stream cannot be followed any more; answer ERROR and close."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# -- messages ------------------------------------------------------------------------------------


class Position(enum.Enum):
    """Where a subscription starts."""

    #: The oldest message the node's log still holds.
    EARLIEST = "Earliest"
    #: Only messages appended after the subscription.
    LATEST = "Latest"
    #: After the group's committed offset (Earliest when nothing is committed).
    CURRENT = "Current"
    #: At the message whose sequence is ``offset``.
    OFFSET = "Offset"


class BatchType(enum.Enum):
    """The three kinds of ``Batch`` header."""

    COUNT = "Count"
    START = "Start"
    END = "End"


@dataclass(frozen=True, slots=True)
class Connect:
    """The first request: who the client is, and the group whose offsets it commits."""

    client_name: str
    group_id: str


@dataclass(frozen=True, slots=True)
class Publish:
    """One message to publish; its checksum has been verified."""

    topic: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Batch:
    """``Batch`` header: Count (``count`` Publish follow), Start or End."""

    batch_type: BatchType
    count: int | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Start receiving ``topic`` from ``position`` (``offset`` only with Offset)."""

    topic: str
    position: Position
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Stop receiving ``topic``."""

    topic: str


@dataclass(frozen=True, slots=True)
class Commit:
    """Record ``offset`` as the group's committed offset of ``topic``."""

    topic: str
    offset: int
    partition: int = 0


@dataclass(frozen=True, slots=True)
class Close:
    """``{"status": "CLOSE"}``: the client is leaving."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A whole frame that is not a valid request; answer ERROR and carry on."""

    code: ErrorCode
    message: str
    #: Set when the rejected frame was a Publish (its payload was consumed and dropped).
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """The server's answer: OK (with ``count`` after a batch) or ERROR."""

    ok: bool
    count: int | None = None
    code: int | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message (server to client)."""

    topic: str
    sequence: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class CommitAck:
    """The server recorded ``offset`` for ``topic``."""

    topic: str
    offset: int
    partition: int = 0


ClientRequest = Connect | Publish | Batch | Subscribe | Unsubscribe | Commit | Close | Rejected
ServerEvent = Status | Message | CommitAck


def sha1_hex(payload: bytes) -> str:
    """The checksum the spec asks for: sha1 of the payload bytes, lowercase hex."""
    return hashlib.sha1(payload).hexdigest()  # noqa: S324 - the protocol's integrity check, not security


# -- encoding --------------------------------------------------------------------------------------


def encode(event: ServerEvent | ClientRequest) -> bytes:
    """The wire bytes of a server answer or a client request (header, then payload if any)."""
    if isinstance(event, Status):
        body: dict[str, Any] = {"status": "OK" if event.ok else "ERROR"}
        if event.ok and event.count is not None:
            body["count"] = event.count
        if not event.ok:
            body["code"] = event.code
            body["message"] = event.message
        return orjson.dumps({"Status": body})
    if isinstance(event, Message):
        header = {
            "topic": event.topic,
            "sequence": event.sequence,
            "payload_size": len(event.payload),
            "checksum": sha1_hex(event.payload),
        }
        return orjson.dumps({"Message": header}) + event.payload
    if isinstance(event, CommitAck):
        return orjson.dumps({"CommitAck": {"topic": event.topic, "partition": event.partition, "offset": event.offset}})
    if isinstance(event, Connect):
        return orjson.dumps({"Connect": {"client_name": event.client_name, "group_id": event.group_id}})
    if isinstance(event, Publish):
        header = {"topic": event.topic, "payload_size": len(event.payload), "checksum": sha1_hex(event.payload)}
        return orjson.dumps({"Publish": header}) + event.payload
    if isinstance(event, Batch):
        batch: dict[str, Any] = {"batch_type": event.batch_type.value}
        if event.count is not None:
            batch["count"] = event.count
        return orjson.dumps({"Batch": batch})
    if isinstance(event, Subscribe):
        sub: dict[str, Any] = {"topic": event.topic, "position": event.position.value}
        if event.offset is not None:
            sub["offset"] = event.offset
        return orjson.dumps({"Subscribe": sub})
    if isinstance(event, Unsubscribe):
        return orjson.dumps({"Unsubscribe": {"topic": event.topic}})
    if isinstance(event, Commit):
        commit = {"topic": event.topic, "partition": event.partition, "commit_offset": event.offset}
        return orjson.dumps({"Commit": commit})
    if isinstance(event, Close):
        return b'{"status": "CLOSE"}'
    raise TypeError(f"not a stream protocol message: {event!r}")
