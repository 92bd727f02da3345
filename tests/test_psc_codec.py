"""The PSC codec: exact wire bytes, round trips, and a clear PSCDecodeError for every bad input."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from helpers.hostile import hostile_values, json_text
from hypothesis import example, given
from hypothesis import strategies as st

from pubsubclub.core.jsonbounds import check
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import psc
from pubsubclub.federation.psc import (
    PUBLISH,
    ChooseVersion,
    Hello,
    Limits,
    Meta,
    PSCDecodeError,
    Publish,
    Resume,
    Subscribe,
    SubscribePattern,
    Unsubscribe,
    UnsubscribePattern,
    choose_version,
    decode,
    encode,
)

# -- strategies -------------------------------------------------------------

#: Text orjson can encode: anything but lone surrogates.
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
topics = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)
json_values = st.recursive(
    st.none()
    | st.booleans()
    # Signed 64 bits: the JSON bounds (2**63 and up are refused, see the hostile tests below).
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
    max_leaves=30,
)
versions = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
metas = st.builds(
    Meta,
    origin=st.none() | text,
    published_at=st.none() | st.floats(0.0, psc.MAX_PUBLISH_TIME),
    message_id=st.none() | text,
    wamp_wrapped=st.booleans(),
)
patterns = st.builds(Pattern, st.sampled_from(["prefix", "wildcard"]), topics)
messages = st.one_of(
    st.builds(SubscribePattern, patterns),
    st.builds(UnsubscribePattern, patterns),
    st.builds(
        Resume,
        st.none(),
        st.just(0),
        st.lists(topics, max_size=3).map(tuple),
        st.none() | st.lists(patterns, max_size=3).map(tuple),
    ),
    st.builds(Hello, st.lists(versions, min_size=1, max_size=64).map(tuple)),
    st.builds(ChooseVersion, versions),
    st.builds(Subscribe, st.lists(topics, min_size=1, max_size=10).map(tuple)),
    st.builds(Unsubscribe, topics),
    st.builds(Publish, topics, json_values, st.none() | metas),
)
#: Arrays that start like PSC messages, so random input reaches every parameter check.
psc_shaped = st.builds(
    lambda kind, params: [kind, *params],
    st.sampled_from([101, 102, 103, 201, 202, 203, 204, 301]) | st.integers(-(2**63), 2**63) | json_values,
    st.lists(json_values | st.lists(st.integers(-3, 3), max_size=3) | metas.map(lambda m: {"o": m.origin}), max_size=4),
)


# -- round trips and exact bytes -------------------------------------------


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        (Hello(((0, 1),)), b"[101,[0,1]]"),
        (Hello(((0, 1), (0, 2))), b"[101,[0,1],[0,2]]"),
        (Hello(((1, 0), (0, 2), (0, 1))), b"[101,[1,0],[0,2],[0,1]]"),
        (ChooseVersion((0, 2)), b"[102,[0,2]]"),
        (Subscribe(("a",)), b'[201,"a"]'),
        (Subscribe(("a", "b")), b'[201,"a","b"]'),
        (Unsubscribe("a"), b'[202,"a"]'),
        (Publish("t", {"x": 1}), b'[301,"t",{"x":1}]'),
        (Publish("t", None), b'[301,"t",null]'),
        (Publish("t", [1, "two", {"three": [None, True, 4.5]}]), b'[301,"t",[1,"two",{"three":[null,true,4.5]}]]'),
        (Publish("t", "\u00e9\u4e2d"), '[301,"t","\u00e9\u4e2d"]'.encode()),
        (
            Publish("t", 1, Meta(origin="n1", published_at=2.5, message_id="n1-7", wamp_wrapped=True)),
            b'[301,"t",1,{"o":"n1","t":2.5,"i":"n1-7","w":1}]',
        ),
        (Publish("t", 1, Meta()), b'[301,"t",1,{}]'),
        (SubscribePattern(Pattern("prefix", "com.app.")), b'[203,"prefix","com.app."]'),
        (SubscribePattern(Pattern("wildcard", "$realm.b#app..temp")), b'[203,"wildcard","$realm.b#app..temp"]'),
        (UnsubscribePattern(Pattern("wildcard", "app..temp")), b'[204,"wildcard","app..temp"]'),
        (Resume("e-1", 7, ("a",)), b'[103,"e-1",7,["a"]]'),
        (Resume(None, 0, (), ()), b"[103,null,0,[],[]]"),
        (
            Resume("e-1", 7, ("a",), (Pattern("prefix", "p."), Pattern("wildcard", "w..x"))),
            b'[103,"e-1",7,["a"],[["prefix","p."],["wildcard","w..x"]]]',
        ),
    ],
)
def test_encode_gives_spec_bytes_and_decodes_back(message: psc.Message, wire: bytes) -> None:
    """Each message type encodes to the spec's JSON array and decodes back to an equal message."""
    assert encode(message) == wire
    assert decode(wire) == message
    assert decode(wire.decode()) == message


def test_decode_accepts_whitespace_and_ignores_unknown_meta_keys() -> None:
    """Formatting is free, and unknown metadata keys are ignored (room to extend 0.2)."""
    assert decode(b' [ 301 , "t" , 1 , { "o" : "x" , "future" : [1] } ] ') == Publish("t", 1, Meta(origin="x"))


def test_meta_publish_time_integer_decodes_as_float() -> None:
    """An integer publish time is accepted and becomes a float."""
    message = decode(b'[301,"t",1,{"t":5}]')
    assert isinstance(message, Publish) and message.meta == Meta(published_at=5.0)
    assert isinstance(message.meta.published_at, float)


def test_encode_refuses_what_it_could_not_decode() -> None:
    """Encoding an empty PSC101/PSC201 or a non-message is a local error, not bytes on the wire."""
    with pytest.raises(ValueError, match="PSC101"):
        encode(Hello(()))
    with pytest.raises(ValueError, match="PSC201"):
        encode(Subscribe(()))
    with pytest.raises(TypeError, match="not a PSC message"):
        encode("hello")  # type: ignore[arg-type]


# -- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "not JSON"),
        (b"nope", "not JSON"),
        (b'[301,"t",', "not JSON"),
        (b'[301,"t",1] trailing', "not JSON"),
        (b"\xff\xfe", "UTF-8"),
        (b'[201,"\xc3"]', "UTF-8"),
        (b"[" * 2000 + b"]" * 2000, "not JSON"),
        (b'{"type":101}', "not a JSON array but dict"),
        (b'"[101]"', "not a JSON array but str"),
        (b"101", "not a JSON array but int"),
        (b"null", "not a JSON array but NoneType"),
        (b"[]", "empty array"),
        (b"[true]", "message type must be an integer, got True"),
        (b"[1.0]", "message type must be an integer, got 1.0"),
        (b'["101"]', "message type must be an integer, got '101'"),
        (b"[null]", "message type must be an integer, got None"),
        (b"[[101]]", "message type must be an integer"),
        (b"[999]", "unknown message type 999"),
        (b"[0]", "unknown message type 0"),
        (b"[-101]", "unknown message type -101"),
        (b"[205]", "unknown message type 205"),
        # wrong arity
        (b"[101]", "PSC101 needs at least one version"),
        (b"[102]", "PSC102 takes 1 parameter(s), got 0"),
        (b"[102,[0,1],[0,2]]", "PSC102 takes 1 parameter(s), got 2"),
        (b"[201]", "PSC201 needs at least one topic"),
        (b"[202]", "PSC202 takes 1 parameter(s), got 0"),
        (b'[202,"a","b"]', "PSC202 takes 1 parameter(s), got 2"),
        (b"[301]", "PSC301 takes 2 parameters (3 with metadata), got 0"),
        (b'[301,"t"]', "PSC301 takes 2 parameters (3 with metadata), got 1"),
        (b'[301,"t",1,{},2]', "PSC301 takes 2 parameters (3 with metadata), got 4"),
        # wrong parameter types
        (b"[201,1]", "topic must be a string, got int"),
        (b'[201,"a",null]', "topic must be a string, got NoneType"),
        (b'[201,["a"]]', "topic must be a string, got list"),
        (b"[202,{}]", "topic must be a string, got dict"),
        (b"[301,7,1]", "topic must be a string, got int"),
        (b'[201,""]', "topic must not be empty"),
        (b'[202,""]', "topic must not be empty"),
        (b'[301,"",1]', "topic must not be empty"),
        (b'[101,"0.1"]', "version must be [major, minor]"),
        (b"[101,[0]]", "version must be [major, minor]"),
        (b"[101,[0,1,2]]", "version must be [major, minor]"),
        (b"[101,[0,1],[0,-2]]", "version must be [major, minor] with non-negative integers"),
        (b"[101,[-1,0]]", "non-negative integers"),
        (b"[101,[0,1.0]]", "non-negative integers"),
        (b"[101,[true,1]]", "non-negative integers"),
        (b'[101,[0,"1"]]', "non-negative integers"),
        (b"[101,[0,2147483648]]", "non-negative integers"),
        (b"[102,[0,-1]]", "non-negative integers"),
        (b"[102,{}]", "version must be [major, minor]"),
        # bad metadata
        (b'[301,"t",1,[]]', "metadata must be an object, got list"),
        (b'[301,"t",1,null]', "metadata must be an object, got NoneType"),
        (b'[301,"t",1,{"o":1}]', "'o' (origin) must be a string"),
        (b'[301,"t",1,{"t":"now"}]', "'t' (publish time) must be a number"),
        (b'[301,"t",1,{"t":true}]', "'t' (publish time) must be a number"),
        (b'[301,"t",1,{"i":5}]', "'i' (message id) must be a string"),
        (b'[301,"t",1,{"w":2}]', "'w' must be 0 or 1"),
        (b'[301,"t",1,{"w":true}]', "'w' must be 0 or 1"),
        (b'[301,"t",1,{"w":1.0}]', "'w' must be 0 or 1"),
        # bad patterns (0.5)
        (b"[203]", "PSC203 takes 2 parameter(s), got 0"),
        (b'[203,"prefix"]', "PSC203 takes 2 parameter(s), got 1"),
        (b'[204,"prefix","a","b"]', "PSC204 takes 2 parameter(s), got 3"),
        (b'[203,"exact","a"]', "PSC203: pattern match must be 'prefix' or 'wildcard', got 'exact'"),
        (b'[203,null,"a"]', "PSC203: pattern match must be 'prefix' or 'wildcard'"),
        (b'[204,"regex","a.*"]', "PSC204: pattern match must be 'prefix' or 'wildcard', got 'regex'"),
        (b'[203,"prefix",5]', "PSC203: pattern must be a string, got int"),
        (b'[203,"wildcard",""]', "PSC203: pattern must not be empty"),
        (b'[204,"prefix",["a"]]', "PSC204: pattern must be a string, got list"),
        (b'[103,null,0,[],{}]', "PSC103 patterns must be an array, got dict"),
        (b'[103,null,0,[],["prefix","a"]]', "PSC103 pattern must be [match, pattern], got 'prefix'"),
        (b'[103,null,0,[],[["prefix"]]]', "PSC103 pattern must be [match, pattern], got array of 1 item(s)"),
        (b'[103,null,0,[],[["glob","a"]]]', "PSC103: pattern match must be 'prefix' or 'wildcard'"),
        (b'[103,null,0,[],[["prefix",""]]]', "PSC103: pattern must not be empty"),
        (b"[103,null,0,[],[],[]]", "PSC103 takes 3 parameters (4 with patterns), got 5"),
    ],
)
def test_bad_input_raises_decode_error_naming_the_problem(data: bytes, problem: str) -> None:
    """Every kind of malformed message raises PSCDecodeError whose message names the problem."""
    with pytest.raises(PSCDecodeError) as info:
        decode(data)
    assert problem in str(info.value)


def test_message_over_size_limit() -> None:
    """A message longer than the link frame limit (max_message_size + link_headroom) is refused before parsing."""
    limits = Limits(max_message_size=16, link_headroom=4)
    at_limit = b'[301,"t","' + b"x" * 8 + b'"]'
    assert len(at_limit) == 20
    assert decode(at_limit, limits) == Publish("t", "x" * 8)
    with pytest.raises(PSCDecodeError, match="message of 21 bytes is over the limit of 20"):
        decode(at_limit[:-2] + b'x"]', limits)
    with pytest.raises(PSCDecodeError, match="over the limit"):
        decode(b"x" * (psc.DEFAULT_LIMITS.max_link_frame + 1))


@pytest.mark.parametrize("kind", [201, 202, 301])
def test_topic_over_length_limit(kind: int) -> None:
    """A topic longer than max_topic_length is refused in PSC201, PSC202 and PSC301."""
    limits = Limits(max_topic_length=5)
    tail = [1] if kind == 301 else []
    assert decode(orjson.dumps([kind, "x" * 5, *tail]), limits)
    with pytest.raises(PSCDecodeError, match="topic of 6 characters is over the limit of 5"):
        decode(orjson.dumps([kind, "x" * 6, *tail]), limits)


def test_pattern_over_length_limit_and_too_many_patterns() -> None:
    """Patterns share the topic length limit; PSC103 holds at most max_patterns_per_peer of them."""
    limits = Limits(max_topic_length=5, max_patterns_per_peer=2)
    assert decode(b'[203,"prefix","xxxxx"]', limits) == SubscribePattern(Pattern("prefix", "xxxxx"))
    with pytest.raises(PSCDecodeError, match="PSC203: pattern of 6 characters is over the limit of 5"):
        decode(b'[203,"prefix","xxxxxx"]', limits)
    two = b'[103,null,0,[],[["prefix","a"],["prefix","b"]]]'
    assert decode(two, limits) == Resume(None, 0, (), (Pattern("prefix", "a"), Pattern("prefix", "b")))
    with pytest.raises(PSCDecodeError, match="PSC103 with 3 patterns is over the limit of 2 per peer"):
        decode(two[:-2] + b',["prefix","c"]]]', limits)


def test_too_many_topics_or_versions() -> None:
    """PSC201 and PSC101 have a named limit on their number of parameters."""
    limits = Limits(max_topics_per_subscribe=2, max_versions=2)
    assert decode(b'[201,"a","b"]', limits) == Subscribe(("a", "b"))
    with pytest.raises(PSCDecodeError, match="PSC201 with 3 topics is over the limit of 2"):
        decode(b'[201,"a","b","c"]', limits)
    with pytest.raises(PSCDecodeError, match="PSC101 with 3 versions is over the limit of 2"):
        decode(b"[101,[0,1],[0,2],[0,3]]", limits)


# -- properties -------------------------------------------------------------


def _decode_or_error(data: bytes | str) -> psc.Message | None:
    try:
        return decode(data)
    except PSCDecodeError:
        return None


@given(st.binary(max_size=200))
def test_random_bytes_only_raise_decode_error(data: bytes) -> None:
    """Random bytes either decode or raise PSCDecodeError; nothing else escapes."""
    message = _decode_or_error(data)
    if message is not None:
        assert decode(encode(message)) == message


@given(json_values | psc_shaped)
def test_random_json_only_raises_decode_error(value: Any) -> None:
    """Random JSON, much of it shaped like PSC, decodes to a message that re-encodes, or raises PSCDecodeError."""
    message = _decode_or_error(orjson.dumps(value))
    if message is not None:
        assert decode(encode(message)) == message


@given(messages)
def test_valid_messages_round_trip(message: psc.Message) -> None:
    """decode(encode(m)) == m for every valid message."""
    assert decode(encode(message)) == message


# -- version choice -----------------------------------------------------------


@pytest.mark.parametrize(
    ("offered", "supported", "chosen"),
    [
        (((0, 1), (0, 2)), ((0, 1), (0, 2)), (0, 2)),
        (((0, 2), (0, 1)), ((0, 1), (0, 2)), (0, 2)),
        (((0, 1),), ((0, 1), (0, 2)), (0, 1)),
        (((0, 1), (0, 2), (1, 0)), ((0, 1), (0, 2)), (0, 2)),
        (((0, 1), (0, 9), (1, 0)), ((0, 9), (1, 0), (2, 0)), (1, 0)),
        (((0, 2),), ((0, 1),), None),
        (((1, 0), (3, 0)), ((0, 1), (0, 2)), None),
    ],
)
def test_choose_version_picks_highest_common(
    offered: tuple[psc.Version, ...], supported: tuple[psc.Version, ...], chosen: psc.Version | None
) -> None:
    """choose_version returns the highest version both sides speak, or None when there is none."""
    assert choose_version(offered, supported) == chosen


def test_choose_version_defaults_to_what_we_speak() -> None:
    """Without a supported list it uses SUPPORTED_VERSIONS (0.1 and 0.2)."""
    assert psc.SUPPORTED_VERSIONS == ((0, 1), (0, 2))
    assert choose_version(((0, 1), (0, 2), (0, 3))) == (0, 2)
    assert choose_version(((5, 5),)) is None


# -- hostile input: depth, numbers, surrogates ---------------------------------------


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"[" * 1000 + b"]" * 1000, "message type must be an integer, got array of 1 item(s)"),
        (b"[101," + b"[" * 999 + b"]" * 999 + b"]", "got array of 1 item(s)"),
        (b"[201," + b"[" * 999 + b"]" * 999 + b"]", "topic must be a string, got list"),
        (b'[301,"a\\ud800",1]', "not JSON"),
        ('[301,"a\ud800",1]', "not JSON"),
        (b'[301,"t",NaN]', "not JSON"),
        (b'[301,"t",1e400]', "not JSON"),
        (b"[" * 1100 + b"]" * 1100, "not JSON"),
        (b"[18446744073709551616]", "message type must be an integer, got 1.8446744073709552e+19"),
    ],
)
def test_hostile_frames_raise_decode_error_with_a_short_reason(data: bytes | str, problem: str) -> None:
    """Deep, non-finite, surrogate or huge input outside a PSC301 message is the link's error, named briefly."""
    with pytest.raises(PSCDecodeError) as info:
        decode(data)
    assert not isinstance(info.value, psc.PSCPayloadError)
    assert problem in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'[301,"t",' + b"[" * 65 + b"]" * 65 + b"]", "nested deeper than 64 levels"),
        (b'[301,"t",{"n":9223372036854775808}]', "integer of 64 bits is out of range"),
        (b'[301,"t",[-9223372036854775809]]', "integer of 64 bits is out of range"),
        (b'[301,"t",123456789012345678901234567890]', "integer of 97 bits is out of range"),
        (b'[301,"t",1,{"o":"n","x":' + b"[" * 70 + b"]" * 70 + b"}]", "nested deeper than 64 levels"),
        (b'[301,"t",1,{"o":"n","t":1e308,"i":"x"}]', "publish time 1e+308 is outside"),
        (b'[301,"t",1,{"o":"n","t":-1.0,"i":"x"}]', "publish time -1.0 is outside"),
        (b'[301,"t",1,{"t":10000000001}]', "publish time 10000000001.0 is outside"),
    ],
)
def test_out_of_bounds_psc301_message_raises_payload_error(data: bytes, problem: str) -> None:
    """A sound PSC301 whose message or metadata breaks the bounds raises PSCPayloadError naming the topic."""
    with pytest.raises(psc.PSCPayloadError) as info:
        decode(data)
    assert info.value.topic == "t"
    assert problem in str(info.value)


def test_psc301_message_at_the_bounds_decodes() -> None:
    """64 levels of message and the 64-bit integer edges are accepted."""
    deep = b"[" * 64 + b"]" * 64
    assert decode(b'[301,"t",' + deep + b"]") == Publish("t", orjson.loads(deep))
    assert decode(b'[301,"t",[9223372036854775807,-9223372036854775808]]') == Publish("t", [2**63 - 1, -(2**63)])


@given(hostile_values, st.sampled_from([101, 102, 103, 201, 202, 203, 204, 301]))
def test_fuzz_hostile_values_only_raise_decode_error(value: Any, kind: int) -> None:
    """Hostile values anywhere give PSCDecodeError (PSCPayloadError only for PSC301) or a message within bounds."""
    for frame in ([kind, value], [kind, "t", value], [kind, "t", "x", {"o": "n", "v": value}]):
        data = json_text(frame)
        try:
            message = decode(data)
        except psc.PSCPayloadError:
            assert kind == PUBLISH
            continue
        except PSCDecodeError:
            continue
        if isinstance(message, Publish):
            check(message.message)


@given(hostile_values)
def test_fuzz_hostile_text_frames_only_raise_decode_error(value: Any) -> None:
    """The same values handed over as ``str`` (as Autobahn could) still raise only PSCDecodeError."""
    try:
        decode(json_text(value).decode())
    except PSCDecodeError:
        pass


meta_items = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**54), st.floats(allow_nan=False), st.text(max_size=4), st.just([])
)


@given(st.dictionaries(st.sampled_from(["o", "t", "i", "w", "s", "x"]), meta_items, max_size=6))
@example({"o": "n1", "t": 1.5, "i": "n1-b-1", "s": 7})
@example({"o": "n1", "t": 1.5, "i": "n1-b-1", "w": 1, "s": 2**53 - 1})
@example({"o": "n1", "t": 1.5, "i": "n1-b-1", "w": True})
@example({"o": "n1", "t": 1.5, "i": "n1-b-1", "s": 2**53})
@example({"o": "n1", "t": 1.5, "i": "n1-b-1", "s": 0})
def test_psc301_metadata_shortcut_agrees_with_the_checks_one_by_one(fields: dict[str, Any]) -> None:
    """Metadata of any shape decodes to the Meta, or fails with the problem, that the field-by-field checks give."""
    data = orjson.dumps([PUBLISH, "t", 1, fields])
    fields = orjson.loads(data)[3]  # what the wire holds: orjson writes a non-finite float as null
    try:
        expected: Meta | str = psc._checked_meta("t", fields)
    except PSCDecodeError as e:
        expected = str(e)
    for bounded in (False, True):
        try:
            got: Meta | str | None = decode(data, bounded=bounded).meta  # type: ignore[union-attr]
        except PSCDecodeError as e:
            got = str(e)
        assert got == expected
