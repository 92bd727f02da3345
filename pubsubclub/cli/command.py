"""The ``pubsubclub`` command: ``node``, ``bridge``, ``cluster``, ``status``, ``bench`` and ``report``."""

from __future__ import annotations

import argparse
import difflib
import sys

from pubsubclub import __version__
from pubsubclub.cli.cluster import add_cluster_arguments, cluster_layout
from pubsubclub.cli.status import add_arguments as add_status_arguments
from pubsubclub.config import ConfigError, add_flags, add_node_flags, bridge_setting, node_config
from pubsubclub.reports.command import add_arguments as add_report_arguments

EXIT_USAGE = 2


def parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    top = argparse.ArgumentParser(prog="pubsubclub", description="Turn WAMP pub/sub servers into a cluster.")
    top.add_argument("--version", action="version", version=f"pubsubclub {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    node = sub.add_parser("node", help="run one node")
    add_node_flags(node)

    bridge = sub.add_parser(
        "bridge",
        help="run a node whose local side is a WAMP router (e.g. Crossbar.io) it joins as a client (docs/bridge.md)",
    )
    bridge.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file (flags win)")
    add_flags(bridge, include=bridge_setting)

    cluster = sub.add_parser("cluster", help="run N local nodes with static discovery")
    add_cluster_arguments(cluster)

    status = sub.add_parser("status", help="one table of the cluster's nodes and links from the ops listeners (--http)")
    add_status_arguments(status)

    bench = sub.add_parser("bench", help="measure cross-node throughput and latency")
    bench.add_argument(
        "--target", metavar="WS_URL", nargs=2, help="WAMP URLs of nodes A and B (default: start two nodes)"
    )
    bench.add_argument(
        "--target-ops",
        metavar="HTTP_URL",
        help="operations listener of node A (e.g. http://127.0.0.1:8181/): wait there until B's interest arrived",
    )
    bench.add_argument("--realm", default="realm1")
    bench.add_argument(
        "--count", type=int, help="messages in the throughput run (default 50000); pycalls: messages counted (500)"
    )
    bench.add_argument("--size", type=int, default=100, help="payload bytes")
    bench.add_argument("--rate", type=int, default=1000, help="messages/s in the latency run")
    bench.add_argument("--latency-count", type=int, default=5000, help="messages in the latency run")
    bench.add_argument("--max-seconds", type=float, default=60.0, help="time bound of each run")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument(
        "--scenario",
        choices=["wamp", "link", "peers", "stream", "idle", "fanout", "calls", "pycalls", "floor", "hop", "tail"],
        default="wamp",
        help="wamp: cross-node WAMP throughput and latency (default); link: node to node with no WAMP client;"
        " peers: the wamp runs against pubsubclub and Crossbar.io (make bench-peers); stream: durable stream publish"
        " and catch-up; idle: node memory per idle WAMP session;"
        " fanout: one publisher to --subscribers over 3 nodes (--nodes 1: on one node);"
        " calls: cross-node RPC, Autobahn caller on A, callee on B;"
        " pycalls: Python calls per paced message on nodes A and B (counted, not timed);"
        " floor: the wamp latency run through two minimal relays instead of nodes (--nodes 1: one), the clients'"
        " and the machine's own floor;"
        " hop: the host's own latency of one paced loopback TCP hop between two trivial processes (how quiet the"
        " machine is);"
        " tail: issue 22's tail bar in one command: --runs default runs alternating with as many floor runs, each"
        " pair between two hop runs, then the verdict (runs over --bar-ms, medians, the nodes' p99 minus the floor's"
        " per pair, the quiet pairs: hop p99 at most --quiet-ms before and after, at most --quiet-steal seconds"
        " stolen by the host in its runs; --client lean: the lean clients', JSON over WebSocket, with their floor;"
        " --client lean --transport rawsocket: over RawSocket, no floor)",
    )
    bench.add_argument(
        "--client",
        choices=["autobahn", "lean"],
        default="autobahn",
        help="wamp: Autobahn-Python clients (default) or lean orjson client processes, RawSocket unless --transport"
        " websocket (their latency run times the nodes with nearly no client library);"
        " calls: Autobahn-Python (default) or lean orjson/WebSocket caller and callee;"
        " floor, tail: either (lean: JSON over WebSocket unless --transport rawsocket)",
    )
    bench.add_argument(
        "--serializer", choices=["json", "msgpack"], default="json", help="wamp: Autobahn clients' serializer"
    )
    bench.add_argument(
        "--transport",
        choices=["websocket", "rawsocket"],
        help="wamp: the clients' transport (default websocket; --client lean: rawsocket); pycalls: the lean clients'"
        " (default rawsocket); tail --client lean: the lean clients' (default websocket; rawsocket: no floor);"
        " idle: the sessions' (default websocket; rawsocket: the node's --rawsocket listener)",
    )
    bench.add_argument("--publishers", type=int, default=1, help="wamp --client lean: publisher processes (default 1)")
    bench.add_argument(
        "--subscribers", type=int, help="fanout: subscribers (default 1000); wamp --client lean: processes (default 1)"
    )
    bench.add_argument(
        "--window", type=int, help="wamp --client lean, link: messages in flight (default 20000); calls: calls (100)"
    )
    bench.add_argument(
        "--runs", type=int, help="peers: runs per figure, the median is shown (default 1); tail: default runs (10)"
    )
    bench.add_argument("--no-floor", action="store_true", help="tail: only the default runs, no floor run between them")
    bench.add_argument(
        "--no-host-probe", action="store_true", help="tail: no --scenario hop run before each pair (no quiet verdict)"
    )
    bench.add_argument(
        "--quiet-ms",
        type=float,
        default=0.3,
        help="tail: a pair is quiet when the hop runs before and after it have p99 at most this many ms (default 0.3)",
    )
    bench.add_argument(
        "--quiet-steal",
        type=float,
        default=0.05,
        help="tail: ... and the host stole at most this many seconds of CPU (/proc/stat, all vCPUs summed) during"
        " each of the pair's latency runs (default 0.05)",
    )
    bench.add_argument(
        "--bar-ms", type=float, default=1.0, help="tail: the bar, p99 in milliseconds each run must meet (default 1.0)"
    )
    bench.add_argument(
        "--clients", help="peers: comma-separated autobahn-json-ws, autobahn-msgpack-rs, lean (default: all)"
    )
    bench.add_argument(
        "--topology", choices=["single", "pair", "both"], default="both", help="peers: one server, two linked, or both"
    )
    bench.add_argument("--calls", type=int, help="peers: calls in the calls rows' throughput run (default: --count)")
    bench.add_argument(
        "--rows",
        default="events,calls,idle,fanout",
        help="peers: comma-separated row groups: events (the wamp runs), calls, idle, fanout (default: all)",
    )
    bench.add_argument(
        "--fanout-messages", type=int, help="fanout: messages published (default 2000; peers' fan-out row: 500)"
    )
    bench.add_argument(
        "--nodes",
        type=int,
        help="fanout: linked nodes (default 3; 1: all on one node); wamp: 2 (default) or 1; floor: relays, 2 or 1",
    )
    bench.add_argument(
        "--workers", type=int, default=1, help="fanout, wamp: the nodes' --workers (default 1: the flag is not passed)"
    )
    bench.add_argument("--sessions", type=int, default=10_000, help="idle: WAMP sessions to open (default 10000)")
    bench.add_argument("--batch", type=int, default=1000, help="stream: messages per Batch Count (default 1000)")
    bench.add_argument("--relaxed", action="store_true", help="stream: the node acks after write(), no fsync")
    bench.add_argument(
        "--acknowledge",
        action="store_true",
        help="wamp, floor --client lean: every publish of the latency run asks for a PUBLISHED (acknowledge: true)",
    )
    bench.add_argument(
        "--cluster-secret-file", metavar="FILE", help="link: both nodes prove this secret and seal their links"
    )
    report = sub.add_parser("report", help="PySpark report over the nodes' metrics dumps (docs/report.md)")
    add_report_arguments(report)
    return top


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """``parse_args``, but an unknown flag is reported by its subcommand with the nearest flag it has."""
    top = parser()
    args, unknown = top.parse_known_args(argv)
    if unknown:
        [commands] = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
        sub: argparse.ArgumentParser = commands.choices[args.command]
        flags = [o for a in sub._actions for o in a.option_strings if o.startswith("--")]
        hints = []
        for word in unknown:
            if word.startswith("-"):
                near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
                if near:
                    hints.append(f"{word.split('=', 1)[0]}: did you mean {near[0]}?")
        message = f"unrecognized arguments: {' '.join(unknown)}"
        sub.error(f"{message} ({'; '.join(hints)})" if hints else f"{message} (see {sub.prog} --help)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pubsubclub`` command."""
    args = _parse(argv)
    try:
        if args.command == "node":
            config = node_config(args)
            from pubsubclub.config.declare import workers_count
            from pubsubclub.node.workers import WorkerPlace

            count = workers_count(config.node.workers)
            if count > 1 and WorkerPlace.from_environment() is None:
                from pubsubclub.node.supervisor import run_supervisor

                return run_supervisor(config, count, list(sys.argv[1:] if argv is None else argv))
            from pubsubclub.node.run import run_node

            return run_node(config)
        if args.command == "bridge":
            config = node_config(args)
            if config.bridge.router is None:
                raise ConfigError("router", "pubsubclub bridge needs --router ws://host:port/path")
            from pubsubclub.node.run import run_node

            return run_node(config, bridge=True)
        if args.command == "cluster":
            if not 1 <= args.nodes <= 64:
                raise ConfigError("nodes", "must be between 1 and 64")
            from pubsubclub.cli.cluster import run_cluster

            return run_cluster(cluster_layout(args))
        if args.command == "status":
            from pubsubclub.cli.status import run as run_status

            return run_status(args)
        if args.command == "bench":
            try:
                return _run_bench(args)
            except TimeoutError as e:  # a run that exceeds --max-seconds: say so, no traceback
                print(f"pubsubclub: bench: {e}", file=sys.stderr)
                return 1
        if args.command == "report":
            from pubsubclub.reports.command import run as run_report

            return run_report(args)
    except ConfigError as e:
        print(f"pubsubclub: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


def _run_bench(args: argparse.Namespace) -> int:
    """``pubsubclub bench``: the scenario's runner."""
    import signal

    # SIGTERM unwinds like Ctrl-C, so every scenario's `finally` stops the nodes and routers it started.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    pycalls = args.scenario == "pycalls"
    if args.count is None:
        args.count = 500 if pycalls else 50_000
    if args.transport is None:
        # The lean clients' throughput and latency runs have been RawSocket since they exist; the tail's and
        # the floor's are WebSocket, the wire of the relays and of the Autobahn clients they are held against.
        lean_raw = args.client == "lean" and args.scenario not in ("tail", "floor")
        args.transport = "rawsocket" if pycalls or lean_raw else "websocket"
    if args.runs is None:
        args.runs = 10 if args.scenario == "tail" else 1
    if pycalls:
        from pubsubclub.bench.pycalls import run_pycalls_bench

        return run_pycalls_bench(args)
    if args.scenario == "peers":
        from pubsubclub.bench.peers import run_peers_bench

        return run_peers_bench(args)
    if args.scenario == "link":
        from pubsubclub.bench.link import run_link_bench

        return run_link_bench(args)
    if args.scenario == "fanout":
        from pubsubclub.bench.fanout import run_fanout_bench

        return run_fanout_bench(args)
    if args.scenario == "idle":
        from pubsubclub.bench.idle import run_idle_bench

        return run_idle_bench(args)
    if args.scenario == "calls":
        from pubsubclub.bench.calls import run_calls_bench

        return run_calls_bench(args)
    if args.scenario == "floor":
        from pubsubclub.bench.floor import run_floor_bench

        return run_floor_bench(args)
    if args.scenario == "hop":
        from pubsubclub.bench.hop import run_hop_bench

        return run_hop_bench(args)
    if args.scenario == "tail":
        from pubsubclub.bench.tail import run_tail_bench

        return run_tail_bench(args)
    if args.scenario == "stream":
        from pubsubclub.bench.stream import run_stream_bench

        return run_stream_bench(args)
    from pubsubclub.bench.wamp import run_bench

    return run_bench(args)
