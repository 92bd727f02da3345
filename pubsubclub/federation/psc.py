"""PubSubClub protocol codec (sans-IO: no Twisted, no sockets).

Every message is a JSON array whose first item is the integer message type
(see ``docs/specs/pubsubclub-protocol.md`` and docs/protocol.md). :func:`decode`
turns one WebSocket text message into one of the frozen dataclasses below and
raises :class:`PSCDecodeError` - the only error it raises - for anything that
is not exactly a valid message. :func:`encode` does the reverse.

Version 0.1 is the spec. Version 0.2 (our extension, negotiated with
PSC101/PSC102) adds an optional fourth item to PSC301: a metadata object
``{"o": origin, "t": publish_time, "i": message_id, "w": 1}``. Version 0.3
(replay after short outages, :mod:`pubsubclub.federation.replay`) adds a
sequence number ``"s"`` to that object and two handshake messages, PSC103
(the consumer's resume position and interest) and PSC104 (the producer's
answer: where the stream continues and how many messages were lost).
Version 0.4 batches messages in a frame. Version 0.5 (0.4 plus pattern
interest) adds PSC203/PSC204 (a consumer's WAMP prefix or wildcard pattern,
:mod:`pubsubclub.core.patterns`) and a fifth PSC103 item, the consumer's whole
pattern interest. Version 0.6 (0.5 plus binary payloads) adds ``"b": 1`` to
the metadata of a PSC301 whose message holds binary values, written in WAMP's
JSON convention (:mod:`pubsubclub.core.binaryjson`); :func:`decode` gives them back
as ``bytes``, and ``"p"``: a WAMP publish's routing object (its
``eligible``/``exclude`` lists by session id, authid and authrole, and a
disclosed publisher), applied by each node to its own subscribers
(docs/protocol.md, "Publish options"); a message that has one goes only to
0.6 links.

Every value is held to :mod:`pubsubclub.core.jsonbounds` (depth, 64-bit integers,
finite floats, no lone surrogates). A PSC301 that is well formed except for
its message or metadata breaking those bounds raises
:class:`PSCPayloadError`, a :class:`PSCDecodeError` that the link answers by
dropping that one message (a producer relays its clients' messages; one bad
message must not cut the link); anything else is the peer's protocol error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

import orjson

from pubsubclub.core import binaryjson, jsonbounds
from pubsubclub.core.hotmessage import hot_message
from pubsubclub.core.patterns import Pattern, pattern_problem

Version = tuple[int, int]

V0_1: Version = (0, 1)
V0_2: Version = (0, 2)
#: Replay after short outages; spoken only by a federation that keeps a replay buffer.
V0_3: Version = (0, 3)
#: 0.3 plus batching: a text frame may carry several messages, one per line (docs/protocol.md).
V0_4: Version = (0, 4)
#: 0.4 plus pattern interest: PSC203/PSC204 and patterns in PSC103 (docs/protocol.md).
V0_5: Version = (0, 5)
#: 0.5 plus binary payloads: ``"b": 1`` in PSC301 metadata (docs/protocol.md, "Binary payloads").
V0_6: Version = (0, 6)
#: 0.6 plus RPC across the cluster: PSC401-PSC406 (federation/psc_rpc.py, docs/protocol.md).
V0_7: Version = (0, 7)
#: 0.7 plus retained events: PSC501 (federation/psc_retain.py, docs/protocol.md).
V0_8: Version = (0, 8)
#: Separates the messages of a 0.4 batch frame; encoded messages never contain it (JSON escapes it).
BATCH_SEPARATOR = b"\n"
#: Versions every link speaks, lowest first (a federation with a replay buffer adds 0.3, and 0.4 to batch).
SUPPORTED_VERSIONS: tuple[Version, ...] = (V0_1, V0_2)

HELLO = 101
CHOOSE_VERSION = 102
RESUME = 103
POSITION = 104
SUBSCRIBE = 201
UNSUBSCRIBE = 202
SUBSCRIBE_PATTERN = 203
UNSUBSCRIBE_PATTERN = 204
PUBLISH = 301


class PSCDecodeError(ValueError):
    """The peer sent bytes that are not a valid PubSubClub message."""


class PSCPayloadError(PSCDecodeError):
    """A well-formed PSC301 whose message or metadata breaks the JSON bounds; drop just it."""

    def __init__(self, topic: str, problem: str) -> None:
        super().__init__(f"PSC301 on {topic[:80]!r}: {problem}")
        self.topic = topic
        self.problem = problem


@dataclass(frozen=True)
class Limits:
    """Named limits for untrusted PSC input."""

    #: Largest message a client of this node may publish, in bytes (``--max-message-size``).
    max_message_size: int = 1024 * 1024
    #: What a link frame may hold beyond ``max_message_size`` (``--link-headroom``): the PSC301 carries
    #: the topic, the re-encoded message and its metadata (docs/protocol.md, "Message sizes").
    link_headroom: int = 64 * 1024
    #: Longest topic accepted, in characters.
    max_topic_length: int = 512
    #: Most topics in one PSC201.
    max_topics_per_subscribe: int = 100_000
    #: Most versions in one PSC101.
    max_versions: int = 64
    #: Most patterns (PSC203, PSC103) one peer may hold on a link at once (0.5).
    max_patterns_per_peer: int = 10_000
    #: Longest replay stream epoch accepted (PSC103/PSC104), in characters.
    max_epoch_length: int = 64
    #: Depth, integer range, floats and strings of every value (docs/security.md).
    json: jsonbounds.JSONBounds = jsonbounds.DEFAULT_BOUNDS


    @property
    def max_link_frame(self) -> int:
        """Largest link frame (and PSC message) this node accepts and sends, in bytes."""
        return self.max_message_size + self.link_headroom


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
class SubscribePattern:
    """PSC203 (0.5): send me messages for topics matching this pattern."""

    pattern: Pattern


@dataclass(frozen=True, slots=True)
class UnsubscribePattern:
    """PSC204 (0.5): stop sending me messages for this pattern."""

    pattern: Pattern


@hot_message
class Meta:
    """Per-message metadata carried by the 0.2 extension."""

    origin: str | None = None
    published_at: float | None = None
    message_id: str | None = None
    #: The message is a WAMP ``{"args", "kwargs"}`` wrapper.
    wamp_wrapped: bool = False
    #: Sequence number on the producer's stream to this consumer node (0.3).
    seq: int | None = None
    #: The message holds binary values (0.6): written as :func:`binaryjson.to_json` writes them.
    binary: bool = False
    #: The WAMP routing object (0.6, ``"p"``): publish options and a disclosed publisher.
    options: dict[str, Any] | None = None


@hot_message
class Publish:
    """PSC301: one published message for a topic."""

    topic: str
    message: Any
    meta: Meta | None = None


@dataclass(frozen=True, slots=True)
class Resume:
    """PSC103 (0.3): the consumer's position on the producer's stream, and its whole interest.

    ``epoch`` is None (and ``seq`` 0) when the consumer holds no position:
    it never linked to this producer, or it restarted since.
    """

    epoch: str | None
    #: The last sequence number the consumer received on ``epoch``.
    seq: int
    topics: tuple[str, ...]
    #: The consumer's whole pattern interest (0.5); None: the 0.3/0.4 form, without the item.
    patterns: tuple[Pattern, ...] | None = None


@dataclass(frozen=True, slots=True)
class Position:
    """PSC104 (0.3): the PSC301s that follow on this link carry ``seq + 1`` onwards, on ``epoch``."""

    epoch: str
    seq: int
    #: Messages lost between the consumer's position and ``seq + 1``; None: unknown.
    lost: int | None


class ExtensionMessage:
    """A message of an extension codec (federation/psc_rpc.py): it encodes itself, and registers its decoder."""

    __slots__ = ()

    def encode(self) -> bytes:
        """The bytes of this message."""
        raise NotImplementedError


#: Message type -> the decoder of an extension codec: ``decoder(params, limits, data)``.
EXTENSION_DECODERS: dict[int, Any] = {}


Message = Union[
    Hello,
    ChooseVersion,
    Subscribe,
    Unsubscribe,
    SubscribePattern,
    UnsubscribePattern,
    Publish,
    Resume,
    Position,
    ExtensionMessage,
]

#: Largest sequence number or count on the wire (JSON-safe integers).
MAX_SEQ = 2**53 - 1
#: Latest publish time (PSC301 ``t``, seconds since the epoch) taken from a peer: the year 2286.
#: A time outside 0..this is no clock's: it would overflow what the node derives from it
#: (NSD's microsecond ``when``, the latency histograms), so the message is dropped and counted.
MAX_PUBLISH_TIME = 1e10


def choose_version(offered: tuple[Version, ...], supported: tuple[Version, ...] = SUPPORTED_VERSIONS) -> Version | None:
    """The highest version in both lists, or None when there is none."""
    common = set(offered) & set(supported)
    return max(common) if common else None


# -- decoding -----------------------------------------------------------------


def decode(data: bytes | str, limits: Limits = DEFAULT_LIMITS, bounded: bool = False) -> Message:
    """Parse one PSC message; raise :class:`PSCDecodeError` naming the problem.

    ``bounded``: :func:`batch_within_bounds` found the frame ``data`` came in
    within the JSON bounds, so its PSC301 is not checked again.
    """
    if len(data) > limits.max_link_frame:
        raise PSCDecodeError(f"message of {len(data)} bytes is over the limit of {limits.max_link_frame}")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise PSCDecodeError(f"not JSON: {e}") from None
    if not isinstance(value, list):
        raise PSCDecodeError(f"not a JSON array but {type(value).__name__}")
    if not value:
        raise PSCDecodeError("empty array: no message type")
    kind = value[0]
    if kind == PUBLISH and type(kind) is int:
        return _publish(value, limits, data, bounded)
    if type(kind) is not int:
        raise PSCDecodeError(f"message type must be an integer, got {_brief(kind)}")
    params = value[1:]
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
    if kind in (SUBSCRIBE_PATTERN, UNSUBSCRIBE_PATTERN):
        name = f"PSC{kind}"
        _arity(name, params, 2)
        pattern = _pattern(name, params[0], params[1], limits)
        return SubscribePattern(pattern) if kind == SUBSCRIBE_PATTERN else UnsubscribePattern(pattern)
    if kind == HELLO:
        if not params:
            raise PSCDecodeError("PSC101 needs at least one version")
        if len(params) > limits.max_versions:
            raise PSCDecodeError(f"PSC101 with {len(params)} versions is over the limit of {limits.max_versions}")
        return Hello(tuple(_version(v) for v in params))
    if kind == CHOOSE_VERSION:
        _arity("PSC102", params, 1)
        return ChooseVersion(_version(params[0]))
    if kind == RESUME:
        return _resume(params, limits)
    if kind == POSITION:
        _arity("PSC104", params, 3)
        lost = params[2]
        return Position(
            _epoch("PSC104", params[0], limits),
            _count("PSC104 sequence number", params[1]),
            None if lost is None else _count("PSC104 lost count", lost),
        )
    extension = EXTENSION_DECODERS.get(kind)
    if extension is not None:
        return extension(params, limits, data)  # type: ignore[no-any-return]
    raise PSCDecodeError(f"unknown message type {kind}")


def batch_within_bounds(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> bool:
    """True when no PSC301 in ``frame`` (a 0.4 batch, one message per line) can break the JSON bounds.

    One pass over the frame instead of one per message; then each line is
    decoded with ``bounded=True``. False: each PSC301 is checked on its own
    as :func:`decode` always does, so one out of bounds is still found and
    dropped by itself (:class:`PSCPayloadError`).
    """
    return jsonbounds.text_within(frame, limits.json, wrapper_depth=1)


def _brief(value: Any) -> str:
    """A short, safe description of a bad value: never the repr of a (possibly deep) container."""
    if isinstance(value, (list, dict)):
        return f"{_json_type(value)} of {len(value)} item(s)"
    if isinstance(value, str):
        return repr(value[:40])
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)[:40]


def _json_type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


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
        raise PSCDecodeError(f"version must be [major, minor] with non-negative integers, got {_brief(value)}")
    return (value[0], value[1])


def _epoch(name: str, value: Any, limits: Limits) -> str:
    if not isinstance(value, str) or not value:
        raise PSCDecodeError(f"{name} epoch must be a non-empty string, got {_brief(value)}")
    if len(value) > limits.max_epoch_length:
        raise PSCDecodeError(f"{name} epoch of {len(value)} characters is over the limit of {limits.max_epoch_length}")
    return value


def _count(name: str, value: Any) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise PSCDecodeError(f"{name} must be an integer between 0 and 2**53-1, got {_brief(value)}")
    return value


def _pattern(name: str, match: Any, pattern: Any, limits: Limits) -> Pattern:
    problem = pattern_problem(match, pattern, limits.max_topic_length)
    if problem is not None:
        raise PSCDecodeError(f"{name}: {problem}")
    return Pattern(match, pattern)


def _patterns(value: Any, limits: Limits) -> tuple[Pattern, ...]:
    if not isinstance(value, list):
        raise PSCDecodeError(f"PSC103 patterns must be an array, got {type(value).__name__}")
    if len(value) > limits.max_patterns_per_peer:
        raise PSCDecodeError(
            f"PSC103 with {len(value)} patterns is over the limit of {limits.max_patterns_per_peer} per peer"
        )
    patterns = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            raise PSCDecodeError(f"PSC103 pattern must be [match, pattern], got {_brief(item)}")
        patterns.append(_pattern("PSC103", item[0], item[1], limits))
    return tuple(patterns)


def _resume(params: list[Any], limits: Limits) -> Resume:
    if len(params) not in (3, 4):
        raise PSCDecodeError(f"PSC103 takes 3 parameters (4 with patterns), got {len(params)}")
    epoch, seq, topics = params[:3]
    patterns = _patterns(params[3], limits) if len(params) == 4 else None
    if not isinstance(topics, list):
        raise PSCDecodeError(f"PSC103 topics must be an array, got {type(topics).__name__}")
    if len(topics) > limits.max_topics_per_subscribe:
        raise PSCDecodeError(f"PSC103 with {len(topics)} topics is over the limit of {limits.max_topics_per_subscribe}")
    if epoch is None:
        if type(seq) is not int or seq != 0:
            raise PSCDecodeError("PSC103 without an epoch must have sequence number 0")
        return Resume(None, 0, tuple(_topic(t, limits) for t in topics), patterns)
    return Resume(
        _epoch("PSC103", epoch, limits),
        _count("PSC103 sequence number", seq),
        tuple(_topic(t, limits) for t in topics),
        patterns,
    )


def _publish(frame: list[Any], limits: Limits, data: bytes | str, bounded: bool) -> Publish:
    n = len(frame)
    if n != 4 and n != 3:
        raise PSCDecodeError(f"PSC301 takes 2 parameters (3 with metadata), got {n - 1}")
    topic = frame[1]
    if type(topic) is not str or not topic or len(topic) > limits.max_topic_length:
        topic = _topic(topic, limits)  # raises, naming the problem
    # The message type and the topic are sound, so whatever breaks the bounds
    # is in the message or its metadata: that message's problem, not the link's.
    if not bounded:
        try:
            jsonbounds.check_decoded(data, frame, limits.json, wrapper_depth=1)
        except jsonbounds.BoundsError as e:
            raise PSCPayloadError(topic, str(e)) from None
    if n == 3:
        return Publish(topic, frame[2])
    value = frame[3]
    if type(value) is dict:
        get = value.get
        if get("b") is not None or get("p") is not None:
            return _extended_publish(topic, frame[2], value)
        origin, published_at, message_id, wrapped, seq = get("o"), get("t"), get("i"), get("w", 0), get("s")
        # Metadata as nodes write it, accepted in one test (once per message on a busy link);
        # anything else gets the checks one by one, which name the problem.
        if (
            type(published_at) is float
            and 0.0 <= published_at <= MAX_PUBLISH_TIME
            and type(origin) is str
            and type(message_id) is str
            and type(wrapped) is int
            and (wrapped == 0 or wrapped == 1)
            and (seq is None or (type(seq) is int and 0 < seq <= MAX_SEQ))
        ):
            return Publish(topic, frame[2], Meta(origin, published_at, message_id, wrapped == 1, seq))
    return Publish(topic, frame[2], _checked_meta(topic, value))


def _extended_publish(topic: str, message: Any, value: dict[str, Any]) -> Publish:
    """A 0.6 PSC301 with binary values (``"b": 1``) or a routing object (``"p"``), or both."""
    meta = _checked_meta(topic, value)
    binary = value.get("b")
    if binary is not None:
        if binary != 1 or type(binary) is not int:
            raise PSCDecodeError("PSC301 metadata 'b' must be 1")
        try:
            message = binaryjson.from_json(message)
        except binaryjson.BinaryDecodeError as e:
            raise PSCPayloadError(topic, str(e)) from None
    options = value.get("p")
    if options is not None:
        problem = routing_problem(options)
        if problem is not None:
            raise PSCPayloadError(topic, f"metadata 'p': {problem}")
    return Publish(topic, message, dataclasses.replace(meta, binary=binary is not None, options=options))


#: Largest WAMP session id (the WAMP spec's 2**53).
_MAX_WAMP_ID = 2**53
#: Routing-object keys holding session ids, and those holding authids or authroles (docs/protocol.md).
_ID_LISTS = ("e", "x")
_NAME_LISTS = ("ea", "xa", "er", "xr")
#: A disclosed publisher: the EVENT details it adds, with their types.
_DISCLOSED = {"publisher": (int,), "publisher_authid": (str, type(None)), "publisher_authrole": (str, type(None))}


def routing_problem(options: Any) -> str | None:
    """Why ``options`` is not a routing object (PSC301 metadata ``"p"``), or None if it is.

    Strict, so a node never delivers a message whose restrictions it did not
    understand: an unknown key is refused, not ignored.
    """
    if type(options) is not dict or not options:
        return "must be a non-empty object"
    for key, value in options.items():
        if key in _ID_LISTS:
            if type(value) is not list or not all(type(v) is int and 0 < v <= _MAX_WAMP_ID for v in value):
                return f"{key!r} must be a list of WAMP session ids"
        elif key in _NAME_LISTS:
            if type(value) is not list or not all(type(v) is str for v in value):
                return f"{key!r} must be a list of strings"
        elif key == "d":
            if (
                type(value) is not dict
                or set(value) != set(_DISCLOSED)
                or not all(type(value[k]) in types for k, types in _DISCLOSED.items())
            ):
                return "'d' must be an object of publisher, publisher_authid and publisher_authrole"
        else:
            return f"unknown key {str(key)[:20]!r}"
    return None


def _checked_meta(topic: str, value: Any) -> Meta:
    """PSC301 metadata checked field by field, its publish time within 0..MAX_PUBLISH_TIME."""
    meta = _meta(value)
    if meta.published_at is not None and not 0.0 <= meta.published_at <= MAX_PUBLISH_TIME:
        raise PSCPayloadError(topic, f"publish time {meta.published_at!r} is outside 0..{MAX_PUBLISH_TIME:.0f}")
    return meta


def _meta(value: Any) -> Meta:
    if not isinstance(value, dict):
        raise PSCDecodeError(f"PSC301 metadata must be an object, got {type(value).__name__}")
    origin = value.get("o")
    published_at = value.get("t")
    message_id = value.get("i")
    wrapped = value.get("w", 0)
    seq = value.get("s")
    if origin is not None and not isinstance(origin, str):
        raise PSCDecodeError("PSC301 metadata 'o' (origin) must be a string")
    if published_at is not None and (type(published_at) not in (int, float)):
        raise PSCDecodeError("PSC301 metadata 't' (publish time) must be a number")
    if message_id is not None and not isinstance(message_id, str):
        raise PSCDecodeError("PSC301 metadata 'i' (message id) must be a string")
    if wrapped not in (0, 1) or type(wrapped) is not int:
        raise PSCDecodeError("PSC301 metadata 'w' must be 0 or 1")
    if seq is not None and (type(seq) is not int or not 1 <= seq <= MAX_SEQ):
        raise PSCDecodeError("PSC301 metadata 's' (sequence number) must be an integer between 1 and 2**53-1")
    return Meta(origin, None if published_at is None else float(published_at), message_id, bool(wrapped), seq)


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
    if isinstance(message, (SubscribePattern, UnsubscribePattern)):
        kind = SUBSCRIBE_PATTERN if isinstance(message, SubscribePattern) else UNSUBSCRIBE_PATTERN
        return orjson.dumps([kind, message.pattern.match, message.pattern.pattern])
    if isinstance(message, Resume):
        fields: list[Any] = [RESUME, message.epoch, message.seq, list(message.topics)]
        if message.patterns is not None:
            fields.append([[p.match, p.pattern] for p in message.patterns])
        return orjson.dumps(fields)
    if isinstance(message, Position):
        return orjson.dumps([POSITION, message.epoch, message.seq, message.lost])
    if isinstance(message, ExtensionMessage):
        return message.encode()
    raise TypeError(f"not a PSC message: {message!r}")


def encode_publish(topic: str, message: Any, meta: Meta | None = None) -> bytes:
    """Serialise a PSC301; with ``meta`` it is the 0.2 form."""
    if meta is None:
        return orjson.dumps([PUBLISH, topic, message])
    return encode_publish_meta(
        topic,
        message,
        meta.origin,
        meta.published_at,
        meta.message_id,
        meta.wamp_wrapped,
        meta.seq,
        meta.binary,
        meta.options,
    )


def encode_publish_meta(
    topic: str,
    message: Any,
    origin: str | None,
    published_at: float | None,
    message_id: str | None,
    wamp_wrapped: bool = False,
    seq: int | None = None,
    binary: bool = False,
    options: dict[str, Any] | None = None,
) -> bytes:
    """:func:`encode_publish` with the fields of its :class:`Meta` (none made: once per forwarded message).

    ``binary``: write ``message``'s bytes in WAMP's JSON convention and flag it (0.6 links only);
    without it a message holding bytes raises TypeError (orjson's "not JSON"). ``options``: the
    WAMP routing object (``"p"``, 0.6 links only).
    """
    fields: dict[str, Any] = {}
    if origin is not None:
        fields["o"] = origin
    if published_at is not None:
        fields["t"] = published_at
    if message_id is not None:
        fields["i"] = message_id
    if wamp_wrapped:
        fields["w"] = 1
    if binary:
        fields["b"] = 1
        message = binaryjson.to_json(message)
    if options is not None:
        fields["p"] = options
    if seq is not None:
        fields["s"] = seq  # last: seq_head() cuts here
    return orjson.dumps([PUBLISH, topic, message, fields])


def with_seq(publish_02: bytes, seq: int) -> bytes:
    """The 0.3 PSC301 bytes: a 0.2 PSC301 (as :func:`encode_publish` makes it) plus ``"s": seq``.

    The message is encoded once; each consumer node's copy only gets its own
    number appended to the metadata object.
    """
    return b"%s%d}]" % (seq_head(publish_02), seq)


def seq_head(publish_02: bytes) -> bytes:
    """The 0.3 PSC301 bytes of a 0.2 PSC301 up to its sequence number: ``head + b"%d}]" % seq`` is :func:`with_seq`.

    Made once per message, then once per consumer node only the number is added.
    """
    head = publish_02[:-2]  # drop the closing "}]"
    return head + (b',"s":' if head[-1:] != b"{" else b'"s":')


def seq_template(publish_02: bytes) -> bytes:
    """:func:`seq_head` as a template: ``template % seq`` is :func:`with_seq` (``%`` in the message escaped).

    Made once per message; what the replay outbox numbers without knowing the PSC301 format.
    """
    head = publish_02[:-2]  # seq_head, without its call (once per forwarded message)
    head += b',"s":' if head[-1:] != b"{" else b'"s":'
    return head.replace(b"%", b"%%") + b"%d}]"
