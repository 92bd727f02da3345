"""REGISTERED with ``--wamp-await-interest`` between real node processes: a call from another node the moment it
arrives reaches the callee.

Node A (the callees) and node B (the caller). B's consumer link to A, on which A
announces its registrations (PSC401), goes through a proxy in the test process
that hands B what A sends 0.1 s late, so B learns of a registration
observably after A answered REGISTERED unless A waits for B. The calls
themselves go A to B's link the other way, undelayed.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from helpers.nodes import Cluster, NodeProcess, start_all
from helpers.wampclient import connect, leave
from twisted.internet import protocol, reactor

pytestmark = pytest.mark.slow

#: How late the proxy hands node B what node A sends on B's consumer link.
DELAY = 0.1


class _Upstream(protocol.Protocol):
    """The proxy's connection to node A: what A sends reaches the client ``DELAY`` s later, in order."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.timer: Any = None

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Let the client's bytes through, those that came first included."""
        self.client.upstream = self
        self.transport.write(b"".join(self.client.early))
        self.client.early.clear()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Hold ``data`` back for ``DELAY`` s, behind what came before it."""
        self.queue.append((reactor.seconds() + DELAY, data))  # type: ignore[attr-defined]
        if self.timer is None:
            self.timer = reactor.callLater(DELAY, self._release)  # type: ignore[attr-defined]

    def _release(self) -> None:
        self.timer = None
        now = reactor.seconds()  # type: ignore[attr-defined]
        while self.queue and self.queue[0][0] <= now:
            self.client.transport.write(self.queue.popleft()[1])
        if self.queue:
            self.timer = reactor.callLater(self.queue[0][0] - now, self._release)  # type: ignore[attr-defined]

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802 - Twisted API
        """A closed: close the client's side (what is held back is dropped, as a cut link would)."""
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.client.transport.loseConnection()


class _Client(protocol.Protocol):
    """Node B's connection to the proxy: its bytes go to A at once."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.upstream: _Upstream | None = None
        self.early: list[bytes] = []

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Dial node A."""
        protocol.ClientCreator(reactor, _Upstream, self).connectTCP("127.0.0.1", self.port)

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """To A now (or once the connection to A is up)."""
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.transport.write(data)

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802 - Twisted API
        """B closed: close A's side."""
        if self.upstream is not None:
            self.upstream.transport.loseConnection()


def _pair(tmp: Path, name: str, extra: tuple[str, ...]) -> tuple[Cluster, Any]:
    """Nodes A and B, B's link from A through a delaying proxy; and the proxy's listening port."""
    # No peer learning: B would learn A's own URL and might keep a direct link instead of the proxy's.
    a = NodeProcess(f"{name}-a", tmp, extra=(*extra, "--no-learn-peers"))
    b = NodeProcess(f"{name}-b", tmp, extra=(*extra, "--no-learn-peers"))
    factory = protocol.Factory()
    factory.protocol = lambda: _Client(a.psc_port)  # type: ignore[assignment,misc]
    listening = reactor.listenTCP(0, factory, interface="127.0.0.1")  # type: ignore[attr-defined]
    a.peers = [b.psc_url]
    b.peers = [f"ws://127.0.0.1:{listening.getHost().port}/psc"]
    start_all([a, b])
    return Cluster([a, b]), listening


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, Cluster]]:
    """Two pairs of nodes, with and without ``--wamp-await-interest``; stopped at the end of the module."""
    tmp = tmp_path_factory.mktemp("await-registration")
    started: list[tuple[Cluster, Any]] = []
    try:
        started.append(_pair(tmp, "on", ("--wamp-await-interest",)))
        started.append(_pair(tmp, "off", ()))
        yield {True: started[0][0], False: started[1][0]}
    finally:
        for cluster, listening in started:
            for node in cluster.nodes:
                node.stop()
            listening.stopListening()


async def _register_then_call(cluster: Cluster, rounds: int) -> list[str | None]:
    """Per fresh procedure registered on A: None if B's call made the moment REGISTERED came back was answered,
    else the error URI."""
    await cluster.linked()
    callee = await connect(cluster[0].wamp_url)
    caller = await connect(cluster[1].wamp_url)
    outcomes: list[str | None] = []
    try:
        for i in range(rounds):
            procedure = f"com.fresh.p{i}"
            await callee.register(lambda i=i: i, procedure)
            try:
                assert await caller.call(procedure) == i
                outcomes.append(None)
            except ApplicationError as e:
                outcomes.append(e.error)
    finally:
        await leave(caller, callee)
    return outcomes


@pytest_twisted.ensureDeferred
async def test_a_call_from_another_node_right_after_registered_is_answered(pairs: dict[bool, Cluster]) -> None:
    """With --wamp-await-interest, each of 20 fresh procedures is called from node B the moment REGISTERED
    reached the callee on node A, and every call is answered (B learned of it first)."""
    assert await _register_then_call(pairs[True], 20) == [None] * 20


@pytest_twisted.ensureDeferred
async def test_without_await_interest_the_call_can_come_before_the_node_knows(pairs: dict[bool, Cluster]) -> None:
    """Without it, REGISTERED comes before node B learned of the procedure (0.1 s later here): B's call then
    gets wamp.error.no_such_procedure (the race the option closes)."""
    outcomes = await _register_then_call(pairs[False], 3)
    assert "wamp.error.no_such_procedure" in outcomes, outcomes
