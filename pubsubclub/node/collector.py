"""The cyclic garbage collector in a node process: survivors of a full collection are frozen, so none walks them again.

A full collection walks every tracked object not frozen; a node holding
10,000 WAMP sessions holds ~240,000 of them, and Python starts one whenever
the objects promoted to its oldest generation since the last reach a quarter
of those that survived it: a node whose sessions grow or churn by a quarter
stalls its reactor (every client on it) for the walk, 250-320 ms at 10,000
sessions (docs/benchmarks.md). :class:`SurvivorFreezer` hooks
``gc.callbacks``: at the end of every full collection it moves the survivors
to the permanent generation (``gc.freeze()``), so the next full collection
walks only what came since the last. Python's quarter rule then compares
what came since with what the last one walked; the third threshold
(``gc-full-threshold``, 1 here, Python's 10) lets a full collection follow
every collection of the middle generation, so each walks about as much as
that one (~7,000 objects net) rather than ten times as much.

Frozen objects are still freed by reference counting; what a full
collection no longer finds is a reference cycle among frozen objects that
became garbage after it. The connection layer breaks the cycles a client
connection forms, when it closes (pubsubclub/net/edge.py), so session churn
leaves nothing frozen behind; the ``gc`` part of ``/stats`` shows the frozen
count, which a leak would make grow with churn (docs/architecture.md,
"Closed connections and the cyclic collector"). A safety net bounds such a
leak: every :data:`THAW_CHECK_SECONDS` the frozen count is compared with what
it was after the last thaw (or start-up); past ``gc-thaw-growth`` times that,
everything is unfrozen and collected once (one long walk, the stall the
freezing otherwise avoids), and the survivors frozen again. A node whose
sessions grow from 1,000 to 10,000 thaws about twice on the way (factor 2);
one whose frozen population stays flat (churn without leaks) never does.
"""

from __future__ import annotations

import gc
import time
from typing import Any

#: Seconds between two comparisons of the frozen count with its size after the last thaw.
THAW_CHECK_SECONDS = 60.0


class SurvivorFreezer:
    """Freezes what survives each full collection, and times the full collections (for ``/stats``)."""

    def __init__(
        self,
        refreeze: bool = True,
        full_threshold: int | None = None,
        clock: Any = time.perf_counter,
        thaw_growth: float = 2.0,
    ) -> None:
        #: Freeze after each full collection; False: only time them (the start-up freeze alone).
        self.refreeze = refreeze
        #: Python's third threshold, set by :meth:`start` (None: left as it is).
        self.full_threshold = full_threshold
        self._clock = clock
        self._started = 0.0
        #: Full collections seen (since :meth:`start`), and freezes after one (the start-up one's included).
        self.full_collections = 0
        self.freezes = 0
        #: Wall time of the start-up collection (:meth:`start`), in seconds.
        self.startup_full_seconds = 0.0
        #: Wall time of the last and of the longest full collection (since :meth:`start`), in seconds.
        self.last_full_seconds = 0.0
        self.max_full_seconds = 0.0
        self.installed = False
        #: Thaw and collect everything once the frozen count passes this many times its size after the
        #: last thaw (0: never).
        self.thaw_growth = thaw_growth
        #: Thaws done (:meth:`check_growth`), and the frozen count they compare with.
        self.thaws = 0
        self._thaw_baseline = 0
        self._checker: Any = None

    def install(self) -> None:
        """Watch the collector (``gc.callbacks``)."""
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def uninstall(self) -> None:
        """Stop watching; what is frozen stays frozen."""
        if self.installed:
            gc.callbacks.remove(self._callback)
            self.installed = False

    def start(self, reactor: Any = None) -> None:
        """The node is up: what it holds now lives as long as the process; collect once, freeze the survivors.

        With ``reactor``, :meth:`check_growth` runs every :data:`THAW_CHECK_SECONDS` on it.
        """
        self.install()
        if self.full_threshold is not None:
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, self.full_threshold)
        gc.collect()
        if not self.refreeze:
            gc.freeze()  # the callback froze them otherwise
        # The start-up collection walked the whole node as built; from here on, the ones that stall clients.
        self.startup_full_seconds = self.last_full_seconds
        self.full_collections = 0
        self.last_full_seconds = self.max_full_seconds = 0.0
        self._thaw_baseline = gc.get_freeze_count()
        if reactor is not None and self.refreeze and self.thaw_growth > 0 and self._checker is None:
            from twisted.internet.task import LoopingCall

            self._checker = LoopingCall(self.check_growth)
            self._checker.clock = reactor
            self._checker.start(THAW_CHECK_SECONDS, now=False)

    def stop(self) -> None:
        """Stop the periodic check (what is frozen stays frozen)."""
        if self._checker is not None and self._checker.running:
            self._checker.stop()
        self._checker = None

    def check_growth(self) -> bool:
        """Past ``thaw_growth`` times the frozen count after the last thaw: unfreeze, collect all once; True if so.

        Frees reference cycles among frozen objects that became garbage after
        their freeze (which no full collection finds): a leak the connection
        layer's cycle breaking should leave nothing to, bounded here to
        ``thaw_growth`` times the live frozen population.
        """
        if not self.refreeze or self.thaw_growth <= 0:
            return False
        if gc.get_freeze_count() <= self._thaw_baseline * self.thaw_growth:
            return False
        gc.unfreeze()
        gc.collect()  # its end (the callback) freezes the survivors again
        self.thaws += 1
        self._thaw_baseline = gc.get_freeze_count()
        return True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = self._clock()
            return
        seconds = self._clock() - self._started
        self.full_collections += 1
        self.last_full_seconds = seconds
        self.max_full_seconds = max(self.max_full_seconds, seconds)
        if self.refreeze:
            # Right at the end of the collection the young generations are empty and the oldest holds
            # exactly its survivors: all reachable, none garbage, when frozen.
            gc.freeze()
            self.freezes += 1

    def stats(self) -> dict[str, Any]:
        """The ``gc`` part of ``/stats``."""
        return {
            "refreeze": self.refreeze,
            "thresholds": list(gc.get_threshold()),
            "frozen": gc.get_freeze_count(),
            "full_collections": self.full_collections,
            "freezes": self.freezes,
            "thaw_growth": self.thaw_growth,
            "thaws": self.thaws,
            "startup_full_ms": round(self.startup_full_seconds * 1000, 3),
            "last_full_ms": round(self.last_full_seconds * 1000, 3),
            "max_full_ms": round(self.max_full_seconds * 1000, 3),
        }
