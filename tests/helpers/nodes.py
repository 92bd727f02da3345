"""The tests' one node-process launcher: ``python -m pubsubclub node`` on 127.0.0.1 (or in a namespace).

:class:`NodeProcess` starts one node and reads back what it bound; :class:`Cluster` and
:func:`start_cluster` start several that list each other as peers. Every node's log is
watched (:func:`watch_log`): the ``no_unhandled_errors_in_node_logs`` fixture of
``conftest.py`` fails the test whose nodes logged a traceback.
"""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from helpers import procfs
from helpers.polling import WAIT_SECONDS, until, wait_until
from helpers.ports import free_port
from helpers.prometheus import metric_value

REPO = Path(__file__).resolve().parent.parent.parent

#: Bearer token of the TEP operator API of nodes started with their front-ends.
OPS_TOKEN = "token of the tests' TEP operator API"

#: Seconds before a test node redials a peer (``[federation] reconnect-initial``, default 1 s).
TEST_RECONNECT_INITIAL = "0.2"

#: Log lines that mean a node hit an error nobody handled; any of them fails the test.
UNHANDLED_MARKERS = ("Unhandled Error", "Unhandled error in Deferred", "Traceback (most recent call last)")
#: Logs of the node processes started by the running test (checked after it).
_node_logs: list[Path] = []


def watch_log(path: Path) -> None:
    """Check ``path`` for unhandled errors when the running test ends."""
    _node_logs.append(path)


def take_watched_logs() -> list[Path]:
    """The logs watched since the last call (and forget them)."""
    taken = list(_node_logs)
    _node_logs.clear()
    return taken


#: Logs of nodes shared by several tests (module-scoped fixtures) and how far each was checked.
_shared_logs: dict[Path, int] = {}


def share_logs(nodes: list[NodeProcess]) -> None:
    """Check these nodes' logs after every test from now on, each time for what they logged since.

    For a module-scoped fixture: its nodes start before the test's own watch list is
    reset (higher scopes are set up first), so :func:`watch_log` alone would miss them.
    Call :func:`unshare_logs` when the fixture stops them.
    """
    for node in nodes:
        _shared_logs.setdefault(node.log_path, 0)


def shared_log_errors() -> dict[Path, list[str]]:
    """The unhandled errors the shared logs show since the last call, per log."""
    found: dict[Path, list[str]] = {}
    for path, offset in list(_shared_logs.items()):
        if not path.exists():
            continue
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read()
        # Only whole lines: the rest is read again next time.
        end = text.rfind(b"\n") + 1
        _shared_logs[path] = offset + end
        lines = text[:end].decode(errors="replace").splitlines()
        if errors := [line for line in lines if any(m in line for m in UNHANDLED_MARKERS)]:
            found[path] = errors
    return found


def unshare_logs(nodes: list[NodeProcess]) -> None:
    """Stop checking these (stopped) nodes' logs after each test; fail if they logged an unhandled error since."""
    found = {path: lines for path, lines in shared_log_errors().items() if path in {n.log_path for n in nodes}}
    for node in nodes:
        _shared_logs.pop(node.log_path, None)
    if found:
        report = "\n".join(f"{path}:\n  " + "\n  ".join(lines[:5]) for path, lines in found.items())
        raise AssertionError(f"node logs show unhandled errors:\n{report}")


def unhandled_errors(path: Path) -> list[str]:
    """The lines of ``path`` that show an unhandled error."""
    if not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if any(m in line for m in UNHANDLED_MARKERS)]


def reconnect_flags(initial: str | None, extra: tuple[str, ...]) -> list[str]:
    """``--reconnect-initial initial``, unless None or ``extra`` sets the reconnect schedule itself."""
    if initial is None or any(arg.startswith("--reconnect-") for arg in extra):
        return []
    return ["--reconnect-initial", initial]


class NodeProcess:
    """One ``python -m pubsubclub node`` process, started with fixed ports."""

    #: The address every listener binds (and clients dial).
    host = "127.0.0.1"
    #: What the command line runs under (``ip netns exec <ns>`` for a node in a namespace).
    wrapper: tuple[str, ...] = ()
    #: ``--reconnect-initial`` of test nodes: the node started first redials peers not yet listening
    #: after this, not the default second (a test that gives the flag in ``extra`` wins; None: the default).
    reconnect_initial: str | None = TEST_RECONNECT_INITIAL

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
        return f"ws://{self.host}:{self.psc_port}/psc"

    @property
    def wamp_url(self) -> str:
        """The WAMP WebSocket URL."""
        return f"ws://{self.host}:{self.wamp_port}/ws"

    @property
    def tep_url(self) -> str:
        """The TEP WebSocket URL."""
        return f"ws://{self.host}:{self.tep_port}/tep"

    @property
    def http_url(self) -> str:
        """The node's web root (the chat page)."""
        return f"http://{self.host}:{self.wamp_port}/"

    @property
    def ops_url(self) -> str:
        """The operations listener's root (/health, /stats, /metrics, /tep)."""
        return f"http://{self.host}:{self.http_port}/"

    def command(self) -> list[str]:
        """The node's command line."""

        def listen(port: int) -> str:
            return f"tcp:{port}:interface={self.host}"

        cmd = [*self.wrapper, sys.executable, "-m", "pubsubclub", "node", "--name", self.name,
               "--wamp", listen(self.wamp_port), "--psc", listen(self.psc_port), "--http", listen(self.http_port),
               "--listen-role", self.listen_role, "--log-level", "info", *self.extra]  # fmt: skip
        cmd += reconnect_flags(self.reconnect_initial, self.extra)
        if self.frontends:
            cmd += ["--nsd", listen(self.nsd_port), "--data-dir", str(self.data_dir)]
            cmd += ["--tep", listen(self.tep_port)]
            cmd += ["--stream", listen(self.stream_port)]
            self.ops_token_path.write_text(OPS_TOKEN + "\n")
            cmd += ["--tep-ops-token-file", str(self.ops_token_path)]
        for peer in self.peers:
            cmd += ["--peer", peer]
        return cmd

    def start(self) -> NodeProcess:
        """Start the process and wait for its ready line."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> NodeProcess:
        """Start the process without waiting (:meth:`wait_ready` next; :func:`start_all` starts several)."""
        log = open(self.log_path, "a")
        watch_log(self.log_path)
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO, env=self.env
        )
        log.close()
        return self

    def wait_ready(self) -> NodeProcess:
        """Wait for the ready line of the process :meth:`launch` started and read back its ports."""
        assert self.proc is not None and self.proc.stdout is not None
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
        try:
            with urllib.request.urlopen(self.ops_url + "health", timeout=5) as r:
                return r.status, dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:
            return e.code, dict(json.loads(e.read()))

    def metrics(self) -> str:
        """The node's ``/metrics`` text (Prometheus format)."""
        with urllib.request.urlopen(self.ops_url + "metrics", timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """One sample of ``/metrics`` (summed over the series that carry ``labels``; 0 when absent)."""
        return metric_value(self.metrics(), name, **labels)

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> int:
        """The process's resident memory, bytes."""
        return procfs.rss(self.pid)

    def fds(self) -> int:
        """Files the process has open."""
        return procfs.open_fds(self.pid)

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


def start_all(nodes: list[NodeProcess]) -> list[NodeProcess]:
    """Start every node at once and wait until each is ready (their start-ups overlap; on failure all are stopped)."""
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_ready()
    except BaseException:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()
                node.proc.wait()
        raise
    return nodes


def start_cluster(
    tmp_path: Path, n: int, listen_role: str = "producer", extra: tuple[str, ...] = (), frontends: bool = False
) -> Cluster:
    """Start ``n`` nodes that list each other as peers."""
    nodes = [NodeProcess(f"node{i + 1}", tmp_path, listen_role, extra, frontends) for i in range(n)]
    for node in nodes:
        node.peers = [other.psc_url for other in nodes if other is not node]
    start_all(nodes)
    return Cluster(nodes)


def assert_clean_log(node: NodeProcess) -> None:
    """Nothing went unhandled in the node (a traceback in its log is an internal error)."""
    text = node.log_path.read_text()
    assert "Traceback" not in text and "Unhandled" not in text, text[-3000:]


async def interest_reached(sender: NodeProcess, receiver: NodeProcess, topic: str) -> None:
    """Until ``sender`` knows that ``receiver`` wants ``topic``."""
    await until(lambda: receiver.name in sender.stats()["remote_interest"].get(topic, []), f"interest in {topic}")
