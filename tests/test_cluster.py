"""Real node processes federating WAMP pub/sub (Autobahn-Python clients)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import pytest_twisted
from helpers.nodes import Cluster
from helpers.polling import until
from helpers.wampclient import connect, leave, publish_acked, subscribe

pytestmark = pytest.mark.slow

TOPIC = "com.example.news"
MARKER = "com.example.marker"


def interest_of(node, topic: str) -> list[str]:
    """Which peer nodes asked ``node`` for ``topic``."""
    return list(node.stats()["remote_interest"].get(topic, []))


async def _publish_reaches_all_nodes_exactly_once(cluster: Cluster) -> None:
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url)
    sub2 = await connect(cluster[1].wamp_url, serializer="msgpack")
    sub3 = await connect(cluster[2].wamp_url)
    rec2, _ = await subscribe(sub2, TOPIC)
    rec3, _ = await subscribe(sub3, TOPIC)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2", "node3"], "node1 to learn interest")
    for i in range(50):
        await publish_acked(pub, TOPIC, {"i": i})
    await publish_acked(pub, TOPIC, "end")
    await rec2.wait_until(lambda r: "end" in r.args)
    await rec3.wait_until(lambda r: "end" in r.args)
    expected = [{"i": i} for i in range(50)] + ["end"]
    # FIFO per (origin, topic): a duplicate would have arrived before "end".
    assert rec2.args == expected
    assert rec3.args == expected
    await leave(pub, sub2, sub3)


@pytest_twisted.ensureDeferred
async def test_publish_on_node1_reaches_nodes_2_and_3_exactly_once(cluster_factory: Callable[..., Cluster]) -> None:
    """A publish on node 1 reaches subscribers on nodes 2 and 3 once each, in order."""
    await _publish_reaches_all_nodes_exactly_once(cluster_factory(3))


@pytest_twisted.ensureDeferred
async def test_consumers_listen_mode_federates_too(cluster_factory: Callable[..., Cluster]) -> None:
    """With consumers listening and producers dialling, the same guarantees hold."""
    cluster = cluster_factory(3, listen_role="consumer")
    links = cluster[0].stats()["links"]
    await _publish_reaches_all_nodes_exactly_once(cluster)
    roles = {(link["direction"], link["role"]) for link in cluster[0].stats()["links"]}
    assert roles == {("in", "consumer"), ("out", "producer")}, links


@pytest_twisted.ensureDeferred
async def test_node_without_subscribers_receives_no_psc301(cluster_factory: Callable[..., Cluster]) -> None:
    """Node 3 has no subscriber for the topic, so node 1 sends it no PSC301 for it."""
    cluster = cluster_factory(3)
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url)
    sub2 = await connect(cluster[1].wamp_url)
    sub3 = await connect(cluster[2].wamp_url)
    rec2, _ = await subscribe(sub2, TOPIC)
    marker3, _ = await subscribe(sub3, MARKER)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2"], "interest of node2")
    await until(lambda: interest_of(cluster[0], MARKER) == ["node3"], "interest of node3")
    for i in range(20):
        await publish_acked(pub, TOPIC, i)
    await publish_acked(pub, MARKER, "end")
    await marker3.wait_for(1)
    await rec2.wait_for(20)
    assert cluster[2].stats()["federation"]["received"] == 1  # the marker only
    assert cluster[1].stats()["federation"]["received"] == 20
    assert cluster[0].stats()["federation"]["forwarded"] == 21
    await leave(pub, sub2, sub3)


@pytest_twisted.ensureDeferred
async def test_unsubscribing_stops_the_flow(cluster_factory: Callable[..., Cluster]) -> None:
    """After the last subscriber on node 2 leaves the topic, node 1 stops sending it."""
    cluster = cluster_factory(2)
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url)
    sub = await connect(cluster[1].wamp_url)
    rec, subscription = await subscribe(sub, TOPIC)
    marker, _ = await subscribe(sub, MARKER)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2"], "interest")
    await publish_acked(pub, TOPIC, "before")
    await rec.wait_for(1)
    await subscription.unsubscribe()
    await until(lambda: interest_of(cluster[0], TOPIC) == [], "PSC202 to arrive")
    await publish_acked(pub, TOPIC, "after")
    await publish_acked(pub, MARKER, "end")
    await marker.wait_for(1)
    assert rec.args == ["before"]
    assert cluster[1].stats()["federation"]["received"] == 2  # "before" and the marker
    await leave(pub, sub)


@pytest_twisted.ensureDeferred
async def test_kill_and_restart_restores_links_and_subscriptions(cluster_factory: Callable[..., Cluster]) -> None:
    """``kill -9`` of node 2, then a restart: links come back, subscribers get each message once."""
    cluster = cluster_factory(3)
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url)
    sub3 = await connect(cluster[2].wamp_url)
    rec3, _ = await subscribe(sub3, TOPIC)
    cluster[1].kill()
    await until(
        lambda: sum(1 for link in cluster[0].stats()["links"] if link["state"] == "open") == 2, "node1 to drop node2"
    )
    cluster[1].start()
    await cluster.linked()
    sub2 = await connect(cluster[1].wamp_url)
    rec2, _ = await subscribe(sub2, TOPIC)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2", "node3"], "interest after restart")
    await until(lambda: interest_of(cluster[2], TOPIC) == ["node2"], "node3 to learn node2's interest")
    for i in range(10):
        await publish_acked(pub, TOPIC, i)
    await publish_acked(pub, TOPIC, "end")
    await rec2.wait_until(lambda r: "end" in r.args)
    await rec3.wait_until(lambda r: "end" in r.args)
    assert rec2.args == [*range(10), "end"]
    assert rec3.args == [*range(10), "end"]
    await leave(pub, sub2, sub3)


@pytest_twisted.ensureDeferred
async def test_binary_payload_is_delivered_locally_and_forwarded(cluster_factory: Callable[..., Cluster]) -> None:
    """MessagePack bytes reach local subscribers and, over PSC 0.6, a JSON subscriber on the other node as bytes."""
    cluster = cluster_factory(2)
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url, serializer="msgpack")
    local = await connect(cluster[0].wamp_url, serializer="msgpack")
    remote = await connect(cluster[1].wamp_url)
    rec_local, _ = await subscribe(local, TOPIC)
    rec_remote, _ = await subscribe(remote, TOPIC)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2"], "interest")
    await publish_acked(pub, TOPIC, b"\x00\x01binary")
    await publish_acked(pub, TOPIC, "text")
    await rec_local.wait_for(2)
    await rec_remote.wait_for(2)
    assert rec_local.args == [b"\x00\x01binary", "text"]
    assert rec_remote.args == [b"\x00\x01binary", "text"]
    assert cluster[0].stats()["federation"]["dropped_not_json"] == 0
    await leave(pub, local, remote)


@pytest_twisted.ensureDeferred
async def test_one_peer_each_joins_a_full_mesh(tmp_path) -> None:
    """node2 and node3 each list only node1; they learn of each other, link both ways, and traffic reaches all."""
    from helpers.nodes import NodeProcess, start_all

    nodes = [NodeProcess(f"node{i + 1}", tmp_path) for i in range(3)]
    nodes[1].peers = [nodes[0].psc_url]
    nodes[2].peers = [nodes[0].psc_url]
    cluster = Cluster(nodes)
    try:
        start_all(nodes)  # start-ups overlap
        await cluster.linked()
        assert sorted(nodes[2].stats()["servers"]) == sorted([nodes[0].psc_url, nodes[1].psc_url])
        await _publish_reaches_all_nodes_exactly_once(cluster)
    finally:
        for node in nodes:
            node.stop()


@pytest_twisted.ensureDeferred
async def test_await_interest_makes_a_publish_right_after_subscribed_arrive(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """With --wamp-await-interest, SUBSCRIBED on node 2 means node 1 has the interest: its next publish arrives.

    Twenty fresh topics, each subscribed on node 2 and published on node 1 the
    moment SUBSCRIBED comes back, with no wait in between.
    """
    cluster = cluster_factory(2, extra=("--wamp-await-interest",))
    await cluster.linked()
    sub = await connect(cluster[1].wamp_url)
    pub = await connect(cluster[0].wamp_url)
    recorders = []
    for i in range(20):
        rec, _ = await subscribe(sub, f"com.example.fresh.{i}")
        await publish_acked(pub, f"com.example.fresh.{i}", i)
        recorders.append(rec)
    for i, rec in enumerate(recorders):
        await rec.wait_for(1)
        assert rec.args == [i]
    await leave(sub, pub)
