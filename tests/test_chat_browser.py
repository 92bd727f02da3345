"""The chat page in headless Chromium: a message typed on node 1's page shows up on node 2's page."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, WAIT_SECONDS, Cluster, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHAT_BROWSER_JS = REPO / "tests" / "js" / "chat_browser.js"
WAMP_CLIENT_JS = REPO / "tests" / "js" / "wamp_client.js"
#: The topic of pubsubclub/static/chat.js.
CHAT_TOPIC = "pubsubclub.demo.chat"
#: chat_browser.js's own per-step timeout; the process gets a generous bound on top.
PAGE_TIMEOUT = 20


def test_chat_message_crosses_nodes_in_the_browser(cluster_factory: Callable[..., Cluster], tmp_path: Path) -> None:
    """chat_browser.js sends from node 1's page and sees the message on node 2's page (and on node 1's)."""
    chromium = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    if not os.access(chromium, os.X_OK):
        pytest.fail(f"{chromium} is missing: install Debian's chromium (`make browser`, part of `make test`)")
    node = shutil.which("node")
    if node is None:
        pytest.fail("node (Node.js) is not on PATH: the browser test drives Chromium from it")

    cluster = cluster_factory(2)
    cluster.wait_linked()
    # A subscriber already on node 2 makes node 1 forward the chat topic before page A
    # publishes, so the test does not race page B's subscription across the link.
    watcher = subprocess.Popen(
        [
            node,
            str(WAMP_CLIENT_JS),
            "--url",
            cluster[1].wamp_url,
            "subscribe",
            "--topic",
            CHAT_TOPIC,
            "--count",
            "1",
            "--timeout",
            str(3 * PAGE_TIMEOUT),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert watcher.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(watcher.stdout, selectors.EVENT_READ)
            ready = watcher.stdout.readline() if sel.select(WAIT_SECONDS) else ""
        if json.loads(ready or "{}") != {"ready": True}:
            watcher.kill()
            pytest.fail(f"JS subscriber on node 2 not ready: {ready!r} {watcher.communicate()[1]}")
        wait_until(lambda: "node2" in cluster[0].stats()["remote_interest"].get(CHAT_TOPIC, []), "chat interest")

        screenshot = tmp_path / "b.png"
        try:
            run = subprocess.run(
                [
                    node,
                    str(CHAT_BROWSER_JS),
                    cluster[0].http_url,
                    cluster[1].http_url,
                    "--screenshot",
                    str(screenshot),
                    "--timeout",
                    str(PAGE_TIMEOUT),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=3 * PAGE_TIMEOUT + WAIT_SECONDS,
            )
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"chat_browser.js did not finish: stdout={e.stdout!r} stderr={e.stderr!r}")
        lines = [line for line in run.stdout.splitlines() if line.strip()]
        assert lines, f"chat_browser.js printed nothing (rc={run.returncode}); stderr: {run.stderr}"
        result = json.loads(lines[-1])
        assert run.returncode == 0 and result["ok"] is True, result
        assert result["seen_on_b"].startswith("alice: hello from A"), result
        assert result["seen_on_a"] == result["seen_on_b"], result
        assert screenshot.stat().st_size > 0

        out, err = watcher.communicate(timeout=WAIT_SECONDS)
        assert watcher.returncode == 0, err
        event = json.loads(out.splitlines()[0])
        assert event["args"][0]["nick"] == "alice" and event["args"][0]["text"] in result["seen_on_b"], event
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
