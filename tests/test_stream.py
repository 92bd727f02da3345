"""The stream front-end against real node processes: every spec exchange, durability, offsets, slow readers, bad input.

Clients are plain sockets speaking the protocol through the codec's client
side (tests/helpers/streamclient.py). Absence is shown with a marker message sent
after, never with a sleep.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.nodes import NodeProcess, share_logs, unshare_logs
from helpers.polling import wait_until
from helpers.streamclient import OK, StreamClient, error

from pubsubclub.frontends.stream import codec as c

pytestmark = pytest.mark.slow

E = c.Position.EARLIEST
#: Numbers for the bad-input cases' topics.
OTHER_TOPICS = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node with the stream front-end on (and NSD, TEP); shared, so each test has topics of its own."""
    started = NodeProcess("s1", tmp_path_factory.mktemp("stream"), frontends=True)
    share_logs([started])
    try:
        yield started.start()
    finally:
        started.stop()
        unshare_logs([started])


def client(node: NodeProcess, **kwargs: int) -> StreamClient:
    """A connected client."""
    made = StreamClient(node.stream_port, **kwargs)
    made.connect()
    return made


def messages(events: list[c.ServerEvent]) -> list[tuple[int, bytes]]:
    """(sequence, payload) of the Message events."""
    return [(e.sequence, e.payload) for e in events if isinstance(e, c.Message)]


def test_connect_must_come_first_then_publish_and_subscribe(node: NodeProcess) -> None:
    """Anything before Connect is an ERROR (401) and goes nowhere; after it, Publish is OK and Earliest replays it."""
    early = StreamClient(node.stream_port)
    early.send(c.Publish("t.first", b"too early"), c.Subscribe("t.first", E))
    assert early.recv(2) == [error(c.ErrorCode.NOT_CONNECTED)] * 2
    early.send(c.Connect("early", "g"), c.Connect("again", "g"))
    assert early.recv(2) == [OK, error(c.ErrorCode.NOT_CONNECTED)]
    early.send(c.Publish("t.first", b"marker"))
    assert early.one() == OK
    reader = client(node)
    reader.send(c.Subscribe("t.first", E))
    assert reader.recv(2) == [OK, c.Message("t.first", 0, b"marker")]  # "too early" was never stored


def test_checksum_mismatch_is_an_error_and_stores_nothing(node: NodeProcess) -> None:
    """A Publish whose sha1 is wrong gets ERROR 422; the stream goes on and the message goes nowhere."""
    writer = client(node)
    bad = b'{"Publish": {"topic": "t.sum", "payload_size": 3, "checksum": "' + b"0" * 40 + b'"}}abc'
    writer.raw(bad)
    assert writer.one() == error(c.ErrorCode.CHECKSUM_MISMATCH)
    writer.send(c.Publish("t.sum", b"good"))
    assert writer.one() == OK
    reader = client(node)
    reader.send(c.Subscribe("t.sum", E))
    assert messages(reader.recv(2)) == [(0, b"good")]


def test_batches_get_one_ok_with_their_count(node: NodeProcess) -> None:
    """Batch Count n then n Publish: one OK count=n; Batch Start .. End: one OK with the count."""
    writer = client(node)
    writer.send(c.Batch(c.BatchType.COUNT, 3), *(c.Publish("t.batch", b"c%d" % i) for i in range(3)))
    assert writer.one() == c.Status(True, count=3)
    writer.send(c.Batch(c.BatchType.START), *(c.Publish("t.batch", b"s%d" % i) for i in range(5)))
    writer.send(c.Batch(c.BatchType.END))
    assert writer.one() == c.Status(True, count=5)
    writer.send(c.Batch(c.BatchType.END))
    assert writer.one() == error(c.ErrorCode.BAD_REQUEST)
    reader = client(node)
    reader.send(c.Subscribe("t.batch", E))
    got = messages(reader.recv(9))
    assert [s for s, _ in got] == list(range(8))
    assert [p for _, p in got] == [b"c0", b"c1", b"c2", b"s0", b"s1", b"s2", b"s3", b"s4"]


def test_positions_earliest_latest_offset_and_current(node: NodeProcess) -> None:
    """Earliest from 0, Latest only new ones, Offset from that sequence, Current after the group's commit."""
    writer = client(node)
    for i in range(5):
        writer.send(c.Publish("t.pos", b"m%d" % i))
    assert writer.recv(5) == [OK] * 5
    latest, offset = client(node), client(node)
    latest.send(c.Subscribe("t.pos", c.Position.LATEST))
    offset.send(c.Subscribe("t.pos", c.Position.OFFSET, 3))
    assert latest.one() == OK
    assert offset.recv(3) == [OK, c.Message("t.pos", 3, b"m3"), c.Message("t.pos", 4, b"m4")]
    writer.send(c.Publish("t.pos", b"m5"))
    assert writer.one() == OK
    assert latest.one() == c.Message("t.pos", 5, b"m5")
    committer = StreamClient(node.stream_port)
    committer.connect("c", "group-a")
    committer.send(c.Commit("t.pos", 2))
    assert committer.one() == c.CommitAck("t.pos", 2)
    committer.close()
    resumed = StreamClient(node.stream_port)
    resumed.connect("c2", "group-a")
    resumed.send(c.Subscribe("t.pos", c.Position.CURRENT))
    assert messages(resumed.recv(4)) == [(3, b"m3"), (4, b"m4"), (5, b"m5")]
    fresh = StreamClient(node.stream_port)
    fresh.connect("c3", "group-b")  # nothing committed: Current is Earliest
    fresh.send(c.Subscribe("t.pos", c.Position.CURRENT))
    assert [s for s, _ in messages(fresh.recv(7))] == [0, 1, 2, 3, 4, 5]


def test_unsubscribe_and_close(node: NodeProcess) -> None:
    """Unsubscribe is OK for a subscribed topic and ERROR 404 otherwise; no message follows it; CLOSE closes."""
    reader, writer = client(node), client(node)
    reader.send(c.Subscribe("t.unsub", c.Position.LATEST), c.Unsubscribe("t.unsub"), c.Unsubscribe("t.unsub"))
    assert reader.recv(3) == [OK, OK, error(c.ErrorCode.NOT_SUBSCRIBED)]
    writer.send(c.Publish("t.unsub", b"after"))
    assert writer.one() == OK
    reader.send(c.Subscribe("t.marker", c.Position.LATEST))
    assert reader.one() == OK
    writer.send(c.Publish("t.marker", b"marker"))
    assert writer.one() == OK
    assert reader.one() == c.Message("t.marker", 0, b"marker")  # and nothing of t.unsub before it
    reader.send(c.Close())
    assert reader.closed() == []


def test_acked_messages_survive_kill_9_with_their_sequences(tmp_path: Path) -> None:
    """kill -9 right after the acks: on restart Earliest returns every acked message with the same sequence."""
    node = NodeProcess("durable", tmp_path, frontends=True).start()
    try:
        writer = client(node)
        writer.send(c.Batch(c.BatchType.COUNT, 200), *(c.Publish("t.dur", b"p%03d" % i) for i in range(200)))
        assert writer.one() == c.Status(True, count=200)
        committer = StreamClient(node.stream_port)
        committer.connect("c", "g-dur")
        committer.send(c.Commit("t.dur", 149))
        assert committer.one() == c.CommitAck("t.dur", 149)
        node.kill()
        node.start()
        reader = client(node)
        reader.send(c.Subscribe("t.dur", E))
        got = messages(reader.recv(201))
        assert got == [(i, b"p%03d" % i) for i in range(200)]
        resumed = StreamClient(node.stream_port)
        resumed.connect("c", "g-dur")
        resumed.send(c.Subscribe("t.dur", c.Position.CURRENT))
        assert messages(resumed.recv(51))[0] == (150, b"p150")
        writer = client(node)
        writer.send(c.Publish("t.dur", b"next"))
        assert writer.one() == OK
        assert reader.one() == c.Message("t.dur", 200, b"next")  # sequences go on, never reused
    finally:
        node.stop()


def test_slow_subscriber_keeps_memory_flat_while_a_fast_one_keeps_up(node: NodeProcess) -> None:
    """60 MB through one topic: a subscriber that never reads costs the node no memory; a reading one gets all."""
    slow = client(node, rcvbuf=4096)
    slow.send(c.Subscribe("t.flow", c.Position.LATEST))
    assert slow.one() == OK
    fast = client(node)
    fast.send(c.Subscribe("t.flow", c.Position.LATEST))
    assert fast.one() == OK
    writer = client(node)
    payload = b"x" * 1000
    before = node.rss()
    sent, got = 0, 0
    for _ in range(60):  # 60 batches of 1,000 messages of 1 KB
        writer.send(c.Batch(c.BatchType.COUNT, 1000), *(c.Publish("t.flow", payload) for _ in range(1000)))
        assert writer.one() == c.Status(True, count=1000)
        sent += 1000
        got += len(messages(fast.recv(1000)))
    assert got == sent
    grown = node.rss() - before
    assert grown < 40 * 1024 * 1024, f"node grew by {grown / 1e6:.1f} MB with a stuck reader"
    # The stuck reader still gets its messages, from the log, in order, once it reads.
    first = slow.recv(5)
    assert [e.sequence for e in first if isinstance(e, c.Message)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"junk that is no header at all", c.ErrorCode.BAD_REQUEST),
        (b'{"Publish": {"topic": "t", "payload_size": -1, "checksum": "x"}}', c.ErrorCode.BAD_REQUEST),
        (b'{"Publish": {"topic": "t", "payload_size": 99999999999, "checksum": "x"}}', c.ErrorCode.TOO_LARGE),
        (b'{"Connect": {"client_name": "' + b"a" * 70_000, c.ErrorCode.TOO_LARGE),
    ],
)
def test_bad_input_gets_an_error_and_a_close_and_others_go_on(
    node: NodeProcess, data: bytes, code: c.ErrorCode
) -> None:
    """Junk, a bad payload_size, a header that never closes: ERROR then close; another client is unaffected."""
    other = client(node)
    bad = StreamClient(node.stream_port)
    bad.raw(data)
    assert bad.closed() == [error(code)]
    topic = f"t.other.{next(OTHER_TOPICS)}"  # one per case: the node (and its log) is shared
    other.send(c.Publish(topic, b"still here"), c.Subscribe(topic, E))
    assert other.recv(3) == [OK, OK, c.Message(topic, 0, b"still here")]
    wait_until(lambda: "Traceback" not in node.log_path.read_text(), "no traceback", timeout=1)


def test_reserved_topics_and_unknown_requests_are_refused(node: NodeProcess) -> None:
    """$ topics are the cluster's: ERROR 400; an unknown header (case matters): ERROR 400, the stream goes on."""
    writer = client(node)
    writer.send(c.Publish("$tep.broadcast", b"no"), c.Subscribe("$nsd.log", E))
    assert writer.recv(2) == [error(c.ErrorCode.BAD_REQUEST)] * 2
    writer.raw(b'{"publish": {"topic": "t"}}{"Nope": {}}')
    assert writer.recv(2) == [error(c.ErrorCode.BAD_REQUEST)] * 2
    writer.send(c.Publish("t.ok", b"ok"))
    assert writer.one() == OK


def test_stream_traffic_is_counted_in_metrics_like_other_front_ends(node: NodeProcess) -> None:
    """published, delivered and dropped (reason checksum) under front-end stream in /metrics."""
    import urllib.request

    writer, reader = client(node), client(node)
    reader.send(c.Subscribe("t.metrics", c.Position.LATEST))
    assert reader.one() == OK
    writer.send(c.Publish("t.metrics", b"12345"))
    assert writer.one() == OK
    writer.raw(b'{"Publish": {"topic": "t.metrics", "payload_size": 1, "checksum": "' + b"0" * 40 + b'"}}x')
    assert writer.one() == error(c.ErrorCode.CHECKSUM_MISMATCH)
    assert reader.one() == c.Message("t.metrics", 0, b"12345")
    with urllib.request.urlopen(node.ops_url + "metrics", timeout=5) as r:
        text = r.read().decode()
    series = [ln for ln in text.splitlines() if ln.startswith("pubsubclub_messages_total") and "t.metrics" in ln]
    for kind, reason in (("published", ""), ("delivered", ""), ("dropped", "checksum")):
        wanted = ('frontend="stream"', f'kind="{kind}"', f'reason="{reason}"')
        line = next((ln for ln in series if all(w in ln for w in wanted)), None)
        assert line is not None and line.endswith(" 1.0"), (kind, line)
