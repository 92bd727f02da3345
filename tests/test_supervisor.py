"""The workers' supervisor's lifecycle (node/supervisor.py), in memory: fake processes on a MemoryReactorClock."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any

import pytest
from twisted.internet.error import ProcessDone, ProcessTerminated
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure

from pubsubclub.config import ConfigError, NodeConfig
from pubsubclub.config.declare import workers_count
from pubsubclub.config.load import build, load_toml
from pubsubclub.node.supervisor import (
    EXIT_MARGIN,
    RESTART_DELAY,
    TRANSITIONS,
    Event,
    State,
    Supervisor,
    SupervisorBug,
)
from pubsubclub.node.workers import WORKER_ENV, ListenerProblem, WorkerPlace, bind_listeners, worker_config


class FakeProcess:
    """A spawned worker: its pid and the signals it was sent."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[str] = []

    def signalProcess(self, name: str) -> None:  # noqa: N802 - Twisted API
        """Record the signal."""
        self.signals.append(name)


class Reactor(MemoryReactorClock):
    """A memory reactor that spawns fake processes."""

    def __init__(self) -> None:
        super().__init__()
        self.running = True
        self.spawned: list[tuple[Any, FakeProcess, dict[str, str]]] = []

    def spawnProcess(self, proto: Any, executable: str, args: Any, env: Any, childFDs: Any) -> FakeProcess:  # noqa: N802, N803
        """Record a spawn; the protocol is driven by the test."""
        process = FakeProcess(1000 + len(self.spawned))
        self.spawned.append((proto, process, env))
        return process

    def stop(self) -> None:
        """The supervisor is done."""
        self.running = False


def make(count: int = 2, **node: Any) -> tuple[Supervisor, Reactor, list[str]]:
    """A started supervisor of ``count`` fake workers and what it wrote on stdout."""
    config = NodeConfig()
    config = replace(config, node=replace(config.node, name="n", **node))
    reactor = Reactor()
    written: list[str] = []
    supervisor = Supervisor(config, count, ["node"], reactor, written.append)
    supervisor.start()
    return supervisor, reactor, written


def ready(reactor: Reactor, i: int) -> None:
    """Spawn number ``i`` prints its ready line."""
    reactor.spawned[i][0].outReceived(json.dumps({"event": "ready", "name": "n", "wamp": "ws://x/ws"}).encode() + b"\n")


def exits(reactor: Reactor, i: int, code: int | None = None, sig: int | None = None) -> None:
    """Spawn number ``i`` ends."""
    reason = ProcessDone(0) if code == 0 else ProcessTerminated(exitCode=code, signal=sig)
    reactor.spawned[i][0].processEnded(Failure(reason))


def test_ready_line_once_every_worker_is_ready() -> None:
    """The node's ready line comes when the last worker is ready, with the worker count; each worker knows its place."""
    supervisor, reactor, written = make()
    places = [WorkerPlace.decode(env[WORKER_ENV]) for _, _, env in reactor.spawned]
    assert [(p.index, p.count, p.node_id) for p in places] == [(0, 2, "n"), (1, 2, "n")]
    ready(reactor, 0)
    assert supervisor.state is State.STARTING and written == []
    ready(reactor, 1)
    assert supervisor.state is State.RUNNING
    line = json.loads(written[0])
    assert line["event"] == "ready" and line["workers"] == 2 and line["name"] == "n"


def test_crashed_worker_restarts_with_growing_delays_until_the_budget_is_spent() -> None:
    """A crashed worker restarts after 0.25 s, then 0.5 s; past worker-max-restarts the node stops, exit 1."""
    supervisor, reactor, _ = make(worker_max_restarts=2)
    ready(reactor, 0)
    ready(reactor, 1)
    exits(reactor, 1, sig=9)
    reactor.advance(RESTART_DELAY - 0.01)
    assert len(reactor.spawned) == 2
    reactor.advance(0.01)
    assert len(reactor.spawned) == 3
    ready(reactor, 2)
    assert supervisor.state is State.RUNNING
    exits(reactor, 2, code=1)
    reactor.advance(2 * RESTART_DELAY)
    assert len(reactor.spawned) == 4
    exits(reactor, 3, code=1)
    assert supervisor.state is State.STOPPING and supervisor.exit_code == 1
    assert reactor.spawned[0][1].signals == ["TERM"]
    exits(reactor, 0, code=0)
    assert supervisor.state is State.STOPPED and not reactor.running
    assert not reactor.getDelayedCalls()


def test_signal_stops_all_and_kills_what_outlives_the_bound() -> None:
    """SIGTERM: TERM to every worker; one still running after shutdown-timeout + margin gets KILL."""
    supervisor, reactor, _ = make(shutdown_timeout=2.0)
    ready(reactor, 0)
    ready(reactor, 1)
    supervisor.signalled("SIGTERM")
    supervisor.signalled("SIGTERM")  # a second one changes nothing
    assert [p.signals for _, p, _ in reactor.spawned] == [["TERM"], ["TERM"]]
    exits(reactor, 0, code=0)
    reactor.advance(2.0 + EXIT_MARGIN)
    assert reactor.spawned[1][1].signals == ["TERM", "KILL"]
    exits(reactor, 1, sig=9)
    assert supervisor.state is State.STOPPED and supervisor.exit_code == 0
    assert not reactor.getDelayedCalls()


def test_worker_that_cannot_start_stops_the_node_with_its_exit_code() -> None:
    """A worker exiting before it was ready (exit 2: a bad listener) stops the others; the node exits 2."""
    supervisor, reactor, _ = make()
    ready(reactor, 1)
    exits(reactor, 0, code=2)
    assert supervisor.state is State.STOPPING and supervisor.exit_code == 2
    assert reactor.spawned[1][1].signals == ["TERM"]
    exits(reactor, 1, code=0)
    assert supervisor.state is State.STOPPED and len(reactor.spawned) == 2


def test_events_without_a_transition_are_bugs() -> None:
    """The table is the lifecycle: an event it has no row for raises, except after the end."""
    supervisor, _, _ = make()
    assert (State.STARTING, Event.RESTARTS_USED_UP) not in TRANSITIONS
    with pytest.raises(SupervisorBug):
        supervisor.handle(Event.RESTARTS_USED_UP)
    supervisor.state = State.STOPPED
    supervisor.handle(Event.EXITED)  # late news: ignored


def test_workers_setting_takes_a_count_or_auto(tmp_path: Any) -> None:
    """``workers``: a number (flag or TOML integer), ``auto`` (the host's cores); 0 is refused naming the key."""
    toml = tmp_path / "node.toml"
    toml.write_text("workers = 3\n")
    assert build(load_toml(str(toml)), {}).node.workers == "3"
    assert workers_count(build({}, {"workers": "auto"}).node.workers) == max(1, min(os.cpu_count() or 1, 256))
    with pytest.raises(ConfigError, match="'workers': must be auto or a whole number"):
        build({}, {"workers": "0"})


def test_worker_config_gives_the_primary_the_single_parts() -> None:
    """Client listeners become inherited sockets everywhere; PSC, ops, peers and Consul stay with worker 0."""
    config = build({}, {"wamp": "tcp:8080", "psc": "tcp:9001", "http": "tcp:8181", "peers": ("ws://p:1/psc",)})
    place = WorkerPlace(0, 2, "n", "/tmp/x", ("wamp", "psc", "http"))
    primary = worker_config(config, place)
    assert primary.wamp.listen == "systemd:domain=INET:name=wamp"
    assert primary.federation.listen == "systemd:domain=INET:name=psc" and primary.node.http is not None
    assert primary.federation.peers == ("ws://p:1/psc",) and primary.node.name == "n"
    other = worker_config(config, replace(place, index=1, fds=("wamp",)))
    assert other.wamp.listen == "systemd:domain=INET:name=wamp" and other.node.name == "n.w1"
    assert other.federation.listen is None and other.node.http is None and other.federation.peers == ()
    assert other.federation.learn_peers is False


def test_client_listeners_share_a_port_and_must_be_tcp() -> None:
    """Each worker gets its own socket on the client port (SO_REUSEPORT); a non-TCP client listener is refused."""
    config = build({}, {"wamp": "tcp:0:interface=127.0.0.1", "psc": "tcp:0:interface=127.0.0.1"})
    bound = bind_listeners(config, 3)
    try:
        ports = {sock.getsockname()[1] for sock in bound["wamp"]}
        assert len(bound["wamp"]) == 3 and len(ports) == 1 and len(bound["psc"]) == 1
    finally:
        for sockets in bound.values():
            for sock in sockets:
                sock.close()
    unix = build({}, {"wamp": "unix:/tmp/pubsubclub-test-wamp.sock"})  # ssl: alike (its files must exist)
    with pytest.raises(ListenerProblem, match="--wamp unix:/tmp/pubsubclub-test-wamp.sock: with --workers above 1"):
        bind_listeners(unix, 2)
