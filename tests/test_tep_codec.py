"""The TEP codec (sans-IO) and the TEP client logic on an in-memory hub."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.hostile import hostile_values, json_text
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.core.hub import Hub
from pubsubclub.core.jsonbounds import check
from pubsubclub.frontends.tep.codec import (
    Broadcast,
    ClientChannels,
    ClientPublish,
    ErrorFrame,
    Event,
    Join,
    JoinReply,
    Leave,
    LeaveReply,
    TEPDecodeError,
    TEPLimits,
    channel_problem,
    decode_client,
    decode_server,
    encode_client,
    encode_server,
)
from pubsubclub.frontends.tep.protocol import BROADCAST_TOPIC, TEPClient, TEPServer
from pubsubclub.testing import MemoryTEPTransport

LIMITS = TEPLimits(max_frame_bytes=4096, max_channel_length=32, max_channels_per_client=3, max_channels_per_request=5)


def frames(*objs: Any) -> tuple[Any, ...]:
    """Encoded server frames decoded back into plain JSON values."""
    return tuple(json.loads(o) for o in objs)


# -- the spec's examples ----------------------------------------------------------


def test_spec_join_example_decodes() -> None:
    """The spec's join request (with a dotted subtopic) is a Join of both channels."""
    data = b'{"topic": "join", "payload": ["channel1", "channel2.subtopic"]}'
    assert decode_client(data) == Join(("channel1", "channel2.subtopic"))


def test_spec_leave_example_decodes() -> None:
    """The spec's leave request is a Leave of both channels."""
    data = '{"topic": "leave", "payload": ["channel1", "channel2.subtopic"]}'
    assert decode_client(data) == Leave(("channel1", "channel2.subtopic"))


def test_custom_command_is_a_publish() -> None:
    """A message on a non-system topic (the spec's 'custom') publishes its payload."""
    assert decode_client(b'{"topic": "custom", "payload": "Something"}') == ClientPublish("custom", "Something")


def test_join_reply_sends_accepted_then_rejected() -> None:
    """A mixed reply is '@join' with the accepted channels, then '#join' with the rejected, as in the spec's UML."""
    assert frames(*encode_server(JoinReply(("chan1",), ("chan2",)))) == (
        {"topic": "@join", "payload": ["chan1"]},
        {"topic": "#join", "payload": ["chan2"]},
    )


def test_reply_frames_only_when_non_empty() -> None:
    """All-accepted sends only '@', all-rejected only '#', an empty request '@' with []."""
    assert frames(*encode_server(LeaveReply(("a",), ()))) == ({"topic": "@leave", "payload": ["a"]},)
    assert frames(*encode_server(LeaveReply((), ("a",)))) == ({"topic": "#leave", "payload": ["a"]},)
    assert frames(*encode_server(JoinReply((), ()))) == ({"topic": "@join", "payload": []},)


def test_event_broadcast_and_error_shapes() -> None:
    """Events carry topic and payload, broadcasts only payload, errors '#error' with error and frame."""
    assert frames(*encode_server(Event("channel1", {"foo": "bar"}))) == (
        {"topic": "channel1", "payload": {"foo": "bar"}},
    )
    assert frames(*encode_server(Broadcast({"foo": "bar"}))) == ({"payload": {"foo": "bar"}},)
    assert frames(*encode_server(ErrorFrame("bad", "x"))) == (
        {"topic": "#error", "payload": {"error": "bad", "frame": "x"}},
    )


# -- round trips -------------------------------------------------------------------

channel_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")),
    min_size=1,
    max_size=32,
).filter(lambda s: channel_problem(s, LIMITS) is None)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)


@given(st.lists(channel_names, max_size=5), json_values, channel_names)
def test_client_frames_round_trip(channels: list[str], payload: Any, topic: str) -> None:
    """Every client frame decodes back to itself."""
    for frame in (Join(tuple(channels)), Leave(tuple(channels)), ClientPublish(topic, payload)):
        assert decode_client(encode_client(frame), LIMITS) == frame


@given(st.lists(channel_names, max_size=5), json_values, channel_names, st.text())
def test_server_frames_round_trip(channels: list[str], payload: Any, topic: str, text: str) -> None:
    """Every server frame decodes back to itself (a reply's two frames merged)."""
    for frame in (Event(topic, payload), Broadcast(payload), ErrorFrame(text, text), ErrorFrame(text)):
        (data,) = encode_server(frame)
        assert decode_server(data, LIMITS) == frame
    half = len(channels) // 2
    for reply in (JoinReply, LeaveReply):
        sent = reply(tuple(channels[:half]), tuple(channels[half:]))
        parts = [decode_server(data, LIMITS) for data in encode_server(sent)]
        merged = reply(sum((p.accepted for p in parts), ()), sum((p.rejected for p in parts), ()))  # type: ignore[union-attr]
        assert merged == sent


# -- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"topic": "a", "payload": 1', "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        ('{"topic": "a\ud800", "payload": 1}', "lone surrogate"),
        (b"[1, 2]", "must be a JSON object, not array"),
        (b'"join"', "must be a JSON object, not string"),
        (b"null", "must be a JSON object, not null"),
        (b'{"payload": 1}', "missing field 'topic'"),
        (b'{"topic": "a"}', "missing field 'payload'"),
        (b'{"topic": 5, "payload": 1}', "'topic' must be a string, not number"),
        (b'{"topic": "a", "payload": 1, "id": 2}', "unknown field(s) 'id'"),
        (b'{"topic": "join", "payload": "chan1"}', "must be an array of channel names, not string"),
        (b'{"topic": "leave", "payload": {"a": 1}}', "must be an array of channel names, not object"),
        (b'{"topic": "join", "payload": ["a", 3]}', "item 1 must be a string, not number"),
        (b'{"topic": "join", "payload": ["a","b","c","d","e","f"]}', "6 channels is over the limit of 5"),
        (b'{"topic": "@join", "payload": ["a"]}', "unknown system command '@join'"),
        (b'{"topic": "#leave", "payload": []}', "unknown system command '#leave'"),
        (b'{"topic": "$tep.broadcast", "payload": 1}', "unknown system command"),
        (b'{"topic": "", "payload": 1}', "channel name is empty"),
        (b'{"topic": "a b", "payload": 1}', "whitespace or control characters"),
        (b'{"topic": "a\\u0000", "payload": 1}', "whitespace or control characters"),
        (('{"topic": "' + "x" * 33 + '", "payload": 1}').encode(), "33 characters is over the limit of 32"),
        (b'{"topic": "a", "payload": "' + b"x" * 4096 + b'"}', "over the limit of 4096"),
        (b'{"topic": "a", "payload": ' + b"[" * 2000 + b"]" * 2000 + b"}", "not valid JSON"),
        (b'{"topic": "a", "payload": NaN}', "not valid JSON"),
    ],
)
def test_bad_client_frames(data: bytes | str, problem: str) -> None:
    """Each class of bad input raises TEPDecodeError naming the problem."""
    with pytest.raises(TEPDecodeError) as e:
        decode_client(data, LIMITS)
    assert problem in str(e.value)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("chan1", True),
        ("channel2.subtopic", True),
        ("Ünïcødé-ok_1", True),
        ("join", False),
        ("leave", False),
        ("@join", False),
        ("#join", False),
        ("@leave", False),
        ("#leave", False),
        ("@anything", False),
        ("#x", False),
        ("$tep.broadcast", False),
        ("", False),
        ("tab\there", False),
        ("new\nline", False),
        ("nbsp\u00a0", False),
        ("zero\u200bwidth", False),
        ("x" * 32, True),
        ("x" * 33, False),
    ],
)
def test_channel_names(name: str, ok: bool) -> None:
    """System names, reserved prefixes, empty, too long and whitespace/control names are not channels."""
    assert (channel_problem(name, LIMITS) is None) is ok


@given(st.binary(max_size=512))
def test_fuzz_bytes_only_raise_decode_error(data: bytes) -> None:
    """Random bytes decode or raise TEPDecodeError, nothing else."""
    for decode in (decode_client, decode_server):
        try:
            decode(data, LIMITS)
        except TEPDecodeError:
            pass


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.sampled_from(["topic", "payload", "x"]) | st.text(max_size=4), children, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_fuzz_json_only_raise_decode_error(value: Any) -> None:
    """Random JSON (including big ints and NaN) decodes or raises TEPDecodeError, nothing else."""
    try:
        text = json.dumps(value)
    except ValueError:
        return
    for decode in (decode_client, decode_server):
        try:
            decode(text, LIMITS)
        except TEPDecodeError:
            pass


@given(st.sampled_from(["join", "leave", "@join", "#join", "chan", "$x", "", "a b"]), st.lists(st.text(max_size=40)))
def test_fuzz_join_shaped_frames(topic: str, payload: list[str]) -> None:
    """Join/leave-shaped frames with arbitrary channel strings decode or raise TEPDecodeError."""
    try:
        decode_client(json.dumps({"topic": topic, "payload": payload}), LIMITS)
    except TEPDecodeError:
        pass


def test_limits_must_be_positive_ints() -> None:
    """A zero, negative or non-int limit is refused when the limits are built."""
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_channel_length"):
            TEPLimits(max_channel_length=bad)  # type: ignore[arg-type]


# -- channel bookkeeping -----------------------------------------------------------------


def test_client_channels_join_leave_and_limit() -> None:
    """Joins are idempotent, duplicates count once, the per-client limit rejects, so does leaving a stranger."""
    channels = ClientChannels(LIMITS)
    reply, new = channels.join(["a", "a", "b", "#join"])
    assert reply == JoinReply(("a", "b"), ("#join",))
    assert new == ("a", "b")
    reply, new = channels.join(["a", "c", "d"])
    assert reply == JoinReply(("a", "c"), ("d",))
    assert new == ("c",)
    assert channels.leave(["b", "b", "zzz"]) == LeaveReply(("b",), ("zzz",))
    assert sorted(channels) == ["a", "c"]
    assert channels.join(["d"])[0] == JoinReply(("d",), ())


# -- the client logic on an in-memory hub --------------------------------------------------


def client_on(server: TEPServer) -> tuple[TEPClient, MemoryTEPTransport]:
    """A new client of ``server`` on a memory transport."""
    transport = MemoryTEPTransport()
    return TEPClient(server, transport), transport


def test_publish_reaches_other_clients_with_prefix() -> None:
    """A client publish reaches other joined clients (not the publisher) under the prefixed hub topic."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS, prefix="tep.")
    a, ta = client_on(server)
    b, tb = client_on(server)
    for client in (a, b):
        client.frame_received(b'{"topic": "join", "payload": ["chan1"]}')
    assert sorted(hub.topics()) == [BROADCAST_TOPIC, "tep.chan1"]
    a.frame_received(b'{"topic": "chan1", "payload": {"n": 1}}')
    assert tb.sent[-1] == {"topic": "chan1", "payload": {"n": 1}}
    assert ta.sent == [{"topic": "@join", "payload": ["chan1"]}]


def test_disabled_client_publish_answers_error() -> None:
    """With client publishing off, a publish gets '#error' echoing the frame and reaches no one."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS, client_publish=False)
    a, ta = client_on(server)
    a.frame_received(b'{"topic": "join", "payload": ["c"]}')
    a.frame_received(b'{"topic": "c", "payload": 1}')
    assert ta.sent[-1] == {
        "topic": "#error",
        "payload": {"error": "client publishing is disabled on this node", "frame": '{"topic": "c", "payload": 1}'},
    }
    assert hub.stats["published"] == 0


def test_server_api_emit_and_broadcast() -> None:
    """emit() reaches the channel's clients, broadcast() every client; stop() closes them and waits."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS)
    a, ta = client_on(server)
    b, tb = client_on(server)
    a.frame_received(b'{"topic": "join", "payload": ["news"]}')
    assert server.emit("news", "hello") == 1
    server.broadcast({"all": True})
    assert ta.sent[1:] == [{"topic": "news", "payload": "hello"}, {"payload": {"all": True}}]
    assert tb.sent == [{"payload": {"all": True}}]
    with pytest.raises(ValueError, match="system name"):
        server.emit("join", 1)
    stopped = server.stop()
    assert ta.closed == (1000, "node shutting down")
    assert hub.topics() == []
    assert not stopped.called  # until both connections are really gone
    a.connection_lost()
    b.connection_lost()
    assert stopped.result == 2


def test_wrapped_wamp_payload_and_non_json_payload() -> None:
    """A WAMP args/kwargs wrapper is sent as that object; bytes as WAMP JSON strings; a non-JSON payload is skipped."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS)
    a, ta = client_on(server)
    a.frame_received(b'{"topic": "join", "payload": ["t"]}')
    hub.publish(hub.envelope("t", {"args": [1, 2], "kwargs": {"k": "v"}}, wamp_wrapped=True))
    hub.publish(hub.envelope("t", b"\x00bytes"))
    hub.publish(hub.envelope("t", {1: "a MessagePack map with an integer key"}))
    hub.publish(hub.envelope("t", "after"))
    assert ta.sent[1:] == [
        {"topic": "t", "payload": {"args": [1, 2], "kwargs": {"k": "v"}}},
        {"topic": "t", "payload": "\x00AGJ5dGVz"},
        {"topic": "t", "payload": "after"},
    ]
    assert server.stats["undeliverable"] == 1


def test_slow_consumer_is_dropped_and_others_served() -> None:
    """A client whose unsent bytes pass the limit is dropped and unsubscribed; others still get the message."""
    hub = Hub("n1")
    server = TEPServer(hub, TEPLimits(max_send_buffer=1000))
    slow, ts = client_on(server)
    fast, tf = client_on(server)
    for client in (slow, fast):
        client.frame_received(b'{"topic": "join", "payload": ["t"]}')
    ts.unsent = 1001
    hub.publish(hub.envelope("t", 1))
    assert ts.dropped is not None and "slow consumer" in ts.dropped
    assert tf.sent[-1] == {"topic": "t", "payload": 1}
    assert hub.subscribers("t") == 1
    assert list(server.clients) == [fast]


def test_bad_frames_and_binary_get_errors_and_keep_the_client() -> None:
    """Bad frames and binary frames get '#error'; the client then still joins normally."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS)
    a, ta = client_on(server)
    a.frame_received(b"{nope")
    a.binary_received(b"\x00\x01")
    a.frame_received(b'{"topic": "join", "payload": ["ok"]}')
    assert [f["topic"] for f in ta.sent] == ["#error", "#error", "@join"]
    assert ta.sent[0]["payload"]["frame"] == "{nope"
    assert ta.sent[1]["payload"] == {
        "error": "binary frames are not supported; send one JSON object per text frame",
        "frame": None,
    }
    assert server.stats["bad_frames"] == 2


def test_broadcast_interest_follows_clients_and_lost_clients_leave() -> None:
    """The node wants broadcasts only while it has TEP clients; a lost client leaves every channel."""
    hub = Hub("n1")
    server = TEPServer(hub, LIMITS)
    assert hub.topics() == []
    a, _ = client_on(server)
    b, _ = client_on(server)
    a.frame_received(b'{"topic": "join", "payload": ["x", "y"]}')
    assert sorted(hub.topics()) == [BROADCAST_TOPIC, "x", "y"]
    a.connection_lost()
    a.connection_lost()
    assert hub.topics() == [BROADCAST_TOPIC]
    b.connection_lost()
    assert hub.topics() == []
    assert server.clients == {}


# -- hostile input: depth, numbers, surrogates ---------------------------------------


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        (b'{"topic":"c","payload":' + b"[" * 65 + b"]" * 65 + b"}", "nested deeper than 64 levels"),
        (b'{"topic":"c","payload":' + b"[" * 1000 + b"]" * 1000 + b"}", "nested deeper than 64 levels"),
        (b'{"topic":"c","payload":{"_class":"Message","when":9223372036854775808}}', "out of range"),
        (b'{"topic":"c","payload":18446744073709551616}', "out of range"),
        (b'{"topic":"c","payload":NaN}', "not valid JSON"),
        (b'{"topic":"c","payload":-Infinity}', "not valid JSON"),
        (b'{"topic":"c","payload":"a\\ud800"}', "not valid JSON"),
        ('{"topic":"c","payload":"a\ud800"}', "lone surrogate"),
    ],
)
def test_hostile_frames_get_a_decode_error(frame: bytes | str, problem: str) -> None:
    """Deep, huge, non-finite and surrogate frames raise TEPDecodeError naming the problem."""
    with pytest.raises(TEPDecodeError, match=problem):
        decode_client(frame)


@given(hostile_values, st.sampled_from(["c", "join", "leave"]))
def test_fuzz_hostile_values_only_raise_decode_error(value: Any, topic: str) -> None:
    """Hostile payloads decode within the bounds or raise TEPDecodeError, for clients and servers alike."""
    data = json_text({"topic": topic, "payload": value})
    for decode in (decode_client, decode_server):
        try:
            frame = decode(data)
        except TEPDecodeError:
            continue
        check(getattr(frame, "payload", None))
