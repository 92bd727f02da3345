"""The login throttle on a fake clock: free failures, growing lockouts, per source, bounded memory."""

from __future__ import annotations

import pytest

from pubsubclub.core.loginthrottle import LoginThrottle, LoginThrottleSettings, source_key


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        """Now."""
        return self.now


@pytest.fixture
def clock() -> Clock:
    """A fresh fake clock."""
    return Clock()


def throttle(clock: Clock, **settings: float) -> LoginThrottle:
    """A throttle with ``settings`` over the defaults."""
    return LoginThrottle(LoginThrottleSettings(**settings), clock)  # type: ignore[arg-type]


def test_failures_before_delay_are_free_then_lockouts_double_up_to_the_cap(clock: Clock) -> None:
    """3 failures cost nothing; then 1, 2, 4, 8 s ... up to the 10 s cap; attempts meanwhile are refused."""
    guard = throttle(clock, failures_before_delay=3, first_delay=1.0, max_delay=10.0)
    for _ in range(3):
        assert guard.locked("10.0.0.1") == 0.0
        assert guard.failed("10.0.0.1") == 0.0
    lockouts = []
    for _ in range(6):
        assert guard.locked("10.0.0.1") == 0.0
        delay = guard.failed("10.0.0.1")
        lockouts.append(delay)
        clock.now += delay / 2
        assert guard.locked("10.0.0.1") == pytest.approx(delay / 2)
        clock.now += delay / 2
    assert lockouts == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert guard.stats() == {
        "sources": 1,
        "failures": 9,
        "lockouts": 6,
        "refused": 6,
        "forgotten_early": 0,
        "replicated": 0,
        "elsewhere": 0,
    }


def test_a_locked_source_does_not_lock_out_another(clock: Clock) -> None:
    """The guesser's address is locked; the real principal's address may still try."""
    guard = throttle(clock, failures_before_delay=1, first_delay=60.0)
    guard.failed("127.0.0.1")
    guard.failed("127.0.0.1")
    assert guard.locked("127.0.0.1") == 60.0
    assert guard.locked("127.0.0.2") == 0.0


def test_a_quiet_source_is_forgotten_after_forget_after(clock: Clock) -> None:
    """No failure for ``forget_after`` seconds: the count starts again (and the entry is dropped)."""
    guard = throttle(clock, failures_before_delay=2, first_delay=1.0, forget_after=100.0)
    for _ in range(3):
        guard.failed("10.0.0.1")
    clock.now += 100.0
    assert guard.failed("10.0.0.1") == 0.0  # counted as the first again
    guard.failed("10.0.0.2")
    clock.now += 100.0
    guard.failed("10.0.0.3")
    assert len(guard) == 1  # the two quiet ones went when a new failure came


def test_the_table_is_bounded_and_forgets_the_least_recent_failure(clock: Clock) -> None:
    """Failures from more than ``max_sources`` addresses keep only the most recent ones."""
    guard = throttle(clock, failures_before_delay=1, first_delay=60.0, max_sources=100)
    for i in range(1000):
        guard.failed(f"10.0.{i // 256}.{i % 256}")
        guard.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(guard) == 100
    assert guard.locked("10.0.3.231") > 0  # the last one
    assert guard.locked("10.0.0.0") == 0.0  # the first, forgotten
    assert guard.stats()["forgotten_early"] == 900


def test_ipv6_sources_count_per_64_and_mapped_ipv4_as_ipv4() -> None:
    """Addresses of one /64 share a count; ::ffff:a.b.c.d is a.b.c.d; anything else is its own key."""
    assert source_key("2001:db8:1:2::1") == source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_key("192.0.2.7") == "192.0.2.7"
    assert source_key("/tmp/socket") == "/tmp/socket"


def test_challenges_held_open_at_once_are_refused_unchecked_once_locked(clock: Clock) -> None:
    """A guesser holding many CHALLENGEs: once its source is locked, even the right ticket gets ABORT too_many."""
    from autobahn.wamp import message
    from autobahn.wamp.role import RoleSubscriberFeatures

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp.auth import parse_auth
    from pubsubclub.frontends.wamp.broker import TOO_MANY_FAILURES, WampRouter
    from pubsubclub.testing import MemoryWampTransport

    policy = parse_auth('[roles.w]\nsubscribe = [""]\n[[principals]]\nauthid = "alice"\nrole = "w"\nticket = "right"\n')
    guard = throttle(clock, failures_before_delay=1, first_delay=60.0)
    router = WampRouter(Hub(), auth=policy, login_throttle=guard)
    transports = []
    for _ in range(4):
        session, transport = router.session_factory(), MemoryWampTransport()
        session.onOpen(transport)
        roles = {"subscriber": RoleSubscriberFeatures()}
        session.onMessage(message.Hello("realm1", roles, authmethods=["ticket"], authid="alice"))
        assert isinstance(transport.sent[-1], message.Challenge)
        transports.append((session, transport))
    for (session, _), answer in zip(transports, ["wrong", "wrong", "right", "wrong"], strict=True):
        session.onMessage(message.Authenticate(answer))
    reasons = [transport.sent[-1].reason for _, transport in transports]
    assert reasons == ["wamp.error.authentication_failed"] * 2 + [TOO_MANY_FAILURES] * 2
    assert guard.stats()["failures"] == 2
