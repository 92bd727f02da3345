"""The supervisor of a node with ``--workers N``: starts the workers, restarts a crashed one, stops them all.

The supervisor binds the node's TCP listeners (pubsubclub/node/workers.py),
starts N ``pubsubclub node`` processes told their place by
:data:`~pubsubclub.node.workers.WORKER_ENV`, prints the node's ready line once
every worker printed its own, restarts a worker that exits on its own (after a
growing delay, at most ``worker-max-restarts`` a minute per worker, else the
node stops with an error) and on SIGTERM/SIGINT stops every worker within the
node's ``shutdown-timeout`` (SIGKILL for what is left after it).

Its lifecycle is :data:`TRANSITIONS`: (state, event) -> (next state, action).
An event with no row for the current state is a bug, raised as such.
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.config import NodeConfig
from pubsubclub.core.hub import random_node_id
from pubsubclub.node.workers import CLIENT_LISTENERS, WORKER_ENV, ListenerProblem, WorkerPlace, bind_listeners

log = Logger()

#: A worker's restarts are counted over this many seconds (``worker-max-restarts`` per window).
RESTART_WINDOW = 60.0
#: First restart delay, doubled for each restart of the same worker in the window ...
RESTART_DELAY = 0.25
#: ... up to this many seconds.
MAX_RESTART_DELAY = 8.0
#: Beyond ``shutdown-timeout``: time for a worker that gave up its graceful stop to exit before SIGKILL.
EXIT_MARGIN = 1.0
#: The first inherited socket's descriptor, as systemd numbers them (sd_listen_fds).
SD_LISTEN_FDS_START = 3
#: Longest line a worker may write on stdout (its ready line); longer ones are cut.
MAX_READY_LINE = 64 * 1024


class State(enum.Enum):
    """Where the supervisor is in its life."""

    #: Workers started; not every one has said it is ready yet.
    STARTING = "starting"
    #: Every worker was ready once; a worker that exits is restarted.
    RUNNING = "running"
    #: SIGTERM sent to every worker (a signal, a failed start, restarts used up); waiting, bounded.
    STOPPING = "stopping"
    #: Every worker is gone; the process exits.
    STOPPED = "stopped"


class Event(enum.Enum):
    """What happens to the supervisor."""

    #: A worker printed its ready line.
    READY = "ready"
    #: The last worker not yet ready became ready.
    ALL_READY = "all ready"
    #: A worker process ended.
    EXITED = "exited"
    #: A worker exited more than ``worker-max-restarts`` times in :data:`RESTART_WINDOW`.
    RESTARTS_USED_UP = "restarts used up"
    #: SIGTERM or SIGINT.
    SIGNAL = "signal"
    #: The stop deadline passed with workers left.
    DEADLINE = "deadline"
    #: No worker process is left.
    ALL_GONE = "all gone"


#: (state, event) -> (next state, the :class:`Supervisor` method that acts on it).
TRANSITIONS: dict[tuple[State, Event], tuple[State, str]] = {
    (State.STARTING, Event.READY): (State.STARTING, "_count_ready"),
    (State.STARTING, Event.ALL_READY): (State.RUNNING, "_announce"),
    (State.STARTING, Event.EXITED): (State.STOPPING, "_fail_start"),
    (State.STARTING, Event.SIGNAL): (State.STOPPING, "_stop_workers"),
    (State.RUNNING, Event.READY): (State.RUNNING, "_back"),
    (State.RUNNING, Event.EXITED): (State.RUNNING, "_restart_later"),
    (State.RUNNING, Event.RESTARTS_USED_UP): (State.STOPPING, "_give_up"),
    (State.RUNNING, Event.SIGNAL): (State.STOPPING, "_stop_workers"),
    (State.STOPPING, Event.READY): (State.STOPPING, "_stop_late_starter"),
    (State.STOPPING, Event.EXITED): (State.STOPPING, "_check_gone"),
    (State.STOPPING, Event.SIGNAL): (State.STOPPING, "_ignore"),
    (State.STOPPING, Event.DEADLINE): (State.STOPPING, "_kill_leftovers"),
    (State.STOPPING, Event.ALL_GONE): (State.STOPPED, "_finish"),
}


class SupervisorBug(Exception):
    """An event arrived in a state with no transition for it."""


@dataclass
class Slot:
    """One worker index: its current process, its ready line, its recent restarts."""

    index: int
    process: Any = None
    pid: int | None = None
    ready: dict[str, Any] | None = None
    restarts: deque[float] = field(default_factory=deque)
    timer: IDelayedCall | None = None
    exit_code: int | None = None


class _WorkerProtocol(protocol.ProcessProtocol):
    """Reads one worker's ready line from its stdout and reports its end."""

    def __init__(self, supervisor: Supervisor, slot: Slot) -> None:
        self.supervisor = supervisor
        self.slot = slot
        self._buffer = b""

    def outReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Lines on stdout: the ready line is taken; anything else is passed on."""
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self.supervisor.worker_line(self.slot, line)
        if len(self._buffer) > MAX_READY_LINE:
            self.supervisor.worker_line(self.slot, self._buffer[:MAX_READY_LINE])
            self._buffer = b""

    def processEnded(self, reason: Failure) -> None:  # noqa: N802 - Twisted API
        """The worker is gone (its exit code or signal in ``reason``)."""
        code = getattr(reason.value, "exitCode", None)
        sig = getattr(reason.value, "signal", None)
        self.supervisor.worker_exited(self.slot, self, code, sig)


class Supervisor:
    """N worker processes of one node (see the module docstring and :data:`TRANSITIONS`)."""

    def __init__(
        self,
        config: NodeConfig,
        count: int,
        argv: list[str],
        reactor: Any,
        write: Callable[[str], None],
    ) -> None:
        self.config = config
        self.count = count
        self.argv = argv
        self.reactor = reactor
        self._write = write
        self.state = State.STARTING
        self.node_id = config.node.name or random_node_id()
        self.folder = ""
        self.sockets: dict[str, list[socket.socket]] = {}
        self.slots = [Slot(i) for i in range(count)]
        self.exit_code = 0
        self._deadline: IDelayedCall | None = None

    # -- the table ------------------------------------------------------------

    def handle(self, event: Event, slot: Slot | None = None) -> None:
        """Take ``event`` through :data:`TRANSITIONS`."""
        row = TRANSITIONS.get((self.state, event))
        if row is None:
            if self.state is State.STOPPED:
                return  # late news after the end (a pipe closing): nothing to do
            raise SupervisorBug(f"no transition for {event.value} in state {self.state.value}")
        self.state, action = row
        getattr(self, action)(slot)

    # -- starting ---------------------------------------------------------------

    def bind(self) -> None:
        """Bind the listeners and make the private folder (raises ListenerProblem)."""
        self.sockets = bind_listeners(self.config, self.count)
        for sockets in self.sockets.values():
            for sock in sockets:
                sock.set_inheritable(True)
        # mkdtemp makes it 0700: only this user reaches the workers' links and ops sockets.
        self.folder = tempfile.mkdtemp(prefix="pubsubclub-workers-")

    def start(self) -> None:
        """Start every worker (the reactor is running: it reaps them)."""
        for slot in self.slots:
            self._spawn(slot)
        log.info(
            "node {node}: supervising {count} workers (pids {pids})",
            node=self.node_id,
            count=self.count,
            pids=[s.pid for s in self.slots],
        )

    def inherited(self, index: int) -> dict[str, socket.socket]:
        """The listening sockets worker ``index`` inherits, by listener."""
        found = {}
        for key, sockets in self.sockets.items():
            if key in CLIENT_LISTENERS:
                found[key] = sockets[index]
            elif index == 0:
                found[key] = sockets[0]
        return found

    def _spawn(self, slot: Slot) -> None:
        slot.timer = None
        slot.ready = None
        inherited = self.inherited(slot.index)
        place = WorkerPlace(slot.index, self.count, self.node_id, self.folder, tuple(inherited))
        # The sockets are passed as systemd passes them (descriptors from 3, LISTEN_FDS, LISTEN_FDNAMES,
        # LISTEN_PID): Twisted's systemd: endpoint adopts them. The shell learns the worker's pid ($$) and
        # exec keeps it.
        env = {
            **os.environ,
            WORKER_ENV: place.encode(),
            "LISTEN_FDS": str(len(inherited)),
            "LISTEN_FDNAMES": ":".join(inherited),
        }
        child_fds: dict[int, Any] = {0: "w", 1: "r", 2: 2}
        for offset, sock in enumerate(inherited.values()):
            child_fds[SD_LISTEN_FDS_START + offset] = sock.fileno()
        argv = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', sys.executable, "-m", "pubsubclub", *self.argv]
        proto = _WorkerProtocol(self, slot)
        slot.process = self.reactor.spawnProcess(proto, "/bin/sh", argv, env=env, childFDs=child_fds)
        slot.pid = slot.process.pid

    def worker_line(self, slot: Slot, line: bytes) -> None:
        """A line a worker wrote on stdout."""
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("event") == "ready" and slot.ready is None:
            slot.ready = message
            self.handle(Event.READY, slot)
            return
        self._write(line.decode(errors="replace") + "\n")

    def _count_ready(self, slot: Slot | None) -> None:
        if all(s.ready is not None for s in self.slots):
            self.handle(Event.ALL_READY)

    def _announce(self, slot: Slot | None) -> None:
        primary = self.slots[0].ready or {}
        line = {**primary, "name": self.node_id, "workers": self.count, "pid": os.getpid()}
        log.info("node {node} ready with {count} workers", node=self.node_id, count=self.count)
        self._write(json.dumps(line) + "\n")

    def _back(self, slot: Slot | None) -> None:
        assert slot is not None
        log.info("worker {index} is back (pid {pid})", index=slot.index, pid=slot.pid)

    # -- exits and restarts -------------------------------------------------------

    def worker_exited(self, slot: Slot, proto: _WorkerProtocol, code: int | None, sig: int | None) -> None:
        """A worker process ended."""
        slot.process = None
        slot.exit_code = code
        how = f"signal {sig}" if sig is not None else f"exit code {code}"
        if self.state in (State.STARTING, State.RUNNING):
            log.warn("worker {index} (pid {pid}) ended: {how}", index=slot.index, pid=slot.pid, how=how)
        else:
            log.info("worker {index} (pid {pid}) stopped: {how}", index=slot.index, pid=slot.pid, how=how)
        self.handle(Event.EXITED, slot)

    def _fail_start(self, slot: Slot | None) -> None:
        assert slot is not None
        code = slot.exit_code
        self.exit_code = code if code and code > 0 else 1
        print(
            f"pubsubclub: error: worker {slot.index} of {self.count} could not start; stopping the others",
            file=sys.stderr,
        )
        self._stop_workers(slot)

    def _restart_later(self, slot: Slot | None) -> None:
        assert slot is not None
        now = self.reactor.seconds()
        while slot.restarts and now - slot.restarts[0] > RESTART_WINDOW:
            slot.restarts.popleft()
        if len(slot.restarts) >= self.config.node.worker_max_restarts:
            self.handle(Event.RESTARTS_USED_UP, slot)
            return
        delay = min(RESTART_DELAY * 2 ** len(slot.restarts), MAX_RESTART_DELAY)
        slot.restarts.append(now)
        log.warn(
            "restarting worker {index} in {delay} s ({n} restarts in the last {window:.0f} s)",
            index=slot.index,
            delay=delay,
            n=len(slot.restarts),
            window=RESTART_WINDOW,
        )
        slot.timer = self.reactor.callLater(delay, self._spawn, slot)

    def _give_up(self, slot: Slot | None) -> None:
        assert slot is not None
        self.exit_code = 1
        log.error(
            "worker {index} crashed {n} times in {window:.0f} s (worker-max-restarts); stopping the node",
            index=slot.index,
            n=len(slot.restarts) + 1,
            window=RESTART_WINDOW,
        )
        self._stop_workers(slot)

    # -- stopping -------------------------------------------------------------------

    def signalled(self, name: str) -> None:
        """SIGTERM or SIGINT reached the supervisor."""
        log.info("received {signal}, stopping {count} workers", signal=name, count=self.count)
        self.handle(Event.SIGNAL)

    def _stop_workers(self, slot: Slot | None) -> None:
        for s in self.slots:
            if s.timer is not None and s.timer.active():
                s.timer.cancel()
            s.timer = None
            self._terminate(s)
        bound = self.config.node.shutdown_timeout + EXIT_MARGIN
        self._deadline = self.reactor.callLater(bound, self.handle, Event.DEADLINE)
        self._check_gone(None)

    def _terminate(self, slot: Slot) -> None:
        if slot.process is not None:
            try:
                slot.process.signalProcess("TERM")
            except Exception:  # already gone: its processEnded is on its way
                log.debug("worker {index} already gone", index=slot.index)

    def _stop_late_starter(self, slot: Slot | None) -> None:
        assert slot is not None
        self._terminate(slot)

    def _ignore(self, slot: Slot | None) -> None:
        """Nothing to do (a second signal while stopping)."""

    def _check_gone(self, slot: Slot | None) -> None:
        if all(s.process is None for s in self.slots):
            self.handle(Event.ALL_GONE)

    def _kill_leftovers(self, slot: Slot | None) -> None:
        self._deadline = None
        for s in self.slots:
            if s.process is not None:
                log.warn(
                    "worker {index} (pid {pid}) still running after the stop bound: SIGKILL", index=s.index, pid=s.pid
                )
                try:
                    s.process.signalProcess("KILL")
                except Exception:
                    log.debug("worker {index} already gone", index=s.index)

    def _finish(self, slot: Slot | None) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None
        for sockets in self.sockets.values():
            for sock in sockets:
                sock.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.reactor.running:
            self.reactor.stop()


def run_supervisor(config: NodeConfig, count: int, argv: list[str]) -> int:
    """Run a node as ``count`` workers under a supervisor until SIGTERM/SIGINT; the exit code."""
    from pubsubclub.node.run import start_logging

    start_logging(config.node.log_level)
    from twisted.internet import reactor

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    supervisor = Supervisor(config, count, argv, reactor, write)
    try:
        supervisor.bind()
    except ListenerProblem as e:
        print(f"pubsubclub: error: {e}", file=sys.stderr)
        return 2

    def on_signal(signum: int, frame: Any) -> None:
        name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
        reactor.callFromThread(supervisor.signalled, name)  # type: ignore[attr-defined]

    def install() -> None:
        # After Twisted's own (it reaps children on SIGCHLD): ours stop the workers first, then the reactor.
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)

    reactor.callWhenRunning(install)  # type: ignore[attr-defined]
    reactor.callWhenRunning(supervisor.start)  # type: ignore[attr-defined]
    reactor.run()  # type: ignore[attr-defined]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return supervisor.exit_code
