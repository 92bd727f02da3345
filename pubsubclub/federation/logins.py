"""Failed logins node-wide: the workers of a node share one lockout table (docs/security.md, "Failed logins").

Each process of a node with ``--workers N`` keeps its own
:class:`~pubsubclub.core.loginthrottle.LoginThrottle` (a login never waits
for another process), and this part makes them one table over the PSC
links the node's workers already hold with their primary
(federation/psc_logins.py: PSC601, PSC602):

- a failure seen by a process: PSC601 to its one peer of the node (a
  worker: the primary; the primary: every worker), applied there as if it
  happened there; the primary relays a worker's to the other workers (split
  horizon: never back). So every process counts every failure of the node:
  one count per source, one lockout, after one or two Unix-socket hops.
- a link of the node coming up (a worker or the primary (re)started, or
  relinked): each side sends its whole table (PSC602, paced like retained
  events), merged by the larger count and the later times, and the primary
  relays the rows that told it something new to the other workers. A process
  that restarts so gets the node's lockouts back within a moment of linking.
- while a process is cut off from the primary it keeps throttling with what
  it holds ("fail to local": not open, not closed; docs/security.md says why).

On only in the processes of a node with workers (:attr:`ClusterLogins.enabled`);
a plain node neither sends nor accepts these messages (the link session
refuses them on any link that is not between two processes of one node).
Sans-IO apart from the injected ``call_later`` and ``queued`` callables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.federation import psc_logins
from pubsubclub.federation.psc_logins import Row
from pubsubclub.federation.session import LinkSession, LinkState, Role

#: Bytes of PSC602 one link-up sends per reactor turn before it yields.
TABLE_SLICE_BYTES = 256 * 1024
#: Seconds to wait before sending more of a table while the link's queue is over half its cap.
TABLE_WAIT = 0.05


class ClusterLogins:
    """This process's side of the node's shared failed-login table; see the module's docstring."""

    def __init__(
        self,
        call_later: Callable[[float, Callable[[], None]], Any],
        queued: Callable[[LinkSession], int],
        queue_cap: Callable[[LinkSession], int],
    ) -> None:
        self._call_later = call_later
        self._queued = queued
        self._queue_cap = queue_cap
        self.throttle: LoginThrottle | None = None
        #: A process of a node with workers: share the table with the node's other processes.
        self.enabled = False
        #: The primary of a node with workers: relays a worker's failures to the other workers.
        self.relaying = False
        #: Open links to the node's other processes where we are the producer: failures go there.
        self._consumers: dict[LinkSession, None] = {}
        #: Counters for /stats.
        self.counts = {"sent": 0, "received": 0, "rows_sent": 0, "rows_merged": 0}

    def attach(self, throttle: LoginThrottle) -> None:
        """Share ``throttle``'s failures with the node's other processes, and take theirs."""
        self.throttle = throttle
        throttle.listener = self.failed_here
        for session in self._consumers:
            self._send_table(session, throttle.rows())

    def link_open(self, session: LinkSession) -> None:
        """A link to another process of the node is open: a producer sends its whole table on it."""
        if self.enabled and session.same_node and session.role is Role.PRODUCER:
            self._consumers[session] = None
            if self.throttle is not None:
                self._send_table(session, self.throttle.rows())

    def link_closed(self, session: LinkSession) -> None:
        """A link closed: no more failures go there (a table being sent stops)."""
        self._consumers.pop(session, None)

    def failed_here(self, key: str) -> None:
        """A wrong credential from ``key`` here: PSC601 to the node's other processes."""
        if self._consumers:
            self._send_failure(psc_logins.FailedLogin(key), None)

    def receive(self, session: LinkSession, msg: psc_logins.FailedLogin | psc_logins.LoginTable) -> None:
        """A PSC601 or PSC602 from another process of the node: applied, and relayed by the primary."""
        throttle = self.throttle
        if throttle is None:
            return
        self.counts["received"] += 1
        if isinstance(msg, psc_logins.FailedLogin):
            throttle.replicated(msg.source)
            if self.relaying:
                self._send_failure(msg, session.peer_node)
            return
        news = [row for row in msg.rows if throttle.merge(*row)]
        self.counts["rows_merged"] += len(news)
        if news and self.relaying:
            for target in self._consumers:
                if target.peer_node != session.peer_node:
                    self._send_table(target, iter(news))

    def _send_failure(self, msg: psc_logins.FailedLogin, source: str | None) -> None:
        """PSC601 once to each other process of the node but ``source`` (two links to one: a superseded one)."""
        data = None
        done: set[str | None] = set() if source is None else {source}
        for target in self._consumers:
            if target.peer_node not in done:
                done.add(target.peer_node)
                data = data or msg.encode()
                target.send_raw(data)
                self.counts["sent"] += 1

    def _send_table(self, session: LinkSession, rows: Iterator[Row]) -> None:
        """Send ``rows`` on ``session`` as PSC602s, in slices, waiting while its queue is over half its cap."""
        if session not in self._consumers or session.state is not LinkState.OPEN:
            return
        if self._queued(session) > self._queue_cap(session) // 2:
            self._call_later(TABLE_WAIT, lambda: self._send_table(session, rows))
            return
        sent = 0
        while True:
            chunk = []
            for row in rows:
                chunk.append(row)
                if len(chunk) == psc_logins.MAX_ROWS:
                    break
            if not chunk:
                return
            data = psc_logins.LoginTable(tuple(chunk)).encode()
            session.send_raw(data)
            self.counts["rows_sent"] += len(chunk)
            sent += len(data)
            if len(chunk) < psc_logins.MAX_ROWS:
                return
            if sent >= TABLE_SLICE_BYTES:
                self._call_later(0, lambda: self._send_table(session, rows))
                return

    def stats(self) -> dict[str, int]:
        """Messages and rows exchanged with the node's other processes."""
        return {**self.counts, "links": len(self._consumers)}
