"""A process's resident memory and open files, read from ``/proc`` (Linux)."""

from __future__ import annotations

import os
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
