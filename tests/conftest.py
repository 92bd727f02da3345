"""Shared fixtures: real ``pubsubclub node`` processes on 127.0.0.1 and WAMP clients."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from hypothesis import settings

# Tests never assert on speed: Hypothesis's per-example deadline (200 ms) is such an
# assertion, and it failed property tests on a loaded machine. Examples stay bounded
# by their count and by pytest-timeout.
settings.register_profile("pubsubclub", deadline=None)
settings.load_profile("pubsubclub")

#: The session-scoped local ``spark`` fixture for the report tests.
pytest_plugins = ["report_spark"]

REPO = Path(__file__).resolve().parent.parent
#: Upper bound for any single wait on a node (start, a condition, a process exit).
WAIT_SECONDS = 20.0

#: Log lines that mean a node hit an error nobody handled; any of them fails the test.
UNHANDLED_MARKERS = ("Unhandled Error", "Unhandled error in Deferred", "Traceback (most recent call last)")
#: Logs of the node processes started by the running test (checked after it).
_node_logs: list[Path] = []


def watch_log(path: Path) -> None:
    """Check ``path`` for unhandled errors when the running test ends."""
    _node_logs.append(path)


def unhandled_errors(path: Path) -> list[str]:
    """The lines of ``path`` that show an unhandled error."""
    if not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if any(m in line for m in UNHANDLED_MARKERS)]


@pytest.fixture(autouse=True)
def no_unhandled_errors_in_node_logs() -> Iterator[None]:
    """Fail any test whose node processes logged an unhandled error (a traceback)."""
    _node_logs.clear()
    yield
    found = {str(path): lines for path in _node_logs if (lines := unhandled_errors(path))}
    _node_logs.clear()
    if found:
        report = "\n".join(f"{path}:\n  " + "\n  ".join(lines[:5]) for path, lines in found.items())
        pytest.fail(f"node logs show unhandled errors:\n{report}", pytrace=False)


#: Ports handed to test listeners come from below the kernel's ephemeral range
#: (``net.ipv4.ip_local_port_range``, 32768-60999 by default). A port the kernel
#: picked for ``bind(0)`` and we released can be taken again by any outgoing
#: connection before the node binds it (CI saw exactly that: "Address already in
#: use"); ports below the range are never auto-assigned, so only an explicit bind
#: can race us. Each pytest process starts at its own place in the range, and each
#: pytest-xdist worker of a run keeps to its own share of it (`make test` runs
#: two), so the workers of one run never hand out the same port.
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


#: Bearer token of the TEP operator API of nodes started with their front-ends.
OPS_TOKEN = "token of the tests' TEP operator API"


class NodeProcess:
    """One ``python -m pubsubclub node`` process, started with fixed ports."""

    def __init__(
        self,
        name: str,
        log_dir: Path,
        listen_role: str = "producer",
        extra: tuple[str, ...] = (),
        frontends: bool = False,
    ) -> None:
        self.name = name
        #: Also serve NSD and TEP (their replication topics show up in PSC traffic).
        self.frontends = frontends
        # Client and ops listeners bind port 0 and the bound port is read back
        # from the ready line (start()); only the PSC port is chosen up front,
        # because peers must be told it before the node starts.
        self.wamp_port = 0
        self.psc_port = free_port()
        self.listen_role = listen_role
        self.extra = extra
        self.peers: list[str] = []
        self.http_port = 0
        self.nsd_port = 0
        self.tep_port = 0
        self.stream_port = 0
        self.data_dir = log_dir / f"{name}-data"
        #: Bearer token file of the TEP operator API (written when the front-ends are on).
        self.ops_token_path = log_dir / f"{name}-ops-token"
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] = {}
        #: The process's environment (None: this one's).
        self.env: dict[str, str] | None = None

    @property
    def psc_url(self) -> str:
        """The PSC URL other nodes dial."""
        return f"ws://127.0.0.1:{self.psc_port}/psc"

    @property
    def wamp_url(self) -> str:
        """The WAMP WebSocket URL."""
        return f"ws://127.0.0.1:{self.wamp_port}/ws"

    @property
    def tep_url(self) -> str:
        """The TEP WebSocket URL."""
        return f"ws://127.0.0.1:{self.tep_port}/tep"

    @property
    def http_url(self) -> str:
        """The node's web root (the chat page)."""
        return f"http://127.0.0.1:{self.wamp_port}/"

    @property
    def ops_url(self) -> str:
        """The operations listener's root (/health, /stats, /metrics, /tep)."""
        return f"http://127.0.0.1:{self.http_port}/"

    def command(self) -> list[str]:
        """The node's command line."""
        cmd = [
            sys.executable,
            "-m",
            "pubsubclub",
            "node",
            "--name",
            self.name,
            "--wamp",
            f"tcp:{self.wamp_port}:interface=127.0.0.1",
            "--psc",
            f"tcp:{self.psc_port}:interface=127.0.0.1",
            "--http",
            f"tcp:{self.http_port}:interface=127.0.0.1",
            "--listen-role",
            self.listen_role,
            "--log-level",
            "info",
            *self.extra,
        ]
        if self.frontends:
            cmd += ["--nsd", f"tcp:{self.nsd_port}:interface=127.0.0.1", "--data-dir", str(self.data_dir)]
            cmd += ["--tep", f"tcp:{self.tep_port}:interface=127.0.0.1"]
            cmd += ["--stream", f"tcp:{self.stream_port}:interface=127.0.0.1"]
            self.ops_token_path.write_text(OPS_TOKEN + "\n")
            cmd += ["--tep-ops-token-file", str(self.ops_token_path)]
        for peer in self.peers:
            cmd += ["--peer", peer]
        return cmd

    def start(self) -> NodeProcess:
        """Start the process and wait for its ready line."""
        log = open(self.log_path, "a")
        watch_log(self.log_path)
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO, env=self.env
        )
        log.close()
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(WAIT_SECONDS):
            raise AssertionError(f"{self.name} did not get ready; log:\n{self.log_path.read_text()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"{self.name} exited during start; log:\n{self.log_path.read_text()}")
        self.ready = json.loads(line)
        self._read_back_ports()
        return self

    def _read_back_ports(self) -> None:
        """The ports the node bound (it was given port 0), from its ready line."""
        ready = self.ready

        def port(key: str) -> int:
            return int(ready[key].rsplit(":", 1)[1].split("/", 1)[0])

        self.wamp_port = port("wamp")
        if "ops" in ready:
            self.http_port = port("ops")
        for key in ("nsd", "tep", "stream"):
            if key in ready:
                setattr(self, f"{key}_port", port(key))

    def stats(self) -> dict[str, Any]:
        """The node's /stats JSON (from the operations listener; the WAMP listener does not serve it)."""
        with urllib.request.urlopen(self.ops_url + "stats", timeout=5) as r:
            return dict(json.loads(r.read()))

    def health(self) -> tuple[int, dict[str, Any]]:
        """Status code and JSON body of ``GET /health``."""
        import urllib.error

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/health", timeout=5) as r:
                return r.status, dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:
            return e.code, dict(json.loads(e.read()))

    def kill(self) -> None:
        """``kill -9``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT_SECONDS)

    def stop(self) -> int | None:
        """SIGTERM and wait."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} ignored SIGTERM") from None


class Cluster:
    """N nodes with static discovery (every node lists every other)."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.nodes = nodes

    def __getitem__(self, i: int) -> NodeProcess:
        return self.nodes[i]

    def meshed(self) -> bool:
        """Whether every node has an open link in each direction with every other node."""
        n = len(self.nodes)
        return all(
            sum(1 for link in node.stats()["links"] if link["state"] == "open") == 2 * (n - 1) for node in self.nodes
        )

    def wait_linked(self) -> None:
        """Until :meth:`meshed` (blocking: for tests that do not run on the reactor)."""
        wait_until(self.meshed, "full mesh of open links")

    async def linked(self) -> None:
        """Until :meth:`meshed`, polling with the reactor (for tests that run on it)."""
        await until(self.meshed, "full mesh of open links")


async def until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    """:func:`wait_until` for tests that run on the reactor: polls with the reactor, never blocks it."""
    from twisted.internet import reactor, task

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await task.deferLater(reactor, 0.02, lambda: None)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    """Poll a node-side condition (over /stats) until it holds; fail after ``timeout``.

    Blocking is deliberate: the condition lives in other processes, and the
    bound keeps a broken node from hanging the suite.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start_cluster(
    tmp_path: Path, n: int, listen_role: str = "producer", extra: tuple[str, ...] = (), frontends: bool = False
) -> Cluster:
    """Start ``n`` nodes that list each other as peers."""
    nodes = [NodeProcess(f"node{i + 1}", tmp_path, listen_role, extra, frontends) for i in range(n)]
    for node in nodes:
        node.peers = [other.psc_url for other in nodes if other is not node]
    for node in nodes:
        node.start()
    return Cluster(nodes)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start clusters; every node is stopped at the end of the test."""
    started: list[Cluster] = []

    def make(
        n: int = 3, listen_role: str = "producer", extra: tuple[str, ...] = (), frontends: bool = False
    ) -> Cluster:
        cluster = start_cluster(tmp_path, n, listen_role, extra, frontends)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        for node in cluster.nodes:
            node.stop()


@pytest.fixture
def node_env() -> dict[str, str]:
    """Environment for child processes."""
    return dict(os.environ)


@pytest_twisted.async_yield_fixture
async def double() -> AsyncIterator[Any]:
    """An in-process Consul double on a free port, without jitter on waits or HTTP-check stagger."""
    from pubsubclub.testing import ConsulDouble

    d = ConsulDouble(rand=lambda: 0.0)
    await d.listen()
    yield d
    await d.stop()
    d.shutdown()
