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
lean`` replaces both clients with :mod:`pubsubclub.bench.lean`'s processes
(and its own latency run: the nodes' share, nearly no client library), over
RawSocket unless ``--transport websocket`` is given. Both
nodes' CPU per delivered message comes from ``/proc``, for each run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from pubsubclub.bench.lean import latency_summary, lean_latency, lean_run, lean_window, publisher_and_subscriber
from pubsubclub.bench.nodes import (
    free_port,
    local,
    machine,
    node_pair,
    progress,
    start_node,
    steal_seconds,
    steal_text,
    stolen_since,
    stop,
    tree_cpu_seconds,
    wait_interest,
)
from pubsubclub.bench.pacing import install_precise_reactor, until_due
from pubsubclub.net.nodelay import set_no_delay

TOPIC = "pubsubclub.bench"
END = "end"
#: Sent by the publisher until the subscriber answers on READY_TOPIC: then the route works both ways
#: (a subscription can take a moment to reach the publisher's node or router, over PSC or rlinks).
PROBE = "probe"
READY_TOPIC = "pubsubclub.bench.ready"


# -- the client processes (run with ``python -m pubsubclub.bench.wamp``) --------------


def _client_main(argv: list[str]) -> int:
    import txaio

    txaio.use_twisted()
    install_precise_reactor()  # see pubsubclub.bench.pacing
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
        proto: Any = await TCP4ClientEndpoint(reactor, parts.hostname or "127.0.0.1", parts.port or 80).connect(factory)
        # Nagle off, as a latency-minded user does: Autobahn's client connections keep it on (its
        # WebSocket attempt fails silently, RawSocket has none; see pubsubclub.net.nodelay), and a
        # paced message can then wait up to 40 ms for the ACK of the one before.
        set_no_delay(proto.transport)
        session = await joined.addTimeout(10, reactor)

        if role == "subscriber":
            done: defer.Deferred[None] = defer.Deferred()
            state = {"n": 0, "first": 0.0, "last": 0.0, "cpu": 0.0}
            latencies: list[float] = []

            def on_event(msg: Any) -> None:
                now = time.time()
                if msg == PROBE:
                    session.publish(READY_TOPIC, "ready")
                    return
                if msg == END:
                    done.callback(None)
                    return
                if state["n"] == 0:
                    state["first"] = now
                    state["cpu"] = time.process_time()
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
            # This process's own CPU from the first message to the end marker (is the client the limit?).
            result["cpu_seconds"] = time.process_time() - state["cpu"] if state["n"] else 0.0
            # Which messages were slowest (by position) tells warm-up from steady-state tails.
            result.update(latency_summary(latencies))
        else:
            mode, count, size, rate = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
            body = "x" * size
            deadline = time.time() + max_seconds
            ready: defer.Deferred[None] = defer.Deferred()
            await session.subscribe(lambda _: None if ready.called else ready.callback(None), READY_TOPIC)
            while not ready.called:
                if time.time() > deadline:
                    raise TimeoutError("the subscriber never answered a probe")
                session.publish(TOPIC, PROBE)
                await task.deferLater(reactor, 0.05, lambda: None)
            start = time.time()
            cpu_start = time.process_time()
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
                    await task.deferLater(reactor, until_due(start, sent, interval, time.time()), lambda: None)
            await session.publish(TOPIC, END, options=PublishOptions(acknowledge=True))
            result.update(sent=sent, start=start, end=time.time(), cpu_seconds=time.process_time() - cpu_start)
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


@dataclass(frozen=True)
class Target:
    """Where a WAMP run goes: the WebSocket and RawSocket URLs of A (publisher) and B (subscriber).

    ``pids`` are the server processes whose CPU (with their children's) is the
    servers' cost; A and B may be the same node or router.
    """

    ws: tuple[str, str]
    rs: tuple[str, str] | None = None
    pids: tuple[int, ...] = ()


def _one_run(target: Target, args: argparse.Namespace, mode: str, count: int, rate: float) -> dict[str, Any]:
    me = [sys.executable, "-m", "pubsubclub.bench.wamp"]
    if args.transport == "rawsocket":
        assert target.rs is not None
        url_a, url_b = target.rs
    else:
        url_a, url_b = target.ws
    common = [args.realm, str(args.max_seconds + 10), args.serializer]
    sub_argv = [*me, "subscriber", url_b, *common]
    common[1] = str(args.max_seconds)
    pub_argv = [*me, "publisher", url_a, *common, mode, str(count), str(args.size), str(rate)]
    p, s = publisher_and_subscriber(sub_argv, pub_argv, args.max_seconds + 30)
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
        "publisher_cpu_us_per_msg": p["cpu_seconds"] / max(p["sent"], 1) * 1e6,
        "subscriber_cpu_us_per_msg": s["cpu_seconds"] / max(s["received"], 1) * 1e6,
    }


def measure(args: argparse.Namespace, target: Target) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The throughput run and the latency run against ``target``, with the Autobahn or the lean clients."""
    if args.client == "lean":
        urls = target.rs if args.transport == "rawsocket" else target.ws
        assert urls is not None
        return lean_run(args, *urls, list(target.pids)), lean_latency(args, *urls, list(target.pids))
    progress(f"throughput run: {args.count} messages of {args.size} B as fast as possible (A -> B)")
    cpu_before = tree_cpu_seconds(list(target.pids))
    throughput = _one_run(target, args, "throughput", args.count, 0)
    if target.pids:
        # The servers' CPU (user + system, from /proc) per delivered message, for the whole run.
        spent = tree_cpu_seconds(list(target.pids)) - cpu_before
        throughput["server_cpu_us_per_msg"] = spent / max(throughput["received"], 1) * 1e6
    progress(
        f"throughput: {throughput['delivered_rate']:.0f} msgs/s delivered; latency run: "
        f"{args.latency_count} messages at {args.rate}/s"
    )
    return throughput, latency_run(args, target)


def latency_run(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """The Autobahn clients' latency run against ``target``, with the servers' CPU per message when it has pids."""
    cpu_before = tree_cpu_seconds(list(target.pids))
    steal_before = steal_seconds()
    latency = _one_run(target, args, "latency", args.latency_count, args.rate)
    latency["steal_seconds"] = stolen_since(steal_before)
    if target.pids:
        spent = tree_cpu_seconds(list(target.pids)) - cpu_before
        latency["server_cpu_us_per_msg"] = spent / max(latency["received"], 1) * 1e6
    return latency


def _settings(args: argparse.Namespace) -> str:
    wire = f"--serializer {args.serializer} --transport {args.transport}"
    if args.client == "lean":
        wire = (
            f"--client lean --transport {args.transport} --publishers {args.publishers} --subscribers"
            f" {args.subscribers or 1} (JSON; lean: rawsocket unless --transport websocket)"
        )
    return (
        f"settings: --count {args.count} --size {args.size} --rate {args.rate} --latency-count "
        f"{args.latency_count} --max-seconds {args.max_seconds:g} --realm {args.realm} {wire} "
        f"(defaults: 50000, 100, 1000, 5000, 60, realm1, json, websocket, autobahn)"
        + (
            f"; targets {args.target[0]} -> {args.target[1]}"
            if args.target
            else f"; --nodes {args.nodes or 2} --workers {getattr(args, 'workers', 1)} (local nodes)"
        )  # fmt: skip
    )


def workers_flag(args: argparse.Namespace) -> list[str]:
    """``--workers N`` for the nodes when N is not 1; nothing for 1 (a node without the flag runs as before)."""
    workers = getattr(args, "workers", 1)
    return ["--workers", str(workers)] if workers != 1 else []


def check_wamp_args(args: argparse.Namespace) -> None:
    """SystemExit for settings the WAMP runs cannot use, before anything starts."""
    if args.publishers < 1 or (args.subscribers or 1) < 1:
        raise SystemExit("pubsubclub: error: --publishers and --subscribers must be at least 1")
    if getattr(args, "nodes", None) not in (None, 1, 2) or getattr(args, "workers", 1) < 1:
        raise SystemExit("pubsubclub: error: --nodes takes 1 or 2 here, --workers at least 1")
    if args.client == "lean":
        args.serializer = "json"
        lean_window(args)
    elif getattr(args, "acknowledge", False):
        raise SystemExit("pubsubclub: error: --acknowledge is the lean clients' (--client lean)")


def run_bench(args: argparse.Namespace) -> int:
    """Run the measurements and print them."""
    progress(_settings(args))
    check_wamp_args(args)
    if args.target and args.transport == "rawsocket":
        raise SystemExit("pubsubclub: error: --target takes WebSocket URLs: use it with the Autobahn WebSocket client")
    procs: list[subprocess.Popen[str]] = []
    try:
        if args.target:
            if args.target_ops:
                wait_interest(args.target_ops, [TOPIC])
            target = Target(ws=tuple(args.target))  # type: ignore[arg-type]
        elif (args.nodes or 2) == 1:
            # Publishers and subscribers on one node (e.g. the lean clients on a node with --workers).
            progress("starting one node (bench-single) on 127.0.0.1")
            flags = ["--wamp", local(free_port()), "--psc", local(0), "--rawsocket", local(free_port())]
            proc, ready = start_node("bench-single", [*flags, *workers_flag(args)])
            procs.append(proc)
            target = Target(ws=(ready["wamp"],) * 2, rs=(ready["rawsocket"],) * 2, pids=(proc.pid,))
        else:
            progress("starting two nodes (bench-a, bench-b) on 127.0.0.1")
            (pa, ready_a), (pb, ready_b) = node_pair(("--rawsocket", "tcp:0:interface=127.0.0.1", *workers_flag(args)))
            procs += [pa, pb]
            progress(f"node pids: A {pa.pid}, B {pb.pid} (for a profiler)")
            target = Target(
                ws=(ready_a["wamp"], ready_b["wamp"]), rs=(ready_a["rawsocket"], ready_b["rawsocket"]),
                pids=(pa.pid, pb.pid),
            )  # fmt: skip
        throughput, latency = measure(args, target)
    finally:
        stop(procs)
    results = {
        "machine": machine(),
        "scenario": "wamp",
        "size": args.size,
        "serializer": args.serializer,
        "transport": args.transport,
        "throughput": throughput,
        "latency": latency,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        t, lat = throughput, latency
        print(
            f"throughput: sent {t['sent']} at {t['publish_rate']:.0f}/s, delivered {t['received']} "
            f"at {t['delivered_rate']:.0f} msgs/s {'on one node' if args.nodes == 1 else 'cross-node'}, "
            f"lost {t['lost']}"
            + (f", nodes' CPU {t['server_cpu_us_per_msg']:.1f} us/msg" if "server_cpu_us_per_msg" in t else "")
            + (
                f"; clients' CPU: publisher {t['publisher_cpu_us_per_msg']:.1f}, subscriber "
                f"{t['subscriber_cpu_us_per_msg']:.1f} us/msg"
                if "publisher_cpu_us_per_msg" in t
                else ""
            )
        )
        if lat and lat["latency_ms"]:
            lm = lat["latency_ms"]
            print(
                f"latency at {args.rate}/s: p50 {lm['p50']:.2f} ms, p99 {lm['p99']:.2f} ms, p99.9 {lm['p999']:.2f} ms, "
                f"max {lm['max']:.2f} ms, lost {lat['lost']}; slowest messages at positions {lat['slowest_positions']}"
                + (f"; nodes' CPU {lat['server_cpu_us_per_msg']:.1f} us/msg" if "server_cpu_us_per_msg" in lat else "")
                + f" ({lat['client']} clients)"
                + steal_text(lat)
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(_client_main(sys.argv[1:]))
