"""``pubsubclub bench --scenario floor``: the measuring instrument's own latency floor.

The default ``pubsubclub bench`` latency run (an Autobahn-Python publisher on
A, an Autobahn-Python subscriber on B, JSON over WebSocket, ``--latency-count``
messages paced at ``--rate``) with the same client processes and the same
runner (:func:`pubsubclub.bench.wamp.latency_run`), but through two minimal
relays (:mod:`pubsubclub.bench.relay`, ``--nodes 1``: one) instead of two
pubsubclub nodes. What this run measures, no node could remove from the
default run's figures: the clients, the kernel, the machine and the least a
Python process relaying WAMP does per message. The figures have the default
run's names (``latency_ms``, ``lost``, the publisher's, subscriber's and
servers' CPU per message; the servers here are the relays).

``--client lean`` runs the lean clients' latency run
(:func:`pubsubclub.bench.lean.lean_latency`, JSON over WebSocket) through the
relays instead: the floor of ``pubsubclub bench --client lean --transport
websocket``, and of ``--scenario tail --client lean``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pubsubclub.bench.lean import lean_latency
from pubsubclub.bench.nodes import machine, progress, start_node, steal_text, stop
from pubsubclub.bench.wamp import Target, latency_run

RELAY = [sys.executable, "-m", "pubsubclub.bench.relay"]


def _check(args: argparse.Namespace) -> int:
    """The number of relays; SystemExit for settings this scenario cannot use, before anything starts."""
    nodes = args.nodes or 2
    if nodes not in (1, 2):
        raise SystemExit("pubsubclub: error: --nodes takes 1 or 2 here")
    if args.client != "lean" and getattr(args, "acknowledge", False):
        raise SystemExit("pubsubclub: error: --acknowledge is the lean clients' (--client lean)")
    if args.target or args.serializer != "json" or args.transport != "websocket":
        raise SystemExit(
            "pubsubclub: error: --scenario floor runs the Autobahn or the lean clients, JSON over WebSocket, against"
            " its own relays (no --target, --serializer msgpack or --transport rawsocket)"
        )
    return nodes


def run_floor_bench(args: argparse.Namespace) -> int:
    """Start the relays, run the latency run through them, print the figures."""
    progress(
        f"settings: --scenario floor --size {args.size} --rate {args.rate} --latency-count {args.latency_count}"
        f" --max-seconds {args.max_seconds:g} --realm {args.realm} --nodes {args.nodes or 2}"
        f" --client {args.client} (defaults: 100, 1000, 5000, 60, realm1, 2, autobahn); JSON over WebSocket,"
        " minimal relays"
    )
    nodes = _check(args)
    bound = ["--max-seconds", str(args.max_seconds + 120)]  # the relays' own bound, should the driver hang
    procs: list[Any] = []
    try:
        if nodes == 1:
            progress("starting one relay (relay-single) on 127.0.0.1")
            proc, ready = start_node("relay-single", bound, RELAY)
            procs.append(proc)
            target = Target(ws=(ready["wamp"],) * 2, pids=(proc.pid,))
            progress(f"relay pids: A {proc.pid}, B {proc.pid}")
        else:
            progress("starting two relays (relay-a, relay-b) on 127.0.0.1")
            pb, ready_b = start_node("relay-b", ["--peer-listen", *bound], RELAY)
            procs.append(pb)
            pa, ready_a = start_node("relay-a", ["--peer", str(ready_b["peer"]), *bound], RELAY)
            procs.append(pa)
            target = Target(ws=(ready_a["wamp"], ready_b["wamp"]), pids=(pa.pid, pb.pid))
            progress(f"relay pids: A {pa.pid}, B {pb.pid}")
        progress(f"latency run: {args.latency_count} messages at {args.rate}/s (A -> B, through the relays)")
        if args.client == "lean":
            latency = lean_latency(args, *target.ws, list(target.pids))
        else:
            latency = latency_run(args, target)
    finally:
        stop(procs)
    results = {
        "machine": machine(),
        "scenario": "floor",
        "nodes": nodes,
        "client": args.client,
        "size": args.size,
        "serializer": "json",
        "transport": "websocket",
        "latency": latency,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        lat, lm = latency, latency.get("latency_ms") or {}
        clients = (
            ""
            if args.client == "lean"
            else f"publisher {lat['publisher_cpu_us_per_msg']:.1f}, subscriber {lat['subscriber_cpu_us_per_msg']:.1f}, "
        )
        print(
            f"floor latency at {args.rate}/s ({nodes} relay{'s' if nodes == 2 else ''}, {args.client} clients): "
            + (
                f"p50 {lm['p50']:.2f} ms, p99 {lm['p99']:.2f} ms, p99.9 {lm['p999']:.2f} ms, max {lm['max']:.2f} ms, "
                if lm
                else ""
            )
            + f"lost {lat['lost']}; CPU per message: {clients}relays {lat.get('server_cpu_us_per_msg', 0.0):.1f} us"
            + steal_text(lat)
        )
    return 0
