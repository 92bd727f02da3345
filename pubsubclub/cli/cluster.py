"""``pubsubclub cluster``: N local nodes with static discovery, stopped together.

The embedded defaults: every node lists every other as a PSC peer, serves
WAMP, NSD and TEP, keeps its NSD store (SQLite) under ``<data-dir>/<node>``,
writes metrics dumps to ``<data-dir>/metrics`` and serves ``/health`` and
``/metrics`` on its ops port. Node k uses ``base + k - 1`` for each port.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from pubsubclub.config import LISTEN_ROLES, LOG_LEVELS, FederationSection, MetricsSection, NodeSection


@dataclass(frozen=True)
class ClusterLayout:
    """Ports and folders of a local cluster."""

    count: int = 3
    wamp_base: int = 8080
    psc_base: int = 9001
    nsd_base: int = 7001
    tep_base: int = 7101
    stream_base: int = 7878
    #: SysV queue key of node 1; node k uses base + k - 1 (one queue per node). 0: no SysV front-end.
    sysv_base_key: int = 0x420
    #: Hub topic prefix of the nodes' SysV channels (a channel name has at most 16 characters).
    sysv_prefix: str = ""
    http_base: int = 8181
    data_dir: str = NodeSection().data_dir
    listen_role: str = FederationSection().listen_role
    log_level: str = NodeSection().log_level
    metrics_interval: float = MetricsSection().interval


#: The one set of cluster defaults: ``pubsubclub cluster``'s flags show and use these.
DEFAULTS = ClusterLayout()


def add_cluster_arguments(cluster: argparse.ArgumentParser) -> None:
    """The flags of ``pubsubclub cluster``, their defaults those of :class:`ClusterLayout`."""
    d = DEFAULTS
    cluster.add_argument("--nodes", type=int, default=d.count, help=f"how many nodes (default {d.count})")
    cluster.add_argument(
        "--wamp-base-port", type=int, default=d.wamp_base, help="WAMP port of node 1; node k uses base+k-1"
    )
    cluster.add_argument(
        "--psc-base-port", type=int, default=d.psc_base, help="PSC port of node 1; node k uses base+k-1"
    )
    cluster.add_argument("--nsd-base-port", type=int, default=d.nsd_base, help="NSD port of node 1")
    cluster.add_argument("--tep-base-port", type=int, default=d.tep_base, help="TEP port of node 1")
    cluster.add_argument("--stream-base-port", type=int, default=d.stream_base, help="stream port of node 1")
    cluster.add_argument(
        "--sysv-base-key", type=lambda v: int(v, 0), default=d.sysv_base_key, help="SysV queue key of node 1 (0: none)"
    )
    cluster.add_argument(
        "--http-base-port", type=int, default=d.http_base, help="ops (/health, /metrics) port of node 1"
    )
    cluster.add_argument("--data-dir", default=d.data_dir, help="stores and metrics folder")
    cluster.add_argument(
        "--metrics-interval", type=float, default=d.metrics_interval, help="seconds between metrics dumps"
    )
    cluster.add_argument("--listen-role", choices=list(LISTEN_ROLES), default=d.listen_role)
    cluster.add_argument("--log-level", default=d.log_level, choices=list(LOG_LEVELS))


def cluster_layout(args: argparse.Namespace) -> ClusterLayout:
    """The layout of parsed ``pubsubclub cluster`` arguments."""
    return ClusterLayout(
        count=args.nodes,
        wamp_base=args.wamp_base_port,
        psc_base=args.psc_base_port,
        nsd_base=args.nsd_base_port,
        tep_base=args.tep_base_port,
        stream_base=args.stream_base_port,
        sysv_base_key=args.sysv_base_key,
        http_base=args.http_base_port,
        data_dir=args.data_dir,
        listen_role=args.listen_role,
        log_level=args.log_level,
        metrics_interval=args.metrics_interval,
    )


def node_command(layout: ClusterLayout, index: int) -> list[str]:
    """The ``pubsubclub node`` command line of node ``index`` (1-based)."""
    name = f"node{index}"
    offset = index - 1

    def listen(base: int) -> str:
        return f"tcp:{base + offset}:interface=127.0.0.1"

    cmd = [sys.executable, "-m", "pubsubclub", "node", "--name", name,
           "--wamp", listen(layout.wamp_base), "--psc", listen(layout.psc_base),
           "--nsd", listen(layout.nsd_base), "--tep", listen(layout.tep_base), "--http", listen(layout.http_base),
           "--stream", listen(layout.stream_base),
           "--data-dir", os.path.join(layout.data_dir, name),
           "--metrics-dir", os.path.join(layout.data_dir, "metrics"),
           "--metrics-interval", str(layout.metrics_interval),
           "--listen-role", layout.listen_role, "--log-level", layout.log_level]  # fmt: skip
    if layout.sysv_base_key:
        cmd += ["--sysv", hex(layout.sysv_base_key + offset)]
        if layout.sysv_prefix:
            cmd += ["--sysv-prefix", layout.sysv_prefix]
    for k in range(1, layout.count + 1):
        if k != index:
            cmd += ["--peer", f"ws://127.0.0.1:{layout.psc_base + k - 1}/psc"]
    return cmd


def start_nodes(layout: ClusterLayout) -> tuple[list[subprocess.Popen[str]], list[dict[str, Any]]]:
    """Start the nodes and read their ready lines; raise SystemExit if one fails to start."""
    procs = [
        subprocess.Popen(node_command(layout, i), stdout=subprocess.PIPE, text=True) for i in range(1, layout.count + 1)
    ]
    rows = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            stop_nodes(procs)
            raise SystemExit(f"pubsubclub: error: a node exited during start (code {proc.wait()}); ports in use?")
        rows.append(json.loads(line))
    return procs, rows


def stop_nodes(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every node (graceful), then wait; kill what does not stop."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_linked(rows: list[dict[str, Any]], timeout: float = 20.0) -> bool:
    """Until every node reports a link each way with every other (its /health), or ``timeout``.

    The endpoint table is printed after this, so it comes after the nodes'
    start-up and link-up logs instead of being buried in them.
    """
    want = 2 * (len(rows) - 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            linked = all(_open_links(row["health"]) >= want for row in rows)
        except (OSError, ValueError, KeyError):
            linked = False
        if linked:
            return True
        time.sleep(0.1)
    return False


def _open_links(health_url: str) -> int:
    with urllib.request.urlopen(health_url, timeout=2) as r:
        return int(json.loads(r.read())["open_links"])


def print_table(rows: list[dict[str, Any]]) -> None:
    """The endpoints of every node."""
    columns = [("node", "name"), ("WAMP", "wamp"), ("chat page", "http"), ("PSC", "psc"), ("NSD", "nsd"),
               ("TEP", "tep"), ("stream", "stream"), ("SysV", "sysv"), ("health", "health")]  # fmt: skip
    widths = [max(len(title), *(len(str(row.get(key, "-"))) for row in rows)) for title, key in columns]
    print("  ".join(title.ljust(w) for (title, _), w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(str(row.get(key, "-")).ljust(w) for (_, key), w in zip(columns, widths, strict=True)))
    sys.stdout.flush()


def run_cluster(layout: ClusterLayout) -> int:
    """Start the nodes, print their endpoints, wait for Ctrl-C, stop them all."""
    procs, rows = start_nodes(layout)
    try:
        if not wait_linked(rows):
            print("pubsubclub: warning: the nodes did not all link within 20 s", file=sys.stderr, flush=True)
        print_table(rows)
        print(f"stores and metrics under {layout.data_dir}/; cluster running; Ctrl-C stops every node", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        # Ctrl-C (SIGINT) stops the cluster even when started as a background job, where the shell
        # hands SIGINT over ignored and Python then installs no KeyboardInterrupt handler.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for proc in procs:
            proc.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        stop_nodes(procs)
