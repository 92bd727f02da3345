"""The federation's interest: what this node asks producers for, and what other nodes asked it for.

Part of :class:`~pubsubclub.federation.federation.Federation`: the hub's
interest listeners (PSC201/202/203/204 to every producer) and the remote
interest (topics and patterns consumers asked for, for the hub and /stats).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from twisted.internet import defer
from twisted.logger import Logger

from pubsubclub.core.counters import Source
from pubsubclub.core.hub import GAP_TOPIC
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import psc
from pubsubclub.federation.session import (
    LinkState,
)
from pubsubclub.federation.state import FederationState

log = Logger()
#: Longest wait for the linked nodes to confirm our interest (``interest_settled``), in seconds.
INTEREST_SETTLE_TIMEOUT = 5.0


class Interest(FederationState):
    """Interest in both directions (a part of :class:`Federation`)."""

    if TYPE_CHECKING:

        def sync_relay_interest(self) -> None:
            """Relay: tell every producer what it is now asked for (relay.py)."""

        def sync_relay_topics(self, topics: tuple[str, ...]) -> None:
            """Relay: the same, for ``topics`` only (relay.py)."""

    # -- hub listeners -----------------------------------------------------

    def topic_added(self, topic: str) -> None:
        """First local subscriber: ask every producer for the topic."""
        if self.worker_prefix is not None:
            self.sync_relay_topics((topic,))
            return
        if self._producers and (topic != GAP_TOPIC or self.asks_gaps):
            data = psc.encode(psc.Subscribe((topic,)))
            for session in self._producers:
                session.send_raw(data)

    def interest_settled(self, timeout: float = INTEREST_SETTLE_TIMEOUT) -> defer.Deferred[None]:
        """Fires once every producer we are linked to has handled all we sent it so far (our interest).

        One WebSocket round trip per open consumer link; a link that closes
        meanwhile counts as settled (it will send its interest again when it
        comes back), and after ``timeout`` seconds it fires anyway.
        """
        waits = []
        for session in list(self._producers):
            link = self._links.get(session)
            if link is not None and session.state is LinkState.OPEN:
                waits.append(link.transport.round_trip())
        settled: defer.Deferred[None] = defer.gatherResults(waits, consumeErrors=True).addCallback(lambda _: None)
        if waits:
            settled.addTimeout(timeout, self._reactor, onTimeoutCancel=lambda *_: None)
        return settled

    def topic_removed(self, topic: str) -> None:
        """Last local subscriber gone: tell every producer."""
        if self.worker_prefix is not None:
            self.sync_relay_topics((topic,))
            return
        if self._producers and (topic != GAP_TOPIC or self.asks_gaps):
            data = psc.encode(psc.Unsubscribe(topic))
            for session in self._producers:
                session.send_raw(data)

    def pattern_added(self, pattern: Pattern) -> None:
        """A pattern's first local holder: PSC203 to every 0.5 producer (within the per-peer limit)."""
        if len(self._announced) >= self.limits.max_patterns_per_peer:
            self._held[pattern] = None
            self.hub.metrics.error(Source.PSC, "patterns_over_limit")
            log.warn(
                "not announcing pattern {pattern!r} to peers: {limit} patterns already announced"
                " (max-patterns-per-peer); its subscribers get only what this node publishes",
                pattern=pattern.pattern,
                limit=self.limits.max_patterns_per_peer,
            )
            return
        self._announce(pattern, psc.SubscribePattern(pattern))

    def pattern_removed(self, pattern: Pattern) -> None:
        """A pattern's last local holder went: PSC204 to every 0.5 producer; announce one held back."""
        if pattern in self._held:
            del self._held[pattern]
            return
        if pattern not in self._announced:
            return
        del self._announced[pattern]
        self._send_to_pattern_producers(psc.encode(psc.UnsubscribePattern(pattern)))
        if self._held:
            waiting = next(iter(self._held))
            del self._held[waiting]
            self._announce(waiting, psc.SubscribePattern(waiting))

    def _announce(self, pattern: Pattern, message: psc.SubscribePattern) -> None:
        self._announced[pattern] = None
        self._send_to_pattern_producers(psc.encode(message))

    def _send_to_pattern_producers(self, data: bytes) -> None:
        if self.worker_prefix is not None:
            self.sync_relay_interest()  # the relay tells each producer its own set (relay.py)
            return
        for session in self._producers:
            if session.with_patterns:
                session.send_raw(data)

    # -- other nodes' interest ---------------------------------------------

    def add_remote_topics_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever :meth:`remote_topics` or :meth:`remote_pattern_set` may have changed."""
        self._remote_topics_listeners.append(listener)

    def remote_topics(self) -> set[str]:
        """Every topic some other node asked us for (PSC201/PSC103), on live links or kept replay streams."""
        topics = set(self._by_topic)
        if self.outbox is not None:
            topics |= self.outbox.topics()
        return topics

    def remote_pattern_set(self) -> set[Pattern]:
        """Every pattern some other node asked us for (PSC 0.5; see :meth:`remote_patterns` for /stats)."""
        return set() if self.outbox is None else set(self.outbox.pattern_interest())

    def _remote_topics_changed(self) -> None:
        for listener in self._remote_topics_listeners:
            try:
                listener()
            except Exception:
                log.failure("remote topics listener {listener!r} raised; isolated", listener=listener)

    def remote_interest(self) -> dict[str, list[str]]:
        """topic -> the peers (node ids, else URLs) that asked us for it."""
        interest = {
            topic: sorted(s.peer_node or s.peer for s in sessions) for topic, sessions in self._by_topic.items()
        }
        if self.outbox is not None:
            for topic, consumers in self.outbox.interest().items():
                interest[topic] = sorted(interest.get(topic, []) + consumers)
        return interest

    def remote_patterns(self) -> dict[str, list[str]]:
        """``"<match>:<pattern>"`` -> the peers that asked us for it (0.5)."""
        if self.outbox is None:
            return {}
        return {f"{p.match}:{p.pattern}": peers for p, peers in self.outbox.pattern_interest().items()}
