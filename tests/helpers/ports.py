"""TCP ports for test listeners: below the kernel's ephemeral range, never handed out twice.

Ports handed to test listeners come from below the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default). A port the kernel
picked for ``bind(0)`` and we released can be taken again by any outgoing
connection before the node binds it (CI saw exactly that: "Address already in
use"); ports below the range are never auto-assigned, so only an explicit bind
can race us. Each pytest process starts at its own place in the range, and each
pytest-xdist worker of a run keeps to its own share of it (`make test` runs
two), so the workers of one run never hand out the same port.
"""

from __future__ import annotations

import os
import socket

_PORT_FLOOR, _PORT_CEILING = 20000, 32000


def _worker_ports(floor: int, ceiling: int) -> tuple[int, int]:
    """This process's share of ``floor .. ceiling``: all of it, or one xdist worker's slice."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under pytest-xdist
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or workers <= 1:
        return floor, ceiling
    share = (ceiling - floor) // workers
    index = int(worker[2:])
    return floor + index * share, floor + (index + 1) * share


_PORT_FLOOR, _PORT_CEILING = _worker_ports(_PORT_FLOOR, _PORT_CEILING)
_next_port = _PORT_FLOOR + (os.getpid() * 97) % (_PORT_CEILING - _PORT_FLOOR)


def free_port() -> int:
    """A TCP port on 127.0.0.1, below the ephemeral range, free when checked and never handed out twice."""
    return free_run(1)


def free_run(n: int) -> int:
    """A port p such that p .. p+n-1 are below the ephemeral range, were free, and are never handed out again."""
    global _next_port
    for _ in range(_PORT_CEILING - _PORT_FLOOR):
        base = _next_port
        if base + n > _PORT_CEILING:
            _next_port = _PORT_FLOOR
            continue
        _next_port = base + n
        try:
            for port in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free test ports below the ephemeral range")
