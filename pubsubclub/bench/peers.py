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

More row groups (``--rows``, default all) run on the same servers:

* **calls** (on the pair): cross-node RPC, :mod:`pubsubclub.bench.calls`'s
  caller on A and callee on B, with Autobahn-Python and with the lean
  WebSocket clients; the routers' rlinks also forward their own clients'
  registrations (``forward_local_invocations``) and every role discloses
  callers (an rlink refuses to forward a call from an unknown caller);
* **idle** and **fanout** (on the single server): memory per idle subscribed
  session (:mod:`pubsubclub.bench.idle`) and fan-out 1 -> ``--subscribers``
  (:mod:`pubsubclub.bench.fanout`).

The routers run with ``--loglevel warn`` (the nodes log warnings only; an
rlink logs two info lines per forwarded call) and without WebSocket
auto-ping (the idle and fan-out clients never answer pings; the nodes get
the same flags as the idle scenario's).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pubsubclub.bench.calls import DEFAULT_WINDOW, measure_calls
from pubsubclub.bench.fanout import measure_fanout
from pubsubclub.bench.idle import idle_node_flags, measure_idle
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
#: The row groups of the table (``--rows``): pub/sub runs, cross-node calls, idle sessions, fan-out.
ROW_GROUPS = ("events", "calls", "idle", "fanout")
#: Messages of the fan-out row unless ``--fanout-messages`` says otherwise.
PEERS_FANOUT_MESSAGES = 500
#: The call clients compared (``pubsubclub.bench.calls``), both JSON over WebSocket.
CALL_CLIENTS = {"autobahn-json-ws": "autobahn", "lean-json-ws": "lean"}


# -- pubsubclub --------------------------------------------------------------------


def _pubsubclub(topology: str, sessions: int = 0) -> tuple[Target, Callable[[], None]]:
    if topology == "single":
        # Caps raised for the idle and fan-out rows' sessions from one address (as their scenarios do).
        extra = idle_node_flags(sessions) if sessions else []
        proc, ready = start_node("bench-single", ["--wamp", local(free_port()), "--psc", local(free_port()),
                                                  "--rawsocket", local(free_port()), *extra])  # fmt: skip
        target = Target(ws=(ready["wamp"],) * 2, rs=(ready["rawsocket"],) * 2, pids=(proc.pid,))
        return target, lambda: stop([proc])
    (pa, ra), (pb, rb) = node_pair(("--rawsocket", "tcp:0:interface=127.0.0.1"))
    target = Target(ws=(ra["wamp"], rb["wamp"]), rs=(ra["rawsocket"], rb["rawsocket"]), pids=(pa.pid, pb.pid))
    return target, lambda: stop([pa, pb])


# -- Crossbar ----------------------------------------------------------------------


def _node_public_keys(node_dirs: list[Path]) -> list[str]:
    """Make each router's node key in ``<dir>/.crossbar`` with Crossbar's own code; their public keys (hex).

    One Python process makes every key (a start of Crossbar's Python is a second or two of imports).
    """
    from pubsubclub.testing.crossbar import crossbar_executable

    cbdirs = [node_dir / ".crossbar" for node_dir in node_dirs]
    for cbdir in cbdirs:
        cbdir.mkdir(parents=True, exist_ok=True)
    python = crossbar_executable().parent / "python"
    subprocess.run(
        [str(python), "-c",
         "import sys; from crossbar.common.key import _maybe_generate_node_key as g; [g(d) for d in sys.argv[1:]]",
         *map(str, cbdirs)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    keys = []
    for cbdir in cbdirs:
        for line in (cbdir / "key.pub").read_text().splitlines():
            if line.startswith("public-key-ed25519:"):
                keys.append(line.split(":", 1)[1].strip())
                break
        else:
            raise RuntimeError(f"no public key in {cbdir / 'key.pub'}")
    return keys


def _with_rlink(config: dict[str, Any], peer_key: str, peer_port: int, calls: bool = False) -> dict[str, Any]:
    """``config`` (one router) plus an rlink to the router on ``peer_port`` whose node key is ``peer_key``.

    With ``calls`` the rlink forwards the router's own registrations too (and
    every role discloses its callers: an rlink refuses to forward a call whose
    caller it does not know).
    """
    from pubsubclub.testing.crossbar import permission, role

    config = copy.deepcopy(config)
    worker = config["workers"][0]
    if calls:
        for realm in worker["realms"]:
            for r in realm["roles"]:
                for p in r["permissions"]:
                    p["disclose"]["caller"] = True
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
            # Each router registers its own clients' procedures on the other (calls cross once); the
            # other router's forwarding registrations are not sent back (forward_remote_invocations).
            "forward_local_invocations": calls,
            "forward_remote_invocations": False,
        }]  # fmt: skip
    return config


def _without_pings(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the WebSocket auto-ping off: the idle and fan-out clients never answer pings."""
    config = copy.deepcopy(config)
    for transport in config["workers"][0]["transports"]:
        if transport["type"] == "web":
            transport["paths"]["ws"].pop("options", None)
    return config


def _crossbar(topology: str, workdir: Path) -> tuple[Target, Callable[[], None]]:
    """One router or two joined by rlinks (events and registrations), WebSocket auto-ping off, warnings only."""
    from pubsubclub.testing.crossbar import CrossbarProcess, router_config

    names = ["single"] if topology == "single" else ["a", "b"]
    ports = {name: (free_port(), free_port()) for name in names}
    # An rlink re-publishes an event only when it knows the publisher: disclosure on (for the pair).
    configs = {name: router_config(ws, rawsocket_port=rs, disclose_publisher=topology == "pair")
               for name, (ws, rs) in ports.items()}  # fmt: skip
    # The idle and fan-out clients never answer pings (the nodes' idle deadline is off for them likewise).
    configs = {name: _without_pings(config) for name, config in configs.items()}
    if topology == "pair":
        keys = dict(zip(names, _node_public_keys([workdir / f"crossbar-{name}" for name in names]), strict=True))
        for name, peer in (("a", "b"), ("b", "a")):
            configs[name] = _with_rlink(configs[name], keys[peer], ports[peer][0], calls=True)
    # Warnings only, as the nodes: an rlink logs two info lines per call it forwards.
    routers = [CrossbarProcess(workdir / f"crossbar-{name}", ports[name][0], configs[name], f"crossbar-{name}",
                               loglevel="warn") for name in names]  # fmt: skip
    for name in names:
        progress(f"starting Crossbar router {name} (ws {ports[name][0]}, rawsocket {ports[name][1]})")
    # Started side by side (each start-up is seconds of imports); an rlink retries until its peer listens.
    try:
        with ThreadPoolExecutor(len(routers)) as pool:
            for future in [pool.submit(router.start) for router in routers]:
                future.result()
    except BaseException:
        for router in routers:
            router.stop()
        raise
    ws = [f"ws://127.0.0.1:{ports[n][0]}/ws" for n in names]
    rs = [f"rs://127.0.0.1:{ports[n][1]}" for n in names]
    pids = tuple(r.proc.pid for r in routers if r.proc is not None)
    target = Target(ws=(ws[0], ws[-1]), rs=(rs[0], rs[-1]), pids=pids)

    def stop_routers() -> None:
        with ThreadPoolExecutor(len(routers)) as pool:
            for future in [pool.submit(router.stop) for router in routers]:
                future.result()

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


def _medians(samples: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """The median of each of ``keys`` over ``samples``, with every sample kept (the noise)."""
    cell: dict[str, Any] = {key: statistics.median(s[key] for s in samples) for key in keys}
    cell.update(runs=len(samples), each=samples)
    return cell


def _rows(
    cells: dict[str, dict[str, Any]], group: str, clients: list[str], keys: tuple[str, ...]
) -> list[dict[str, Any]]:
    rows = []
    for client in clients:
        ours, theirs = cells[f"pubsubclub/{group}/{client}"], cells[f"crossbar/{group}/{client}"]
        rows.append({"group": group, "client": client, "pubsubclub": ours, "crossbar": theirs,
                     "ratio": {key: _ratio(ours[key], theirs[key]) for key in keys}})  # fmt: skip
    return rows


CALL_KEYS = ("calls_per_s", "server_cpu_us_per_call", "p50_ms", "p99_ms")


def _call_cells(args: argparse.Namespace, system: str, target: Target) -> dict[str, dict[str, Any]]:
    """Cross-node calls on a pair: caller on A, callee on B, each call client."""
    cells = {}
    for client, kind in CALL_CLIENTS.items():
        progress(f"{system}, calls: {client}")
        run_args = argparse.Namespace(
            **{**vars(args), "client": kind, "window": DEFAULT_WINDOW, "count": args.calls or args.count}
        )
        samples = [measure_calls(run_args, target.ws[0], target.ws[1], list(target.pids)) for _ in range(args.runs)]
        cells[f"{system}/calls/{client}"] = _medians(samples, CALL_KEYS)
    return cells


def _single_cells(
    args: argparse.Namespace, system: str, target: Target, groups: list[str]
) -> dict[str, dict[str, Any]]:
    """Idle subscribed sessions and fan-out 1 -> N on one server."""
    cells = {}
    port, pids = int(target.ws[0].rsplit(":", 1)[1].split("/", 1)[0]), list(target.pids)
    for group in [g for g in ("idle", "fanout") if g in groups]:
        progress(f"{system}, {group}")
        samples = []
        for _ in range(args.runs):
            if group == "idle":
                samples.append(measure_idle(port, pids, args.sessions, args.max_seconds))
                continue
            figures = measure_fanout([port], None, args.subscribers or 1000, args.fanout_messages, args.size,
                                     args.max_seconds)  # fmt: skip
            if figures["lost"]:
                raise RuntimeError(f"{system} fan-out: {figures['lost']} deliveries lost")
            samples.append(figures)
        keys = ("bytes_per_session",) if group == "idle" else ("deliveries_per_second",)
        cells[f"{system}/{group}/{group}"] = _medians(samples, keys)
    return cells


def run_peers_bench(args: argparse.Namespace) -> int:
    """Every client x topology against pubsubclub and Crossbar; one table of ratios."""
    clients = args.clients.split(",") if args.clients else list(CLIENTS)
    topologies = TOPOLOGIES if args.topology == "both" else (args.topology,)
    unknown = [c for c in clients if c not in CLIENTS]
    groups = args.rows.split(",")
    if unknown or args.runs < 1 or not set(groups) <= set(ROW_GROUPS):
        raise SystemExit(f"pubsubclub: error: --clients takes {', '.join(CLIENTS)}; --rows takes "
                         f"{', '.join(ROW_GROUPS)}; --runs at least 1")  # fmt: skip
    check_wamp_args(argparse.Namespace(**{**vars(args), **CLIENTS["lean"]}))
    # Fewer than the fanout scenario's 2,000: one Crossbar router takes ~25,000 deliveries/s (docs/benchmarks.md).
    args.fanout_messages = args.fanout_messages or PEERS_FANOUT_MESSAGES
    from pubsubclub.testing.crossbar import CrossbarMissing, crossbar_executable

    try:
        crossbar_executable()  # a clear error now rather than after the pubsubclub runs
    except CrossbarMissing as e:
        raise SystemExit(f"pubsubclub: error: {e}") from None
    progress(f"settings: --scenario peers --rows {args.rows} --clients {','.join(clients)} --topology "
             f"{args.topology} --runs {args.runs} --count {args.count} --latency-count {args.latency_count} --rate "
             f"{args.rate} --size {args.size} --calls {args.calls or args.count} --sessions {args.sessions} "
             f"--subscribers {args.subscribers or 1000} --fanout-messages {args.fanout_messages} --max-seconds "
             f"{args.max_seconds:g}")  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="pubsubclub-bench-peers-"))
    rows: list[dict[str, Any]] = []
    other_rows: list[dict[str, Any]] = []
    # Each server set is started once per system and serves every group that runs on it.
    wanted = [t for t in ("single", "pair") if (t in topologies and "events" in groups) or
              (t == "pair" and "calls" in groups) or (t == "single" and {"idle", "fanout"} & set(groups))]  # fmt: skip
    try:
        for topology in wanted:
            events = "events" in groups and topology in topologies
            cells: dict[str, dict[str, Any]] = {}
            for system in ("pubsubclub", "crossbar"):
                progress(f"{system}, {topology}")
                if system == "pubsubclub":
                    # Room for the idle sessions and the fan-out's together (closes may lag behind opens).
                    target, stop_system = _pubsubclub(topology, args.sessions + (args.subscribers or 1000) + 1)
                else:
                    target, stop_system = _crossbar(topology, workdir)
                try:
                    for client in clients if events else ():
                        progress(f"{system}, {topology}: {client}")
                        cells[f"{system}/{client}"] = _cell(args, client, target)
                    if topology == "pair" and "calls" in groups:
                        cells.update(_call_cells(args, system, target))
                    if topology == "single":
                        cells.update(_single_cells(args, system, target, groups))
                finally:
                    stop_system()
            if topology == "pair" and "calls" in groups:
                other_rows += _rows(cells, "calls", list(CALL_CLIENTS), CALL_KEYS)
            for group, key in (("idle", "bytes_per_session"), ("fanout", "deliveries_per_second")):
                if f"pubsubclub/{group}/{group}" in cells:
                    group_rows = _rows(cells, group, [group], (key,))
                    for row in group_rows:
                        row["client"] = "lean-ws"  # the asyncio WebSocket client of pubsubclub.bench.idle
                    other_rows += group_rows
            for client in clients if events else ():
                ours, theirs = cells[f"pubsubclub/{client}"], cells[f"crossbar/{client}"]
                rows.append({
                    "client": client, "topology": topology, "pubsubclub": ours, "crossbar": theirs,
                    "ratio": {key: _ratio(ours[key], theirs[key]) for key in ("msgs_per_s", "server_cpu_us_per_msg",
                                                                              "p99_ms")},
                })  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = {"machine": machine(), "scenario": "peers", "runs": args.runs, "count": args.count, "rows": rows,
               "other_rows": other_rows}  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print("\n\n".join(t for t in (_table(rows) if rows else "", _other_table(other_rows, args)) if t))
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


#: Per row group: (figure, unit, digits) for each column pair of the second table.
_OTHER_COLUMNS: dict[str, list[tuple[str, str, int]]] = {
    "calls": [("calls_per_s", "calls/s", 0), ("server_cpu_us_per_call", "CPU us/call", 1), ("p50_ms", "p50 ms", 2),
              ("p99_ms", "p99 ms", 2)],
    "idle": [("bytes_per_session", "KiB/session", 1)],
    "fanout": [("deliveries_per_second", "deliveries/s", 0)],
}  # fmt: skip


def _other_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Calls, idle and fan-out rows: one line per figure, pubsubclub / Crossbar."""
    if not rows:
        return ""
    where = {
        "calls": f"pair, caller on A, callee on B; {DEFAULT_WINDOW} in flight, latency at {args.rate}/s",
        "idle": f"single, {args.sessions} subscribed sessions",
        "fanout": f"single, 1 -> {args.subscribers or 1000}, {args.fanout_messages} messages",
    }
    lines = ["| group | client | figure | pubsubclub | Crossbar | ratio |", "|---|---|---|---|---|---|"]
    for r in rows:
        for key, unit, digits in _OTHER_COLUMNS[r["group"]]:
            scale = 1 / 1024 if unit == "KiB/session" else 1
            ours, theirs, ratio = r["pubsubclub"][key] * scale, r["crossbar"][key] * scale, r["ratio"][key]
            lines.append(f"| {r['group']} | {r['client']} | {unit} | {ours:,.{digits}f} | {theirs:,.{digits}f} | "
                         f"{'-' if ratio is None else f'{ratio:.2f}'} |")  # fmt: skip
    lines.append("")
    lines += [f"{group}: {text}" for group, text in where.items() if any(r["group"] == group for r in rows)]
    return "\n".join(lines)
