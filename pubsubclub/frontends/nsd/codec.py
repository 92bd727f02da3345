"""NSD publish/subscribe protocol codec (sans-IO: no Twisted, no sockets).

``docs/specs/nsd-protocol.html``: one JSON object per line, every object has a
``_class``. :class:`LineFramer` cuts a byte stream into lines with a hard cap
that never buffers more than the cap; :func:`decode_request` turns one line
into a request dataclass or raises :class:`NSDRequestError`, whose
:attr:`~NSDRequestError.error` is the spec's ``INVALID REQUEST: <line>`` text;
the ``encode_*`` functions produce response lines.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Any, Union

import orjson

from pubsubclub.core import jsonbounds

#: ``_class`` of a message object.
MESSAGE_CLASS = "Message"


class NSDRequestError(ValueError):
    """A line that is not a valid request; ``error`` is the text sent back."""

    def __init__(self, line: str, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.error = f"INVALID REQUEST: {line}"


@dataclass(frozen=True)
class NSDLimits:
    """Named limits for NSD input."""

    #: Largest message accepted by Publish, in characters of its compact JSON text.
    max_message_chars: int = 65_536
    #: Longest request line buffered, in bytes; longer lines are answered and discarded.
    max_line_bytes: int = 1024 * 1024
    #: Longest identity/channel name, in characters.
    max_name_chars: int = 256
    #: Most messages one Get returns (the newest are kept if there are more).
    max_get_messages: int = 10_000
    #: Depth, integer range, floats and strings of every request (docs/security.md).
    json: jsonbounds.JSONBounds = jsonbounds.DEFAULT_BOUNDS


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """Open: establish identity, create its channel, subscribe to it."""

    identity: str


@dataclass(frozen=True, slots=True)
class PublishRequest:
    """Publish ``message`` (a Message object, extra fields kept) on the identity's channel."""

    identity: str
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """Subscribe the identity to ``channel``."""

    identity: str
    channel: str


@dataclass(frozen=True, slots=True)
class UnsubscribeRequest:
    """Unsubscribe the identity from ``channel``."""

    identity: str
    channel: str


@dataclass(frozen=True, slots=True)
class GetRequest:
    """Messages of the identity's channels published strictly after ``after``."""

    identity: str
    after: int


Request = Union[OpenRequest, PublishRequest, SubscribeRequest, UnsubscribeRequest, GetRequest]


# -- framing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """One complete request line (without its newline)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class OversizeLine:
    """A line longer than the cap: it was discarded; ``chars`` characters long."""

    chars: int


class LineFramer:
    """Cuts bytes into lines; never holds more than ``max_line_bytes``."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._buffer = b""
        #: Discarding an oversize line: characters counted so far, else None.
        self._discarding: int | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    @property
    def pending(self) -> int:
        """Bytes of an unfinished line held in memory."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[Line | OversizeLine]:
        """Add bytes; return the lines (and oversize reports) they complete."""
        out: list[Line | OversizeLine] = []
        while data:
            newline = data.find(b"\n")
            chunk, data = (data, b"") if newline < 0 else (data[:newline], data[newline + 1 :])
            if self._discarding is not None:
                self._discarding += len(self._decoder.decode(chunk))
            elif len(self._buffer) + len(chunk) > self._max:
                self._decoder.reset()
                self._discarding = len(self._decoder.decode(self._buffer + chunk))
                self._buffer = b""
            else:
                self._buffer += chunk
            if newline < 0:
                break
            if self._discarding is not None:
                self._discarding += len(self._decoder.decode(b"", final=True))
                out.append(OversizeLine(self._discarding))
                self._discarding = None
                self._decoder.reset()
            else:
                line, self._buffer = self._buffer, b""
                out.append(Line(line[:-1] if line.endswith(b"\r") else line))
        return out


# -- requests -----------------------------------------------------------------------


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace")


def name_problem(value: Any, field: str, limits: NSDLimits) -> str | None:
    """Why ``value`` cannot be an identity or channel name, or None if it can."""
    if not isinstance(value, str):
        return f"{field} must be a string"
    if not value or len(value) > limits.max_name_chars:
        return f"{field} must be 1-{limits.max_name_chars} characters"
    if any(ord(c) < 32 for c in value):
        return f"{field} must not contain control characters"
    if value.startswith("$"):
        return f"{field} must not start with '$' (reserved for the cluster)"
    return None


def _name(value: Any, field: str, line: str, limits: NSDLimits) -> str:
    problem = name_problem(value, field, limits)
    if problem is not None:
        raise NSDRequestError(line, problem)
    return str(value)


def stored_message_problem(message: Any, when: int, limits: NSDLimits) -> str | None:
    """Why ``message`` cannot be a stored Message with ``when``, or None if it can.

    What NSD stores and replicates: an object with ``_class`` Message, string
    ``from`` and ``body``, the record's ``when``, and nothing beyond the JSON
    bounds. Used on every record that comes from another node or from disk.
    """
    if not isinstance(message, dict):
        return "message is not an object"
    if message.get("_class") != MESSAGE_CLASS:
        return "message _class is not Message"
    if not isinstance(message.get("from"), str) or not isinstance(message.get("body"), str):
        return "message from and body must be strings"
    if message.get("when") != when or type(message.get("when")) is not int:
        return "message when does not match its record"
    try:
        jsonbounds.check(message, limits.json)
    except jsonbounds.BoundsError as e:
        return f"message out of bounds: {e}"
    return None


def decode_request(line: bytes, limits: NSDLimits = NSDLimits()) -> Request:
    """Parse one request line; raise :class:`NSDRequestError` for anything invalid."""
    text = _text(line)
    try:
        obj = jsonbounds.loads(line, limits.json)
    except orjson.JSONDecodeError:
        raise NSDRequestError(text, "not JSON (or not UTF-8)") from None
    except jsonbounds.BoundsError as e:
        raise NSDRequestError(text, f"out of bounds: {e}") from None
    if not isinstance(obj, dict):
        raise NSDRequestError(text, "not a JSON object")
    kind = obj.get("_class")
    identity = _name(obj.get("identity"), "identity", text, limits)
    if kind == "OpenRequest":
        return OpenRequest(identity)
    if kind == "PublishRequest":
        message = obj.get("message")
        if not isinstance(message, dict) or message.get("_class") != MESSAGE_CLASS:
            raise NSDRequestError(text, "message must be a Message object")
        if not isinstance(message.get("body"), str):
            raise NSDRequestError(text, "message body must be a string")
        sender = message.get("from", identity)
        if not isinstance(sender, str):
            raise NSDRequestError(text, "message from must be a string")
        return PublishRequest(identity, message)
    if kind in ("SubscribeRequest", "UnsubscribeRequest"):
        channel = _name(obj.get("channel"), "channel", text, limits)
        return (SubscribeRequest if kind == "SubscribeRequest" else UnsubscribeRequest)(identity, channel)
    if kind == "GetRequest":
        after = obj.get("after")
        if type(after) is not int or after < 0:
            raise NSDRequestError(text, "after must be a non-negative integer")
        return GetRequest(identity, after)
    raise NSDRequestError(text, f"unknown _class {kind!r:.40}")


def message_chars(message: dict[str, Any]) -> int:
    """Size of a message as the limit counts it: characters of its compact JSON text."""
    return len(orjson.dumps(message).decode())


# -- responses ----------------------------------------------------------------------


def encode_success() -> bytes:
    """``SuccessResponse`` line."""
    return b'{"_class":"SuccessResponse"}\n'


def encode_error(error: str) -> bytes:
    """``ErrorResponse`` line with the spec's error text."""
    return orjson.dumps({"_class": "ErrorResponse", "error": error}) + b"\n"


def encode_message_list(messages: list[bytes]) -> bytes:
    """``MessageListResponse`` line from already-encoded message objects."""
    return b'{"_class":"MessageListResponse","messages":[' + b",".join(messages) + b"]}\n"


def no_such_channel(channel: str) -> str:
    """The spec's error text for an unknown channel."""
    return f"NO SUCH CHANNEL: {channel}"


def message_too_big(chars: int) -> str:
    """The spec's error text for an oversize message."""
    return f"MESSAGE TOO BIG: {chars} characters"


def too_many_channels(why: str) -> str:
    """Error text for an Open of a new channel past a node limit (in the spec's ``KIND: detail`` style)."""
    return f"TOO MANY CHANNELS: {why}"


def not_authorized(why: str) -> str:
    """Error text for a request the auth policy refuses (in the spec's ``KIND: detail`` style)."""
    return f"NOT AUTHORIZED: {why}"
