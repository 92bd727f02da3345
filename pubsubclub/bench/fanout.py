"""``pubsubclub bench --scenario fanout``: one publisher, ``--subscribers`` spread over 3 nodes (or on one).

Three linked nodes are started (``--nodes 1``: one node, which gets
``--workers N`` when N is not 1; ``make bench-peers`` measures the same
against one Crossbar router). A lean asyncio client (the minimal RFC 6455
client of :mod:`pubsubclub.bench.idle`) opens the subscribers round-robin over
the nodes and subscribes each to one topic; a lean publisher on node 1 sends
``--count`` messages of ``--size`` bytes as fast as the node takes them. The
subscribers only count EVENT frames (no JSON decoding), so the rate is the
nodes'. Deliveries/s = events received by all subscribers / time from the
first publish to the last event. Every subscriber must get every message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import time
import urllib.request
from typing import Any

from pubsubclub.bench.idle import frame, idle_node_flags, joined_session, read_frame
from pubsubclub.bench.nodes import free_port, local, machine, progress, start_node, stop, wait_interest

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
                    *idle_node_flags(subscribers)]  # fmt: skip
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


async def _read_frames(reader: asyncio.StreamReader, want: int, counter: list[int], done: asyncio.Event) -> None:
    """Count EVENT frames (type 36) until ``want`` arrived."""
    got = 0
    while got < want:
        if (await read_frame(reader)).startswith(b"[36,"):
            got += 1
            counter[0] += 1
    done.set()


async def _run(
    ports: list[int], ops: str | None, subscribers: int, count: int, size: int, deadline: float
) -> dict[str, Any]:
    """Subscribers round-robin over ``ports``, the publisher on the first; ``ops``: wait there for interest."""
    subs = []
    for i in range(subscribers):
        reader, writer = await joined_session(ports[i % len(ports)], PUBSUB_HELLO)
        writer.write(frame(json.dumps([32, i + 1, {}, TOPIC]).encode()))
        answer = await read_frame(reader)
        if not answer.startswith(b"[33,"):
            raise RuntimeError(f"no SUBSCRIBED: {answer[:80]!r}")
        subs.append((reader, writer))
        if (i + 1) % 250 == 0:
            progress(f"{i + 1} subscribers")
    if ops is not None and len(ports) > 1:
        # Node 1 must know every other node wants the topic before the first publish.
        wait_interest(ops, [TOPIC], peers=len(ports) - 1, timeout=max(deadline - time.monotonic(), 1))
    counter = [0]
    done = [asyncio.Event() for _ in subs]
    readers = [asyncio.ensure_future(_read_frames(r, count, counter, d)) for (r, _), d in zip(subs, done, strict=True)]
    pub_reader, pub_writer = await joined_session(ports[0], PUBSUB_HELLO)
    body = "x" * size
    frames = [frame(json.dumps([16, n + 1, {}, TOPIC, [body]]).encode()) for n in range(min(count, 1000))]
    progress(f"publishing {count} messages of {size} B on node 1 to {subscribers} subscribers")
    start = time.perf_counter()
    for n in range(count):
        pub_writer.write(frames[n % len(frames)])
        if n % 100 == 99:
            await pub_writer.drain()
    await pub_writer.drain()
    remaining = deadline - time.monotonic()
    await asyncio.wait_for(asyncio.gather(*(d.wait() for d in done)), timeout=max(remaining, 1))
    seconds = time.perf_counter() - start
    for task in readers:
        task.cancel()
    for _, writer in [*subs, (pub_reader, pub_writer)]:
        writer.transport.abort()
    return {"deliveries": counter[0], "seconds": seconds}


def measure_fanout(
    ports: list[int], ops: str | None, subscribers: int, count: int, size: int, max_seconds: float
) -> dict[str, Any]:
    """One fan-out run against the WebSocket listeners on ``ports`` (subscribers round-robin, publisher on port 1)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, subscribers * 2 + 1024):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, subscribers * 2 + 1024), hard))
    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(_run(ports, ops, subscribers, count, size, time.monotonic() + max_seconds))
    finally:
        loop.close()
    return {
        "subscribers": subscribers,
        "published": count,
        "deliveries": result["deliveries"],
        "lost": subscribers * count - result["deliveries"],
        "deliveries_per_second": result["deliveries"] / result["seconds"],
    }


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
        figures = measure_fanout(ports, ready[0]["ops"], subscribers, count, size, args.max_seconds)
    finally:
        stop(procs)
    results = {"machine": machine(), "scenario": "fanout", "nodes": nodes, "workers": workers, **figures}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        where = f"over {nodes} nodes" if nodes > 1 else "on one node"
        print(
            f"fan-out 1 -> {subscribers} {where} (--workers {workers}): {figures['deliveries']:,} deliveries = "
            f"{figures['deliveries_per_second']:,.0f}/s, lost {figures['lost']}"
        )
    return 0
