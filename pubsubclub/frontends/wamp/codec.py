"""The WAMP hot path without Autobahn ``Message`` objects: PUBLISH in, EVENT out.

Why it exists: under load a node spent much of its time building Autobahn
``Message`` objects for every PUBLISH it read (``Publish.parse`` checks a
dozen options, then the constructor checks them again) and for every EVENT
it wrote (construct, ``marshal``, serialize). This module does the two
messages of the publish path on plain lists and bytes; every other message
still goes through Autobahn's classes.

- :func:`decode` is Autobahn's ``Serializer.unserialize`` (same checks, same
  words in every ``ProtocolError``), except that a PUBLISH that is plainly
  valid becomes a :class:`PublishRequest` without a ``Message``. "Plainly
  valid" is a strict subset of what ``Publish.parse`` accepts (request id in
  range, options holding at most ``acknowledge``/``exclude_me`` as booleans and
  keys Autobahn ignores, a loose URI topic, list args, dict kwargs with string
  keys). Any other PUBLISH is handed to ``Publish.parse`` itself, so every
  refusal, and its wording, is Autobahn's own. So is every PUBLISH with
  routing options (``eligible``, ``exclude``, ... or ``disclose_me``): they take
  this slower path, and the plain publish pays nothing for them. ``tests/test_wamp_codec.py``
  checks on random messages that both accept and refuse the same, with the
  same fields.
- :func:`event_message` is the EVENT as a list, as ``Event.marshal`` writes
  it; the broker encodes it once per publish and wire format with the
  connection's object serializer (orjson with WAMP's ``"\\0"`` + base64
  binary convention, or msgpack) and sends the same bytes to every recipient.

Sans-IO: no Twisted; Autobahn only for its message classes and errors.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from autobahn.wamp import message
from autobahn.wamp.exception import ProtocolError

__all__ = [
    "DISCLOSED",
    "EVENT",
    "PUBLISH",
    "ROUTING_KEYS",
    "PublishRequest",
    "decode",
    "decoded",
    "event_message",
    "publish_request",
    "routing_options",
]

PUBLISH = message.Publish.MESSAGE_TYPE
EVENT = message.Event.MESSAGE_TYPE
#: Largest WAMP id (the spec's 2**53), as Autobahn checks it.
_MAX_ID = 2**53
#: The loose URI rule (non-empty components, no whitespace, '.' or '#'), matched whole: a topic
#: it accepts is one Autobahn's looser ``match`` (which lets a trailing newline through) accepts too.
_LOOSE_URI = re.compile(r"([^\s\.#]+\.)*[^\s\.#]+")
#: PUBLISH options Autobahn checks beyond ``acknowledge``/``exclude_me``: with any of them, ``Publish.parse`` decides.
_CHECKED_OPTIONS = frozenset(
    {
        "exclude",
        "exclude_authid",
        "exclude_authrole",
        "eligible",
        "eligible_authid",
        "eligible_authrole",
        "retain",
        "transaction_hash",
        "forward_for",
        "enc_algo",
        "enc_key",
        "enc_serializer",
    }
)
_FLAG_OPTIONS = ("acknowledge", "exclude_me")
#: Options Autobahn ignores that the broker acts on: with one of them the slower path decides too.
_BROKER_OPTIONS = frozenset({"disclose_me"})


#: PUBLISH option -> its key in the routing object (and in PSC301 metadata ``"p"``).
ROUTING_KEYS = {
    "eligible": "e",
    "exclude": "x",
    "eligible_authid": "ea",
    "exclude_authid": "xa",
    "eligible_authrole": "er",
    "exclude_authrole": "xr",
}
#: Routing-object key of a disclosed publisher: the EVENT details to add.
DISCLOSED = "d"


def routing_options(msg: message.Publish) -> dict[str, Any] | None:
    """The black- and whitelists of an Autobahn-parsed PUBLISH as a routing object; None without any.

    Autobahn's ``Publish.parse`` has checked their types (lists of ints in
    the id range, lists of strings).
    """
    routing: dict[str, Any] | None = None
    for option, key in ROUTING_KEYS.items():
        value = getattr(msg, option, None)
        if value is not None:
            if routing is None:
                routing = {}
            routing[key] = list(value)
    return routing


class PublishRequest(NamedTuple):
    """A decoded PUBLISH: the fields the broker uses, as ``Publish.parse`` would give them.

    A NamedTuple rather than a frozen dataclass: it is built for every
    publish, and a tuple is the cheapest immutable record to build.
    """

    request: int
    topic: str
    args: Any
    kwargs: Any
    #: The ``acknowledge`` option, None when absent.
    acknowledge: bool | None
    #: The ``exclude_me`` option, None when absent.
    exclude_me: bool | None
    #: A transparent (``payload``) publication's payload, which the broker refuses; else None.
    payload: Any = None
    #: Bytes of the WAMP message as received, when the transport knew them (metrics).
    size: int | None = None
    #: The black- and whitelists as a routing object (:func:`routing_options`).
    routing: dict[str, Any] | None = None
    #: The ``disclose_me`` option (true: the publisher asks to be named in its EVENTs).
    disclose_me: bool | None = None
    #: The ``retain`` option (true: keep it as the topic's retained event).
    retain: bool = False

    @classmethod
    def from_message(cls, msg: message.Publish, size: int | None = None, options: Any = None) -> PublishRequest:
        """The fields of an Autobahn ``Publish`` (for messages parsed by Autobahn); ``options``: its raw options."""
        disclose = options.get("disclose_me") if type(options) is dict else None
        return cls(
            msg.request,
            msg.topic,
            msg.args,
            msg.kwargs,
            msg.acknowledge,
            msg.exclude_me,
            msg.payload,
            size,
            routing_options(msg),
            disclose if type(disclose) is bool else None,
            msg.retain is True,
        )


def publish_request(raw: list[Any], size: int | None = None) -> PublishRequest | None:
    """``raw`` (a decoded ``[16, ...]`` list) as a PublishRequest when it is plainly valid, else None.

    None means "let ``Publish.parse`` decide", never "invalid".
    """
    n = len(raw)
    if n < 4 or n > 6:
        return None
    request, options, topic = raw[1], raw[2], raw[3]
    if type(request) is not int or request < 0 or request > _MAX_ID:
        return None
    if type(options) is not dict or type(topic) is not str or _LOOSE_URI.fullmatch(topic) is None:
        return None
    acknowledge = exclude_me = None
    if options:
        for key, value in options.items():
            if key in _FLAG_OPTIONS:
                if type(value) is not bool:
                    return None
                if key == "acknowledge":
                    acknowledge = value
                else:
                    exclude_me = value
            elif type(key) is not str or key in _CHECKED_OPTIONS or key in _BROKER_OPTIONS:
                return None
    args = kwargs = None
    if n >= 5:
        args = raw[4]
        if type(args) is not list:
            return None
        if n == 6:
            kwargs = raw[5]
            if type(kwargs) is not dict:
                return None
            for key in kwargs:
                if type(key) is not str:
                    return None
    return PublishRequest(request, topic, args, kwargs, acknowledge, exclude_me, None, size)


def decode(serializer: Any, payload: bytes, is_binary: bool | None) -> list[Any]:
    """The WAMP messages in ``payload``, as Autobahn's ``serializer.unserialize`` gives them, PUBLISH aside.

    ``serializer`` is an Autobahn ``Serializer`` (JSON or MessagePack, not
    batched). A PUBLISH comes back as a :class:`PublishRequest` (a plainly
    valid one without ever building Autobahn's ``Publish``); everything else
    as Autobahn's ``Message``. Raises what Autobahn raises
    (``ProtocolError``, ``InvalidUriError``), with the same words.
    """
    objects = serializer._serializer
    if is_binary is not None and is_binary != objects.BINARY:
        raise ProtocolError(
            f"invalid serialization of WAMP message (binary {is_binary}, but expected {objects.BINARY})"
        )
    try:
        raws = objects.unserialize(payload)
    except Exception as e:
        raise ProtocolError(f"invalid serialization of WAMP message: {type(e).__name__} {e}") from None
    return decoded(serializer, raws, len(payload))


def decoded(serializer: Any, raws: list[Any], size: int) -> list[Any]:
    """:func:`decode` of a payload of ``size`` bytes whose object serializer gave ``raws`` (checked, not yet parsed)."""
    messages: list[Any] = []
    for raw in raws:
        if type(raw) is list and raw and type(raw[0]) is int and raw[0] == PUBLISH:
            fast = publish_request(raw, size)
            if fast is not None:
                messages.append(fast)
                continue
        msg = _parse(serializer.MESSAGE_TYPE_MAP, raw)
        # A PUBLISH Autobahn had to decide reaches the broker in the same shape, with its size.
        if type(msg) is message.Publish:
            msg = PublishRequest.from_message(msg, size, raw[2])
        else:
            _mark_disclosure(msg, raw)
        messages.append(msg)
    return messages


class DisclosingCall(message.Call):  # type: ignore[misc]
    """A CALL whose options ask ``disclose_me`` (Autobahn's ``Call.parse`` drops the option; decode marks it)."""

    __slots__ = ()


class DisclosingRegister(message.Register):  # type: ignore[misc]
    """A REGISTER whose options ask ``disclose_caller`` (dropped by Autobahn's ``Register.parse`` too)."""

    __slots__ = ()


# Error texts name a message by its class (session.py's ``_kind``): these are still a CALL and a REGISTER.
DisclosingCall.__name__ = "Call"
DisclosingRegister.__name__ = "Register"


def _mark_disclosure(msg: Any, raw: list[Any]) -> None:
    """Keep the disclosure option Autobahn's parser drops, as the message's class (same slots, no copy)."""
    options = raw[2] if len(raw) > 2 else None
    if type(options) is dict:
        if type(msg) is message.Call and options.get("disclose_me") is True:
            msg.__class__ = DisclosingCall
        elif type(msg) is message.Register and options.get("disclose_caller") is True:
            msg.__class__ = DisclosingRegister


def _parse(classes: dict[int, Any], raw: Any) -> Any:
    """One decoded message through Autobahn's checks and ``parse`` (the serializer's own wording)."""
    if type(raw) is not list:
        raise ProtocolError(f"invalid type {type(raw)} for WAMP message")
    if not raw:
        raise ProtocolError("missing message type in WAMP message")
    message_type = raw[0]
    if type(message_type) is not int:
        raise ProtocolError(f"invalid type {type(message_type)} for WAMP message type")
    klass = classes.get(message_type)
    if klass is None:
        raise ProtocolError(f"invalid WAMP message type {message_type}")
    return klass.parse(raw)


#: EVENT.Details: the broker discloses nothing (no publisher, no topic for exact-match subscriptions).
_NO_DETAILS: dict[str, Any] = {}


def event_message(
    subscription: int,
    publication: int,
    args: list[Any] | None,
    kwargs: dict[str, Any] | None,
    details: dict[str, Any] | None = None,
) -> list[Any]:
    """The EVENT list as Autobahn's ``Event.marshal`` writes it: args only when needed, kwargs only when non-empty.

    ``details``: e.g. ``{"topic": t}`` for a pattern subscription's EVENT.
    """
    known = details or _NO_DETAILS
    if kwargs:
        return [EVENT, subscription, publication, known, args if args is not None else [], kwargs]
    if args:
        return [EVENT, subscription, publication, known, args]
    return [EVENT, subscription, publication, known]
