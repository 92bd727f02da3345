"""The SysV queue's budget: whether one more message for a client may go on the shared queue.

The queue is shared by every client and small (16 KiB by default), so a
client that stops reading must not fill it for the others. Sans-IO: the
queue is a :class:`ClientQueue` (the real one is
:class:`~pubsubclub.frontends.sysv.queue.SysVQueue`, a fake in tests).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from pubsubclub.core.proc import ENDED_STATES, any_thread_running, stat_fields
from pubsubclub.frontends.sysv.codec import (
    BODY_SIZE,
)

#: Messages of room the budget keeps free for requests to the server and the replies to them.
REQUEST_RESERVE = 8


class QueueFull(Exception):
    """The queue has no room for the message (it was not sent)."""


class QueueGone(Exception):
    """The queue was removed (``ipcrm``) under the node."""


class ClientQueue(Protocol):
    """What :class:`SysVService` needs of the queue (a real :class:`SysVQueue`, or a fake in tests)."""

    def send(self, pid: int, data: bytes) -> None:
        """Put ``data`` on the queue for ``pid`` without waiting; QueueFull or QueueGone if not."""

    def waiting(self, pid: int) -> bool:
        """True if at least one message for ``pid`` is on the queue."""

    def used(self) -> int:
        """Messages on the queue, for anyone."""

    def capacity(self) -> int:
        """Messages of :data:`BODY_SIZE` bytes the queue holds."""

    def purge(self, pid: int) -> int:
        """Remove every message waiting for ``pid``; how many."""

    def addressees(self) -> set[int] | None:
        """The receivers (``mtype``) of the messages on the queue, read without taking them; None if unknown."""


@dataclass(frozen=True)
class SysVLimits:
    """The spec's limits (flags may raise them) and each client's share of the queue."""

    max_users: int = 16
    max_channels: int = 16
    max_subscriptions: int = 64
    max_blocks: int = 64
    #: Messages that may wait on the queue for one client before more are dropped.
    client_queue_share: int = 64
    #: Seconds a reply to a PID that is not logged in (CONNECTION, a refused LOGIN, LOGOUT)
    #: is left for it; then whatever waits for that PID is a stray and is removed.
    stray_grace: float = 2.0


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks after boot); None if it is gone or a zombie.

    Two processes with one PID have different start times, so a PID reused
    after a client died is not taken for that client. Without ``/proc`` the
    start time is 0 for every live process. A client whose main thread has
    exited while its other threads run on is alive, although ``/proc`` shows
    its leader as a zombie (:mod:`pubsubclub.core.proc`).
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: alive
    except OverflowError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None if os.path.isdir("/proc/self") else 0
    except OSError:
        return 0
    fields = stat_fields(stat)
    if len(fields) < 20 or (fields[0] in ENDED_STATES and not any_thread_running(pid)):
        return None
    return int(fields[19])


class QueueBudget:
    """How many messages may wait on the shared queue for each client.

    Every client is guaranteed :attr:`guaranteed` waiting messages: the queue's
    capacity less :data:`REQUEST_RESERVE`, split among ``max_users``. Beyond
    that a client may borrow free room up to ``client_queue_share``, as long as
    every other logged-in client keeps its guaranteed part and the reserve
    stays free. With a queue big enough for every user's full share (see
    :meth:`wanted_bytes`), the guarantee is the share itself.

    What waits for a client is not visible per client, so the budget keeps an
    upper bound: messages sent since the client was last seen with nothing
    waiting, never more than the queue holds in all. When the bound reaches the
    guarantee, the queue is asked (``msgrcv`` with no room, which fails with
    E2BIG and takes nothing when a message waits) whether the client has read
    everything; if it has, the bound starts again from zero. And a request
    from a client shows it read the replies to its earlier requests (the
    spec's clients wait for each reply), so those leave the bound then: a
    client that reads only its replies, leaving deliveries for later, still
    gets its replies.
    """

    def __init__(self, limits: SysVLimits, capacity: int) -> None:
        self.share = limits.client_queue_share
        self.max_users = limits.max_users
        self.capacity = capacity
        room = max(0, capacity - REQUEST_RESERVE)
        #: Messages every client may have waiting, whatever the others do.
        self.guaranteed = max(1, min(self.share, room // self.max_users))
        self._unread: dict[int, int] = {}
        #: Replies sent to each client since its last request.
        self._replies: dict[int, int] = {}

    @staticmethod
    def wanted_bytes(limits: SysVLimits) -> int:
        """Queue size (``msg_qbytes``) that gives every user its whole share."""
        return (limits.max_users * limits.client_queue_share + REQUEST_RESERVE) * BODY_SIZE

    def admit(self, pid: int, queue: ClientQueue, logged_in: int) -> bool:
        """True if one more message for ``pid`` may go on the queue now."""
        unread = self._unread.get(pid, 0)
        if unread < self.guaranteed:
            return True
        used = queue.used()
        unread = min(unread, used)
        if unread >= self.guaranteed and not queue.waiting(pid):
            unread = 0
        self._unread[pid] = unread
        if unread < self.guaranteed:
            return True
        if unread >= self.share:
            return False
        others = max(0, logged_in - 1) * self.guaranteed
        return self.capacity - used > REQUEST_RESERVE + others

    def sent(self, pid: int, is_reply: bool = False) -> None:
        """One message for ``pid`` went on the queue (``is_reply``: the answer to a request)."""
        self._unread[pid] = self._unread.get(pid, 0) + 1
        if is_reply:
            self._replies[pid] = self._replies.get(pid, 0) + 1

    def request_from(self, pid: int) -> None:
        """``pid`` sent a request: it has read the replies to its earlier ones."""
        replies = self._replies.pop(pid, 0)
        if replies:
            self._unread[pid] = max(0, self._unread.get(pid, 0) - replies)

    def unread(self, pid: int) -> int:
        """The bound on messages waiting for ``pid``."""
        return self._unread.get(pid, 0)

    def forget(self, pid: int) -> None:
        """``pid`` is gone and its messages purged."""
        self._unread.pop(pid, None)
        self._replies.pop(pid, None)

    def pids(self) -> list[int]:
        """Every client the node has sent something (until it is forgotten)."""
        return list(self._unread)
