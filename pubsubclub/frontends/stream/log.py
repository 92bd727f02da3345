"""The stream front-end's durable log: per topic, an append-only sequence of records on disk.

Plain Python (no Twisted): the stream front-end calls it from the reactor thread,
:meth:`StreamLog.append` for every accepted ``Publish`` and :meth:`StreamLog.sync`
once per reactor turn (group commit), and answers OK only after the sync. Time is
injected (``clock``), so retention is testable without waiting.

The layout on disk and the record format are in :mod:`~pubsubclub.frontends.stream.segments`.

Appends go straight to the operating system (one ``writev`` each, no Python buffer):
a process crash loses nothing that was appended, a power loss what was not synced.
:meth:`StreamLog.sync` calls ``fdatasync`` on every segment written since the last sync
and ``fsync`` on the topic folder when a segment file was created there; with
``fsync=False`` (the relaxed mode) it does nothing, the data being in the OS already. A
full segment is synced when the next one is created, so a crash cannot leave a hole in
the middle of the log, only a torn tail of the newest segment. A read sees a record as
soon as it is appended: a front-end that must never show a record a power loss could
take back delivers after the sync, when it answers the publisher. A record lost that
way was never synced, and its sequence goes to the next record appended; a sequence
that was stored on close is never handed out again.

On open, the newest segment of each topic is read whole and checked (header, length,
CRC, sequence); a torn or corrupt tail is cut off, and what was cut is reported in
:attr:`StreamLog.recovered`. Older segments were synced when they were closed and are
read lazily: each segment keeps a sparse index (a ``(sequence, offset)`` pair every
:data:`INDEX_INTERVAL_BYTES` of file), built while appending, and for an older segment
on its first read or retention check. A read finds its start by bisection and decodes
at most that many bytes before reaching it. A damaged record found by a read (a bit
flipped on disk later) raises :class:`StreamLogError`; it is never skipped silently.

Retention removes whole segments from the old end of a topic, never the newest
(active) one: those whose last record is older than ``retention_seconds``, then those
that keep the topic over ``retention_bytes``. Only topics marked with
:meth:`StreamLog.retain` (this node keeps their log) accept appends.

Node-wide caps (docs/stream.md, "Node-wide limits"):

- **Open files.** No file stays open for an idle topic: segment files are opened on
  demand (appends and reads alike) and kept in one LRU of at most ``max_open_files``.
  Closing the least recently used one first makes what it holds durable (``fdatasync``,
  and its folder when a segment was created there), so a later :meth:`StreamLog.sync`
  has nothing left to do for it; a failure there is remembered and raised by that sync.
- **Topics.** At most ``max_topics`` topics; :meth:`StreamLog.retain` of a new one past
  that raises :class:`TopicLimitError`.
- **Disk.** The segment files of all topics together stay within ``max_disk_bytes``: an
  append that would go over first deletes the oldest segments across all topics (by
  their last record's time, never a topic's active one); when that cannot free enough,
  it raises :class:`DiskFullError` and stores nothing.

:class:`~pubsubclub.frontends.stream.offsets.OffsetStore` keeps the consumer groups'
committed offsets in SQLite (importable from here too).

Not thread-safe: one thread (the reactor's) uses a StreamLog; ``lock`` keeps a second
process out.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import sqlite3
import time
import zlib
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable

from pubsubclub.frontends.stream.offsets import OffsetStore
from pubsubclub.frontends.stream.segments import (
    _FIELDS,
    _HEADER,
    _LENGTH,
    _NAME_FILE,
    _SEGMENT_NAME,
    HEADER_BYTES,
    INDEX_INTERVAL_BYTES,
    MAX_HEX_NAME_BYTES,
    MAX_TOPIC_BYTES,
    READ_CHUNK_BYTES,
    DiskFullError,
    LogSettings,
    Record,
    RetentionResult,
    StreamLogError,
    TopicLimitError,
    _Damaged,
    _folder_name,
    _folder_topic,
    _fsync_dir,
    _records,
    _Segment,
    _Topic,
    _topic_bytes,
)

__all__ = [
    "HEADER_BYTES",
    "INDEX_INTERVAL_BYTES",
    "MAX_HEX_NAME_BYTES",
    "MAX_TOPIC_BYTES",
    "LogSettings",
    "OffsetStore",
    "Record",
    "RetentionResult",
    "DiskFullError",
    "StreamLog",
    "StreamLogError",
    "TopicLimitError",
]

_META_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    topic TEXT PRIMARY KEY,
    retained INTEGER NOT NULL,
    next_sequence INTEGER NOT NULL
);
"""

# -- topic names and folders ---------------------------------------------------------------------


# -- records -------------------------------------------------------------------------------------


# -- the log -------------------------------------------------------------------------------------


class StreamLog:
    """Per-topic append-only logs under ``directory``: append, sync (group commit), read, retention."""

    def __init__(
        self, directory: str, settings: LogSettings = LogSettings(), clock: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory
        self.settings = settings
        self._clock = clock
        #: Bytes cut from the end of each topic's newest segment on open (torn or corrupt tail).
        self.recovered: dict[str, int] = {}
        self._topics_dir = os.path.join(directory, "topics")
        self._topics: dict[str, _Topic] = {}
        self._dirty: dict[str, _Topic] = {}
        #: Open segment files, least recently used first, each with its topic.
        self._open: OrderedDict[_Segment, _Topic] = OrderedDict()
        #: A sync that failed while closing a file for the LRU; the next :meth:`sync` raises it.
        self._sync_failure: str | None = None
        #: Bytes of all segment files.
        self._disk_bytes = 0
        #: Segments retention may delete (every topic's but its active one).
        self._removable = 0
        self._closed = False
        try:
            os.makedirs(self._topics_dir, exist_ok=True)
            self._lock = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StreamLogError(f"cannot open the stream log in {directory}: {exc}") from exc
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock)
            raise StreamLogError(f"the stream log in {directory} is open elsewhere") from None
        try:
            self._db = sqlite3.connect(os.path.join(directory, "meta.sqlite3"), isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_META_SCHEMA)
            self._load()
        except BaseException as exc:
            self._release()
            if isinstance(exc, OSError | sqlite3.Error):
                raise StreamLogError(f"cannot open the stream log in {directory}: {exc}") from exc
            raise

    @property
    def recovered_bytes(self) -> int:
        """Bytes of torn or corrupt tails cut off on open, all topics together."""
        return sum(self.recovered.values())

    @property
    def open_files(self) -> int:
        """Segment files open now (at most ``settings.max_open_files``)."""
        return len(self._open)

    @property
    def disk_bytes(self) -> int:
        """Bytes of all segment files (at most ``settings.max_disk_bytes`` when it is set)."""
        return self._disk_bytes

    # -- opening ---------------------------------------------------------------------------------

    def _load(self) -> None:
        meta = {
            topic: (bool(retained), nxt)
            for topic, retained, nxt in self._db.execute("SELECT topic, retained, next_sequence FROM topics")
        }
        for folder in sorted(os.listdir(self._topics_dir)):
            topic = _folder_topic(self._topics_dir, folder)
            if topic is None:
                continue
            retained, nxt = meta.pop(topic, (False, 0))
            self._topics[topic] = self._open_topic(topic, folder, retained, nxt)
        for topic, (retained, nxt) in meta.items():
            # Known (retained, or its segments were lost) but without a folder: make it.
            t = _Topic(topic, self._make_folder(_topic_bytes(topic)), retained, nxt)
            self._topics[topic] = t
        for t in self._topics.values():
            self._disk_bytes += sum(seg.size for seg in t.segments)
            self._removable += max(len(t.segments) - 1, 0)

    def _open_topic(self, topic: str, folder: str, retained: bool, next_sequence: int) -> _Topic:
        t = _Topic(topic, os.path.join(self._topics_dir, folder), retained, next_sequence)
        bases = []
        for name in os.listdir(t.folder):
            match = _SEGMENT_NAME.fullmatch(name)
            if match:
                bases.append(int(match.group(1)))
        for base in sorted(bases):
            path = os.path.join(t.folder, f"{base:020d}.log")
            t.segments.append(_Segment(base, path, os.path.getsize(path)))
        if t.segments:
            active = t.segments[-1]
            fd = os.open(active.path, os.O_RDWR | os.O_APPEND)
            try:
                file_size = os.fstat(fd).st_size
                damage = active.scan(fd, file_size)
                if damage is not None:
                    os.ftruncate(fd, active.size)
                    if self.settings.fsync:
                        os.fdatasync(fd)
                    self.recovered[topic] = file_size - active.size
                    # Cut off: what is missing was never durable, a gap, not damage to report on every read.
                    active.damage = None
            finally:
                os.close(fd)
            t.next_sequence = max(next_sequence, active.base + active.count)
        return t

    def _make_folder(self, raw: bytes) -> str:
        """Create the folder of a topic (atomically, with its name file when hashed); its path."""
        name = _folder_name(raw)
        path = os.path.join(self._topics_dir, name)
        if os.path.isdir(path):
            return path
        staging = os.path.join(self._topics_dir, "." + name + ".new")
        os.makedirs(staging, exist_ok=True)
        if name.startswith("x"):
            with open(os.path.join(staging, _NAME_FILE), "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
        os.rename(staging, path)
        _fsync_dir(self._topics_dir)
        return path

    # -- topics ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StreamLogError("the stream log is closed")

    def topics(self) -> list[str]:
        """Every topic with a log on this node, sorted."""
        self._check_open()
        return sorted(self._topics)

    def retained(self, topic: str) -> bool:
        """Whether this node keeps ``topic``'s log (accepts appends to it)."""
        self._check_open()
        t = self._topics.get(topic)
        return t is not None and t.retained

    def retained_topics(self) -> list[str]:
        """Every retained topic, sorted."""
        self._check_open()
        return sorted(name for name, t in self._topics.items() if t.retained)

    def retain(self, topic: str) -> None:
        """Keep ``topic``'s log on this node from now on (survives restarts)."""
        self._check_open()
        raw = _topic_bytes(topic)
        t = self._topics.get(topic)
        if t is not None and t.retained:
            return
        if t is None and len(self._topics) >= self.settings.max_topics:
            raise TopicLimitError(
                f"cannot keep topic {topic[:80]!r}: the stream log holds {len(self._topics)} topics, "
                f"its cap (max-topics) is {self.settings.max_topics}"
            )
        try:
            if t is None:
                t = _Topic(topic, self._make_folder(raw), False, 0)
                self._topics[topic] = t
            self._db.execute(
                """INSERT INTO topics (topic, retained, next_sequence) VALUES (?, 1, ?)
                   ON CONFLICT (topic) DO UPDATE SET retained = 1""",
                (topic, t.next_sequence),
            )
        except (OSError, sqlite3.Error) as exc:
            raise StreamLogError(f"cannot retain {topic[:80]!r}: {exc}") from exc
        t.retained = True

    def first_sequence(self, topic: str) -> int:
        """The oldest sequence still in ``topic``'s log (``next_sequence`` when it is empty)."""
        self._check_open()
        t = self._topics.get(topic)
        return 0 if t is None else t.first_sequence

    def next_sequence(self, topic: str) -> int:
        """The sequence the next append to ``topic`` gets (one past the last)."""
        self._check_open()
        t = self._topics.get(topic)
        return 0 if t is None else t.next_sequence

    # -- writing ---------------------------------------------------------------------------------

    def append(self, topic: str, payload: bytes) -> int:
        """Add ``payload`` to ``topic``'s log; its sequence. Durable after the next :meth:`sync`."""
        self._check_open()
        t = self._topics.get(topic)
        if t is None or not t.retained:
            _topic_bytes(topic)
            raise StreamLogError(f"topic {topic[:80]!r} is not retained by this node")
        length = len(payload)
        if length > self.settings.max_payload_bytes:
            raise StreamLogError(f"payload of {length} bytes is over the limit of {self.settings.max_payload_bytes}")
        sequence = t.next_sequence
        timestamp = float(self._clock())
        fields = _FIELDS.pack(sequence, timestamp)
        crc = zlib.crc32(payload, zlib.crc32(fields, zlib.crc32(_LENGTH.pack(length))))
        header = _HEADER.pack(length, crc, sequence, timestamp)
        record_bytes = HEADER_BYTES + length
        cap = self.settings.max_disk_bytes
        if cap and self._disk_bytes + record_bytes > cap:
            self._free_disk(record_bytes)
        try:
            active = t.segments[-1] if t.segments else None
            if (
                active is None
                or active.base + active.count != sequence
                or (active.size and active.size + record_bytes > self.settings.segment_bytes)
            ):
                active = self._roll(t)
            fd = self._fd(t, active)
            offset = active.size
            try:
                written = os.writev(fd, [header, payload])
            except OSError:
                written = -1
            if written != record_bytes:
                os.ftruncate(fd, offset)
                raise OSError(f"could not write {record_bytes} bytes")
        except OSError as exc:
            raise StreamLogError(f"cannot append to {topic[:80]!r}: {exc}") from exc
        active.note(sequence, offset, timestamp)
        active.size = offset + record_bytes
        self._disk_bytes += record_bytes
        t.next_sequence = sequence + 1
        if not t.dirty:
            t.dirty = True
            self._dirty[topic] = t
        return sequence

    def _roll(self, t: _Topic) -> _Segment:
        """Close the active segment (durable first) and start one at ``t.next_sequence``."""
        old = t.segments[-1] if t.segments else None
        if old is not None and old.fd is not None:
            if self.settings.fsync:
                os.fdatasync(old.fd)
            self._close_file(old)
        if old is not None and old.size == 0:
            # An empty segment (its only records were torn off) would name sequences no file has.
            os.unlink(old.path)
            t.segments.pop()
        base = t.next_sequence
        self._remember_next([(t.name, int(t.retained), base)])
        path = os.path.join(t.folder, f"{base:020d}.log")
        segment = _Segment(base, path, 0)
        segment.indexed = True
        self._make_room()
        segment.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        self._open[segment] = t
        if t.segments:
            self._removable += 1  # the previous active segment
        t.segments.append(segment)
        t.folder_dirty = True
        if not t.dirty:
            t.dirty = True
            self._dirty[t.name] = t
        return segment

    # -- open files (an LRU) ---------------------------------------------------------------------

    def _fd(self, t: _Topic, seg: _Segment) -> int:
        """``seg``'s file, opened (closing the least recently used one past the cap) if need be."""
        fd = seg.fd
        if fd is not None:
            self._open.move_to_end(seg)
            return fd
        self._make_room()
        fd = seg.fd = os.open(seg.path, os.O_RDWR | os.O_APPEND)
        self._open[seg] = t
        return fd

    def _make_room(self) -> None:
        """Close least recently used files until one more may open."""
        while len(self._open) >= self.settings.max_open_files:
            seg, t = next(iter(self._open.items()))
            if t.dirty and seg is t.segments[-1]:
                # Its appends wait for a sync: make them durable now, while the file is open.
                try:
                    if self.settings.fsync:
                        assert seg.fd is not None
                        os.fdatasync(seg.fd)
                        if t.folder_dirty:
                            _fsync_dir(t.folder)
                except OSError as exc:
                    if self._sync_failure is None:
                        self._sync_failure = f"cannot sync {t.name[:80]!r}: {exc}"
                t.dirty = t.folder_dirty = False
                del self._dirty[t.name]
            self._close_file(seg)

    def _close_file(self, seg: _Segment) -> None:
        """Close ``seg``'s file if it is open (nothing is synced here)."""
        fd = seg.fd
        if fd is not None:
            seg.fd = None
            del self._open[seg]
            os.close(fd)

    def _remember_next(self, rows: list[tuple[str, int, int]]) -> None:
        """Store ``(topic, retained, next_sequence)`` rows, never lowering a stored next sequence."""
        try:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    """INSERT INTO topics (topic, retained, next_sequence) VALUES (?, ?, ?)
                       ON CONFLICT (topic) DO UPDATE SET next_sequence = max(next_sequence, excluded.next_sequence)""",
                    rows,
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StreamLogError(f"cannot store the next sequences: {exc}") from exc

    def sync(self) -> None:
        """Make everything appended so far durable (relaxed mode: it is in the OS already)."""
        self._check_open()
        failure, self._sync_failure = self._sync_failure, None
        if failure is not None:
            raise StreamLogError(failure)
        for t in list(self._dirty.values()):
            try:
                if self.settings.fsync:
                    fd = t.segments[-1].fd if t.segments else None
                    if fd is not None:
                        os.fdatasync(fd)
                    if t.folder_dirty:
                        _fsync_dir(t.folder)
            except OSError as exc:
                # After a failed fsync the kernel may have dropped the pages: treat the log as failed.
                raise StreamLogError(f"cannot sync {t.name[:80]!r}: {exc}") from exc
            t.dirty = t.folder_dirty = False
            del self._dirty[t.name]

    # -- reading ---------------------------------------------------------------------------------

    def read(self, topic: str, start_seq: int, max_count: int, max_bytes: int) -> list[Record]:
        """Records of ``topic`` from ``max(start_seq, first_sequence)`` on, in order.

        At most ``max_count`` records whose payloads add up to at most ``max_bytes``,
        except that the first record comes whatever its size (or a large one would
        block its reader for ever).
        """
        self._check_open()
        t = self._topics.get(topic)
        out: list[Record] = []
        if t is None or not t.segments or max_count < 1:
            return out
        sequence = max(start_seq, t.first_sequence)
        segments = t.segments
        i = bisect_right(segments, sequence, key=lambda s: s.base) - 1
        budget = max_bytes
        try:
            while i < len(segments) and sequence < t.next_sequence:
                upper = segments[i + 1].base if i + 1 < len(segments) else t.next_sequence
                if sequence < upper:
                    budget = self._read_segment(t, segments[i], sequence, upper, out, max_count, budget)
                    if budget < 0 or len(out) >= max_count:
                        break
                i += 1
                if i < len(segments):
                    sequence = max(sequence, segments[i].base)
        except OSError as exc:
            raise StreamLogError(f"cannot read {topic[:80]!r}: {exc}") from exc
        return out

    def _read_segment(
        self, t: _Topic, seg: _Segment, sequence: int, upper: int, out: list[Record], max_count: int, budget: int
    ) -> int:
        """Add records ``[sequence, upper)`` of ``seg`` to ``out``; the budget left, negative when spent."""
        fd = self._fd(t, seg)
        if not seg.indexed:
            seg.scan(fd, os.fstat(fd).st_size)
        wanted = sequence
        try:
            for offset, seq, timestamp, payload, _end in _records(
                fd, seg.start_offset(sequence), seg.size, READ_CHUNK_BYTES
            ):
                if seq < wanted:
                    continue
                if seq >= upper:
                    return budget
                if seq != wanted:
                    raise _Damaged(offset, f"sequence {seq} where {wanted} belongs")
                if out and len(payload) > budget:
                    return -1
                out.append(Record(seq, timestamp, bytes(payload)))
                budget -= len(payload)
                wanted += 1
                if len(out) >= max_count:
                    return budget
        except _Damaged as exc:
            raise StreamLogError(f"topic {t.name[:80]!r}: damaged record in {seg.path}: {exc}") from None
        if wanted < upper and seg.damage is not None:
            raise StreamLogError(
                f"topic {t.name[:80]!r}: sequences {wanted} to {upper - 1} are unreadable, "
                f"damaged record in {seg.path}: {seg.damage}"
            )
        # Otherwise what is missing was lost in a crash before reaching the disk (relaxed mode): skip it.
        return budget

    # -- retention -------------------------------------------------------------------------------

    def enforce_retention(self) -> RetentionResult:
        """Delete old segments (never a topic's active one) past the age or size limit."""
        self._check_open()
        max_age = self.settings.retention_seconds
        max_bytes = self.settings.retention_bytes
        now = float(self._clock())
        removed = removed_bytes = 0
        for t in self._topics.values():
            total = sum(seg.size for seg in t.segments)
            drop = 0
            try:
                for seg in t.segments[:-1]:
                    too_big = max_bytes > 0 and total > max_bytes
                    too_old = max_age > 0 and now - self._last_timestamp(seg) > max_age
                    if not (too_big or too_old):
                        break
                    self._delete(seg)
                    total -= seg.size
                    removed_bytes += seg.size
                    drop += 1
                if drop:
                    del t.segments[:drop]
                    removed += drop
                    if self.settings.fsync:
                        _fsync_dir(t.folder)
            except OSError as exc:
                del t.segments[:drop]
                raise StreamLogError(f"retention of {t.name[:80]!r}: {exc}") from exc
        return RetentionResult(removed, removed_bytes)

    def _delete(self, seg: _Segment) -> None:
        """Close and unlink a segment that is not its topic's active one (the caller drops it from the list)."""
        self._close_file(seg)
        size = os.path.getsize(seg.path)
        os.unlink(seg.path)
        self._disk_bytes -= size
        self._removable -= 1

    def _free_disk(self, needed: int) -> None:
        """Delete the oldest segments across all topics until ``needed`` more bytes fit the disk cap."""
        cap = self.settings.max_disk_bytes
        refusal = f"the stream log holds {self._disk_bytes} bytes, its disk cap (max-disk-bytes) is {cap}"
        if self._removable == 0 or needed > cap:
            raise DiskFullError(f"{refusal}; nothing left that retention may delete")
        heads = [(self._last_timestamp(t.segments[0]), i, t) for i, t in enumerate(self._topics.values())
                 if len(t.segments) > 1]  # fmt: skip
        heapq.heapify(heads)
        folders: set[str] = set()
        try:
            while heads and self._disk_bytes + needed > cap:
                _, i, t = heapq.heappop(heads)
                self._delete(t.segments[0])
                del t.segments[0]
                folders.add(t.folder)
                if len(t.segments) > 1:
                    heapq.heappush(heads, (self._last_timestamp(t.segments[0]), i, t))
            if self.settings.fsync:
                for folder in folders:
                    _fsync_dir(folder)
        except OSError as exc:
            raise StreamLogError(f"disk cap retention: {exc}") from exc
        if self._disk_bytes + needed > cap:
            raise DiskFullError(f"{refusal}; only active segments are left")

    def _last_timestamp(self, seg: _Segment) -> float:
        """The timestamp of the segment's last record (minus infinity when it has none)."""
        if not seg.indexed:
            fd = os.open(seg.path, os.O_RDONLY)
            try:
                seg.scan(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return float("-inf") if seg.last_timestamp is None else seg.last_timestamp

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Sync, remember every topic's next sequence, close the files. Idempotent."""
        if self._closed:
            return
        try:
            self.sync()
            self._remember_next([(t.name, int(t.retained), t.next_sequence) for t in self._topics.values()])
        finally:
            self._release()

    def _release(self) -> None:
        self._closed = True
        for seg in list(getattr(self, "_open", ())):
            self._close_file(seg)
        if hasattr(self, "_db"):
            self._db.close()
        os.close(self._lock)


# -- committed offsets ---------------------------------------------------------------------------
