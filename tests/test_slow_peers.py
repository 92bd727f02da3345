"""Clients that stop reading and peers that freeze, against real node processes, memory read from /proc.

Clients are bare sockets (tests/helpers/rawws.py ``SocketWebSocket``): they read only
when told to, so they can stop. Every load loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.nodes import Cluster, NodeProcess, start_cluster
from helpers.polling import wait_until
from helpers.rawws import SocketWebSocket, Wamp

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
#: Send buffer / link queue cap given to the nodes here (the default is 16 MiB).
CAP = 1 * MiB
#: What a node may grow by beyond its caps: the interpreter's own churn while it works.
MARGIN = 16 * MiB
#: One message's payload.
PAYLOAD = "x" * 1000


def flood(node: NodeProcess, publisher: SocketWebSocket, send: object, count: int, seconds: float) -> int:
    """Call ``send(i)`` up to ``count`` times within ``seconds``, sampling the node's RSS; the peak RSS."""
    assert callable(send)
    peak = node.rss()
    deadline = time.monotonic() + seconds
    for i in range(count):
        send(i)
        if i % 500 == 0:
            peak = max(peak, node.rss())
            if time.monotonic() > deadline:
                break
    return max(peak, node.rss())


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One node with WAMP, TEP and the ops port, with a 1 MiB send buffer."""
    n = NodeProcess("slow", tmp_path, extra=("--max-send-buffer", str(CAP)), frontends=True).start()
    yield n
    n.stop()


def test_wamp_subscriber_that_stops_reading_is_dropped_and_counted(node: NodeProcess) -> None:
    """Past the send buffer a non-reading WAMP subscriber is dropped; the node stays within its cap; others served."""
    slow = Wamp(node, rcvbuf=4096)
    slow.subscribe("slow.t")
    publisher = Wamp(node)
    baseline = node.rss()
    # 48 MB offered: without the cap all of it would queue in the node for the stuck client.
    peak = flood(node, publisher, lambda i: publisher.publish("slow.t", PAYLOAD), 48_000, 60.0)
    publisher.publish("slow.t", "sync", acknowledge=True)  # the node has handled every publish before it
    assert node.metric("pubsubclub_disconnects_total", frontend="wamp", reason="slow_consumer") == 1
    assert peak - baseline < CAP + MARGIN, f"node grew by {(peak - baseline) / MiB:.1f} MiB"
    assert slow.closed_by_peer()
    healthy = Wamp(node)
    healthy.subscribe("slow.t")
    publisher.publish("slow.t", "marker", acknowledge=True)
    assert healthy.next_event() == ["marker"]


def test_tep_client_that_stops_reading_is_dropped_and_counted(node: NodeProcess) -> None:
    """The same for a TEP client that joined a channel and stopped reading."""
    slow = SocketWebSocket(node.tep_port, "/tep", rcvbuf=4096)
    slow.send_text(json.dumps({"topic": "join", "payload": ["slowchan"]}))
    assert json.loads(slow.recv_text()) == {"topic": "@join", "payload": ["slowchan"]}
    publisher = Wamp(node)
    baseline = node.rss()
    peak = flood(node, publisher, lambda i: publisher.publish("slowchan", PAYLOAD), 48_000, 60.0)
    publisher.publish("slowchan", "sync", acknowledge=True)
    assert node.metric("pubsubclub_disconnects_total", frontend="tep", reason="slow_consumer") == 1
    assert peak - baseline < CAP + MARGIN, f"node grew by {(peak - baseline) / MiB:.1f} MiB"
    assert slow.closed_by_peer()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Cluster]:
    """Two linked nodes with 1 MiB link queues and replay buffers; SIGCONT and stop at the end."""
    cap = ("--max-link-queue", str(CAP), "--replay-buffer-bytes", str(CAP))
    cluster = start_cluster(tmp_path, 2, extra=cap)
    yield cluster
    for n in cluster.nodes:
        if n.proc is not None and n.proc.poll() is None:
            os.kill(n.proc.pid, signal.SIGCONT)
        n.stop()


def _links_to(node: NodeProcess, peer: str) -> list[tuple[str, str]]:
    return sorted((link["direction"], link["state"]) for link in node.stats()["links"] if link["peer_node"] == peer)


def test_frozen_peer_is_closed_within_15_s_and_costs_at_most_the_caps(pair: Cluster) -> None:
    """SIGSTOP a peer for 30 s under load: the node closes both links within 15 s, keeps to its caps, relinks once."""
    a, b = pair[0], pair[1]
    pair.wait_linked()
    frozen_subscriber = Wamp(b)
    frozen_subscriber.subscribe("frozen.t")
    wait_until(lambda: a.stats()["remote_interest"].get("frozen.t") == ["node2"], "node2's interest at node1")
    publisher = Wamp(a)
    baseline = a.rss()
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    closed_after: float | None = None
    peak = baseline
    # ~2,000 msgs/s of 1 KB for 30 s: 60 MB offered to the frozen peer, paced and bounded.
    for i in range(60_000):
        publisher.publish("frozen.t", PAYLOAD)
        if i % 200 == 0:
            time.sleep(0.1)  # pacing the load generator, not waiting for an event
            peak = max(peak, a.rss())
            if closed_after is None and all(state != "open" for _, state in _links_to(a, "node2")):
                closed_after = time.monotonic() - frozen_at
            if time.monotonic() - frozen_at > 30:
                break
    publisher.publish("frozen.t", "sync", acknowledge=True)
    peak = max(peak, a.rss())
    assert closed_after is not None and closed_after <= 15, f"links to the frozen peer closed after {closed_after}"
    # Caps for one peer: its replay buffer, plus a transport queue of link queue + one replay burst.
    assert peak - baseline < 3 * CAP + MARGIN, f"node1 grew by {(peak - baseline) / MiB:.1f} MiB"
    os.kill(b.proc.pid, signal.SIGCONT)
    pair.wait_linked()
    wait_until(lambda: _links_to(a, "node2") == [("in", "open"), ("out", "open")], "one link per direction")
    fresh = Wamp(b)
    fresh.subscribe("after.t")
    wait_until(lambda: "node2" in a.stats()["remote_interest"].get("after.t", []), "interest after the thaw")
    publisher.publish("after.t", "marker", acknowledge=True)
    assert fresh.next_event() == ["marker"]
