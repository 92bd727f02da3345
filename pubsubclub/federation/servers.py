"""The federation's servers: the links a node dials, their retries, and the servers learned from peers.

Part of :class:`~pubsubclub.federation.federation.Federation` (its one
state, split by job): ``add_server`` / ``remove_server`` (driven by
discovery), each a Twisted ``ClientService`` with the federation's retry
policy, and peer learning (docs/protocol.md, "Peer learning").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

from twisted.application.internet import ClientService
from twisted.internet import defer
from twisted.internet.abstract import isIPAddress
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.logger import Logger

from pubsubclub.core.counters import Source
from pubsubclub.federation.hints import ReportingEndpoint, with_hint
from pubsubclub.federation.linkclient import PSCClientFactory
from pubsubclub.federation.session import (
    CLOSE_REMOVED,
    LinkSession,
)
from pubsubclub.federation.state import FederationState
from pubsubclub.federation.tls import IOpenSSLTrustRoot, client_tls
from pubsubclub.federation.transport import ADVERTISE_HEADER, PEERS_HEADER, LinkHost

log = Logger()


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
    #: Why the last attempt failed (federation/hints.py), None once linked.
    last_failure: str | None = None
    #: The node id its links named in their handshake (kept while it is down); None: never heard yet.
    node: str | None = None


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


class Dialling(FederationState):
    """The servers a federation dials (a part of :class:`Federation`)."""

    def client_headers(self, url: str) -> dict[str, str]:
        """Extra handshake headers sent when dialling ``url`` (asked again on every attempt)."""
        return self.peer_headers()

    def peer_headers(self) -> dict[str, str]:
        """Handshake headers telling a peer where to reach us and whom we dial (both directions)."""
        if not self.learn_peers:
            return {}
        listed = [url for url in self._servers if url not in self.unlisted]  # never a node's own workers
        headers = {PEERS_HEADER: " ".join(listed[:MAX_LEARNED_PER_LINK])}
        if self.announce_url is not None:
            headers[ADVERTISE_HEADER] = self.announce_url
        return headers

    def _learn(self, heard: tuple[str | None, str | None]) -> None:
        """Dial the nodes a peer told us about in its handshake that we do not dial yet."""
        if not self.learn_from_peers:
            return  # a worker other than the primary: its one peer is the primary
        advertised, peers = heard
        urls = ([advertised] if advertised else []) + (peers.split()[:MAX_LEARNED_PER_LINK] if peers else [])
        for url in urls:
            if url in self._servers or url == self.announce_url or url == self.advertise_url:
                continue
            if sum(1 for s in self._servers.values() if s.learned) >= MAX_LEARNED_SERVERS:
                self.hub.metrics.error(Source.PSC, "learned_servers_full")
                return
            if len(url) > MAX_LEARNED_URL_LENGTH or not _dialable(url):
                self.hub.metrics.error(Source.PSC, "bad_learned_url")
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
        endpoint = ReportingEndpoint(self._endpoint_factory(self._reactor, url), lambda why: self.link_failed(url, why))
        factory = PSCClientFactory(cast("LinkHost", self), url, self._reactor, self._ping_interval)

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

    def link_failed(self, url: str, reason: str, connected: bool = False) -> None:
        """Dialling ``url`` failed (``connected``: after the TCP connect, e.g. an HTTP refusal): log it with a hint."""
        server = self._servers.get(url)
        if server is not None:
            server.last_failure = reason
        say = log.warn if connected else log.info
        say("could not link to {url}: {reason}", url=url, reason=with_hint(reason, url))

    def peer_states(self, urls: list[str]) -> list[tuple[str, bool, str | None]]:
        """(url, linked, why the last attempt failed) for each of ``urls`` (for the ready report)."""
        rows = []
        for url in urls:
            server = self._servers.get(url)
            linked = server is not None and server.down_since is None
            rows.append((url, linked, None if server is None or linked else server.last_failure))
        return rows

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
