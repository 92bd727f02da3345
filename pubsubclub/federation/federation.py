"""The federation: every PSC link of one node, and the hub glue.

One :class:`Federation` per node. It listens for links (``resource()``),
dials configured servers (``add_server`` / ``remove_server``, each a Twisted
``ClientService``), tells producers about the hub's interest changes and
forwards local publishes to the consumers that asked for their topic.
Messages received from a producer are delivered locally only, never forwarded
again: one hop over a full mesh, so no loops and no duplicates.

Why one long module: it is the federation's one state (servers, links,
interest, forwarding, replay hooks); the link protocol and transport live
apart.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.resource import WebSocketResource
from autobahn.websocket.types import ConnectionDeny, ConnectionRequest
from twisted.application.internet import ClientService
from twisted.internet import defer
from twisted.internet.abstract import isIPAddress
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from pubsubclub.core.counters import FederationEvent
from pubsubclub.core.hub import GAP_TOPIC, Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import psc
from pubsubclub.federation.auth import (
    AUTH_HEADER,
    DEFAULT_MAX_PENDING,
    DEFAULT_MAX_PENDING_PER_SOURCE,
    DEFAULT_PROOF_TIMEOUT,
    DIALLED_HEADER,
    AuthRefused,
    Challenge,
    LinkAuth,
    Refusal,
)
from pubsubclub.federation.replay import DUPLICATE, Gap, Inbox, Outbox, ReplaySettings, ResumeRefused, Stream
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.federation.session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_DUPLICATE,
    CLOSE_REMOVED,
    LinkError,
    LinkSession,
    LinkState,
    Role,
)
from pubsubclub.federation.tls import IOpenSSLTrustRoot, client_tls
from pubsubclub.federation.transport import (
    ADVERTISE_HEADER,
    NODE_HEADER,
    PEERS_HEADER,
    PSCClientFactory,
    PSCServerFactory,
)
from pubsubclub.net.ratelog import RateLimitedLog

log = Logger()
# Counted per message: bound once, as reading a member off its enum class costs more than the count.
_RECEIVED, _FORWARDED = FederationEvent.RECEIVED, FederationEvent.FORWARDED

#: Longest wait for the linked nodes to confirm our interest (``interest_settled``), in seconds.
INTEREST_SETTLE_TIMEOUT = 5.0


@dataclass
class _Server:
    """One configured server we dial: its retry state and its current link."""

    url: str
    service: ClientService
    #: Reconnect delays taken since this server's last PSC handshake.
    failures: int = 0
    #: Learned from another node's handshake (not configured): forgotten when it stays unreachable.
    learned: bool = False
    #: When its link last went down (or the server was added); None while linked.
    down_since: float | None = None
    #: The link dialled for it, from transport start to close; None between attempts.
    link: Link | None = None


@dataclass(eq=False)
class Link:
    """One PSC link: its protocol session, the transport carrying it, and the server it was dialled for."""

    session: LinkSession
    #: The Autobahn protocol (``close_link``, ``heard``, ``accepted``).
    transport: Any
    #: The server record it was dialled for; None when the peer dialled us.
    server: _Server | None = None

    @property
    def direction(self) -> str:
        """``out`` when we dialled, ``in`` when the peer did."""
        return "in" if self.server is None else "out"

    def close(self, code: int, reason: str) -> None:
        """Close with a reason the peer can read."""
        self.transport.close_link(code, reason)


def _dialable(url: str) -> bool:
    """Whether ``url`` is a ws:// or wss:// URL with a host and a port."""
    try:
        parts = urlsplit(url)
        return parts.scheme in ("ws", "wss") and bool(parts.hostname) and parts.port is not None
    except ValueError:
        return False


def endpoint_for_url(reactor: Any, url: str, trust_root: IOpenSSLTrustRoot | None = None) -> IStreamClientEndpoint:
    """A client endpoint for a ``ws://`` or ``wss://host:port/path`` URL.

    ``wss://`` verifies the peer's certificate chain against ``trust_root``
    (the platform's CAs when None) and its name or IP address against the URL's host.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    secure = parts.scheme == "wss"
    port = parts.port or (443 if secure else 80)
    endpoint: IStreamClientEndpoint
    if isIPAddress(parts.hostname):
        endpoint = TCP4ClientEndpoint(reactor, parts.hostname, port, timeout=5)
    else:
        endpoint = HostnameEndpoint(reactor, parts.hostname.encode("idna"), port, timeout=5)
    if secure:
        endpoint = wrapClientTLS(client_tls(parts.hostname, trust_root), endpoint)
    return endpoint


#: Most URLs taken from one handshake's X-PubSubClub-Peers; more are ignored.
MAX_LEARNED_PER_LINK = 256
#: Longest URL taken from a handshake; longer ones are ignored.
MAX_LEARNED_URL_LENGTH = 512
#: Most learned servers held at once; past it, nothing more is learned.
MAX_LEARNED_SERVERS = 1024
#: Seconds a learned server may stay unreachable before it is forgotten.
LEARNED_FORGET_AFTER = 60.0

#: Most (topic, link) forward counts held back between reads of the metrics; past it they are added at once.
MAX_HELD_COUNTS = 1024

#: Default cap on the bytes queued for one peer's link (docs/security.md, "Silent and slow peers").
DEFAULT_MAX_LINK_QUEUE = 16 * 1024 * 1024

#: How many times larger a message's JSON may be than the client's bytes for it: MessagePack's
#: one-byte ``false`` or control character is six bytes of JSON (``false,``, ``\u0001``); JSON's
#: ``1e15`` becomes ``1000000000000000.0``. Below the bound a publish needs no check (``unchecked_below``).
MAX_REENCODING_GROWTH = 6
#: Bytes a PSC301 may add around the re-encoded message: topic, origin, time, message id, JSON.
PSC_OVERHEAD_ALLOWANCE = 8 * 1024
#: Room for the sequence number a 0.3 stream adds to a PSC301's metadata (``,"s":<integer>``).
SEQ_ALLOWANCE = 32
#: ``Envelope.wire`` key of a local publish's PSC301 with metadata, made once (the size check, then forwarding).
_PSC_RICH = "psc301"
#: ``Envelope.wire`` key of the same in the 0.6 binary form, for a message holding bytes (0.6 links only).
_PSC_BINARY = "psc301-binary"


class Federation:
    """All PSC links of one node (both roles), driven by the hub and discovery."""

    def __init__(
        self,
        hub: Hub,
        *,
        listen_role: Role = Role.PRODUCER,
        reactor: Any = None,
        ping_interval: float = 5.0,
        retry: RetryPolicy = RetryPolicy(),
        rand: Callable[[], float] = random.random,
        versions: tuple[psc.Version, ...] = psc.SUPPORTED_VERSIONS,
        limits: psc.Limits = psc.DEFAULT_LIMITS,
        advertise_url: str | None = None,
        endpoint_factory: Callable[[Any, str], IStreamClientEndpoint] = endpoint_for_url,
        secret: bytes | None = None,
        proof_timeout: float = DEFAULT_PROOF_TIMEOUT,
        max_pending_proofs: int = DEFAULT_MAX_PENDING,
        max_pending_proofs_per_source: int = DEFAULT_MAX_PENDING_PER_SOURCE,
        replay: ReplaySettings | None = None,
        max_link_queue: int = DEFAULT_MAX_LINK_QUEUE,
        learn_peers: bool = True,
        batch: bool = True,
        patterns: bool = True,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.hub = hub
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
                proof_timeout=proof_timeout,
                max_pending=max_pending_proofs,
                max_pending_per_source=max_pending_proofs_per_source,
            )
        )
        #: Refused link attempts are logged a few per kind and interval, the rest counted (a flood is one line).
        self.refusal_log = RateLimitedLog(log, reactor)
        #: PSC 0.3 (replay after short outages, federation/replay.py): offered when ``replay`` is given.
        self.outbox: Outbox | None = None
        self.inbox: Inbox | None = None
        if replay is not None:
            self.outbox = Outbox(replay, reactor.seconds, boot=os.urandom(6).hex(), metrics=hub.metrics)
            self.inbox = Inbox(replay.max_positions, metrics=hub.metrics)
            if psc.V0_3 not in versions:
                self.versions = (*versions, psc.V0_3)
            if batch and psc.V0_4 not in self.versions:
                self.versions = (*self.versions, psc.V0_4)
            if batch and patterns and psc.V0_5 not in self.versions:
                self.versions = (*self.versions, psc.V0_5)
            # Binary payloads (0.6) come with 0.5: a node that offers 0.5 can carry them.
            if psc.V0_5 in self.versions and psc.V0_6 not in self.versions:
                self.versions = (*self.versions, psc.V0_6)
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
        hub.metrics.add_settler(self._settle)
        hub.add_interest_listener(self)
        hub.add_pattern_listener(self)
        hub.add_publish_listener(self)
        # Publishes whose PSC301 might not fit a link are measured before the front-end acknowledges them.
        unchecked = (limits.max_link_frame - PSC_OVERHEAD_ALLOWANCE) // MAX_REENCODING_GROWTH
        hub.set_forward_check(self.forward_problem, unchecked_below=max(unchecked, 0))

    @property
    def stats(self) -> dict[str, int]:
        """The federation's event counters (a view of the hub's metrics)."""
        return self.hub.metrics.view("federation")

    # -- listening ---------------------------------------------------------

    def server_factory(self) -> PSCServerFactory:
        """The WebSocket factory accepting links (serve it at ``/psc``)."""
        return PSCServerFactory(self, self._reactor, self._ping_interval)

    def resource(self) -> WebSocketResource:
        """A twisted.web resource accepting links."""
        return WebSocketResource(self.server_factory())

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
        Without a secret, no challenge.
        """
        if self.auth is None:
            return {}, None
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
        return {AUTH_HEADER: challenge.header()}, challenge

    def auth_refused(self, peer: str, node: str | None, refusal: Refusal, how: str) -> None:
        """Count a link refused for not proving the cluster secret (``how``: HTTP status or close code); log it.

        Logged a few per kind of refusal and interval, the rest as one count
        (:class:`~pubsubclub.net.ratelog.RateLimitedLog`): a flood of
        never-proving connections is a handful of lines, not one each.
        """
        self.hub.metrics.event(FederationEvent.AUTH_REFUSED)
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

    def client_headers(self, url: str) -> dict[str, str]:
        """Extra handshake headers sent when dialling ``url`` (asked again on every attempt)."""
        return self.peer_headers()

    def peer_headers(self) -> dict[str, str]:
        """Handshake headers telling a peer where to reach us and whom we dial (both directions)."""
        if not self.learn_peers:
            return {}
        headers = {PEERS_HEADER: " ".join(list(self._servers)[:MAX_LEARNED_PER_LINK])}
        if self.announce_url is not None:
            headers[ADVERTISE_HEADER] = self.announce_url
        return headers

    def _learn(self, heard: tuple[str | None, str | None]) -> None:
        """Dial the nodes a peer told us about in its handshake that we do not dial yet."""
        advertised, peers = heard
        urls = ([advertised] if advertised else []) + (peers.split()[:MAX_LEARNED_PER_LINK] if peers else [])
        for url in urls:
            if url in self._servers or url == self.announce_url or url == self.advertise_url:
                continue
            if sum(1 for s in self._servers.values() if s.learned) >= MAX_LEARNED_SERVERS:
                self.hub.metrics.error("psc", "learned_servers_full")
                return
            if len(url) > MAX_LEARNED_URL_LENGTH or not _dialable(url):
                self.hub.metrics.error("psc", "bad_learned_url")
                continue
            log.info("learned of {url} from a peer", url=url)
            self.add_server(url, learned=True)

    # -- servers (driven by discovery) -------------------------------------

    def servers(self) -> list[str]:
        """URLs currently configured to dial."""
        return list(self._servers)

    def add_server(self, url: str, *, learned: bool = False) -> None:
        """Start linking to ``url`` now and keep the link up until removed.

        ``learned``: told by a peer, not configured; forgotten after
        :data:`LEARNED_FORGET_AFTER` seconds unreachable. Adding a learned URL
        again as configured makes it configured.
        """
        existing = self._servers.get(url)
        if existing is not None:
            existing.learned = existing.learned and learned
            return
        if self.advertise_url is not None and url == self.advertise_url:
            log.info("not linking to {url}: it is this node", url=url)
            return
        endpoint = self._endpoint_factory(self._reactor, url)
        factory = PSCClientFactory(self, url, self._reactor, self._ping_interval)

        # The backoff is counted here, not by ClientService: its count resets at
        # every TCP connect, and a PSC handshake can still fail after that. It
        # cannot wait for the handshake either (prepareConnection): a connection
        # lost while being prepared has no transition in its state machine.
        def retry_delay(attempt: int) -> float:
            server.failures += 1
            down = server.down_since
            if server.learned and down is not None and self._reactor.seconds() - down > LEARNED_FORGET_AFTER:
                log.info(
                    "forgetting learned server {url}: unreachable since {seconds:.0f} s",
                    url=url,
                    seconds=self._reactor.seconds() - down,
                )
                self._reactor.callLater(0, self._forget_learned, server)
            return self._retry.delay(server.failures, self._rand)

        service = ClientService(endpoint, factory, retryPolicy=retry_delay, clock=self._reactor)
        server = self._servers[url] = _Server(url, service, learned=learned, down_since=self._reactor.seconds())
        log.info("linking to {url}", url=url)
        service.startService()

    def remove_server(self, url: str) -> defer.Deferred[None]:
        """Close the link to ``url`` and stop retrying it."""
        server = self._servers.pop(url, None)
        if server is None:
            return defer.succeed(None)
        log.info("unlinking from {url}", url=url)
        if server.link is not None:
            server.link.close(CLOSE_REMOVED, "server removed from this node's list")
        return defer.maybeDeferred(server.service.stopService)

    def _forget_learned(self, server: _Server) -> None:
        """Remove a learned server, unless it was configured or replaced meanwhile."""
        if self._servers.get(server.url) is server and server.learned:
            self.remove_server(server.url)

    def found_self(self, url: str) -> None:
        """``url`` turned out to be this node: forget it."""
        self._reactor.callLater(0, self.remove_server, url)

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
                self.hub.metrics.disconnect("psc", "superseded")
                self._links[existing].close(CLOSE_DUPLICATE, "superseded by a direct link to the same node")
                existing = None
            if existing is not None:
                log.warn(
                    "duplicate link to node {node} via {peer}; closing it", node=session.peer_node, peer=session.peer
                )
                self.hub.metrics.event(FederationEvent.LINKS_REFUSED)
                duplicate = self._links[session]
                duplicate.close(CLOSE_DUPLICATE, f"already linked to node {session.peer_node}")
                server = duplicate.server
                if server is not None and server.learned:
                    # Another URL of a node we already dial: do not keep redialling it.
                    self._reactor.callLater(0, self._forget_learned, server)
                return
            self._producers[session] = None
            topics = [topic for topic in self.hub.topics() if topic != GAP_TOPIC]  # gap reports stay local
            if session.with_replay and self.inbox is not None:
                epoch, seq = self.inbox.position(session.peer_node or session.peer)
                patterns = tuple(self._announced) if session.with_patterns else None
                session.send(psc.Resume(epoch, seq, tuple(topics), patterns))
            elif topics:
                session.send(psc.Subscribe(tuple(topics)))
        link = self._links.get(session)
        if link is not None:
            if link.server is not None:
                link.server.failures = 0
                link.server.down_since = None
            self._learn(link.transport.heard)
        self.hub.metrics.event(FederationEvent.LINKS_OPENED)
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
                self.hub.metrics.disconnect("psc", "superseded")
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
        self.hub.metrics.disconnect("psc", "slow_consumer")

    def link_too_large(self, session: LinkSession, size: int, limit: int) -> None:
        """A message over what ``session``'s peer accepts (an older node with a smaller limit) is not sent to it."""
        peer = session.peer_node or session.peer
        log.warn(
            "not sending a message of {size} bytes to {peer}: over the {limit} bytes its link accepts",
            size=size,
            peer=peer,
            limit=limit,
        )
        self.hub.metrics.event(FederationEvent.DROPPED_TOO_LARGE)

    def forward_problem(self, envelope: Envelope) -> str | None:
        """Why a local publish cannot cross the links (its PSC301 is over the link frame limit), or None.

        Front-ends ask (through :meth:`Hub.refusal`) before they acknowledge.
        The PSC301 made here is kept on the envelope and sent as it is.
        """
        try:
            rich = self._rich(envelope)
        except TypeError:
            try:
                rich = self._rich_binary(envelope)  # bytes measured as they cross: "\0" + base64
            except TypeError:
                return None  # not JSON even so (non-string keys): never forwarded (dropped, not_json)
        size = len(rich) + SEQ_ALLOWANCE
        limits = self.limits
        if size <= limits.max_link_frame:
            return None
        return (
            f"message is {size} bytes as a PSC301, over the link limit of {limits.max_link_frame} bytes"
            f" (max-message-size {limits.max_message_size} + link-headroom {limits.link_headroom})"
        )

    @staticmethod
    def _rich(envelope: Envelope) -> bytes:
        """``envelope``'s PSC301 with metadata (0.2 and later), made once per message.

        Raises TypeError when the message is not JSON (bytes in it: see :meth:`_rich_binary`).
        """
        wire = envelope.wire
        rich: bytes | None = wire.get(_PSC_RICH)
        if rich is None:
            rich = wire[_PSC_RICH] = psc.encode_publish_meta(
                envelope.topic, envelope.payload, envelope.origin, envelope.published_at, envelope.message_id,
                envelope.wamp_wrapped, options=envelope.options,
            )  # fmt: skip
        return rich

    def _rich_options(self, envelope: Envelope) -> bytes:
        """The 0.6 PSC301 of a message with WAMP publish options (``"p"``), with ``"b": 1`` too if it holds bytes."""
        try:
            return self._rich(envelope)
        except TypeError:
            return self._rich_binary(envelope)

    @staticmethod
    def _rich_binary(envelope: Envelope) -> bytes:
        """``envelope``'s PSC301 in the 0.6 binary form (``"b": 1``), made once; only after :meth:`_rich` refused it.

        Raises TypeError when the message is not JSON even with its bytes
        written as ``"\0"`` + base64 (e.g. MessagePack maps with non-string keys).
        """
        wire = envelope.wire
        rich: bytes | None = wire.get(_PSC_BINARY)
        if rich is None:
            rich = wire[_PSC_BINARY] = psc.encode_publish_meta(
                envelope.topic, envelope.payload, envelope.origin, envelope.published_at, envelope.message_id,
                envelope.wamp_wrapped, binary=True, options=envelope.options,
            )  # fmt: skip
        return rich

    def link_unsubscribed(self, session: LinkSession, topic: str) -> None:
        """A consumer no longer wants ``topic`` from us."""
        if session.with_replay and self.outbox is not None:
            self.outbox.unsubscribe(session, topic)
        sessions = self._by_topic.get(topic)
        if sessions is not None:
            sessions.pop(session, None)
            if not sessions:
                del self._by_topic[topic]
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

    def link_resume(self, session: LinkSession, message: psc.Resume) -> None:
        """0.3: a consumer resumes its stream; answer PSC104, resend what it missed, then go live."""
        assert self.outbox is not None  # 0.3 is offered only with an outbox
        try:
            plan = self.outbox.resume(session, session.peer_node, message)
        except ResumeRefused as e:
            raise LinkError(CLOSE_BAD_MESSAGE, e.reason) from None
        session.send(plan.position)
        for data in plan.replay:
            session.send_raw(data)
        peer = session.peer_node or session.peer
        log.info(
            "PSC stream to {peer}: epoch {epoch}, resumed after {seq}, {replayed} resent, {lost} lost",
            peer=peer,
            epoch=plan.position.epoch,
            seq=plan.position.seq,
            replayed=len(plan.replay),
            lost=plan.position.lost,
        )
        if plan.replay:
            self.hub.metrics.link_count(peer, "replayed", len(plan.replay))
        old = self._links.get(plan.superseded)
        if old is not None:
            old.close(CLOSE_DUPLICATE, "superseded by a newer link from the same node")
        for topic in message.topics:
            self.hub.remote_subscribed(topic, peer)
        self._remote_topics_changed()

    def link_position(self, session: LinkSession, message: psc.Position) -> None:
        """0.3: the producer said where its stream continues; report a gap it announces."""
        assert self.inbox is not None
        gap = self.inbox.positioned(session.peer_node or session.peer, message)
        if gap is not None:
            self._report_gap(gap)

    def _report_gap(self, gap: Gap) -> None:
        """Log, count and tell local subscribers of GAP_TOPIC that messages from a producer are lost."""
        self.hub.metrics.event(FederationEvent.GAPS)
        self.hub.metrics.event(FederationEvent.GAP_MESSAGES, gap.lost or 0)
        self.hub.metrics.link_count(gap.producer, "gaps", 1)
        if gap.lost:
            self.hub.metrics.link_count(gap.producer, "lost", gap.lost)
        log.warn(
            "gap in the stream from {peer}: {lost} messages lost ({reason})",
            peer=gap.producer,
            lost="an unknown number of" if gap.lost is None else gap.lost,
            reason=gap.reason,
        )
        now = self._reactor.seconds()
        payload = {"origin": gap.producer, "lost": gap.lost, "reason": gap.reason}
        self.hub.deliver_remote(Envelope(GAP_TOPIC, payload, origin=self.node_id, published_at=now))

    def link_dropped(self, session: LinkSession, error: psc.PSCPayloadError) -> None:
        """A producer sent a PSC301 whose message breaks the JSON bounds: count it, keep the link."""
        peer = session.peer_node or session.peer
        self.hub.metrics.event(FederationEvent.DROPPED_BOUNDS)
        self.hub.metrics.count(error.topic, "psc", "dropped", 1, session.last_size, peer=peer, reason="bounds")
        log.warn("dropped a PSC301 from {peer}: {problem}", peer=peer, problem=str(error))

    def link_error(self, session: LinkSession) -> None:
        """Handling a message from ``session`` raised (logged by the transport); the link stays."""
        self.hub.metrics.event(FederationEvent.HANDLER_ERRORS)
        self.hub.metrics.error("psc", "handler_error")

    def link_received(self, session: LinkSession, message: psc.Publish) -> None:
        """A producer sent a message: deliver it here, never forward it."""
        meta = message.meta
        if session.with_replay and self.inbox is not None and meta is not None and meta.seq is not None:
            skipped = self.inbox.accept(session.peer_node or session.peer, meta.seq)
            if skipped:
                if skipped == DUPLICATE:
                    self.hub.metrics.event(FederationEvent.DUPLICATES_DROPPED)
                    self.hub.metrics.link_count(session.peer_node or session.peer, "duplicates", 1)
                    return
                self._report_gap(Gap(session.peer_node or session.peer, skipped, "sequence"))
        size = session.last_size
        if meta is None:
            envelope = Envelope(message.topic, message.message, session.peer_node, size=size)
        else:
            envelope = Envelope(
                message.topic,
                message.message,
                meta.origin or session.peer_node,
                meta.published_at,
                meta.message_id,
                meta.wamp_wrapped,
                size,
                options=meta.options,
            )
        metrics = self.hub.metrics
        metrics.event(_RECEIVED)
        metrics.count(message.topic, "psc", "received", 1, size, peer=session.peer_node or session.peer)
        if envelope.published_at is not None and envelope.origin is not None:
            metrics.latency(envelope.origin, self._reactor.seconds() - envelope.published_at)
        self.hub.deliver_remote(envelope)

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        """A producer sent PSC301s in one frame: deliver them here in order, counting once for the run.

        What :meth:`link_received` does per message, with the counters added
        up over the run (the same totals) and one clock reading for its
        latencies (the frame arrived at once).
        """
        hub = self.hub
        metrics = hub.metrics
        received: dict[str, list[int]] = {}
        latencies: dict[str, list[float]] = {}
        try:
            hub.deliver_remote_batch(self._envelopes(session, messages, sizes, received, latencies))
        finally:
            n = 0
            peer = session.peer_node or session.peer
            for topic, (count, nbytes) in received.items():
                n += count
                metrics.count(topic, "psc", "received", count, nbytes, peer=peer)
            if n:
                metrics.event(_RECEIVED, n)
            for origin, seconds in latencies.items():
                metrics.latencies(origin, seconds)

    def _envelopes(
        self,
        session: LinkSession,
        messages: list[psc.Publish],
        sizes: list[int],
        received: dict[str, list[int]],
        latencies: dict[str, list[float]],
    ) -> Iterator[Envelope]:
        """:meth:`link_received_batch`'s envelopes, one at a time; stops when the session closes.

        Adds each to ``received`` (topic -> [messages, bytes]) and its latency to ``latencies`` (by origin).
        """
        peer_node = session.peer_node
        peer = peer_node or session.peer
        inbox = self.inbox if session.with_replay else None
        now = self._reactor.seconds()
        closed = LinkState.CLOSED
        for message, size in zip(messages, sizes, strict=True):
            if session.state is closed:
                return
            meta = message.meta
            if meta is None:
                envelope = Envelope(message.topic, message.message, peer_node, size=size)
            else:
                if inbox is not None and meta.seq is not None:
                    skipped = inbox.accept(peer, meta.seq)
                    if skipped:
                        if skipped == DUPLICATE:
                            self.hub.metrics.event(FederationEvent.DUPLICATES_DROPPED)
                            self.hub.metrics.link_count(peer, "duplicates", 1)
                            continue
                        self._report_gap(Gap(peer, skipped, "sequence"))
                origin = meta.origin or peer_node
                published_at = meta.published_at
                envelope = Envelope(
                    message.topic, message.message, origin, published_at, meta.message_id, meta.wamp_wrapped, size,
                    options=meta.options,
                )  # fmt: skip
                if published_at is not None and origin is not None:
                    waits = latencies.get(origin)
                    if waits is None:
                        waits = latencies[origin] = []
                    waits.append(now - published_at)
            cell = received.get(message.topic)
            if cell is None:
                received[message.topic] = [1, size]
            else:
                cell[0] += 1
                cell[1] += size
            yield envelope

    # -- hub listeners -----------------------------------------------------

    def topic_added(self, topic: str) -> None:
        """First local subscriber: ask every producer for the topic."""
        if self._producers and topic != GAP_TOPIC:
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
        if self._producers and topic != GAP_TOPIC:
            data = psc.encode(psc.Unsubscribe(topic))
            for session in self._producers:
                session.send_raw(data)

    def pattern_added(self, pattern: Pattern) -> None:
        """A pattern's first local holder: PSC203 to every 0.5 producer (within the per-peer limit)."""
        if len(self._announced) >= self.limits.max_patterns_per_peer:
            self._held[pattern] = None
            self.hub.metrics.error("psc", "patterns_over_limit")
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
        for session in self._producers:
            if session.with_patterns:
                session.send_raw(data)

    def local_published(self, envelope: Envelope) -> None:
        """Forward a local publish to each consumer that asked for its topic.

        Counted as forwarded in :attr:`_forwarded`, added to the metrics before
        any read of them (:meth:`_settle`): the same totals, no per-message call.
        """
        topic = envelope.topic
        sessions = self._by_topic.get(topic)
        outbox = self.outbox
        streams = None if outbox is None else outbox.streams_for(topic)
        if not sessions and not streams:
            return
        plain: bytes | None = None
        rich: bytes | None = None
        forwarded = self._forwarded
        if len(forwarded) >= MAX_HELD_COUNTS:
            self._settle()  # bounded: publishing on ever new topics must not grow the node
        if envelope.options is not None:
            # WAMP publish options (PSC 0.6 "p"): only links that apply them get the message.
            self._forward_binary(envelope, sessions, streams)
            return
        sent = 0
        try:
            if streams:
                assert outbox is not None
                rich = self._rich(envelope)
                sent = outbox.forward(topic, rich, forwarded, streams)
            for session in sessions or ():
                if session.with_metadata:
                    if rich is None:
                        rich = self._rich(envelope)
                    data = rich
                else:
                    if plain is None:
                        plain = psc.encode_publish(topic, envelope.payload)
                    data = plain
                session.send_raw(data)
                cell = forwarded.get((topic, session))
                if cell is None:
                    cell = forwarded[(topic, session)] = [0, 0]
                cell[0] += 1
                cell[1] += len(data)
                sent += 1
        except TypeError:  # orjson: the payload is not JSON (bytes in it); raised before anything was sent
            self._forward_binary(envelope, sessions, streams)
            return
        self._forwarded_n += sent

    def _forward_binary(
        self, envelope: Envelope, sessions: dict[LinkSession, None] | None, streams: dict[Stream, None] | None
    ) -> None:
        """:meth:`local_published` for a message holding bytes or WAMP publish options: to 0.6 links only.

        Older links (below 0.6: ``sessions`` all are, and streams whose
        consumer did not speak 0.6) cannot carry it and are counted as
        dropped (``not_json``), as is everyone when it is not JSON even so.
        """
        topic = envelope.topic
        try:
            binary = self._rich_binary(envelope) if envelope.options is None else self._rich_options(envelope)
        except TypeError as e:
            takers: dict[Stream, None] = {}
            error = str(e)
        else:
            takers = {stream: None for stream in streams or () if stream.binary}
            error = "binary values or publish options, and the link is older than PSC 0.6"
        missed = len(sessions or ()) + len(streams or ()) - len(takers)
        if takers:
            assert self.outbox is not None
            self._forwarded_n += self.outbox.forward(topic, binary, self._forwarded, takers)
        if missed:
            self.hub.metrics.event(FederationEvent.DROPPED_NOT_JSON)
            self.hub.metrics.count(topic, "psc", "dropped", missed, payload_size(envelope), reason="not_json")
            log.warn(
                "not forwarding a message on {topic} to {missed} links: payload is not JSON ({error})",
                topic=topic,
                missed=missed,
                error=error,
            )

    def _settle(self) -> None:
        """Add the forwards held back since the last read of the metrics (run by ``Metrics.settle``)."""
        metrics = self.hub.metrics
        n = self._forwarded_n
        if n:
            self._forwarded_n = 0
            metrics.event(_FORWARDED, n)
        forwarded = self._forwarded
        if forwarded:
            for (topic, session), (count, nbytes) in forwarded.items():
                metrics.count(topic, "psc", "forwarded", count, nbytes, peer=session.peer_node or session.peer)
            forwarded.clear()  # in place: a read in the middle of local_published leaves its reference valid

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

    def open_links(self) -> int:
        """Number of links past their handshake."""
        return sum(1 for s in self._links if s.state is LinkState.OPEN)
