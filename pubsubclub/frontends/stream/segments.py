"""The stream log's on-disk pieces: settings and errors, topic folders, records, segments and their index.

Plain Python (no Twisted). :class:`~pubsubclub.frontends.stream.log.StreamLog`
composes these into the log (the LRU of open files, topics and caps,
retention; its docstring says how writes become durable).

Layout under ``directory``::

    lock                          flock()ed while a StreamLog has the directory open
    meta.sqlite3                  topics(topic, retained, next_sequence), WAL, synchronous=FULL
    topics/<folder>/              one folder per topic
        00000000000000000000.log  segment files, named by their first sequence (20 digits)
        00000000000000001234.log
        topic                     the topic's name (UTF-8), only in hashed folders (below)

A topic's folder is the lowercase hex of its UTF-8 name, which is reversible and safe
for any name (``a/b``, ``..``, NUL, non-ASCII) and for case-insensitive file systems.
A file name may have at most 255 bytes, so a topic longer than
:data:`MAX_HEX_NAME_BYTES` (its hex would not fit) gets ``x`` followed by the sha256 of
its name instead, and its name is kept in a ``topic`` file inside.

A segment is nothing but records, back to back. A record is a 24-byte big-endian
header, then the payload::

    u32 payload length | u32 CRC32 | u64 sequence | f64 timestamp (seconds, from clock)

The CRC32 covers the length, the sequence, the timestamp and the payload (every byte
of the record except the CRC itself). Sequences start at 0 per topic and grow by
exactly one; within a segment they are contiguous from the file's name, so the log
starts at the first sequence of its oldest segment and a sequence maps to a file by
bisection. ``meta.sqlite3`` also keeps each topic's next sequence (written when a
segment is created and on close), so a topic never restarts at 0, even if all its
segment files were gone.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

_MiB = 1024 * 1024


#: Longest topic name, in UTF-8 bytes.
MAX_TOPIC_BYTES = 1024


#: Longest topic name, in UTF-8 bytes, whose folder is its hex (2 characters a byte, 255 at most).
MAX_HEX_NAME_BYTES = 120


#: One sparse index entry at least every this many bytes of segment file.
INDEX_INTERVAL_BYTES = 4096


#: Bytes fetched per ``pread`` when reading records.
READ_CHUNK_BYTES = 64 * 1024


#: Bytes fetched per ``pread`` when checking or indexing a whole segment.
SCAN_CHUNK_BYTES = _MiB


#: Largest offset SQLite stores (a signed 64-bit integer).
MAX_OFFSET = 2**63 - 1


#: length, CRC32, sequence, timestamp.
_HEADER = struct.Struct(">IIQd")


#: Bytes in a record's header.
HEADER_BYTES = _HEADER.size


_LENGTH = struct.Struct(">I")


_FIELDS = struct.Struct(">Qd")


_SEGMENT_NAME = re.compile(r"(\d{20})\.log")


_HEX_FOLDER = re.compile(r"(?:[0-9a-f]{2})+")


_HASH_FOLDER = re.compile(r"x[0-9a-f]{64}")


#: The file that names the topic of a hashed folder.
_NAME_FILE = "topic"


class StreamLogError(Exception):
    """The log refused a request (bad topic, too large, not retained) or could not do it (I/O error)."""


class TopicLimitError(StreamLogError):
    """A new topic would take the log over ``max_topics``."""


class DiskFullError(StreamLogError):
    """An append would take the log over ``max_disk_bytes`` and retention cannot free enough."""


@dataclass(frozen=True)
class LogSettings:
    """Segment size, retention and durability of a :class:`StreamLog`."""

    #: A new segment starts when a record would make the active one larger than this.
    segment_bytes: int = 64 * _MiB
    #: Per topic; older segments go while the topic is larger. 0: unlimited.
    retention_bytes: int = 1024 * _MiB
    #: Segments whose last record is older than this go. 0: unlimited.
    retention_seconds: float = 7 * 24 * 3600
    #: Largest payload :meth:`StreamLog.append` accepts.
    max_payload_bytes: int = 16 * _MiB
    #: True: :meth:`StreamLog.sync` fdatasyncs. False (relaxed): appends reach the OS, nothing more.
    fsync: bool = True
    #: Segment files open at once, all topics together (an LRU; appends and reads reopen on demand).
    max_open_files: int = 128
    #: Topics the log holds at most; a new one past it is refused (:class:`TopicLimitError`).
    max_topics: int = 10_000
    #: Bytes of segment files, all topics together; past it the oldest segments go first. 0: unlimited.
    max_disk_bytes: int = 10 * 1024 * _MiB

    def __post_init__(self) -> None:
        for name in ("max_open_files", "max_topics"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"stream log LogSettings.{name} must be a positive int, not {value!r}")
        for name in ("segment_bytes", "retention_bytes", "max_payload_bytes", "max_disk_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"stream log LogSettings.{name} must be a non-negative int, not {value!r}")
        if self.segment_bytes < 1:
            raise ValueError("stream log LogSettings.segment_bytes must be at least 1")
        if self.max_payload_bytes > 0xFFFFFFFF:
            raise ValueError("stream log LogSettings.max_payload_bytes must fit in 32 bits")
        seconds = self.retention_seconds
        if type(seconds) not in (int, float) or not 0 <= seconds < float("inf"):
            raise ValueError(f"stream log LogSettings.retention_seconds must be a finite number >= 0, not {seconds!r}")
        if type(self.fsync) is not bool:
            raise ValueError(f"stream log LogSettings.fsync must be a bool, not {self.fsync!r}")


@dataclass(frozen=True, slots=True)
class Record:
    """One message of a topic's log."""

    sequence: int
    #: Seconds, as the log's clock told when it was appended.
    timestamp: float
    payload: bytes


@dataclass(frozen=True)
class RetentionResult:
    """What :meth:`StreamLog.enforce_retention` removed."""

    segments: int
    removed_bytes: int


def _topic_bytes(topic: str) -> bytes:
    if not isinstance(topic, str) or not topic:
        raise StreamLogError("a topic must be a non-empty string")
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        raise StreamLogError(f"topic {topic[:80]!r} is not valid Unicode") from None
    if len(raw) > MAX_TOPIC_BYTES:
        raise StreamLogError(f"topic {topic[:80]!r}... is longer than {MAX_TOPIC_BYTES} UTF-8 bytes")
    return raw


def _folder_name(raw: bytes) -> str:
    if len(raw) <= MAX_HEX_NAME_BYTES:
        return raw.hex()
    return "x" + hashlib.sha256(raw).hexdigest()


def _folder_topic(topics_dir: str, folder: str) -> str | None:
    """The topic a folder holds, or None for anything that is not a topic folder."""
    raw: bytes | None = None
    if _HEX_FOLDER.fullmatch(folder) and len(folder) <= 2 * MAX_HEX_NAME_BYTES:
        raw = bytes.fromhex(folder)
    elif _HASH_FOLDER.fullmatch(folder):
        try:
            with open(os.path.join(topics_dir, folder, _NAME_FILE), "rb") as f:
                raw = f.read(MAX_TOPIC_BYTES + 1)
        except FileNotFoundError:
            return None
    if raw is None or _folder_name(raw) != folder:
        return None
    try:
        topic = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return topic if topic and len(raw) <= MAX_TOPIC_BYTES else None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Damaged(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"{reason} at byte {offset}")
        self.offset = offset
        self.reason = reason


def _records(fd: int, offset: int, limit: int, chunk: int) -> Iterator[tuple[int, int, float, memoryview, int]]:
    """Yield ``(offset, sequence, timestamp, payload, end)`` of the records in ``[offset, limit)``.

    Raises :class:`_Damaged` at the first record that is cut short or fails its CRC.
    The payload is a view into a buffer; copy it before the next iteration if kept.
    """
    buf = memoryview(b"")
    start = pos = offset
    while pos < limit:
        rel = pos - start
        if rel + HEADER_BYTES > len(buf):
            buf = memoryview(os.pread(fd, min(max(chunk, HEADER_BYTES), limit - pos), pos))
            start, rel = pos, 0
            if len(buf) < HEADER_BYTES:
                raise _Damaged(pos, "partial header")
        length, crc, sequence, timestamp = _HEADER.unpack_from(buf, rel)
        end = pos + HEADER_BYTES + length
        if end > limit:
            raise _Damaged(pos, "short payload")
        if end - start > len(buf):
            buf = memoryview(os.pread(fd, max(chunk, end - pos), pos))
            start, rel = pos, 0
            if len(buf) < end - pos:
                raise _Damaged(pos, "short payload")
        body = rel + HEADER_BYTES
        payload = buf[body : body + length]
        if zlib.crc32(payload, zlib.crc32(buf[rel + 8 : body], zlib.crc32(buf[rel : rel + 4]))) != crc:
            raise _Damaged(pos, "CRC mismatch")
        yield pos, sequence, timestamp, payload, end
        pos = end


class _Segment:
    """One segment file: its first sequence, valid size and sparse index."""

    __slots__ = (
        "base",
        "path",
        "fd",
        "size",
        "count",
        "last_timestamp",
        "index_seqs",
        "index_offsets",
        "indexed",
        "damage",
    )

    def __init__(self, base: int, path: str, size: int) -> None:
        self.base = base
        self.path = path
        #: The file while it is in the log's LRU of open files; None when closed.
        self.fd: int | None = None
        #: Bytes of whole, checked records (the file may be longer only while damaged).
        self.size = size
        #: Records in the segment; meaningful once indexed.
        self.count = 0
        self.last_timestamp: float | None = None
        self.index_seqs = array("Q")
        self.index_offsets = array("Q")
        #: Whether count, last_timestamp and the index are known (older segments: on first use).
        self.indexed = False
        #: What ended the records early when indexing found a damaged one.
        self.damage: _Damaged | None = None

    def note(self, sequence: int, offset: int, timestamp: float) -> None:
        """Account for the record at ``offset``."""
        if not self.index_offsets or offset - self.index_offsets[-1] >= INDEX_INTERVAL_BYTES:
            self.index_seqs.append(sequence)
            self.index_offsets.append(offset)
        self.count += 1
        self.last_timestamp = timestamp

    def scan(self, fd: int, limit: int) -> _Damaged | None:
        """Index the records in ``[0, limit)``; the damage that stopped the scan, if any."""
        self.count = 0
        self.last_timestamp = None
        del self.index_seqs[:], self.index_offsets[:]
        self.size = 0
        self.damage = None
        try:
            for offset, sequence, timestamp, _payload, end in _records(fd, 0, limit, SCAN_CHUNK_BYTES):
                if sequence != self.base + self.count:
                    raise _Damaged(offset, f"sequence {sequence} where {self.base + self.count} belongs")
                self.note(sequence, offset, timestamp)
                self.size = end
        except _Damaged as exc:
            self.damage = exc
        self.indexed = True
        return self.damage

    def start_offset(self, sequence: int) -> int:
        """The offset of the last indexed record at or before ``sequence``."""
        i = bisect_right(self.index_seqs, sequence) - 1
        return self.index_offsets[i] if i >= 0 else 0


class _Topic:
    """A topic's folder, segments (oldest first) and write state."""

    __slots__ = ("name", "folder", "retained", "next_sequence", "segments", "dirty", "folder_dirty")

    def __init__(self, name: str, folder: str, retained: bool, next_sequence: int) -> None:
        self.name = name
        self.folder = folder
        self.retained = retained
        self.next_sequence = next_sequence
        self.segments: list[_Segment] = []
        #: Appended to since the last sync (its active segment's file is open: closing it syncs it).
        self.dirty = False
        #: A segment file was created since the last sync.
        self.folder_dirty = False

    @property
    def first_sequence(self) -> int:
        return self.segments[0].base if self.segments else self.next_sequence
