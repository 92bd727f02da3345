"""The stream front-end's durable log: records, segments, crash recovery, retention, offsets."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.procfs import open_fds
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.frontends.stream.log import (
    HEADER_BYTES,
    INDEX_INTERVAL_BYTES,
    MAX_TOPIC_BYTES,
    DiskFullError,
    LogSettings,
    OffsetStore,
    Record,
    RetentionResult,
    StreamLog,
    StreamLogError,
    TopicLimitError,
)


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def open_log(path: Path, clock: Callable[[], float] | None = None, **options: Any) -> StreamLog:
    """A StreamLog in ``path`` with a fake clock unless one is given."""
    return StreamLog(str(path), LogSettings(**options), clock or FakeClock())


def crash(log: StreamLog) -> None:
    """Leave ``log`` as a killed process would: files as written, no sync, nothing stored on close."""
    log._release()


def segments(path: Path, topic: str) -> list[Path]:
    """The segment files of ``topic`` (a short name: its folder is its hex), oldest first."""
    return sorted((path / "topics" / topic.encode().hex()).glob("*.log"))


def everything(log: StreamLog, topic: str) -> list[Record]:
    """Every record ``topic`` still has."""
    return log.read(topic, 0, 1_000_000, 1 << 40)


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    """Appended payloads come back with their sequences (from 0, by one) and the clock's time."""
    clock = FakeClock(5.25)
    log = open_log(tmp_path, clock)
    log.retain("t")
    assert log.append("t", b"one") == 0
    clock.now = 6.5
    assert log.append("t", b"") == 1
    assert log.append("t", bytes(range(256)) * 40) == 2
    assert everything(log, "t") == [
        Record(0, 5.25, b"one"),
        Record(1, 6.5, b""),
        Record(2, 6.5, bytes(range(256)) * 40),
    ]
    assert (log.first_sequence("t"), log.next_sequence("t")) == (0, 3)
    assert log.read("t", 2, 10, 10) == [Record(2, 6.5, bytes(range(256)) * 40)]
    assert log.read("t", 3, 10, 10) == []
    log.close()


def test_read_stops_at_max_count_and_max_bytes_but_returns_at_least_one(tmp_path: Path) -> None:
    """A read honours both limits, except that the first record comes whatever its size."""
    log = open_log(tmp_path)
    log.retain("t")
    for i in range(10):
        log.append("t", bytes([i]) * 10)
    assert [r.sequence for r in log.read("t", 0, 3, 1000)] == [0, 1, 2]
    assert [r.sequence for r in log.read("t", 4, 100, 35)] == [4, 5, 6]
    assert [r.sequence for r in log.read("t", 4, 100, 5)] == [4]
    assert [r.sequence for r in log.read("t", -7, 1, 0)] == [0]
    assert log.read("t", 0, 0, 1000) == []
    log.close()


def test_unknown_topic_is_an_empty_log(tmp_path: Path) -> None:
    """A topic the node never kept reads empty and starts at 0."""
    log = open_log(tmp_path)
    assert log.read("nothing", 0, 10, 100) == []
    assert (log.first_sequence("nothing"), log.next_sequence("nothing")) == (0, 0)
    assert log.topics() == [] and not log.retained("nothing")
    log.close()


def test_sequences_continue_after_reopen(tmp_path: Path) -> None:
    """Records and the next sequence survive close and open."""
    log = open_log(tmp_path)
    log.retain("t")
    for i in range(5):
        log.append("t", b"m%d" % i)
    log.close()
    log = open_log(tmp_path)
    assert log.recovered_bytes == 0
    assert [r.payload for r in everything(log, "t")] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert log.append("t", b"m5") == 5
    log.close()


def test_segments_roll_at_segment_bytes_and_reads_cross_them(tmp_path: Path) -> None:
    """A record that would overfill the active segment starts a new file named by its sequence."""
    record = HEADER_BYTES + 50
    log = open_log(tmp_path, segment_bytes=2 * record + 10)
    log.retain("t")
    for i in range(9):
        log.append("t", bytes([65 + i]) * 50)
    names = [p.name for p in segments(tmp_path, "t")]
    assert names == [f"{base:020d}.log" for base in (0, 2, 4, 6, 8)]
    assert all(p.stat().st_size == 2 * record for p in segments(tmp_path, "t")[:-1])
    assert [r.sequence for r in log.read("t", 3, 4, 10_000)] == [3, 4, 5, 6]
    log.close()
    log = open_log(tmp_path, segment_bytes=2 * record + 10)
    assert [r.payload[:1] for r in log.read("t", 1, 100, 10_000)] == [bytes([65 + i]) for i in range(1, 9)]
    assert log.append("t", b"x" * 50) == 9
    assert [p.name for p in segments(tmp_path, "t")][-1] == f"{8:020d}.log"
    log.close()


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    """segment_bytes bounds how records are grouped, not how large one may be."""
    log = open_log(tmp_path, segment_bytes=100)
    log.retain("t")
    for size in (10, 500, 10):
        log.append("t", b"p" * size)
    assert [p.name for p in segments(tmp_path, "t")] == [f"{base:020d}.log" for base in (0, 1, 2)]
    assert [len(r.payload) for r in everything(log, "t")] == [10, 500, 10]
    log.close()


def test_sparse_index_is_rebuilt_on_open_and_finds_the_middle(tmp_path: Path) -> None:
    """A reopened segment gets an index entry about every INDEX_INTERVAL_BYTES, and reads start near their record."""
    log = open_log(tmp_path)
    log.retain("t")
    for i in range(3000):
        log.append("t", i.to_bytes(4, "big") * 25)
    log.close()
    log = open_log(tmp_path)
    active = log._topics["t"].segments[-1]
    record = HEADER_BYTES + 100
    assert len(active.index_seqs) == pytest.approx(3000 * record / INDEX_INTERVAL_BYTES, rel=0.05)
    assert active.start_offset(2345) > 2345 * record - INDEX_INTERVAL_BYTES - record
    assert log.read("t", 2345, 2, 1 << 20) == [
        Record(2345, 1000.0, (2345).to_bytes(4, "big") * 25),
        Record(2346, 1000.0, (2346).to_bytes(4, "big") * 25),
    ]
    log.close()


def damage_cut(path: Path, size: int) -> None:
    """Cut the last three bytes (a short payload)."""
    os.truncate(path, size - 3)


def damage_cut_header(path: Path, size: int) -> None:
    """Cut in the middle of the last record's header."""
    os.truncate(path, size - (HEADER_BYTES + 20) + 10)


def damage_payload(path: Path, size: int) -> None:
    """Flip a bit of the last record's payload."""
    _flip(path, size - 5)


def damage_sequence(path: Path, size: int) -> None:
    """Flip a bit of the last record's sequence number (caught by the CRC)."""
    _flip(path, size - (HEADER_BYTES + 20) + 12)


def damage_garbage(path: Path, size: int) -> None:
    """Zeros after the last record, as a file system may leave after a crash."""
    with open(path, "ab") as f:
        f.write(bytes(4096))


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


@pytest.mark.parametrize(
    ("damage", "lost"),
    [
        (damage_cut, 1),
        (damage_cut_header, 1),
        (damage_payload, 1),
        (damage_sequence, 1),
        (damage_garbage, 0),
    ],
)
def test_torn_or_corrupt_tail_is_cut_off_on_open(
    tmp_path: Path, damage: Callable[[Path, int], None], lost: int
) -> None:
    """After a crash, a torn or corrupt last record is cut and reported; the records before it stay."""
    log = open_log(tmp_path)
    log.retain("t")
    for i in range(4):
        log.append("t", b"%020d" % i)
    log.sync()
    crash(log)
    [path] = segments(tmp_path, "t")
    size = path.stat().st_size
    damage(path, size)
    damaged_size = path.stat().st_size
    log = open_log(tmp_path)
    kept = 4 - lost
    assert log.recovered == {"t": damaged_size - kept * (HEADER_BYTES + 20)}
    assert path.stat().st_size == kept * (HEADER_BYTES + 20)
    assert [r.payload for r in everything(log, "t")] == [b"%020d" % i for i in range(kept)]
    assert log.append("t", b"after") == kept
    assert everything(log, "t")[-1] == Record(kept, 1000.0, b"after")
    log.close()


def test_a_sequence_handed_out_before_a_clean_close_is_not_reused(tmp_path: Path) -> None:
    """A record lost after a clean close (bit rot) leaves a gap: its sequence never names another record."""
    log = open_log(tmp_path)
    log.retain("t")
    for i in range(4):
        log.append("t", b"%020d" % i)
    log.close()
    [path] = segments(tmp_path, "t")
    damage_payload(path, path.stat().st_size)
    log = open_log(tmp_path)
    assert log.recovered_bytes == HEADER_BYTES + 20
    assert log.next_sequence("t") == 4
    assert log.append("t", b"new") == 4
    assert [r.sequence for r in everything(log, "t")] == [0, 1, 2, 4]
    log.close()


def test_damage_inside_an_older_segment_is_reported_by_reads(tmp_path: Path) -> None:
    """A flipped bit in a full segment is never skipped silently; the rest of the log stays readable."""
    options: dict[str, Any] = {"segment_bytes": 3 * (HEADER_BYTES + 8)}
    log = open_log(tmp_path, **options)
    log.retain("t")
    for i in range(9):
        log.append("t", b"%08d" % i)
    log.close()
    _flip(segments(tmp_path, "t")[1], HEADER_BYTES + 8 + HEADER_BYTES + 2)
    log = open_log(tmp_path, **options)
    assert log.recovered_bytes == 0
    assert [r.sequence for r in log.read("t", 0, 4, 1000)] == [0, 1, 2, 3]
    with pytest.raises(StreamLogError, match="damaged"):
        log.read("t", 4, 1, 1000)
    with pytest.raises(StreamLogError, match="damaged"):
        log.read("t", 2, 10, 1000)
    assert [r.sequence for r in log.read("t", 6, 10, 1000)] == [6, 7, 8]
    log.close()


def test_retention_by_size_deletes_whole_old_segments(tmp_path: Path) -> None:
    """Oldest segments go while the topic is over retention_bytes; the log then starts later."""
    record = HEADER_BYTES + 50
    log = open_log(tmp_path, segment_bytes=2 * record, retention_bytes=5 * record)
    log.retain("t")
    for i in range(10):
        log.append("t", bytes([i]) * 50)
    assert log.enforce_retention() == RetentionResult(segments=3, removed_bytes=6 * record)
    assert [p.name for p in segments(tmp_path, "t")] == [f"{6:020d}.log", f"{8:020d}.log"]
    assert (log.first_sequence("t"), log.next_sequence("t")) == (6, 10)
    assert [r.sequence for r in log.read("t", 0, 100, 10_000)] == [6, 7, 8, 9]
    assert log.enforce_retention() == RetentionResult(0, 0)
    log.close()


def test_retention_by_age_never_deletes_the_active_segment_and_sequences_continue(tmp_path: Path) -> None:
    """Segments whose last record is older than retention_seconds go; the active one stays; numbering goes on."""
    clock = FakeClock(0.0)
    options: dict[str, Any] = {"segment_bytes": 2 * (HEADER_BYTES + 1), "retention_seconds": 100, "retention_bytes": 0}
    log = open_log(tmp_path, clock, **options)
    log.retain("t")
    for i in range(5):
        clock.now = 10.0 * i
        log.append("t", b"x")
    # Segments [0, 1] (last at 10 s), [2, 3] (30 s), [4] (40 s, active).
    clock.now = 115.0
    assert log.enforce_retention().segments == 1
    assert log.first_sequence("t") == 2
    clock.now = 10_000.0
    assert log.enforce_retention().segments == 1
    assert [p.name for p in segments(tmp_path, "t")] == [f"{4:020d}.log"]
    assert everything(log, "t") == [Record(4, 40.0, b"x")]
    log.close()
    log = open_log(tmp_path, clock, **options)
    assert (log.first_sequence("t"), log.next_sequence("t")) == (4, 5)
    assert log.append("t", b"y") == 5
    assert log.append("t", b"z") == 6
    log.close()


def test_a_topic_whose_segments_all_vanished_does_not_restart_at_zero(tmp_path: Path) -> None:
    """The next sequence is kept in the metadata too, so an empty topic folder resumes where the log was."""
    log = open_log(tmp_path, segment_bytes=HEADER_BYTES + 1)
    log.retain("t")
    for _ in range(4):
        log.append("t", b"x")
    log.close()
    for path in segments(tmp_path, "t"):
        path.unlink()
    log = open_log(tmp_path)
    assert (log.first_sequence("t"), log.next_sequence("t")) == (4, 4)
    assert log.read("t", 0, 10, 100) == []
    assert log.append("t", b"y") == 4
    assert [p.name for p in segments(tmp_path, "t")] == [f"{4:020d}.log"]
    log.close()


def test_unretained_topic_refuses_append(tmp_path: Path) -> None:
    """Only topics this node retains take appends."""
    log = open_log(tmp_path)
    with pytest.raises(StreamLogError, match="not retained"):
        log.append("t", b"x")
    assert log.next_sequence("t") == 0 and log.topics() == []
    log.close()


def test_retained_set_survives_reopen(tmp_path: Path) -> None:
    """Retained topics are stored, including ones that never got a record."""
    log = open_log(tmp_path)
    log.retain("b")
    log.retain("a")
    log.retain("a")
    log.append("a", b"1")
    log.close()
    log = open_log(tmp_path)
    assert log.retained_topics() == ["a", "b"] and log.topics() == ["a", "b"]
    assert log.retained("a") and not log.retained("c")
    assert log.append("b", b"1") == 0
    log.close()


ODD_TOPICS = ["a/b", "..", '}{"', "Zürich/東京 🚀", "\x00nul", "/", "x" * MAX_TOPIC_BYTES, "é" * (MAX_TOPIC_BYTES // 2)]


def test_odd_topic_names_round_trip_through_their_folders(tmp_path: Path) -> None:
    """Any topic within the bounds gets its own folder and comes back, exactly, after reopening."""
    log = open_log(tmp_path)
    for i, topic in enumerate(ODD_TOPICS):
        log.retain(topic)
        log.append(topic, b"%d" % i)
    log.close()
    assert len(os.listdir(tmp_path / "topics")) == len(ODD_TOPICS)
    assert all(len(name) <= 255 for name in os.listdir(tmp_path / "topics"))
    log = open_log(tmp_path)
    assert log.topics() == sorted(ODD_TOPICS)
    for i, topic in enumerate(ODD_TOPICS):
        assert everything(log, topic) == [Record(0, 1000.0, b"%d" % i)]
    log.close()


@pytest.mark.parametrize("topic", ["", "x" * (MAX_TOPIC_BYTES + 1), "é" * (MAX_TOPIC_BYTES // 2 + 1), "\ud800"])
def test_topic_name_bounds(tmp_path: Path, topic: str) -> None:
    """Empty names, names over MAX_TOPIC_BYTES UTF-8 bytes and lone surrogates are refused."""
    log = open_log(tmp_path)
    with pytest.raises(StreamLogError):
        log.retain(topic)
    with pytest.raises(StreamLogError):
        log.append(topic, b"x")
    assert log.topics() == []
    log.close()


def test_payload_bound(tmp_path: Path) -> None:
    """A payload over max_payload_bytes is refused and uses no sequence."""
    log = open_log(tmp_path, max_payload_bytes=10)
    log.retain("t")
    assert log.append("t", b"x" * 10) == 0
    with pytest.raises(StreamLogError, match="over the limit"):
        log.append("t", b"x" * 11)
    assert log.append("t", b"y") == 1
    log.close()


def test_relaxed_mode_is_readable_and_survives_reopen(tmp_path: Path) -> None:
    """With fsync=False the log behaves the same, only sync() promises less."""
    log = open_log(tmp_path, fsync=False, segment_bytes=100)
    log.retain("t")
    for i in range(10):
        log.append("t", b"%d" % i)
        if i % 3 == 0:
            log.sync()
    assert [r.payload for r in everything(log, "t")] == [b"%d" % i for i in range(10)]
    crash(log)
    log = open_log(tmp_path, fsync=False, segment_bytes=100)
    assert [r.payload for r in everything(log, "t")] == [b"%d" % i for i in range(10)]
    log.close()


def test_one_open_log_per_directory(tmp_path: Path) -> None:
    """A second StreamLog on the same directory is refused until the first closes."""
    log = open_log(tmp_path)
    with pytest.raises(StreamLogError, match="open elsewhere"):
        open_log(tmp_path)
    log.close()
    log.close()
    open_log(tmp_path).close()


def test_a_closed_log_refuses_everything(tmp_path: Path) -> None:
    """Using a closed log is a clear error, not a write to a closed file."""
    log = open_log(tmp_path)
    log.retain("t")
    log.close()
    with pytest.raises(StreamLogError, match="closed"):
        log.append("t", b"x")
    with pytest.raises(StreamLogError, match="closed"):
        log.read("t", 0, 1, 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"segment_bytes": 0},
        {"retention_bytes": -1},
        {"retention_seconds": float("inf")},
        {"max_payload_bytes": 2**32},
        {"fsync": 1},
        {"max_open_files": 0},
        {"max_topics": 0},
        {"max_disk_bytes": -1},
    ],
)
def test_settings_are_validated(bad: dict[str, Any]) -> None:
    """Impossible settings are refused at construction, naming the field."""
    with pytest.raises(ValueError, match=next(iter(bad))):
        LogSettings(**bad)


def test_offset_store_survives_reopen(tmp_path: Path) -> None:
    """Committed offsets are per (group, topic), overwritten by later commits, and on disk."""
    path = str(tmp_path / "offsets.sqlite3")
    store = OffsetStore(path)
    assert store.get("g", "t") is None
    store.commit("g", "t", 5)
    store.commit("g", "t", 7)
    store.commit("h", "t", 1)
    store.commit("g", "a/b}", 0)
    with pytest.raises(StreamLogError):
        store.commit("g", "t", -1)
    with pytest.raises(StreamLogError):
        store.commit("g", "", 1)
    store.close()
    store = OffsetStore(path)
    assert (store.get("g", "t"), store.get("h", "t"), store.get("g", "a/b}"), store.get("h", "x")) == (7, 1, 0, None)
    store.close()


# -- node-wide caps: open files, topics, disk -------------------------------------------------------


def disk_bytes(path: Path) -> int:
    """Bytes of every segment file under the log's folder."""
    return sum(f.stat().st_size for f in (path / "topics").glob("*/*.log"))


def test_idle_topics_keep_no_file_open(tmp_path: Path) -> None:
    """Appends and reads over 300 topics hold at most max_open_files files open, and every record reads back."""
    log = open_log(tmp_path, max_open_files=8, segment_bytes=64)
    before = open_fds()
    for round_ in range(3):
        for i in range(300):
            log.retain(f"t{i}")
            log.append(f"t{i}", b"%d-%d" % (i, round_) * 5)  # 3 records roll a 64-byte segment
        log.sync()
        assert log.open_files <= 8 and open_fds() - before <= 8
    for i in range(300):
        assert [r.payload for r in everything(log, f"t{i}")] == [b"%d-%d" % (i, r) * 5 for r in range(3)]
        assert log.open_files <= 8
    assert open_fds() - before <= 8
    log.close()
    assert open_fds() <= before
    log = open_log(tmp_path, max_open_files=8, segment_bytes=64)
    assert [r.payload for r in everything(log, "t299")] == [b"299-%d" % r * 5 for r in range(3)]
    log.close()


def test_closing_a_file_for_the_lru_makes_its_appends_durable(tmp_path: Path) -> None:
    """Appends whose file the LRU closed before the sync survive a crash right after that sync."""
    log = open_log(tmp_path, max_open_files=1)
    log.retain("a")
    log.retain("b")
    log.append("a", b"first")
    log.append("b", b"second")  # closes a's file: a's append is synced then
    log.sync()
    assert log.open_files == 1
    crash(log)
    log = open_log(tmp_path, max_open_files=1)
    assert [r.payload for r in everything(log, "a")] == [b"first"]
    assert [r.payload for r in everything(log, "b")] == [b"second"]
    log.close()


def test_a_new_topic_past_max_topics_is_refused_and_known_ones_go_on(tmp_path: Path) -> None:
    """The topic cap refuses a new topic with TopicLimitError; existing topics still take appends, also after reopen."""
    log = open_log(tmp_path, max_topics=3)
    for topic in ("a", "b", "c"):
        log.retain(topic)
        log.append(topic, b"x")
    with pytest.raises(TopicLimitError, match="max-topics"):
        log.retain("d")
    assert log.topics() == ["a", "b", "c"]
    log.retain("a")
    assert log.append("a", b"y") == 1
    log.close()
    # Lowered below what is on disk: what is kept stays, nothing new comes.
    log = open_log(tmp_path, max_topics=2)
    assert log.retained_topics() == ["a", "b", "c"]
    with pytest.raises(TopicLimitError):
        log.retain("d")
    log.close()


def test_disk_cap_deletes_the_oldest_segments_across_topics_first(tmp_path: Path) -> None:
    """Over max_disk_bytes an append first deletes the oldest segments of any topic, never an active one."""
    clock = FakeClock(0.0)
    record = HEADER_BYTES + 76  # one 100-byte record per segment
    log = open_log(tmp_path, clock, segment_bytes=100, max_disk_bytes=6 * record, retention_bytes=0)
    for topic in ("old", "new"):
        log.retain(topic)
    for topic in ("old", "old", "old", "new", "new", "new"):
        clock.now += 1
        log.append(topic, b"x" * 76)
    assert log.disk_bytes == 6 * record == disk_bytes(tmp_path)
    clock.now += 1
    assert log.append("new", b"y" * 76) == 3
    # The oldest segment of all (old's first) went, nothing else.
    assert (log.first_sequence("old"), log.first_sequence("new")) == (1, 0)
    assert log.disk_bytes == 6 * record == disk_bytes(tmp_path)
    clock.now += 1
    log.append("new", b"z" * 76)
    assert (log.first_sequence("old"), log.first_sequence("new")) == (2, 0)
    log.close()


def test_disk_cap_refuses_when_only_active_segments_are_left(tmp_path: Path) -> None:
    """When retention cannot free enough, append raises DiskFullError, stores nothing and uses no sequence."""
    record = HEADER_BYTES + 76
    log = open_log(tmp_path, segment_bytes=100, max_disk_bytes=3 * record)
    for topic in ("a", "b", "c", "d"):
        log.retain(topic)
    for topic in ("a", "b", "c"):
        log.append(topic, b"x" * 76)
    with pytest.raises(DiskFullError, match="max-disk-bytes"):
        log.append("d", b"x" * 76)
    assert log.next_sequence("d") == 0 and log.disk_bytes == 3 * record == disk_bytes(tmp_path)
    # A larger cap (or space freed) lets appends go on.
    log.close()
    log = open_log(tmp_path, segment_bytes=100, max_disk_bytes=4 * record)
    assert log.disk_bytes == 3 * record
    assert log.append("d", b"x" * 76) == 0
    log.close()


# -- a random walk against a model -----------------------------------------------------------------

TOPICS = ["a", "b/..", "ü"]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(TOPICS), st.binary(max_size=90)),
        st.tuples(
            st.just("burst"), st.sampled_from(TOPICS), st.integers(min_value=1, max_value=12), st.integers(0, 60)
        ),
        st.tuples(st.just("sync")),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("crash")),
        st.tuples(st.just("tick"), st.floats(min_value=0, max_value=150)),
        st.tuples(st.just("retention")),
        st.tuples(
            st.just("read"),
            st.sampled_from(TOPICS),
            st.integers(min_value=-2, max_value=40),
            st.integers(min_value=1, max_value=8),
            st.integers(min_value=0, max_value=300),
        ),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_random_operations_agree_with_a_model(ops: list[tuple[Any, ...]]) -> None:
    """Appends, syncs, reopens, crashes, retention and reads agree with a list per topic."""
    with tempfile.TemporaryDirectory() as directory:
        clock = FakeClock(0.0)
        # Two open files for three topics: every step goes through the LRU.
        options = LogSettings(
            segment_bytes=200, retention_bytes=500, retention_seconds=100, fsync=False, max_open_files=2
        )
        log = StreamLog(directory, options, clock)
        model: dict[str, list[Record]] = {topic: [] for topic in TOPICS}
        first = dict.fromkeys(TOPICS, 0)
        for topic in TOPICS:
            log.retain(topic)
        for op in ops:
            if op[0] in ("append", "burst"):
                topic = op[1]
                for payload in [op[2]] if op[0] == "append" else [b"%d" % len(model[topic]) * op[3]] * op[2]:
                    assert log.append(topic, payload) == len(model[topic])
                    model[topic].append(Record(len(model[topic]), clock.now, payload))
            elif op[0] == "sync":
                log.sync()
            elif op[0] in ("reopen", "crash"):
                log.close() if op[0] == "reopen" else crash(log)
                log = StreamLog(directory, options, clock)
                assert log.recovered_bytes == 0 and log.retained_topics() == sorted(TOPICS)
            elif op[0] == "tick":
                clock.now += op[1]
            elif op[0] == "retention":
                log.enforce_retention()
            else:
                _, topic, start, max_count, max_bytes = op
                got = log.read(topic, start, max_count, max_bytes)
                expected: list[Record] = []
                for record in model[topic][max(start, log.first_sequence(topic)) :]:
                    size = sum(len(r.payload) for r in expected) + len(record.payload)
                    if len(expected) == max_count or (expected and size > max_bytes):
                        break
                    expected.append(record)
                assert got == expected
            for topic in TOPICS:
                assert log.next_sequence(topic) == len(model[topic])
                assert first[topic] <= log.first_sequence(topic) <= len(model[topic])
                first[topic] = log.first_sequence(topic)
                if model[topic]:
                    # Retention never takes the newest record.
                    assert log.first_sequence(topic) < len(model[topic])
            assert log.open_files <= 2
            assert log.disk_bytes == disk_bytes(Path(directory))
        for topic in TOPICS:
            assert everything(log, topic) == model[topic][log.first_sequence(topic) :]
        log.close()
