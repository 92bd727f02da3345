"""Untrusted input against real nodes: issue 12 points 3, 4 and 5, end to end.

Clients are the real thing: Autobahn-Python WAMP sessions (on the Twisted
reactor), the independent ``websockets`` library for raw WAMP, TEP and PSC
peers, and plain sockets for NSD. Every wait is bounded: ``recv`` takes a
timeout, node-side conditions are polled over ``/stats`` with ``wait_until``,
and absence is checked with a marker message sent after.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
import pytest_twisted
from helpers.nodes import Cluster, NodeProcess, assert_clean_log, share_logs, unshare_logs
from helpers.nsdclient import SANE_WHEN, SUCCESS, NSDClient
from helpers.polling import until
from helpers.pscpeer import psc_producer
from helpers.rawws import RECV_SECONDS, close_of
from helpers.tepclient import join, recv, send, tep
from helpers.wampclient import connect, leave, publish_acked, subscribe
from websockets.sync.client import connect as ws_connect

from pubsubclub.frontends.nsd.store import NSDStore

pytestmark = pytest.mark.slow

#: The issue's publish: a complete NSD Message whose ``when`` is SQLite's largest integer.
POISON = {"_class": "Message", "body": "x", "when": 9223372036854775807}
#: Messages in the WAMP batch that must cross the cluster after the poison.
BATCH = 300


def nsd_stats(node: NodeProcess) -> dict[str, Any]:
    """The node's NSD counters."""
    return dict(node.stats()["nsd"])


def links_opened(cluster: Cluster) -> list[int]:
    """How many links each node has opened since it started (a flapping link opens again and again)."""
    return [node.stats()["federation"]["links_opened"] for node in cluster.nodes]


def assert_nsd_answers(node: NodeProcess, identity: str) -> list[dict[str, Any]]:
    """Open, Publish, Subscribe and Get answer normally on ``node``; the messages of channel Alice."""
    client = NSDClient(node.nsd_port, identity)
    try:
        assert client.open() == SUCCESS
        assert client.publish(f"hello from {identity}") == SUCCESS
        assert client.subscribe("Alice") == SUCCESS
        messages = client.get(0)
    finally:
        client.close()
    assert all(type(m["when"]) is int and 0 < m["when"] < SANE_WHEN for m in messages), messages
    return [m for m in messages if m["from"] != identity]


async def assert_wamp_batch_crosses(sender: NodeProcess, receiver: NodeProcess, topic: str) -> None:
    """A bounded batch published on ``sender`` all reaches a subscriber on ``receiver``, marker last."""
    sub = await connect(receiver.wamp_url)
    pub = await connect(sender.wamp_url)
    rec, _ = await subscribe(sub, topic)
    await until(lambda: receiver.name in sender.stats()["remote_interest"].get(topic, []), f"interest in {topic}")
    for i in range(BATCH):
        pub.publish(topic, i)
    await publish_acked(pub, topic, "marker")
    await rec.wait_until(lambda r: bool(r.args) and r.args[-1] == "marker")
    assert rec.args == [*range(BATCH), "marker"]
    await leave(sub, pub)


# -- point 3: one anonymous publish must not break NSD, links or traffic ------------------------


@pytest_twisted.ensureDeferred
async def test_the_issues_publish_breaks_nothing_also_after_a_restart(cluster_factory: Callable[..., Cluster]) -> None:
    """The issue's WAMP publish and TEP frame on an NSD channel's topic: NSD, links and WAMP traffic carry on."""
    cluster = cluster_factory(3, frontends=True)
    await cluster.linked()
    alice = NSDClient(cluster[0].nsd_port, "Alice")
    assert alice.open() == SUCCESS
    for node in cluster.nodes[1:]:
        await until(lambda n=node: nsd_stats(n)["channels"] == 1, f"{node.name} to learn channel Alice")
    await until(lambda: len(cluster[0].stats()["remote_interest"].get("Alice", [])) == 2, "interest in Alice")
    opened = links_opened(cluster)

    wamp = await connect(cluster[0].wamp_url)
    await publish_acked(wamp, "Alice", POISON)  # the exact publish of the issue
    with tep(cluster[1]) as ws:
        send(ws, "Alice", POISON)  # and the same as a TEP frame
        join(ws, "after.poison")  # answered after the publish was handled
    await leave(wamp)
    for node in cluster.nodes:
        await until(lambda n=node: nsd_stats(n)["messages"] == 2, f"{node.name} to store both foreign messages")

    for i, node in enumerate(cluster.nodes):
        foreign = assert_nsd_answers(node, f"Check{i}")
        assert sorted(m["from"] for m in foreign) == ["$foreign@node1", "$foreign@node2"]
        assert all(m["payload"] == POISON and json.loads(m["body"]) == POISON for m in foreign)
    await assert_wamp_batch_crosses(cluster[0], cluster[2], "bulk.after.poison")
    assert links_opened(cluster) == opened, "links flapped"

    cluster[1].stop()
    cluster[1].start()
    await cluster.linked()
    opened = links_opened(cluster)
    await until(lambda: nsd_stats(cluster[1])["messages"] >= 5, "node2's history after the restart")
    foreign = assert_nsd_answers(cluster[1], "AfterRestart")
    assert sorted(m["from"] for m in foreign if m["from"].startswith("$")) == ["$foreign@node1", "$foreign@node2"]
    await assert_wamp_batch_crosses(cluster[1], cluster[0], "bulk.after.restart")
    await assert_wamp_batch_crosses(cluster[2], cluster[1], "bulk.after.restart.back")
    assert links_opened(cluster) == opened, "links flapped after the restart"
    assert [node.stats()["hub"]["sink_errors"] for node in cluster.nodes] == [0, 0, 0]
    for node in cluster.nodes:
        assert_clean_log(node)


# -- point 4: forged NSD messages -------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_forged_nsd_messages_are_not_read_as_genuine(cluster_factory: Callable[..., Cluster]) -> None:
    """A complete Message with any from/when, via WAMP or TEP, reaches NSD clients wrapped, from '$foreign@...'."""
    cluster = cluster_factory(2, frontends=True)
    await cluster.linked()
    alice, bob = NSDClient(cluster[0].nsd_port, "Alice"), NSDClient(cluster[1].nsd_port, "Bob")
    assert alice.open() == SUCCESS
    await until(lambda: "node2" in cluster[0].stats()["remote_interest"].get("Alice", []), "node2's interest")
    assert bob.open() == SUCCESS and bob.subscribe("Alice") == SUCCESS
    assert alice.publish("genuine") == SUCCESS
    await until(lambda: len(bob.get(0)) == 1, "the genuine message on node2")
    [genuine] = bob.get(0)
    forged = {"_class": "Message", "from": "Alice", "when": genuine["when"] + 1, "body": "send me your password"}

    wamp = await connect(cluster[1].wamp_url)
    await publish_acked(wamp, "Alice", forged)
    await leave(wamp)
    with tep(cluster[0]) as ws:
        send(ws, "Alice", {**forged, "when": 1})
        join(ws, "after.forgery")
    assert alice.publish("marker") == SUCCESS
    await until(lambda: len(bob.get(0)) == 4, "all four messages on node2")

    messages = bob.get(0)
    assert [(m["from"], m["body"]) for m in messages if m["from"] == "Alice"] == [
        ("Alice", "genuine"),
        ("Alice", "marker"),
    ]
    fakes = [m for m in messages if m["from"] != "Alice"]
    assert sorted(m["from"] for m in fakes) == ["$foreign@node1", "$foreign@node2"]
    for fake in fakes:
        assert json.loads(fake["body"])["body"] == "send me your password"
        assert fake["when"] > genuine["when"]  # NSD's clock, not the forger's
    assert alice.get(0) == messages  # every node reads the same
    for node in cluster.nodes:
        assert_clean_log(node)


# -- point 5: malformed input on every listener -------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node with every front-end; it listens as consumer, so a raw PSC peer that dials it is a producer.

    Shared by the module's tests: the hostile input of one must not harm the next either.
    """
    proc = NodeProcess("n1", tmp_path_factory.mktemp("untrusted"), listen_role="consumer", frontends=True)
    share_logs([proc])
    try:
        yield proc.start()
    finally:
        proc.stop()
        unshare_logs([proc])


def raw_wamp(node: NodeProcess, frames: list[str | bytes], subprotocol: str = "wamp.2.json") -> list[Any]:
    """Send WAMP frames on a raw WebSocket; every reply until the node closes (it must close)."""
    replies: list[Any] = []
    with ws_connect(node.wamp_url, subprotocols=[subprotocol], open_timeout=5, close_timeout=2) as ws:
        for frame in frames:
            ws.send(frame)
        while True:
            try:
                data = ws.recv(timeout=RECV_SECONDS)
            except TimeoutError:
                raise AssertionError(f"the node neither answered nor closed; so far {replies}") from None
            except Exception:  # closed
                break
            replies.append(msgpack.unpackb(data) if isinstance(data, bytes) else json.loads(data))
        assert ws.close_code == 1000, (ws.close_code, replies)
    return replies


HELLO = json.dumps([1, "realm1", {"roles": {"subscriber": {}, "publisher": {}}}])
DEEP = "[" * 300 + "]" * 300


@pytest.mark.parametrize(
    ("frames", "subprotocol", "problem"),
    [
        ([HELLO, '[32, 1, {}, "a\\ud800"]'], "wamp.2.json", "lone surrogate"),
        ([HELLO, '[16, 2, {}, "com.t", [NaN]]'], "wamp.2.json", "non-finite number"),
        ([HELLO, '[16, 2, {}, "com.t", [18446744073709551616]]'], "wamp.2.json", "out of range"),
        ([HELLO, f'[16, 2, {{}}, "com.t", [{DEEP}]]'], "wamp.2.json", "nested deeper than 64 levels"),
        (
            [msgpack.packb(json.loads(HELLO)), msgpack.packb([16, 2, {}, "com.t", [float("-inf")]])],
            "wamp.2.msgpack",
            "non-finite number",
        ),
        (
            [msgpack.packb(json.loads(HELLO)), msgpack.packb([16, 2, {}, "com.t", [msgpack.Timestamp(0, 0)]])],
            "wamp.2.msgpack",
            "not JSON",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_hostile_wamp_gets_abort_and_the_node_serves_others(
    node: NodeProcess, frames: list[Any], subprotocol: str, problem: str
) -> None:
    """Each hostile WAMP message is answered with ABORT protocol_violation naming the problem, then a close."""
    sub = await connect(node.wamp_url)
    rec, _ = await subscribe(sub, "com.still")
    replies = raw_wamp(node, frames, subprotocol)
    assert replies[-1][0] == 3 and replies[-1][2] == "wamp.error.protocol_violation", replies
    assert problem in replies[-1][1]["message"]
    pub = await connect(node.wamp_url)
    await publish_acked(pub, "com.still", "ok")
    await rec.wait_for(1)
    assert rec.args == ["ok"]
    await leave(sub, pub)
    assert_clean_log(node)


def nsd_line(client: NSDClient, line: bytes) -> dict[str, Any]:
    """Send one raw line; the answer."""
    client.send_raw(line + b"\n")
    return dict(json.loads(client.read_line()))


def test_hostile_nsd_gets_invalid_request_and_the_node_serves_others(node: NodeProcess) -> None:
    """Deep, huge, non-finite and surrogate NSD requests are INVALID REQUEST; the same connection goes on."""
    client = NSDClient(node.nsd_port, "Mallory")
    assert client.open() == SUCCESS
    deep = b"[" * 256 + b"]" * 256
    lines = [
        b'{"_class":"PublishRequest","identity":"Mallory","message":{"_class":"Message","body":"x","x":' + deep + b"}}",
        b'{"_class":"GetRequest","identity":"Mallory","after":9223372036854775808}',
        b'{"_class":"PublishRequest","identity":"Mallory","message":{"_class":"Message","body":"x","n":1e999}}',
        b'{"_class":"PublishRequest","identity":"Mallory","message":{"_class":"Message","body":"\\ud800"}}',
        b'{"_class":"PublishRequest","identity":"Mallory","message":{"_class":"Message","body":"x","n":-1' + b"0" * 30
        + b"}}",
    ]  # fmt: skip
    for line in lines:
        answer = nsd_line(client, line)
        assert answer == {"_class": "ErrorResponse", "error": "INVALID REQUEST: " + line.decode()}
    # The issue's when, sent by an NSD client: in range for JSON, ignored by NSD.
    answer = nsd_line(
        client,
        b'{"_class":"PublishRequest","identity":"Mallory","message":'
        + orjson.dumps({**POISON, "from": "Alice"})
        + b"}",
    )
    assert answer == SUCCESS
    [stored] = client.get(0)
    assert stored["from"] == "Mallory" and 0 < stored["when"] < SANE_WHEN
    assert client.publish("still here") == SUCCESS
    assert [m["body"] for m in client.get(0)] == ["x", "still here"]
    client.close()
    assert_clean_log(node)


@pytest.mark.parametrize(
    ("frame", "problem"),
    [
        ('{"topic": "c", "payload": ' + DEEP + "}", "nested deeper than 64 levels"),
        ('{"topic": "c", "payload": {"when": 9223372036854775808}}', "out of range"),
        ('{"topic": "c", "payload": 123456789012345678901234567890}', "out of range"),
        ('{"topic": "c", "payload": Infinity}', "not valid JSON"),
        ('{"topic": "c", "payload": "\\udc00"}', "not valid JSON"),
    ],
)
def test_hostile_tep_gets_error_frames_and_the_connection_stays(node: NodeProcess, frame: str, problem: str) -> None:
    """Each hostile TEP frame is answered with '#error' naming the problem; the client and others go on."""
    observer = tep(node)
    join(observer, "c")
    ws = tep(node)
    ws.send(frame)
    error = recv(ws)
    assert error["topic"] == "#error" and problem in error["payload"]["error"], error
    send(ws, "c", "good")
    assert recv(observer) == {"topic": "c", "payload": "good"}  # nothing before it: the bad frame went nowhere
    ws.close()
    observer.close()
    assert_clean_log(node)


@pytest_twisted.ensureDeferred
async def test_hostile_psc_drops_bad_messages_and_closes_only_for_protocol_errors(node: NodeProcess) -> None:
    """Out-of-bounds PSC301 messages are dropped (link kept); a frame nested 1,000 deep closes with 4400."""
    sub = await connect(node.wamp_url)
    rec, _ = await subscribe(sub, "wire.t")
    before = node.stats()["federation"]  # the node is shared: its counters are compared with these
    producer = psc_producer(node)
    opened = before["links_opened"] + 1
    await until(lambda: node.stats()["federation"]["links_opened"] == opened, "the raw producer's link")
    bad_messages = [
        '[301, "wire.t", {"n": 9223372036854775808}]',
        '[301, "wire.t", [18446744073709551616]]',
        '[301, "wire.t", ' + DEEP + "]",
        '[301, "wire.t", "x", {"o": "raw", "t": 1e300, "x": ' + DEEP + "}]",
    ]
    for message in bad_messages:
        producer.send(message)
    producer.send('[301, "wire.t", "good", {"o": "raw", "i": "raw-1"}]')
    await rec.wait_for(1)
    assert rec.args == ["good"]
    federation = node.stats()["federation"]
    assert federation["dropped_bounds"] == before["dropped_bounds"] + 4 and federation["links_opened"] == opened
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'pubsubclub_messages_total{frontend="psc",kind="dropped",peer="tcp4:' in metrics

    other = psc_producer(node)
    other.send("[" * 1000 + "]" * 1000)
    code, reason = close_of(other)
    assert (code, reason) == (4400, "bad PSC message: message type must be an integer, got array of 1 item(s)")
    producer.send('[301, "wire.t", "still linked"]')
    await rec.wait_for(2)
    assert rec.args == ["good", "still linked"]
    producer.close()
    await leave(sub)
    assert_clean_log(node)


# -- a store poisoned by the old code -------------------------------------------------------------


def test_store_poisoned_by_an_older_version_is_repaired_at_start(tmp_path: Path) -> None:
    """Rows the old code stored from the issue's publish are quarantined at start; NSD then answers normally."""
    node = NodeProcess("n1", tmp_path, frontends=True)
    node.data_dir.mkdir(parents=True)
    store = NSDStore(str(node.data_dir / "nsd.sqlite3"))
    store.add_channel("Alice", 1_700_000_000_000_000)
    store.set_subscription("Alice", "Alice", True, 1_700_000_000_000_001)
    good = {"_class": "Message", "from": "Alice", "when": 1_700_000_000_000_002, "body": "kept"}
    store.add_message("Alice", good["when"], "old-1", orjson.dumps(good))
    store.add_message("Alice", POISON["when"], "old-2", orjson.dumps(POISON))  # what the old code stored
    store.close()
    node.start()
    try:
        alice = NSDClient(node.nsd_port, "Alice")
        assert alice.open() == SUCCESS
        assert alice.publish("new") == SUCCESS
        assert [(m["body"], m["when"] < SANE_WHEN) for m in alice.get(0)] == [("kept", True), ("new", True)]
        stats = nsd_stats(node)
        assert stats["quarantined"] == 1 and stats["repaired"] == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'pubsubclub_errors_total{component="nsd",reason="store_row_quarantined"} 1.0' in metrics
        assert "moved to the quarantine table" in node.log_path.read_text()
        assert_clean_log(node)
    finally:
        node.stop()
