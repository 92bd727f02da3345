"""The System V front-end: C programs on a message queue, on the node's hub.

The protocol is docs/specs/sysv-protocol.pl.md; the wire is
:mod:`pubsubclub.frontends.sysv.codec`; every choice the spec leaves open is in
docs/sysv.md. The parts, from the inside out:

* :class:`SysVService` (this module) is the protocol (sans-IO, no Twisted): users,
  channels, subscriptions and blocks; one request in, the replies out through
  a :class:`~pubsubclub.frontends.sysv.budget.ClientQueue`; hub sinks for
  channels with subscribers. It is tested in memory with a fake queue.
* :mod:`~pubsubclub.frontends.sysv.budget`: whether one more message for a
  client may go on the small shared queue.
* :mod:`~pubsubclub.frontends.sysv.queue`: the real queue (``sysv_ipc``) and
  the thread that receives from it.
* :mod:`~pubsubclub.frontends.sysv.frontend`: :class:`SysVFrontend` composes them for the node.

Channels and hub topics
    SysV channel ``c`` is hub topic ``prefix + c`` (``--sysv-prefix``). The
    channel registry is this node's (the queue is): a channel exists for the
    node's SysV clients once one of them registered it (MSGREG).

The old names (``QueueBudget``, ``SysVQueue``, ``SysVFrontend``...) stay importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.logger import Logger

from pubsubclub.core.counters import DropReason, Kind, Source, SysVEvent
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.frontends.sysv.budget import (
    REQUEST_RESERVE,
    ClientQueue,
    QueueBudget,
    QueueFull,
    QueueGone,
    SysVLimits,
    process_start,
)
from pubsubclub.frontends.sysv.codec import (
    BODY_SIZE,
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
    decode_request,
    delivery,
    delivery_text,
    new_channel,
    next_count,
    reply,
)
from pubsubclub.frontends.sysv.queue import QueueReceiver, SysVQueue
from pubsubclub.frontends.sysv.registry import _User, restore, snapshot
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role

__all__ = [
    "REQUEST_RESERVE",
    "ClientQueue",
    "QueueBudget",
    "QueueFull",
    "QueueGone",
    "QueueReceiver",
    "SysVLimits",
    "SysVQueue",
    "SysVService",
    "process_start",
]

log = Logger()

#: Delivery counters reserved (and saved) ahead, so a crash never reuses one.
COUNT_RESERVE_STEP = 10_000


class _ChannelSink:
    """The hub sink of one channel with SysV subscribers on this node."""

    #: The hub counts this sink's deliveries (docs/metrics.md, "Who counts a delivery").
    counts_as = Source.SYSV

    def __init__(self, service: SysVService, channel: str) -> None:
        self._service = service
        self.channel = channel

    def deliver(self, envelope: Envelope) -> int:
        """A message from any front-end or node: to every subscriber of the channel; how many were sent it."""
        return self._service.fan_out(self.channel, envelope, self._service.publishing)


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
        #: The PID whose publish the hub is delivering now (its own channel sink skips it), else None.
        self.publishing: int | None = None
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
        self.hub.metrics.event(SysVEvent.REQUESTS)
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
            self.hub.metrics.error(Source.SYSV, "internal_error")

    def _bad_request(self, reason: str, detail: str, sender: int | None) -> None:
        self.hub.metrics.event(SysVEvent.BAD_REQUESTS)
        self.hub.metrics.error(Source.SYSV, reason)
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
        self.hub.metrics.count(topic, Source.SYSV, Kind.PUBLISHED, 1, payload_size(envelope))
        # This node's SysV subscribers are served below, where blocks are known.
        # The hub hands it to this node's SysV subscribers too (through the channel's sink, which skips the
        # publisher and those blocking it), so it counts their deliveries as it does every front-end's.
        self.publishing = pid
        try:
            self.hub.publish(envelope)
        finally:
            self.publishing = None

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
            self.hub.metrics.event(SysVEvent.REPLIES)
            if pid not in self.users:
                self._replied[pid] = self._clock()

    def _send(self, pid: int, data: bytes, topic: str | None = None, is_reply: bool = False) -> bool:
        """Put ``data`` on the queue for ``pid`` if its budget allows; count what does not go."""
        reason = None
        if not self.budget.admit(pid, self.queue, len(self.users)):
            reason = DropReason.SLOW_CONSUMER
        else:
            try:
                self.queue.send(pid, data)
            except QueueFull:
                reason = DropReason.QUEUE_FULL
            except QueueGone:
                reason = DropReason.QUEUE_GONE
        if reason is None:
            self.budget.sent(pid, is_reply)
            return True
        self.hub.metrics.event(SysVEvent.DROPPED)
        if topic is not None:
            self.hub.metrics.count(topic, Source.SYSV, Kind.DROPPED, 1, BODY_SIZE, reason=reason)
        else:
            self.hub.metrics.error(Source.SYSV, f"reply_{reason}")
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

    def fan_out(self, channel: str, envelope: Envelope, sender: int | None) -> int:
        """Deliver ``envelope`` to the channel's subscribers (not ``sender``, nor those blocking it); how many got it.

        Deliveries are counted by the hub, from what this returns; drops here.
        """
        subscribers = self.subscriptions.get(channel)
        if not subscribers:
            return 0
        data = self._delivery(channel, envelope)
        topic = envelope.topic
        if data is None:
            size = payload_size(envelope)
            self.hub.metrics.count(topic, Source.SYSV, Kind.DROPPED, len(subscribers), size, reason=DropReason.NOT_JSON)
            self.hub.metrics.event(SysVEvent.DROPPED, len(subscribers))
            return 0
        sent = 0
        for pid, remaining in list(subscribers.items()):
            if pid == sender or (sender is not None and sender in self.blocks.get(pid, ())):
                continue
            if not self._send(pid, data, topic):
                continue
            sent += 1
            if remaining == 1:
                self._remove_subscription(channel, pid)  # its k messages are delivered
            elif remaining > 1:
                subscribers[pid] = remaining - 1
                self.dirty = True
        if sent:
            self.hub.metrics.event(SysVEvent.DELIVERIES, sent)
        return sent

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
                self.hub.metrics.event(SysVEvent.CLIENTS_GONE)
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
            self.hub.metrics.event(SysVEvent.STRAYS_REMOVED, removed)
            self.hub.metrics.error(Source.SYSV, "stray_removed", removed)
        return removed

    def save(self) -> None:
        """Hand the state to the ``save`` callback (if any); it is no longer dirty."""
        self.dirty = False
        if self._save is not None:
            self._save(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The state that survives a restart, as JSON-ready data (see :mod:`pubsubclub.frontends.sysv.registry`)."""
        return snapshot(self)

    def restore(self, state: dict[str, Any]) -> None:
        """Load a :meth:`snapshot`; see :func:`~pubsubclub.frontends.sysv.registry.restore` (ValueError if not one)."""
        restore(self, state)

    def close(self) -> None:
        """Leave the hub (the registry stays, for :meth:`snapshot`)."""
        for channel, sink in list(self._sinks.items()):
            self.hub.unsubscribe(self.topic(channel), sink)
        self._sinks.clear()

    @property
    def counts(self) -> dict[str, int]:
        """The front-end's event counters: a view of the node's metrics (/metrics shows the same numbers)."""
        return self.hub.metrics.view("sysv")

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


def _show(nick: bytes) -> str:
    """A nick for logs."""
    return nick.decode("utf-8", "replace")


def __getattr__(name: str) -> Any:
    """``SysVFrontend`` by its old path (frontend.py imports this module, so it is looked up when asked)."""
    if name == "SysVFrontend":
        from pubsubclub.frontends.sysv.frontend import SysVFrontend

        return SysVFrontend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
