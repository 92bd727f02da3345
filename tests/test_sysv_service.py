"""The System V protocol in memory: every scenario's replies, limits, budget, sweeps and saved state."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.frontends.sysv.codec import (
    BODY_SIZE,
    MESSAGE_COUNT_BASE,
    RawMessage,
    Signal,
    pack,
    unpack,
)
from pubsubclub.frontends.sysv.service import REQUEST_RESERVE, QueueBudget, QueueFull, SysVLimits, SysVService
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role

OK = Signal.OPERATION_SUCCESS


class FakeQueue:
    """A System V queue in memory: (receiver, message) pairs in order, ``capacity`` messages at most."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.messages: list[tuple[int, bytes]] = []
        self._capacity = capacity

    def send(self, pid: int, data: bytes) -> None:
        """msgsnd with IPC_NOWAIT."""
        assert len(data) == BODY_SIZE
        if len(self.messages) >= self._capacity:
            raise QueueFull
        self.messages.append((pid, data))

    def waiting(self, pid: int) -> bool:
        """Something waits for ``pid``."""
        return any(p == pid for p, _ in self.messages)

    def used(self) -> int:
        """Messages on the queue."""
        return len(self.messages)

    def capacity(self) -> int:
        """Messages it holds."""
        return self._capacity

    def purge(self, pid: int) -> int:
        """Remove ``pid``'s messages."""
        before = len(self.messages)
        self.messages = [(p, d) for p, d in self.messages if p != pid]
        return before - len(self.messages)

    def addressees(self) -> set[int] | None:
        """The receivers of what is on the queue."""
        return {p for p, _ in self.messages}

    def read(self, pid: int) -> list[RawMessage]:
        """What client ``pid`` reads now (msgrcv until ENOMSG)."""
        mine = [unpack(d) for p, d in self.messages if p == pid]
        self.messages = [(p, d) for p, d in self.messages if p != pid]
        return mine


class Recorder:
    """A hub sink of another front-end."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []

    def deliver(self, envelope: Envelope) -> None:
        """Keep it."""
        self.envelopes.append(envelope)


class World:
    """A service on a fake queue with live fake PIDs, and client helpers."""

    def __init__(self, limits: SysVLimits = SysVLimits(), capacity: int = 10_000, **kwargs: Any) -> None:
        self.hub = Hub("n1")
        self.queue = FakeQueue(capacity)
        self.alive: dict[int, int] = {}
        self.saved: list[dict[str, Any]] = []
        self.service = SysVService(
            self.hub, self.queue, limits, process_start=self.alive.get, save=self.saved.append, **kwargs
        )

    def spawn(self, pid: int) -> int:
        """A live client process."""
        self.alive[pid] = 1000 + pid
        return pid

    def send(self, pid: int, signal: int, short: bytes = b"", long: bytes = b"") -> list[RawMessage]:
        """Client ``pid`` sends one message; everything it then reads."""
        self.service.message_received(pack(pid, signal, short, long))
        return self.queue.read(pid)

    def ask(self, pid: int, signal: int, short: bytes = b"", long: bytes = b"") -> Signal:
        """Send and return the one reply (nothing else may come)."""
        got = self.send(pid, signal, short, long)
        assert [m.sender for m in got] == [1], got
        return Signal(got[0].type)

    def login(self, pid: int, nick: bytes) -> int:
        """Spawn and log in."""
        self.spawn(pid)
        assert self.ask(pid, Signal.LOGIN, nick) == OK
        return pid

    def register(self, pid: int, channel: bytes) -> None:
        """MSGREG, and read what it brings."""
        replies = self.send(pid, Signal.MSGREG, channel)
        assert [m.type for m in replies] == [OK, Signal.NEW_CHANNEL]
        for other in self.service.users:
            if other != pid:
                self.queue.read(other)

    def texts(self, pid: int) -> list[str]:
        """Deliveries waiting for ``pid``, as text."""
        got = self.queue.read(pid)
        assert all(m.type >= MESSAGE_COUNT_BASE for m in got), got
        return [m.long_text.split(b"\0")[0].decode() for m in got]


def counted(world: World, kind: str, reason: str | None = None) -> int:
    """Messages the hub's metrics counted for SysV with ``kind`` (and ``reason``)."""
    return sum(
        n
        for (_, frontend, k, _, r), n, _ in world.hub.metrics.totals()
        if (frontend, k) == ("sysv", kind) and r == reason
    )


@pytest.fixture
def world() -> World:
    """A service with the spec's limits on a roomy fake queue."""
    return World()


# -- a) to k), each reply -------------------------------------------------------------------


def test_a_connection_is_acknowledged(world: World) -> None:
    """a) CONNECTION -> OPERATION_SUCCESS, whether logged in or not."""
    world.spawn(100)
    assert world.ask(100, Signal.CONNECTION) == OK
    world.login(101, b"alice")
    assert world.ask(101, Signal.CONNECTION) == OK


def test_b_login_replies(world: World) -> None:
    """b) OPERATION_SUCCESS, INVALID_USERNAME, UNAVAILABLE (nick taken, already logged in), SERVER_OVERFLOW."""
    world.spawn(100)
    assert world.ask(100, Signal.LOGIN, b"al") == Signal.INVALID_USERNAME
    assert world.ask(100, Signal.LOGIN, b"alice") == OK
    assert world.ask(100, Signal.LOGIN, b"alice2") == Signal.UNAVAILABLE
    world.spawn(101)
    assert world.ask(101, Signal.LOGIN, b"alice") == Signal.UNAVAILABLE
    for pid in range(102, 117):
        world.login(pid, f"user{pid}".encode())
    assert len(world.service.users) == 16
    world.spawn(200)
    assert world.ask(200, Signal.LOGIN, b"seventeenth") == Signal.SERVER_OVERFLOW
    assert world.ask(100, Signal.LOGOUT) == OK
    assert world.ask(200, Signal.LOGIN, b"seventeenth") == OK


def test_c_logout_replies(world: World) -> None:
    """c) OPERATION_SUCCESS when logged in, else SENDER_NOT_RECOGNIZED."""
    world.login(100, b"alice")
    assert world.ask(100, Signal.LOGOUT) == OK
    assert world.ask(100, Signal.LOGOUT) == Signal.SENDER_NOT_RECOGNIZED


def test_d_subscribe_replies(world: World) -> None:
    """d) SENDER_NOT_RECOGNIZED, NO_CHANNEL, OPERATION_SUCCESS, UNAVAILABLE (again)."""
    world.spawn(99)
    assert world.ask(99, Signal.SUBSCRIBE, b"news") == Signal.SENDER_NOT_RECOGNIZED
    world.login(100, b"alice")
    assert world.ask(100, Signal.SUBSCRIBE, b"news") == Signal.NO_CHANNEL
    assert world.ask(100, Signal.SUBSCRIBE, b"$tep.broadcast") == Signal.NO_CHANNEL
    world.register(100, b"news")
    assert world.ask(100, Signal.SUBSCRIBE, b"news", b"-1") == OK
    assert world.ask(100, Signal.SUBSCRIBE, b"news", b"5") == Signal.UNAVAILABLE
    assert world.hub.subscribers("news") == 1


def test_e_unsubscribe_replies(world: World) -> None:
    """e) SENDER_NOT_RECOGNIZED, NO_CHANNEL, UNAVAILABLE (not subscribed), OPERATION_SUCCESS."""
    world.spawn(99)
    assert world.ask(99, Signal.UNSUBSCRIBE, b"news") == Signal.SENDER_NOT_RECOGNIZED
    world.login(100, b"alice")
    assert world.ask(100, Signal.UNSUBSCRIBE, b"news") == Signal.NO_CHANNEL
    world.register(100, b"news")
    assert world.ask(100, Signal.UNSUBSCRIBE, b"news") == Signal.UNAVAILABLE
    assert world.ask(100, Signal.SUBSCRIBE, b"news") == OK
    assert world.ask(100, Signal.UNSUBSCRIBE, b"news") == OK
    assert world.hub.subscribers("news") == 0


def test_f_register_replies_and_new_channel_to_everyone(world: World) -> None:
    """f) OPERATION_SUCCESS then NEW_CHANNEL to every logged-in user, the registrant included; UNAVAILABLE again."""
    world.spawn(99)
    assert world.ask(99, Signal.MSGREG, b"news") == Signal.SENDER_NOT_RECOGNIZED
    for pid, nick in ((100, b"alice"), (101, b"bob"), (102, b"carol")):
        world.login(pid, nick)
    got = world.send(100, Signal.MSGREG, b"news")
    assert [(m.sender, m.type) for m in got] == [(1, OK), (1, Signal.NEW_CHANNEL)]
    assert got[1].short_text.rstrip(b"\0") == b"news"
    for pid in (101, 102):
        assert [(m.type, m.short_text.rstrip(b"\0")) for m in world.queue.read(pid)] == [(Signal.NEW_CHANNEL, b"news")]
    assert world.queue.read(99) == []  # not logged in: not told
    assert world.ask(101, Signal.MSGREG, b"news") == Signal.UNAVAILABLE
    assert world.ask(101, Signal.MSGREG, b"$cluster.gap") == Signal.UNAVAILABLE
    assert world.ask(101, Signal.MSGREG, b"") == Signal.UNAVAILABLE


def test_g_message_replies_and_h_deliveries(world: World) -> None:
    """g) SENDER_NOT_RECOGNIZED, NO_CHANNEL, OPERATION_SUCCESS; h) deliveries with type = a counter."""
    world.spawn(99)
    assert world.ask(99, Signal.MESSAGE, b"news", b"hi") == Signal.SENDER_NOT_RECOGNIZED
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    assert world.ask(alice, Signal.MESSAGE, b"news", b"hi") == Signal.NO_CHANNEL
    world.register(alice, b"news")
    for pid in (alice, bob, carol):
        assert world.ask(pid, Signal.SUBSCRIBE, b"news") == OK
    other = Recorder()
    world.hub.subscribe("news", other)
    assert world.ask(alice, Signal.MESSAGE, b"news", b"[news] [alice]: one") == OK
    assert world.ask(alice, Signal.MESSAGE, b"news", b"[news] [alice]: two") == OK  # the sender gets no copy
    got_bob, got_carol = world.queue.read(bob), world.queue.read(carol)
    assert [m.type for m in got_bob] == [MESSAGE_COUNT_BASE, MESSAGE_COUNT_BASE + 1]
    assert got_bob == got_carol  # one counter per message, for every recipient
    assert {m.sender for m in got_bob} == {1}
    assert [m.short_text.rstrip(b"\0") for m in got_bob] == [b"news", b"news"]
    assert [m.long_text.rstrip(b"\0") for m in got_bob] == [b"[news] [alice]: one", b"[news] [alice]: two"]
    assert [(e.topic, e.payload) for e in other.envelopes] == [
        ("news", "[news] [alice]: one"),
        ("news", "[news] [alice]: two"),
    ]


def test_i_block_and_j_unblock_replies(world: World) -> None:
    """i) and j): SENDER_NOT_RECOGNIZED, INVALID_USERNAME, UNAVAILABLE, OPERATION_SUCCESS; blocks filter by sender."""
    world.spawn(99)
    assert world.ask(99, Signal.BLOCK, b"bob") == Signal.SENDER_NOT_RECOGNIZED
    assert world.ask(99, Signal.UNBLOCK, b"bob") == Signal.SENDER_NOT_RECOGNIZED
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    world.register(alice, b"news")
    for pid in (alice, carol):
        world.ask(pid, Signal.SUBSCRIBE, b"news")
    assert world.ask(alice, Signal.BLOCK, b"nobody") == Signal.INVALID_USERNAME
    assert world.ask(alice, Signal.UNBLOCK, b"nobody") == Signal.INVALID_USERNAME
    assert world.ask(alice, Signal.UNBLOCK, b"bob") == Signal.UNAVAILABLE
    assert world.ask(alice, Signal.BLOCK, b"bob") == OK
    assert world.ask(alice, Signal.BLOCK, b"bob") == Signal.UNAVAILABLE
    assert world.ask(alice, Signal.BLOCK, b"alice") == Signal.UNAVAILABLE
    assert world.ask(bob, Signal.MESSAGE, b"news", b"from bob") == OK
    assert world.texts(carol) == ["from bob"]
    assert world.ask(carol, Signal.MESSAGE, b"news", b"from carol") == OK
    assert world.texts(alice) == ["from carol"]
    assert world.ask(alice, Signal.UNBLOCK, b"bob") == OK
    assert world.ask(bob, Signal.MESSAGE, b"news", b"again") == OK
    assert world.texts(alice) == ["again"]


def test_k_quit_logs_out_without_reply_and_clears_the_queue(world: World) -> None:
    """k) QUIT: no reply; the slot, subscriptions and blocks are freed; what waited for it is removed."""
    alice, bob = world.login(100, b"alice"), world.login(101, b"bob")
    world.register(alice, b"news")
    world.ask(bob, Signal.SUBSCRIBE, b"news")
    world.ask(alice, Signal.BLOCK, b"bob")
    world.ask(alice, Signal.MESSAGE, b"news", b"waiting for bob")
    assert world.queue.waiting(bob)
    del world.alive[bob]  # QUIT usually arrives after the client exited
    world.service.message_received(pack(bob, Signal.QUIT))
    assert not world.queue.waiting(bob)
    assert set(world.service.users) == {alice}
    assert world.service.stats()["subscriptions"] == 0 and world.service.stats()["blocks"] == 0
    assert world.hub.subscribers("news") == 0
    world.spawn(bob)
    assert world.ask(bob, Signal.LOGIN, b"bob") == OK


# -- quantities, limits, other front-ends --------------------------------------------------------


def test_a_quantity_of_k_ends_the_subscription_after_k_messages(world: World) -> None:
    """k > 0: exactly k deliveries, then the subscription is gone; 0 and below: durable."""
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    world.register(alice, b"news")
    assert world.ask(bob, Signal.SUBSCRIBE, b"news", b"2") == OK
    assert world.ask(carol, Signal.SUBSCRIBE, b"news", b"0") == OK
    for i in range(4):
        world.ask(alice, Signal.MESSAGE, b"news", f"m{i}".encode())
    assert world.texts(bob) == ["m0", "m1"]
    assert world.texts(carol) == ["m0", "m1", "m2", "m3"]
    assert world.ask(bob, Signal.UNSUBSCRIBE, b"news") == Signal.UNAVAILABLE
    assert world.ask(bob, Signal.SUBSCRIBE, b"news", b"1") == OK


def test_limits_answer_server_overflow() -> None:
    """Past max channels, subscriptions or blocks: SERVER_OVERFLOW (docs/sysv.md)."""
    world = World(SysVLimits(max_users=4, max_channels=2, max_subscriptions=3, max_blocks=1))
    a, b, c = world.login(100, b"aaa"), world.login(101, b"bbb"), world.login(102, b"ccc")
    world.register(a, b"one")
    world.register(a, b"two")
    assert world.ask(a, Signal.MSGREG, b"three") == Signal.SERVER_OVERFLOW
    assert [world.ask(p, Signal.SUBSCRIBE, b"one") for p in (a, b, c)] == [OK, OK, OK]
    assert world.ask(a, Signal.SUBSCRIBE, b"two") == Signal.SERVER_OVERFLOW
    assert world.ask(a, Signal.BLOCK, b"bbb") == OK
    assert world.ask(a, Signal.BLOCK, b"ccc") == Signal.SERVER_OVERFLOW
    assert world.ask(b, Signal.LOGOUT) == OK  # its subscription and the block on it go
    assert world.ask(a, Signal.SUBSCRIBE, b"two") == OK
    assert world.ask(a, Signal.BLOCK, b"ccc") == OK


def test_other_front_ends_reach_subscribers_as_text(world: World) -> None:
    """A hub message: str as is, JSON as compact text, long ones cut on a character boundary, bytes as WAMP JSON."""
    alice = world.login(100, b"alice")
    world.register(alice, b"news")
    world.ask(alice, Signal.SUBSCRIBE, b"news")
    hub = world.hub
    hub.publish(hub.envelope("news", "plain"))
    hub.publish(hub.envelope("news", {"args": [1, 2], "kwargs": {}}, wamp_wrapped=True))
    hub.publish(hub.envelope("news", "ż" * 200))
    hub.publish(hub.envelope("news", b"\x93msgpack"))
    hub.publish(hub.envelope("news", {1: "a MessagePack map with an integer key"}))
    hub.publish(hub.envelope("elsewhere", "not subscribed"))
    texts = world.texts(alice)
    assert texts[:2] == ["plain", '{"args":[1,2],"kwargs":{}}']
    assert texts[2] == "ż" * 127 and len(texts[2].encode()) == 254
    assert texts[3] == '"\\u0000k21zZ3BhY2s="'
    assert len(texts) == 4
    assert world.service.counts["dropped"] == 1


def test_publishes_follow_the_anonymous_role() -> None:
    """With --auth the anonymous role decides; a refused subscribe or publish is UNAVAILABLE."""
    policy = AuthPolicy(roles=(Role("guest", subscribe=("open.",), publish=("open.",)),), anonymous="guest")
    world = World(auth=policy)
    alice = world.login(100, b"alice")
    world.register(alice, b"open.x")
    world.register(alice, b"closed")
    assert world.ask(alice, Signal.SUBSCRIBE, b"closed") == Signal.UNAVAILABLE
    assert world.ask(alice, Signal.MESSAGE, b"closed", b"no") == Signal.UNAVAILABLE
    assert world.ask(alice, Signal.SUBSCRIBE, b"open.x") == OK
    assert world.ask(alice, Signal.MESSAGE, b"open.x", b"yes") == OK
    refusing = World(auth=AuthPolicy(roles=(Role("guest"),), anonymous=None))
    refusing.spawn(100)
    assert refusing.ask(100, Signal.LOGIN, b"alice") == Signal.UNAVAILABLE


def test_channels_map_to_prefixed_topics() -> None:
    """Channel c is hub topic prefix + c; a '$' prefix is refused."""
    world = World(prefix="sysv.")
    alice = world.login(100, b"alice")
    world.register(alice, b"news")
    world.ask(alice, Signal.SUBSCRIBE, b"news")
    assert world.hub.topics() == ["sysv.news"]
    with pytest.raises(ValueError):
        World(prefix="$x")


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x01\x02", "truncated"),
        (pack(100, Signal.LOGIN, b"alice") + b"junk", "oversized"),
        (pack(100, 77), "unknown_type"),
        (pack(1, Signal.LOGIN, b"alice"), "bad_sender"),
        (pack(100, Signal.SUBSCRIBE, b"news", b"many"), "bad_quantity"),
        (pack(100, Signal.MESSAGE, b"news", b"\xc3\x28"), "bad_text"),
        (pack(555, Signal.LOGIN, b"ghost"), "dead_sender"),
    ],
)
def test_bad_messages_are_counted_and_ignored(world: World, data: bytes, reason: str) -> None:
    """No reply, no state change, a counter; the next good request is served."""
    world.spawn(100)
    world.service.message_received(data)
    assert world.queue.messages == []
    assert world.hub.metrics.errors == {("sysv", reason): 1}
    assert world.ask(100, Signal.CONNECTION) == OK


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(99, 102), st.integers(0, 12), st.binary(max_size=16), st.binary(max_size=8))))
def test_any_sequence_of_messages_never_raises(messages: list[tuple[int, int, bytes, bytes]]) -> None:
    """Random requests from a few clients: replies only to live senders, counts stay consistent."""
    world = World(SysVLimits(max_users=2, max_channels=2, max_subscriptions=2, max_blocks=1))
    for pid in (100, 101, 102):
        world.spawn(pid)
    for sender, signal, short, long in messages:
        world.service.message_received(pack(sender, signal, short, long))
    service = world.service
    assert len(service.users) <= 2 and len(service.channels) <= 2
    assert service.stats()["subscriptions"] == sum(len(s) for s in service.subscriptions.values()) <= 2
    assert {pid for pid, _ in world.queue.messages} <= {100, 101, 102}


# -- the queue budget ---------------------------------------------------------------------------


def test_budget_guarantees_a_share_of_a_small_queue() -> None:
    """The kernel's default 16 KiB queue (58 messages) split among 16 users: 3 each, the reserve kept."""
    budget = QueueBudget(SysVLimits(), 16384 // BODY_SIZE)
    assert budget.guaranteed == (58 - REQUEST_RESERVE) // 16 == 3
    assert QueueBudget.wanted_bytes(SysVLimits()) == (16 * 64 + REQUEST_RESERVE) * BODY_SIZE
    assert QueueBudget(SysVLimits(), QueueBudget.wanted_bytes(SysVLimits()) // BODY_SIZE).guaranteed == 64


@pytest.mark.parametrize("capacity", [58, 16 * 64 + REQUEST_RESERVE])
def test_a_client_that_never_reads_does_not_stop_the_others(capacity: int) -> None:
    """Its deliveries are dropped past its share and counted; a reading client gets every message."""
    world = World(capacity=capacity)
    alice, slow, fast = world.login(100, b"alice"), world.login(101, b"slow"), world.login(102, b"fast")
    world.register(alice, b"news")
    world.ask(slow, Signal.SUBSCRIBE, b"news")
    world.ask(fast, Signal.SUBSCRIBE, b"news")
    received = []
    for i in range(300):
        assert world.ask(alice, Signal.MESSAGE, b"news", f"m{i}".encode()) == OK
        received += world.texts(fast)
    assert received == [f"m{i}" for i in range(300)]
    waiting = sum(1 for pid, _ in world.queue.messages if pid == slow)
    assert waiting <= 64
    assert world.queue.used() <= capacity - REQUEST_RESERVE
    assert world.service.counts["dropped"] == 300 - waiting
    assert counted(world, "dropped", "slow_consumer") == 300 - waiting
    assert counted(world, "delivered") == 300 + waiting
    assert world.service.counts["deliveries"] == 300 + waiting


def test_a_client_that_catches_up_is_served_again() -> None:
    """Once it has read what waited, its bound starts from zero."""
    world = World(capacity=58)
    alice, slow = world.login(100, b"alice"), world.login(101, b"slow")
    world.register(alice, b"news")
    world.ask(slow, Signal.SUBSCRIBE, b"news")
    for i in range(80):
        world.ask(alice, Signal.MESSAGE, b"news", f"m{i}".encode())
    first = world.texts(slow)
    assert 3 <= len(first) < 80
    world.ask(alice, Signal.MESSAGE, b"news", b"after")
    assert world.texts(slow) == ["after"]


def test_a_client_reading_only_its_replies_always_gets_them() -> None:
    """16 users on a 58-message queue, deliveries left unread: each request still gets its reply."""
    world = World(capacity=58)
    users = [world.login(100 + i, f"user{i:02}".encode()) for i in range(16)]
    first = users[0]
    world.send(first, Signal.MSGREG, b"news")  # OK and NEW_CHANNEL; the NEW_CHANNELs of all stay unread
    world.queue.messages = [(p, d) for p, d in world.queue.messages if not (p == first and unpack(d).type == OK)]
    world.service.message_received(pack(first, Signal.SUBSCRIBE, b"news"))
    for i in range(20):
        world.service.message_received(pack(first, Signal.MESSAGE, b"news", f"m{i}".encode()))
        replies = [m for m in (unpack(d) for p, d in world.queue.messages if p == first) if m.type == OK]
        assert replies, f"no reply to request {i}"
        world.queue.messages = [(p, d) for p, d in world.queue.messages if not (p == first and unpack(d).type == OK)]
    assert world.service.counts["dropped"] == 0


# -- clients that die, state that survives ---------------------------------------------------------


def test_sweep_logs_out_dead_clients_and_clears_their_messages(world: World) -> None:
    """A client whose process is gone (or whose PID now belongs to another process) is logged out."""
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    world.register(alice, b"news")
    world.ask(bob, Signal.SUBSCRIBE, b"news")
    world.ask(alice, Signal.MESSAGE, b"news", b"for bob")
    del world.alive[bob]
    world.alive[carol] += 1  # the PID was reused by a new process
    world.service.sweep()
    assert set(world.service.users) == {alice}
    assert not world.queue.waiting(bob)
    assert world.service.counts["clients_gone"] == 2
    assert world.hub.subscribers("news") == 0


def test_sweep_removes_messages_for_pids_no_client_has_and_spares_clients_and_fresh_replies() -> None:
    """Forged messages to a stranger PID go at the next sweep; a logged-in client's and a fresh reply stay."""
    now = [100.0]
    world = World(SysVLimits(stray_grace=2.0), clock=lambda: now[0])
    alice = world.login(100, b"alice")
    stranger = world.spawn(555)  # alive, never logged in
    waiting = world.spawn(556)  # asked CONNECTION, has not read the reply yet
    world.service.message_received(pack(waiting, Signal.CONNECTION))
    fill = pack(1, 0)
    for pid in (stranger, 777, alice, alice):  # 777: no process at all
        world.queue.messages.append((pid, fill))
    world.service.sweep()
    assert [p for p, _ in world.queue.messages] == [waiting, alice, alice]
    assert world.service.counts["strays_removed"] == 2
    now[0] += 1.9
    world.service.sweep()
    assert world.queue.waiting(waiting)  # still within its grace
    now[0] += 0.2
    world.service.sweep()
    assert [p for p, _ in world.queue.messages] == [alice, alice]
    assert world.service.counts["strays_removed"] == 3
    assert world.hub.metrics.errors[("sysv", "stray_removed")] == 3


def test_state_survives_a_restart(world: World) -> None:
    """Users, channels, subscriptions (with what is left of k), blocks and the counter come back."""
    alice, bob = world.login(100, b"alice"), world.login(101, b"sixteen-chars-ok")
    world.register(alice, b"news")
    world.ask(bob, Signal.SUBSCRIBE, b"news", b"3")
    world.ask(alice, Signal.SUBSCRIBE, b"news")
    world.ask(alice, Signal.BLOCK, b"sixteen-chars-ok")
    world.ask(alice, Signal.MESSAGE, b"news", b"m1")
    counter = world.queue.read(bob)[0].type
    state = world.service.snapshot()
    again = World()
    again.alive.update(world.alive)
    again.service.restore(state)
    assert again.service.snapshot() == state
    assert again.hub.topics() == ["news"]
    assert again.ask(alice, Signal.MESSAGE, b"news", b"m2") == OK
    (delivered,) = again.queue.read(bob)
    assert delivered.type > counter  # counters are reserved ahead: never repeated after a crash
    assert again.ask(bob, Signal.MESSAGE, b"news", b"blocked") == OK
    assert again.queue.read(alice) == []
    assert again.service.subscriptions["news"][bob] == 1


@pytest.mark.parametrize(
    "state",
    [
        None,
        {"version": 2},
        {"version": 1, "count_mark": 5},
        {"version": 1, "count_mark": 2000, "users": [[100, "zz", 1]]},
        {"version": 1, "count_mark": 2000, "users": "x"},
    ],
)
def test_a_broken_state_is_refused(state: Any) -> None:
    """restore raises ValueError (the front-end then starts empty)."""
    with pytest.raises(ValueError):
        World().service.restore(state)


def test_stats_and_metrics_show_the_same_sysv_counts(world: World) -> None:
    """SysV's /stats counters are events of the node's Metrics: pubsubclub_events_total shows the same numbers."""
    from pubsubclub.core.metrics import PrometheusCollector

    world.spawn(99)
    world.send(99, 12345)  # a bad request
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    world.register(alice, b"news")
    for pid in (bob, carol):
        world.ask(pid, Signal.SUBSCRIBE, b"news")
    for i in range(3):
        assert world.ask(alice, Signal.MESSAGE, b"news", f"m{i}".encode()) == OK
    stats = world.service.stats()
    assert stats["deliveries"] == 6 and stats["bad_requests"] == 1 and stats["requests"] > 6
    families = PrometheusCollector(world.hub.metrics, dict, list).collect()
    (events,) = [f for f in families if f.name == "pubsubclub_events"]
    scraped = {s.labels["event"]: s.value for s in events.samples if s.labels["component"] == "sysv"}
    assert scraped == {name: stats[name] for name in scraped}
    assert {"requests", "bad_requests", "replies", "deliveries"} <= set(scraped)


def test_the_hub_counts_sysv_deliveries_at_hand_off(world: World) -> None:
    """A SysV publish goes through the hub, which counts one delivery per SysV client sent it (the sender skipped)."""
    alice, bob, carol = world.login(100, b"alice"), world.login(101, b"bob"), world.login(102, b"carol")
    world.register(alice, b"news")
    for pid in (alice, bob, carol):
        world.ask(pid, Signal.SUBSCRIBE, b"news")
    assert world.ask(alice, Signal.MESSAGE, b"news", b"hello") == OK  # to bob and carol
    world.hub.publish(world.hub.envelope("news", "from wamp"))  # from another front-end: to all three
    assert len(world.texts(bob)) == 2 and len(world.texts(carol)) == 2 and world.texts(alice) == ["from wamp"]
    delivered = [
        (n, nbytes) for (topic, frontend, kind, _, _), n, nbytes in world.hub.metrics.totals()
        if (topic, frontend, kind) == ("news", "sysv", "delivered")
    ]  # fmt: skip
    # Counted by the hub at hand-off, as WAMP's: the payload's JSON size per recipient (docs/metrics.md).
    assert delivered == [(5, 2 * len(b'"hello"') + 3 * len(b'"from wamp"'))]
    assert world.service.counts["deliveries"] == 5 and world.hub.stats["published"] == 2
