"""Log lines about refused connections, rate-limited: a few in full, then a count per interval.

A stranger can make a node refuse thousands of connections a second; one
log line each would fill the disk and bury everything else (47,750 lines in
60 s before this existed). :class:`RateLimitedLog` logs the first
``burst`` events of a kind in each ``interval`` in full and counts the rest;
when the interval ends one line says how many were not logged. A kind is a
fixed string chosen by the caller (never peer data), so the table stays as
small as the code's kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger, LogLevel

#: Seconds of one counting window.
DEFAULT_INTERVAL = 10.0
#: Events of one kind logged in full per window; the rest are counted.
DEFAULT_BURST = 5


@dataclass
class _Window:
    """One kind's current window: when it began, how many were logged and how many only counted."""

    start: float
    level: LogLevel
    logged: int = 0
    suppressed: int = 0
    summary: IDelayedCall | None = None


class RateLimitedLog:
    """Logs at most ``burst`` lines per kind per ``interval``, then one line with the count of the rest."""

    def __init__(
        self, log: Logger, clock: IReactorTime, *, interval: float = DEFAULT_INTERVAL, burst: int = DEFAULT_BURST
    ) -> None:
        self._log = log
        self._clock = clock
        self.interval = interval
        self.burst = burst
        self._windows: dict[str, _Window] = {}
        #: Events counted but not logged one by one, over the log's life.
        self.suppressed = 0

    def warn(self, kind: str, format: str, **fields: Any) -> bool:
        """A warning of ``kind``; True when it was logged in full."""
        return self.emit(LogLevel.warn, kind, format, **fields)

    def info(self, kind: str, format: str, **fields: Any) -> bool:
        """An informational line of ``kind``; True when it was logged in full."""
        return self.emit(LogLevel.info, kind, format, **fields)

    def emit(self, level: LogLevel, kind: str, format: str, **fields: Any) -> bool:
        """Log ``format`` with ``fields`` at ``level`` unless ``kind`` used its burst in this window."""
        now = self._clock.seconds()
        window = self._windows.get(kind)
        if window is None or now - window.start >= self.interval:
            if window is not None and window.summary is not None:
                # The clock jumped past the summary's time without running it.
                self._summarise(kind)
            window = self._windows[kind] = _Window(now, level)
        if window.logged < self.burst:
            window.logged += 1
            self._log.emit(level, format, **fields)
            return True
        window.suppressed += 1
        self.suppressed += 1
        if window.summary is None:
            delay = max(window.start + self.interval - now, 0.0)
            window.summary = self._clock.callLater(delay, self._summarise, kind)
        return False

    def _summarise(self, kind: str) -> None:
        window = self._windows.pop(kind, None)
        if window is None:
            return
        if window.summary is not None and window.summary.active():
            window.summary.cancel()
        if window.suppressed:
            self._log.emit(
                window.level,
                "{kind}: {count} more in the last {interval:g} s, not logged one by one",
                kind=kind,
                count=window.suppressed,
                interval=self.interval,
            )

    def flush(self) -> None:
        """Log every pending count now and cancel the timers (on shutdown)."""
        for kind in list(self._windows):
            window = self._windows[kind]
            if window.summary is not None:
                self._summarise(kind)
            else:
                del self._windows[kind]
