"""PubSubClub protocol codec (sans-IO: no Twisted, no sockets).

Every message is a JSON array whose first item is the integer message type
(see ``specs/pubsubclub-protocol.md`` and docs/protocol.md). :func:`decode`
turns one WebSocket text message into one of the frozen dataclasses below and
raises :class:`PSCDecodeError` - the only error it raises - for anything that
is not exactly a valid message. :func:`encode` does the reverse.

Version 0.1 is the spec. Version 0.2 (our extension, negotiated with
PSC101/PSC102) adds an optional fourth item to PSC301: a metadata object
``{"o": origin, "t": publish_time, "i": message_id, "w": 1}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import orjson

Version = tuple[int, int]

V0_1: Version = (0, 1)
V0_2: Version = (0, 2)
#: Versions this implementation speaks, lowest first.
SUPPORTED_VERSIONS: tuple[Version, ...] = (V0_1, V0_2)

HELLO = 101
CHOOSE_VERSION = 102
SUBSCRIBE = 201
UNSUBSCRIBE = 202
PUBLISH = 301


class PSCDecodeError(ValueError):
    """The peer sent bytes that are not a valid PubSubClub message."""


@dataclass(frozen=True)
class Limits:
    """Named limits for untrusted PSC input."""

    #: Largest encoded message accepted, in bytes.
    max_message_size: int = 1024 * 1024
    #: Longest topic accepted, in characters.
    max_topic_length: int = 512
    #: Most topics in one PSC201.
    max_topics_per_subscribe: int = 100_000
    #: Most versions in one PSC101.
    max_versions: int = 64


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Hello:
    """PSC101: the versions the sender implements."""

    versions: tuple[Version, ...]


@dataclass(frozen=True, slots=True)
class ChooseVersion:
    """PSC102: the version chosen for this link."""

    version: Version


@dataclass(frozen=True, slots=True)
class Subscribe:
    """PSC201: send me messages for these topics."""

    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """PSC202: stop sending me messages for this topic."""

    topic: str


@dataclass(frozen=True, slots=True)
class Meta:
    """Per-message metadata carried by the 0.2 extension."""

    origin: str | None = None
    published_at: float | None = None
    message_id: str | None = None
    #: The message is a WAMP ``{"args", "kwargs"}`` wrapper.
    wamp_wrapped: bool = False


@dataclass(frozen=True, slots=True)
class Publish:
    """PSC301: one published message for a topic."""

    topic: str
    message: Any
    meta: Meta | None = None


Message = Union[Hello, ChooseVersion, Subscribe, Unsubscribe, Publish]


def choose_version(offered: tuple[Version, ...], supported: tuple[Version, ...] = SUPPORTED_VERSIONS) -> Version | None:
    """The highest version in both lists, or None when there is none."""
    common = set(offered) & set(supported)
    return max(common) if common else None


# -- decoding -----------------------------------------------------------------


def decode(data: bytes | str, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Parse one PSC message; raise :class:`PSCDecodeError` naming the problem."""
    if len(data) > limits.max_message_size:
        raise PSCDecodeError(f"message of {len(data)} bytes is over the limit of {limits.max_message_size}")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise PSCDecodeError(f"not JSON: {e}") from None
    if not isinstance(value, list):
        raise PSCDecodeError(f"not a JSON array but {type(value).__name__}")
    if not value:
        raise PSCDecodeError("empty array: no message type")
    kind = value[0]
    if type(kind) is not int:
        raise PSCDecodeError(f"message type must be an integer, got {kind!r:.40}")
    params = value[1:]
    if kind == PUBLISH:
        return _publish(params, limits)
    if kind == SUBSCRIBE:
        if not params:
            raise PSCDecodeError("PSC201 needs at least one topic")
        if len(params) > limits.max_topics_per_subscribe:
            raise PSCDecodeError(
                f"PSC201 with {len(params)} topics is over the limit of {limits.max_topics_per_subscribe}"
            )
        return Subscribe(tuple(_topic(t, limits) for t in params))
    if kind == UNSUBSCRIBE:
        _arity("PSC202", params, 1)
        return Unsubscribe(_topic(params[0], limits))
    if kind == HELLO:
        if not params:
            raise PSCDecodeError("PSC101 needs at least one version")
        if len(params) > limits.max_versions:
            raise PSCDecodeError(f"PSC101 with {len(params)} versions is over the limit of {limits.max_versions}")
        return Hello(tuple(_version(v) for v in params))
    if kind == CHOOSE_VERSION:
        _arity("PSC102", params, 1)
        return ChooseVersion(_version(params[0]))
    raise PSCDecodeError(f"unknown message type {kind}")


def _arity(name: str, params: list[Any], n: int) -> None:
    if len(params) != n:
        raise PSCDecodeError(f"{name} takes {n} parameter(s), got {len(params)}")


def _topic(value: Any, limits: Limits) -> str:
    if not isinstance(value, str):
        raise PSCDecodeError(f"topic must be a string, got {type(value).__name__}")
    if not value:
        raise PSCDecodeError("topic must not be empty")
    if len(value) > limits.max_topic_length:
        raise PSCDecodeError(f"topic of {len(value)} characters is over the limit of {limits.max_topic_length}")
    return value


def _version(value: Any) -> Version:
    if not isinstance(value, list) or len(value) != 2 or not all(type(n) is int and 0 <= n < 2**31 for n in value):
        raise PSCDecodeError(f"version must be [major, minor] with non-negative integers, got {value!r:.60}")
    return (value[0], value[1])


def _publish(params: list[Any], limits: Limits) -> Publish:
    if len(params) == 2:
        return Publish(_topic(params[0], limits), params[1])
    if len(params) == 3:
        return Publish(_topic(params[0], limits), params[1], _meta(params[2]))
    raise PSCDecodeError(f"PSC301 takes 2 parameters (3 with metadata), got {len(params)}")


def _meta(value: Any) -> Meta:
    if not isinstance(value, dict):
        raise PSCDecodeError(f"PSC301 metadata must be an object, got {type(value).__name__}")
    origin = value.get("o")
    published_at = value.get("t")
    message_id = value.get("i")
    wrapped = value.get("w", 0)
    if origin is not None and not isinstance(origin, str):
        raise PSCDecodeError("PSC301 metadata 'o' (origin) must be a string")
    if published_at is not None and (type(published_at) not in (int, float)):
        raise PSCDecodeError("PSC301 metadata 't' (publish time) must be a number")
    if message_id is not None and not isinstance(message_id, str):
        raise PSCDecodeError("PSC301 metadata 'i' (message id) must be a string")
    if wrapped not in (0, 1) or type(wrapped) is not int:
        raise PSCDecodeError("PSC301 metadata 'w' must be 0 or 1")
    return Meta(origin, None if published_at is None else float(published_at), message_id, bool(wrapped))


# -- encoding -----------------------------------------------------------------


def encode(message: Message) -> bytes:
    """Serialise one PSC message to the bytes of a WebSocket text frame."""
    if isinstance(message, Publish):
        return encode_publish(message.topic, message.message, message.meta)
    if isinstance(message, Subscribe):
        if not message.topics:
            raise ValueError("PSC201 needs at least one topic")
        return orjson.dumps([SUBSCRIBE, *message.topics])
    if isinstance(message, Unsubscribe):
        return orjson.dumps([UNSUBSCRIBE, message.topic])
    if isinstance(message, Hello):
        if not message.versions:
            raise ValueError("PSC101 needs at least one version")
        return orjson.dumps([HELLO, *[list(v) for v in message.versions]])
    if isinstance(message, ChooseVersion):
        return orjson.dumps([CHOOSE_VERSION, list(message.version)])
    raise TypeError(f"not a PSC message: {message!r}")


def encode_publish(topic: str, message: Any, meta: Meta | None = None) -> bytes:
    """Serialise a PSC301; with ``meta`` it is the 0.2 form."""
    if meta is None:
        return orjson.dumps([PUBLISH, topic, message])
    fields: dict[str, Any] = {}
    if meta.origin is not None:
        fields["o"] = meta.origin
    if meta.published_at is not None:
        fields["t"] = meta.published_at
    if meta.message_id is not None:
        fields["i"] = meta.message_id
    if meta.wamp_wrapped:
        fields["w"] = 1
    return orjson.dumps([PUBLISH, topic, message, fields])
