"""The federation: every PSC link of one node, and the hub glue.

One :class:`Federation` per node. It listens for links (``resource()``),
dials configured servers (``add_server`` / ``remove_server``, each a Twisted
``ClientService``), tells producers about the hub's interest changes and
forwards local publishes to the consumers that asked for their topic.
Messages received from a producer are delivered locally only, never forwarded
again: one hop over a full mesh, so no loops and no duplicates.

The federation is one state (servers, links, interest, forwarding, replay
hooks) split by job into parts, one module each: ``servers`` (dialling,
retries, peer learning), ``interest`` (ours to producers, consumers' to us),
``forwarding`` (local publishes out) and ``receiving`` (remote publishes in);
this module builds it and runs the links' lifecycle. The link protocol
(``session``) and transport (``transport``) live apart.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from autobahn.twisted.resource import WebSocketResource
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.internet import defer
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from pubsubclub.core.counters import FederationEvent, Source
from pubsubclub.core.hub import GAP_TOPIC, Hub
from pubsubclub.core.metrics import Metrics
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import psc, psc_logins, psc_retain
from pubsubclub.federation.auth import (
    AUTH_HEADER,
    DIALLED_HEADER,
    AuthRefused,
    Challenge,
    LinkAuth,
    Refusal,
)
from pubsubclub.federation.forwarding import (  # noqa: F401 (re-exported: the federation's limits, by their old path)
    MAX_HELD_COUNTS,
    MAX_REENCODING_GROWTH,
    PSC_OVERHEAD_ALLOWANCE,
    SEQ_ALLOWANCE,
    Forwarding,
)
from pubsubclub.federation.interest import INTEREST_SETTLE_TIMEOUT, Interest  # noqa: F401 (re-exported)
from pubsubclub.federation.linkserver import PSCServerFactory
from pubsubclub.federation.logins import ClusterLogins
from pubsubclub.federation.realmcheck import PLAIN_REALM_HEADER, REALM_CONFLICT, realm_conflict, realm_header
from pubsubclub.federation.receiving import Receiving
from pubsubclub.federation.relay import Relay
from pubsubclub.federation.replay import Inbox, Outbox
from pubsubclub.federation.retained import ClusterRetained
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.federation.rpc import ClusterRPC
from pubsubclub.federation.servers import (  # noqa: F401 (re-exported)
    LEARNED_FORGET_AFTER,
    MAX_LEARNED_PER_LINK,
    MAX_LEARNED_SERVERS,
    MAX_LEARNED_URL_LENGTH,
    Dialling,
    Link,
    _Server,
    endpoint_for_url,
)
from pubsubclub.federation.session import (
    CLOSE_DUPLICATE,
    LinkSession,
    LinkState,
    Role,
)
from pubsubclub.federation.settings import FederationSettings
from pubsubclub.federation.transport import NODE_HEADER
from pubsubclub.net.ratelog import RateLimitedLog
from pubsubclub.net.websocket import TakeoverResource

log = Logger()


class Federation(Dialling, Interest, Forwarding, Receiving, Relay):
    """All PSC links of one node (both roles), driven by the hub and discovery."""

    def __init__(
        self,
        hub: Hub,
        settings: FederationSettings | None = None,
        *,
        reactor: Any = None,
        retry: RetryPolicy = RetryPolicy(),
        rand: Callable[[], float] = random.random,
        endpoint_factory: Callable[[Any, str], IStreamClientEndpoint] = endpoint_for_url,
        metrics: Metrics | None = None,
        **options: Any,
    ) -> None:
        """A federation around ``hub``: ``settings``, with any of its fields overridden by ``options``."""
        settings = replace(settings or FederationSettings(), **options)
        #: What this federation was configured with.
        self.settings = settings
        listen_role, ping_interval, versions, limits = (
            settings.listen_role,
            settings.ping_interval,
            settings.versions,
            settings.limits,
        )
        advertise_url, secret, replay, max_link_queue = (
            settings.advertise_url,
            settings.secret,
            settings.replay,
            settings.max_link_queue,
        )
        learn_peers, batch, patterns = settings.learn_peers, settings.batch, settings.patterns
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.hub = hub
        #: The node's counters (node/node.py hands them down); by default the hub's, which are the same.
        self.metrics = metrics if metrics is not None else hub.metrics
        self.node_id = hub.node_id
        self.listen_role = listen_role
        self.versions = versions
        self.limits = limits
        self.advertise_url = advertise_url
        self._reactor = reactor
        self._ping_interval = ping_interval
        #: Bytes a link may have written but not yet sent to its peer; past it the link is dropped.
        self.max_link_queue = max_link_queue
        #: Tell peers whom we know and dial whom they know (docs/protocol.md, "Peer learning").
        self.learn_peers = learn_peers
        #: The PSC URL other nodes should dial to reach us, told to peers; None: not told (not dialable).
        self.announce_url: str | None = advertise_url
        self._retry = retry
        self._rand = rand
        self._endpoint_factory = endpoint_factory
        #: Proves and checks the cluster secret on every link; None: links are not authenticated.
        self.auth = (
            None
            if secret is None
            else LinkAuth(
                secret,
                proof_timeout=settings.proof_timeout,
                max_pending=settings.max_pending_proofs,
                max_pending_per_source=settings.max_pending_proofs_per_source,
            )
        )
        #: Refused link attempts are logged a few per kind and interval, the rest counted (a flood is one line).
        self.refusal_log = RateLimitedLog(log, reactor)
        #: Our plain WAMP realm, told in every handshake; a listener refuses a dialler naming another.
        self.plain_realm = settings.plain_realm
        #: PSC 0.3 (replay after short outages, federation/replay.py): offered when ``replay`` is given.
        self.outbox: Outbox | None = None
        self.inbox: Inbox | None = None
        if replay is not None:
            self.outbox = Outbox(replay, reactor.seconds, boot=os.urandom(6).hex(), metrics=self.metrics)
            self.inbox = Inbox(replay.max_positions, metrics=self.metrics)
            if psc.V0_3 not in versions:
                self.versions = (*versions, psc.V0_3)
            if batch and psc.V0_4 not in self.versions:
                self.versions = (*self.versions, psc.V0_4)
            if batch and patterns and psc.V0_5 not in self.versions:
                self.versions = (*self.versions, psc.V0_5)
            # Binary payloads (0.6) come with 0.5: a node that offers 0.5 can carry them.
            if psc.V0_5 in self.versions and psc.V0_6 not in self.versions:
                self.versions = (*self.versions, psc.V0_6)
            # RPC across the cluster (0.7, federation/rpc.py) comes with 0.6.
            if psc.V0_6 in self.versions and psc.V0_7 not in self.versions:
                self.versions = (*self.versions, psc.V0_7)
            # Retained events across the cluster (0.8, federation/retained.py) come with 0.7.
            if psc.V0_7 in self.versions and psc.V0_8 not in self.versions:
                self.versions = (*self.versions, psc.V0_8)
        #: RPC over 0.7 links (federation/rpc.py); the node attaches its WAMP dealer.
        self.rpc = ClusterRPC(self.node_id, limits)
        self.rpc.round_trips = self.round_trips
        #: Retained events over 0.8 links (federation/retained.py); the node attaches the WAMP router's table.
        self.retained = ClusterRetained(self.metrics, reactor.callLater, self._link_queued, self.queue_cap)
        #: Failed logins shared by a node's workers (federation/logins.py); the node attaches its throttle.
        self.logins = ClusterLogins(reactor.callLater, self._link_queued, self.queue_cap)
        #: A worker other than the primary: its primary's node id (failed logins are shared with it alone).
        self.primary_node: str | None = None
        self._servers: dict[str, _Server] = {}
        #: Every live link, by its session.
        self._links: dict[LinkSession, Link] = {}
        #: Open links on which we are the consumer (the peers are producers).
        self._producers: dict[LinkSession, None] = {}
        #: topic -> open links whose consumer asked for it (we are the producer).
        self._by_topic: dict[str, dict[LinkSession, None]] = {}
        #: Called (no arguments) after other nodes' interest in our topics may have changed.
        self._remote_topics_listeners: list[Callable[[], None]] = []
        #: Local patterns announced to 0.5 producers (at most ``limits.max_patterns_per_peer``) ...
        self._announced: dict[Pattern, None] = {}
        #: ... and those held back past that limit, announced as announced ones go.
        self._held: dict[Pattern, None] = {}
        #: Forwarded PSC301s not yet in the metrics: (topic, link) -> [messages, bytes], and how many in all.
        self._forwarded: dict[tuple[str, Any], list[int]] = {}
        self._forwarded_n = 0
        self.worker_prefix = None
        self.learn_from_peers = True
        self.asks_gaps = False
        self.unlisted = set()
        self._relay_sent = {}
        self._relay_sent_patterns = {}
        self._relay_hint = None
        self.metrics.add_settler(self._settle)
        self._received_counts = {}
        self.metrics.add_settler(self._settle_received)
        hub.add_interest_listener(self)
        hub.add_pattern_listener(self)
        hub.add_publish_listener(self)
        # Publishes whose PSC301 might not fit a link are measured before the front-end acknowledges them.
        unchecked = (limits.max_link_frame - PSC_OVERHEAD_ALLOWANCE) // MAX_REENCODING_GROWTH
        hub.set_forward_check(self.forward_problem, unchecked_below=max(unchecked, 0))

    @property
    def stats(self) -> dict[str, int]:
        """The federation's event counters (a view of the hub's metrics)."""
        return self.metrics.view("federation")

    # -- listening ---------------------------------------------------------

    def server_factory(self) -> PSCServerFactory:
        """The WebSocket factory accepting links (serve it at ``/psc``)."""
        return PSCServerFactory(self, self._reactor, self._ping_interval)

    def resource(self) -> WebSocketResource:
        """A twisted.web resource accepting links."""
        return TakeoverResource(self.server_factory())

    def check_request(
        self, request: ConnectionRequest, source: str, on_evict: Callable[[], None]
    ) -> tuple[dict[str, str], Challenge | None]:
        """Refuse a link at the WebSocket handshake (raise ConnectionDeny), else the answer headers.

        With a cluster secret the dialler must offer a nonce (HTTP 401 when
        it sends none, 403 when malformed); the answer proves the secret to
        the dialler, says whether it dialled our advertised URL (the route),
        and challenges it. The returned challenge is settled by the dialler's
        first frame (:meth:`check_proof`), or evicted by newer ones from
        ``source`` past the pending caps (``on_evict`` closes the connection).
        Without a secret, no challenge. A dialler whose plain WAMP realm is
        not ours is refused first (HTTP 409, federation/realmcheck.py).
        """
        conflict = realm_conflict(self.plain_realm, request.headers.get(PLAIN_REALM_HEADER))
        if conflict is not None:
            node = request.headers.get(NODE_HEADER) or str(request.peer)
            self.metrics.event(FederationEvent.LINKS_REFUSED)
            self.hub.metrics.error(Source.PSC, "plain_realm_conflict")
            self.refusal_log.warn("plain_realm", "PSC link from {node} refused: {why}", node=node[:80], why=conflict)
            raise ConnectionDeny(REALM_CONFLICT, conflict)
        told = realm_header(self.plain_realm)
        if self.auth is None:
            return told, None
        node = request.headers.get(NODE_HEADER) or ""
        own = () if self.announce_url is None else (self.announce_url,)
        try:
            challenge = self.auth.challenge(
                request.headers.get(AUTH_HEADER),
                node,
                self.node_id,
                dialled_url=request.headers.get(DIALLED_HEADER),
                own_urls=own,
                source=source,
                on_evict=on_evict,
            )
        except AuthRefused as e:
            self.auth_refused(str(request.peer), node, e.refusal, f"HTTP {e.refusal.http_status}")
            raise ConnectionDeny(e.refusal.http_status, e.refusal.value) from None
        return {AUTH_HEADER: challenge.header(), **told}, challenge

    def client_headers(self, url: str) -> dict[str, str]:
        """Extra handshake headers when dialling ``url``: peer learning's, and our plain realm."""
        return {**super().client_headers(url), **realm_header(self.plain_realm)}

    def auth_refused(self, peer: str, node: str | None, refusal: Refusal, how: str) -> None:
        """Count a link refused for not proving the cluster secret (``how``: HTTP status or close code); log it.

        Logged a few per kind of refusal and interval, the rest as one count
        (:class:`~pubsubclub.net.ratelog.RateLimitedLog`): a flood of
        never-proving connections is a handful of lines, not one each.
        """
        self.metrics.event(FederationEvent.AUTH_REFUSED)
        if refusal is Refusal.GONE:
            self.refusal_log.info(
                "PSC links ended before proving the cluster secret",
                "PSC link from {peer} (node {node}) ended before proving the cluster secret",
                peer=peer,
                node=(node or "")[:128] or None,
            )
            return
        self.refusal_log.warn(
            f"refused PSC links ({refusal.value})",
            "refused PSC link from {peer} (node {node}): {how}, {reason}",
            peer=peer,
            node=(node or "")[:128] or None,
            how=how,
            reason=refusal.value,
        )

    def stop(self) -> defer.Deferred[Any]:
        """Close every link with a reason and stop dialling."""
        self.refusal_log.flush()
        for link in list(self._links.values()):
            # 1000, not 1001 "going away": Autobahn's sendClose only accepts 1000 and 3000-4999.
            link.close(1000, "node shutting down")
        stopping = [defer.maybeDeferred(s.service.stopService) for s in self._servers.values()]
        self._servers.clear()
        return defer.DeferredList(stopping)

    # -- link lifecycle (called by the transport) --------------------------

    def link_started(self, session: LinkSession, transport: Any, dialled: str | None) -> None:
        """A transport opened and its session exists; ``dialled``: the server URL it was dialled for."""
        server = None if dialled is None else self._servers.get(dialled)
        link = self._links[session] = Link(session, transport, server)
        if server is not None:
            server.link = link

    def link_open(self, session: LinkSession) -> None:
        """Handshake done: the consumer sends its whole interest in one PSC201."""
        dialled = self._links.get(session)
        if dialled is not None and dialled.server is not None and session.peer_node is not None:
            dialled.server.node = session.peer_node  # the meta API names a server down by it (relay.py)
        if self.worker_prefix is not None:
            link = self._links.get(session)
            if not self.mark_worker(session, None if link is None else link.transport):
                return
            session.same_node = session.worker
        elif self.primary_node is not None:
            session.same_node = session.peer_node == self.primary_node
        if session.role is Role.CONSUMER:
            existing = None
            if session.peer_node is not None:
                existing = next((other for other in self._producers if other.peer_node == session.peer_node), None)
            if existing is not None and session.direct and not existing.direct:
                # Only a direct link (the URL the node advertises, under both MACs) displaces
                # one dialled elsewhere: an alias, a load balancer, or a relay.
                log.info(
                    "direct link to node {node} via {peer}; closing the indirect one via {other}",
                    node=session.peer_node,
                    peer=session.peer,
                    other=existing.peer,
                )
                self.metrics.disconnect(Source.PSC, "superseded")
                self._links[existing].close(CLOSE_DUPLICATE, "superseded by a direct link to the same node")
                existing = None
            if existing is not None:
                log.warn(
                    "duplicate link to node {node} via {peer}; closing it", node=session.peer_node, peer=session.peer
                )
                self.metrics.event(FederationEvent.LINKS_REFUSED)
                duplicate = self._links[session]
                duplicate.close(CLOSE_DUPLICATE, f"already linked to node {session.peer_node}")
                server = duplicate.server
                if server is not None and server.learned:
                    # Another URL of a node we already dial: do not keep redialling it.
                    self._reactor.callLater(0, self._forget_learned, server)
                return
            self._producers[session] = None
            if self.worker_prefix is None:
                # Gap reports stay local (a worker asks its primary for the primary's).
                topics = [topic for topic in self.hub.topics() if topic != GAP_TOPIC or self.asks_gaps]
            else:
                topics = self.relay_topics(session)
            if session.with_replay and self.inbox is not None:
                epoch, seq = self.inbox.position(session.peer_node or session.peer)
                if not session.with_patterns:
                    patterns = None
                elif self.worker_prefix is None:
                    patterns = tuple(self._announced)
                else:
                    patterns = self.relay_patterns(session)
                session.send(psc.Resume(epoch, seq, tuple(topics), patterns))
            elif topics:
                session.send(psc.Subscribe(tuple(topics)))
        link = self._links.get(session)
        if link is not None:
            if link.server is not None:
                link.server.failures = 0
                link.server.down_since = None
            self._learn(link.transport.heard)
        if session.with_rpc:
            self.rpc.link_open(session)
        if session.with_retained:
            self.retained.link_open(session)
        if session.same_node and session.with_rpc:
            self.logins.link_open(session)
        self.metrics.event(FederationEvent.LINKS_OPENED)
        log.info(
            "PSC link up: {role} of {peer} (node {node}), version {version}",
            role=session.role.value,
            peer=session.peer,
            node=session.peer_node,
            version=session.version,
        )

    def link_closed(self, session: LinkSession) -> None:
        """The transport closed (or we are closing it)."""
        link = self._links.pop(session, None)
        server = None if link is None else link.server
        if server is not None and server.link is link:
            server.link = None
            if server.down_since is None:
                server.down_since = self._reactor.seconds()
        self._producers.pop(session, None)
        self.rpc.link_closed(session)
        self.retained.link_closed(session)
        self.logins.link_closed(session)
        if self.outbox is not None:
            self.outbox.detach(session)
        for topic in session.topics:
            sessions = self._by_topic.get(topic)
            if sessions is not None:
                sessions.pop(session, None)
                if not sessions:
                    del self._by_topic[topic]
        self._remote_topics_changed()

    def link_subscribed(self, session: LinkSession, topics: tuple[str, ...]) -> None:
        """A consumer asked us (its producer) for ``topics``."""
        if not session.topics_heard:
            session.topics_heard = True
            self._supersede_ghosts(session)
        if session.with_replay and self.outbox is not None:
            self.outbox.subscribe(session, topics)
        else:
            for topic in topics:
                self._by_topic.setdefault(topic, {})[session] = None
        peer = session.peer_node or session.peer
        for topic in topics:
            self.hub.remote_subscribed(topic, peer)
        self._relay_hint = topics  # the relay then looks at these topics only (relay.py)
        self._remote_topics_changed()

    def _supersede_ghosts(self, session: LinkSession) -> None:
        """Close older links accepted from the node that just spoke on ``session`` in the same role.

        A node dials each URL once; when it talks on a new link, an older link
        it dialled in to us is dead from its side (a partition, a freeze, a
        restart) even though our TCP has not noticed. Waiting for its first
        interest message, not the handshake, matters: a dialler that finds it
        has two links to us (two URLs of one node) closes the newer one before
        sending anything on it, so the two sides never close each other's keeper.
        """
        link = self._links.get(session)
        if session.peer_node is None or link is None or link.server is not None:
            return
        for other, other_link in list(self._links.items()):
            if (
                other is not session
                and other.peer_node == session.peer_node
                and other.role is session.role
                and other_link.server is None
            ):
                log.info("closing the older link from node {node}: it dialled again", node=session.peer_node)
                self.metrics.disconnect(Source.PSC, "superseded")
                other_link.close(CLOSE_DUPLICATE, "superseded by a newer link from the same node")

    def queue_cap(self, session: LinkSession | None) -> int:
        """Bytes ``session``'s transport may hold unsent before the link is dropped.

        A 0.3 link resends up to a whole replay buffer at once when it resumes,
        so it may queue that much on top of ``max_link_queue``.
        """
        if session is not None and session.with_replay and self.outbox is not None:
            return self.max_link_queue + self.outbox.settings.max_bytes
        return self.max_link_queue

    def link_overflow(self, session: LinkSession, queued: int) -> None:
        """``session``'s peer is not taking what we send: past the cap, the link is dropped and counted."""
        peer = session.peer_node or session.peer
        log.warn(
            "dropping the PSC link to {peer}: {queued} bytes queued, limit is {limit}",
            peer=peer,
            queued=queued,
            limit=self.queue_cap(session),
        )
        self.metrics.disconnect(Source.PSC, "slow_consumer")

    def link_too_large(self, session: LinkSession, size: int, limit: int) -> None:
        """A message over what ``session``'s peer accepts (an older node with a smaller limit) is not sent to it."""
        peer = session.peer_node or session.peer
        log.warn(
            "not sending a message of {size} bytes to {peer}: over the {limit} bytes its link accepts",
            size=size,
            peer=peer,
            limit=limit,
        )
        self.metrics.event(FederationEvent.DROPPED_TOO_LARGE)

    def link_unsubscribed(self, session: LinkSession, topic: str) -> None:
        """A consumer no longer wants ``topic`` from us."""
        if session.with_replay and self.outbox is not None:
            self.outbox.unsubscribe(session, topic)
        sessions = self._by_topic.get(topic)
        if sessions is not None:
            sessions.pop(session, None)
            if not sessions:
                del self._by_topic[topic]
        self._relay_hint = (topic,)
        self._remote_topics_changed()

    def link_pattern(self, session: LinkSession, pattern: Pattern, added: bool) -> None:
        """0.5: a consumer asked us (its producer) for ``pattern``, or no longer wants it."""
        if self.outbox is None:  # 0.5 is offered only with an outbox
            return
        if added:
            self.outbox.subscribe_pattern(session, pattern)
        else:
            self.outbox.unsubscribe_pattern(session, pattern)
        self._remote_topics_changed()

    def link_rpc(self, session: LinkSession, message: psc.ExtensionMessage) -> None:
        """A 0.7 RPC message (federation/rpc.py)."""
        self.rpc.receive(session, message)

    def round_trips(self, sessions: list[LinkSession], timeout: float) -> defer.Deferred[bool]:
        """Fires True once each open link of ``sessions`` has handled all we sent on it, False after ``timeout`` s."""
        waits = []
        for session in sessions:
            link = self._links.get(session)
            if link is not None and session.state is LinkState.OPEN:
                waits.append(link.transport.round_trip())
        done: defer.Deferred[bool] = defer.gatherResults(waits, consumeErrors=True).addCallback(lambda _: True)
        if waits:
            done.addTimeout(timeout, self._reactor, onTimeoutCancel=lambda *_: False)
        return done

    def pong_hold(self, session: LinkSession) -> defer.Deferred[Any] | None:
        """What a round trip's pong on ``session`` waits for: the registrations it brought, relayed on (rpc.py)."""
        return self.rpc.pong_hold(session)

    def link_retained(self, session: LinkSession, message: psc_retain.Retained) -> None:
        """A 0.8 retained event (federation/retained.py)."""
        self.retained.receive(session, message)

    def link_logins(self, session: LinkSession, message: psc_logins.FailedLogin | psc_logins.LoginTable) -> None:
        """Failed logins from another process of this node (federation/logins.py)."""
        self.logins.receive(session, message)

    def _link_queued(self, session: LinkSession) -> int:
        """Bytes ``session``'s transport holds unsent (0 for a transport that does not say)."""
        link = self._links.get(session)
        queued = None if link is None else getattr(link.transport, "queued", None)
        return 0 if queued is None else int(queued())

    # -- introspection -----------------------------------------------------

    def links(self) -> list[dict[str, Any]]:
        """Every link and configured server, with its state, for /health and tests."""
        rows = []
        dialled = set()
        for session, link in self._links.items():
            if link.server is not None:
                dialled.add(link.server.url)
            rows.append(
                {
                    "peer": session.peer,
                    "peer_node": session.peer_node,
                    "role": session.role.value,
                    "state": session.state.value,
                    "version": None if session.version is None else f"{session.version[0]}.{session.version[1]}",
                    "direction": link.direction,
                    "direct": session.direct,
                    "topics": len(session.topics),
                    "patterns": len(session.patterns),
                }
            )
        for url in self._servers:
            if url not in dialled:
                rows.append(
                    {
                        "peer": url,
                        "peer_node": None,
                        "role": self.listen_role.opposite.value,
                        "state": "connecting",
                        "version": None,
                        "direction": "out",
                        "topics": 0,
                        "patterns": 0,
                    }
                )
        return rows

    def open_links(self) -> int:
        """Number of links past their handshake."""
        return sum(1 for s in self._links if s.state is LinkState.OPEN)
