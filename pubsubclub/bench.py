"""``pubsubclub bench``: cross-node throughput and latency with real WAMP clients.

Two nodes A and B (started here unless ``--target`` names them), one
Autobahn-Python publisher on A and one Autobahn-Python subscriber on B, each
in its own process. Two runs:

* throughput: ``--count`` messages of ``--size`` bytes, as fast as the
  publisher can (in batches, yielding to the reactor), then an acknowledged
  end marker; FIFO per (origin, topic) means that when the marker arrives,
  every message before it either arrived or was lost;
* latency: ``--latency-count`` messages paced at ``--rate`` per second, each
  carrying its send time; the subscriber computes one-way latency (same host,
  same clock).

Every run is bounded by ``--max-seconds``.

``--serializer msgpack`` and ``--transport rawsocket`` pick the Autobahn
clients' wire (the nodes then also listen with ``--rawsocket``); ``--client
lean`` replaces both clients with :mod:`pubsubclub.bench_lean`'s processes
(throughput only). Both nodes' CPU per delivered message comes from ``/proc``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from pubsubclub.bench_lean import lean_run, lean_window
from pubsubclub.bench_nodes import cpu_seconds, machine, node_pair, progress, stop, wait_interest

TOPIC = "pubsubclub.bench"
END = "end"


# -- the client processes (run with ``python -m pubsubclub.bench``) --------------


def _client_main(argv: list[str]) -> int:
    import txaio

    txaio.use_twisted()
    from twisted.internet import task

    role, url, realm, max_seconds, serializer_name = argv[0], argv[1], argv[2], float(argv[3]), argv[4]
    argv = argv[5:]
    result: dict[str, Any] = {}

    async def run(reactor: Any) -> None:
        from urllib.parse import urlsplit

        from autobahn.twisted.rawsocket import WampRawSocketClientFactory
        from autobahn.twisted.wamp import ApplicationSession
        from autobahn.twisted.websocket import WampWebSocketClientFactory
        from autobahn.wamp.serializer import JsonSerializer, MsgPackSerializer
        from autobahn.wamp.types import ComponentConfig, PublishOptions
        from twisted.internet import defer
        from twisted.internet.endpoints import TCP4ClientEndpoint

        joined: defer.Deferred[Any] = defer.Deferred()

        class Session(ApplicationSession):  # type: ignore[misc]
            def onJoin(self, details: Any) -> None:
                joined.callback(self)

        serializer = MsgPackSerializer() if serializer_name == "msgpack" else JsonSerializer()
        factory: Any
        if url.startswith("rs://"):
            factory = WampRawSocketClientFactory(lambda: Session(ComponentConfig(realm)), serializer=serializer)
        else:
            factory = WampWebSocketClientFactory(
                lambda: Session(ComponentConfig(realm)), url=url, serializers=[serializer]
            )
        parts = urlsplit(url)
        await TCP4ClientEndpoint(reactor, parts.hostname or "127.0.0.1", parts.port or 80).connect(factory)
        session = await joined.addTimeout(10, reactor)

        if role == "subscriber":
            done: defer.Deferred[None] = defer.Deferred()
            state = {"n": 0, "first": 0.0, "last": 0.0}
            latencies: list[float] = []

            def on_event(msg: Any) -> None:
                now = time.time()
                if msg == END:
                    done.callback(None)
                    return
                if state["n"] == 0:
                    state["first"] = now
                state["n"] += 1
                state["last"] = now
                if isinstance(msg, dict) and "t" in msg:
                    latencies.append(now - msg["t"])

            await session.subscribe(on_event, TOPIC)
            sys.stdout.write(json.dumps({"ready": True}) + "\n")
            sys.stdout.flush()
            try:
                await done.addTimeout(max_seconds, reactor)
            except defer.TimeoutError:
                result["timed_out"] = True
            result.update(received=state["n"], first=state["first"], last=state["last"])
            if latencies:
                # Which messages were slowest (by position): tells warm-up from steady-state tails.
                slowest = sorted(range(len(latencies)), key=latencies.__getitem__)[-5:]
                result["slowest_positions"] = sorted(slowest)
                latencies.sort()
                result["latency_ms"] = {
                    "p50": latencies[len(latencies) // 2] * 1000,
                    "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
                    "p999": latencies[min(len(latencies) - 1, int(len(latencies) * 0.999))] * 1000,
                    "max": latencies[-1] * 1000,
                }
        else:
            mode, count, size, rate = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
            body = "x" * size
            start = time.time()
            deadline = start + max_seconds
            sent = 0
            if mode == "throughput":
                batch = 200
                while sent < count and time.time() < deadline:
                    for _ in range(min(batch, count - sent)):
                        session.publish(TOPIC, {"i": sent, "p": body})
                        sent += 1
                    # Let the reactor write; stay bounded by the transport's buffer.
                    await task.deferLater(reactor, 0, lambda: None)
            else:
                interval = 1.0 / rate
                while sent < count and time.time() < deadline:
                    due = min(count, int((time.time() - start) / interval) + 1)
                    while sent < due:
                        session.publish(TOPIC, {"i": sent, "t": time.time(), "p": body})
                        sent += 1
                    await task.deferLater(reactor, min(interval, 0.001), lambda: None)
            await session.publish(TOPIC, END, options=PublishOptions(acknowledge=True))
            result.update(sent=sent, start=start, end=time.time())
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        session.leave()

    task.react(lambda r: defer_run(run, r))
    return 0


def defer_run(fn: Any, reactor: Any) -> Any:
    """Run an async function as a Deferred and print its result line at the end."""
    from twisted.internet import defer

    return defer.ensureDeferred(fn(reactor))


# -- the driver ------------------------------------------------------------------


def _one_run(
    url_a: str,
    url_b: str,
    ops_a: str | None,
    args: argparse.Namespace,
    mode: str,
    count: int,
    rate: float,
) -> dict[str, Any]:
    me = [sys.executable, "-m", "pubsubclub.bench"]
    common = [args.realm, str(args.max_seconds + 10), args.serializer]
    sub = subprocess.Popen([*me, "subscriber", url_b, *common], stdout=subprocess.PIPE, text=True)
    assert sub.stdout is not None
    sub.stdout.readline()  # {"ready": true}
    if ops_a is not None:
        # Node A's /stats (on its operations listener) says when B's interest arrived.
        wait_interest(ops_a, [TOPIC])
    common[1] = str(args.max_seconds)
    pub = subprocess.run(
        [*me, "publisher", url_a, *common, mode, str(count), str(args.size), str(rate)],
        stdout=subprocess.PIPE,
        text=True,
        timeout=args.max_seconds + 30,
    )
    out_sub, _ = sub.communicate(timeout=args.max_seconds + 30)
    p = json.loads(pub.stdout.strip().splitlines()[-1])
    s = json.loads(out_sub.strip().splitlines()[-1])
    duration = max(s.get("last", 0) - p["start"], 1e-9)
    return {
        "mode": mode,
        "client": "autobahn",
        "sent": p["sent"],
        "received": s["received"],
        "lost": p["sent"] - s["received"],
        "publish_rate": p["sent"] / max(p["end"] - p["start"], 1e-9),
        "delivered_rate": s["received"] / duration,
        "latency_ms": s.get("latency_ms"),
        "slowest_positions": s.get("slowest_positions"),
    }


def _settings(args: argparse.Namespace) -> str:
    wire = f"--serializer {args.serializer} --transport {args.transport}"
    if args.client == "lean":
        wire = f"--client lean --publishers {args.publishers} --subscribers {args.subscribers or 1} (JSON, RawSocket)"
    return (
        f"settings: --count {args.count} --size {args.size} --rate {args.rate} --latency-count "
        f"{args.latency_count} --max-seconds {args.max_seconds:g} --realm {args.realm} {wire} "
        f"(defaults: 50000, 100, 1000, 5000, 60, realm1, json, websocket, autobahn)"
        + (f"; targets {args.target[0]} -> {args.target[1]}" if args.target else "; two local nodes")
    )


def run_bench(args: argparse.Namespace) -> int:
    """Run the measurements and print them."""
    procs: list[subprocess.Popen[str]] = []
    progress(_settings(args))
    rawsocket = args.transport == "rawsocket" or args.client == "lean"
    if args.publishers < 1 or (args.subscribers or 1) < 1:
        raise SystemExit("pubsubclub: error: --publishers and --subscribers must be at least 1")
    if args.client == "lean":
        lean_window(args)
    if args.target and rawsocket:
        raise SystemExit("pubsubclub: error: --target takes WebSocket URLs: use it with the Autobahn WebSocket client")
    latency: dict[str, Any] | None = None
    try:
        ops_a: str | None
        if args.target:
            url_a, url_b = args.target
            ops_a = args.target_ops
        else:
            progress("starting two nodes (bench-a, bench-b) on 127.0.0.1")
            extra = ("--rawsocket", "tcp:0:interface=127.0.0.1") if rawsocket else ()
            (pa, ready_a), (pb, ready_b) = node_pair(extra)
            procs += [pa, pb]
            progress(f"node pids: A {pa.pid}, B {pb.pid} (for a profiler)")
            ops_a = ready_a["ops"]
            key = "rawsocket" if rawsocket else "wamp"
            url_a, url_b = ready_a[key], ready_b[key]
        if args.client == "lean":
            throughput = lean_run(args, url_a, url_b, ready_a["ops"], ready_b["ops"], [p.pid for p in procs])
        else:
            progress(f"throughput run: {args.count} messages of {args.size} B as fast as possible (A -> B)")
            cpu_before = [cpu_seconds(p.pid) for p in procs]
            throughput = _one_run(url_a, url_b, ops_a, args, "throughput", args.count, 0)
            if procs:
                # Both nodes' CPU (user + system, from /proc) per delivered message, for the whole run.
                spent = sum(cpu_seconds(p.pid) for p in procs) - sum(cpu_before)
                throughput["server_cpu_us_per_msg"] = spent / max(throughput["received"], 1) * 1e6
            progress(
                f"throughput: {throughput['delivered_rate']:.0f} msgs/s delivered; latency run: "
                f"{args.latency_count} messages at {args.rate}/s"
            )
            latency = _one_run(url_a, url_b, ops_a, args, "latency", args.latency_count, args.rate)
    finally:
        stop(procs)
    results = {
        "machine": machine(),
        "scenario": "wamp",
        "size": args.size,
        "serializer": "json" if args.client == "lean" else args.serializer,
        "transport": "rawsocket" if rawsocket else "websocket",
        "throughput": throughput,
        "latency": latency,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        t, lat = throughput, latency
        print(
            f"throughput: sent {t['sent']} at {t['publish_rate']:.0f}/s, delivered {t['received']} "
            f"at {t['delivered_rate']:.0f} msgs/s cross-node, lost {t['lost']}"
            + (f", nodes' CPU {t['server_cpu_us_per_msg']:.1f} us/msg" if "server_cpu_us_per_msg" in t else "")
        )
        if lat and lat["latency_ms"]:
            lm = lat["latency_ms"]
            print(
                f"latency at {args.rate}/s: p50 {lm['p50']:.2f} ms, p99 {lm['p99']:.2f} ms, p99.9 {lm['p999']:.2f} ms, "
                f"max {lm['max']:.2f} ms, lost {lat['lost']}; slowest messages at positions {lat['slowest_positions']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(_client_main(sys.argv[1:]))
