"""The ``pubsubclub`` command line: flags, config files, ``cluster``."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.nodes import REPO
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_port, free_run

from pubsubclub.config import ConfigError, build, load_toml


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pubsubclub`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "pubsubclub", *args], capture_output=True, text=True, timeout=WAIT_SECONDS, cwd=REPO
    )


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["node", "--listen-role", "both"], "--listen-role"),
        (["node", "--wamp", "bogus:1"], "'wamp'"),
        (["node", "--psc", "tcp:notaport"], "'psc'"),
        (["node", "--peer", "http://127.0.0.1:9001/psc"], "'peer'"),
        (["node", "--peer", "ws://127.0.0.1/psc"], "'peer'"),
        (["node", "--name", "has space"], "'name'"),
        (["node", "--max-message-size", "12"], "'max-message-size'"),
        (["node", "--max-json-depth", "1000"], "'max-json-depth'"),
        (["node", "--nsd-max-clock-skew", "0"], "'nsd-max-clock-skew'"),
        (["node", "--no-such-flag"], "--no-such-flag"),
        (["cluster", "--nodes", "0"], "'nodes'"),
        (["bridge"], "'router'"),
        (["bridge", "--router", "http://127.0.0.1:8080/ws"], "'router'"),
        (["bridge", "--router", "ws://127.0.0.1:8080/ws", "--ticket-file", "/no/such/file"], "'ticket-file'"),
        (["bridge", "--router", "ws://127.0.0.1:8080/ws", "--wamp", "tcp:8080"], "--wamp"),
    ],
)
def test_bad_flags_exit_2_naming_the_key(args: list[str], named: str) -> None:
    """Every bad flag value ends with exit code 2 and a message naming it."""
    result = run_cli(*args)
    assert result.returncode == 2, result
    assert named in result.stderr


def test_bad_config_file_names_the_key(tmp_path: Path) -> None:
    """An unknown or mistyped key in the TOML file is named, exit code 2."""
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('wamp = "tcp:8080"\ncolour = "blue"\n')
    result = run_cli("node", "--config", str(unknown))
    assert result.returncode == 2 and "'colour'" in result.stderr
    mistyped = tmp_path / "mistyped.toml"
    mistyped.write_text("peer = 5\n")
    result = run_cli("node", "--config", str(mistyped))
    assert result.returncode == 2 and "'peer'" in result.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("peer = [\n")
    result = run_cli("node", "--config", str(broken))
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    result = run_cli("node", "--config", str(tmp_path / "missing.toml"))
    assert result.returncode == 2 and "cannot read" in result.stderr


def test_config_file_and_flags_merge(tmp_path: Path) -> None:
    """Keys from the file are used; flags override them; hyphenated keys work."""
    path = tmp_path / "node.toml"
    path.write_text(
        'name = "n1"\nlisten-role = "consumer"\nrealm = "r1"\npeer = ["ws://127.0.0.1:9002/psc"]\n'
        'wamp = "tcp:8085:interface=127.0.0.1"\n'
    )
    config = build(load_toml(str(path)), {"realm": "r2"})
    assert (config.node.name, config.federation.listen_role, config.wamp.realm) == ("n1", "consumer", "r2")
    assert config.federation.peers == ("ws://127.0.0.1:9002/psc",)
    with pytest.raises(ConfigError, match="'listen-role'"):
        build({}, {"listen_role": "nobody"})


def test_node_listener_in_use_exits_nonzero(tmp_path: Path) -> None:
    """A node whose WAMP port is taken says so, naming --wamp, and exits 2 (configuration error) instead of hanging."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = run_cli("node", "--wamp", f"tcp:{port}:interface=127.0.0.1", "--psc", f"tcp:{free_port()}")
    assert result.returncode == 2
    assert f"--wamp tcp:{port}:interface=127.0.0.1: cannot listen on 127.0.0.1:{port}" in result.stderr


def test_cluster_command_starts_links_and_stops_nodes(tmp_path: Path) -> None:
    """``pubsubclub cluster --nodes 2`` prints a table of endpoints after the nodes' link-up logs; Ctrl-C stops all.

    stdout and stderr share one pipe here, as they share a terminal.
    """
    data = tmp_path / "data"
    wamp, psc, ops = free_run(2), free_run(2), free_run(2)
    while psc - 1 <= wamp <= psc + 1:
        psc = free_run(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pubsubclub", "cluster", "--nodes", "2", "--wamp-base-port", str(wamp),
         "--psc-base-port", str(psc), "--nsd-base-port", str(free_run(2)), "--tep-base-port", str(free_run(2)),
         "--stream-base-port", str(free_run(2)), "--sysv-base-key", hex(random.randint(0x10000000, 0x7FFFFFF0)),
         "--http-base-port", str(ops), "--data-dir", str(data), "--log-level", "info"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        out = b""
        while b"Ctrl-C" not in out:
            assert sel.select(WAIT_SECONDS), out
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, (out, proc.stderr.read() if proc.stderr else "")
            out += chunk
        table = out.decode()
        assert "PSC link up" in table  # the nodes' logs came first ...
        header = re.search(r"^node +WAMP", table, re.MULTILINE)
        assert header is not None and "PSC link up" not in table[header.start() :]  # ... and none after the table
        assert f"ws://127.0.0.1:{wamp}/ws" in table and f"ws://127.0.0.1:{wamp + 1}/ws" in table
        assert f"ws://127.0.0.1:{psc + 1}/psc" in table
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{ops}/stats", timeout=5) as r:
            assert json.loads(r.read())["servers"] == [f"ws://127.0.0.1:{psc + 1}/psc"]
        proc.send_signal(signal.SIGINT)
        # Read the shutdown logs to the end (the pipe must not fill up), then the exit status.
        deadline = time.monotonic() + WAIT_SECONDS
        while sel.select(max(0.0, deadline - time.monotonic())):
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(1)
        assert proc.returncode == 0, out.decode(errors="replace")[-6000:]
        # Every node is gone: its port refuses connections.
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{wamp}/", timeout=5)
    finally:
        # Whatever happened, no node outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_SECONDS)
