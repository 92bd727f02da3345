"""The stream front-end's committed offsets per (consumer group, topic), in SQLite."""

from __future__ import annotations

import sqlite3

from pubsubclub.frontends.stream.segments import MAX_OFFSET, StreamLogError, _topic_bytes

_OFFSETS_SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    group_id TEXT NOT NULL,
    topic TEXT NOT NULL,
    offset INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic)
);
"""


class OffsetStore:
    """Committed offsets per (consumer group, topic), in SQLite (WAL, synchronous=FULL)."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._db = sqlite3.connect(path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_OFFSETS_SCHEMA)
        except sqlite3.Error as exc:
            raise StreamLogError(f"cannot open the offset store {path}: {exc}") from exc

    def commit(self, group: str, topic: str, offset: int) -> None:
        """Record ``offset`` as ``group``'s committed offset of ``topic`` (durable on return)."""
        _topic_bytes(topic)
        if not isinstance(group, str):
            raise StreamLogError("a group id must be a string")
        if type(offset) is not int or not 0 <= offset <= MAX_OFFSET:
            raise StreamLogError(f"offset {offset!r} is not an integer in [0, 2**63)")
        try:
            self._db.execute(
                """INSERT INTO offsets (group_id, topic, offset) VALUES (?, ?, ?)
                   ON CONFLICT (group_id, topic) DO UPDATE SET offset = excluded.offset""",
                (group, topic, offset),
            )
        except sqlite3.Error as exc:
            raise StreamLogError(f"cannot commit the offset of {topic[:80]!r}: {exc}") from exc

    def get(self, group: str, topic: str) -> int | None:
        """``group``'s committed offset of ``topic``, or None when it has none."""
        row = self._db.execute("SELECT offset FROM offsets WHERE group_id = ? AND topic = ?", (group, topic)).fetchone()
        return None if row is None else int(row[0])

    def close(self) -> None:
        """Close the database."""
        self._db.close()
