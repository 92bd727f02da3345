"""Cross-implementation WAMP: autobahn-js under node and Autobahn-Python on different nodes of a cluster."""

from __future__ import annotations

import json
import selectors
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from helpers.nodes import REPO, Cluster
from helpers.polling import WAIT_SECONDS, until
from helpers.wampclient import connect, leave, publish_acked, subscribe

pytestmark = pytest.mark.slow

WAMP_CLIENT_JS = REPO / "tests" / "js" / "wamp_client.js"
TOPIC = "com.example.js"
COUNT = 5
#: The JS client's own timeout (it exits 1 after it); the test waits a little longer.
JS_TIMEOUT = 20


def node_binary() -> str:
    """The ``node`` executable; a missing one is a broken test environment, not a skip."""
    path = shutil.which("node")
    if path is None:
        pytest.fail("node (Node.js) is not on PATH: the JS client tests need it (see the Makefile's js target)")
    return path


def js_client(url: str, command: str, topic: str, count: int) -> subprocess.Popen[str]:
    """Start ``tests/js/wamp_client.js``; stdout is a pipe of JSON lines."""
    return subprocess.Popen(
        [
            node_binary(),
            str(WAMP_CLIENT_JS),
            "--url",
            url,
            command,
            "--topic",
            topic,
            "--count",
            str(count),
            "--timeout",
            str(JS_TIMEOUT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def read_line(proc: subprocess.Popen[str], timeout: float = WAIT_SECONDS) -> dict[str, Any]:
    """The next JSON line the JS client prints, within ``timeout``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            raise AssertionError(f"no output from the JS client within {timeout} s; stderr: {proc.communicate()[1]}")
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the JS client exited early (rc={proc.wait()}); stderr: {proc.communicate()[1]}")
    return dict(json.loads(line))


def finish(proc: subprocess.Popen[str]) -> tuple[int, list[dict[str, Any]], str]:
    """Wait for the JS client to exit: its exit code, remaining stdout lines and stderr."""
    try:
        out, err = proc.communicate(timeout=JS_TIMEOUT + 5)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.strip()], err


def interest_of(node: Any, topic: str) -> list[str]:
    """Which peer nodes asked ``node`` for ``topic``."""
    return list(node.stats()["remote_interest"].get(topic, []))


@pytest_twisted.ensureDeferred
async def test_python_publisher_to_js_subscriber(cluster_factory: Callable[..., Cluster]) -> None:
    """Autobahn-Python publishes on node 1; an autobahn-js subscriber on node 2 gets all, in order."""
    cluster = cluster_factory(2)
    await cluster.linked()
    js = js_client(cluster[1].wamp_url, "subscribe", TOPIC, COUNT)
    try:
        assert read_line(js) == {"ready": True}
        await until(lambda: interest_of(cluster[0], TOPIC) == ["node2"], "node1 to learn node2's interest")
        pub = await connect(cluster[0].wamp_url)
        for i in range(COUNT):
            await publish_acked(pub, TOPIC, {"i": i, "from": "python"})
        rc, lines, err = finish(js)
    finally:
        if js.poll() is None:
            js.kill()
            js.wait()
    assert rc == 0, err
    assert lines == [{"args": [{"i": i, "from": "python"}], "kwargs": {}} for i in range(COUNT)]
    await leave(pub)


@pytest_twisted.ensureDeferred
async def test_js_publisher_to_python_subscriber(cluster_factory: Callable[..., Cluster]) -> None:
    """An autobahn-js client publishes on node 1; an Autobahn-Python subscriber on node 2 gets all, in order."""
    cluster = cluster_factory(2)
    await cluster.linked()
    sub = await connect(cluster[1].wamp_url)
    rec, _ = await subscribe(sub, TOPIC)
    await until(lambda: interest_of(cluster[0], TOPIC) == ["node2"], "node1 to learn node2's interest")
    # Blocking the reactor here is fine: the events wait in the socket until it runs again.
    rc, lines, err = finish(js_client(cluster[0].wamp_url, "publish", TOPIC, COUNT))
    assert rc == 0, err
    assert lines == [{"published": COUNT}]
    await rec.wait_for(COUNT)
    assert rec.events == [(({"i": i},), {}) for i in range(COUNT)]
    await leave(sub)
