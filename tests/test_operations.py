"""Operations: /health, graceful SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import NodeProcess, start_all
from helpers.polling import until, wait_until
from helpers.wampclient import connect

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
    start_all([a, b])
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


def test_stats_only_on_the_operations_listener(tmp_path: Path) -> None:
    """/stats (peer addresses, interest) is served on --http only: the public WAMP port answers 404."""
    import urllib.error
    import urllib.request

    node = NodeProcess("a", tmp_path).start()
    try:
        stats = node.stats()
        assert stats["node"] == "a"
        # The start-up collection's survivors are frozen, and so will be each later one's (gc-refreeze).
        assert stats["gc"]["refreeze"] is True and stats["gc"]["freezes"] >= 1 and stats["gc"]["frozen"] > 10_000
        assert stats["gc"]["thresholds"][2] == 1  # gc-full-threshold: a full collection may follow each middle one
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(node.http_url + "stats", timeout=5)
        assert e.value.code == 404
    finally:
        node.stop()


def test_public_operations_listener_warns(tmp_path: Path) -> None:
    """--http bound beyond loopback logs a security warning naming what it exposes; loopback does not."""
    from helpers.ports import free_port

    public = NodeProcess("public", tmp_path, extra=("--http", f"tcp:{free_port()}"))
    private = NodeProcess("private", tmp_path)
    start_all([public, private])
    try:
        assert "the operations listener" in public.log_path.read_text()
        assert "/stats shows peer addresses" in public.log_path.read_text()
        assert "the operations listener" not in private.log_path.read_text()
    finally:
        public.stop()
        private.stop()


@pytest_twisted.ensureDeferred
async def test_metrics_scrape_is_capped_by_topic(tmp_path: Path) -> None:
    """400 topics from one client, --metrics-max-topics 5: the scrape names 5 topics plus __other__, sums intact."""
    import urllib.request

    from helpers.wampclient import leave, publish_acked
    from twisted.internet import defer

    node = NodeProcess("a", tmp_path, extra=("--metrics-max-topics", "5")).start()
    try:
        session = await connect(node.wamp_url)
        # Pipelined (each still acknowledged), not 400 round trips one after the other.
        await defer.gatherResults([defer.ensureDeferred(publish_acked(session, f"spray.{i}", i)) for i in range(400)])
        for _ in range(3):
            await publish_acked(session, "spray.busy", "again")
        await leave(session)
        with urllib.request.urlopen(node.ops_url + "metrics", timeout=5) as r:
            text = r.read().decode()
        series = [
            line
            for line in text.splitlines()
            if line.startswith("pubsubclub_messages_total{") and 'kind="published"' in line
        ]
        topics = {line.split('topic="')[1].split('"')[0] for line in series}
        assert len(topics) == 6 and "__other__" in topics and "spray.busy" in topics
        assert sum(float(line.rsplit(" ", 1)[1]) for line in series) == 403
        assert len(text) < 20_000
    finally:
        node.stop()


def test_deprecated_flat_key_is_logged_at_start(tmp_path: Path) -> None:
    """A config file with a flat key of an earlier version starts the node and logs where the key belongs now."""
    path = tmp_path / "node.toml"
    path.write_text('realm = "realm1"\n[consul]\nttl = 5\n')
    node = NodeProcess("flat", tmp_path, extra=("--config", str(path))).start()
    try:
        log = node.log_path.read_text()
        assert "config key 'realm' is deprecated; write it as [wamp] realm" in log
        assert "ttl" not in log.split("deprecated", 1)[1].split("\n", 1)[0]
    finally:
        node.stop()


def test_ctrl_c_and_sigterm_together_stop_once(tmp_path: Path) -> None:
    """SIGINT then SIGTERM (Ctrl-C under ``pubsubclub cluster``): one clean shutdown, exit 0, nothing critical."""
    import signal

    node = NodeProcess("twice", tmp_path).start()
    assert node.proc is not None
    node.proc.send_signal(signal.SIGINT)
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(20) == 0
    log = node.log_path.read_text()
    # Whichever of the two Python handles first stops the node; the other is ignored.
    assert log.count("shutting down\n") == 2  # "received SIG..., shutting down" and "node twice shutting down"
    assert ("received SIGINT" in log) != ("received SIGTERM" in log) and "node twice shutting down" in log
    assert "ReactorNotRunning" not in log and "critical" not in log
