"""``make demo``'s example: a publish on node 1 shown arriving on nodes 2 and 3, then Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sysv_ipc
from helpers.nodes import REPO
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_run

pytestmark = pytest.mark.slow


def demo_env(tmp_path: Path) -> dict[str, str]:
    """The demo's environment: free ports, a data folder in ``tmp_path`` and a random SysV key."""
    env = dict(os.environ)
    for name in ("WAMP", "PSC", "NSD", "TEP", "HTTP", "STREAM"):
        key = f"DEMO_{name}_PORT"
        env[key] = str(free_run(3))
    env["DEMO_DATA_DIR"] = str(tmp_path / "data")
    env["DEMO_SYSV_KEY"] = hex(random.randint(0x10000000, 0x7FFFFFF0))
    return env


def sysv_queues(env: dict[str, str]) -> list[int]:
    """The keys of the demo's three SysV queues that exist now."""
    base = int(env["DEMO_SYSV_KEY"], 16)
    found = []
    for key in range(base, base + 3):
        with contextlib.suppress(sysv_ipc.ExistentialError):
            sysv_ipc.MessageQueue(key)
            found.append(key)
    return found


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_demo_shows_fan_out_and_stops_on_ctrl_c(tmp_path: Path, stop_signal: signal.Signals) -> None:
    """The demo prints the endpoint table and the messages, and on Ctrl-C or SIGTERM stops and removes its queues."""
    env = demo_env(tmp_path)
    # The nodes' logs go to a file: a pipe nobody reads would fill up and stall them.
    log_path = tmp_path / "demo-stderr.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "demo.py")],
            stdout=subprocess.PIPE, stderr=log, bufsize=0, cwd=REPO, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        _check_demo(proc, env, tmp_path, log_path, stop_signal)
    finally:
        # Whatever happened, no node outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(WAIT_SECONDS)


def _check_demo(
    proc: subprocess.Popen[bytes], env: dict[str, str], tmp_path: Path, log_path: Path, stop_signal: signal.Signals
) -> None:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    out = b""
    while b"Ctrl-C stops the cluster" not in out:
        assert sel.select(WAIT_SECONDS * 2), out
        chunk = os.read(proc.stdout.fileno(), 65536)
        assert chunk, (out, log_path.read_text(errors="replace")[-4000:])
        out += chunk
    text = out.decode()
    assert "node2 received: {'text': 'hello from node1'" in text
    assert "node3 received: {'text': 'hello from node1'" in text
    assert f"http://127.0.0.1:{env['DEMO_WAMP_PORT']}/" in text
    assert "C client: reply OPERATION_SUCCESS" in text
    assert "stream subscriber on node2 received: '[chat] [democ]: hello from C'" in text
    assert len(sysv_queues(env)) == 3
    if stop_signal == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
    else:
        proc.send_signal(signal.SIGTERM)  # `kill PID`: the demo alone, which stops its nodes
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(WAIT_SECONDS)
    assert proc.returncode == 0, log_path.read_text(errors="replace")[-4000:]
    assert (tmp_path / "data" / "node1" / "nsd.sqlite3").exists()
    assert sysv_queues(env) == [], "the demo left SysV queues behind"


def test_demo_names_the_variable_that_moves_a_taken_port(tmp_path: Path) -> None:
    """With node 1's WAMP port taken, the demo exits 2 naming the port and DEMO_WAMP_PORT, and starts no node."""
    env = demo_env(tmp_path)
    port = int(env["DEMO_WAMP_PORT"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(
            [sys.executable, str(REPO / "examples" / "demo.py")],
            capture_output=True, text=True, cwd=REPO, env=env, timeout=WAIT_SECONDS,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"port {port} (node1's WAMP listener) is in use" in done.stderr
    assert f"DEMO_WAMP_PORT={port + 10000} make demo" in done.stderr
    assert not (tmp_path / "data").exists()
