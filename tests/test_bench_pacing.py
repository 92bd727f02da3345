"""The latency runs' pacing (pubsubclub.bench.pacing): each message waits for its own due time."""

from __future__ import annotations

from pubsubclub.bench.pacing import paced, until_due


def test_the_wait_is_until_the_next_messages_own_due_time() -> None:
    """Woken 0.3 ms late for message 4 of a 1 ms schedule, message 5 is waited for 0.7 ms, not a fixed 1 ms."""
    start, interval = 100.0, 0.001
    assert abs(until_due(start, 5, interval, start + 0.0043) - 0.0007) < 1e-9


def test_a_late_message_is_not_waited_for() -> None:
    """Past its due time the wait is zero (never negative)."""
    assert until_due(100.0, 3, 0.001, 100.01) == 0.0


class FakeClock:
    """``time.time`` and ``time.sleep`` on a clock that only sleeping (or the test) moves; the sleeps are kept."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        self.now += seconds


def test_paced_yields_each_number_at_its_due_time_catches_up_after_a_stall_and_stops_at_the_deadline() -> None:
    """At 1,000/s from t=100: 0 at once, 1 after 1 ms; a 2.5 ms stall after 1 releases 2 and 3 at once.

    The deadline is checked before each wait: 4 was started before it, 5 is not.
    """
    clock = FakeClock(100.0)
    got: list[tuple[int, float]] = []
    for number in paced(100.0, 10, 1000.0, 100.0039, now=clock.time, sleep=clock.sleep):
        got.append((number, round(clock.now, 9)))
        if number == 1:
            clock.now += 0.0025  # the sender stalled after message 1
    assert got == [(0, 100.0), (1, 100.001), (2, 100.0035), (3, 100.0035), (4, 100.004)]
    assert clock.sleeps == [0.001, 0.0005]
