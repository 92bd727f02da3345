"""Retained events across the cluster over PSC 0.8 links (docs/protocol.md, "Extension: version 0.8").

Every node keeps a replica of the cluster's retained events
(:class:`~pubsubclub.core.retained.RetainedStore`, the WAMP router's), so a
``get_retained`` SUBSCRIBE is answered from the subscriber's own node with no
round trip, whatever node the event was published on and whether or not
this node had subscribers for the topic then. The price is the stated
exception to "a node receives only the topics it has subscribers for":
retained events (not live ones) go to every 0.8 node.

- A local publish that retains an event: PSC501 to every open 0.8 link
  where this node is the producer (one hop, as PSC301; a node never
  forwards a PSC501 it received).
- A 0.8 link opens: the producer sends its whole table (its own and its
  replicas of other nodes' events), paced so the link's queue never holds
  more than half its cap of them; a node that starts or restarts so gets
  the running cluster's table from each peer.
- A PSC501 received: merged by last-writer-wins
  (:meth:`RetainedStore.merge`); past this node's caps it is dropped and
  counted (``pubsubclub_errors_total{component="psc",reason="retained_cap"}``).

A node with workers (docs/architecture.md, "Workers") is one node here too:
its primary *relays* (:attr:`ClusterRetained.relaying`) a PSC501 that changed
its table on, with split horizon (one from a worker: to the other nodes and
the other workers; one from another node: to the workers), so every worker
and every node holds every retained event; a link-up table is already the
whole table, replicas included.

Sans-IO apart from the injected ``call_later`` and ``queued`` callables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from twisted.logger import Logger

from pubsubclub.core.counters import Source
from pubsubclub.core.metrics import Metrics
from pubsubclub.core.retained import RetainedEvent, RetainedStore
from pubsubclub.federation import psc_retain
from pubsubclub.federation.session import LinkSession, LinkState, Role

log = Logger()

#: Bytes of PSC501 one link-up sends per reactor turn before it yields.
TABLE_SLICE_BYTES = 256 * 1024
#: Seconds to wait before sending more of a table while the link's queue is over half its cap.
TABLE_WAIT = 0.05


class ClusterRetained:
    """This node's side of retained events on all its 0.8 links; see the module's docstring."""

    def __init__(
        self,
        metrics: Metrics,
        call_later: Callable[[float, Callable[[], None]], Any],
        queued: Callable[[LinkSession], int],
        queue_cap: Callable[[LinkSession], int],
    ) -> None:
        self.metrics = metrics
        self._call_later = call_later
        self._queued = queued
        self._queue_cap = queue_cap
        self.store: RetainedStore | None = None
        #: Open 0.8 links where we are the producer: retained events go there.
        self._consumers: dict[LinkSession, None] = {}
        #: The primary of a node with workers: peers' events go on to the others (relay.py).
        self.relaying = False

    def attach(self, store: RetainedStore) -> None:
        """Share ``store`` with the cluster: its local events go out, peers' events come in."""
        self.store = store
        store.add_listener(self.retained)
        for session in self._consumers:
            self._send_table(session, store.events())

    def stats(self) -> dict[str, int]:
        """Retained topics held, and open links carrying them."""
        return {"retained_topics": 0 if self.store is None else len(self.store), "retained_links": len(self._consumers)}

    def link_open(self, session: LinkSession) -> None:
        """A 0.8 link is open: a producer sends its whole table on it."""
        if session.role is Role.PRODUCER:
            self._consumers[session] = None
            if self.store is not None:
                self._send_table(session, self.store.events())

    def link_closed(self, session: LinkSession) -> None:
        """A link closed: no more retained events go there (a table being sent stops)."""
        self._consumers.pop(session, None)

    def _send_table(self, session: LinkSession, events: Iterator[RetainedEvent]) -> None:
        """Send ``events`` on ``session`` in slices, waiting while its queue is over half its cap."""
        if session not in self._consumers or session.state is not LinkState.OPEN:
            return
        if self._queued(session) > self._queue_cap(session) // 2:
            self._call_later(TABLE_WAIT, lambda: self._send_table(session, events))
            return
        sent = 0
        for event in events:
            data = psc_retain.Retained(event).encode()
            session.send_raw(data)
            sent += len(data)
            if sent >= TABLE_SLICE_BYTES:
                self._call_later(0, lambda: self._send_table(session, events))
                return

    def retained(self, event: RetainedEvent) -> None:
        """A local publish retained ``event``: PSC501 to every 0.8 node."""
        if self._consumers:
            data = psc_retain.Retained(event).encode()
            for session in self._consumers:
                session.send_raw(data)

    def receive(self, session: LinkSession, msg: psc_retain.Retained) -> None:
        """A PSC501 from a producer: merged by last-writer-wins, dropped and counted past the caps."""
        store = self.store
        if store is None:
            return  # no WAMP here: nobody can ask for retained events
        merged = store.merge(msg.event)
        if merged and self.relaying:
            data = None
            for target in self._consumers:
                if session.peer_node == target.peer_node or not (target.worker or session.worker):
                    continue  # split horizon: never back to its worker, never from one node to another
                data = data or psc_retain.Retained(msg.event).encode()
                target.send_raw(data)
        if merged is None:
            self.metrics.error(Source.PSC, "retained_cap")
            log.debug(
                "dropped the retained event of {topic} from {peer}: over this node's retained caps",
                topic=msg.event.topic,
                peer=session.peer_node or session.peer,
            )
