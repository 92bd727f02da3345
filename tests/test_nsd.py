"""The NSD front-end on real nodes: the spec's exchanges, cluster-wide state, restarts, bad input."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import Cluster, NodeProcess
from helpers.nsdclient import SUCCESS, NSDClient, error
from helpers.polling import until, wait_until
from helpers.wampclient import connect, leave, publish_acked, subscribe
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow


def nsd_stats(node: NodeProcess) -> dict[str, int]:
    """The node's NSD counters."""
    return dict(node.stats()["nsd"])


def test_spec_exchange_on_one_node(tmp_path: Path) -> None:
    """Open, Publish, Subscribe, Unsubscribe and Get answer exactly as the spec's examples."""
    node = NodeProcess("n1", tmp_path, extra=("--nsd-max-message-chars", "200"), frontends=True).start()
    try:
        alice, bob = NSDClient(node.nsd_port, "Alice"), NSDClient(node.nsd_port, "Bob")
        assert alice.open() == SUCCESS
        assert alice.open() == SUCCESS  # always succeeds
        assert alice.subscribe("Bob") == error("NO SUCH CHANNEL: Bob")
        assert alice.unsubscribe("Bob") == error("NO SUCH CHANNEL: Bob")
        assert bob.open() == SUCCESS
        assert alice.subscribe("Bob") == SUCCESS
        assert bob.publish("Hello again!") == SUCCESS
        assert alice.publish("pic attached, base64 encoded, LOL", pic="iVBORw0KGgo") == SUCCESS
        messages = alice.get(0)
        assert [(m["_class"], m["from"], m["body"]) for m in messages] == [
            ("Message", "Bob", "Hello again!"),
            ("Message", "Alice", "pic attached, base64 encoded, LOL"),
        ]
        assert messages[1]["pic"] == "iVBORw0KGgo"
        whens = [m["when"] for m in messages]
        assert all(isinstance(w, int) and w > 0 for w in whens) and whens == sorted(whens)
        assert alice.get(whens[0]) == messages[1:]  # strictly after
        assert alice.get(whens[1]) == []
        assert bob.get(0) == messages[:1]  # Bob is subscribed to his own channel only
        assert alice.unsubscribe("Bob") == SUCCESS
        assert alice.get(0) == messages[1:]  # the channels subscribed to *now*
        big = alice.publish("x" * 300)
        assert big["_class"] == "ErrorResponse" and big["error"].startswith("MESSAGE TOO BIG: ")
        assert int(big["error"].split(": ")[1].split()[0]) > 300
        assert NSDClient(node.nsd_port, "Zed").publish("hi") == error("NO SUCH CHANNEL: Zed")
        alice.send_raw(b"[{]\n")
        assert alice.read_line() == b'{"_class":"ErrorResponse","error":"INVALID REQUEST: [{]"}'
        assert alice.get(0) == messages[1:]  # still serving after an error
    finally:
        node.stop()


def test_bad_input_gets_errors_and_harms_nobody(tmp_path: Path) -> None:
    """Invalid JSON, unknown _class, bad fields, invalid UTF-8, oversize lines and half lines break nothing."""
    node = NodeProcess("n1", tmp_path, frontends=True).start()
    try:
        good = NSDClient(node.nsd_port, "Good")
        assert good.open() == SUCCESS
        bad = NSDClient(node.nsd_port, "Bad")
        cases = [
            b"not json",
            b'{"_class":"TeleportRequest","identity":"Bad"}',
            b'{"_class":"GetRequest","identity":"Bad","after":"yesterday"}',
            b'{"_class":"OpenRequest"}',
            b'{"_class":"OpenRequest","identity":"\xff\xfe"}',
        ]
        for line in cases:
            bad.send_raw(line + b"\n")
            answer = bad.read_line().decode()
            assert answer.startswith('{"_class":"ErrorResponse","error":"INVALID REQUEST: '), answer
        bad.send_raw(b"x" * (2 * 1024 * 1024) + b"\n")  # over the 1 MiB line cap
        assert bad.read_line() == b'{"_class":"ErrorResponse","error":"MESSAGE TOO BIG: 2097152 characters"}'
        half = NSDClient(node.nsd_port, "Half")
        half.send_raw(b'{"_class":"OpenRequest","ident')
        half.close()
        assert good.publish("still here") == SUCCESS
        assert [m["body"] for m in good.get(0)] == ["still here"]
        assert node.proc is not None and node.proc.poll() is None
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_cluster_wide_channels_history_and_cross_protocol(cluster_factory: Callable[..., Cluster]) -> None:
    """A channel opened on node 1 is subscribable on node 3; NSD and WAMP messages cross nodes both ways."""
    cluster = cluster_factory(3, frontends=True)
    await cluster.linked()
    alice = NSDClient(cluster[0].nsd_port, "Alice")
    assert alice.open() == SUCCESS
    await until(lambda: nsd_stats(cluster[2])["channels"] == 1, "node3 to learn channel Alice")
    carol = NSDClient(cluster[2].nsd_port, "Carol")
    assert carol.open() == SUCCESS
    assert carol.subscribe("Alice") == SUCCESS
    # WAMP subscriber on node 2 sees NSD publishes on node 1 as Message objects.
    wamp_sub = await connect(cluster[1].wamp_url)
    rec, _ = await subscribe(wamp_sub, "Alice")
    await until(lambda: "node2" in cluster[0].stats()["remote_interest"].get("Alice", []), "interest in Alice")
    assert alice.publish("from nsd", pic="abc") == SUCCESS
    await rec.wait_for(1)
    [event] = rec.args
    assert (event["_class"], event["from"], event["body"], event["pic"]) == ("Message", "Alice", "from nsd", "abc")
    # A WAMP publish on node 1 shows up in NSD Get on node 3.
    wamp_pub = await connect(cluster[0].wamp_url)
    await publish_acked(wamp_pub, "Alice", {"via": "wamp"})
    await until(lambda: len(carol.get(0)) == 2, "node3 history to hold both messages")
    first, second = carol.get(0)
    assert first == event  # identical, 'when' included, on every node
    assert second["body"] == '{"via":"wamp"}' and second["payload"] == {"via": "wamp"}
    assert second["from"] == "$foreign@node1" and second["when"] > first["when"]  # NSD's from, never the payload's
    # A TEP client on node 2 sees NSD publishes as the Message object.
    with ws_connect(cluster[1].tep_url, open_timeout=10) as tep:
        tep.send(json.dumps({"topic": "join", "payload": ["Alice"]}))
        assert json.loads(tep.recv(timeout=10)) == {"topic": "@join", "payload": ["Alice"]}
        await until(lambda: "node2" in cluster[0].stats()["remote_interest"].get("Alice", []), "interest")
        assert alice.publish("to tep") == SUCCESS
        frame = json.loads(tep.recv(timeout=10))
        assert frame["topic"] == "Alice" and frame["payload"]["body"] == "to tep"
        assert frame["payload"]["_class"] == "Message" and frame["payload"]["from"] == "Alice"
    assert len(carol.get(0)) == 3
    # A client moving to node 2 with its cursor sees the same thing.
    carol_on_2 = NSDClient(cluster[1].nsd_port, "Carol")
    await until(lambda: len(carol_on_2.get(0)) == 3, "node2 history")
    assert carol_on_2.get(first["when"])[0] == second
    await leave(wamp_sub, wamp_pub)


def test_history_and_channels_survive_a_restart_and_reach_a_late_node(
    cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Restarting a node keeps NSD state; a node that joins later gets channels, subscriptions and history."""
    cluster = cluster_factory(2, frontends=True)
    cluster.wait_linked()
    alice = NSDClient(cluster[0].nsd_port, "Alice")
    assert alice.open() == SUCCESS
    for i in range(5):
        assert alice.publish(f"m{i}") == SUCCESS
    before = alice.get(0)
    wait_until(lambda: nsd_stats(cluster[1])["messages"] == 5, "replication to node2")
    cluster[0].stop()
    cluster[0].start()
    again = NSDClient(cluster[0].nsd_port, "Alice")
    assert again.get(0) == before
    assert again.publish("after restart") == SUCCESS
    late = NodeProcess("late", tmp_path, frontends=True)
    late.peers = [node.psc_url for node in cluster.nodes]
    late.start()
    try:
        wait_until(lambda: nsd_stats(late)["messages"] == 6, "state transfer to the late node")
        on_late = NSDClient(late.nsd_port, "Alice")
        assert on_late.get(0) == again.get(0)
        dave = NSDClient(late.nsd_port, "Dave")
        assert dave.open() == SUCCESS
        assert dave.subscribe("Alice") == SUCCESS
    finally:
        late.stop()
