"""Failed logins slow the guesser: per-source lockouts that grow with each failure (sans-IO).

One :class:`LoginThrottle` per node is asked by every place that checks a
credential (WAMP ticket, WAMP-CRA and cryptosign; the TEP operator API's
bearer token). A source address may fail ``failures_before_delay`` times
freely; each further failure locks it out for ``first_delay`` seconds,
doubling up to ``max_delay``. While locked out, its attempts are refused at
once without the credential being checked, so a guesser gets at most one
checked guess per lockout, however many connections it opens. Other
sources, the real principal's among them, are not affected.

State is a timestamp pair per source, never a timer: the table holds at
most ``max_sources`` entries (least recently failed dropped first), and a
source that fails nothing for ``forget_after`` seconds starts afresh. IPv6
sources count per /64, the block one host usually holds. Time comes from an
injected clock (the reactor's ``seconds`` in a node).

A successful login does not clear a source's failures: whoever holds one
valid credential could otherwise log in between guesses at another's.

A node with workers keeps one table per process and makes them one
(federation/logins.py): :attr:`LoginThrottle.listener` hears each failure
seen here, :meth:`LoginThrottle.replicated` applies one another process saw,
and :meth:`LoginThrottle.rows` / :meth:`LoginThrottle.merge` carry a whole
table to a process that (re)starts, merged by the larger count and the later
times (idempotent: a row merged twice changes nothing).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["RETRY_ELSEWHERE", "LoginThrottle", "LoginThrottleSettings", "source_key"]

#: "Try again in" seconds told to a source past its free failures by a process that does not check them.
RETRY_ELSEWHERE = 1.0


@dataclass(frozen=True)
class LoginThrottleSettings:
    """The throttle's limits (``[node] auth-*`` settings)."""

    #: Failed logins a source may make before lockouts begin.
    failures_before_delay: int = 5
    #: Lockout after the first failure past that, in seconds; each further failure doubles it.
    first_delay: float = 1.0
    #: Longest lockout, in seconds.
    max_delay: float = 60.0
    #: A source with no failure for this long is forgotten (its count starts again), in seconds.
    forget_after: float = 600.0
    #: Sources remembered at most; past it the one that failed least recently is forgotten.
    max_sources: int = 10_000


def source_key(host: str) -> str:
    """The key a source address is counted under: the address itself, or its /64 for IPv6."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


class _Failures:
    """One source's count and when its lockout ends."""

    __slots__ = ("count", "last", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last = 0.0
        self.until = 0.0


class LoginThrottle:
    """Per-source failure counts with growing lockouts; ask :meth:`locked` before checking a credential."""

    def __init__(self, settings: LoginThrottleSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self._clock = clock
        self._sources: OrderedDict[str, _Failures] = OrderedDict()
        #: Counters for /stats (``replicated``: failures another process of the node saw, federation/logins.py).
        self.counts = {
            "failures": 0,
            "lockouts": 0,
            "refused": 0,
            "forgotten_early": 0,
            "replicated": 0,
            "elsewhere": 0,
        }
        #: Called with the source key of each failure seen here (not of replicated ones); None: nobody.
        self.listener: Callable[[str], None] | None = None
        #: Whether this process checks the credentials of a source past its free failures. False in a
        #: node's workers other than the primary: those sources are checked by the primary alone, one at a
        #: time, so a guesser timing its tries to reach every worker at once still gets one per lockout.
        self.checks_past_free = True

    def locked(self, host: str) -> float:
        """Seconds ``host`` must still wait before a credential of its is checked; 0.0 if it may try now.

        A positive answer counts as a refused attempt. Where :attr:`checks_past_free` is False, a source
        past its free failures is refused here with :data:`RETRY_ELSEWHERE` once its lockout is over.
        """
        entry = self._sources.get(source_key(host))
        if entry is None:
            return 0.0
        now = self._clock()
        left = entry.until - now
        if left <= 0.0:
            settings = self.settings
            if (
                self.checks_past_free
                or entry.count < settings.failures_before_delay
                or now - entry.last >= settings.forget_after
            ):
                return 0.0
            left = RETRY_ELSEWHERE
            self.counts["elsewhere"] += 1
        self.counts["refused"] += 1
        return left

    def failed(self, host: str) -> float:
        """``host`` gave a wrong credential; the lockout it starts now, in seconds (0.0: none yet)."""
        key = source_key(host)
        delay = self._fail(key)
        self.counts["failures"] += 1
        if delay > 0.0:
            self.counts["lockouts"] += 1
        if self.listener is not None:
            self.listener(key)
        return delay

    def replicated(self, key: str) -> float:
        """Source ``key`` failed on another process of this node: counted here as if it failed here."""
        self.counts["replicated"] += 1
        return self._fail(key)

    def _fail(self, key: str) -> float:
        settings = self.settings
        now = self._clock()
        entry = self._entry(key, now)
        entry.count += 1
        entry.last = now
        over = entry.count - settings.failures_before_delay
        if over <= 0:
            return 0.0
        delay = min(settings.max_delay, settings.first_delay * 2.0 ** min(over - 1, 64))
        entry.until = now + delay
        return delay

    def _entry(self, key: str, now: float) -> _Failures:
        """``key``'s entry (a fresh one if it has none or was quiet for ``forget_after``), now the most recent."""
        settings = self.settings
        entry = self._sources.pop(key, None)
        if entry is None or now - entry.last >= settings.forget_after:
            entry = _Failures()
        self._sources[key] = entry  # most recently failed last
        sources = self._sources
        while len(sources) > settings.max_sources:
            sources.popitem(last=False)
            self.counts["forgotten_early"] += 1
        while sources:  # the oldest first: drop those quiet for forget_after
            oldest = next(iter(sources.values()))
            if oldest is entry or now - oldest.last < settings.forget_after:
                break
            sources.popitem(last=False)
        return entry

    def rows(self) -> Iterator[tuple[str, int, float, float]]:
        """Each remembered source as ``(key, count, seconds since its last failure, seconds of lockout left)``.

        The least recently failed first; the keys are read when the iteration
        starts, so the table may change while it runs (gone entries are skipped).
        """
        now = self._clock()
        for key in list(self._sources):
            entry = self._sources.get(key)
            if entry is not None and now - entry.last < self.settings.forget_after:
                yield key, entry.count, now - entry.last, max(0.0, entry.until - now)

    def merge(self, key: str, count: int, age: float, left: float) -> bool:
        """Merge a row of another process's table (:meth:`rows`): the larger count, the later times.

        True when it changed this table (the row told something new).
        """
        now = self._clock()
        if age >= self.settings.forget_after or count <= 0:
            return False
        last = now - max(0.0, age)
        until = now + min(max(0.0, left), self.settings.max_delay)
        entry = self._sources.get(key)
        if entry is not None and now - entry.last < self.settings.forget_after:
            if count <= entry.count and last <= entry.last and until <= entry.until:
                return False
        entry = self._entry(key, now)
        entry.count = max(entry.count, count)
        entry.last = max(entry.last, last)
        entry.until = max(entry.until, until)
        return True

    def __len__(self) -> int:
        """Sources remembered."""
        return len(self._sources)

    def stats(self) -> dict[str, int]:
        """Sources remembered and the counters, for /stats."""
        return {"sources": len(self._sources), **self.counts}
