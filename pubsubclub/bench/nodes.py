"""The processes every ``pubsubclub bench`` scenario measures: nodes on free ports, their CPU and memory.

Each scenario starts real ``pubsubclub node`` processes on 127.0.0.1, waits
for their ready line, reads what they cost from ``/proc`` and prints progress
on stderr (stdout keeps only the results, e.g. for ``--json``). Those steps
live here once.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

#: Names a directory: every node a bench starts runs under cProfile and leaves its profile there.
PROFILE_ENV = "PUBSUBCLUB_BENCH_PROFILE"


def progress(text: str) -> None:
    """One progress line on stderr."""
    print(f"bench: {text}", file=sys.stderr, flush=True)


#: Where the bench's listeners' ports come from: below the kernel's ephemeral range, under the tests' ports
#: (tests/helpers/ports.py keeps to 20000-32000), so that no ``bind(0)`` or outgoing connection, the nodes' own
#: included, can take a port between the moment it is picked and the node's bind of it.
PORT_FLOOR, PORT_CEILING = 10000, 20000
#: The kernel's ephemeral range, read from here when the platform has it.
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"

_handed_out: set[int] = set()


def port_range(ephemeral: str | None = None) -> tuple[int, int]:
    """The ports :func:`free_port` picks from: PORT_FLOOR .. PORT_CEILING, cut to end below the ephemeral range.

    An empty range (a host whose ephemeral range starts below PORT_FLOOR) makes
    :func:`free_port` ask the kernel instead, as it always did.
    """
    ceiling = PORT_CEILING
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open(ephemeral or EPHEMERAL_RANGE) as f:
            ceiling = min(ceiling, int(f.read().split()[0]))
    return PORT_FLOOR, ceiling


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range, never handed out twice here.

    A port the kernel chose for ``bind(0)`` and that was released again can be
    taken by any outgoing connection or ``bind(0)`` before the node binds it:
    ``pubsubclub bench --scenario tail`` lost a whole bar check to "address
    already in use" that way. Ports below the ephemeral range are never
    chosen by the kernel, so only an explicit bind can race us.
    """
    floor, ceiling = port_range()
    span = ceiling - floor
    if span > 0:
        start = os.getpid() * 97 % span
        for step in range(span):
            port = floor + (start + step) % span
            if port in _handed_out:
                continue
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local(port: int) -> str:
    """The endpoint string of a loopback listener on ``port``."""
    return f"tcp:{port}:interface=127.0.0.1"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds of ``pids`` and all their descendants (a Crossbar node runs its router in a child)."""
    total = 0.0
    for pid in descendants(pids):
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue  # a child that exited took its CPU time with it
    return total


def tree_rss(pids: list[int]) -> int:
    """Resident set size of ``pids`` and all their descendants, in bytes."""
    total = 0
    for pid in descendants(pids):
        try:
            total += rss(pid)
        except (OSError, RuntimeError):
            continue  # gone meanwhile
    return total


def descendants(pids: list[int]) -> set[int]:
    """``pids`` and every process below them."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue  # gone meanwhile
    tree, todo = set(pids), list(pids)
    while todo:
        parent = todo.pop()
        for child in [c for c, p in parents.items() if p == parent and c not in tree]:
            tree.add(child)
            todo.append(child)
    return tree


def rss(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU model and count, Python, platform, load when asked."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "python_executable": os.path.realpath(sys.executable),
        "libpython": libpython(),
        "platform": platform.platform(),
        "load_average": os.getloadavg()[0],
    }


def libpython(maps: str = "/proc/self/maps") -> str | None:
    """The shared ``libpython`` this interpreter runs from, "static" when it has none, None if unknown.

    Which interpreter build ran a benchmark moves its latency figures as much
    as the nodes' own share: the same nodes took about 15 % less CPU per paced
    message on Debian's static PGO/LTO build than on pyenv's default (shared,
    unoptimised) one (docs/benchmarks.md, "The tail, ninth round").
    Whether a build was optimised cannot be read from ``sysconfig`` reliably
    (Debian's reports the configure line of its shared variant), so the
    results carry the facts that can: the executable and this.
    """
    try:
        with open(maps) as f:
            # address, perms, offset, device, inode, then the path (which may hold spaces)
            paths = {line.split(maxsplit=5)[5].strip() for line in f if "/libpython" in line}
    except OSError:
        return None
    return sorted(paths)[0] if paths else "static"


def steal_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU time the hypervisor gave to others while this machine's vCPUs wanted it, all vCPUs, since boot.

    The ``steal`` column of ``/proc/stat``'s ``cpu`` line, in seconds; None
    where there is no such file or column (not Linux, or a kernel without it).
    """
    try:
        with open(stat) as f:
            fields = next((line.split() for line in f if line.startswith("cpu ")), [])
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def stolen_since(before: float | None) -> float | None:
    """Seconds of steal (:func:`steal_seconds`, all vCPUs summed) since the reading ``before``; None if unknown.

    The latency runs report it (``steal_seconds``) for their own time, so a
    reader can tell a run the host took CPU from (docs/benchmarks.md, "The
    tail, eighth round").
    """
    now = steal_seconds()
    return None if before is None or now is None else round(now - before, 3)


def steal_text(latency: dict[str, Any]) -> str:
    """A latency run's steal for its text line: "; the host stole S s of CPU during it", or nothing when unknown."""
    stolen = latency.get("steal_seconds")
    return "" if stolen is None else f"; the host stole {stolen:.2f} s of CPU during it"


def start_node(
    name: str, args: list[str], command: list[str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start ``pubsubclub node --name NAME ARGS`` (or ``command``) quietly; the process and its ready line.

    With ``PUBSUBCLUB_BENCH_PROFILE=DIR`` in the environment a node runs under
    cProfile and writes ``DIR/NAME.prof`` when it stops (for ``pstats``).
    """
    cmd = command or [sys.executable, "-m", "pubsubclub", "node"]
    profile_dir = os.environ.get(PROFILE_ENV)
    if profile_dir and not command:
        cmd = [sys.executable, "-m", "cProfile", "-o", os.path.join(profile_dir, f"{name}.prof"), "-m", "pubsubclub",
               "node"]  # fmt: skip
    proc = subprocess.Popen(
        [*cmd, "--name", name, "--log-level", "warn", "--no-chat-page", *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if command else None,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"node {name} did not start (exit status {proc.returncode})")
    return proc, json.loads(line)


def node_pair(
    extra: tuple[str, ...] = (), commands: tuple[list[str], list[str]] | None = None
) -> list[tuple[subprocess.Popen[str], dict[str, Any]]]:
    """Nodes A and B linked both ways on free ports, each with an operations listener; started, ready.

    ``commands`` replaces ``pubsubclub node`` for A and B (the link scenario's agents).
    """
    psc = [free_port(), free_port()]
    nodes: list[tuple[subprocess.Popen[str], dict[str, Any]]] = []
    try:
        for i, name in enumerate(("bench-a", "bench-b")):
            args = ["--wamp", local(free_port()), "--psc", local(psc[i]), "--peer", f"ws://127.0.0.1:{psc[1 - i]}/psc",
                    "--http", local(free_port()), *extra]  # fmt: skip
            nodes.append(start_node(name, args, commands[i] if commands else None))
    except BaseException:
        stop(p for p, _ in nodes)
        raise
    return nodes


def stop(procs: Any) -> None:
    """Terminate ``procs`` and wait for each.

    Their stdin pipes are closed first: an agent waiting there for its "go" (a
    reactor thread in ``readline``) would otherwise hold its reactor's shutdown,
    which joins its threads, until the kill below.
    """
    procs = list(procs)
    for p in procs:
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def stats(ops_url: str) -> dict[str, Any]:
    """A node's ``/stats`` (its operations listener's URL ends with ``/``)."""
    with urllib.request.urlopen(ops_url + "stats", timeout=5) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting until {what}")
        time.sleep(0.02)


def wait_interest(ops_url: str, topics: list[str], peers: int = 1, timeout: float = 20.0) -> None:
    """Wait until the node behind ``ops_url`` knows ``peers`` other nodes want each of ``topics``."""

    def known() -> bool:
        interest = stats(ops_url)["remote_interest"]
        return all(len(interest.get(t, ())) >= peers for t in topics)

    wait_for(f"{ops_url} knows the interest in {', '.join(topics)}", known, timeout)
