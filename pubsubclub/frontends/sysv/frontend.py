"""The System V front-end (``--sysv KEY``): the service, the queue and its thread, composed for the node."""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import Any

import sysv_ipc
from twisted.internet import defer, task
from twisted.logger import Logger

from pubsubclub.config import SysVSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import Frontend, FrontendBase
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register
from pubsubclub.frontends.sysv.budget import QueueBudget, SysVLimits
from pubsubclub.frontends.sysv.queue import QueueReceiver, SysVQueue
from pubsubclub.frontends.sysv.service import SysVService
from pubsubclub.frontends.wamp.auth import AuthPolicy

log = Logger()

#: Seconds between checks that logged-in clients are alive.
SWEEP_SECONDS = 1.0


# -- the front-end ---------------------------------------------------------------------------


def _host_lock(key: int) -> socket.socket | None:
    """Hold the host-wide name of ``key`` (an abstract Unix socket), so two nodes never share a queue."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        lock.bind(f"\0pubsubclub-sysv-{key:#x}")
    except OSError as e:
        lock.close()
        if e.errno == errno.EADDRINUSE:
            raise RuntimeError(f"another pubsubclub node on this host serves SysV key {key:#x}") from None
        return None  # no abstract sockets (not Linux): nothing to hold
    return lock


class SysVFrontend(FrontendBase):
    """The System V message-queue front-end (``--sysv KEY``), composed for the node."""

    name = "sysv"

    def __init__(self, hub: Hub, section: SysVSection, context: FrontendContext) -> None:
        super().__init__(context)
        if section.key is None:
            raise ValueError("the SysV front-end needs --sysv KEY")
        key = int(section.key, 0)
        self.key = key
        self._hub = hub
        self.section = section
        self._auth: AuthPolicy | None = context.auth
        self._reactor = context.reactor
        self.limits = SysVLimits(
            max_users=section.max_users,
            max_channels=section.max_channels,
            max_subscriptions=section.max_subscriptions,
            max_blocks=section.max_blocks,
            client_queue_share=section.client_queue_share,
            stray_grace=float(section.stray_grace),
        )
        #: Where the registry survives restarts.
        self.state_path = os.path.join(context.data_dir, f"sysv-{key:#x}.json")
        self.queue: SysVQueue | None = None
        self.service: SysVService | None = None
        self.receiver: QueueReceiver | None = None
        self._sweeper: task.LoopingCall | None = None
        self._lock: socket.socket | None = None
        self._reopen = False

    async def listen(self) -> dict[str, str]:
        """Open (or create) the queue, restore the registry, start receiving; ``sysv`` -> ``sysv:0x420``."""
        self._lock = _host_lock(self.key)
        try:
            self.queue = self._open_queue()
        except (sysv_ipc.Error, OSError) as e:
            if self._lock is not None:
                self._lock.close()
            raise RuntimeError(f"cannot open SysV queue {self.key:#x}: {e}") from e
        self.service = SysVService(
            self._hub,
            self.queue,
            self.limits,
            prefix=self.section.prefix,
            auth=self._auth,
            save=self._write_state,
        )
        self._read_state()
        self._start_receiving()
        self._sweeper = task.LoopingCall(self._tick)
        self._sweeper.clock = self._reactor
        self._sweeper.start(SWEEP_SECONDS, now=True)
        return {"sysv": f"sysv:{self.key:#x}"}

    def _open_queue(self) -> SysVQueue:
        queue = SysVQueue(self.key)
        wanted = QueueBudget.wanted_bytes(self.limits)
        if not queue.grow(wanted):
            budget = QueueBudget(self.limits, queue.capacity())
            log.warn(
                "SysV queue {key} holds {size} bytes ({n} messages), not the {wanted} that give each of {users}"
                " users {share} waiting messages: each is guaranteed {guaranteed} (raise kernel.msgmnb to"
                " {wanted}, or run the node with CAP_SYS_RESOURCE; docs/sysv.md)",
                key=f"{self.key:#x}",
                size=queue.size_bytes(),
                n=queue.capacity(),
                wanted=wanted,
                users=self.limits.max_users,
                share=self.limits.client_queue_share,
                guaranteed=budget.guaranteed,
            )
        log.info(
            "SysV queue {key} (id {id}) {how}, {used} messages waiting",
            key=f"{self.key:#x}",
            id=queue.id,
            how="created" if queue.created else "already there: used as it is",
            used=queue.used(),
        )
        return queue

    def _start_receiving(self) -> None:
        assert self.queue is not None and self.service is not None
        self.receiver = QueueReceiver(self.queue, self.service.message_received, self._reactor, self._queue_lost)
        self.receiver.start()

    def _queue_lost(self, failure: Exception) -> None:
        log.error("SysV queue {key} is unusable ({failure}); making it again", key=f"{self.key:#x}", failure=failure)
        self._reopen = True
        self._tick()

    def _tick(self) -> None:
        """Every second: re-make a lost queue, log out dead clients, save the registry if it changed."""
        service = self.service
        if service is None:
            return
        if self._reopen:
            try:
                self.queue = self._open_queue()
            except (sysv_ipc.Error, OSError) as e:
                log.error("SysV queue {key} cannot be made: {e}; trying again", key=f"{self.key:#x}", e=str(e))
                return
            self._reopen = False
            service.queue = self.queue
            service.budget = QueueBudget(self.limits, self.queue.capacity())
            self._start_receiving()
        try:
            service.sweep()
            if service.dirty:
                service.save()
        except Exception:
            log.failure("SysV housekeeping failed")

    def _read_state(self) -> None:
        assert self.service is not None
        try:
            with open(self.state_path, "rb") as f:
                state = json.loads(f.read(1 << 20))
            self.service.restore(state)
        except FileNotFoundError:
            return
        except (ValueError, OSError) as e:
            bad = f"{self.state_path}.bad"
            log.warn(
                "SysV state {path} unusable ({e}); starting empty, kept as {bad}", path=self.state_path, e=e, bad=bad
            )
            try:
                os.replace(self.state_path, bad)
            except OSError:
                pass
            return
        service = self.service
        log.info(
            "SysV state restored: {users} users, {channels} channels, {subs} subscriptions, {blocks} blocks",
            users=len(service.users),
            channels=len(service.channels),
            subs=service.stats()["subscriptions"],
            blocks=service.stats()["blocks"],
        )

    def _write_state(self, state: dict[str, Any]) -> None:
        temporary = f"{self.state_path}.tmp"
        try:
            os.makedirs(os.path.dirname(self.state_path) or ".", exist_ok=True)
            with open(temporary, "w") as f:
                json.dump(state, f)
            os.replace(temporary, self.state_path)
        except OSError:
            log.failure("SysV state could not be saved to {path}", path=self.state_path)

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Stop receiving (the thread is woken and exits); the registry is kept for the next start."""
        if self.receiver is None:
            return None
        return self.receiver.stop()

    def finish(self) -> None:
        """Stop the sweeps, leave the hub, save the registry, release the key. The queue stays."""
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        if self.service is not None:
            self.service.close()
            self.service.save()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def stats(self) -> dict[str, Any]:
        """The queue, the registry's sizes and the counters."""
        if self.service is None or self.queue is None:
            return {}
        return {
            "key": f"{self.key:#x}",
            "queue_id": self.queue.id,
            "waiting": self.queue.used(),
            "receiving": self.receiver is not None and self.receiver.running,
            "receiver_stop_ms": None if self.receiver is None else self.receiver.stop_ms,
            **self.service.stats(),
        }


def build(hub: Hub, section: Any, context: FrontendContext) -> Frontend:
    """The SysV front-end of ``section`` (its queue opens at listen)."""
    return SysVFrontend(hub, section, context)


register(
    FrontendSpec(
        name="sysv",
        section=SysVSection,
        build=build,
        enabled=lambda section: section.key is not None,
        counters=("sysv",),
        single_resource=True,  # one kernel queue and its saved registry
    )
)
