"""``pubsubclub bench --scenario tail``: issue 22's tail bar checked in one command.

The bar: p99 at 1,000 msgs/s at most 1 ms in every one of 10 consecutive
``pubsubclub bench`` runs. This scenario runs ``--runs`` (default 10) default
``pubsubclub bench`` runs, each as its own ``python -m pubsubclub bench --json``
child process (fresh nodes, the throughput run, then the latency run: exactly
what a user's separate invocation does), and unless ``--no-floor`` alternates
them with as many ``--scenario floor`` runs (floor, nodes, floor, nodes, ...),
so that the nodes and the instrument's own floor see the same minutes of the
machine. ``--client lean`` runs the same check with the lean clients, JSON
over WebSocket (``pubsubclub bench --client lean --transport websocket``: the
nodes' share of the latency, nearly no client library), paired with the floor
of the same clients (``--scenario floor --client lean``); with ``--transport
rawsocket`` the lean clients run over RawSocket, with no floor runs (the
floor's relays speak WebSocket only).
Unless ``--no-host-probe``, each pair starts with a ``--scenario hop`` run
(:mod:`pubsubclub.bench.hop`: one loopback hop between two trivial
processes) and one more follows the last pair, which say how quiet the
machine was in those minutes: the bar asks for "a quiet machine", and a host
whose one hop alone has a p99 over ``--quiet-ms`` is not one. Every latency
run also reports the CPU time the hypervisor stole during it
(``steal_seconds``, all vCPUs summed); more than ``--quiet-steal`` in a
pair's floor or nodes run makes that pair not quiet. Then the verdict
(:func:`verdict`, a pure function of the runs): per side the runs over
``--bar-ms`` or with a lost message, "met in k of N", the medians, the
nodes' p99 minus the floor's p99 of each pair, and the pairs whose host was
quiet with the nodes' runs among them that met the bar. The headline stays "met in k of N" over all runs:
the quiet figures explain a miss, they do not drop it.

Each child runs in its own process group; a child that fails, prints no
results or outlives :func:`child_timeout` is stopped with everything it
started (SIGTERM to the group, SIGKILL to what is left) and named in the error.
The bench's own SIGTERM, Ctrl-C or an exception does the same to the running
child.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pubsubclub.bench.nodes import machine, progress

#: Most runs per side: a bound on the loop (10 is the bar; 100 pairs take over an hour).
MAX_RUNS = 100
#: Seconds a stopped child has to unwind (its nodes' own stop) before its process group is killed.
STOP_GRACE = 30.0
#: The child runs' lines shown in an error about them.
ERROR_LINES = 12

#: Options of ``pubsubclub bench`` that do not apply to the bar's runs, with the value that means "not given".
REFUSED: dict[str, tuple[str, Any]] = {
    "--target": ("target", None),
    "--target-ops": ("target_ops", None),
    "--serializer": ("serializer", "json"),
    "--workers": ("workers", 1),
    "--publishers": ("publishers", 1),
    "--subscribers": ("subscribers", None),
    "--window": ("window", None),
    "--clients": ("clients", None),
    "--topology": ("topology", "both"),
    "--calls": ("calls", None),
    "--rows": ("rows", "events,calls,idle,fanout"),
    "--fanout-messages": ("fanout_messages", None),
    "--sessions": ("sessions", 10_000),
    "--batch": ("batch", 1000),
    "--relaxed": ("relaxed", False),
    "--acknowledge": ("acknowledge", False),
    "--cluster-secret-file": ("cluster_secret_file", None),
}

#: The quiet pair's defaults (``--quiet-ms``, ``--quiet-steal``): a hop run's p99 in ms, seconds stolen in a run.
QUIET_MS = 0.3
QUIET_STEAL = 0.05

#: What each kind of run adds to ``pubsubclub bench`` (shown in its progress line).
SCENARIO_FLAG = {"nodes": "", "floor": " --scenario floor", "host": " --scenario hop"}

#: Runs a child: (argv, timeout) -> (exit status, or None when it timed out; its stdout; its stderr).
Runner = Callable[[list[str], float], tuple["int | None", str, str]]


def check_tail_args(args: argparse.Namespace) -> None:
    """SystemExit for settings the bar's runs cannot take, before anything starts."""
    given = [flag for flag, (dest, default) in REFUSED.items() if getattr(args, dest, default) != default]
    if args.client != "lean" and getattr(args, "transport", "websocket") != "websocket":
        given.insert(0, "--transport")  # the lean clients may run over RawSocket (then with no floor)
    if getattr(args, "nodes", None) not in (None, 2):
        given.insert(0, "--nodes")
    if given:
        raise SystemExit(
            f"pubsubclub: error: --scenario tail runs the default bench (JSON over WebSocket, two local nodes of one"
            f" worker) and --scenario floor: {', '.join(given)} does not apply (it takes --client, --runs,"
            " --no-floor, --no-host-probe, --bar-ms, --quiet-ms, --quiet-steal, --size, --rate, --latency-count,"
            " --count, --max-seconds, --realm, and --transport rawsocket with --client lean)"
        )
    if not 1 <= args.runs <= MAX_RUNS:
        raise SystemExit(f"pubsubclub: error: --runs takes 1 to {MAX_RUNS} here")
    if not args.bar_ms > 0 or not args.quiet_ms > 0 or not args.quiet_steal >= 0:
        raise SystemExit("pubsubclub: error: --bar-ms and --quiet-ms must be above 0, --quiet-steal at least 0")
    if args.rate < 1 or args.latency_count < 1 or args.count < 1 or args.size < 0 or not args.max_seconds > 0:
        raise SystemExit(
            "pubsubclub: error: --rate, --latency-count and --count must be at least 1, --size at least 0,"
            " --max-seconds above 0"
        )


def child_argv(args: argparse.Namespace, kind: str) -> list[str]:
    """The ``pubsubclub bench`` command of one run: ``kind`` "nodes" (the default bench), "floor" or "host"."""
    if kind == "host":
        paced = ["--rate", str(args.rate), "--latency-count", str(args.latency_count)]
        return [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "hop", *paced, "--max-seconds",
                f"{args.max_seconds:g}", "--json"]  # fmt: skip
    common = ["--size", str(args.size), "--rate", str(args.rate), "--latency-count", str(args.latency_count),
              "--max-seconds", f"{args.max_seconds:g}", "--realm", args.realm, "--json"]  # fmt: skip
    clients = ["--client", args.client]
    if kind == "floor":
        return [sys.executable, "-m", "pubsubclub", "bench", "--scenario", "floor", *clients, *common]
    wire = ["--transport", args.transport] if args.client == "lean" else []
    return [sys.executable, "-m", "pubsubclub", "bench", "--count", str(args.count), *clients, *wire, *common]


def child_timeout(args: argparse.Namespace) -> float:
    """Seconds one child run may take: its two runs' own bounds (``--max-seconds`` + 30 each) and 120 for the rest.

    A child normally ends within its own bounds and reports why; this one is for a child that hangs.
    """
    return 2 * (args.max_seconds + 30) + 120


def run_child(argv: list[str], timeout: float, grace: float = STOP_GRACE) -> tuple[int | None, str, str]:
    """Run ``argv`` in its own process group; (exit status or None on timeout, stdout, stderr).

    The child's stderr (its progress) is passed on as it comes, indented.
    Whatever ends the wait (the child's exit, the timeout, the bench's SIGTERM
    or Ctrl-C, an exception), the group is then emptied before this returns or
    raises: after a timeout or an exception SIGTERM and ``grace`` seconds for
    the child to unwind (its nodes' own stop), then SIGKILL to whatever is left.
    The child (the group's leader) is reaped only after that SIGKILL, so the
    group's id cannot have been reused by then.
    """
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(target=_pass_on, args=(proc.stderr, lines), daemon=True)
        ended = False
        try:
            progress(f"  child pid {proc.pid}")
            reader.start()
            ended = _exited(proc.pid, timeout)
        finally:
            try:
                if not ended:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
                    _exited(proc.pid, grace)
            finally:  # even when a second Ctrl-C or SIGTERM cuts the grace short
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            if reader.is_alive():
                reader.join(10)  # its pipe closes with the group; a process outside it would only keep the thread
        out.seek(0)
        return (proc.returncode if ended else None), out.read(), "".join(lines)


def _exited(pid: int, seconds: float) -> bool:
    """Whether child ``pid`` exits within ``seconds``; it is left unreaped (a zombie) for its group's SIGKILL."""
    deadline = time.monotonic() + seconds
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _pass_on(stream: Any, lines: list[str]) -> None:
    """Keep a child's stderr lines and show each as a progress line of its own run."""
    for line in stream:
        lines.append(line)
        progress(f"  {line.rstrip().removeprefix('bench: ')}")


def run_record(kind: str, pair: int, position: int, result: dict[str, Any]) -> dict[str, Any]:
    """One run's figures from its child's JSON results (``kind`` "nodes", "floor" or "host")."""
    lat = result["latency"]
    lm = lat.get("latency_ms") or {}
    record: dict[str, Any] = {
        "kind": kind,
        "pair": pair,
        "position": position,
        "p50": lm.get("p50"),
        "p99": lm.get("p99"),
        "p999": lm.get("p999"),
        "max": lm.get("max"),
        "sent": lat["sent"],
        "received": lat["received"],
        "lost": lat["lost"],
        "server_cpu_us_per_msg": lat.get("server_cpu_us_per_msg"),
        "slowest_positions": lat.get("slowest_positions"),
        "load_average": result.get("machine", {}).get("load_average"),
        # The host's own say on how quiet it was: CPU time it took from this machine during the latency run.
        "steal_seconds": lat.get("steal_seconds"),
    }
    if kind == "nodes":
        t = result["throughput"]
        record["throughput_lost"] = t["lost"]
        record["throughput"] = {key: t.get(key) for key in ("sent", "received", "delivered_rate",
                                                             "server_cpu_us_per_msg")}  # fmt: skip
    return record


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _side(runs: list[dict[str, Any]], bar_ms: float) -> dict[str, Any]:
    """One side's verdict: runs over the bar (or without a p99), runs that lost a message, medians, steal per run."""
    over = [r["pair"] for r in runs if r["p99"] is None or r["p99"] > bar_ms]
    lost = [r["pair"] for r in runs if r["lost"] or r.get("throughput_lost")]
    met_runs = sum(1 for r in runs if r["pair"] not in over and r["pair"] not in lost)
    return {
        "runs": len(runs),
        "met_runs": met_runs,
        "met": bool(runs) and met_runs == len(runs),
        "over_bar": over,
        "lost": lost,
        "median_ms": {key: _median([r[key] for r in runs]) for key in ("p50", "p99", "p999", "max")},
        "median_server_cpu_us_per_msg": _median([r["server_cpu_us_per_msg"] for r in runs]),
        "steal_seconds": [r.get("steal_seconds") for r in runs],
    }


def verdict(
    runs: list[dict[str, Any]], bar_ms: float, quiet_ms: float = QUIET_MS, quiet_steal: float = QUIET_STEAL
) -> dict[str, Any]:
    """The bar's verdict from the run records (:func:`run_record`): per side, and the nodes' p99 over the floor's.

    A run meets the bar when its p99 is at or under ``bar_ms`` and it lost no
    message (in the latency run, nor in the nodes' throughput run); a side meets
    it when every run does. Without floor runs the floor's fields are None;
    without host runs the host's.
    """
    nodes = [r for r in runs if r["kind"] == "nodes"]
    floor = [r for r in runs if r["kind"] == "floor"]
    host = [r for r in runs if r["kind"] == "host"]
    paired: list[float | None] | None = None
    if floor:
        floor_p99 = {r["pair"]: r["p99"] for r in floor}
        paired = []
        for r in nodes:
            other = floor_p99.get(r["pair"])
            paired.append(None if r["p99"] is None or other is None else r["p99"] - other)
    return {
        "bar_ms": bar_ms,
        "nodes": _side(nodes, bar_ms),
        "floor": _side(floor, bar_ms) if floor else None,
        "paired_p99_ms": paired,
        "median_paired_p99_ms": _median(paired) if paired is not None else None,
        "host": _host(host, nodes, runs, bar_ms, quiet_ms, quiet_steal) if host else None,
    }


def _host(
    host: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    runs: list[dict[str, Any]],
    bar_ms: float,
    quiet_ms: float,
    quiet_steal: float,
) -> dict[str, Any]:
    """How quiet the host was: each hop run's p99, the quiet pairs, and how the nodes did in those.

    ``host`` and ``nodes`` are the hop and nodes runs of ``runs`` (every run, for the steal).

    Hop run ``k`` opens pair ``k``, and the hop run after the last pair has
    ``pair`` = runs + 1, so pair ``k``'s runs lie between hop runs ``k`` and
    ``k + 1``. A hop run is calm when its p99 is at or under ``quiet_ms`` and
    it lost nothing. A pair is quiet when the hop runs on both sides of it are
    calm (the one before alone when there is none after) and the host stole
    at most ``quiet_steal`` seconds of CPU during each of the pair's floor and
    nodes latency runs (a run whose steal is unknown is not held against it). The
    host's noise comes in bursts of seconds: a probe before the runs alone
    missed a burst that began during them, and the steal during a run is the
    host's own account of it (docs/benchmarks.md). The nodes' runs of the
    quiet pairs are judged as :func:`_side` judges them.
    """
    calm = {r["pair"]: r["p99"] is not None and r["p99"] <= quiet_ms and not r["lost"] for r in host}
    stolen = {r["pair"] for r in runs if r["kind"] != "host" and (r.get("steal_seconds") or 0) > quiet_steal}
    quiet = [
        r["pair"]
        for r in nodes
        if calm.get(r["pair"], False) and calm.get(r["pair"] + 1, True) and r["pair"] not in stolen
    ]
    on_quiet = _side([r for r in nodes if r["pair"] in quiet], bar_ms)
    return {
        "quiet_ms": quiet_ms,
        "quiet_steal_seconds": quiet_steal,
        "stolen_pairs": sorted(stolen),
        "p99_ms": [r["p99"] for r in host],
        "median_ms": {key: _median([r[key] for r in host]) for key in ("p50", "p99", "p999", "max")},
        "quiet_pairs": quiet,
        "nodes_on_quiet_pairs": {key: on_quiet[key] for key in ("runs", "met_runs", "over_bar", "lost")},
    }


def run_tail_bench(args: argparse.Namespace, runner: Runner = run_child) -> int:
    """Run the pairs (host, floor, nodes, ...; a last host run) one after the other, print the runs and the verdict."""
    check_tail_args(args)
    # The floor's relays speak WebSocket: lean clients over RawSocket have no floor to pair with.
    raw_lean = args.transport == "rawsocket"
    with_floor = not args.no_floor and not raw_lean
    with_host = not args.no_host_probe
    kinds = ["host"] * with_host + ["floor"] * with_floor + ["nodes"]
    total = args.runs * len(kinds) + with_host  # and a hop run after the last pair
    timeout = child_timeout(args)
    progress(
        f"settings: --scenario tail --runs {args.runs} --bar-ms {args.bar_ms:g}{' --no-floor' if args.no_floor else ''}"
        f"{' --no-host-probe' if args.no_host_probe else ''} --quiet-ms {args.quiet_ms:g} --quiet-steal"
        f" {args.quiet_steal:g}"
        f" --count {args.count} --size {args.size} --rate {args.rate} --latency-count {args.latency_count}"
        f" --max-seconds {args.max_seconds:g} --realm {args.realm} --client {args.client} --transport"
        f" {args.transport} (defaults: 10, 1, floor on, host probe on, 0.3, 0.05, 50000, 100, 1000, 5000, 60,"
        f" realm1, autobahn, websocket{'; over RawSocket: no floor runs' if raw_lean else ''}); {total} child runs"
        f" ({' then '.join(kinds)}, x {args.runs}{', then host' if with_host else ''}), each bounded by {timeout:g} s"
    )
    before = machine()
    runs: list[dict[str, Any]] = []
    schedule = [(pair, kind) for pair in range(1, args.runs + 1) for kind in kinds]
    for pair, kind in schedule + [(args.runs + 1, "host")] * with_host:
        position = len(runs) + 1
        of = f"pair {pair} of {args.runs}" if pair <= args.runs else f"after pair {args.runs}"
        name = f"run {position} of {total} ({kind}, {of})"
        progress(f"{name}: pubsubclub bench{SCENARIO_FLAG[kind]}")
        status, out, err = runner(child_argv(args, kind), timeout)
        record = _parse(name, status, out, err, timeout, kind, pair, position)
        runs.append(record)
        progress(f"{name}: {_figures(record)}")
    results = {
        "machine": before,
        "load_average_after": machine()["load_average"],
        "scenario": "tail",
        "runs": args.runs,
        "floor": with_floor,
        "client": args.client,
        "order": kinds,
        "size": args.size,
        "rate": args.rate,
        "latency_count": args.latency_count,
        "count": args.count,
        "serializer": "json",
        "transport": args.transport,
        "nodes_runs": [r for r in runs if r["kind"] == "nodes"],
        "floor_runs": [r for r in runs if r["kind"] == "floor"] if with_floor else None,
        "host_runs": [r for r in runs if r["kind"] == "host"] if with_host else None,
        "verdict": verdict(runs, args.bar_ms, args.quiet_ms, args.quiet_steal),
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(human(results))
    return 0


def _parse(
    name: str, status: int | None, out: str, err: str, timeout: float, kind: str, pair: int, position: int
) -> dict[str, Any]:
    """The run's record; SystemExit naming the run when it failed, timed out or printed no results."""
    why = ""
    if status is None:
        why = f"did not end within {timeout:g} s (stopped with everything it started)"
    elif status != 0:
        why = f"exited with status {status}"
    else:
        try:
            return run_record(kind, pair, position, json.loads(out))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            why = f"printed no usable results ({type(e).__name__}: {e})"
    lines = err.strip().splitlines()[-ERROR_LINES:]
    shown = "; its last lines on stderr:\n  " + "\n  ".join(lines) if lines else " (nothing on stderr)"
    raise SystemExit(f"pubsubclub: error: bench --scenario tail: {name} {why}{shown}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _figures(r: dict[str, Any]) -> str:
    cpu = r["server_cpu_us_per_msg"]
    return (
        f"p50 {_ms(r['p50'])}, p99 {_ms(r['p99'])}, p99.9 {_ms(r['p999'])}, max {_ms(r['max'])} ms, lost {r['lost']}"
        + (f" (throughput run {r['throughput_lost']})" if "throughput_lost" in r else "")
        + f"; servers' CPU {'-' if cpu is None else f'{cpu:.1f}'} us/msg"
        + (f"; steal {r['steal_seconds']:.2f} s" if r.get("steal_seconds") is not None else "")
    )


def _side_text(what: str, side: dict[str, Any], bar_ms: float) -> str:
    m = side["median_ms"]
    over = ", ".join(map(str, side["over_bar"])) or "none"
    lost = ", ".join(map(str, side["lost"])) or "none"
    return (
        f"{what}: bar {'MET' if side['met'] else 'NOT MET'}: p99 <= {bar_ms:g} ms with no message lost in"
        f" {side['met_runs']} of {side['runs']} runs (over the bar: pairs {over}; lost messages: pairs {lost});"
        f" medians p50 {_ms(m['p50'])}, p99 {_ms(m['p99'])}, p99.9 {_ms(m['p999'])}, max {_ms(m['max'])} ms"
    )


def human(results: dict[str, Any]) -> str:
    """The results as text: one line per run, then the verdict."""
    v = results["verdict"]
    lines = [
        f"tail: {results['runs']} pairs of runs ({', '.join(results['order'])}; {results['client']} clients)"
        f" at {results['rate']}/s,"
        f" {results['latency_count']} messages each; bar: p99 <= {v['bar_ms']:g} ms, no message lost",
    ]
    every = results["nodes_runs"] + (results["floor_runs"] or []) + (results.get("host_runs") or [])
    for r in sorted(every, key=lambda r: r["position"]):
        pair = f"pair {r['pair']:>3}" if r["pair"] <= results["runs"] else f"after {results['runs']:>2}"
        lines.append(f"  {pair} {r['kind']:<5}: {_figures(r)}")
    lines.append(_side_text("nodes", v["nodes"], v["bar_ms"]))
    if v["floor"] is not None:
        lines.append(_side_text("floor", v["floor"], v["bar_ms"]))
        each = ", ".join("-" if d is None else f"{d:+.3f}" for d in v["paired_p99_ms"])
        median = v["median_paired_p99_ms"]
        shown = "-" if median is None else f"{median:+.3f}"
        lines.append(f"nodes' p99 minus the floor's, per pair: {each} ms; median {shown} ms")
    host = v.get("host")
    if host is not None:
        quiet = host["nodes_on_quiet_pairs"]
        pairs = ", ".join(map(str, host["quiet_pairs"])) or "none"
        lines.append(
            f"host: one hop's p99 in each hop run (before each pair, and after the last)"
            f" {', '.join(_ms(p) for p in host['p99_ms'])} ms (median {_ms(host['median_ms']['p99'])}); quiet pairs"
            f" (p99 <= {host['quiet_ms']:g} ms before and after, steal <= {host['quiet_steal_seconds']:g} s in"
            f" the pair's runs): {pairs}; nodes at or under the bar in"
            f" {quiet['met_runs']} of those {quiet['runs']}; the host stole more in pairs"
            f" {', '.join(map(str, host['stolen_pairs'])) or 'none'}"
        )
    return "\n".join(lines)
