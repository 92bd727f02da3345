"""The NSD store and clock: retention, last-writer-wins subscriptions, dedupe, the hybrid clock."""

from __future__ import annotations

import time
from pathlib import Path

from pubsubclub.frontends.nsd.protocol import HybridClock
from pubsubclub.frontends.nsd.store import NSDStore


def test_retention_by_count_keeps_the_newest_per_channel(tmp_path: Path) -> None:
    """Count retention keeps the newest N messages of each channel."""
    store = NSDStore(str(tmp_path / "s.sqlite3"))
    for i in range(5):
        store.add_message("a", 10 + i, f"a{i}", f'"a{i}"'.encode())
        store.add_message("b", 10 + i, f"b{i}", f'"b{i}"'.encode())
    assert store.apply_retention(2, None) == 6
    assert [m for _, m in store.messages_after(["a", "b"], 0, 100)] == [b'"a3"', b'"b3"', b'"a4"', b'"b4"']


def test_retention_by_age_drops_old_messages(tmp_path: Path) -> None:
    """Age retention drops messages stored longer ago than the limit."""
    store = NSDStore(str(tmp_path / "s.sqlite3"))
    store.add_message("a", 1, "old", b"1")
    store._db.execute("UPDATE messages SET stored_at = ?", (time.time() - 3600,))
    store.add_message("a", 2, "new", b"2")
    assert store.apply_retention(None, 60) == 1
    assert store.messages_after(["a"], 0, 10) == [("a", b"2")]


def test_subscriptions_last_writer_wins_and_messages_dedupe(tmp_path: Path) -> None:
    """An older (un)subscription never overrides a newer one; a message id is stored once."""
    store = NSDStore(str(tmp_path / "s.sqlite3"))
    assert store.set_subscription("alice", "bob", True, 20)
    assert not store.set_subscription("alice", "bob", False, 10)
    assert store.subscribed("alice") == ["bob"]
    assert store.set_subscription("alice", "bob", False, 30)
    assert store.subscribed("alice") == []
    assert store.add_message("a", 1, "id-1", b"1")
    assert not store.add_message("a", 1, "id-1", b"1")


def test_state_survives_reopening_the_file(tmp_path: Path) -> None:
    """Channels, subscriptions and history are on disk."""
    path = str(tmp_path / "s.sqlite3")
    store = NSDStore(path)
    store.add_channel("a", 1)
    store.set_subscription("x", "a", True, 1)
    store.add_message("a", 5, "m", b"{}")
    store.close()
    again = NSDStore(path)
    assert again.channels() == ["a"] and again.subscribed("x") == ["a"] and again.max_when() == 5


def test_hybrid_clock_is_monotonic_and_moves_past_what_it_sees() -> None:
    """The clock never goes back, even when wall time does, and jumps past observed values."""
    now = [100.0]
    clock = HybridClock(lambda: now[0])
    first = clock.tick()
    now[0] = 99.0  # the wall clock stepped back
    second = clock.tick()
    assert second == first + 1
    clock.observe(second + 1_000_000)
    assert clock.tick() == second + 1_000_001
