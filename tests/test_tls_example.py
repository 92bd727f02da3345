"""The TLS walk-through of docs/security.md, run as written: examples/tls/make_certs.py, then a 2-node TLS cluster."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest_twisted
from helpers.nodes import REPO, NodeProcess
from helpers.polling import WAIT_SECONDS, until
from helpers.wampclient import connect as wamp_connect
from helpers.wampclient import leave, publish_acked, subscribe
from twisted.internet.ssl import Certificate

TOPIC = "com.example.tls"


def stats(node: NodeProcess) -> dict[str, Any]:
    """``/stats`` from the (plain HTTP, loopback) operations listener."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/stats", timeout=5) as r:
        return dict(json.loads(r.read()))


def make_certs(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run examples/tls/make_certs.py as the walk-through does."""
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "tls" / "make_certs.py"), str(folder), *args],
        capture_output=True, text=True, cwd=REPO, timeout=WAIT_SECONDS, check=True,
    )  # fmt: skip


def test_make_certs_writes_the_files_with_private_modes(tmp_path: Path) -> None:
    """ca.pem, one key+certificate file per node and a cluster secret; keys and the secret are 0600."""
    done = make_certs(tmp_path / "certs", "--nodes", "a", "b")
    assert "wrote ca.pem, a.pem, b.pem, cluster-secret" in done.stdout
    for name in ("a.pem", "b.pem", "cluster-secret"):
        assert stat.S_IMODE((tmp_path / "certs" / name).stat().st_mode) == 0o600
    pem = (tmp_path / "certs" / "a.pem").read_text()
    assert pem.startswith("-----BEGIN PRIVATE KEY-----") and "-----BEGIN CERTIFICATE-----" in pem
    assert len((tmp_path / "certs" / "cluster-secret").read_text().strip()) == 64


@pytest_twisted.ensureDeferred
async def test_tls_cluster_from_the_walk_through(tmp_path: Path) -> None:
    """Two nodes on ssl: listeners with the script's files link over wss:// and a wss:// WAMP publish crosses."""
    certs = tmp_path / "certs"
    make_certs(certs, "--nodes", "a", "b")
    a, b = NodeProcess("a", tmp_path), NodeProcess("b", tmp_path)
    for node in (a, b):
        pem = certs / f"{node.name}.pem"
        listen = f":interface=127.0.0.1:privateKey={pem}:certKey={pem}"
        node.extra = (
            "--psc", f"ssl:{node.psc_port}{listen}",
            "--wamp", f"ssl:0{listen}",
            "--ca-file", str(certs / "ca.pem"),
            "--cluster-secret-file", str(certs / "cluster-secret"),
        )  # fmt: skip
    a.peers = [f"wss://127.0.0.1:{b.psc_port}/psc"]
    b.peers = [f"wss://127.0.0.1:{a.psc_port}/psc"]
    try:
        a.start(), b.start()
        assert a.ready["psc"].startswith("wss://") and b.ready["wamp"].startswith("wss://")

        def linked() -> bool:
            return all(sum(link["state"] == "open" for link in stats(n)["links"]) == 2 for n in (a, b))

        await until(linked, "wss links both ways")
        trust = Certificate.loadPEM((certs / "ca.pem").read_bytes())
        sub = await wamp_connect(f"wss://127.0.0.1:{b.wamp_port}/ws", trust_root=trust)
        pub = await wamp_connect(f"wss://localhost:{a.wamp_port}/ws", trust_root=trust)
        rec, _ = await subscribe(sub, TOPIC)
        await until(lambda: stats(a)["remote_interest"].get(TOPIC) == ["b"], "a to learn b's interest")
        await publish_acked(pub, TOPIC, "over tls")
        await rec.wait_for(1)
        assert rec.args == ["over tls"]
        await leave(pub, sub)
    finally:
        a.stop(), b.stop()
