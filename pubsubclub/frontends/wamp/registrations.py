"""The dealer's registration table entries and calls in flight, and how a procedure matches one.

Split from pubsubclub/frontends/wamp/dealer.py (issue 19): the records the
Dealer keeps (``_Registration``, ``_Call``), the session and cluster-listener
protocols it is written against, the ``match``/``invoke`` options it offers
and the pure helpers for its per-owner tables and wildcard matching. The
Dealer itself (REGISTER, CALL, the tables and their caps) stays in dealer.py,
which re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from autobahn.wamp import message

MATCHES = ("exact", "prefix", "wildcard")
INVOKES = ("single", "roundrobin", "random", "first", "last")


class Party(Protocol):
    """A session as the dealer sees it."""

    def send_message(self, msg: message.Message) -> None:
        """Send one WAMP message to this session's client."""

    def send_if_fits(self, msg: message.Message) -> tuple[int, int] | None:
        """Send ``msg`` if its encoding fits the session's message-size limit: None; else ``(size, limit)``, unsent."""


class ClusterListener(Protocol):
    """Told of this node's own registrations (federation/rpc.py announces them to the other nodes)."""

    def registered(self, registration: _Registration) -> None:
        """A local registration was made."""

    def unregistered(self, registration: _Registration) -> None:
        """A local registration is gone."""


@dataclass(eq=False, slots=True)
class _Registration:
    id: int
    realm: str
    procedure: str
    callee: Party
    #: The callee announced call canceling: it is sent INTERRUPT for calls that end without it.
    interruptible: bool = False
    match: str = "exact"
    invoke: str = "single"
    #: When it was made (its node's clock) and on which node: the cluster-wide order of registrations.
    created: float = 0.0
    node: str = ""
    #: Its id on its own node, for a registration of another node (``callee`` is then the link's stand-in).
    remote_id: int | None = None
    #: The callee asked ``disclose_caller`` (its INVOCATIONs name the caller when the caller's node permits it).
    disclose_caller: bool = False

    @property
    def order(self) -> tuple[float, str, int]:
        """Earlier first, the same on every node: wins a single procedure, ``first`` of a shared one."""
        return (self.created, self.node, self.id if self.remote_id is None else self.remote_id)


@dataclass(eq=False, slots=True)
class _Call:
    """One CALL in flight: who asked, who answers, and the timer ending it."""

    caller: Party
    request: int
    callee: Party
    registration: _Registration
    timer: Any = None


class DisclosedInvocation(message.Invocation):  # type: ignore[misc]
    """An INVOCATION for another node's callee whose caller's node discloses the caller regardless (PSC403 ``"d"``)."""

    __slots__ = ()


#: Who a call's caller is, as far as its node lets it be known: (session id, authid, authrole).
Identity = tuple[int | None, str | None, str | None]
NO_IDENTITY: Identity = (None, None, None)


def _forget(table: dict[Any, dict[int, Any]], owner: Any, key: int) -> None:
    """Remove ``key`` from ``owner``'s entries in ``table``, and the owner once it has none."""
    own = table.get(owner)
    if own is not None:
        own.pop(key, None)
        if not own:
            del table[owner]


def _unoffered(msg: message.Register) -> str | None:
    """Why a REGISTER asks for something this dealer does not offer, or None."""
    if msg.match not in (None, *MATCHES):
        return f"this dealer offers match {', '.join(MATCHES)}, not {msg.match!r}"
    if msg.invoke not in (None, *INVOKES):
        return f"this dealer offers invoke {', '.join(INVOKES)}, not {msg.invoke!r}"
    return None


def _wildcard(pattern: str, procedure: str) -> bool:
    """WAMP wildcard matching: as many ``.``-separated parts, each non-empty pattern part equal."""
    parts = pattern.split(".")
    called = procedure.split(".")
    if len(parts) != len(called):
        return False
    return all(not p or p == c for p, c in zip(parts, called, strict=True))


#: A dealer table key: (realm, match, procedure or pattern).
Key = tuple[str, str, str]


class PatternIndex:
    """The prefix and wildcard keys of a dealer's table, found for a called procedure without a scan of them all.

    Prefixes are kept per realm by length: a CALL tries the procedure's own
    prefixes of those lengths only, longest first (a dict lookup each).
    Wildcards are kept per realm and number of ``.``-separated parts: only
    those with as many parts as the procedure are tried. The choice is the
    dealer's rule: the longest matching prefix, else the matching wildcard
    with the most non-empty parts (then the greatest pattern).
    """

    __slots__ = ("_lengths", "_order", "_wildcards")

    def __init__(self) -> None:
        #: realm -> prefix length -> prefix keys of that length.
        self._lengths: dict[str, dict[int, int]] = {}
        #: realm -> its prefix lengths, longest first.
        self._order: dict[str, tuple[int, ...]] = {}
        #: (realm, parts) -> wildcard keys.
        self._wildcards: dict[tuple[str, int], dict[Key, None]] = {}

    def add(self, key: Key) -> None:
        """A prefix or wildcard key gained its first registration."""
        realm, match, uri = key
        if match == "prefix":
            lengths = self._lengths.setdefault(realm, {})
            lengths[len(uri)] = lengths.get(len(uri), 0) + 1
            self._order[realm] = tuple(sorted(lengths, reverse=True))
        elif match == "wildcard":
            self._wildcards.setdefault((realm, uri.count(".") + 1), {})[key] = None

    def remove(self, key: Key) -> None:
        """A prefix or wildcard key lost its last registration."""
        realm, match, uri = key
        if match == "prefix":
            lengths = self._lengths.get(realm, {})
            left = lengths.get(len(uri), 0) - 1
            if left > 0:
                lengths[len(uri)] = left
                return
            lengths.pop(len(uri), None)
            if lengths:
                self._order[realm] = tuple(sorted(lengths, reverse=True))
            else:
                self._lengths.pop(realm, None)
                self._order.pop(realm, None)
        elif match == "wildcard":
            slot = (realm, uri.count(".") + 1)
            keys = self._wildcards.get(slot)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._wildcards[slot]

    def find(self, realm: str, procedure: str, groups: dict[Key, list[Any]], exclude: Any = None) -> Key | None:
        """The key of the pattern registration a CALL of ``procedure`` goes to (none held only by ``exclude``)."""
        for n in self._order.get(realm, ()):
            if n <= len(procedure):
                key = (realm, "prefix", procedure[:n])
                group = groups.get(key)
                if group and (exclude is None or any(r.callee is not exclude for r in group)):
                    return key
        candidates = self._wildcards.get((realm, procedure.count(".") + 1))
        if not candidates:
            return None
        best: tuple[int, str] | None = None
        found: Key | None = None
        for key in candidates:
            if not _wildcard(key[2], procedure):
                continue
            if exclude is not None and all(r.callee is exclude for r in groups[key]):
                continue
            rank = (sum(1 for part in key[2].split(".") if part), key[2])
            if best is None or rank > best:
                best, found = rank, key
        return found
