"""The System V front-end: C programs on a message queue, on the node's hub.

The protocol is docs/specs/sysv-protocol.pl.md; the wire is
:mod:`pubsubclub.frontends.sysv.codec`; every choice the spec leaves open is in
docs/sysv.md. The parts, from the inside out:

* :class:`SysVService` is the protocol (sans-IO, no Twisted): users,
  channels, subscriptions and blocks; one request in, the replies out through
  a :class:`ClientQueue`; hub sinks for channels with subscribers. It is
  tested in memory with a fake queue.
* :class:`QueueBudget` decides whether one more message for a client may go
  on the queue: the queue is shared by every client and small (16 KiB by
  default), so a client that stops reading must not fill it for the others.
* :class:`SysVQueue` is the real queue (``sysv_ipc``): non-blocking sends,
  a blocking receive for the receiving thread, and the probes the budget uses.
* :class:`QueueReceiver` is the receiving thread: the queue has no file
  descriptor, so a thread blocks in ``msgrcv(type=1)`` and hands each message
  to the reactor with ``callFromThread``.
* :class:`SysVFrontend` composes them for the node.

Channels and hub topics
    SysV channel ``c`` is hub topic ``prefix + c`` (``--sysv-prefix``). The
    channel registry is this node's (the queue is): a channel exists for the
    node's SysV clients once one of them registered it (MSGREG).

Why one long module: the service, the queue's budget, the receive thread and
the front-end are one queue's whole life and are read together.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import sysv_ipc
from twisted.internet import defer, task
from twisted.logger import Logger

from pubsubclub.config import NodeConfig
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.frontends.base import Frontend
from pubsubclub.frontends.sysv.codec import (
    BODY_SIZE,
    LONG_TEXT_SIZE,
    MESSAGE_COUNT_BASE,
    MESSAGE_COUNT_MAX,
    SERVER_ID,
    Block,
    Connect,
    Login,
    Logout,
    Publish,
    Quit,
    RegisterChannel,
    Signal,
    Subscribe,
    SysVDecodeError,
    Unblock,
    Unsubscribe,
    channel_name,
    decode_request,
    delivery,
    delivery_text,
    new_channel,
    next_count,
    nick_name,
    pack,
    reply,
)
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role

__all__ = [
    "REQUEST_RESERVE",
    "ClientQueue",
    "QueueBudget",
    "QueueFull",
    "QueueGone",
    "QueueReceiver",
    "SysVFrontend",
    "SysVLimits",
    "SysVQueue",
    "SysVService",
    "process_start",
]

log = Logger()

#: Messages of room the budget keeps free for requests to the server and the replies to them.
REQUEST_RESERVE = 8
#: Delivery counters reserved (and saved) ahead, so a crash never reuses one.
COUNT_RESERVE_STEP = 10_000
#: Messages the receiving thread may hand to the reactor before it waits for them to be handled.
MAX_PENDING = 256
#: Seconds between checks that logged-in clients are alive.
SWEEP_SECONDS = 1.0
#: Seconds :meth:`QueueReceiver.stop` waits for the thread.
STOP_SECONDS = 2.0
#: Version of the saved state file.
STATE_VERSION = 1


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
    start time is 0 for every live process.
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
    # The command name may hold spaces and parentheses: the fields follow the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
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


@dataclass(slots=True)
class _User:
    pid: int
    nick: bytes
    #: :func:`process_start` at login: tells a reused PID from this client.
    start: int


class _ChannelSink:
    """The hub sink of one channel with SysV subscribers on this node."""

    def __init__(self, service: SysVService, channel: str) -> None:
        self._service = service
        self.channel = channel

    def deliver(self, envelope: Envelope) -> None:
        """A message from another front-end or node: to every subscriber of the channel."""
        self._service.fan_out(self.channel, envelope, None)


class SysVService:
    """The protocol of one node's queue: requests in, replies and deliveries out."""

    def __init__(
        self,
        hub: Hub,
        queue: ClientQueue,
        limits: SysVLimits = SysVLimits(),
        *,
        prefix: str = "",
        auth: AuthPolicy | None = None,
        process_start: Callable[[int], int | None] = process_start,
        save: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if prefix.startswith("$"):
            raise ValueError(f"SysV prefix {prefix!r} must not start with '$' (reserved hub topics)")
        self.hub = hub
        self.queue = queue
        self.limits = limits
        self.prefix = prefix
        #: The role of every SysV client (the policy's anonymous role); None: no policy, all allowed.
        self.role: Role | None = None if auth is None else auth.anonymous_role
        #: The policy refuses anonymous clients, so no SysV client may log in.
        self.refuse_logins = auth is not None and self.role is None
        self.budget = QueueBudget(limits, queue.capacity())
        self._process_start = process_start
        self._save = save
        self._clock = clock
        #: PID that is not logged in -> when the node last replied to it (kept for ``stray_grace``).
        self._replied: dict[int, float] = {}
        self.users: dict[int, _User] = {}
        self._by_nick: dict[bytes, int] = {}
        #: Registered channels, in registration order.
        self.channels: dict[str, None] = {}
        #: channel -> subscriber PID -> messages still to deliver (0: durable).
        self.subscriptions: dict[str, dict[int, int]] = {}
        self._subscription_count = 0
        #: blocker PID -> PIDs whose messages it does not get.
        self.blocks: dict[int, set[int]] = {}
        self._block_count = 0
        self._sinks: dict[str, _ChannelSink] = {}
        #: The next delivery counter, and the first one not yet reserved in the saved state.
        self._count = MESSAGE_COUNT_BASE
        self._count_mark = MESSAGE_COUNT_BASE
        self._wire_key = f"sysv|{prefix}"
        #: The saved state is behind (subscription quantities, logins).
        self.dirty = False
        self._logged_reasons: set[str] = set()
        #: Plain counters for /stats (message counters go to hub.metrics).
        self.counts: dict[str, int] = dict.fromkeys(
            ("requests", "bad_requests", "replies", "deliveries", "dropped", "clients_gone", "strays_removed"), 0
        )
        self._handlers: dict[type, Callable[[Any], None]] = {
            Connect: self._connect,
            Login: self._login,
            Logout: self._logout,
            Subscribe: self._subscribe,
            Unsubscribe: self._unsubscribe,
            RegisterChannel: self._register,
            Publish: self._publish,
            Block: self._block,
            Unblock: self._unblock,
            Quit: self._quit,
        }

    # -- input -------------------------------------------------------------------------

    def message_received(self, data: bytes) -> None:
        """Handle one message a client sent to the server; never raises."""
        self.counts["requests"] += 1
        try:
            request = decode_request(data)
        except SysVDecodeError as e:
            self._bad_request(e.reason, str(e), e.sender)
            return
        if not isinstance(request, Quit) and self._process_start(request.sender) is None:
            # Nobody would read the reply, and it would stay on the queue. (A QUIT
            # usually arrives after its sender exited; it has no reply.)
            self._bad_request("dead_sender", f"process {request.sender} does not exist", request.sender)
            return
        self.budget.request_from(request.sender)
        try:
            self._handlers[type(request)](request)
        except Exception:
            log.failure("SysV: internal error handling {request!r}", request=request)
            self.hub.metrics.error("sysv", "internal_error")

    def _bad_request(self, reason: str, detail: str, sender: int | None) -> None:
        self.counts["bad_requests"] += 1
        self.hub.metrics.error("sysv", reason)
        # The first of each kind at info level, the rest at debug: a flood of junk cannot flood the log.
        emit = log.debug if reason in self._logged_reasons else log.info
        self._logged_reasons.add(reason)
        emit("SysV: ignored a message from {sender}: {detail}", sender=sender, detail=detail)

    def _connect(self, request: Connect) -> None:
        self._reply(request.sender, Signal.OPERATION_SUCCESS)

    def _login(self, request: Login) -> None:
        pid, nick = request.sender, request.nick
        if self.refuse_logins:
            log.info("SysV: login of {pid} refused: the auth policy admits no anonymous clients", pid=pid)
            self._reply(pid, Signal.UNAVAILABLE)
        elif nick is None:
            self._reply(pid, Signal.INVALID_USERNAME)
        elif pid in self.users or nick in self._by_nick:
            self._reply(pid, Signal.UNAVAILABLE)
        elif len(self.users) >= self.limits.max_users:
            self._reply(pid, Signal.SERVER_OVERFLOW)
        else:
            start = self._process_start(pid)
            self._add_user(_User(pid, nick, 0 if start is None else start))
            log.info("SysV: {nick} ({pid}) logged in", nick=_show(nick), pid=pid)
            self._reply(pid, Signal.OPERATION_SUCCESS)

    def _logout(self, request: Logout) -> None:
        if self._remove_user(request.sender):
            self._reply(request.sender, Signal.OPERATION_SUCCESS)
        else:
            self._reply(request.sender, Signal.SENDER_NOT_RECOGNIZED)

    def _subscribe(self, request: Subscribe) -> None:
        pid, channel = request.sender, request.channel
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
        elif channel is None or channel not in self.channels:
            self._reply(pid, Signal.NO_CHANNEL)
        elif pid in self.subscriptions.get(channel, ()):
            self._reply(pid, Signal.UNAVAILABLE)
        elif self.role is not None and not self.role.may_subscribe(self.topic(channel)):
            log.info("SysV: role {role} may not subscribe to {channel!r}", role=self.role.name, channel=channel)
            self._reply(pid, Signal.UNAVAILABLE)
        elif self._subscription_count >= self.limits.max_subscriptions:
            self._reply(pid, Signal.SERVER_OVERFLOW)
        else:
            self._add_subscription(channel, pid, max(0, request.quantity))
            self._reply(pid, Signal.OPERATION_SUCCESS)

    def _unsubscribe(self, request: Unsubscribe) -> None:
        pid, channel = request.sender, request.channel
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
        elif channel is None or channel not in self.channels:
            self._reply(pid, Signal.NO_CHANNEL)
        elif pid not in self.subscriptions.get(channel, ()):
            self._reply(pid, Signal.UNAVAILABLE)
        else:
            self._remove_subscription(channel, pid)
            self._reply(pid, Signal.OPERATION_SUCCESS)

    def _register(self, request: RegisterChannel) -> None:
        pid, channel = request.sender, request.channel
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
        elif channel is None or channel in self.channels:
            self._reply(pid, Signal.UNAVAILABLE)
        elif len(self.channels) >= self.limits.max_channels:
            self._reply(pid, Signal.SERVER_OVERFLOW)
        else:
            self.channels[channel] = None
            self.dirty = True
            log.info(
                "SysV: channel {channel!r} registered by {nick}", channel=channel, nick=_show(self.users[pid].nick)
            )
            self._reply(pid, Signal.OPERATION_SUCCESS)
            announcement = new_channel(channel)
            for user in list(self.users):
                self._send(user, announcement)

    def _publish(self, request: Publish) -> None:
        pid, channel = request.sender, request.channel
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
            return
        if channel is None or channel not in self.channels:
            self._reply(pid, Signal.NO_CHANNEL)
            return
        topic = self.topic(channel)
        if self.role is not None and not self.role.may_publish(topic):
            log.info("SysV: role {role} may not publish to {channel!r}", role=self.role.name, channel=channel)
            self._reply(pid, Signal.UNAVAILABLE)
            return
        self._reply(pid, Signal.OPERATION_SUCCESS)
        envelope = self.hub.envelope(topic, request.text)
        self.hub.metrics.count(topic, "sysv", "published", 1, payload_size(envelope))
        # This node's SysV subscribers are served below, where blocks are known.
        self.hub.publish(envelope, exclude=self._sinks.get(channel))
        self.fan_out(channel, envelope, pid)

    def _block(self, request: Block) -> None:
        pid = request.sender
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
            return
        target = None if request.nick is None else self._by_nick.get(request.nick)
        blocked = self.blocks.get(pid, set())
        if target is None:
            self._reply(pid, Signal.INVALID_USERNAME)
        elif target == pid or target in blocked:
            self._reply(pid, Signal.UNAVAILABLE)
        elif self._block_count >= self.limits.max_blocks:
            self._reply(pid, Signal.SERVER_OVERFLOW)
        else:
            self.blocks.setdefault(pid, set()).add(target)
            self._block_count += 1
            self.dirty = True
            self._reply(pid, Signal.OPERATION_SUCCESS)

    def _unblock(self, request: Unblock) -> None:
        pid = request.sender
        if pid not in self.users:
            self._reply(pid, Signal.SENDER_NOT_RECOGNIZED)
            return
        target = None if request.nick is None else self._by_nick.get(request.nick)
        if target is None:
            self._reply(pid, Signal.INVALID_USERNAME)
        elif target not in self.blocks.get(pid, ()):
            self._reply(pid, Signal.UNAVAILABLE)
        else:
            self._remove_block(pid, target)
            self._reply(pid, Signal.OPERATION_SUCCESS)

    def _quit(self, request: Quit) -> None:
        # No reply: the client is closing. What still waits for it would stay on the queue.
        self._remove_user(request.sender)
        self._purge(request.sender)

    # -- users, subscriptions, blocks -----------------------------------------------------

    def _add_user(self, user: _User) -> None:
        self.users[user.pid] = user
        self._by_nick[user.nick] = user.pid
        self.dirty = True

    def _remove_user(self, pid: int) -> bool:
        """Log ``pid`` out: its subscriptions and every block it is part of end. False if not logged in."""
        user = self.users.pop(pid, None)
        if user is None:
            return False
        del self._by_nick[user.nick]
        for channel in [c for c, subscribers in self.subscriptions.items() if pid in subscribers]:
            self._remove_subscription(channel, pid)
        for blocked in list(self.blocks.get(pid, ())):
            self._remove_block(pid, blocked)
        for blocker in [b for b, blocked in self.blocks.items() if pid in blocked]:
            self._remove_block(blocker, pid)
        self.dirty = True
        log.info("SysV: {nick} ({pid}) logged out", nick=_show(user.nick), pid=pid)
        return True

    def _add_subscription(self, channel: str, pid: int, remaining: int) -> None:
        subscribers = self.subscriptions.setdefault(channel, {})
        subscribers[pid] = remaining
        self._subscription_count += 1
        self.dirty = True
        if channel not in self._sinks:
            sink = self._sinks[channel] = _ChannelSink(self, channel)
            self.hub.subscribe(self.topic(channel), sink)

    def _remove_subscription(self, channel: str, pid: int) -> None:
        subscribers = self.subscriptions[channel]
        del subscribers[pid]
        self._subscription_count -= 1
        self.dirty = True
        if not subscribers:
            del self.subscriptions[channel]
            sink = self._sinks.pop(channel, None)
            if sink is not None:
                self.hub.unsubscribe(self.topic(channel), sink)

    def _remove_block(self, blocker: int, blocked: int) -> None:
        pids = self.blocks[blocker]
        pids.discard(blocked)
        if not pids:
            del self.blocks[blocker]
        self._block_count -= 1
        self.dirty = True

    # -- output ----------------------------------------------------------------------------

    def topic(self, channel: str) -> str:
        """The hub topic of SysV ``channel``."""
        return self.prefix + channel

    def _reply(self, pid: int, signal: Signal) -> None:
        if self._send(pid, reply(signal), is_reply=True):
            self.counts["replies"] += 1
            if pid not in self.users:
                self._replied[pid] = self._clock()

    def _send(self, pid: int, data: bytes, topic: str | None = None, is_reply: bool = False) -> bool:
        """Put ``data`` on the queue for ``pid`` if its budget allows; count what does not go."""
        reason = None
        if not self.budget.admit(pid, self.queue, len(self.users)):
            reason = "slow_consumer"
        else:
            try:
                self.queue.send(pid, data)
            except QueueFull:
                reason = "queue_full"
            except QueueGone:
                reason = "queue_gone"
        if reason is None:
            self.budget.sent(pid, is_reply)
            return True
        self.counts["dropped"] += 1
        if topic is not None:
            self.hub.metrics.count(topic, "sysv", "dropped", 1, BODY_SIZE, reason=reason)
        else:
            self.hub.metrics.error("sysv", f"reply_{reason}")
        return False

    def _delivery(self, channel: str, envelope: Envelope) -> bytes | None:
        """The delivery of ``envelope``, built once with its counter; None if it is not JSON."""
        data = envelope.wire.get(self._wire_key)
        if data is None:
            try:
                text = delivery_text(envelope.payload)
            except TypeError:
                data = b""  # e.g. MessagePack bytes from a WAMP publisher
            else:
                data = delivery(self._next_count(), channel, text)
            envelope.wire[self._wire_key] = data
        return data or None

    def _next_count(self) -> int:
        count = self._count
        self._count = next_count(count)
        if count >= self._count_mark or self._count < count:
            # Reserve the next step now, so a restart after a crash never repeats a counter.
            self._count_mark = min(self._count + COUNT_RESERVE_STEP, MESSAGE_COUNT_MAX)
            self.save()
        return count

    def fan_out(self, channel: str, envelope: Envelope, sender: int | None) -> None:
        """Deliver ``envelope`` to the channel's subscribers (not ``sender``, nor those blocking it)."""
        subscribers = self.subscriptions.get(channel)
        if not subscribers:
            return
        data = self._delivery(channel, envelope)
        topic = envelope.topic
        if data is None:
            size = payload_size(envelope)
            self.hub.metrics.count(topic, "sysv", "dropped", len(subscribers), size, reason="not_json")
            self.counts["dropped"] += len(subscribers)
            return
        nbytes = _text_size(data)
        for pid, remaining in list(subscribers.items()):
            if pid == sender or (sender is not None and sender in self.blocks.get(pid, ())):
                continue
            if not self._send(pid, data, topic):
                continue
            self.counts["deliveries"] += 1
            self.hub.metrics.count(topic, "sysv", "delivered", 1, nbytes)
            if remaining == 1:
                self._remove_subscription(channel, pid)  # its k messages are delivered
            elif remaining > 1:
                subscribers[pid] = remaining - 1
                self.dirty = True

    def _purge(self, pid: int) -> None:
        try:
            purged = self.queue.purge(pid)
        except QueueGone:
            purged = 0
        self.budget.forget(pid)
        if purged:
            log.info("SysV: removed {n} messages left on the queue for {pid}", n=purged, pid=pid)

    # -- housekeeping -------------------------------------------------------------------------

    def sweep(self) -> None:
        """Log out clients whose process is gone, clear what waits for them and forget them."""
        for pid in set(self.users) | set(self.budget.pids()):
            start = self._process_start(pid)
            user = self.users.get(pid)
            if start is not None and (user is None or user.start in (0, start)):
                continue
            if user is not None:
                log.info("SysV: {nick} ({pid}) is gone without QUIT", nick=_show(user.nick), pid=pid)
                self.counts["clients_gone"] += 1
                self._remove_user(pid)
            self._purge(pid)
        self.remove_strays()

    def remove_strays(self) -> int:
        """Take off the queue what waits for a PID that is neither the server nor a logged-in client.

        Anyone who may write to the queue can address messages to any PID,
        and nobody reads those for a PID no client has: 19 of them filled a
        16 KiB queue for good. Messages for a logged-in client are its own to
        read and are never touched; a reply the node sent to a PID that is not
        logged in is left ``stray_grace`` seconds for its reader. How many were removed.
        """
        now = self._clock()
        grace = self.limits.stray_grace
        for pid, when in list(self._replied.items()):
            if now - when >= grace or pid in self.users:
                del self._replied[pid]
        try:
            addressees = self.queue.addressees() if self.queue.used() else None
        except QueueGone:
            return 0
        if not addressees:
            return 0
        removed = 0
        for pid in addressees:
            if pid == SERVER_ID or pid in self.users or pid in self._replied:
                continue
            try:
                taken = self.queue.purge(pid)
            except QueueGone:
                return removed
            self.budget.forget(pid)
            removed += taken
            if taken:
                # Once at info level, then at debug: whoever writes the strays cannot flood the log.
                emit = log.debug if "stray" in self._logged_reasons else log.info
                self._logged_reasons.add("stray")
                emit("SysV: removed {n} messages waiting for {pid}, which is no logged-in client", n=taken, pid=pid)
        if removed:
            self.counts["strays_removed"] += removed
            self.hub.metrics.error("sysv", "stray_removed", removed)
        return removed

    def save(self) -> None:
        """Hand the state to the ``save`` callback (if any); it is no longer dirty."""
        self.dirty = False
        if self._save is not None:
            self._save(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The state that survives a restart, as JSON-ready data."""
        return {
            "version": STATE_VERSION,
            "count_mark": self._count_mark,
            "channels": list(self.channels),
            "users": [[u.pid, u.nick.hex(), u.start] for u in self.users.values()],
            "subscriptions": [
                [pid, c, n] for c, subscribers in self.subscriptions.items() for pid, n in subscribers.items()
            ],
            "blocks": [[blocker, blocked] for blocker, pids in self.blocks.items() for blocked in sorted(pids)],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load a :meth:`snapshot` (of this or an earlier run); what breaks the limits is left out.

        Raises ValueError for a state that is not a snapshot.
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError("not a SysV state of version 1")
        mark = state.get("count_mark")
        if type(mark) is not int or not MESSAGE_COUNT_BASE <= mark <= MESSAGE_COUNT_MAX:
            raise ValueError("count_mark out of range")
        self._count = self._count_mark = mark
        for name in _rows(state, "channels", str):
            if len(self.channels) < self.limits.max_channels and channel_name(name.encode("utf-8", "replace")):
                self.channels[name] = None
        for pid, nick_hex, start in _rows(state, "users", list, (int, str, int)):
            nick = bytes.fromhex(nick_hex)
            if (
                len(self.users) < self.limits.max_users
                and pid > SERVER_ID
                and nick_name(nick) is not None
                and nick not in self._by_nick
            ):
                self._add_user(_User(pid, nick, start))
        for pid, channel, remaining in _rows(state, "subscriptions", list, (int, str, int)):
            if (
                pid in self.users
                and channel in self.channels
                and pid not in self.subscriptions.get(channel, ())
                and self._subscription_count < self.limits.max_subscriptions
            ):
                self._add_subscription(channel, pid, max(0, remaining))
        for blocker, blocked in _rows(state, "blocks", list, (int, int)):
            if (
                blocker in self.users
                and blocked in self.users
                and blocker != blocked
                and blocked not in self.blocks.get(blocker, ())
                and self._block_count < self.limits.max_blocks
            ):
                self.blocks.setdefault(blocker, set()).add(blocked)
                self._block_count += 1
        self.dirty = False

    def close(self) -> None:
        """Leave the hub (the registry stays, for :meth:`snapshot`)."""
        for channel, sink in list(self._sinks.items()):
            self.hub.unsubscribe(self.topic(channel), sink)
        self._sinks.clear()

    def stats(self) -> dict[str, Any]:
        """Sizes and counters for /stats."""
        return {
            "users": len(self.users),
            "channels": len(self.channels),
            "subscriptions": self._subscription_count,
            "blocks": self._block_count,
            "queue_capacity": self.budget.capacity,
            "guaranteed_share": self.budget.guaranteed,
            **self.counts,
        }


def _text_size(data: bytes) -> int:
    """Bytes of text in a delivery (longText up to its NUL)."""
    start = BODY_SIZE - LONG_TEXT_SIZE
    end = data.find(b"\0", start)
    return (BODY_SIZE if end < 0 else end) - start


def _rows(state: dict[str, Any], key: str, kind: type, shape: tuple[type, ...] = ()) -> list[Any]:
    """The list ``state[key]`` with every row of type ``kind`` (and, for lists, of ``shape``)."""
    rows = state.get(key, [])
    if not isinstance(rows, list) or len(rows) > 10_000:
        raise ValueError(f"{key} is not a list of at most 10000 rows")
    for row in rows:
        ok = isinstance(row, kind)
        if ok and shape:
            ok = len(row) == len(shape) and all(type(v) is t for v, t in zip(row, shape, strict=True))
        if not ok:
            raise ValueError(f"bad row in {key}: {row!r:.80}")
    return rows


def _show(nick: bytes) -> str:
    """A nick for logs."""
    return nick.decode("utf-8", "replace")


# -- the real queue --------------------------------------------------------------------------


def _kernel_limit(name: str, default: int) -> int:
    """``/proc/sys/kernel/<name>`` as an int (``default`` where there is none)."""
    try:
        with open(f"/proc/sys/kernel/{name}") as f:
            return int(f.read())
    except (OSError, ValueError):
        return default


#: ``msgrcv`` flags that copy the message at an index and leave it: MSG_COPY | IPC_NOWAIT (Linux headers).
_COPY_FLAGS = 0o40000 | 0o4000
_MTYPE = ctypes.c_long


def _message_copier(size: int) -> tuple[Any, Any, int] | None:
    """libc's ``msgrcv`` and a buffer for one message of ``size`` bytes (struct msgbuf: mtype, mtext)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        msgrcv = libc.msgrcv
    except (OSError, AttributeError):
        return None
    msgrcv.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long, ctypes.c_int)
    msgrcv.restype = ctypes.c_ssize_t
    return msgrcv, ctypes.create_string_buffer(ctypes.sizeof(_MTYPE) + size), size


class SysVQueue:
    """The node's queue through ``sysv_ipc``: created if missing (mode 0600), else used as it is."""

    #: Access mode of a queue the node creates: the node's user (and root) only.
    MODE = 0o600
    #: Largest receive buffer the reading handle grows to (a message is at most kernel.msgmax).
    MAX_RECEIVE = 1 << 26

    def __init__(self, key: int) -> None:
        self.key = key
        try:
            self._queue = sysv_ipc.MessageQueue(key, sysv_ipc.IPC_CREX, self.MODE, max_message_size=BODY_SIZE)
            #: True if this node created the queue; False if it was there already.
            self.created = True
        except sysv_ipc.ExistentialError:
            self._queue = sysv_ipc.MessageQueue(key, 0, max_message_size=BODY_SIZE)
            self.created = False
        self.id: int = self._queue.id
        # msgrcv without MSG_NOERROR leaves a message bigger than the buffer on the
        # queue (E2BIG), where it would block every later one: read with room for the largest.
        self._receive_size = max(BODY_SIZE, _kernel_limit("msgmax", 8192))
        self._reader = self._handle(self._receive_size)
        # No room at all: msgrcv fails with E2BIG, taking nothing, when a message waits.
        self._prober = self._handle(0)
        self._copy = _message_copier(self._receive_size)

    def _handle(self, size: int) -> sysv_ipc.MessageQueue:
        return sysv_ipc.MessageQueue(self.key, 0, max_message_size=size)

    def size_bytes(self) -> int:
        """The queue's ``msg_qbytes``."""
        return int(self._queue.max_size)

    def grow(self, wanted: int) -> bool:
        """Raise ``msg_qbytes`` to ``wanted`` (past kernel.msgmnb only with CAP_SYS_RESOURCE); True if it is."""
        if self.size_bytes() >= wanted:
            return True
        for size in (wanted, _kernel_limit("msgmnb", 0)):
            if size <= self.size_bytes():
                continue
            try:
                self._queue.max_size = size
            except (sysv_ipc.Error, OSError):
                continue
        return self.size_bytes() >= wanted

    # -- ClientQueue -----------------------------------------------------------------------

    def send(self, pid: int, data: bytes) -> None:
        """``msgsnd`` with IPC_NOWAIT to ``pid``."""
        try:
            self._queue.send(data, block=False, type=pid)
        except sysv_ipc.BusyError:
            raise QueueFull from None
        except (sysv_ipc.Error, OSError) as e:
            raise QueueGone(str(e)) from None

    def waiting(self, pid: int) -> bool:
        """True if something waits for ``pid`` (taken from nothing: a message that waits does not fit no room)."""
        for _ in range(4):
            try:
                self._prober.receive(block=False, type=pid)
            except OSError as e:
                if e.errno == errno.E2BIG:
                    return True
                raise
            except sysv_ipc.BusyError:
                return False
            except sysv_ipc.ExistentialError:
                return False
            # An empty message for pid was taken (never ours): ask again.
        return True

    def used(self) -> int:
        """Messages on the queue."""
        try:
            return int(self._queue.current_messages)
        except sysv_ipc.ExistentialError:
            return 0

    def capacity(self) -> int:
        """Messages of the protocol's size the queue holds."""
        return self.size_bytes() // BODY_SIZE

    def addressees(self) -> set[int] | None:
        """The ``mtype`` of every message on the queue, copied and left there (``msgrcv`` with ``MSG_COPY``).

        MSG_COPY (Linux 3.8+, ``CONFIG_CHECKPOINT_RESTORE``) reads the message
        at an index without taking it. Without it (ENOSYS) this is None, logged
        once, and strays stay (docs/sysv.md). The queue may change between two
        calls; a message missed now is seen at the next sweep.
        """
        if self._copy is None:
            return None
        copy, buffer, size = self._copy
        found: set[int] = set()
        for index in range(self.used() + 1):
            if copy(self.id, buffer, size, index, _COPY_FLAGS) >= 0:
                found.add(_MTYPE.from_buffer(buffer).value)
                continue
            error = ctypes.get_errno()
            if error == errno.E2BIG:
                continue  # larger than kernel.msgmax was at start: not the protocol's, and not countable here
            if error in (errno.ENOSYS, errno.EPERM) and not found:
                log.warn(
                    "SysV: msgrcv(MSG_COPY) is not available ({e}): messages to stray PIDs are not removed",
                    e=os.strerror(error),
                )
                self._copy = None
                return None
            if error in (errno.EIDRM, errno.EINVAL):
                raise QueueGone(os.strerror(error))
            break  # ENOMSG: past the last message
        return found

    def purge(self, pid: int) -> int:
        """Take every message waiting for ``pid``; how many."""
        taken = 0
        for _ in range(self.capacity() + 64):
            try:
                self._reader.receive(block=False, type=pid)
            except sysv_ipc.BusyError:
                break
            except sysv_ipc.ExistentialError:
                raise QueueGone from None
            taken += 1
        return taken

    # -- the receiving thread ----------------------------------------------------------------

    def receive(self) -> bytes:
        """Wait for the next message to the server (blocking: call it from a thread); QueueGone if removed."""
        while True:
            try:
                data, _ = self._reader.receive(block=True, type=SERVER_ID)
                return bytes(data)
            except sysv_ipc.ExistentialError:
                raise QueueGone(f"queue {self.key:#x} was removed") from None
            except OSError as e:
                if e.errno != errno.E2BIG or self._receive_size >= self.MAX_RECEIVE:
                    raise
                # kernel.msgmax was raised after the start: a bigger message is possible now.
                self._receive_size = min(self.MAX_RECEIVE, max(self._receive_size * 2, _kernel_limit("msgmax", 0)))
                self._reader = self._handle(self._receive_size)
            except sysv_ipc.Error as e:
                if type(e) is not sysv_ipc.Error:
                    raise
                # EINTR: a signal reached this thread; wait again.

    def wake(self) -> bool:
        """Send the server a message no client sends (sender 1), so the receiving thread returns; True if sent."""
        try:
            self._queue.send(pack(SERVER_ID, 0), block=False, type=SERVER_ID)
        except (sysv_ipc.Error, OSError):
            return False
        return True

    def remove(self) -> None:
        """Remove the queue from the system (``ipcrm -q``)."""
        self._queue.remove()


class QueueReceiver:
    """The thread that waits in ``msgrcv(type=1)`` and hands each message to the reactor.

    At most :data:`MAX_PENDING` messages are handed over and not yet handled:
    past that the thread waits, and further requests wait on the queue (where
    the kernel bounds them), not in the reactor's memory.
    """

    def __init__(
        self,
        queue: SysVQueue,
        handle: Callable[[bytes], None],
        reactor: Any,
        lost: Callable[[Exception], None],
    ) -> None:
        self._queue = queue
        self._handle = handle
        self._reactor = reactor
        self._lost = lost
        self._pending = threading.BoundedSemaphore(MAX_PENDING)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._done: defer.Deferred[None] = defer.Deferred()
        #: Milliseconds the last :meth:`stop` took, once it is done.
        self.stop_ms: float | None = None

    @property
    def running(self) -> bool:
        """The thread is receiving."""
        return self._thread is not None and not self._done.called

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=f"sysv-receiver-{self._queue.key:#x}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failure: Exception | None = None
        while not self._stopping:
            self._pending.acquire()
            try:
                data = self._queue.receive()
            except Exception as e:  # QueueGone, or the queue became unusable (permissions)
                self._pending.release()
                failure = e
                break
            if self._stopping:
                self._pending.release()
                break
            self._reactor.callFromThread(self._deliver, data)
        self._reactor.callFromThread(self._exited, failure)

    def _deliver(self, data: bytes) -> None:
        try:
            self._handle(data)
        finally:
            self._pending.release()

    def _exited(self, failure: Exception | None) -> None:
        if not self._done.called:
            self._done.callback(None)
        if failure is not None and not self._stopping:
            self._lost(failure)

    def stop(self) -> defer.Deferred[None]:
        """Stop receiving: wake the thread with a message of its own; fires when it has exited.

        If it cannot be woken (queue full or gone) within :data:`STOP_SECONDS`,
        fires anyway: the thread is a daemon and ends with the process.
        """
        if self._thread is None or self._done.called:
            return defer.succeed(None)
        self._stopping = True
        started = time.perf_counter()
        done: defer.Deferred[None] = defer.Deferred()
        wakes: list[Any] = []

        def wake() -> None:
            if not self._done.called and not self._queue.wake():
                wakes.append(self._reactor.callLater(0.1, wake))  # full: try again soon

        def exited(_: object) -> None:
            self.stop_ms = (time.perf_counter() - started) * 1000
            log.info("SysV receiving thread stopped in {ms:.2f} ms", ms=self.stop_ms)
            finish()

        def give_up() -> None:
            log.warn("SysV receiving thread did not stop within {s} s; left to end with the process", s=STOP_SECONDS)
            finish()

        def finish() -> None:
            for call in (*wakes, timeout):
                if call.active():
                    call.cancel()
            if not done.called:
                done.callback(None)

        timeout = self._reactor.callLater(STOP_SECONDS, give_up)
        self._done.addCallback(exited)
        wake()
        return done


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


class SysVFrontend(Frontend):
    """The System V message-queue front-end (``--sysv KEY``), composed for the node."""

    name = "sysv"

    def __init__(self, hub: Hub, config: NodeConfig, auth: AuthPolicy | None, reactor: Any) -> None:
        super().__init__()
        key = config.sysv_key()
        if key is None:
            raise ValueError("the SysV front-end needs --sysv KEY")
        self.key = key
        self._hub = hub
        self._config = config
        self._auth = auth
        self._reactor = reactor
        section = config.sysv
        self.limits = SysVLimits(
            max_users=section.max_users,
            max_channels=section.max_channels,
            max_subscriptions=section.max_subscriptions,
            max_blocks=section.max_blocks,
            client_queue_share=section.client_queue_share,
            stray_grace=float(section.stray_grace),
        )
        #: Where the registry survives restarts.
        self.state_path = os.path.join(config.node.data_dir, f"sysv-{key:#x}.json")
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
            prefix=self._config.sysv.prefix,
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
