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
"Closed connections and the cyclic collector").
"""

from __future__ import annotations

import gc
import time
from typing import Any


class SurvivorFreezer:
    """Freezes what survives each full collection, and times the full collections (for ``/stats``)."""

    def __init__(
        self, refreeze: bool = True, full_threshold: int | None = None, clock: Any = time.perf_counter
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

    def start(self) -> None:
        """The node is up: what it holds now lives as long as the process; collect once, freeze the survivors."""
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
            "startup_full_ms": round(self.startup_full_seconds * 1000, 3),
            "last_full_ms": round(self.last_full_seconds * 1000, 3),
            "max_full_ms": round(self.max_full_seconds * 1000, 3),
        }
