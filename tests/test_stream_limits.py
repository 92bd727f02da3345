"""The stream front-end's node-wide limits (issue 18): fds with many topics, topic and disk caps, bounded partial
input, and no acknowledged publish too large for the cluster's links.

Real node processes, plain sockets (tests/helpers/streamclient.py) and Autobahn WAMP sessions. Absence is shown with
a marker sent after, never with a sleep.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
import pytest_twisted
from helpers.nodes import Cluster, NodeProcess
from helpers.polling import until, wait_until
from helpers.streamclient import OK, StreamClient, error
from helpers.wampclient import connect, leave, publish_acked
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.task import Clock

from pubsubclub.config import NodeConfig, NodeSection
from pubsubclub.core.hub import Hub
from pubsubclub.federation import psc
from pubsubclub.frontends.stream import codec as c
from pubsubclub.frontends.stream.protocol import StreamService, TooLargeForLinks, hub_payload_json_bytes, to_hub_payload
from pubsubclub.node.node import frontend_context

E = c.Position.EARLIEST
MiB = 1024 * 1024


def start(tmp_path: Path, name: str, *extra: str) -> NodeProcess:
    """A node with only the stream front-end (and WAMP, ops) on, its log in tmp_path."""
    listen = ("--stream", "tcp:0:interface=127.0.0.1", "--data-dir", str(tmp_path / f"{name}-data"))
    return NodeProcess(name, tmp_path, extra=(*listen, *extra)).start()


def client(node: NodeProcess) -> StreamClient:
    """A connected stream client."""
    made = StreamClient(node.stream_port)
    made.connect()
    return made


def stream_stats(node: NodeProcess) -> dict[str, int]:
    """The stream front-end's part of /stats."""
    return dict(node.stats()["stream"])


def log_bytes(node: NodeProcess) -> int:
    """Bytes of every segment file of the node's stream log."""
    return sum(f.stat().st_size for f in (node.data_dir / "stream" / "topics").glob("*/*.log"))


# -- units: the size a stream payload takes on a PSC link --------------------------------------------


@given(st.one_of(st.binary(max_size=300), st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_link_size_of_a_payload_is_computed_exactly_without_encoding(data: bytes) -> None:
    """hub_payload_json_bytes is the length of the JSON the federation writes for the payload, text or binary."""
    hub = to_hub_payload(data)
    assert hub_payload_json_bytes(data, not hub.startswith("\x00")) == len(orjson.dumps(hub))


# -- node processes ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_a_flood_of_stream_topics_keeps_fds_bounded_and_the_node_answering(tmp_path: Path) -> None:
    """3,000 topics from one client: fds stay within max-open-files, /health answers, a WAMP client joins.

    After a restart, WAMP publishes to 1,000 of those topics (appended to their logs) do not reopen them all.
    """
    node = start(tmp_path, "n1", "--stream-max-open-files", "64", "--no-stream-fsync")
    try:
        before = node.fds()
        flooder = client(node)
        for first in range(0, 3000, 500):
            flooder.send(*(c.Publish(f"flood.{i}", b"x") for i in range(first, first + 500)))
            assert flooder.recv(500) == [OK] * 500
            assert node.fds() - before <= 64 + 4, f"{node.fds() - before} more fds after {first + 500} topics"
        assert stream_stats(node)["open_files"] <= 64
        assert node.health()[0] == 200
        await leave(await connect(node.wamp_url))
        flooder.close()
        node.stop()
        node.start()
        before = node.fds()
        session = await connect(node.wamp_url)
        # Pipelined (each still acknowledged): 1,000 round trips one after the other took seconds.
        await defer.gatherResults(
            [defer.ensureDeferred(publish_acked(session, f"flood.{i}", "from wamp")) for i in range(1000)]
        )
        assert node.fds() - before <= 64 + 4
        await leave(session)
        # Every topic still reads back, its file reopened on demand.
        reader = client(node)
        reader.send(c.Subscribe("flood.0", E))
        assert reader.recv(3) == [OK, c.Message("flood.0", 0, b"x"), c.Message("flood.0", 1, b"from wamp")]
        reader.send(c.Subscribe("flood.2999", E))
        assert reader.recv(2) == [OK, c.Message("flood.2999", 0, b"x")]
        assert node.fds() - before <= 64 + 4 and node.health()[0] == 200
    finally:
        node.stop()


@pytest.mark.slow
def test_a_new_topic_past_max_topics_gets_error_429_and_known_topics_go_on(tmp_path: Path) -> None:
    """Past [stream] max-topics a Publish or Subscribe to a new topic is ERROR 429 naming the cap; others go on."""
    node = start(tmp_path, "n1", "--stream-max-topics", "3")
    try:
        writer = client(node)
        writer.send(c.Publish("a", b"1"), c.Publish("b", b"1"), c.Subscribe("c", E))
        assert writer.recv(3) == [OK] * 3
        writer.send(c.Publish("d", b"1"))
        refused = writer.one()
        assert refused == error(c.ErrorCode.TOO_MANY_TOPICS)
        assert isinstance(refused, c.Status) and "max-topics" in (refused.message or "")
        writer.send(c.Subscribe("e", E), c.Batch(c.BatchType.COUNT, 2), c.Publish("f", b"no"), c.Publish("a", b"2"))
        assert writer.recv(3) == [error(c.ErrorCode.TOO_MANY_TOPICS)] * 2 + [c.Status(True, count=1)]
        writer.send(c.Subscribe("a", E))
        assert messages(writer.recv(3)) == [b"1", b"2"]
        assert stream_stats(node)["retained_topics"] == 3
    finally:
        node.stop()


def messages(events: list[c.ServerEvent]) -> list[bytes]:
    """Payloads of the Message events."""
    return [e.payload for e in events if isinstance(e, c.Message)]


@pytest.mark.slow
def test_disk_cap_deletes_oldest_segments_then_refuses_with_507(tmp_path: Path) -> None:
    """The log stays within max-disk-bytes: old segments go first; with only active ones left, ERROR 507."""
    cap = 64 * 1024
    node = start(
        tmp_path, "n1", "--stream-segment-bytes", "4096", "--stream-max-disk-bytes", str(cap), "--no-stream-fsync"
    )
    try:
        writer = client(node)
        payload = b"p" * 1000
        for _ in range(4):
            writer.send(c.Batch(c.BatchType.COUNT, 50), *(c.Publish("big", payload) for _ in range(50)))
            assert writer.one() == c.Status(True, count=50)
        assert log_bytes(node) <= cap
        reader = client(node)
        reader.send(c.Subscribe("big", E))
        first = reader.recv(2)[1]
        assert isinstance(first, c.Message) and first.sequence > 100  # the oldest went, the newest stayed
        # Many topics, one active segment each: once nothing but active segments is left, publishes are refused.
        answers = []
        for i in range(40):
            writer.send(c.Publish(f"t{i}", b"q" * 3000))
            answers.append(writer.one())
        refused = [a for a in answers if a != OK]
        assert refused and all(a == error(c.ErrorCode.DISK_FULL) for a in refused)
        assert isinstance(refused[0], c.Status) and "max-disk-bytes" in (refused[0].message or "")
        assert stream_stats(node)["disk_bytes"] == log_bytes(node) <= cap
    finally:
        node.stop()


def declare(node: NodeProcess, size: int, send: int) -> socket.socket:
    """A connection that connects, declares a Publish of ``size`` bytes and sends ``send`` of them."""
    sock = socket.create_connection(("127.0.0.1", node.stream_port))
    sock.sendall(c.encode(c.Connect("declarer", "g")))
    sock.sendall(orjson.dumps({"Publish": {"topic": "big", "payload_size": size, "checksum": "0" * 40}}))
    if send:
        try:
            sock.sendall(b"y" * send)
        except OSError:
            pass  # past the node's budget: it answered 503 and closed while we were sending
    return sock


def answered_then_closed(sock: socket.socket) -> list[c.ServerEvent]:
    """What the node answered before closing ``sock`` (bounded wait)."""
    made = StreamClient.__new__(StreamClient)
    made.sock, made.decoder, made.pending = sock, c.ClientDecoder(), []
    return made.closed()


@pytest.mark.slow
def test_declared_payloads_are_refused_early_or_bounded_node_wide(tmp_path: Path) -> None:
    """A 16 MB declaration is refused at its header (413); half-sent payloads past max-pending-bytes get 503.

    40 connections each holding 900 KB of a declared 1 MB payload would hold 36 MB; the node holds at most
    its 8 MiB budget, closes the rest, and a publisher still gets OK.
    """
    budget = 8 * MiB
    node = start(tmp_path, "n1", "--stream-max-pending-bytes", str(budget))
    try:
        before = node.rss()
        for _ in range(40):
            sock = declare(node, 16_000_000, 0)
            assert answered_then_closed(sock) == [OK, error(c.ErrorCode.TOO_LARGE)]
        held = [declare(node, 1_000_000, 900_000) for _ in range(40)]
        # Each sender learns its fate: some are held, the rest answered 503 and closed.
        wait_until(lambda: stream_stats(node)["connections"] <= 10, "connections past the budget to be closed")
        assert stream_stats(node)["pending_bytes"] <= budget
        grown = node.rss() - before
        assert grown < 20 * MiB, f"node grew by {grown / 1e6:.1f} MB"
        writer = client(node)
        writer.send(c.Publish("small", b"still here"))
        assert writer.one() == OK
        for sock in held:
            sock.close()
        wait_until(lambda: stream_stats(node)["pending_bytes"] == 0, "half-sent payloads to be forgotten")
    finally:
        node.stop()


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_a_publish_too_large_for_the_links_is_refused_and_the_next_20_reach_another_node(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """A stream publish whose PSC301 would exceed max-message-size gets 413 before any OK; one that fits and the
    next 20 all reach a stream subscriber on the other node, in order."""
    cluster = cluster_factory(2, frontends=True)
    await cluster.linked()
    reader = StreamClient(cluster[1].stream_port)
    reader.connect()
    reader.send(c.Subscribe("wide", c.Position.LATEST))
    assert reader.one() == OK
    await until(lambda: "node2" in cluster[0].stats()["remote_interest"].get("wide", []), "node1 to learn interest")
    writer = StreamClient(cluster[0].stream_port)
    writer.connect()
    binary = os.urandom(800_000)  # 1,066,680 bytes of base64 on the link
    text = b"a" * (MiB - 100)  # fits the header check, not the PSC301's metadata
    fits = b"b" * 1_000_000
    writer.send(c.Publish("wide", binary), c.Publish("wide", text), c.Publish("wide", fits))
    too_large = writer.recv(3)
    assert too_large[:2] == [error(c.ErrorCode.TOO_LARGE)] * 2 and too_large[2] == OK
    assert isinstance(too_large[0], c.Status) and "max-message-size" in (too_large[0].message or "")
    writer.send(*(c.Publish("wide", b"m%d" % i) for i in range(20)))
    assert writer.recv(20) == [OK] * 20
    got = reader.recv(21, timeout=20)
    assert got == [c.Message("wide", 0, fits)] + [c.Message("wide", 1 + i, b"m%d" % i) for i in range(20)]
    # Nothing refused was stored on the publishing node either.
    local = StreamClient(cluster[0].stream_port)
    local.connect()
    local.send(c.Subscribe("wide", E))
    assert [e.sequence for e in local.recv(22) if isinstance(e, c.Message)] == list(range(21))


def test_the_link_check_agrees_with_the_psc301_the_federation_writes(tmp_path: Path) -> None:
    """Around max-message-size, a payload passes the check exactly when its PSC301 (longest metadata) fits."""
    config = NodeConfig(node=replace(NodeSection(), data_dir=str(tmp_path), max_message_size=4096))
    hub = Hub("node-with-a-long-name")
    service = StreamService(hub, config.stream, frontend_context(config, Clock()))
    try:
        for payload in [b"t" * n for n in range(3900, 4100)] + [b"\x00" * n for n in range(2950, 3100, 7)]:
            hub_payload = to_hub_payload(payload)
            envelope = hub.envelope("topic/\u00e9", hub_payload)
            frame = psc.encode_publish_meta(
                envelope.topic, hub_payload, envelope.origin, envelope.published_at, envelope.message_id, False,
                psc.MAX_SEQ,
            )  # fmt: skip
            try:
                service.check_fits_links(envelope.topic, payload, hub_payload)
            except TooLargeForLinks:
                fits = False
            else:
                fits = True
            # Headroom for a longer time and message id is never more than a few dozen bytes.
            assert (len(frame) <= 4096) if fits else (len(frame) > 4096 - 48)
    finally:
        service.stop()
