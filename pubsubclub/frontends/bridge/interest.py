"""Which topics and patterns a router's clients want, from its subscription meta API (sans-IO).

Why it exists: a bridge (pubsubclub/frontends/bridge/router.py) must tell the cluster
what the router's clients subscribe to, but the router only tells it facts one
at a time (a listing, ``on_create``, ``on_subscribe``, ``on_unsubscribe``,
``on_delete``, a session's role), asynchronously and interleaved. This module
turns those facts, in arrival order, into "this (match, uri) is now wanted /
no longer wanted", with no I/O, so every interleaving can be tested in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from autobahn.wamp.exception import ApplicationError


@dataclass
class _Subscription:
    """One router subscription (Crossbar: one per URI and match policy)."""

    uri: str
    match: str
    members: set[int] = field(default_factory=set)


#: One subscription as the router names it: ``(match, uri)``, match ``exact``, ``prefix`` or ``wildcard``.
Interest = tuple[str, str]
EXACT = "exact"


@dataclass(frozen=True)
class InterestStep:
    """What one meta-API fact changed: interests gained or lost, sessions whose role must be asked."""

    added: tuple[Interest, ...] = ()
    removed: tuple[Interest, ...] = ()
    lookup: tuple[int, ...] = ()


class RouterInterest:
    """The topics and patterns that non-bridge sessions of a router subscribe to, from its meta API.

    Fed facts in the order they arrive on the bridge's router session (a
    listing's answer reflects every event that arrived before it, since one
    connection delivers in order), it answers which ``(match, uri)`` became
    wanted or unwanted. A session counts once its role is known and is not the
    bridge role; ``own_session`` (the bridge itself) never counts, nor do the
    router's own ``wamp.*`` topics.
    """

    def __init__(self, own_session: int, bridge_role: str) -> None:
        self.bridge_role = bridge_role
        self._subs: dict[int, _Subscription] = {}
        #: session -> True (a bridge), False (counts), None (role asked, not yet known).
        self._bridge: dict[int, bool | None] = {own_session: True}
        self._own = own_session
        self._wanted: set[Interest] = set()

    def wanted(self) -> set[Interest]:
        """Every ``(match, uri)`` some counted session subscribes to."""
        return set(self._wanted)

    def subscriptions(self) -> list[list[Any]]:
        """``[match, uri, members]`` of every router subscription known, for /stats."""
        return sorted([sub.match, sub.uri, len(sub.members)] for sub in self._subs.values())

    def sessions(self) -> int:
        """Sessions tracked (members of some subscription, or asked about)."""
        return len(self._bridge) - 1

    def created(self, session: int, details: dict[str, Any]) -> InterestStep:
        """``wamp.subscription.on_create``: ``session`` made subscription ``details`` (then subscribes to it)."""
        self._describe(details)
        return self.subscribed(session, int(details["id"]))

    def listed(self, details: dict[str, Any], members: Iterable[int]) -> InterestStep:
        """A subscription as ``wamp.subscription.get`` and ``list_subscribers`` describe it now."""
        sub = self._describe(details)
        before = self._counted(sub)
        old = sub.members
        sub.members = set(members)
        lookup = self._ask(sub.members)
        for session in old - sub.members:
            self._forget_if_idle(session)
        return self._step(sub, before, lookup)

    def subscribed(self, session: int, sub_id: int) -> InterestStep:
        """``wamp.subscription.on_subscribe``."""
        sub = self._subs.get(sub_id)
        if sub is None:  # a subscription we never heard created: its listing is still on the way
            return InterestStep()
        before = self._counted(sub)
        sub.members.add(session)
        return self._step(sub, before, self._ask((session,)))

    def unsubscribed(self, session: int, sub_id: int) -> InterestStep:
        """``wamp.subscription.on_unsubscribe`` (also sent for every subscription of a session that left)."""
        sub = self._subs.get(sub_id)
        if sub is None:
            return InterestStep()
        before = self._counted(sub)
        sub.members.discard(session)
        self._forget_if_idle(session)
        return self._step(sub, before)

    def deleted(self, sub_id: int) -> InterestStep:
        """``wamp.subscription.on_delete`` (or ``get`` found it gone): the subscription no longer exists."""
        sub = self._subs.pop(sub_id, None)
        if sub is None:
            return InterestStep()
        before = self._counted(sub)
        sub.members.clear()
        step = self._step(sub, before)
        for session in list(self._bridge):
            self._forget_if_idle(session)
        return step

    def role_known(self, session: int, authrole: str | None) -> InterestStep:
        """``wamp.session.get`` answered ``authrole`` for ``session`` (None: no such session any more)."""
        if self._bridge.get(session, False) is not None or session == self._own:
            return InterestStep()
        subs = [sub for sub in self._subs.values() if session in sub.members]
        before = [self._counted(sub) for sub in subs]
        if authrole is None:
            for sub in subs:
                sub.members.discard(session)
            self._bridge.pop(session, None)
        else:
            self._bridge[session] = authrole == self.bridge_role
        added: list[Interest] = []
        removed: list[Interest] = []
        for sub, was in zip(subs, before, strict=True):
            step = self._step(sub, was)
            added += step.added
            removed += step.removed
        return InterestStep(tuple(added), tuple(removed))

    # -- internals ---------------------------------------------------------------------------

    def _describe(self, details: dict[str, Any]) -> _Subscription:
        sub_id = int(details["id"])
        sub = self._subs.get(sub_id)
        if sub is None:
            sub = self._subs[sub_id] = _Subscription(str(details["uri"]), str(details.get("match") or EXACT))
        return sub

    def _ask(self, sessions: Iterable[int]) -> tuple[int, ...]:
        lookup = []
        for session in sessions:
            if session not in self._bridge:
                self._bridge[session] = None
                lookup.append(session)
        return tuple(lookup)

    def _forget_if_idle(self, session: int) -> None:
        if session != self._own and self._bridge.get(session) is not None:
            if not any(session in sub.members for sub in self._subs.values()):
                del self._bridge[session]

    def _counted(self, sub: _Subscription) -> bool:
        if sub.uri.startswith("wamp."):
            return False
        return any(self._bridge.get(member) is False for member in sub.members)

    def _step(self, sub: _Subscription, before: bool, lookup: tuple[int, ...] = ()) -> InterestStep:
        after = self._counted(sub)
        key = (sub.match, sub.uri)
        if after and not before:
            self._wanted.add(key)
            return InterestStep(added=(key,), lookup=lookup)
        if before and not after:
            self._wanted.discard(key)
            return InterestStep(removed=(key,), lookup=lookup)
        return InterestStep(lookup=lookup)


async def router_role(session: Any, session_id: int) -> str | None:
    """The authrole the router gives ``session_id`` ("" when it names none), None when that session left.

    What the call raises when the bridge's own session went away is left to the caller.
    """
    try:
        info = await session.call("wamp.session.get", session_id)
    except ApplicationError:
        return None
    found = info.get("authrole") if isinstance(info, dict) else None
    return "" if found is None else str(found)
