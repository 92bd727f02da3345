"""NSD codec: the spec's requests and responses, the bounded line framer, fuzzing."""

from __future__ import annotations

import orjson
import pytest
from helpers.hostile import hostile_values, json_text
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.core.jsonbounds import check
from pubsubclub.frontends.nsd import codec


def test_spec_requests_decode() -> None:
    """Every request example of the spec decodes to its dataclass."""
    assert codec.decode_request(b'{"_class":"OpenRequest", "identity":"Alice"}') == codec.OpenRequest("Alice")
    pub = codec.decode_request(
        b'{"_class":"PublishRequest", "identity":"Alice", "message":{"_class":"Message", "from":"Bob", '
        b'"when":0, "body":"Hello again!"}}'
    )
    assert pub == codec.PublishRequest("Alice", {"_class": "Message", "from": "Bob", "when": 0, "body": "Hello again!"})
    assert codec.decode_request(
        b'{"_class":"SubscribeRequest", "identity":"Alice", "channel":"Bob"}'
    ) == codec.SubscribeRequest("Alice", "Bob")
    assert codec.decode_request(
        b'{"_class":"UnsubscribeRequest", "identity":"Alice", "channel":"Bob"}'
    ) == codec.UnsubscribeRequest("Alice", "Bob")
    assert codec.decode_request(b'{"_class":"GetRequest", "identity":"Alice", "after":42}') == codec.GetRequest(
        "Alice", 42
    )


def test_extra_message_fields_are_kept() -> None:
    """A message's extra fields (such as pic) survive decoding unchanged."""
    line = b'{"_class":"PublishRequest","identity":"A","message":{"_class":"Message","body":"x","pic":"iVBOR"}}'
    request = codec.decode_request(line)
    assert isinstance(request, codec.PublishRequest) and request.message["pic"] == "iVBOR"


@pytest.mark.parametrize(
    "line",
    [
        b"[{]",
        b"not json",
        b"[]",
        b"42",
        b'{"identity":"A"}',
        b'{"_class":"NopeRequest","identity":"A"}',
        b'{"_class":"OpenRequest"}',
        b'{"_class":"OpenRequest","identity":5}',
        b'{"_class":"OpenRequest","identity":""}',
        b'{"_class":"OpenRequest","identity":"a\\nb"}',
        b'{"_class":"OpenRequest","identity":"$nsd.control"}',
        b'{"_class":"SubscribeRequest","identity":"A"}',
        b'{"_class":"SubscribeRequest","identity":"A","channel":["B"]}',
        b'{"_class":"GetRequest","identity":"A"}',
        b'{"_class":"GetRequest","identity":"A","after":-1}',
        b'{"_class":"GetRequest","identity":"A","after":1.5}',
        b'{"_class":"GetRequest","identity":"A","after":"3"}',
        b'{"_class":"GetRequest","identity":"A","after":true}',
        b'{"_class":"PublishRequest","identity":"A"}',
        b'{"_class":"PublishRequest","identity":"A","message":"hi"}',
        b'{"_class":"PublishRequest","identity":"A","message":{"body":"x"}}',
        b'{"_class":"PublishRequest","identity":"A","message":{"_class":"Message","body":5}}',
        b'{"_class":"PublishRequest","identity":"A","message":{"_class":"Message","body":"x","from":1}}',
        b"\xff\xfe{}",
    ],
)
def test_invalid_requests_get_the_spec_error_with_the_line(line: bytes) -> None:
    """Anything but a valid request is INVALID REQUEST followed by the line received."""
    with pytest.raises(codec.NSDRequestError) as info:
        codec.decode_request(line)
    assert info.value.error == "INVALID REQUEST: " + line.decode("utf-8", errors="replace")


def test_responses_are_the_spec_lines() -> None:
    """Responses encode as single lines with the spec's classes and texts."""
    assert orjson.loads(codec.encode_success()) == {"_class": "SuccessResponse"}
    assert orjson.loads(codec.encode_error(codec.no_such_channel("Bob"))) == {
        "_class": "ErrorResponse",
        "error": "NO SUCH CHANNEL: Bob",
    }
    assert codec.message_too_big(1234) == "MESSAGE TOO BIG: 1234 characters"
    listed = codec.encode_message_list([b'{"_class":"Message","from":"Bob","when":47,"body":"Hello again!"}'])
    assert listed.endswith(b"\n") and listed.count(b"\n") == 1
    assert orjson.loads(listed)["messages"][0]["when"] == 47
    assert orjson.loads(codec.encode_message_list([])) == {"_class": "MessageListResponse", "messages": []}


def test_framer_splits_lines_across_chunks_and_strips_cr() -> None:
    """Lines may arrive in pieces and end with CRLF or LF."""
    framer = codec.LineFramer(100)
    assert framer.feed(b'{"a"') == []
    assert framer.feed(b":1}\r\n{}\n{") == [codec.Line(b'{"a":1}'), codec.Line(b"{}")]
    assert framer.pending == 1


def test_framer_never_holds_more_than_the_cap() -> None:
    """An oversize line is discarded as it streams in and reported once with its length in characters."""
    framer = codec.LineFramer(10)
    out = []
    for _ in range(1000):
        out += framer.feed(("é" * 100).encode())  # 100 characters, 200 bytes
        assert framer.pending <= 10
    out += framer.feed(b"\nok\n")
    assert out == [codec.OversizeLine(100_000), codec.Line(b"ok")]


@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_raise_the_request_error(data: bytes) -> None:
    """Random bytes never make the decoder raise anything but NSDRequestError."""
    try:
        codec.decode_request(data)
    except codec.NSDRequestError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@given(
    st.dictionaries(
        st.sampled_from(["_class", "identity", "channel", "after", "message", "x"]),
        json_values | st.sampled_from(["OpenRequest", "PublishRequest", "GetRequest", "SubscribeRequest"]),
    )
)
def test_fuzz_random_objects_only_raise_the_request_error(obj: dict[str, object]) -> None:
    """Random request-shaped objects either decode or raise NSDRequestError."""
    try:
        codec.decode_request(orjson.dumps(obj))
    except codec.NSDRequestError:
        pass


@given(st.lists(st.binary(max_size=40), max_size=30))
def test_fuzz_framer_is_bounded_and_loses_no_short_line(chunks: list[bytes]) -> None:
    """The framer never buffers past its cap, and short lines come out intact."""
    framer = codec.LineFramer(32)
    out = []
    for chunk in chunks:
        out += framer.feed(chunk)
        assert framer.pending <= 32
    stream = b"".join(chunks)
    complete = stream.split(b"\n")[:-1]
    expected = [codec.Line(line[:-1] if line.endswith(b"\r") else line) for line in complete if len(line) <= 32]
    assert [item for item in out if isinstance(item, codec.Line)] == expected


# -- hostile input: depth, numbers, surrogates ---------------------------------------


def publish_line(message: object) -> bytes:
    """A PublishRequest line carrying ``message`` as written by a hostile client."""
    return json_text({"_class": "PublishRequest", "identity": "A", "message": message})


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (publish_line({"_class": "Message", "body": "x", "x": [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]}), None),
        (b'{"_class":"PublishRequest","identity":"A","message":{"_class":"Message","body":"x","x":'
         + b"[" * 256 + b"]" * 256 + b"}}", "nested deeper than 64 levels"),
        (publish_line({"_class": "Message", "body": "x", "when": 2**63}), "out of range"),
        (publish_line({"_class": "Message", "body": "x", "n": 2**64}), "out of range"),
        (b'{"_class":"GetRequest","identity":"A","after":9223372036854775808}', "out of range"),
        (b'{"_class":"GetRequest","identity":"A","after":1e400}', "not JSON"),
        (b'{"_class":"PublishRequest","identity":"A","message":{"_class":"Message","body":NaN}}', "not JSON"),
        (b'{"_class":"OpenRequest","identity":"a\\ud800"}', "not JSON"),
    ],
)  # fmt: skip
def test_hostile_requests_get_invalid_request(line: bytes, problem: str | None) -> None:
    """Deep, huge, non-finite and surrogate requests are INVALID REQUEST naming the problem (20 levels are fine)."""
    if problem is None:
        assert isinstance(codec.decode_request(line), codec.PublishRequest)
        return
    with pytest.raises(codec.NSDRequestError) as info:
        codec.decode_request(line)
    assert problem in info.value.problem
    assert info.value.error == "INVALID REQUEST: " + line.decode()


@given(hostile_values, st.sampled_from(["message", "after", "identity", "channel", "x"]))
def test_fuzz_hostile_values_only_raise_the_request_error(value: object, field: str) -> None:
    """Hostile values in any field of any request decode within the bounds or raise NSDRequestError."""
    for kind in ("PublishRequest", "GetRequest", "SubscribeRequest"):
        obj: dict[str, object] = {"_class": kind, "identity": "A", "channel": "B", "after": 0}
        obj["message"] = {"_class": "Message", "body": "b", "extra": value}
        obj[field] = value if field != "message" else obj["message"]
        try:
            request = codec.decode_request(json_text(obj))
        except codec.NSDRequestError:
            continue
        if isinstance(request, codec.PublishRequest):
            check(request.message)
