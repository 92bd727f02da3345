"""The stream protocol's wire format (docs/specs/stream-protocol.md), sans-IO: the decoders, and every name by one path.

A stream is a sequence of JSON headers, each a single object, some followed by
raw payload bytes (``Publish`` from a client, ``Message`` from the server,
``payload_size`` bytes each). Whitespace between frames is skipped. Three parts:

- :mod:`~pubsubclub.frontends.stream.messages`: the limits, error codes, the
  typed requests and answers, and :func:`encode`.
- :mod:`~pubsubclub.frontends.stream.framing`: :class:`HeaderScanner`, which finds
  where a header ends by counting brackets while tracking JSON strings and their
  escapes, and the header's parsing within bounds.
- here: :class:`ServerDecoder` turns client bytes into typed requests;
  :class:`ClientDecoder` is the mirror image, for clients (the bench, the tests).

Every name of the three is importable from here (``from
pubsubclub.frontends.stream import codec as c`` is how users write it). Nothing
here imports Twisted.

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
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pubsubclub.core import jsonbounds
from pubsubclub.frontends.stream.framing import HeaderScanner, _parse_header
from pubsubclub.frontends.stream.messages import (
    DEFAULT_LIMITS,
    DEFAULT_PORT,
    Batch,
    BatchType,
    ClientRequest,
    Close,
    Commit,
    CommitAck,
    Connect,
    ErrorCode,
    Limits,
    Message,
    Position,
    Publish,
    Rejected,
    ServerEvent,
    Status,
    StreamFramingError,
    Subscribe,
    Unsubscribe,
    encode,
    sha1_hex,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_PORT",
    "Batch",
    "BatchType",
    "ClientDecoder",
    "ClientRequest",
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
    "ServerEvent",
    "Status",
    "StreamFramingError",
    "Subscribe",
    "Unsubscribe",
    "encode",
    "sha1_hex",
]

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
