"""The NSD store: channels, subscriptions and message history in SQLite.

One file per node under ``--data-dir`` (``nsd.sqlite3``). Every node keeps the
whole cluster's NSD state (it is replicated over the ``$nsd.*`` topics, see
:mod:`pubsubclub.frontends.nsd.protocol`), so a node restart or a client moving between
nodes finds the same channels, subscriptions and history. Calls are
synchronous: SQLite in WAL mode answers these small queries in microseconds,
well below what a thread hop would cost.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS channels (
    name TEXT PRIMARY KEY,
    created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    identity TEXT NOT NULL,
    channel TEXT NOT NULL,
    active INTEGER NOT NULL,
    stamp INTEGER NOT NULL,
    PRIMARY KEY (identity, channel)
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    "when" INTEGER NOT NULL,
    message_id TEXT NOT NULL UNIQUE,
    message BLOB NOT NULL,
    stored_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_channel ON messages (channel, "when");
CREATE TABLE IF NOT EXISTS quarantine (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    reason TEXT NOT NULL,
    row TEXT NOT NULL,
    quarantined_at REAL NOT NULL
);
"""

#: Longest message id a stored row may have.
_MAX_ID_CHARS = 256
#: Why a messages row is bad, checked in SQL (a full scan in C: cheap even for big histories).
_BAD_MESSAGE = f"""
    CASE
      WHEN typeof("when") != 'integer' OR "when" <= 0 OR "when" > :horizon THEN 'when out of range'
      WHEN typeof(message_id) != 'text' OR length(message_id) NOT BETWEEN 1 AND {_MAX_ID_CHARS} THEN 'bad message id'
      WHEN typeof(channel) != 'text' OR length(channel) = 0 THEN 'bad channel'
      WHEN NOT json_valid(CAST(message AS TEXT)) OR json_type(CAST(message AS TEXT)) != 'object'
        THEN 'not a JSON object'
    END"""

#: What a bad row is checked against: (table, row) -> problem or None.
RowCheck = Callable[[str, tuple[Any, ...]], "str | None"]


class NSDStore:
    """Channels, per-identity subscriptions (last writer wins) and history."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    # -- channels -------------------------------------------------------------------

    def channels(self) -> list[str]:
        """Every known channel."""
        return [row[0] for row in self._db.execute("SELECT name FROM channels ORDER BY name")]

    def has_channel(self, name: str) -> bool:
        """Whether ``name`` exists."""
        return self._db.execute("SELECT 1 FROM channels WHERE name = ?", (name,)).fetchone() is not None

    def add_channel(self, name: str, created: int) -> bool:
        """Create ``name``; True when it is new."""
        cur = self._db.execute("INSERT OR IGNORE INTO channels (name, created) VALUES (?, ?)", (name, created))
        return cur.rowcount > 0

    # -- subscriptions -----------------------------------------------------------------

    def set_subscription(self, identity: str, channel: str, active: bool, stamp: int) -> bool:
        """Record (un)subscription if ``stamp`` is newer than what is stored; True if applied."""
        cur = self._db.execute(
            """INSERT INTO subscriptions (identity, channel, active, stamp) VALUES (?, ?, ?, ?)
               ON CONFLICT (identity, channel) DO UPDATE SET active = excluded.active, stamp = excluded.stamp
               WHERE excluded.stamp > subscriptions.stamp""",
            (identity, channel, int(active), stamp),
        )
        return cur.rowcount > 0

    def subscribed(self, identity: str) -> list[str]:
        """Channels ``identity`` is subscribed to now."""
        rows = self._db.execute(
            "SELECT channel FROM subscriptions WHERE identity = ? AND active = 1 ORDER BY channel", (identity,)
        )
        return [row[0] for row in rows]

    def subscriptions(self) -> list[tuple[str, str, bool, int]]:
        """Every subscription record (for replication)."""
        rows = self._db.execute("SELECT identity, channel, active, stamp FROM subscriptions")
        return [(i, c, bool(a), s) for i, c, a, s in rows]

    # -- history ---------------------------------------------------------------------

    def add_message(self, channel: str, when: int, message_id: str, message: bytes) -> bool:
        """Store one message; False when its id is already stored (replicated twice)."""
        cur = self._db.execute(
            'INSERT OR IGNORE INTO messages (channel, "when", message_id, message, stored_at) VALUES (?, ?, ?, ?, ?)',
            (channel, when, message_id, message, time.time()),
        )
        return cur.rowcount > 0

    def has_message(self, message_id: str) -> bool:
        """Whether a message with this id is stored."""
        return self._db.execute("SELECT 1 FROM messages WHERE message_id = ?", (message_id,)).fetchone() is not None

    def messages_after(self, channels: Iterable[str], after: int, limit: int) -> list[tuple[str, bytes]]:
        """(channel, message) of ``channels`` with ``when > after`` in publish order (the newest ``limit``)."""
        names = list(channels)
        if not names:
            return []
        marks = ",".join("?" * len(names))
        rows = self._db.execute(
            f'SELECT channel, message FROM (SELECT channel, message, "when", message_id FROM messages '
            f'WHERE channel IN ({marks}) AND "when" > ? ORDER BY "when" DESC, message_id DESC LIMIT ?) '
            f'ORDER BY "when", message_id',
            (*names, after, limit),
        )
        return [(row[0], row[1]) for row in rows]

    def history(self, after: int = 0) -> list[tuple[str, int, str, bytes]]:
        """Every stored message after ``after`` (for replication), oldest first."""
        rows = self._db.execute(
            'SELECT channel, "when", message_id, message FROM messages WHERE "when" > ? ORDER BY "when", message_id',
            (after,),
        )
        return [(c, w, i, m) for c, w, i, m in rows]

    def max_when(self) -> int:
        """The newest ``when`` stored, or 0."""
        row = self._db.execute('SELECT MAX("when") FROM messages').fetchone()
        return int(row[0] or 0)

    def apply_retention(self, keep_per_channel: int | None, max_age_seconds: float | None) -> int:
        """Drop history beyond the retention settings; return how many rows went."""
        removed = 0
        if max_age_seconds:
            cur = self._db.execute("DELETE FROM messages WHERE stored_at < ?", (time.time() - max_age_seconds,))
            removed += cur.rowcount
        if keep_per_channel:
            cur = self._db.execute(
                """DELETE FROM messages WHERE seq IN (
                     SELECT seq FROM (
                       SELECT seq, ROW_NUMBER() OVER (PARTITION BY channel ORDER BY "when" DESC, message_id DESC) AS n
                       FROM messages) WHERE n > ?)""",
                (keep_per_channel,),
            )
            removed += cur.rowcount
        return removed

    # -- repair ----------------------------------------------------------------------

    def quarantine_bad_rows(self, horizon: int, row_problem: RowCheck) -> int:
        """Move rows that older versions could store but NSD must not serve to ``quarantine``; return how many.

        Messages are checked in SQL (``when`` in ``1..horizon``, id, channel,
        a JSON object); channels and subscriptions (few) by ``row_problem``.
        Quarantined rows keep their data (as JSON text) for an operator.
        """
        moved: list[tuple[str, str, str, tuple[Any, ...]]] = []
        for seq, channel, when, message_id, message, reason in self._db.execute(
            f'SELECT seq, channel, "when", message_id, message, {_BAD_MESSAGE} AS reason FROM messages '
            "WHERE reason IS NOT NULL",
            {"horizon": horizon},
        ):
            text = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
            moved.append(
                ("messages", reason, "DELETE FROM messages WHERE seq = ?", (seq, [channel, when, message_id, text]))
            )
        for name, created in self._db.execute("SELECT name, created FROM channels"):
            reason = row_problem("channels", (name,))
            if reason is not None:
                moved.append(("channels", reason, "DELETE FROM channels WHERE name = ?", (name, [name, created])))
        for identity, channel, active, stamp in self._db.execute(
            "SELECT identity, channel, active, stamp FROM subscriptions"
        ):
            reason = row_problem("subscriptions", (identity, channel, bool(active), stamp))
            if reason is not None:
                moved.append(
                    (
                        "subscriptions",
                        reason,
                        "DELETE FROM subscriptions WHERE identity = ? AND channel = ?",
                        ((identity, channel), [identity, channel, active, stamp]),
                    )
                )
        if not moved:
            return 0
        now = time.time()
        self._db.execute("BEGIN")
        try:
            for source, reason, delete, (key, row) in moved:
                data = json.dumps(row, default=repr)
                self._db.execute(
                    "INSERT INTO quarantine (source, reason, row, quarantined_at) VALUES (?, ?, ?, ?)",
                    (source, reason, data, now),
                )
                self._db.execute(delete, key if isinstance(key, tuple) else (key,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return len(moved)

    def quarantined(self) -> list[tuple[str, str, str]]:
        """Every quarantined row: (table, reason, row as JSON text)."""
        return [(s, r, d) for s, r, d in self._db.execute("SELECT source, reason, row FROM quarantine ORDER BY seq")]

    def stats(self) -> dict[str, Any]:
        """Row counts."""
        q = self._db.execute
        return {
            "channels": q("SELECT COUNT(*) FROM channels").fetchone()[0],
            "messages": q("SELECT COUNT(*) FROM messages").fetchone()[0],
            "subscriptions": q("SELECT COUNT(*) FROM subscriptions WHERE active = 1").fetchone()[0],
            "quarantined": q("SELECT COUNT(*) FROM quarantine").fetchone()[0],
        }
