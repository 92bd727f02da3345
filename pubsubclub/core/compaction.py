"""When to copy a table that grew large and has emptied since.

CPython never shrinks a dict's (or a set's) hash table when keys are
deleted: a table that once held 300,000 registrations keeps its 300,000-slot
arrays (about 10 MB) after every session that made them has left, until the
next insertion that happens to resize it. A copy (``dict(d)``) is sized for
what is left. :class:`Compaction` tracks one table's high-water mark and says
when that copy is worth making: once the table has fallen to a quarter of its
peak (and the peak was large enough to matter), or has emptied, so the
copying costs O(1) amortised per removal.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Tables that never held more than this many entries are not worth copying.
MIN_PEAK = 1024
#: Entries the smallest dict table holds (CPython's 8 slots, two thirds usable).
MINIMAL_DICT = 5


@dataclass(slots=True)
class Compaction:
    """The high-water mark of one table (or of tables that grow and shrink together)."""

    peak: int = 0

    def grown(self, size: int) -> None:
        """The table now holds ``size`` entries (call after an insertion)."""
        if size > self.peak:
            self.peak = size

    def due(self, size: int) -> bool:
        """After a removal: True when the table (now ``size`` entries) should be copied; the mark restarts.

        Also when it has just emptied after holding more than a minimal dict does
        (copying an empty table costs nothing), so an idle node's tables are as
        small as a fresh node's.
        """
        if size == 0:
            due = self.peak > MINIMAL_DICT
        else:
            due = self.peak >= MIN_PEAK and size * 4 <= self.peak
        if due:
            self.peak = size
        return due
