"""The latency runs' pacing (pubsubclub.bench.pacing): each message waits for its own due time."""

from __future__ import annotations

from pubsubclub.bench.pacing import until_due


def test_the_wait_is_until_the_next_messages_own_due_time() -> None:
    """Woken 0.3 ms late for message 4 of a 1 ms schedule, message 5 is waited for 0.7 ms, not a fixed 1 ms."""
    start, interval = 100.0, 0.001
    assert abs(until_due(start, 5, interval, start + 0.0043) - 0.0007) < 1e-9


def test_a_late_message_is_not_waited_for() -> None:
    """Past its due time the wait is zero (never negative)."""
    assert until_due(100.0, 3, 0.001, 100.01) == 0.0
