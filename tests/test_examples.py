"""The examples users copy from: the SysV C client's command line, the stream client, the Crossbar config."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sysv_ipc
from conftest import REPO


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/sysv/client.c built with gcc, as `make examples/sysv/client` does."""
    exe = tmp_path_factory.mktemp("sysv") / "client"
    source = REPO / "examples" / "sysv" / "client.c"
    subprocess.run(["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O2", "-o", str(exe), str(source)], check=True)
    return exe


def queue_ids() -> set[str]:
    """The ids of every System V message queue on this host (/proc/sysvipc/msg)."""
    lines = Path("/proc/sysvipc/msg").read_text().splitlines()[1:]
    return {line.split()[1] for line in lines}


def test_sysv_client_help_prints_usage_and_makes_no_queue(c_client: Path) -> None:
    """``client --help`` prints the usage and exits 0 without a ``ready`` line or a new (IPC_PRIVATE) queue."""
    before = queue_ids()
    done = subprocess.run([str(c_client), "--help"], input="", capture_output=True, text=True, timeout=10)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: client [KEY]") and "ready" not in done.stdout
    assert queue_ids() - before == set()


@pytest.mark.parametrize("argv", [["0"], ["bogus"], ["0x420x"], [""], ["-1"], ["0x420", "extra"]])
def test_sysv_client_bad_key_exits_2_with_usage(c_client: Path, argv: list[str]) -> None:
    """A key that is not a positive number (0 would be IPC_PRIVATE) or extra arguments: usage on stderr, exit 2."""
    before = queue_ids()
    done = subprocess.run([str(c_client), *argv], input="", capture_output=True, text=True, timeout=10)
    assert done.returncode == 2, done.stdout
    assert "usage: client [KEY]" in done.stderr and done.stdout == ""
    assert queue_ids() - before == set()


def test_sysv_client_reaches_an_existing_queue_by_hex_key(c_client: Path) -> None:
    """A valid key finds the queue made for it (here: a queue with no node behind it) and prints ``ready``."""
    queue = sysv_ipc.MessageQueue(None, sysv_ipc.IPC_CREX, 0o600)
    try:
        done = subprocess.run([str(c_client), hex(queue.key)], input="", capture_output=True, text=True, timeout=10)
    finally:
        queue.remove()
    assert done.stdout.startswith("ready "), done.stdout
