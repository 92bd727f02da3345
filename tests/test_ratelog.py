"""The rate-limited log of refused connections, on a fake clock."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, LogLevel, formatEvent

from pubsubclub.net.ratelog import RateLimitedLog


def capture() -> tuple[Logger, list[dict[str, Any]]]:
    """A Logger whose events land in a list."""
    events: list[dict[str, Any]] = []
    return Logger(observer=events.append), events


def test_burst_then_one_count_per_interval() -> None:
    """1,000 refusals in one interval: the first five in full, then one line with the count of the rest."""
    log, events = capture()
    clock = Clock()
    rate = RateLimitedLog(log, clock, interval=10.0, burst=5)
    for i in range(1000):
        rate.warn("refused", "refused {n}", n=i)
    assert [formatEvent(e) for e in events] == [f"refused {i}" for i in range(5)]
    clock.advance(10)
    assert len(events) == 6
    assert formatEvent(events[-1]) == "refused: 995 more in the last 10 s, not logged one by one"
    assert events[-1]["log_level"] is LogLevel.warn
    assert rate.suppressed == 995 and clock.getDelayedCalls() == []


def test_new_window_logs_in_full_again_and_kinds_are_apart() -> None:
    """After the interval the next events are logged in full; each kind has its own budget."""
    log, events = capture()
    clock = Clock()
    rate = RateLimitedLog(log, clock, interval=10.0, burst=1)
    assert rate.warn("a", "a1") and not rate.warn("a", "a2")
    assert rate.info("b", "b1")
    clock.advance(10)
    assert rate.warn("a", "a3")
    assert [formatEvent(e) for e in events] == ["a1", "b1", "a: 1 more in the last 10 s, not logged one by one", "a3"]
    assert clock.getDelayedCalls() == []


def test_quiet_kind_leaves_no_timer_and_flush_reports() -> None:
    """Under the burst no timer is set; flush logs pending counts at once and cancels their timers."""
    log, events = capture()
    clock = Clock()
    rate = RateLimitedLog(log, clock, interval=10.0, burst=2)
    rate.warn("a", "x")
    assert clock.getDelayedCalls() == []
    for _ in range(4):
        rate.warn("b", "y")
    rate.flush()
    assert formatEvent(events[-1]) == "b: 2 more in the last 10 s, not logged one by one"
    assert clock.getDelayedCalls() == []
