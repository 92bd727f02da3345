"""The examples users copy from: the SysV C client's command line, the stream client, the Crossbar config."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sysv_ipc
from helpers.nodes import REPO, NodeProcess
from helpers.polling import WAIT_SECONDS
from helpers.ports import free_port

from pubsubclub.testing import crossbar


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


STREAM_CLIENT = REPO / "examples" / "stream" / "client.py"


def stream_client(node: NodeProcess, *args: str) -> list[str]:
    """Run examples/stream/client.py against ``node``; its stdout lines (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, str(STREAM_CLIENT), "--server", f"127.0.0.1:{node.stream_port}", *args],
        capture_output=True, text=True, timeout=WAIT_SECONDS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def stream_node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One node with its stream listener (and the other front-ends)."""
    node = NodeProcess("stream1", tmp_path, frontends=True).start()
    yield node
    node.stop()


def test_stream_client_publishes_subscribes_from_offsets_and_commits(stream_node: NodeProcess) -> None:
    """The example publishes (acknowledged), reads from earliest and from a sequence, and resumes after a commit."""
    topic = "examples.orders"
    assert stream_client(stream_node, "publish", topic, "first", "second\nline", "third") == [f"published {topic}"] * 3
    everything = ["0\tfirst", "1\tsecond\\nline", "2\tthird"]
    assert stream_client(stream_node, "subscribe", topic, "--from", "earliest", "--count", "3") == everything
    assert stream_client(stream_node, "subscribe", topic, "--from", "1", "--count", "2") == everything[1:]
    # --commit: group "billing" processed 0 and 1, so "current" resumes at 2.
    args = ("--group", "billing", "subscribe", topic, "--from", "current")
    assert stream_client(stream_node, *args, "--count", "2", "--commit") == everything[:2]
    assert stream_client(stream_node, *args, "--count", "1") == everything[2:]
    # commit: another group skips to after 0.
    assert stream_client(stream_node, "--group", "audit", "commit", topic, "0") == [f"committed {topic} 0"]
    audit = stream_client(stream_node, "--group", "audit", "subscribe", topic, "--from", "current", "--count", "2")
    assert audit == everything[1:]


def test_stream_client_help_and_errors_say_what_to_do(stream_node: NodeProcess) -> None:
    """--help lists the commands; a $ topic: the node's ERROR on stderr, exit 1; no listener: exit 1 naming --stream."""
    done = subprocess.run([sys.executable, str(STREAM_CLIENT), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and all(c in done.stdout for c in ("publish", "subscribe", "commit"))
    server = f"127.0.0.1:{stream_node.stream_port}"
    bad = subprocess.run(
        [sys.executable, str(STREAM_CLIENT), "--server", server, "publish", "$sys", "x"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.startswith("error 400 "), bad.stderr
    closed = subprocess.run(
        [sys.executable, str(STREAM_CLIENT), "--server", f"127.0.0.1:{free_port()}", "publish", "t", "x"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert closed.returncode == 1 and "is the node running with --stream?" in closed.stderr


def test_crossbar_example_config_is_what_the_bridge_tests_run() -> None:
    """examples/crossbar/config.json equals the config the bridge tests give Crossbar, but for their free port."""
    example = json.loads((REPO / "examples" / "crossbar" / "config.json").read_text())
    assert example == crossbar.example_config()
    # What CrossbarProcess writes for a test router on some port, with the port put back to 8080.
    tested = crossbar.CrossbarProcess(node_dir=Path("unused"), port=18080).config
    [web] = [t for t in tested["workers"][0]["transports"] if t["type"] == "web"]
    assert web["endpoint"]["port"] == 18080
    web["endpoint"]["port"] = 8080
    assert example == tested


def test_bridge_doc_points_to_the_example_and_drops_the_json_root_claim() -> None:
    """docs/bridge.md names examples/crossbar/config.json and no longer says `/` serves a JSON document."""
    text = (REPO / "docs" / "bridge.md").read_text()
    assert "examples/crossbar/config.json" in text
    assert "serves a small JSON document" not in text and "`/` answers 404" in text


def test_readme_quick_start_and_operator_paths() -> None:
    """README keeps `make demo`/`make test` as the quick start and names the pip path, ports, stand-in and examples."""
    text = (REPO / "README.md").read_text()
    start = text.index("## Quick start")
    block = text[text.index("```sh\n", start) + 6 : text.index("```", text.index("```sh\n", start) + 6)]
    assert [line.split()[:2] for line in block.splitlines()] == [["make", "demo"], ["make", "test"]]
    for needed in ("pip install .", "'.[report]'", "pubsubclub cluster --nodes 3 --wamp-base-port", "ipcrm -Q"):
        assert needed in text, needed
    demo = (REPO / "examples" / "demo.py").read_text()
    for variable in ("DEMO_WAMP_PORT", "DEMO_PSC_PORT", "DEMO_NSD_PORT", "DEMO_TEP_PORT", "DEMO_STREAM_PORT",
                     "DEMO_HTTP_PORT", "DEMO_SYSV_KEY", "DEMO_DATA_DIR"):  # fmt: skip
        assert f'"{variable}"' in demo and f"`{variable}" in text, variable
    assert "python -m pubsubclub.testing.consul_agent" in text
    for path in ("examples/stream/client.py", "examples/crossbar/config.json", "examples/sysv/client.c"):
        assert path in text or path.removesuffix(".c") in text, path
        assert (REPO / path).is_file(), path
