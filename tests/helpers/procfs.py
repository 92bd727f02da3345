"""A process's resident memory and open files, read from ``/proc`` (Linux), and waiting for processes to be gone."""

from __future__ import annotations

import os
import time
from pathlib import Path


def rss(pid: int) -> int:
    """Resident memory of process ``pid``, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_fds(pid: int | None = None) -> int:
    """File descriptors process ``pid`` has open (this process when ``pid`` is None)."""
    return len(os.listdir(f"/proc/{'self' if pid is None else pid}/fd"))


def assert_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Each of ``pids`` is gone within ``timeout`` (a killed orphan is a zombie until init reaps it)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"{pid} outlived the bench"
            time.sleep(0.05)
