"""``pubsubclub bench --scenario fanout``: one publisher, ``--subscribers`` spread over 3 nodes (or on one).

Three linked nodes are started (``--nodes 1``: one node, which gets
``--workers N`` when N is not 1; ``make bench-peers`` measures the same
against one Crossbar router). One client process (:mod:`pubsubclub.bench.rawfan`:
raw sockets in one epoll loop, JSON over WebSocket) opens the subscribers
round-robin over the nodes, subscribes each to one topic, and publishes
``--fanout-messages`` messages of ``--size`` bytes on node 1 as fast as the
node takes them. The subscribers count EVENT frames by a marker in C (no
frame parsing), so the rate is the nodes'; the client's and the nodes' CPU
per delivery are reported side by side. Deliveries/s = events received by
all subscribers / time from the first publish to the last event. Every
subscriber must get every message exactly once (checked at the end).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import time
import urllib.request
from typing import Any

from pubsubclub.bench import rawfan
from pubsubclub.bench.idle import idle_node_flags
from pubsubclub.bench.nodes import (
    cpu_seconds,
    descendants,
    free_port,
    local,
    machine,
    progress,
    start_node,
    stats,
    stop,
    wait_interest,
)  # fmt: skip

TOPIC = "pubsubclub.bench.fanout"
PUBSUB_HELLO = json.dumps([1, "realm1", {"roles": {"subscriber": {}, "publisher": {}}}]).encode()
NODES = 3


def start_fanout_nodes(
    nodes: int = NODES, workers: int = 1, subscribers: int = 1000
) -> tuple[list[subprocess.Popen[str]], list[dict[str, Any]]]:
    """``nodes`` linked nodes, each allowing the subscribers (and the publisher) from one address."""
    psc = [free_port() for _ in range(nodes)]
    procs, ready = [], []
    try:
        for i in range(nodes):
            args = ["--wamp", local(free_port()), "--psc", local(psc[i]), "--http", local(free_port()),
                    *idle_node_flags(subscribers, workers)]  # fmt: skip
            if workers != 1:  # the flag only when asked for: a node without --workers runs as before
                args += ["--workers", str(workers)]
            for j in range(nodes):
                if j != i:
                    args += ["--peer", f"ws://127.0.0.1:{psc[j]}/psc"]
            proc, line = start_node(f"fan{i + 1}", args)
            procs.append(proc)
            ready.append(line)
    except BaseException:
        stop(procs)
        raise
    return procs, ready


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/", 1)[0])


def _wait_workers(ops: str, timeout: float) -> list[dict[str, Any]]:
    """With workers: until every worker knows another one wants the topic; the per-worker rows of ``/stats``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = stats(ops).get("workers") or []
        if all(TOPIC in (r.get("remote_interest") or {}) for r in rows if r.get("state") == "up"):
            return list(rows)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not learn each other's interest in {TOPIC}: {rows!r}")
        time.sleep(0.05)


def _cpu_by_process(pids: list[int]) -> dict[int, float]:
    """CPU seconds so far of each of ``pids`` and their descendants (a node's supervisor and workers)."""
    out = {}
    for pid in descendants(pids):
        with contextlib.suppress(OSError):
            out[pid] = cpu_seconds(pid)
    return out


def measure_fanout(
    ports: list[int],
    ops: str | None,
    subscribers: int,
    count: int,
    size: int,
    max_seconds: float,
    pids: list[int] | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """One fan-out run against the WebSocket listeners on ``ports`` (subscribers round-robin, publisher on port 1).

    ``pids``: the servers' processes, whose CPU (with their children's) is read from /proc around the run.
    ``workers`` above 1: wait until the node's workers know each other's interest, report sessions per worker.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, subscribers * 2 + 1024):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, subscribers * 2 + 1024), hard))
    deadline = time.monotonic() + max_seconds
    subs = []
    pub = None
    try:
        for i in range(subscribers):
            subs.append(rawfan.subscriber(ports[i % len(ports)], PUBSUB_HELLO, TOPIC, max_seconds))
            if (i + 1) % 250 == 0:
                progress(f"{i + 1} subscribers")
        remaining = max(deadline - time.monotonic(), 1)
        rows: list[dict[str, Any]] = []
        if ops is not None and len(ports) > 1:
            # Node 1 must know every other node wants the topic before the first publish.
            wait_interest(ops, [TOPIC], peers=len(ports) - 1, timeout=remaining)
        if ops is not None and workers > 1:
            rows = _wait_workers(ops, remaining)
        pub = rawfan.publisher(ports[0], PUBSUB_HELLO, max_seconds)
        data = rawfan.publications(TOPIC, count, size)
        progress(f"publishing {count} messages of {size} B on node 1 to {subscribers} subscribers")
        before = _cpu_by_process(pids or [])
        result = rawfan.run(subs, pub, data, count, deadline)
        after = _cpu_by_process(pids or [])
        node_cpu = sum(after.values()) - sum(before.values()) if pids else None
    finally:
        for sock in [*subs, *([pub] if pub is not None else [])]:
            sock.close()
    deliveries = result["deliveries"]
    figures: dict[str, Any] = {
        "subscribers": subscribers,
        "published": count,
        "deliveries": deliveries,
        "lost": subscribers * count - deliveries,
        "deliveries_per_second": deliveries / result["seconds"],
        "client": "raw-epoll-ws",  # one process, one core at most: raw sockets, epoll, EVENTs counted by marker
        "client_cpu_us_per_delivery": result["client_cpu_seconds"] / deliveries * 1e6,
    }
    if node_cpu is not None:
        figures["node_cpu_us_per_delivery"] = node_cpu / deliveries * 1e6
        # Cores busy during the run: the servers' processes (each, busiest first) and the client.
        busy = sorted((after[p] - before.get(p, 0.0) for p in after), reverse=True)
        figures["node_cores_by_process"] = [round(c / result["seconds"], 2) for c in busy if c > 0]
    figures["client_cores"] = round(result["client_cpu_seconds"] / result["seconds"], 2)
    if rows:
        figures["sessions_per_worker"] = [r.get("wamp_sessions") for r in rows]
    return figures


def run_fanout_bench(args: argparse.Namespace) -> int:
    """Start the nodes, fan one publisher out to the subscribers, print deliveries/s."""
    subscribers, count, size = args.subscribers or 1000, args.fanout_messages or 2000, args.size
    nodes, workers = args.nodes or NODES, args.workers
    if nodes < 1 or workers < 1:
        raise SystemExit("pubsubclub: error: --nodes and --workers must be at least 1")
    progress(
        f"settings: --scenario fanout --nodes {nodes} --workers {workers} --subscribers {subscribers}"
        f" --fanout-messages {count} --size {size} --max-seconds {args.max_seconds:g}"
        f" (defaults: {NODES}, 1, 1000, 2000, 100, 60)"
    )
    procs, ready = start_fanout_nodes(nodes, workers, subscribers)
    try:
        ports = [_port(r["wamp"]) for r in ready]
        deadline = time.monotonic() + args.max_seconds
        # Links up before subscribing (interest travels on them).
        while nodes > 1 and time.monotonic() < deadline:
            healths = []
            for r in ready:
                with urllib.request.urlopen(r["health"], timeout=5) as resp:
                    healths.append(json.loads(resp.read())["open_links"])
            if all(h == 2 * (nodes - 1) for h in healths):
                break
            time.sleep(0.05)
        pids = [p.pid for p in procs]
        figures = measure_fanout(ports, ready[0]["ops"], subscribers, count, size, args.max_seconds, pids, workers)
    finally:
        stop(procs)
    results = {"machine": machine(), "scenario": "fanout", "nodes": nodes, "workers": workers, **figures}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        where = f"over {nodes} nodes" if nodes > 1 else "on one node"
        print(
            f"fan-out 1 -> {subscribers} {where} (--workers {workers}): {figures['deliveries']:,} deliveries = "
            f"{figures['deliveries_per_second']:,.0f}/s, lost {figures['lost']}; CPU us/delivery: nodes "
            f"{figures['node_cpu_us_per_delivery']:.2f}, client {figures['client_cpu_us_per_delivery']:.2f}"
            + (f"; sessions per worker {figures['sessions_per_worker']}" if "sessions_per_worker" in figures else "")
        )
    return 0
