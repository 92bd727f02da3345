"""Metrics on real nodes: dump files with exact counts, Prometheus text on /metrics."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import Cluster
from helpers.polling import until
from helpers.wampclient import connect, leave, publish_acked, subscribe

pytestmark = pytest.mark.slow


def read_dumps(folder: Path) -> list[dict]:
    """Every record of every dump file under ``folder``."""
    rows = []
    for path in sorted(folder.rglob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


@pytest_twisted.ensureDeferred
async def test_dumps_count_exactly_the_traffic_sent(cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    """Published, delivered, forwarded and received counts in the dumps equal the WAMP traffic, per node."""
    metrics = tmp_path / "metrics"
    cluster = cluster_factory(3, extra=("--metrics-dir", str(metrics), "--metrics-interval", "0.2"))
    await cluster.linked()
    pub = await connect(cluster[0].wamp_url)
    subs = [await connect(node.wamp_url) for node in cluster.nodes[1:]]
    recs = [(await subscribe(s, "hot.topic"))[0] for s in subs]
    cold, _ = await subscribe(subs[0], "cold.topic")
    await until(lambda: cluster[0].stats()["remote_interest"].get("hot.topic") == ["node2", "node3"], "interest")
    await until(lambda: cluster[0].stats()["remote_interest"].get("cold.topic") == ["node2"], "interest")
    for i in range(30):
        await publish_acked(pub, "hot.topic", {"i": i})
    for i in range(7):
        await publish_acked(pub, "cold.topic", i)
    for rec in recs:
        await rec.wait_for(30)
    await cold.wait_for(7)
    text = urllib.request.urlopen(f"http://127.0.0.1:{cluster[0].http_port}/metrics", timeout=5).read().decode()
    assert (
        'pubsubclub_messages_total{frontend="wamp",kind="published",peer="",reason="",topic="hot.topic"} 30.0' in text
    )
    await leave(pub, *subs)
    for node in cluster.nodes:
        assert node.stop() == 0  # the final dump is written on shutdown
    rows = read_dumps(metrics)
    assert {r["v"] for r in rows} == {1}
    totals: Counter[tuple[str, str, str, str | None]] = Counter()
    for r in rows:
        if r["type"] == "counter":
            totals[(r["node"], r["topic"], r["kind"], r["peer"])] += r["count"]
    assert totals[("node1", "hot.topic", "published", None)] == 30
    assert totals[("node1", "cold.topic", "published", None)] == 7
    assert totals[("node1", "hot.topic", "forwarded", "node2")] == 30
    assert totals[("node1", "hot.topic", "forwarded", "node3")] == 30
    assert totals[("node1", "cold.topic", "forwarded", "node2")] == 7
    assert totals[("node1", "cold.topic", "forwarded", "node3")] == 0
    assert totals[("node2", "hot.topic", "received", "node1")] == 30
    assert totals[("node2", "hot.topic", "delivered", None)] == 30
    assert totals[("node3", "hot.topic", "delivered", None)] == 30
    assert totals[("node2", "cold.topic", "delivered", None)] == 7
    assert totals[("node1", "hot.topic", "delivered", None)] == 0
    latency = [r for r in rows if r["type"] == "latency" and r["node"] == "node2"]
    assert sum(r["count"] for r in latency) == 37 and {r["origin"] for r in latency} == {"node1"}
    files = list(metrics.rglob("*"))
    assert not [f for f in files if f.name.endswith(".tmp")]
    assert {f.relative_to(metrics).parts[0] for f in files} == {"node=node1", "node=node2", "node=node3"}


@pytest_twisted.ensureDeferred
async def test_report_over_a_real_clusters_dumps_counts_exactly(
    cluster_factory: Callable[..., Cluster], tmp_path: Path, spark: object
) -> None:
    """Report over 3 real nodes' dumps: Parquet totals equal the WAMP traffic; the page names the top topic."""
    import pyarrow.parquet as pq

    from pubsubclub.reports.job import run_report

    metrics = tmp_path / "metrics"
    cluster = cluster_factory(3, extra=("--metrics-dir", str(metrics), "--metrics-interval", "0.3"))
    await cluster.linked()
    sessions = [await connect(node.wamp_url) for node in cluster.nodes]
    # Every node subscribes "busy" and "quiet"; each node publishes 20 "busy" and 5 "quiet".
    recorders = []
    for s in sessions:
        for topic in ("busy", "quiet"):
            recorders.append((await subscribe(s, topic))[0])
    for node in cluster.nodes:
        await until(lambda n=node: all(len(n.stats()["remote_interest"].get(t, [])) == 2 for t in ("busy", "quiet")),
                   "full interest")  # fmt: skip
    for s in sessions:
        for i in range(20):
            await publish_acked(s, "busy", i)
        for i in range(5):
            await publish_acked(s, "quiet", i)
    # exclude_me: each session gets the other two nodes' messages only.
    for rec in recorders[0::2]:
        await rec.wait_for(40)
    for rec in recorders[1::2]:
        await rec.wait_for(10)
    await leave(*sessions)
    for node in cluster.nodes:
        assert node.stop() == 0
    out = tmp_path / "report"
    result = run_report(metrics, out, spark=spark, progress=lambda _m: None)
    totals = {row["topic"]: row for row in pq.read_table(out / "topic_totals").to_pylist()}
    assert (totals["busy"]["published"], totals["busy"]["delivered"], totals["busy"]["forwarded"]) == (60, 120, 120)
    assert (totals["quiet"]["published"], totals["quiet"]["delivered"], totals["quiet"]["forwarded"]) == (15, 30, 30)
    assert totals["busy"]["received"] == 120
    matrix = {(r["node"], r["peer"]): r["count"] for r in pq.read_table(out / "traffic_matrix").to_pylist()}
    assert matrix == {(a, b): 25 for a in ("node1", "node2", "node3") for b in ("node1", "node2", "node3") if a != b}
    fanout = {r["topic"]: r["fanout"] for r in pq.read_table(out / "fanout").to_pylist()}
    assert fanout == {"busy": 2.0, "quiet": 2.0}
    assert result.top_topic == "busy"
    assert "busy" in result.html.read_text()
