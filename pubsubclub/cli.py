"""The ``pubsubclub`` command: ``node``, ``cluster``, ``bench`` and ``report``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pubsubclub import __version__
from pubsubclub.config import ConfigError, build, load_toml
from pubsubclub.reports.command import add_arguments as add_report_arguments

EXIT_USAGE = 2


def _add_node_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file (flags win)")
    p.add_argument("--name", help="node id, unique in the cluster (default: random)")
    p.add_argument(
        "--wamp", metavar="ENDPOINT", help="WAMP listener, a Twisted endpoint (default tcp:8080:interface=127.0.0.1)"
    )
    p.add_argument("--realm", help="WAMP realm (default realm1)")
    p.add_argument(
        "--psc", metavar="ENDPOINT", help="federation listener, path /psc (default tcp:9001:interface=127.0.0.1)"
    )
    p.add_argument(
        "--peer",
        metavar="URL",
        action="append",
        help="PSC URL of another node, e.g. ws://127.0.0.1:9002/psc (repeatable)",
    )
    p.add_argument(
        "--listen-role", choices=["producer", "consumer"], help="which role listens, cluster-wide (default producer)"
    )
    p.add_argument("--advertise", metavar="URL", help="the PSC URL other nodes use for this node")
    p.add_argument("--max-message-size", type=int, metavar="BYTES", help="largest WAMP/PSC message accepted")
    p.add_argument("--no-chat-page", action="store_true", help="do not serve the browser chat page at /")
    p.add_argument(
        "--http", metavar="ENDPOINT", help="operations listener: /health, /stats, /metrics, /tep (default: off)"
    )
    p.add_argument("--consul", metavar="URL", help="Consul agent URL, e.g. http://127.0.0.1:8500 (discovery)")
    p.add_argument("--service", help="Consul service name (default pubsubclub)")
    p.add_argument("--consul-token", metavar="TOKEN", help="Consul ACL token")
    p.add_argument("--consul-dc", metavar="DC", help="Consul datacenter")
    p.add_argument(
        "--consul-check", choices=["ttl", "http"], help="health check: ttl heartbeats (default) or http on /health"
    )
    p.add_argument("--consul-ttl", type=float, metavar="SECONDS", help="TTL of the Consul check (default 10)")
    # Advanced: tests shorten it; operators rarely need to.
    p.add_argument("--consul-debounce", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    p.add_argument("--cluster-secret-file", metavar="FILE", help="links must prove this secret (HMAC)")
    p.add_argument("--ca-file", metavar="PEM", help="CA certificates that wss:// peers are verified against")
    p.add_argument("--metrics-dir", metavar="DIR", help="write metrics dumps here (docs/metrics.md)")
    p.add_argument("--metrics-interval", type=float, metavar="S", help="seconds between metrics dumps (default 10)")
    p.add_argument(
        "--metrics-max-topics",
        type=int,
        metavar="N",
        help="topics with their own /metrics series, the busiest; the rest summed as __other__ (default 200)",
    )
    p.add_argument("--nsd", metavar="ENDPOINT", help="NSD listener (TCP, JSON lines), e.g. tcp:7000")
    p.add_argument("--data-dir", metavar="DIR", help="folder for the node's stores (default pubsubclub-data)")
    p.add_argument("--nsd-prefix", metavar="PREFIX", help="hub topic prefix of NSD channels (default none)")
    p.add_argument("--nsd-max-message-chars", type=int, metavar="N", help="largest NSD message (default 65536)")
    p.add_argument("--nsd-retention-count", type=int, metavar="N", help="NSD messages kept per channel (0: all)")
    p.add_argument("--nsd-retention-seconds", type=float, metavar="S", help="NSD history age limit (0: none)")
    p.add_argument("--tep", metavar="ENDPOINT", help="TEP listener (WebSocket at /tep), e.g. tcp:7100")
    p.add_argument("--tep-prefix", metavar="PREFIX", help="hub topic prefix of TEP channels (default none)")
    p.add_argument("--no-tep-client-publish", action="store_true", help="TEP clients may not publish (they get #error)")
    p.add_argument("--tep-max-channels", type=int, metavar="N", help="channels one TEP client may join (default 100)")
    p.add_argument(
        "--tep-ops-token-file",
        metavar="FILE",
        help="bearer token of the TEP operator API (/tep on --http); without it the API is off",
    )
    p.add_argument(
        "--replay-buffer-bytes",
        type=int,
        metavar="BYTES",
        help="PSC 0.3 replay buffer per consumer node (default 16777216)",
    )
    p.add_argument(
        "--replay-window-seconds",
        type=float,
        metavar="S",
        help="a dropped link that comes back within S seconds loses nothing (default 60; 0: extension off)",
    )
    p.add_argument(
        "--no-learn-peers",
        action="store_true",
        help="dial only the configured peers; do not tell peers whom this node dials (default: learn)",
    )
    p.add_argument(
        "--max-send-buffer",
        type=int,
        metavar="BYTES",
        help="a WAMP or TEP client with more unread is dropped as a slow consumer (default 16777216)",
    )
    p.add_argument(
        "--max-link-queue",
        type=int,
        metavar="BYTES",
        help="a PSC link with more queued for its peer is dropped (default 16777216)",
    )
    p.add_argument(
        "--auth",
        metavar="FILE.toml",
        help="WAMP principals and roles, also applied to TEP and NSD (docs/security.md; default: none, all anonymous)",
    )
    p.add_argument(
        "--max-json-depth", type=int, metavar="N", help="deepest array/object nesting clients may send (default 64)"
    )
    p.add_argument(
        "--nsd-max-clock-skew",
        type=float,
        metavar="S",
        help="seconds an NSD when/stamp from another node may be ahead of this clock (default 3600)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])


def parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    top = argparse.ArgumentParser(prog="pubsubclub", description="Turn WAMP pub/sub servers into a cluster.")
    top.add_argument("--version", action="version", version=f"pubsubclub {__version__}")
    sub = top.add_subparsers(dest="command", required=True)

    node = sub.add_parser("node", help="run one node")
    _add_node_flags(node)

    cluster = sub.add_parser("cluster", help="run N local nodes with static discovery")
    cluster.add_argument("--nodes", type=int, default=3, help="how many nodes (default 3)")
    cluster.add_argument("--wamp-base-port", type=int, default=8080, help="WAMP port of node 1; node k uses base+k-1")
    cluster.add_argument("--psc-base-port", type=int, default=9001, help="PSC port of node 1; node k uses base+k-1")
    cluster.add_argument("--nsd-base-port", type=int, default=7001, help="NSD port of node 1")
    cluster.add_argument("--tep-base-port", type=int, default=7101, help="TEP port of node 1")
    cluster.add_argument("--http-base-port", type=int, default=8181, help="ops (/health, /metrics) port of node 1")
    cluster.add_argument("--data-dir", default="pubsubclub-data", help="stores and metrics folder")
    cluster.add_argument("--metrics-interval", type=float, default=10.0, help="seconds between metrics dumps")
    cluster.add_argument("--listen-role", choices=["producer", "consumer"], default="producer")
    cluster.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])

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
    bench.add_argument("--count", type=int, default=50_000, help="messages in the throughput run")
    bench.add_argument("--size", type=int, default=100, help="payload bytes")
    bench.add_argument("--rate", type=int, default=1000, help="messages/s in the latency run")
    bench.add_argument("--latency-count", type=int, default=5000, help="messages in the latency run")
    bench.add_argument("--max-seconds", type=float, default=60.0, help="time bound of each run")
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    report = sub.add_parser("report", help="PySpark report over the nodes' metrics dumps (docs/report.md)")
    add_report_arguments(report)
    return top


def _node_config(args: argparse.Namespace) -> Any:
    file_values = load_toml(args.config) if args.config else {}
    flags = {
        "name": args.name,
        "wamp": args.wamp,
        "realm": args.realm,
        "psc": args.psc,
        "peer": tuple(args.peer) if args.peer else None,
        "listen_role": args.listen_role,
        "advertise": args.advertise,
        "max_message_size": args.max_message_size,
        "chat_page": False if args.no_chat_page else None,
        "http": args.http,
        "nsd": args.nsd,
        "metrics_dir": args.metrics_dir,
        "metrics_interval": args.metrics_interval,
        "metrics_max_topics": args.metrics_max_topics,
        "tep_ops_token_file": args.tep_ops_token_file,
        "data_dir": args.data_dir,
        "nsd_prefix": args.nsd_prefix,
        "nsd_max_message_chars": args.nsd_max_message_chars,
        "nsd_retention_count": args.nsd_retention_count,
        "nsd_retention_seconds": args.nsd_retention_seconds,
        "consul": args.consul,
        "service": args.service,
        "consul_token": args.consul_token,
        "consul_dc": args.consul_dc,
        "consul_check": args.consul_check,
        "consul_ttl": args.consul_ttl,
        "consul_debounce": args.consul_debounce,
        "cluster_secret_file": args.cluster_secret_file,
        "ca_file": args.ca_file,
        "tep": args.tep,
        "tep_prefix": args.tep_prefix,
        "tep_client_publish": False if args.no_tep_client_publish else None,
        "tep_max_channels": args.tep_max_channels,
        "replay_buffer_bytes": args.replay_buffer_bytes,
        "replay_window_seconds": args.replay_window_seconds,
        "auth": args.auth,
        "max_json_depth": args.max_json_depth,
        "max_send_buffer": args.max_send_buffer,
        "learn_peers": False if args.no_learn_peers else None,
        "max_link_queue": args.max_link_queue,
        "nsd_max_clock_skew": args.nsd_max_clock_skew,
    }
    return build(file_values, flags)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pubsubclub`` command."""
    args = parser().parse_args(argv)
    try:
        if args.command == "node":
            config = _node_config(args)
            from pubsubclub.run import run_node

            return run_node(config, args.log_level)
        if args.command == "cluster":
            if not 1 <= args.nodes <= 64:
                raise ConfigError("nodes", "must be between 1 and 64")
            from pubsubclub.cluster import ClusterLayout, run_cluster

            layout = ClusterLayout(
                count=args.nodes,
                wamp_base=args.wamp_base_port,
                psc_base=args.psc_base_port,
                nsd_base=args.nsd_base_port,
                tep_base=args.tep_base_port,
                http_base=args.http_base_port,
                data_dir=args.data_dir,
                listen_role=args.listen_role,
                log_level=args.log_level,
                metrics_interval=args.metrics_interval,
            )
            return run_cluster(layout)
        if args.command == "bench":
            from pubsubclub.bench import run_bench

            return run_bench(args)
        if args.command == "report":
            from pubsubclub.reports.command import run as run_report

            return run_report(args)
    except ConfigError as e:
        print(f"pubsubclub: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE
