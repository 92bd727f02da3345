"""Pattern subscriptions across real node processes (PSC 0.5), with Autobahn-Python clients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.types import SubscribeOptions
from helpers.nodes import Cluster, NodeProcess, start_all
from helpers.polling import until
from helpers.wampclient import Recorder, connect, leave, publish_acked, subscribe

pytestmark = pytest.mark.slow


async def subscribe_pattern(session: Any, topic: str, match: str) -> Recorder:
    """Subscribe a new recorder to the ``match`` pattern ``topic``; events keep their details."""
    rec = Recorder()
    await session.subscribe(rec, topic, options=SubscribeOptions(match=match, details=True))
    return rec


def topics_of(rec: Recorder) -> list[tuple[Any, str]]:
    """``(first arg, details.topic)`` of each event."""
    return [(args[0], kwargs["details"].topic) for args, kwargs in rec.events]


def remote_patterns(node: NodeProcess) -> dict[str, list[str]]:
    """``"<match>:<pattern>"`` -> the peers that asked ``node`` for it."""
    return dict(node.stats()["remote_patterns"])


@pytest_twisted.ensureDeferred
async def test_pattern_subscribers_on_node2_get_matching_publishes_from_node1(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Prefix and wildcard subscribers on node 2 get node 1's matching publishes with the concrete topic, and
    node 1 sends node 2 no PSC301 for a topic that matches none of node 2's interest."""
    cluster = cluster_factory(2)
    await cluster.linked()
    sub = await connect(cluster[1].wamp_url)
    pub = await connect(cluster[0].wamp_url, serializer="msgpack")
    by_prefix = await subscribe_pattern(sub, "com.app.", "prefix")
    by_wildcard = await subscribe_pattern(sub, "home..temp", "wildcard")
    exact, _ = await subscribe(sub, "news.today")
    await until(
        lambda: remote_patterns(cluster[0]) == {"prefix:com.app.": ["node2"], "wildcard:home..temp": ["node2"]},
        "node1 to learn node2's patterns",
    )
    await until(lambda: "news.today" in cluster[0].stats()["remote_interest"], "node1 to learn node2's topic")
    unmatched = ["com.other.x", "home.kitchen.humidity", "home.a.b.temp", "news.yesterday", "com.apple"]
    for topic in unmatched:
        await publish_acked(pub, topic, "unwanted")
    await publish_acked(pub, "com.app.orders.1", "p")
    await publish_acked(pub, "home.kitchen.temp", "w")
    await publish_acked(pub, "news.today", "e")
    # The last publish is the marker: FIFO per (origin, topic) is all we have, so it also
    # comes after every unwanted one on the one link, which would have arrived before it.
    await exact.wait_for(1)
    await by_prefix.wait_for(1)
    await by_wildcard.wait_for(1)
    assert topics_of(by_prefix) == [("p", "com.app.orders.1")]
    assert topics_of(by_wildcard) == [("w", "home.kitchen.temp")]
    assert exact.args == ["e"]
    assert cluster[1].stats()["federation"]["received"] == 3
    assert cluster[0].stats()["federation"]["forwarded"] == 3
    await leave(sub, pub)


@pytest_twisted.ensureDeferred
async def test_a_peer_without_the_extension_still_sends_exact_topics(tmp_path: Path) -> None:
    """Node 3 offers no 0.5: node 2's pattern subscriber gets node 1's matches, from node 3 only what node 2 wants
    exactly; exact topics flow both ways as before."""
    nodes = [
        NodeProcess("node1", tmp_path),
        NodeProcess("node2", tmp_path),
        NodeProcess("node3", tmp_path, extra=("--no-federation-patterns",)),
    ]
    for node in nodes:
        node.peers = [other.psc_url for other in nodes if other is not node]
    cluster = Cluster(nodes)
    try:
        start_all(nodes)
        await cluster.linked()
        versions = {(link["peer_node"], link["version"]) for link in nodes[1].stats()["links"]}
        assert versions == {("node1", "0.8"), ("node3", "0.4")}
        sub = await connect(nodes[1].wamp_url)
        pub1 = await connect(nodes[0].wamp_url)
        pub3 = await connect(nodes[2].wamp_url)
        by_prefix = await subscribe_pattern(sub, "com.app.", "prefix")
        exact, _ = await subscribe(sub, "com.app.exact")
        await until(lambda: remote_patterns(nodes[0]) == {"prefix:com.app.": ["node2"]}, "node1 to learn the pattern")
        await until(lambda: "com.app.exact" in nodes[2].stats()["remote_interest"], "node3 to learn the topic")
        assert remote_patterns(nodes[2]) == {}
        await publish_acked(pub3, "com.app.from3", "missed")
        await publish_acked(pub1, "com.app.from1", "one")
        await publish_acked(pub3, "com.app.exact", "three")
        await exact.wait_for(1)
        await by_prefix.wait_until(lambda r: len(r.events) >= 2)
        assert sorted(topics_of(by_prefix)) == [("one", "com.app.from1"), ("three", "com.app.exact")]
        assert exact.args == ["three"]
        await leave(sub, pub1, pub3)
    finally:
        for node in nodes:
            node.stop()
