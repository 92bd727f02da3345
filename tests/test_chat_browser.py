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
from helpers.nodes import REPO, Cluster
from helpers.polling import WAIT_SECONDS, wait_until

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


def test_the_c_clients_message_shows_up_in_a_chat_page_on_another_node(tmp_path: Path) -> None:
    """As in the demo: the C client on node 1's SysV queue, channel chat (prefix pubsubclub.demo.), node 2's page."""
    import random

    from helpers.nodes import NodeProcess

    chromium = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
    node = shutil.which("node")
    if not os.access(chromium, os.X_OK) or node is None:
        pytest.fail("chromium and node are needed (make test installs them)")
    c_client = tmp_path / "client"
    subprocess.run(
        ["gcc", "-std=c11", "-O2", "-o", str(c_client), str(REPO / "examples" / "sysv" / "client.c")], check=True
    )
    key = random.randint(0x10000000, 0x7FFFFFF0)
    one = NodeProcess("node1", tmp_path, extra=("--sysv", hex(key), "--sysv-prefix", "pubsubclub.demo."))
    two = NodeProcess("node2", tmp_path)
    one.peers, two.peers = [two.psc_url], [one.psc_url]
    cluster = Cluster([one.start(), two.start()])
    page = None
    try:
        cluster.wait_linked()
        text = f"hello from C {random.randint(0, 10**9)}"
        page = subprocess.Popen(
            [node, str(CHAT_BROWSER_JS), "--watch", two.http_url, "--text", text, "--timeout", str(PAGE_TIMEOUT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )  # fmt: skip
        assert page.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(page.stdout, selectors.EVENT_READ)
            first = page.stdout.readline() if sel.select(3 * PAGE_TIMEOUT) else ""
        assert json.loads(first or "{}") == {"connected": True}, (first, page.stderr.read() if page.stderr else "")
        wait_until(lambda: "node2" in one.stats()["remote_interest"].get(CHAT_TOPIC, []), "the page's interest")
        script = f"connect\nlogin democ\nregister chat\nsend chat {text}\nquit\n"
        said = subprocess.run([str(c_client), hex(key)], input=script, capture_output=True, text=True, timeout=30)
        assert "reply OPERATION_SUCCESS" in said.stdout, said.stdout
        out, err = page.communicate(timeout=3 * PAGE_TIMEOUT + WAIT_SECONDS)
        result = json.loads(out.splitlines()[-1])
        assert page.returncode == 0 and result["ok"] is True, (result, err)
        assert result["seen"] == f"·: [chat] [democ]: {text}", result  # as text, not as a JSON dump
    finally:
        if page is not None and page.poll() is None:
            page.kill()
            page.wait()
        for n in cluster.nodes:
            n.stop()
        try:
            import sysv_ipc

            sysv_ipc.MessageQueue(key).remove()
        except Exception:  # already gone
            pass
