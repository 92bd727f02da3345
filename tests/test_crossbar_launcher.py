"""The Crossbar.io launcher of ``pubsubclub.testing.crossbar`` against the real router from PyPI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import pytest_twisted
from helpers.polling import wait_until
from helpers.ports import free_port
from helpers.wampclient import connect, leave, publish_acked, subscribe

from pubsubclub.testing import crossbar
from pubsubclub.testing.crossbar import BRIDGE_ROLE, CrossbarMissing, CrossbarProcess


@pytest.fixture(scope="module")
def router(crossbar_routers: list[CrossbarProcess]) -> CrossbarProcess:
    """A router with the generated config (``router_config``): one of the run's shared ones (the restart test
    leaves it running again on its port)."""
    proc = crossbar_routers[1]
    assert proc.config == crossbar.router_config(proc.port)
    return proc


def test_missing_crossbar_fails_with_a_clear_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the virtualenv the launcher raises (an AssertionError: tests fail, never skip) naming `make crossbar`."""
    monkeypatch.setenv(crossbar.CROSSBAR_ENV, str(tmp_path / "no-such-crossbar"))
    with pytest.raises(CrossbarMissing, match="make crossbar"):
        CrossbarProcess(tmp_path, free_port()).start()
    assert issubclass(CrossbarMissing, AssertionError)


@pytest_twisted.ensureDeferred
async def test_router_accepts_anonymous_ticket_and_wampcra_sessions(router: CrossbarProcess) -> None:
    """The generated config lets anonymous, ticket and WAMP-CRA sessions join, with their roles."""
    anon = await connect(router.url)
    by_ticket = await connect(router.url, authid="bridge-1", ticket="ticket-of-bridge-1")
    by_cra = await connect(router.url, authid="bridge-2", secret="secret-of-bridge-2")
    try:
        assert anon.details.authrole == "anonymous"
        assert (by_ticket.details.authrole, by_ticket.details.authmethod) == (BRIDGE_ROLE, "ticket")
        assert (by_cra.details.authrole, by_cra.details.authmethod) == (BRIDGE_ROLE, "wampcra")
        with pytest.raises(ConnectionError, match="wamp.error.not_authorized"):
            await connect(router.url, authid="bridge-1", ticket="wrong ticket")
    finally:
        await leave(anon, by_ticket, by_cra)


@pytest_twisted.ensureDeferred
async def test_roles_may_use_the_subscription_and_session_meta_api(router: CrossbarProcess) -> None:
    """A bridge-role session can list subscriptions, read one and ask who a session is."""
    client = await connect(router.url)
    bridge = await connect(router.url, authid="bridge-1", ticket="ticket-of-bridge-1")
    try:
        rec, sub = await subscribe(client, "launcher.topic")
        listed = await bridge.call("wamp.subscription.list")
        assert sub.id in listed["exact"]
        info = await bridge.call("wamp.subscription.get", sub.id)
        assert info["uri"] == "launcher.topic"
        assert await bridge.call("wamp.subscription.list_subscribers", sub.id) == [client._session_id]
        who = await bridge.call("wamp.session.get", client._session_id)
        assert who["authrole"] == "anonymous"
        await publish_acked(bridge, "launcher.topic", "hello")
        await rec.wait_for(1)
        assert rec.args == ["hello"]
    finally:
        await leave(client, bridge)


def test_restart_serves_again_and_kill_stops_the_process_group(router: CrossbarProcess) -> None:
    """restart() comes back on the same port; kill() leaves no router behind."""
    router.restart()
    assert crossbar.port_open(router.port)
    router.kill()
    assert not router.running()
    # kill() waited until no process of the router's group was left. One whole-suite run still found
    # the port accepting right after it: the wait is bounded, and its failure names who listens there.
    try:
        wait_until(lambda: not crossbar.port_open(router.port), f"port {router.port} to close after kill()")
    except AssertionError as err:
        listeners = subprocess.run(
            ["ss", "-ltnp", f"sport = :{router.port}"], capture_output=True, text=True, check=False
        ).stdout
        raise AssertionError(f"{err}; listening there:\n{listeners}") from None
    router.start()
    assert crossbar.port_open(router.port)
