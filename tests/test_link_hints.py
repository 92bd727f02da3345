"""Link failures that say what to do: the hint per reason, and "ready, K of N peers reachable" (issue 21)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.nodes import NodeProcess
from helpers.polling import wait_until
from helpers.ports import free_port

from pubsubclub.federation.hints import link_failure_hint


@pytest.mark.parametrize(
    ("reason", "url", "hint"),
    [
        ("WebSocket connection upgrade failed [404]: Not Found", "ws://h:1/", "is the path /psc?"),
        (
            "WebSocket connection upgrade failed [400]: This server only speaks WebSocket subprotocols wamp.2.json",
            "ws://h:1/ws",
            "that looks like a WAMP port, not a PSC port",
        ),
        ("Connection was refused by other side: 111: Connection refused.", "ws://10.0.0.7:9001/psc",
         "nothing listening at 10.0.0.7:9001"),
        ("[('SSL routines', '', 'certificate verify failed')]", "wss://h:1/psc", "with --ca-file"),
        ("User timeout caused connection failure.", "ws://h:9/psc", "no answer from h:9"),
    ],
)  # fmt: skip
def test_link_failure_hint_names_the_likely_mistake(reason: str, url: str, hint: str) -> None:
    """Each known failure reason maps to advice naming the likely mistake."""
    said = link_failure_hint(reason, url)
    assert said is not None and hint in said


def test_link_failure_hint_has_no_guess_for_other_reasons() -> None:
    """A reason it does not know gets no hint (not a wrong one)."""
    assert link_failure_hint("WebSocket connection upgrade failed [401]: Unauthorized") is None
    assert link_failure_hint("Connection lost.") is None


def test_ready_report_names_unreachable_peers_with_hints(tmp_path: Path) -> None:
    """Peers at a WAMP port, at a path without /psc and at a dead port: each log line carries its hint."""
    target = NodeProcess("target", tmp_path).start()
    try:
        dead = free_port()
        node = NodeProcess("dialler", tmp_path)
        node.peers = [
            target.wamp_url,
            f"ws://127.0.0.1:{target.psc_port}/",
            f"ws://127.0.0.1:{dead}/psc",
            target.psc_url,
        ]
        node.start()
        try:
            wait_until(lambda: "peers reachable" in node.log_path.read_text(), "the ready report")
        finally:
            node.stop()
    finally:
        target.stop()
    log = node.log_path.read_text()
    assert "ready, 1 of 4 peers reachable" in log
    assert f"could not link to {target.wamp_url}: WebSocket connection upgrade failed [400]" in log
    assert f"peer {target.wamp_url} not reachable: " in log
    lines = {
        line.split(" not reachable: ")[0].rsplit(" ", 1)[1]: line
        for line in log.splitlines()
        if " not reachable: " in line
    }
    assert "that looks like a WAMP port, not a PSC port" in lines[target.wamp_url]
    assert "is the path /psc?" in lines[f"ws://127.0.0.1:{target.psc_port}/"]
    assert f"nothing listening at 127.0.0.1:{dead}" in lines[f"ws://127.0.0.1:{dead}/psc"]
    assert target.psc_url not in lines


def test_all_peers_reachable_is_reported_as_such(tmp_path: Path) -> None:
    """With every configured peer linked the node logs "ready, 1 of 1 peers reachable" and no unreachable line."""
    target = NodeProcess("target", tmp_path).start()
    node = NodeProcess("dialler", tmp_path)
    node.peers = [target.psc_url]
    try:
        node.start()
        wait_until(lambda: "peers reachable" in node.log_path.read_text(), "the ready report")
    finally:
        node.stop()
        target.stop()
    log = node.log_path.read_text()
    assert "ready, 1 of 1 peers reachable" in log and "not reachable" not in log


def test_bridge_router_retry_names_the_url_and_reason(tmp_path: Path) -> None:
    """A bridge whose router is down logs the router URL and why it could not connect, not an endpoint repr."""
    router = f"ws://127.0.0.1:{free_port()}/ws"
    bridge = NodeProcess("bridge", tmp_path)
    bridge.command = lambda: [  # type: ignore[method-assign]
        sys.executable, "-m", "pubsubclub", "bridge", "--name", "bridge", "--router", router, "--realm", "realm1",
        "--psc", f"tcp:{bridge.psc_port}:interface=127.0.0.1", "--http", "tcp:0:interface=127.0.0.1",
        "--log-level", "info",
    ]  # fmt: skip
    bridge._read_back_ports = lambda: None  # type: ignore[method-assign]
    try:
        bridge.start()
        wait_until(lambda: "cannot reach the router" in bridge.log_path.read_text(), "the router failure line")
    finally:
        bridge.stop()
    log = bridge.log_path.read_text()
    assert f"bridge: cannot reach the router at {router}: Connection was refused" in log
    assert " object at 0x" not in log
