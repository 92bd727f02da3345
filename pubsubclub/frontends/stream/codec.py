"""The stream protocol's wire format (docs/specs/stream-protocol.md), sans-IO.

A stream is a sequence of JSON headers, each a single object, some followed by
raw payload bytes (``Publish`` from a client, ``Message`` from the server,
``payload_size`` bytes each). The spec finds the end of a header "by counting
brackets"; :class:`HeaderScanner` does that while tracking JSON strings and
their escapes, so a ``}`` or a quote inside a topic, or a payload that begins
with ``{``, never ends or starts a header early. Whitespace between frames is
skipped.

:class:`ServerDecoder` turns client bytes into typed requests; the server's
answers are encoded by :func:`encode`. :class:`ClientDecoder` is the mirror
image, for clients (the bench, the tests). Nothing here imports Twisted.

Errors come in two kinds:

- :class:`StreamFramingError`: the byte stream cannot be followed any more (a
  header that is not a JSON object, too long, a ``Publish`` whose payload size
  is unusable). The server answers an ERROR status and closes.
- :class:`Rejected`, an *event*: the frame was read whole but is not a valid
  request (an unknown header, a bad field, a checksum mismatch). The server
  answers an ERROR status and goes on; the stream is still in step.

Headers are case-sensitive, as the spec says. One leniency: a comma before a
closing ``}`` or ``]`` (outside strings) is accepted, because the spec's own
``Unsubscribe`` example has one.

Why one long module: it is the stream protocol's whole wire format, encoder and decoders, sans-IO.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.core import jsonbounds
from pubsubclub.core.jsonbounds import BoundsError, JSONBounds

__all__ = [
    "DEFAULT_LIMITS",
    "Batch",
    "BatchType",
    "ClientDecoder",
    "Close",
    "Commit",
    "CommitAck",
    "Connect",
    "ErrorCode",
    "HeaderScanner",
    "Limits",
    "Message",
    "Position",
    "Publish",
    "Rejected",
    "ServerDecoder",
    "Status",
    "StreamFramingError",
    "Subscribe",
    "Unsubscribe",
    "encode",
    "sha1_hex",
]

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


# -- framing ---------------------------------------------------------------------------------------

_WHITESPACE = b" \t\r\n"
_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")
_QUOTE = ord('"')
_BACKSLASH = ord("\\")
#: A comma, optional whitespace, then a closing bracket (only applied outside strings, see _lenient).
_TRAILING_COMMA = re.compile(rb",(\s*[}\]])")


class HeaderScanner:
    """Finds where a JSON header ends by counting brackets outside strings; incremental."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._depth = 0
        self._in_string = False
        self._escaped = False
        #: A comma outside strings was seen (the lenient retry is only worth it then).
        self.saw_comma = False

    def feed(self, data: bytes | bytearray | memoryview, start: int) -> int | None:
        """Scan ``data[start:]``; the index just past the header's end, or None when more is needed.

        Leading whitespace is skipped; the first other byte must be ``{``.
        """
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        buf = self._buf
        i, end = start, len(data)
        while i < end:
            byte = data[i]
            i += 1
            if not buf:
                if byte in _WHITESPACE:
                    continue
                if byte != 0x7B:  # "{"
                    raise StreamFramingError(
                        ErrorCode.BAD_REQUEST, f"expected a JSON header starting with '{{', got {bytes([byte])!r}"
                    )
            buf.append(byte)
            if in_string:
                if escaped:
                    escaped = False
                elif byte == _BACKSLASH:
                    escaped = True
                elif byte == _QUOTE:
                    in_string = False
            elif byte == _QUOTE:
                in_string = True
            elif byte in _OPEN:
                depth += 1
            elif byte in _CLOSE:
                depth -= 1
                if depth == 0:
                    self._depth, self._in_string, self._escaped = 0, False, False
                    return i
            elif byte == 0x2C:  # ","
                self.saw_comma = True
            if len(buf) > self._max:
                raise StreamFramingError(ErrorCode.TOO_LARGE, f"header longer than {self._max} bytes")
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        return None

    def take(self) -> bytes:
        """The header scanned so far (call after :meth:`feed` returned an index); resets the scanner."""
        header = bytes(self._buf)
        self._buf.clear()
        self.saw_comma = False
        return header

    @property
    def idle(self) -> bool:
        """No header is half read."""
        return not self._buf

    @property
    def pending(self) -> int:
        """Bytes of the header half read."""
        return len(self._buf)

    def clear(self) -> None:
        """Forget a half-read header."""
        self._buf.clear()
        self._depth, self._in_string, self._escaped = 0, False, False
        self.saw_comma = False


def _lenient(header: bytes) -> bytes:
    """``header`` without commas that directly precede a closing bracket, outside strings."""
    out = bytearray()
    in_string = escaped = False
    pending_comma = -1
    for byte in header:
        if in_string:
            if escaped:
                escaped = False
            elif byte == _BACKSLASH:
                escaped = True
            elif byte == _QUOTE:
                in_string = False
            out.append(byte)
            continue
        if byte in _CLOSE and pending_comma >= 0:
            del out[pending_comma]
        if byte == 0x2C:
            pending_comma = len(out)
        elif byte not in _WHITESPACE:
            pending_comma = -1
        if byte == _QUOTE:
            in_string = True
        out.append(byte)
    return bytes(out)


def _parse_header(header: bytes, bounds: JSONBounds, lenient: bool) -> dict[str, Any]:
    try:
        value = jsonbounds.loads(header, bounds)
    except BoundsError as e:
        raise StreamFramingError(ErrorCode.BAD_REQUEST, f"header out of bounds: {e}") from None
    except ValueError:
        value = None
        if lenient:
            try:
                value = jsonbounds.loads(_lenient(header), bounds)
            except ValueError:
                value = None
        if value is None:
            raise StreamFramingError(ErrorCode.BAD_REQUEST, "header is not valid JSON") from None
    if not isinstance(value, dict):
        raise StreamFramingError(ErrorCode.BAD_REQUEST, "header is not a JSON object")
    return value


#: C0 and C1 control characters: never part of a topic or a name.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class _Reject(Exception):
    """A field problem in a frame read whole (becomes a :class:`Rejected` event)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    if name not in body:
        raise _Reject(ErrorCode.BAD_REQUEST, f"{what}: missing {name!r}")
    value = body[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Reject(ErrorCode.BAD_REQUEST, f"{what}: {name!r} has the wrong type")
    return value


def _text(body: dict[str, Any], name: str, what: str, limit: int) -> str:
    value = _field(body, name, str, what)
    if not value:
        raise _Reject(ErrorCode.BAD_REQUEST, f"{what}: {name!r} is empty")
    if len(value) > limit:
        raise _Reject(ErrorCode.TOO_LARGE, f"{what}: {name!r} longer than {limit} characters")
    if _CONTROL.search(value):
        raise _Reject(ErrorCode.BAD_REQUEST, f"{what}: {name!r} holds control characters")
    return value


def _count(body: dict[str, Any], name: str, what: str) -> int:
    value = _field(body, name, int, what)
    if value < 0:
        raise _Reject(ErrorCode.BAD_REQUEST, f"{what}: {name!r} is negative")
    return int(value)


def _body(header: dict[str, Any], name: str) -> dict[str, Any]:
    body = header[name]
    if not isinstance(body, dict):
        raise _Reject(ErrorCode.BAD_REQUEST, f"{name}: the value must be an object")
    return body


class ServerDecoder:
    """Client bytes in, requests out: ``receive(data)`` then iterate :meth:`events`."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._scanner = HeaderScanner(limits.max_header_bytes)
        self._buf = bytearray()
        #: (topic or None if rejected, payload size, checksum, rejection) while reading a payload.
        self._payload: tuple[str | None, int, str, _Reject | None] | None = None
        self._failed: StreamFramingError | None = None

    def receive(self, data: bytes) -> None:
        """Buffer bytes from the client."""
        self._buf += data

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded: a half header or a half payload (what a connection holds)."""
        return len(self._buf) + self._scanner.pending

    def discard(self) -> None:
        """Drop whatever is buffered (the connection is closing); later bytes are still buffered."""
        self._buf = bytearray()
        self._scanner.clear()

    def events(self) -> Iterator[ClientRequest]:
        """Every complete request buffered so far; raises :class:`StreamFramingError` once the stream is lost."""
        if self._failed is not None:
            raise self._failed
        try:
            yield from self._events()
        except StreamFramingError as e:
            self._failed = e
            self._buf.clear()
            raise

    def _events(self) -> Iterator[ClientRequest]:
        buf = self._buf
        pos = 0
        try:
            while True:
                if self._payload is not None:
                    topic, size, checksum, rejection = self._payload
                    if len(buf) - pos < size:
                        return
                    payload = bytes(buf[pos : pos + size])
                    pos += size
                    self._payload = None
                    if rejection is not None:
                        yield Rejected(rejection.code, rejection.message, topic)
                    elif sha1_hex(payload) != checksum:
                        yield Rejected(ErrorCode.CHECKSUM_MISMATCH, "checksum is not the sha1 of the payload", topic)
                    else:
                        assert topic is not None
                        yield Publish(topic, payload)
                    continue
                end = self._scanner.feed(buf, pos)
                if end is None:
                    pos = len(buf)
                    return
                pos = end
                lenient = self._scanner.saw_comma
                yield from self._request(_parse_header(self._scanner.take(), self.limits.json, lenient))
        finally:
            del buf[:pos]

    def _request(self, header: dict[str, Any]) -> Iterator[ClientRequest]:
        if header == {"status": "CLOSE"}:
            yield Close()
            return
        if len(header) != 1:
            yield Rejected(ErrorCode.BAD_REQUEST, "a header holds exactly one request")
            return
        (name,) = header
        if name == "Publish":
            # Framing depends on payload_size: a Publish whose size cannot be used loses the stream.
            body = header[name]
            size = body.get("payload_size") if isinstance(body, dict) else None
            if type(size) is not int or size < 0:
                raise StreamFramingError(
                    ErrorCode.BAD_REQUEST, "Publish: 'payload_size' must be a non-negative integer"
                )
            if size > self.limits.max_payload_bytes:
                raise StreamFramingError(
                    ErrorCode.TOO_LARGE, f"Publish: payload of {size} bytes, limit is {self.limits.max_payload_bytes}"
                )
            topic: str | None = None
            checksum = ""
            rejection: _Reject | None = None
            try:
                topic = _text(body, "topic", "Publish", self.limits.max_topic_length)
                checksum = _field(body, "checksum", str, "Publish").lower()
                if not re.fullmatch(r"[0-9a-f]{40}", checksum):
                    raise _Reject(ErrorCode.BAD_REQUEST, "Publish: 'checksum' must be 40 hex digits (sha1)")
            except _Reject as e:
                rejection = e
            self._payload = (topic, size, checksum, rejection)
            return
        try:
            yield self._simple(name, header)
        except _Reject as e:
            yield Rejected(e.code, e.message)

    def _simple(self, name: str, header: dict[str, Any]) -> ClientRequest:
        limits = self.limits
        if name == "Connect":
            body = _body(header, name)
            return Connect(
                _text(body, "client_name", name, limits.max_name_length),
                _text(body, "group_id", name, limits.max_name_length),
            )
        if name == "Batch":
            body = _body(header, name)
            raw = _field(body, "batch_type", str, name)
            try:
                batch_type = BatchType(raw)
            except ValueError:
                raise _Reject(ErrorCode.BAD_REQUEST, "Batch: 'batch_type' must be Count, Start or End") from None
            if batch_type is not BatchType.COUNT:
                return Batch(batch_type)
            count = _count(body, "count", name)
            if not 1 <= count <= limits.max_batch_count:
                raise _Reject(ErrorCode.TOO_LARGE, f"Batch: 'count' must be between 1 and {limits.max_batch_count}")
            return Batch(batch_type, count)
        if name == "Subscribe":
            body = _body(header, name)
            topic = _text(body, "topic", name, limits.max_topic_length)
            raw = _field(body, "position", str, name)
            try:
                position = Position(raw)
            except ValueError:
                raise _Reject(
                    ErrorCode.BAD_REQUEST, "Subscribe: 'position' must be Earliest, Latest, Current or Offset"
                ) from None
            offset = _count(body, "offset", name) if position is Position.OFFSET else None
            return Subscribe(topic, position, offset)
        if name == "Unsubscribe":
            return Unsubscribe(_text(_body(header, name), "topic", name, limits.max_topic_length))
        if name == "Commit":
            body = _body(header, name)
            topic = _text(body, "topic", name, limits.max_topic_length)
            partition = _count(body, "partition", name) if "partition" in body else 0
            return Commit(topic, _count(body, "commit_offset", name), partition)
        raise _Reject(ErrorCode.BAD_REQUEST, f"unknown request {name[:40]!r} (headers are case-sensitive)")


class ClientDecoder:
    """Server bytes in, answers and messages out (for clients: the bench, the tests)."""

    def __init__(self, max_header_bytes: int = 64 * 1024, max_payload_bytes: int = 64 * 1024 * 1024) -> None:
        self._scanner = HeaderScanner(max_header_bytes)
        self._max_payload = max_payload_bytes
        self._buf = bytearray()
        self._pending: tuple[str, int, int, str] | None = None

    def receive(self, data: bytes) -> None:
        """Buffer bytes from the server."""
        self._buf += data

    def events(self) -> Iterator[ServerEvent]:
        """Every complete answer or message buffered so far."""
        buf = self._buf
        pos = 0
        try:
            while True:
                if self._pending is not None:
                    topic, sequence, size, checksum = self._pending
                    if len(buf) - pos < size:
                        return
                    payload = bytes(buf[pos : pos + size])
                    pos += size
                    self._pending = None
                    if sha1_hex(payload) != checksum:
                        raise StreamFramingError(
                            ErrorCode.CHECKSUM_MISMATCH, f"message {sequence} on {topic!r}: bad sha1"
                        )
                    yield Message(topic, sequence, payload)
                    continue
                end = self._scanner.feed(buf, pos)
                if end is None:
                    pos = len(buf)
                    return
                pos = end
                header = _parse_header(self._scanner.take(), jsonbounds.DEFAULT_BOUNDS, False)
                event = self._answer(header)
                if event is not None:
                    yield event
        finally:
            del buf[:pos]

    def _answer(self, header: dict[str, Any]) -> ServerEvent | None:
        if "Status" in header and isinstance(header["Status"], dict):
            body = header["Status"]
            if body.get("status") == "OK":
                return Status(True, count=body.get("count"))
            return Status(False, code=body.get("code"), message=body.get("message"))
        if "CommitAck" in header and isinstance(header["CommitAck"], dict):
            body = header["CommitAck"]
            return CommitAck(body["topic"], body["offset"], body.get("partition", 0))
        if "Message" in header and isinstance(header["Message"], dict):
            body = header["Message"]
            size = body.get("payload_size")
            if type(size) is not int or not 0 <= size <= self._max_payload:
                raise StreamFramingError(ErrorCode.BAD_REQUEST, "Message: bad 'payload_size'")
            self._pending = (body["topic"], body["sequence"], size, str(body["checksum"]).lower())
            return None
        raise StreamFramingError(ErrorCode.BAD_REQUEST, f"unknown server header {list(header)[:3]}")
