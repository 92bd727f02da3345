"""Retained events: the node's table of the last retained event per hub topic (sans-IO).

WAMP's event retention (a PUBLISH with ``retain: true``; a SUBSCRIBE with
``get_retained: true`` gets each matching topic's retained event right after
SUBSCRIBED). Every node holds a replica of the cluster's table, keyed by hub
topic (so realms stay apart); PSC 0.8 links carry it (federation/retained.py,
docs/protocol.md "Extension: version 0.8").

The merge rule is last-writer-wins by :attr:`RetainedEvent.stamp`,
``(publish time at the origin, origin node id, message id)``: every node
compares the same triples, so all of them keep the same winner whatever order
the events reach them in. An event whose stamp is not greater than the one
held is ignored (so a table sent twice changes nothing).

Bounded by a number of topics and a number of payload bytes; past either a
new event is refused (:meth:`RetainedStore.retain` returns why: the WAMP
broker answers the publisher ERROR) or, from a peer, dropped and counted by
the caller. A retained event is replaced, never cleared (docs/protocol.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.core import binaryjson
from pubsubclub.core.patterns import Pattern


def payload_bytes(payload: Any) -> int:
    """What a retained payload counts against the byte cap: its JSON size (bytes in the 0.6 carrier form).

    The same number on every node for the same event, so every replica
    reaches the cap at the same event.
    """
    try:
        return len(orjson.dumps(payload))
    except TypeError:
        return len(orjson.dumps(binaryjson.to_json(payload)))


@dataclass(frozen=True, slots=True)
class RetainedEvent:
    """The retained event of one hub topic, as published at its origin."""

    topic: str
    payload: Any
    #: ``payload`` is a WAMP ``{"args", "kwargs"}`` wrapper (as Envelope.wamp_wrapped).
    wamp_wrapped: bool
    #: The WAMP routing object (publish options, a disclosed publisher), or None.
    options: dict[str, Any] | None
    published_at: float
    origin: str
    message_id: str
    #: Bytes the event counts against ``max_bytes`` (:func:`payload_bytes` of its payload).
    size: int

    @property
    def stamp(self) -> tuple[float, str, str]:
        """The last-writer-wins key: the greater stamp is the topic's retained event on every node."""
        return (self.published_at, self.origin, self.message_id)


class RetainedStore:
    """The last retained event of each hub topic, bounded in topics and bytes."""

    def __init__(self, max_topics: int = 10_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_topics <= 0 or max_bytes <= 0:
            raise ValueError("RetainedStore needs positive max_topics and max_bytes")
        #: ``[wamp] max-retained-topics``: topics with a retained event, the whole cluster's replica.
        self.max_topics = max_topics
        #: ``[wamp] max-retained-bytes``: their payload bytes together.
        self.max_bytes = max_bytes
        self._events: dict[str, RetainedEvent] = {}
        self._bytes = 0
        #: Called with each event retained by a local publish (the federation sends it to every 0.8 peer).
        self._listeners: list[Callable[[RetainedEvent], None]] = []

    def __len__(self) -> int:
        return len(self._events)

    @property
    def bytes(self) -> int:
        """Payload bytes held."""
        return self._bytes

    def add_listener(self, listener: Callable[[RetainedEvent], None]) -> None:
        """Call ``listener`` with every event a local publish retains."""
        self._listeners.append(listener)

    def problem(self, event: RetainedEvent) -> tuple[str, str, int] | None:
        """Why ``event`` cannot be held (``(text, setting, limit)``), or None when it fits."""
        held = self._events.get(event.topic)
        if held is None and len(self._events) >= self.max_topics:
            text = f"{len(self._events)} topics have a retained event, the limit is {self.max_topics}"
            return text, "wamp.max-retained-topics", self.max_topics
        grown = self._bytes + event.size - (0 if held is None else held.size)
        if grown > self.max_bytes:
            text = f"retained events would hold {grown} bytes, the limit is {self.max_bytes}"
            return text, "wamp.max-retained-bytes", self.max_bytes
        return None

    def retain(self, event: RetainedEvent) -> tuple[str, str, int] | None:
        """A local publish retains ``event``: None when done (listeners told), else why it was refused."""
        problem = self.problem(event)
        if problem is not None:
            return problem
        if self._put(event):
            for listener in self._listeners:
                listener(event)
        return None

    def merge(self, event: RetainedEvent) -> bool | None:
        """An event from a peer: True if it is now the topic's, False if an older one, None if over a cap."""
        held = self._events.get(event.topic)
        if held is not None and event.stamp <= held.stamp:
            return False
        if self.problem(event) is not None:
            return None
        return self._put(event)

    def _put(self, event: RetainedEvent) -> bool:
        held = self._events.get(event.topic)
        if held is not None:
            if event.stamp <= held.stamp:
                return False  # an older event (a clock behind the winner's): every node keeps the winner
            self._bytes -= held.size
        self._events[event.topic] = event
        self._bytes += event.size
        return True

    def get(self, topic: str) -> RetainedEvent | None:
        """The retained event of ``topic``, if any."""
        return self._events.get(topic)

    def matching(self, pattern: Pattern) -> list[RetainedEvent]:
        """The retained events of every topic ``pattern`` matches, in topic order (a scan: subscribe path only)."""
        return sorted((e for e in self._events.values() if pattern.matches(e.topic)), key=lambda e: e.topic)

    def events(self) -> Iterator[RetainedEvent]:
        """Every retained event (a snapshot: safe while the table changes)."""
        return iter(list(self._events.values()))
