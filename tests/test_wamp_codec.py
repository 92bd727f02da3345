"""The WAMP codec on the hot path (orjson JSON, PUBLISH in, EVENT out) against Autobahn's: same values, refusals."""

from __future__ import annotations

import copy
import json
from typing import Any

import autobahn.twisted  # noqa: F401 - selects Twisted for txaio before autobahn.wamp.serializer binds its clock
import pytest
from autobahn.wamp import message
from autobahn.wamp.serializer import JsonObjectSerializer, JsonSerializer, MsgPackSerializer
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pubsubclub.core.jsonbounds import JSONBounds
from pubsubclub.frontends.wamp.codec import PublishRequest, decode, event_message, publish_request
from pubsubclub.frontends.wamp.transport import _BoundedJsonObjectSerializer, bounded_serializers

OURS = _BoundedJsonObjectSerializer(JSONBounds())
THEIRS = JsonObjectSerializer()

#: JSON values as WAMP carries them: int64 integers, finite floats, text without lone surrogates, and bytes.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    # A string starting with NUL *is* the binary convention (Autobahn reads it as base64 too).
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20).filter(lambda t: t[:1] != "\x00")
    | st.binary(max_size=20)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8), children, max_size=4
        )
    ),
    max_leaves=20,
)
#: Message-shaped lists: a type code, a request id, options, a URI, args, kwargs.
messages = st.tuples(
    st.sampled_from([1, 16, 32, 36, 6]),
    st.integers(min_value=0, max_value=2**53),
    st.dictionaries(st.text(max_size=8), scalars, max_size=3),
    st.text(alphabet="abc.", min_size=1, max_size=20),
    st.lists(values, max_size=3),
    st.dictionaries(st.text(max_size=8), values, max_size=3),
).map(list)


@settings(max_examples=400)
@given(messages)
def test_encoding_reads_back_as_autobahns(message: list[Any]) -> None:
    """Every message encodes to JSON that any reader (Python's, Autobahn's) reads as Autobahn's encoding.

    The bytes are Autobahn's too, except that a float may be written in another
    valid form of the same double (orjson: ``0.00001``, Python: ``1e-05``).
    """
    ours, theirs = OURS.serialize(message), THEIRS.serialize(message)
    assert json.loads(ours) == json.loads(theirs)
    assert THEIRS.unserialize(ours) == THEIRS.unserialize(theirs)


@settings(max_examples=400)
@given(messages)
def test_decoding_gives_autobahns_values(message: list[Any]) -> None:
    """Decoding Autobahn's bytes gives the same values (bytes included) as Autobahn's decoder."""
    data = THEIRS.serialize(message)
    assert OURS.unserialize(data) == THEIRS.unserialize(data)


def _outcome(serializer: Any, data: bytes) -> Any:
    try:
        return ("ok", serializer.unserialize(data))
    except Exception:
        return "refused"


@settings(max_examples=400)
@given(st.binary(max_size=40) | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_junk_is_refused_where_autobahn_refuses_it(data: bytes) -> None:
    """Random input: both refuse it, or both read the same value (ours then also checks the bounds)."""
    ours, theirs = _outcome(OURS, data), _outcome(THEIRS, data)
    if theirs == "refused":
        assert ours == "refused"
    elif ours != "refused":
        assert ours == theirs


@pytest.mark.parametrize(
    "data",
    [b'[16,1,{},"t",["\\u0000AQI="]]', b'[16,1,{"\\u0000k":1},"t",[]]', b'[16,1,{},"t",[1.5e300,-0.0,1e-7]]'],
)
def test_binary_convention_and_floats_as_autobahn(data: bytes) -> None:
    """NUL-prefixed strings become bytes in values (not in keys); floats read the same."""
    assert OURS.unserialize(data) == THEIRS.unserialize(data)


# -- PUBLISH in, EVENT out without Autobahn Message objects (pubsubclub/frontends/wamp/codec.py) ------------------

JSON_WAMP, MSGPACK_WAMP = (
    {s.SERIALIZER_ID: s for s in bounded_serializers(JSONBounds())}[name] for name in ("json", "msgpack")
)

#: Option keys Autobahn checks for PUBLISH, the two the broker reads, and some it ignores.
option_keys = st.sampled_from(
    [
        "acknowledge",
        "exclude_me",
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
        "x_custom",
        "disclose_me",
    ]
)
option_values = (
    st.booleans()
    | st.integers(min_value=-5, max_value=2**54)
    | st.text(max_size=5)
    | st.lists(st.integers(min_value=0, max_value=10) | st.text(max_size=3), max_size=3)
    | st.fixed_dictionaries(
        {"session": st.integers(0, 9), "authid": st.text(max_size=3), "authrole": st.text(max_size=3)}
    )
    | st.sampled_from(["cryptobox", "mqtt", "xbr", "json", "cbor", "msgpack"])
    | st.none()
)
#: Each field: usually valid (the fast path's cases), otherwise any of many wrong shapes.
valid_topics = st.sampled_from(["com.example.t", "a", "a.b.c", "Ünï.cödé", "x-y_z.1"])
topics = (
    valid_topics | valid_topics | st.sampled_from(["a..b", ".a", "a.", "a b", "a#b", "a\n", ""]) | st.text(max_size=12)
)
valid_requests = st.integers(min_value=0, max_value=2**53)
requests = valid_requests | valid_requests | st.sampled_from([-1, 0, 2**53, 2**53 + 1, 1.0, "1", None, True, [1]])
valid_options = st.dictionaries(st.sampled_from(["acknowledge", "exclude_me", "x_custom"]), st.booleans(), max_size=2)
options = (
    valid_options
    | valid_options
    | st.dictionaries(option_keys, option_values, max_size=3)
    | st.dictionaries(st.integers(0, 3), st.booleans(), max_size=1)
    | st.sampled_from([None, [], "x"])
)
valid_args = st.lists(values, max_size=3)
valid_kwargs = st.dictionaries(st.text(max_size=4), values, max_size=3)
args_field = valid_args | valid_args | st.sampled_from(["s", b"b", None, 1, {"a": 1}])
kwargs_field = (
    valid_kwargs
    | valid_kwargs
    | st.dictionaries(st.integers(0, 3), values, max_size=2)
    | st.sampled_from(["s", b"b", None, [1]])
)
#: PUBLISH-shaped lists, valid and not: right and wrong types and lengths in every position.
publishes = st.tuples(
    requests, options, topics, args_field, kwargs_field, st.sampled_from([4, 5, 6, 4, 5, 6, 1, 2, 3, 7])
).map(lambda t: [16, *t[:-1], "extra"][: t[-1]])


def _fields(msg: Any) -> Any:
    """What the broker reads from a PUBLISH (Autobahn's or ours), for comparing; other messages as they are."""
    if isinstance(msg, message.Publish):
        msg = PublishRequest.from_message(msg)
    if isinstance(msg, PublishRequest):
        # Autobahn's Publish has no disclose_me (it drops the option); decode keeps it from the raw
        # options, which test_publish_options_take_the_slower_path_and_are_kept checks.
        return ("PUBLISH", msg._replace(size=None, disclose_me=None))
    return msg


def _parsed(parse: Any, *args: Any) -> Any:
    try:
        return ("ok", [_fields(m) for m in parse(*args)])
    except Exception as e:
        return ("error", type(e), str(e))


@settings(max_examples=500)
@given(publishes)
def test_fast_publish_only_where_autobahn_accepts_with_the_same_fields(raw: list[Any]) -> None:
    """Where the fast decoder takes a PUBLISH, Autobahn's ``Publish.parse`` accepts it and reads the same fields."""
    fast = publish_request(raw)
    if fast is not None:
        assert _fields(fast) == _fields(message.Publish.parse(raw))


@settings(max_examples=300)
@given(st.tuples(valid_requests, st.dictionaries(option_keys, option_values, max_size=3), valid_topics, valid_args))
def test_fast_publish_checks_options_as_autobahn(fields: tuple[Any, ...]) -> None:
    """Random options on otherwise valid PUBLISHes: taken fast only where Autobahn accepts them, same flags."""
    raw = [16, *fields]
    fast = publish_request(raw)
    theirs = _parsed(lambda: [message.Publish.parse(raw)])
    if fast is not None:
        assert theirs == ("ok", [_fields(fast)])


@settings(max_examples=500)
@given(publishes, st.sampled_from(["json", "msgpack"]))
@example([16, 1, {"disclose_me": False}, "com.example.t"], "json")
def test_decode_accepts_and_refuses_exactly_as_autobahn(raw: list[Any], name: str) -> None:
    """Bytes of random PUBLISH-shaped messages: our decode and Autobahn's unserialize agree, errors word for word."""
    serializer = copy.copy(JSON_WAMP if name == "json" else MSGPACK_WAMP)
    try:
        data = serializer._serializer.serialize(raw)
    except TypeError:  # a message JSON cannot carry (integer keys): nothing to compare
        return
    binary = name == "msgpack"
    assert _parsed(decode, serializer, data, binary) == _parsed(serializer.unserialize, data, binary)


@settings(max_examples=300)
@given(messages, st.sampled_from(["json", "msgpack"]), st.sampled_from([None, True, False]))
def test_decode_of_other_messages_is_autobahns(raw: list[Any], name: str, binary: bool | None) -> None:
    """Other message types, and frames of the wrong kind (text for MessagePack), decode or fail as with Autobahn."""
    serializer = copy.copy(JSON_WAMP if name == "json" else MSGPACK_WAMP)
    data = serializer._serializer.serialize(raw)
    assert _parsed(decode, serializer, data, binary) == _parsed(serializer.unserialize, data, binary)


@pytest.mark.parametrize(
    "raw",
    [
        [16, 1, {}, "com.example.t", [{"i": 1, "p": "x" * 100}]],
        [16, 2**53, {"acknowledge": True}, "a", [1, 2], {"k": b"\x00\x01"}],
        [16, 3, {"exclude_me": False, "x_custom": True}, "a.b"],
    ],
)
def test_common_publishes_take_the_fast_path(raw: list[Any]) -> None:
    """The publishes clients send every day are decoded without an Autobahn message, with their byte count."""
    data = JSON_WAMP._serializer.serialize(raw)
    (decoded,) = decode(copy.copy(JSON_WAMP), data, False)
    assert isinstance(decoded, PublishRequest)
    assert decoded.size == len(data)
    assert _fields(decoded) == _fields(message.Publish.parse(raw))


@pytest.mark.parametrize(
    ("options", "routing", "disclose"),
    [
        ({"disclose_me": True}, None, True),
        ({"exclude": [5, 7], "eligible_authrole": ["r"]}, {"x": [5, 7], "er": ["r"]}, None),
        (
            {"eligible": [1], "exclude_authid": ["a"], "eligible_authid": ["b"]},
            {"e": [1], "xa": ["a"], "ea": ["b"]},
            None,
        ),
        ({"exclude_authrole": ["x"], "disclose_me": "yes"}, {"xr": ["x"]}, None),
    ],
)
def test_publish_options_take_the_slower_path_and_are_kept(
    options: dict[str, Any], routing: dict[str, Any] | None, disclose: bool | None
) -> None:
    """A PUBLISH with routing options or disclose_me is Autobahn-parsed, and keeps them as a routing object."""
    data = JSON_WAMP._serializer.serialize([16, 4, options, "a.b", [1]])
    (decoded,) = decode(copy.copy(JSON_WAMP), data, False)
    assert isinstance(decoded, PublishRequest)
    assert publish_request([16, 4, options, "a.b", [1]]) is None
    assert (decoded.routing, decoded.disclose_me, decoded.args) == (routing, disclose, [1])


@settings(max_examples=400)
@given(
    st.integers(min_value=0, max_value=2**53),
    st.integers(min_value=0, max_value=2**53),
    st.lists(values, max_size=3),
    st.none() | st.dictionaries(st.text(max_size=6), values, max_size=3),
    st.sampled_from(["json", "msgpack"]),
)
def test_event_bytes_read_as_autobahns_event(
    subscription: int, publication: int, args: list[Any], kwargs: dict[str, Any] | None, name: str
) -> None:
    """EVENT bytes from ``event_message`` + our serializer read, with Autobahn's own serializer, as its EVENT."""
    ours = JSON_WAMP if name == "json" else MSGPACK_WAMP
    theirs = JsonSerializer() if name == "json" else MsgPackSerializer()
    data = ours._serializer.serialize(event_message(subscription, publication, args, kwargs))
    expected = message.Event(subscription, publication, args=args, kwargs=kwargs)
    (decoded,) = theirs.unserialize(data, name == "msgpack")
    (autobahns,) = theirs.unserialize(expected.serialize(theirs._serializer), name == "msgpack")
    assert decoded == autobahns
    assert (decoded.args, decoded.kwargs) == (autobahns.args, autobahns.kwargs)


def test_binary_payload_in_event_uses_the_nul_base64_convention() -> None:
    """Bytes in an EVENT are ``"\\0"`` + base64 in JSON and bin in MessagePack, as Autobahn writes them."""
    raw = event_message(7, 9, [b"\x00\xffab"], {"k": [b""]})
    assert JSON_WAMP._serializer.serialize(raw) == b'[36,7,9,{},["\\u0000AP9hYg=="],{"k":["\\u0000"]}]'
    assert MSGPACK_WAMP._serializer.serialize(raw) == MsgPackSerializer()._serializer.serialize(raw)
