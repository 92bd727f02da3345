"""``pubsubclub status``: the cluster's nodes and links from the ops listeners, against real nodes (issue 21)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from helpers.nodes import REPO, Cluster
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_port


def status(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pubsubclub status`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "pubsubclub", "status", *args],
        capture_output=True, text=True, cwd=REPO, timeout=WAIT_SECONDS,
    )  # fmt: skip


def test_status_names_every_node_and_link_state(cluster_factory: Callable[..., Cluster]) -> None:
    """From one node's ops URL the table names all three nodes and each of that node's links, open, 0.8."""
    cluster = cluster_factory(3)
    cluster.wait_linked()
    done = status("--http", cluster[0].ops_url)
    assert done.returncode == 0, done.stderr
    _title, nodes, links = done.stdout.split("\n\n")
    node_rows = {line.split()[0]: line.split() for line in nodes.splitlines()[1:]}
    assert node_rows["node1"][1] == "ready" and node_rows["node1"][3] == "4/4"
    assert node_rows["node2"][1] == node_rows["node3"][1] == "linked"
    link_rows = [line.split() for line in links.splitlines()[1:]]
    assert sorted((row[1], row[4]) for row in link_rows) == [
        ("node2", "in"), ("node2", "out"), ("node3", "in"), ("node3", "out")
    ]  # fmt: skip
    assert all(row[5] == "open" and row[6] == "0.8" for row in link_rows)
    assert cluster[1].psc_url in links


def test_status_json_and_watch_frames(cluster_factory: Callable[..., Cluster]) -> None:
    """--json gives the nodes' /stats with per-peer traffic; --watch 0.2 --count 2 prints two frames with rates."""
    cluster = cluster_factory(2)
    cluster.wait_linked()
    urls = ("--http", cluster[0].ops_url, "--http", cluster[1].ops_url)
    done = status(*urls, "--json")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert [n["stats"]["node"] for n in said["nodes"]] == ["node1", "node2"] and said["unreachable"] == []
    assert all(n["status"] == "ready" and "peers" in n["stats"]["traffic"] for n in said["nodes"])
    watched = status(*urls, "--watch", "0.2", "--count", "2")
    assert watched.returncode == 0, watched.stderr
    frames = watched.stdout.split("pubsubclub status: ")[1:]
    assert len(frames) == 2
    # The second frame has a previous one, so its rate columns hold numbers instead of "-".
    assert " 0.0 " in frames[1] and " 0.0 " not in frames[0]


def test_status_of_an_unreachable_url_says_so_and_exits_1() -> None:
    """Nothing listening at --http: a clear message naming the URL, exit 1, no traceback."""
    url = f"http://127.0.0.1:{free_port()}/"
    done = status("--http", url)
    assert done.returncode == 1
    assert f"pubsubclub status: cannot reach {url}: " in done.stderr
    assert "is the node running" in done.stderr and "Traceback" not in done.stderr
