"""A front-end is one package plus one registration: a toy one, defined here alone, runs in a real node.

The toy protocol: TCP, one line per message; every line a client sends is
published on the hub topic of its section, and every toy client (a sink on
that topic) gets every line the others publish. Nothing outside this file
names it: the node finds it in the registry, builds it from its section,
guards its listener with the edge, lists it in /stats and stops it.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, reactor, task, threads
from twisted.internet.endpoints import serverFromString
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineOnlyReceiver

from pubsubclub.config import FederationSection, NodeConfig, NodeSection, WampSection, setting
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.frontends import registry
from pubsubclub.frontends.base import Frontend, FrontendBase, tcp_url
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec
from pubsubclub.node.node import Node

LOOPBACK = "tcp:0:interface=127.0.0.1"


@dataclass(frozen=True)
class ToySection:
    """``[toy]``: the toy front-end."""

    listen: str | None = setting(LOOPBACK, "toy listener", metavar="ENDPOINT")
    topic: str = setting("toy", "hub topic every toy line goes to", metavar="TOPIC")


class ToyConnection(LineOnlyReceiver):
    """One toy client: its lines go to the hub, the hub's lines come back to it."""

    delimiter = b"\n"
    factory: ToyFactory

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Subscribe to the toy topic."""
        self.factory.frontend.connections.add(self)
        self.factory.frontend.hub.subscribe(self.factory.frontend.section.topic, self)

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802 - Twisted API
        """Leave the hub."""
        self.factory.frontend.connections.discard(self)
        self.factory.frontend.hub.unsubscribe_all(self)

    def lineReceived(self, line: bytes) -> None:  # noqa: N802 - Twisted API
        """Publish the line to every other subscriber of the topic."""
        frontend = self.factory.frontend
        frontend.lines += 1
        hub = frontend.hub
        hub.publish(hub.envelope(frontend.section.topic, line.decode()), exclude=self)

    def deliver(self, envelope: Envelope) -> None:
        """A line published on the topic, by a toy client or anyone else."""
        self.sendLine(str(envelope.payload).encode())


class ToyFactory(Factory):
    """Builds toy connections for one front-end."""

    protocol = ToyConnection

    def __init__(self, frontend: ToyFrontend) -> None:
        self.frontend = frontend


class ToyFrontend(FrontendBase):
    """The toy front-end, built from its own section and the node's context only."""

    name = "toy"

    def __init__(self, hub: Hub, section: ToySection, context: FrontendContext) -> None:
        super().__init__(context)
        self.hub, self.section, self.reactor = hub, section, context.reactor
        self.connections: set[ToyConnection] = set()
        self.lines = 0

    async def listen(self) -> dict[str, str]:
        """Serve toy clients behind the node's edge; the URL as ``toy``."""
        assert self.section.listen is not None
        factory = self.guarded("toy", ToyFactory(self), b"TOO MANY CONNECTIONS\n")
        port = await serverFromString(self.reactor, self.section.listen).listen(factory)
        self._ports.append(port)
        return {"toy": tcp_url(port)}

    def close(self, reason: str) -> None:
        """Close every client."""
        for connection in list(self.connections):
            assert connection.transport is not None
            connection.transport.loseConnection()

    def stats(self) -> dict[str, Any]:
        """Open connections and lines received."""
        return {"connections": len(self.connections), "lines": self.lines}


@pytest.fixture
def toy_registered() -> Iterator[FrontendSpec]:
    """The toy front-end in the registry for one test."""
    spec = registry.register(
        FrontendSpec(
            name="toy",
            section=ToySection,
            build=ToyFrontend,
            enabled=lambda section: section.listen is not None,
            endpoints=lambda section: {"toy": section.listen},
        )
    )
    yield spec
    registry.unregister("toy")


#: Set once both toy clients are on the hub: then the first one writes.
_READY = threading.Event()


def _exchange(port: int) -> str:
    """Two toy clients: the first sends a line once both are in, the second reads it (blocking; run in a thread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as reader:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as writer:
            _READY.wait(10)
            writer.sendall(b"hello from a toy\n")
            return reader.makefile("rb").readline().decode()




async def _stats(ops: str) -> dict[str, Any]:
    """The node's /stats."""
    response = await treq.get(ops + "stats", persistent=False)
    return json.loads(await response.text())  # type: ignore[no-any-return]


@pytest_twisted.ensureDeferred
async def test_a_frontend_registered_alone_runs_in_a_node(tmp_path: Path, toy_registered: FrontendSpec) -> None:
    """A node builds the registered toy front-end from its section, lists it in /stats, and its clients talk."""
    _READY.clear()
    config = NodeConfig(
        node=NodeSection(name="toy-node", data_dir=str(tmp_path), http=LOOPBACK),
        wamp=WampSection(listen=LOOPBACK, chat_page=False),
        federation=FederationSection(listen=LOOPBACK),
    )
    node = Node(config, reactor)
    urls = await node.start()
    try:
        assert "toy" in urls and isinstance(node.frontend("toy"), Frontend)
        port = int(urls["toy"].rsplit(":", 1)[1])
        exchange = threads.deferToThread(_exchange, port)
        for _ in range(200):  # both clients subscribed on the hub, within 10 s
            stats = await _stats(urls["ops"])
            if stats["toy"]["connections"] == 2:
                break
            await task.deferLater(reactor, 0.05, lambda: None)
        assert stats["toy"] == {"connections": 2, "lines": 0}
        assert stats["edge"]["toy"]["connections"] == 2  # it stands on the node's connection layer
        _READY.set()
        assert await exchange == "hello from a toy\n"
        stats = await _stats(urls["ops"])
        assert stats["toy"] == {"connections": 0, "lines": 1}
        assert stats["wamp"] is not None and stats["nsd"] is None  # the built-in keys are unchanged
    finally:
        _READY.set()
        await defer.ensureDeferred(node.stop())
    assert node.frontend("toy").stats() == {"connections": 0, "lines": 1}


def test_a_node_without_the_registration_has_no_toy() -> None:
    """Unregistered, the toy is nowhere: the registration is what adds it."""
    assert "toy" not in {s.name for s in registry.specs()}
    assert {"wamp", "nsd", "tep", "stream", "sysv", "bridge"} <= {s.name for s in registry.specs()}
