"""``pubsubclub cluster``: N local nodes with static discovery, stopped together."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any


def node_command(index: int, count: int, wamp_base: int, psc_base: int, listen_role: str, log_level: str) -> list[str]:
    """The ``pubsubclub node`` command line of node ``index`` (1-based)."""
    peers = [f"ws://127.0.0.1:{psc_base + k - 1}/psc" for k in range(1, count + 1) if k != index]
    cmd = [
        sys.executable,
        "-m",
        "pubsubclub",
        "node",
        "--name",
        f"node{index}",
        "--wamp",
        f"tcp:{wamp_base + index - 1}:interface=127.0.0.1",
        "--psc",
        f"tcp:{psc_base + index - 1}:interface=127.0.0.1",
        "--listen-role",
        listen_role,
        "--log-level",
        log_level,
    ]
    for peer in peers:
        cmd += ["--peer", peer]
    return cmd


def run_cluster(count: int, wamp_base: int, psc_base: int, listen_role: str, log_level: str) -> int:
    """Start ``count`` nodes, print their endpoints, wait for Ctrl-C, stop them all."""
    procs: list[subprocess.Popen[str]] = []
    rows: list[dict[str, Any]] = []
    try:
        for i in range(1, count + 1):
            proc = subprocess.Popen(
                node_command(i, count, wamp_base, psc_base, listen_role, log_level),
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                print(f"pubsubclub: error: a node exited during start (code {proc.wait()})", file=sys.stderr)
                return 1
            rows.append(json.loads(line))
        print(f"{'node':<8} {'WAMP (ws)':<30} {'chat page':<28} {'PSC':<30}")
        for row in rows:
            print(f"{row['name']:<8} {row['wamp']:<30} {row['http']:<28} {row.get('psc', '-'):<30}")
        print("cluster running; Ctrl-C stops every node", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        for proc in procs:
            proc.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
