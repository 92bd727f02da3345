"""The stream protocol codec (docs/specs/stream-protocol.md): bracket-counting framing, requests, limits, bad input."""

from __future__ import annotations

import json

import pytest
from helpers.hostile import hostile_values, json_text
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.frontends.stream.codec import (
    Batch,
    BatchType,
    ClientDecoder,
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
    ServerDecoder,
    Status,
    StreamFramingError,
    Subscribe,
    Unsubscribe,
    encode,
    sha1_hex,
)

#: Topics with everything that could fool a bracket counter: braces, brackets, quotes, backslashes.
tricky_topics = st.sampled_from(['a}b', 'x{"y"}', "q\\\"}", "[]{}", "ünï}", "t"]) | st.text(
    st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20
)
payloads = st.binary(max_size=64) | st.sampled_from([b"{", b'{"Publish": 1}', b"}}}", b'"', b""])
requests = st.one_of(
    st.builds(Connect, st.sampled_from(["c1", 'n"}']), st.sampled_from(["g", "{grp}"])),
    st.builds(Publish, tricky_topics, payloads),
    st.builds(Batch, st.just(BatchType.COUNT), st.integers(1, 5)),
    st.builds(Batch, st.sampled_from([BatchType.START, BatchType.END])),
    st.builds(Subscribe, tricky_topics, st.sampled_from([Position.EARLIEST, Position.LATEST, Position.CURRENT])),
    st.builds(Subscribe, tricky_topics, st.just(Position.OFFSET), st.integers(0, 2**40)),
    st.builds(Unsubscribe, tricky_topics),
    st.builds(Commit, tricky_topics, st.integers(0, 2**40), st.integers(0, 3)),
    st.just(Close()),
)


def decode_all(data: bytes, chunks: list[int] | None = None, limits: Limits | None = None) -> list[object]:
    """Feed ``data`` to a server decoder, split after each offset in ``chunks``; every request."""
    decoder = ServerDecoder(limits or Limits())
    events: list[object] = []
    start = 0
    for cut in [*(chunks or []), len(data)]:
        decoder.receive(data[start:cut])
        events.extend(decoder.events())
        start = cut
    return events


@settings(max_examples=200, deadline=None)
@given(st.lists(requests, min_size=1, max_size=5), st.data())
def test_any_split_of_valid_frames_decodes_to_the_same_requests(frames: list[object], data: st.DataObject) -> None:
    """Frames encoded back to back decode to themselves however the bytes are split, with whitespace between."""
    wire = b"\n ".join(encode(frame) for frame in frames)  # type: ignore[arg-type]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    assert decode_all(wire, cuts) == frames


def test_every_single_split_point_of_a_tricky_stream() -> None:
    """A topic holding '}' and quotes and a payload starting with '{': every split point gives the same result."""
    frames = [
        Connect("client", "group"),
        Publish('ti}c"k[', b'{"Publish": {"topic": "x"}}'),
        Subscribe("}", Position.OFFSET, 7),
        Close(),
    ]
    wire = b"".join(encode(f) for f in frames)
    for cut in range(len(wire) + 1):
        assert decode_all(wire, [cut]) == frames, cut
    assert decode_all(wire, list(range(len(wire)))) == frames  # one byte at a time


def test_spec_examples_decode_including_the_trailing_comma() -> None:
    """The spec's headers, as written (its Unsubscribe example ends its object with a comma)."""
    payload = b"hello"
    wire = (
        b'{"Connect": {\n    "client_name": "Name of client",\n    "group_id": "group id of client"\n}}'
        + b'{"Publish":\n{\n"topic": "TOPIC",\n"payload_size": 5,\n"checksum": "'
        + sha1_hex(payload).encode()
        + b'"\n}\n}'  # the payload starts right after the header's last brace
        + payload
        + b'{"Batch": {"batch_type": "Count", "count": 2}}'
        + b'{"Subscribe":\n{\n"topic": "TOPIC",\n"position": "Offset",\n"offset": 3\n}\n}'
        + b'{"Unsubscribe":\n{\n"topic": "TOPIC",\n}\n}'
        + b'{"Commit":\n{\n    "topic": "topic",\n    "partition": 0,\n    "commit_offset": 9\n}\n}'
        + b'{ "status": "CLOSE" }'
    )
    assert decode_all(wire) == [
        Connect("Name of client", "group id of client"),
        Publish("TOPIC", payload),
        Batch(BatchType.COUNT, 2),
        Subscribe("TOPIC", Position.OFFSET, 3),
        Unsubscribe("TOPIC"),
        Commit("topic", 9, 0),
        Close(),
    ]


def test_checksum_mismatch_is_rejected_and_the_stream_stays_in_step() -> None:
    """A bad sha1 costs that message only: the next frame decodes."""
    bad = json.dumps({"Publish": {"topic": "t", "payload_size": 3, "checksum": "0" * 40}}).encode() + b"abc"
    good = encode(Publish("t", b"ok"))
    assert decode_all(bad + good) == [
        Rejected(ErrorCode.CHECKSUM_MISMATCH, "checksum is not the sha1 of the payload", "t"),
        Publish("t", b"ok"),
    ]


@pytest.mark.parametrize(
    ("header", "code", "fragment"),
    [
        ({"publish": {"topic": "t"}}, ErrorCode.BAD_REQUEST, "case-sensitive"),
        ({"Connect": {"client_name": "c"}}, ErrorCode.BAD_REQUEST, "missing 'group_id'"),
        ({"Connect": {"client_name": "c", "group_id": 5}}, ErrorCode.BAD_REQUEST, "wrong type"),
        ({"Subscribe": {"topic": "t", "position": "Middle"}}, ErrorCode.BAD_REQUEST, "position"),
        ({"Subscribe": {"topic": "t", "position": "Offset"}}, ErrorCode.BAD_REQUEST, "missing 'offset'"),
        ({"Subscribe": {"topic": "t", "position": "Offset", "offset": -1}}, ErrorCode.BAD_REQUEST, "negative"),
        ({"Subscribe": {"topic": "", "position": "Latest"}}, ErrorCode.BAD_REQUEST, "empty"),
        ({"Subscribe": {"topic": "a\nb", "position": "Latest"}}, ErrorCode.BAD_REQUEST, "control"),
        ({"Subscribe": {"topic": "t" * 513, "position": "Latest"}}, ErrorCode.TOO_LARGE, "longer than 512"),
        ({"Batch": {"batch_type": "Count", "count": 0}}, ErrorCode.TOO_LARGE, "between 1 and"),
        ({"Batch": {"batch_type": "count"}}, ErrorCode.BAD_REQUEST, "batch_type"),
        ({"Commit": {"topic": "t", "commit_offset": True}}, ErrorCode.BAD_REQUEST, "wrong type"),
        ({"Unsubscribe": "t"}, ErrorCode.BAD_REQUEST, "must be an object"),
        ({"Unsubscribe": {"topic": "t"}, "Commit": {}}, ErrorCode.BAD_REQUEST, "exactly one request"),
        ({"status": "close"}, ErrorCode.BAD_REQUEST, "case-sensitive"),
    ],
)
def test_bad_requests_are_rejected_and_the_next_frame_decodes(header: dict, code: ErrorCode, fragment: str) -> None:
    """Each whole-but-wrong frame is one Rejected event with a reason; the stream goes on."""
    events = decode_all(json.dumps(header).encode() + encode(Close()))
    assert len(events) == 2 and events[1] == Close()
    rejected = events[0]
    assert isinstance(rejected, Rejected) and rejected.code == code, rejected
    assert fragment in rejected.message


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"hello", ErrorCode.BAD_REQUEST),
        (b"[1, 2]", ErrorCode.BAD_REQUEST),
        (b"{not json}", ErrorCode.BAD_REQUEST),
        (b'{"Publish": {"topic": "t", "checksum": "' + b"0" * 40 + b'"}}', ErrorCode.BAD_REQUEST),
        (b'{"Publish": {"topic": "t", "payload_size": -1}}', ErrorCode.BAD_REQUEST),
        (b'{"Publish": {"topic": "t", "payload_size": 2000000}}', ErrorCode.TOO_LARGE),
        (b'{"Publish": {"topic": "t", "payload_size": 18446744073709551616}}', ErrorCode.BAD_REQUEST),
        (b"{" * 100 + b"}" * 100, ErrorCode.BAD_REQUEST),
        (b'{"Connect": {"client_name": "' + b"x" * 20000 + b'"}}', ErrorCode.TOO_LARGE),
    ],
)
def test_framing_errors_end_the_stream_with_a_code(data: bytes, code: ErrorCode) -> None:
    """What cannot be followed raises StreamFramingError (then the server closes); later input is not read."""
    decoder = ServerDecoder()
    decoder.receive(data + encode(Close()))
    with pytest.raises(StreamFramingError) as info:
        list(decoder.events())
    assert info.value.code == code
    with pytest.raises(StreamFramingError):
        list(decoder.events())


def test_a_header_that_never_ends_is_bounded() -> None:
    """An unterminated header fails as soon as it passes the limit, not when memory runs out."""
    decoder = ServerDecoder(Limits(max_header_bytes=1024))
    decoder.receive(b'{"Connect": {"client_name": "')
    assert list(decoder.events()) == []
    decoder.receive(b"a" * 2000)
    with pytest.raises(StreamFramingError) as info:
        list(decoder.events())
    assert info.value.code == ErrorCode.TOO_LARGE


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=4))
def test_random_bytes_give_events_or_a_framing_error_only(data: bytes, cuts: list[int]) -> None:
    """No input raises anything but StreamFramingError."""
    cuts = sorted(c for c in cuts if c <= len(data))
    try:
        events = decode_all(data, cuts)
    except StreamFramingError:
        return
    kinds = (Connect, Publish, Batch, Subscribe, Unsubscribe, Commit, Close, Rejected)
    assert all(isinstance(e, kinds) for e in events)


@settings(max_examples=200, deadline=None)
@given(hostile_values)
def test_hostile_json_in_a_header_is_a_clear_error(value: object) -> None:
    """Deep nesting, huge integers, NaN and lone surrogates inside a header: a framing error or a rejection."""
    header = json_text({"Subscribe": {"topic": "t", "position": "Offset", "offset": value}})
    try:
        events = decode_all(header)
    except StreamFramingError as e:
        assert e.code in (ErrorCode.BAD_REQUEST, ErrorCode.TOO_LARGE)
        return
    assert len(events) == 1
    assert isinstance(events[0], (Subscribe, Rejected))


def test_server_answers_encode_as_the_spec_shows_and_a_client_reads_them() -> None:
    """Status, Message (header then payload, sha1) and CommitAck round-trip through the client decoder."""
    assert json.loads(encode(Status(True))) == {"Status": {"status": "OK"}}
    assert json.loads(encode(Status(True, count=3))) == {"Status": {"status": "OK", "count": 3}}
    error = Status(False, code=422, message="checksum")
    assert json.loads(encode(error)) == {"Status": {"status": "ERROR", "code": 422, "message": "checksum"}}
    message = Message("t}", 41, b'{"x"')
    data = encode(message)
    header = data[: -len(message.payload)]
    assert json.loads(header) == {
        "Message": {"topic": "t}", "sequence": 41, "payload_size": 4, "checksum": sha1_hex(b'{"x"')}
    }
    ack = CommitAck("t", 9, 0)
    assert json.loads(encode(ack)) == {"CommitAck": {"topic": "t", "partition": 0, "offset": 9}}
    client = ClientDecoder()
    wire = encode(Status(True)) + data + encode(ack) + encode(error)
    got = []
    for i in range(len(wire)):
        client.receive(wire[i : i + 1])
        got.extend(client.events())
    assert got == [Status(True), message, ack, error]
