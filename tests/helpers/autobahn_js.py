"""Autobahn|JS's router integration suite (crossbario/autobahn-js) run against pubsubclub nodes.

Upstream's ``packages/autobahn/test/*.vitest.js`` are written for "any compliant WAMP
router on ws://127.0.0.1:8080/ws". They are not vendored here and no package registry
ships them (npm's ``autobahn`` 26.3.1 holds only ``index.js`` and ``lib/``; the older
nodeunit form in 19.4.1's tarball runs from tests/helpers/autobahn_js_npm.py), so
they come from a copy of the repository named by ``$PUBSUBCLUB_AUTOBAHN_JS`` (or found
at ``../shared/autobahn-js`` beside the checkout): a bare git directory, a clone or a
plain copy of the tree. From a git directory the pinned commit is extracted whatever its
HEAD is; a plain copy must hold exactly the pinned ``test/`` tree (checked by its git
tree id). The library the tests load is the same release from npm (``autobahn-26`` in
js/package.json, identical to ``lib/`` at that commit), vitest is pinned there too.

The runner lays out ``<dir>/autobahn/{test,index.js,lib}``, runs vitest with
tests/js/autobahn_suite.config.mjs (upstream's settings plus our setup file, which
points ``testutil.config.url`` and the RawSocket test's port 8080 at the node under
test), and reads the per-file outcome from vitest's JSON report.

Run it with ``make router-suite`` (docs/conformance.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from helpers.nodes import Cluster, NodeProcess
from helpers.ports import free_port
from pubsubclub.testing.crossbar import CrossbarProcess, router_config

REPO = Path(__file__).resolve().parent.parent.parent
JS = REPO / "js"
VITEST = JS / "node_modules" / "vitest" / "vitest.mjs"
#: The npm release whose lib/ the suite's tests load (an alias in js/package.json).
AUTOBAHN_NPM = JS / "node_modules" / "autobahn-26"
CONFIG = REPO / "tests" / "js" / "autobahn_suite.config.mjs"
SETUP = REPO / "tests" / "js" / "autobahn_suite.setup.js"

#: Where the suite is looked for: this variable, else ``../shared/autobahn-js``, else the fetch snapshot.
SOURCE_ENV = "PUBSUBCLUB_AUTOBAHN_JS"
#: Set (to anything but "" or "0") to fail instead of skipping when no copy is found.
REQUIRED_ENV = "PUBSUBCLUB_AUTOBAHN_JS_REQUIRED"

#: crossbario/autobahn-js tag v26.3.1, the release of npm's autobahn 26.3.1.
SUITE_COMMIT = "e7b2477d3dcde9029490d6b9a0c4efe8d86741c2"
#: Git tree id of ``packages/autobahn/test`` at SUITE_COMMIT.
SUITE_TEST_TREE = "6735b24ec3e86185a597a6beb4a6767650d19a4f"
SUITE_TEST_PATH = "packages/autobahn/test"

#: The router files: every ``*.vitest.js`` of SUITE_COMMIT except the five unit files
#: that need no router (test_basic_async, test_basic_sync, test_rawsocket_protocol,
#: test_sealedbox, test_util_is_object) and test_binary, which needs a second
#: WebSocket transport on port 8090 and the Python backend of upstream's CI
#: (``.crossbar/backend.py``'s ``any.echo``).
ROUTER_FILES = (
    "test_connect",
    "test_error_handling",
    "test_pubsub_basic",
    "test_pubsub_complex",
    "test_pubsub_eligible",
    "test_pubsub_exclude",
    "test_pubsub_excludeme",
    "test_pubsub_multiple_matching_subs",
    "test_pubsub_options",
    "test_pubsub_prefix_sub",
    "test_pubsub_wildcard_sub",
    "test_rawsocket_transport",
    "test_rpc_arguments",
    "test_rpc_complex",
    "test_rpc_error",
    "test_rpc_options",
    "test_rpc_progress",
    "test_rpc_request_id_sequence",
    "test_rpc_routing",
    "test_rpc_slowsquare",
    "test_serialization_cbor",
    "test_serialization_json",
    "test_serialization_msgpack",
)

#: The per-test timeout tests/js/autobahn_suite.config.mjs sets (upstream: 30 s).
TEST_TIMEOUT_S = 15

#: Bound on one vitest run (23 files, each test bounded by the suite's 30 s timeout).
RUN_TIMEOUT = 300.0


def suite_source() -> Path | None:
    """The copy of crossbario/autobahn-js to take the suite from, or None."""
    named = os.environ.get(SOURCE_ENV, "")
    if named:
        return Path(named)
    # A copy beside the checkout, or the snapshot a session's fetch tool leaves
    # (github:crossbario/autobahn-js, a bare git directory).
    for beside in (REPO.parent / "shared" / "autobahn-js", REPO.parent / ".mirror" / "crossbario+autobahn-js" / "repo"):
        if beside.exists():
            return beside
    return None


def suite_required() -> bool:
    """Whether a missing suite is a failure rather than a skip."""
    return os.environ.get(REQUIRED_ENV, "") not in ("", "0")


def _git_dir(source: Path) -> Path | None:
    """``source``'s git directory when it is a bare repository or a clone."""
    if (source / "objects").is_dir() and (source / "HEAD").is_file():
        return source
    if (source / ".git").exists():
        return source / ".git"
    return None


def tree_id(directory: Path) -> str:
    """Git's tree id of a flat directory of regular files (mode 100644, as upstream's test/ is)."""
    entries = b""
    for path in sorted(directory.iterdir(), key=lambda p: p.name.encode()):
        if not path.is_file():
            raise ValueError(f"{path}: the suite's test/ holds only files")
        data = path.read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).digest()
        entries += b"100644 " + path.name.encode() + b"\0" + blob
    return hashlib.sha1(b"tree %d\0" % len(entries) + entries).hexdigest()


def extract_tests(source: Path, dest: Path) -> None:
    """Put the pinned ``packages/autobahn/test`` of ``source`` into ``dest`` (which must not exist)."""
    git_dir = _git_dir(source)
    if git_dir is not None:
        archive = subprocess.run(
            ["git", "--git-dir", str(git_dir), "archive", "--format=tar", SUITE_COMMIT, SUITE_TEST_PATH],
            capture_output=True,
            check=False,
            timeout=60,
        )
        if archive.returncode != 0:
            error = archive.stderr.decode(errors="replace")
            raise AssertionError(f"{source}: cannot extract {SUITE_TEST_PATH} at {SUITE_COMMIT}: {error}")
        dest.mkdir(parents=True)
        prefix = SUITE_TEST_PATH + "/"
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith(prefix) and "/" not in member.name[len(prefix) :]:
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    (dest / member.name[len(prefix) :]).write_bytes(extracted.read())
    else:
        tests = source / SUITE_TEST_PATH if (source / SUITE_TEST_PATH).is_dir() else source
        shutil.copytree(tests, dest)
    found = tree_id(dest)
    if found != SUITE_TEST_TREE:
        raise AssertionError(
            f"{source}: {SUITE_TEST_PATH} has tree {found}, not {SUITE_TEST_TREE} (autobahn-js {SUITE_COMMIT})"
        )


def prepare(source: Path, work: Path) -> Path:
    """Lay out ``work/autobahn`` (the suite's test/ beside npm's index.js and lib/); returns that root."""
    if not VITEST.exists() or not AUTOBAHN_NPM.exists():
        raise AssertionError(f"{VITEST} or {AUTOBAHN_NPM} missing: run `make js` (cd js && npm ci)")
    root = work / "autobahn"
    extract_tests(source, root / "test")
    # Symlinks: node resolves them to js/node_modules/autobahn-26, so lib/ finds its own dependencies.
    (root / "index.js").symlink_to(AUTOBAHN_NPM / "index.js")
    (root / "lib").symlink_to(AUTOBAHN_NPM / "lib")
    return root


@dataclass
class FileResult:
    """One suite file's outcome."""

    passed: bool
    #: The first failure's message (first lines), "" when passed.
    failure: str


def node_env() -> dict[str, str]:
    """Environment for vitest: dependencies from js/, and WebSocket on Node 20 (a flag before 22)."""
    env = dict(os.environ)
    env["NODE_PATH"] = str(JS / "node_modules")
    version = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    if int(version.strip().lstrip("v").split(".")[0]) < 22:
        env["NODE_OPTIONS"] = (env.get("NODE_OPTIONS", "") + " --experimental-websocket").strip()
    return env


def suite_env(root: Path, url: str, rawsocket_port: int) -> dict[str, str]:
    """node_env() plus what the setup file reads: the suite's root, the router's URL and RawSocket port."""
    env = node_env()
    env.update(
        PUBSUBCLUB_SUITE_ROOT=str(root),
        PUBSUBCLUB_SUITE_URL=url,
        PUBSUBCLUB_SUITE_RAWSOCKET_PORT=str(rawsocket_port),
        PUBSUBCLUB_SUITE_SETUP=str(SETUP),
    )
    return env


def run_suite(root: Path, url: str, rawsocket_port: int, report: Path) -> dict[str, FileResult]:
    """Run the router files against ``url`` and ``rawsocket_port``; the outcome of each file.

    vitest's output (verbose reporter) goes to ``report`` with the suffix ``.log``.
    """
    env = suite_env(root, url, rawsocket_port)
    cmd = [
        "node",
        str(VITEST),
        "run",
        "--config",
        str(CONFIG),
        "--root",
        str(root),
        "--reporter=verbose",
        "--reporter=json",
        f"--outputFile.json={report}",
        *(f"test/{name}.vitest.js" for name in ROUTER_FILES),
    ]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=RUN_TIMEOUT)
    report.with_suffix(".log").write_text(proc.stdout + proc.stderr)
    if not report.exists():
        output = proc.stdout[-3000:] + "\n" + proc.stderr[-3000:]
        raise AssertionError(f"vitest wrote no report (exit {proc.returncode}):\n{output}")
    results = parse_report(json.loads(report.read_text()))
    add_testlog_mismatches(results, root.parent / "testlog")
    return results


def parse_report(report: dict[str, object]) -> dict[str, FileResult]:
    """Per-file outcome from vitest's JSON report (file name without ``.vitest.js``)."""
    results: dict[str, FileResult] = {}
    test_results = report.get("testResults")
    assert isinstance(test_results, list)
    for file in test_results:
        name = Path(file["name"]).name.removesuffix(".vitest.js")
        assertions = file.get("assertionResults", [])
        failures = [
            f"{a.get('title')}: {' '.join(a.get('failureMessages') or [])}"
            for a in assertions
            if a.get("status") not in ("passed", "skipped", "pending", "todo")
        ]
        if not failures and file.get("status") != "passed":
            failures = [file.get("message") or f"file status {file.get('status')}"]
        passed = not failures and any(a.get("status") == "passed" for a in assertions)
        first = failures[0] if failures else ("no test passed" if not passed else "")
        # vitest's JSON report words a test timeout as this placeholder.
        first = first.replace("Error: STACK_TRACE_ERROR", f"timed out (no answer within {TEST_TIMEOUT_S} s)")
        results[name] = FileResult(passed, "\n".join(first.splitlines()[:3])[:500])
    return results


def add_testlog_mismatches(results: dict[str, FileResult], kept: Path) -> None:
    """Append the Testlog mismatches the setup file kept to the failures of their files."""
    if not kept.is_dir():
        return
    for path in sorted(kept.iterdir()):
        for name, result in results.items():
            if not result.passed and path.stem.startswith(name):
                result.failure += f"\n{path.stem}:{path.read_text()[:3000]}"


def rawsocket_node(name: str, log_dir: Path) -> NodeProcess:
    """A node for the suite: it also serves WAMP over RawSocket (on a port chosen here)."""
    node = NodeProcess(name, log_dir, extra=("--rawsocket", f"tcp:{free_port()}:interface=127.0.0.1"))
    node.extra += ("--wamp-await-interest",)
    return node


def rawsocket_port(node: NodeProcess) -> int:
    """The node's RawSocket port, from its ready line (rs://127.0.0.1:PORT)."""
    return int(node.ready["rawsocket"].rsplit(":", 1)[1])


def linked_pair(log_dir: Path, started: list[NodeProcess]) -> tuple[NodeProcess, NodeProcess]:
    """Two suite nodes linked to each other, started (and added to ``started``, for the caller to stop)."""
    a, b = rawsocket_node("a", log_dir), rawsocket_node("b", log_dir)
    a.peers, b.peers = [b.psc_url], [a.psc_url]
    started += [a, b]
    a.start()
    b.start()
    Cluster([a, b]).wait_linked()
    return a, b


@contextmanager
def alternating(a: NodeProcess, b: NodeProcess) -> Iterator[tuple[str, int]]:
    """A WebSocket URL and a RawSocket port whose connections go to ``a`` and ``b`` in turn.

    On a normal exit it asserts that both nodes got connections of each kind.
    """
    ws = RoundRobinProxy([a.wamp_port, b.wamp_port]).start()
    rs = RoundRobinProxy([rawsocket_port(a), rawsocket_port(b)]).start()
    try:
        yield f"ws://127.0.0.1:{ws.port}/ws", rs.port
    finally:
        ws.stop()
        rs.stop()
    assert min(ws.counts) > 0 and min(rs.counts) > 0, f"connections did not alternate: ws {ws.counts}, rs {rs.counts}"


def start_crossbar(log_dir: Path) -> tuple[CrossbarProcess, int]:
    """Crossbar.io started as upstream's CI configures it (CBOR, MessagePack, JSON); it and its RawSocket port."""
    port, raw_port = free_port(), free_port()
    config = router_config(port, rawsocket_port=raw_port)
    for transport in config["workers"][0]["transports"]:
        where = transport["paths"]["ws"] if transport["type"] == "web" else transport
        where["serializers"] = ["cbor", "msgpack", "json"]
    return CrossbarProcess(log_dir, port, config).start(), raw_port


class RoundRobinProxy:
    """A TCP proxy on 127.0.0.1 that sends its k-th accepted connection to ``backends[k % n]``.

    It runs an asyncio loop on its own thread, so the blocking test can use it while
    vitest runs; ``counts`` says how many connections each backend got.
    """

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.counts = [0] * len(backends)
        self.port = 0
        self._accepted = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="round-robin-proxy", daemon=True)

    def start(self) -> RoundRobinProxy:
        """Listen (port read back into ``port``) and serve from the proxy's thread."""
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread.start()
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self._accepted % len(self.backends)
        self._accepted += 1
        self.counts[index] += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.backends[index])
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        """Close the listener and every proxied connection, and end the thread."""

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
