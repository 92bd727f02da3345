"""``pubsubclub bench --scenario peers`` (``make bench-peers``): the same WAMP runs against Crossbar.io.

For each client (Autobahn JSON over WebSocket, Autobahn MessagePack over
RawSocket, the lean RawSocket clients) and each topology, the runs of
:func:`pubsubclub.bench.wamp.measure` go against:

* **single**: one pubsubclub node / one Crossbar router, publisher and
  subscriber on it;
* **pair**: two pubsubclub nodes linked by PSC / two Crossbar routers joined
  by rlinks (router-to-router links), publisher on A, subscriber on B.

Crossbar comes from its own virtualenv (``make crossbar``) and is started by
:mod:`pubsubclub.testing.crossbar` with a generated ``config.json``. For the
pair, each router gets a node key made beforehand with Crossbar's own key
code, an ``rlink`` role, a cryptosign principal holding the *other* router's
public key (an rlink's remote leg authenticates with the node key), and an
rlink to the other router that forwards local events only (so nothing loops).
A router's CPU is its whole process tree (controller and router worker).

Each cell is the median of ``--runs`` runs; the table gives pubsubclub /
Crossbar for every figure (above 1 is better for msgs/s, below 1 for CPU
and p99).
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pubsubclub.bench.nodes import free_port, local, machine, node_pair, progress, start_node, stop
from pubsubclub.bench.wamp import Target, check_wamp_args, measure

#: The clients compared, as ``pubsubclub bench`` settings.
CLIENTS: dict[str, dict[str, str]] = {
    "autobahn-json-ws": {"client": "autobahn", "serializer": "json", "transport": "websocket"},
    "autobahn-msgpack-rs": {"client": "autobahn", "serializer": "msgpack", "transport": "rawsocket"},
    "lean": {"client": "lean", "serializer": "json", "transport": "rawsocket"},
}
TOPOLOGIES = ("single", "pair")
RLINK_ROLE = "rlink"


# -- pubsubclub --------------------------------------------------------------------


def _pubsubclub(topology: str) -> tuple[Target, Callable[[], None]]:
    if topology == "single":
        proc, ready = start_node("bench-single", ["--wamp", local(free_port()), "--psc", local(free_port()),
                                                  "--rawsocket", local(free_port())])  # fmt: skip
        target = Target(ws=(ready["wamp"],) * 2, rs=(ready["rawsocket"],) * 2, pids=(proc.pid,))
        return target, lambda: stop([proc])
    (pa, ra), (pb, rb) = node_pair(("--rawsocket", "tcp:0:interface=127.0.0.1"))
    target = Target(ws=(ra["wamp"], rb["wamp"]), rs=(ra["rawsocket"], rb["rawsocket"]), pids=(pa.pid, pb.pid))
    return target, lambda: stop([pa, pb])


# -- Crossbar ----------------------------------------------------------------------


def _node_public_key(node_dir: Path) -> str:
    """Make the router's node key in ``node_dir/.crossbar`` with Crossbar's own code; its public key (hex)."""
    from pubsubclub.testing.crossbar import crossbar_executable

    cbdir = node_dir / ".crossbar"
    cbdir.mkdir(parents=True, exist_ok=True)
    python = crossbar_executable().parent / "python"
    subprocess.run(
        [str(python), "-c", "import sys; from crossbar.common.key import _maybe_generate_node_key as g; g(sys.argv[1])",
         str(cbdir)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    for line in (cbdir / "key.pub").read_text().splitlines():
        if line.startswith("public-key-ed25519:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError(f"no public key in {cbdir / 'key.pub'}")


def _with_rlink(config: dict[str, Any], peer_key: str, peer_port: int) -> dict[str, Any]:
    """``config`` (one router) plus an rlink to the router on ``peer_port`` whose node key is ``peer_key``."""
    from pubsubclub.testing.crossbar import permission, role

    config = copy.deepcopy(config)
    worker = config["workers"][0]
    cryptosign = {"type": "static", "principals": {
        "peer-router": {"realm": "realm1", "role": RLINK_ROLE, "authorized_keys": [peer_key]}}}  # fmt: skip
    for transport in worker["transports"]:
        auth = transport["paths"]["ws"]["auth"] if transport["type"] == "web" else transport["auth"]
        auth["cryptosign"] = cryptosign
    for realm in worker["realms"]:
        realm["roles"].append(role(RLINK_ROLE, [permission(disclose_publisher=True)]))
        realm["rlinks"] = [{
            "id": "to-peer",
            "realm": realm["name"],
            "transport": {"type": "websocket", "endpoint": {"type": "tcp", "host": "127.0.0.1", "port": peer_port},
                          "url": f"ws://127.0.0.1:{peer_port}/ws", "serializers": ["json"]},
            # Each router forwards what its own clients publish; remote events stay put (no loops).
            "forward_local_events": True,
            "forward_remote_events": False,
            "forward_local_invocations": False,
            "forward_remote_invocations": False,
        }]  # fmt: skip
    return config


def _crossbar(topology: str, workdir: Path) -> tuple[Target, Callable[[], None]]:
    from pubsubclub.testing.crossbar import CrossbarProcess, router_config

    names = ["single"] if topology == "single" else ["a", "b"]
    ports = {name: (free_port(), free_port()) for name in names}
    # An rlink re-publishes an event only when it knows the publisher: disclosure on (for the pair).
    configs = {name: router_config(ws, rawsocket_port=rs, disclose_publisher=topology == "pair")
               for name, (ws, rs) in ports.items()}  # fmt: skip
    if topology == "pair":
        keys = {name: _node_public_key(workdir / f"crossbar-{name}") for name in names}
        for name, peer in (("a", "b"), ("b", "a")):
            configs[name] = _with_rlink(configs[name], keys[peer], ports[peer][0])
    routers: list[CrossbarProcess] = []
    try:
        for name in names:
            router = CrossbarProcess(workdir / f"crossbar-{name}", ports[name][0], configs[name], f"crossbar-{name}")
            progress(f"starting Crossbar router {name} (ws {ports[name][0]}, rawsocket {ports[name][1]})")
            routers.append(router.start())
    except BaseException:
        for router in routers:
            router.stop()
        raise
    ws = [f"ws://127.0.0.1:{ports[n][0]}/ws" for n in names]
    rs = [f"rs://127.0.0.1:{ports[n][1]}" for n in names]
    pids = tuple(r.proc.pid for r in routers if r.proc is not None)
    target = Target(ws=(ws[0], ws[-1]), rs=(rs[0], rs[-1]), pids=pids)

    def stop_routers() -> None:
        for router in routers:
            router.stop()

    return target, stop_routers


# -- the table ---------------------------------------------------------------------


def _cell(args: argparse.Namespace, client: str, target: Target) -> dict[str, Any]:
    """Median figures of ``--runs`` runs of ``client`` against ``target``."""
    runs = []
    for _ in range(args.runs):
        run_args = argparse.Namespace(**{**vars(args), **CLIENTS[client]})
        throughput, latency = measure(run_args, target)
        if throughput["lost"]:
            raise RuntimeError(f"{client}: {throughput['lost']} messages lost")
        p99 = latency["latency_ms"]["p99"] if latency and latency["latency_ms"] else None
        runs.append((throughput["delivered_rate"], throughput["server_cpu_us_per_msg"], p99))
    return {
        "msgs_per_s": statistics.median(r[0] for r in runs),
        "server_cpu_us_per_msg": statistics.median(r[1] for r in runs),
        "p99_ms": statistics.median(r[2] for r in runs if r[2] is not None) if runs[0][2] is not None else None,
        "runs": len(runs),
        # Every run's figures, for the noise (the table shows the medians).
        "each": [{"msgs_per_s": r[0], "server_cpu_us_per_msg": r[1], "p99_ms": r[2]} for r in runs],
    }


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if ours is None or not theirs else ours / theirs


def run_peers_bench(args: argparse.Namespace) -> int:
    """Every client x topology against pubsubclub and Crossbar; one table of ratios."""
    clients = args.clients.split(",") if args.clients else list(CLIENTS)
    topologies = TOPOLOGIES if args.topology == "both" else (args.topology,)
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or args.runs < 1:
        raise SystemExit(f"pubsubclub: error: --clients takes {', '.join(CLIENTS)}; --runs at least 1")
    check_wamp_args(argparse.Namespace(**{**vars(args), **CLIENTS["lean"]}))
    from pubsubclub.testing.crossbar import CrossbarMissing, crossbar_executable

    try:
        crossbar_executable()  # a clear error now rather than after the pubsubclub runs
    except CrossbarMissing as e:
        raise SystemExit(f"pubsubclub: error: {e}") from None
    progress(f"settings: --scenario peers --clients {','.join(clients)} --topology {args.topology} --runs "
             f"{args.runs} --count {args.count} --latency-count {args.latency_count} --rate {args.rate} --size "
             f"{args.size}")  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="pubsubclub-bench-peers-"))
    rows: list[dict[str, Any]] = []
    try:
        for topology in topologies:
            cells: dict[str, dict[str, Any]] = {}
            for system in ("pubsubclub", "crossbar"):
                progress(f"{system}, {topology}")
                if system == "pubsubclub":
                    target, stop_system = _pubsubclub(topology)
                else:
                    target, stop_system = _crossbar(topology, workdir)
                try:
                    for client in clients:
                        progress(f"{system}, {topology}: {client}")
                        cells[f"{system}/{client}"] = _cell(args, client, target)
                finally:
                    stop_system()
            for client in clients:
                ours, theirs = cells[f"pubsubclub/{client}"], cells[f"crossbar/{client}"]
                rows.append({
                    "client": client, "topology": topology, "pubsubclub": ours, "crossbar": theirs,
                    "ratio": {key: _ratio(ours[key], theirs[key]) for key in ("msgs_per_s", "server_cpu_us_per_msg",
                                                                              "p99_ms")},
                })  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = {"machine": machine(), "scenario": "peers", "runs": args.runs, "count": args.count, "rows": rows}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(_table(rows))
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table (pubsubclub / Crossbar per figure)."""

    def num(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    lines = [
        "| client | topology | msgs/s pubsubclub | msgs/s Crossbar | ratio | CPU us/msg pubsubclub | CPU us/msg "
        "Crossbar | ratio | p99 ms pubsubclub | p99 ms Crossbar | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ours, theirs, ratio = r["pubsubclub"], r["crossbar"], r["ratio"]
        lines.append(
            f"| {r['client']} | {r['topology']} | {num(ours['msgs_per_s'])} | {num(theirs['msgs_per_s'])} | "
            f"{num(ratio['msgs_per_s'], 2)} | {num(ours['server_cpu_us_per_msg'], 1)} | "
            f"{num(theirs['server_cpu_us_per_msg'], 1)} | {num(ratio['server_cpu_us_per_msg'], 2)} | "
            f"{num(ours['p99_ms'], 2)} | {num(theirs['p99_ms'], 2)} | {num(ratio['p99_ms'], 2)} |"
        )
    return "\n".join(lines)
