"""Transport Exchange Protocol codec (sans-IO: no Twisted, no sockets).

Every TEP message is one JSON object in one WebSocket text frame
(``docs/specs/tep-protocol.md``; our choices are in docs/tep.md). Clients send
``{"topic": ..., "payload": ...}``: topic ``join``/``leave`` with a list of
channels, or a channel name to publish to. The server sends replies on
``@join``/``#join``/``@leave``/``#leave``, events ``{"topic", "payload"}``,
broadcasts ``{"payload"}`` and, for bad input, ``#error``.

:func:`decode_client` turns one client frame into a frozen dataclass and
raises :class:`TEPDecodeError` - the only error it raises - naming what is
wrong. :func:`encode_server` turns server frames into the bytes of text
frames; :func:`encode_client` and :func:`decode_server` are the client's half,
used by tests and by anyone writing a Python TEP client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Union

import orjson

from pubsubclub.core import binaryjson, jsonbounds

__all__ = [
    "DEFAULT_LIMITS",
    "SYSTEM_NAMES",
    "Broadcast",
    "ClientChannels",
    "ClientFrame",
    "ClientPublish",
    "ErrorFrame",
    "Event",
    "Join",
    "JoinReply",
    "Leave",
    "LeaveReply",
    "ServerFrame",
    "TEPDecodeError",
    "TEPLimits",
    "channel_problem",
    "decode_client",
    "decode_server",
    "echo_of",
    "encode_client",
    "encode_server",
]

JOIN = "join"
LEAVE = "leave"
JOINED = "@join"
JOIN_REJECTED = "#join"
LEFT = "@leave"
LEAVE_REJECTED = "#leave"
#: Topic of the error frame the server sends for bad input (our extension).
ERROR = "#error"

#: Names that are commands or replies, never channels.
SYSTEM_NAMES = frozenset({JOIN, LEAVE, JOINED, JOIN_REJECTED, LEFT, LEAVE_REJECTED})
#: First characters reserved for replies (``@``, ``#``) and the server (``$``).
RESERVED_PREFIXES = ("@", "#", "$")
#: How much of a bad frame an error frame echoes back, in characters.
ECHO_CHARS = 1024

_FIELDS = frozenset({"topic", "payload"})
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


class TEPDecodeError(ValueError):
    """The client sent a frame that is not valid TEP; the message says why."""


@dataclass(frozen=True)
class TEPLimits:
    """Hard limits applied to every TEP client."""

    #: Largest frame or message accepted, in bytes (the transport closes with 1009 above it).
    max_frame_bytes: int = 1024 * 1024
    #: Longest channel name accepted, in characters.
    max_channel_length: int = 256
    #: Channels one client may have joined at once; more are rejected on ``#join``.
    max_channels_per_client: int = 100
    #: Channels in one ``join`` or ``leave`` frame; a longer list is a bad frame.
    max_channels_per_request: int = 100
    #: Unsent bytes queued for one client before it is dropped as too slow.
    max_send_buffer: int = 16 * 1024 * 1024
    #: Depth, integer range, floats and strings of every frame (docs/security.md).
    json: jsonbounds.JSONBounds = jsonbounds.DEFAULT_BOUNDS

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_channel_length",
            "max_channels_per_client",
            "max_channels_per_request",
            "max_send_buffer",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"TEPLimits.{name} must be a positive int, not {value!r}")


DEFAULT_LIMITS = TEPLimits()


# -- client frames --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Join:
    """``join``: subscribe to these channels."""

    channels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Leave:
    """``leave``: unsubscribe from these channels."""

    channels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClientPublish:
    """A client message on a channel: publish ``payload`` to it."""

    topic: str
    payload: Any


ClientFrame = Union[Join, Leave, ClientPublish]


# -- server frames --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinReply:
    """The answer to ``join``: ``@join`` lists the accepted channels, ``#join`` the rejected."""

    accepted: tuple[str, ...]
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LeaveReply:
    """The answer to ``leave``: ``@leave`` lists the channels left, ``#leave`` the rejected."""

    accepted: tuple[str, ...]
    rejected: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Event:
    """A message published to a channel the client joined."""

    topic: str
    payload: Any


@dataclass(frozen=True, slots=True)
class Broadcast:
    """A message for every TEP client of the cluster; it has no topic."""

    payload: Any


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """``#error``: the client's frame was refused; ``frame`` echoes (the start of) it."""

    error: str
    frame: str | None = None


ServerFrame = Union[JoinReply, LeaveReply, Event, Broadcast, ErrorFrame]


# -- channel names ----------------------------------------------------------------


def channel_problem(name: str, limits: TEPLimits = DEFAULT_LIMITS) -> str | None:
    """Why ``name`` cannot be a channel, or None if it can.

    Dots carry no meaning: ``channel2.subtopic`` is an ordinary channel.
    """
    if not name:
        return "channel name is empty"
    if len(name) > limits.max_channel_length:
        return f"channel name of {len(name)} characters is over the limit of {limits.max_channel_length}"
    if name in SYSTEM_NAMES:
        return f"{name!r} is a system name"
    if name.startswith(RESERVED_PREFIXES):
        return f"channel names starting with {name[0]!r} are reserved"
    # isprintable() is False for control, format, surrogate, private-use and
    # unassigned code points and for every space except " ", which we add.
    if not name.isprintable() or " " in name:
        return f"channel name {name[:64]!r} contains whitespace or control characters"
    return None


class ClientChannels:
    """The channels one client has joined; answers ``join`` and ``leave``.

    Joining a channel already joined is accepted again (and is not new);
    leaving a channel not joined is rejected. Duplicates in one request count
    once. Past ``max_channels_per_client`` further channels are rejected.
    """

    def __init__(self, limits: TEPLimits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._joined: dict[str, None] = {}

    def __contains__(self, channel: object) -> bool:
        return channel in self._joined

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._joined))

    def __len__(self) -> int:
        return len(self._joined)

    def join(
        self, channels: Iterable[str], allowed: Callable[[str], bool] | None = None
    ) -> tuple[JoinReply, tuple[str, ...]]:
        """The reply to a ``join``, and the channels newly joined by it.

        ``allowed`` (when given) says which valid channels the client may
        join at all (its role's subscribe prefixes); the others are rejected.
        """
        accepted: list[str] = []
        rejected: list[str] = []
        new: list[str] = []
        limit = self._limits.max_channels_per_client
        for channel in dict.fromkeys(channels):
            if channel_problem(channel, self._limits) is not None or (allowed is not None and not allowed(channel)):
                rejected.append(channel)
            elif channel in self._joined:
                accepted.append(channel)
            elif len(self._joined) >= limit:
                rejected.append(channel)
            else:
                self._joined[channel] = None
                accepted.append(channel)
                new.append(channel)
        return JoinReply(tuple(accepted), tuple(rejected)), tuple(new)

    def leave(self, channels: Iterable[str]) -> LeaveReply:
        """The reply to a ``leave``; its accepted channels are the ones left."""
        accepted: list[str] = []
        rejected: list[str] = []
        for channel in dict.fromkeys(channels):
            if channel in self._joined:
                del self._joined[channel]
                accepted.append(channel)
            else:
                rejected.append(channel)
        return LeaveReply(tuple(accepted), tuple(rejected))


# -- decoding ---------------------------------------------------------------------


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _load_object(data: bytes | str, max_bytes: int, bounds: jsonbounds.JSONBounds) -> dict[str, Any]:
    """One JSON object from a text frame; TEPDecodeError for anything else."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            raise TEPDecodeError("frame is not valid UTF-8 text (lone surrogate)") from None
    else:
        raw = data
    if len(raw) > max_bytes:
        raise TEPDecodeError(f"frame of {len(raw)} bytes is over the limit of {max_bytes}")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TEPDecodeError("frame is not valid UTF-8 text") from None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise TEPDecodeError(f"frame is not valid JSON: {e}") from None
    try:
        jsonbounds.check_decoded(raw, value, bounds)
    except jsonbounds.BoundsError as e:
        raise TEPDecodeError(f"frame is out of bounds: {e}") from None
    if not isinstance(value, dict):
        raise TEPDecodeError(f"frame must be a JSON object, not {_json_type(value)}")
    return value


def decode_client(data: bytes | str, limits: TEPLimits = DEFAULT_LIMITS) -> ClientFrame:
    """Parse one client frame; raise :class:`TEPDecodeError` naming the problem."""
    value = _load_object(data, limits.max_frame_bytes, limits.json)
    unknown = sorted(value.keys() - _FIELDS)
    if unknown:
        raise TEPDecodeError(f"unknown field(s) {', '.join(repr(k[:64]) for k in unknown[:5])}")
    if "topic" not in value:
        raise TEPDecodeError("missing field 'topic' (only the server may broadcast)")
    topic = value["topic"]
    if not isinstance(topic, str):
        raise TEPDecodeError(f"field 'topic' must be a string, not {_json_type(topic)}")
    if "payload" not in value:
        raise TEPDecodeError("missing field 'payload'")
    payload = value["payload"]
    if topic == JOIN:
        return Join(_channel_list(topic, payload, limits))
    if topic == LEAVE:
        return Leave(_channel_list(topic, payload, limits))
    if topic in SYSTEM_NAMES or topic.startswith(RESERVED_PREFIXES):
        raise TEPDecodeError(f"unknown system command {topic[:64]!r}")
    problem = channel_problem(topic, limits)
    if problem is not None:
        raise TEPDecodeError(f"cannot publish: {problem}")
    return ClientPublish(topic, payload)


def _channel_list(command: str, payload: Any, limits: TEPLimits) -> tuple[str, ...]:
    if not isinstance(payload, list):
        raise TEPDecodeError(f"payload of {command!r} must be an array of channel names, not {_json_type(payload)}")
    if len(payload) > limits.max_channels_per_request:
        raise TEPDecodeError(
            f"{command!r} with {len(payload)} channels is over the limit of {limits.max_channels_per_request}"
        )
    for i, item in enumerate(payload):
        if not isinstance(item, str):
            raise TEPDecodeError(f"payload of {command!r}: item {i} must be a string, not {_json_type(item)}")
    return tuple(payload)


def decode_server(data: bytes | str, limits: TEPLimits = DEFAULT_LIMITS) -> ServerFrame:
    """Parse one server frame (a client's view); raise :class:`TEPDecodeError`.

    Each reply frame decodes on its own: ``@join`` gives a :class:`JoinReply`
    with no rejected channels, ``#join`` one with no accepted channels.
    """
    value = _load_object(data, limits.max_frame_bytes, limits.json)
    unknown = sorted(value.keys() - _FIELDS)
    if unknown:
        raise TEPDecodeError(f"unknown field(s) {', '.join(repr(k[:64]) for k in unknown[:5])}")
    if "payload" not in value:
        raise TEPDecodeError("missing field 'payload'")
    payload = value["payload"]
    if "topic" not in value:
        return Broadcast(payload)
    topic = value["topic"]
    if not isinstance(topic, str):
        raise TEPDecodeError(f"field 'topic' must be a string, not {_json_type(topic)}")
    if topic in (JOINED, JOIN_REJECTED, LEFT, LEAVE_REJECTED):
        channels = _channel_list(topic, payload, limits)
        ok = topic.startswith("@")
        reply = JoinReply if topic in (JOINED, JOIN_REJECTED) else LeaveReply
        return reply(channels, ()) if ok else reply((), channels)
    if topic == ERROR:
        if not isinstance(payload, dict) or not isinstance(payload.get("error"), str):
            raise TEPDecodeError("payload of '#error' must be an object with a string 'error'")
        frame = payload.get("frame")
        if frame is not None and not isinstance(frame, str):
            raise TEPDecodeError(f"'frame' of '#error' must be a string, not {_json_type(frame)}")
        return ErrorFrame(payload["error"], frame)
    if topic in SYSTEM_NAMES or topic.startswith(RESERVED_PREFIXES):
        raise TEPDecodeError(f"unknown system reply {topic[:64]!r}")
    return Event(topic, payload)


def echo_of(data: bytes | str) -> str:
    """The start of a received frame as text, for an error frame."""
    text = data if isinstance(data, str) else data[: ECHO_CHARS * 4].decode("utf-8", "replace")
    return text[:ECHO_CHARS]


# -- encoding ---------------------------------------------------------------------


def _dumps(value: dict[str, Any]) -> bytes:
    # Bytes (a WAMP binary payload) as WAMP JSON's "\u0000" + base64 string; orjson raises
    # TypeError for anything else JSON cannot carry (huge ints, non-string keys).
    return binaryjson.dumps(value)


def encode_server(frame: ServerFrame) -> tuple[bytes, ...]:
    """The text frames for ``frame``: one, or up to two for a join/leave reply.

    A reply sends ``@`` with the accepted channels and ``#`` with the rejected
    ones, each only when non-empty; a reply with neither sends ``@`` with an
    empty list, so every request gets an answer.
    """
    if isinstance(frame, Event):
        return (_dumps({"topic": frame.topic, "payload": frame.payload}),)
    if isinstance(frame, Broadcast):
        return (_dumps({"payload": frame.payload}),)
    if isinstance(frame, ErrorFrame):
        return (_dumps({"topic": ERROR, "payload": {"error": frame.error, "frame": frame.frame}}),)
    ok, refused = (JOINED, JOIN_REJECTED) if isinstance(frame, JoinReply) else (LEFT, LEAVE_REJECTED)
    frames = []
    if frame.accepted or not frame.rejected:
        frames.append(_dumps({"topic": ok, "payload": list(frame.accepted)}))
    if frame.rejected:
        frames.append(_dumps({"topic": refused, "payload": list(frame.rejected)}))
    return tuple(frames)


def encode_client(frame: ClientFrame) -> bytes:
    """The text frame for a client ``frame``."""
    if isinstance(frame, Join):
        return _dumps({"topic": JOIN, "payload": list(frame.channels)})
    if isinstance(frame, Leave):
        return _dumps({"topic": LEAVE, "payload": list(frame.channels)})
    return _dumps({"topic": frame.topic, "payload": frame.payload})
