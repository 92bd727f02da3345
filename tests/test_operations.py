"""Operations: /health, graceful SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from conftest import NodeProcess, until, wait_until
from wampclient import connect

pytestmark = pytest.mark.slow


def link_states(node: NodeProcess) -> list[tuple[str, str]]:
    """(peer, state) of every link in /health."""
    return sorted((link["peer"], link["state"]) for link in node.health()[1]["links"])


def test_health_reflects_link_states(tmp_path: Path) -> None:
    """/health is 200 once listening and lists a peer as connecting until it is up, then open."""
    a = NodeProcess("a", tmp_path)
    b = NodeProcess("b", tmp_path)
    a.peers = [b.psc_url]
    b.peers = [a.psc_url]
    a.start()
    try:
        code, body = a.health()
        assert code == 200 and body["status"] == "ready" and body["node"] == "a"
        assert link_states(a) == [(b.psc_url, "connecting")]
        b.start()
        wait_until(lambda: a.health()[1]["open_links"] == 2, "both links of a to open")
        states = {(link["direction"], link["state"], link["peer_node"]) for link in a.health()[1]["links"]}
        assert states == {("out", "open", "b"), ("in", "open", "b")}
        b.kill()
        wait_until(lambda: a.health()[1]["open_links"] == 0, "a to notice b is gone")
        assert link_states(a) == [(b.psc_url, "connecting")]
    finally:
        a.stop()
        b.stop()


@pytest_twisted.ensureDeferred
async def test_sigterm_says_goodbye_to_clients_and_closes_links(tmp_path: Path) -> None:
    """SIGTERM: WAMP clients get GOODBYE system_shutdown, peers see the links close, exit code 0."""
    from twisted.internet import defer

    a = NodeProcess("a", tmp_path)
    b = NodeProcess("b", tmp_path)
    a.peers = [b.psc_url]
    b.peers = [a.psc_url]
    a.start()
    b.start()
    try:
        await until(lambda: b.health()[1]["open_links"] == 2, "links up")
        session = await connect(a.wamp_url)
        left: defer.Deferred[str] = defer.Deferred()
        session.on("leave", lambda _s, details: left.callback(details.reason))
        assert a.stop() == 0
        assert await left == "wamp.close.system_shutdown"
        await until(lambda: b.health()[1]["open_links"] == 0, "b to see a's links closed")
        assert "closed (code=1000, reason=node shutting down)" in b.log_path.read_text()
    finally:
        b.stop()
