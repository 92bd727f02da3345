"""A node's workers share failed logins (in memory): PSC601/602, the links that may carry them, relay and merge."""

from __future__ import annotations

from typing import Any

import pytest

from pubsubclub.core.loginthrottle import RETRY_ELSEWHERE, LoginThrottle, LoginThrottleSettings
from pubsubclub.federation import psc, psc_logins
from pubsubclub.federation.logins import ClusterLogins
from pubsubclub.federation.session import CLOSE_BAD_MESSAGE, LinkError, LinkSession, LinkState, Role

V07 = (psc.V0_1, psc.V0_2, psc.V0_3, psc.V0_4, psc.V0_5, psc.V0_6, psc.V0_7)


class Clock:
    """A clock the test moves."""

    now = 1000.0

    def __call__(self) -> float:
        """Now."""
        return self.now


class Owner:
    """A LinkOwner that records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("link_"):
            raise AttributeError(name)
        return lambda link, *args: self.calls.append((name, args))


class Peer:
    """What ClusterLogins reads of a link (an open producer link to another process of the node)."""

    role = Role.PRODUCER
    state = LinkState.OPEN
    same_node = True

    def __init__(self, name: str) -> None:
        self.peer_node = name
        self.sent: list[Any] = []

    def send_raw(self, data: bytes) -> None:
        """Record the message, decoded."""
        self.sent.append(psc.decode(data))


def consumer_link(owner: Owner) -> LinkSession:
    """A consumer link after its 0.7 handshake."""
    link = LinkSession(Role.CONSUMER, [].append, owner, "peer", versions=V07)  # type: ignore[arg-type]
    link.start()
    link.receive(psc.encode(psc.ChooseVersion(psc.V0_7)))
    link.receive(psc.encode(psc.Position("epoch", 0, 0)))
    return link


def shared(clock: Clock, relaying: bool = False, **settings: Any) -> tuple[ClusterLogins, LoginThrottle]:
    """A ClusterLogins with its throttle attached."""
    logins = ClusterLogins(lambda delay, f: f(), lambda session: 0, lambda session: 1 << 20)
    logins.enabled = True
    logins.relaying = relaying
    throttle = LoginThrottle(LoginThrottleSettings(**settings), clock)
    logins.attach(throttle)
    return logins, throttle


def test_codec_round_trips_and_refuses_out_of_bounds_rows() -> None:
    """PSC601/602 decode to what was encoded; too many rows, bad sources, counts or times are decode errors."""
    assert psc.decode(psc_logins.FailedLogin("10.0.0.1").encode()) == psc_logins.FailedLogin("10.0.0.1")
    table = psc_logins.LoginTable((("10.0.0.1", 4, 1.5, 30.0), ("2001:db8::/64", 1, 0.0, 0.0)))
    assert psc.decode(table.encode()) == table
    too_many = psc_logins.LoginTable((("10.0.0.1", 1, 0.0, 0.0),) * (psc_logins.MAX_ROWS + 1)).encode()
    bad = [
        too_many,
        b'[601, ""]',
        b'[601, "' + b"x" * (psc_logins.MAX_SOURCE_LENGTH + 1) + b'"]',
        b'[601, "a", "b"]',
        b'[602, [["a", 0, 0, 0]]]',
        b'[602, [["a", 1, -1, 0]]]',
        b'[602, [["a", 1, 0, 1e400]]]',
        b'[602, [["a", 1, 0]]]',
        b'[602, {"a": 1}]',
    ]
    for data in bad:
        with pytest.raises(psc.PSCDecodeError):
            psc.decode(data)


def test_a_link_not_between_two_processes_of_the_node_refuses_them() -> None:
    """PSC601 from another node is a protocol error (4400); on a link to the node's primary it reaches the owner."""
    owner = Owner()
    link = consumer_link(owner)
    with pytest.raises(LinkError) as refused:
        link.receive(psc_logins.FailedLogin("10.0.0.1").encode())
    assert refused.value.code == CLOSE_BAD_MESSAGE
    link.same_node = True
    link.receive(psc_logins.FailedLogin("10.0.0.1").encode())
    assert [args for name, args in owner.calls if name == "link_logins"] == [(psc_logins.FailedLogin("10.0.0.1"),)]


def test_the_primary_relays_a_workers_failure_to_the_other_workers_only() -> None:
    """A failure from w1 is counted by the primary and sent to w2, never back to w1; a local one goes to both."""
    clock = Clock()
    logins, throttle = shared(clock, relaying=True, failures_before_delay=1, first_delay=60.0)
    w1, w2 = Peer("n.w1"), Peer("n.w2")
    logins.link_open(w1)  # type: ignore[arg-type]
    logins.link_open(w2)  # type: ignore[arg-type]
    assert w1.sent == [] and w2.sent == []  # an empty table sends nothing
    logins.receive(w1, psc_logins.FailedLogin("10.0.0.1"))  # type: ignore[arg-type]
    assert w1.sent == [] and w2.sent == [psc_logins.FailedLogin("10.0.0.1")]
    throttle.failed("10.0.0.1")  # the second failure, seen by the primary itself: the lockout starts
    assert throttle.locked("10.0.0.1") == 60.0
    assert w1.sent == w2.sent[1:] == [psc_logins.FailedLogin("10.0.0.1")]
    assert throttle.stats()["replicated"] == 1 and throttle.stats()["failures"] == 1


def test_a_table_is_sent_on_link_up_and_merged_by_max_and_only_news_are_relayed() -> None:
    """Link-up sends the table in PSC602s of at most MAX_ROWS; merging is idempotent; the primary relays news."""
    clock = Clock()
    logins, throttle = shared(clock, relaying=True, failures_before_delay=1, first_delay=60.0)
    for i in range(psc_logins.MAX_ROWS + 1):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    w1, w2 = Peer("n.w1"), Peer("n.w2")
    logins.link_open(w1)  # type: ignore[arg-type]
    assert [len(m.rows) for m in w1.sent] == [psc_logins.MAX_ROWS, 1]
    logins.link_open(w2)  # type: ignore[arg-type]
    w1.sent.clear()
    w2.sent.clear()
    worker, worker_throttle = shared(Clock(), failures_before_delay=1, first_delay=60.0)
    for message in [psc_logins.LoginTable(((key, 2, 1.0, 59.0),)) for key in ("10.0.0.0", "192.0.2.1")]:
        logins.receive(w1, message)  # type: ignore[arg-type]
        logins.receive(w1, message)  # merged twice: the second tells nothing new
    assert w1.sent == []
    assert [m.rows for m in w2.sent] == [(("10.0.0.0", 2, 1.0, 59.0),), (("192.0.2.1", 2, 1.0, 59.0),)]
    assert throttle.locked("192.0.2.1") == pytest.approx(59.0)
    for message in w2.sent:
        worker.receive(w2, message)  # type: ignore[arg-type]
    assert worker_throttle.locked("192.0.2.1") == pytest.approx(59.0)


def test_merging_keeps_the_cap_and_ignores_forgotten_rows() -> None:
    """A table larger than max_sources leaves max_sources; rows quiet for forget_after are not taken; lockouts
    longer than max_delay are cut to it."""
    clock = Clock()
    _, throttle = shared(clock, max_sources=10, forget_after=100.0, max_delay=60.0)
    for i in range(50):
        throttle.merge(f"10.0.0.{i}", 3, 1.0, 0.0)
    assert len(throttle) == 10 and throttle.stats()["forgotten_early"] == 40
    assert not throttle.merge("10.0.1.1", 9, 100.0, 50.0)
    assert throttle.merge("10.0.1.2", 9, 0.0, 10_000.0) and throttle.locked("10.0.1.2") == 60.0


def test_a_worker_leaves_a_source_past_its_free_failures_to_the_primary() -> None:
    """With checks_past_free off, a source at its free failures is refused (retry elsewhere), one below is not."""
    clock = Clock()
    _, throttle = shared(clock, failures_before_delay=2, first_delay=60.0, forget_after=100.0)
    throttle.checks_past_free = False
    throttle.replicated("10.0.0.1")
    assert throttle.locked("10.0.0.1") == 0.0
    throttle.replicated("10.0.0.1")
    assert throttle.locked("10.0.0.1") == RETRY_ELSEWHERE
    clock.now += 100.0  # quiet for forget_after: a fresh source again
    assert throttle.locked("10.0.0.1") == 0.0
    assert throttle.stats()["elsewhere"] == 1 and throttle.stats()["refused"] == 1
