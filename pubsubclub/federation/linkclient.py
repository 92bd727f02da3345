"""The dialling side of a PSC link: the upgrade request and the cluster-secret offer and proof.

:class:`PSCClientProtocol` is the shared link protocol
(:class:`~pubsubclub.federation.transport._LinkProtocolBase`) on Autobahn's client
protocol; :class:`PSCClientFactory` dials one configured server with it. Both stay
importable from :mod:`pubsubclub.federation.transport`.
"""

from __future__ import annotations

from typing import Any

from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
)
from autobahn.websocket.types import ConnectingRequest, ConnectionResponse
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.federation.auth import (
    AUTH_HEADER,
    DIALLED_HEADER,
    AuthRefused,
    Offer,
    Refusal,
)
from pubsubclub.federation.seal import LinkSeal
from pubsubclub.federation.session import (
    CLOSE_SELF,
    CLOSE_UNAUTHENTICATED,
)
from pubsubclub.federation.transport import (
    ADVERTISE_HEADER,
    MAX_FRAME_HEADER,
    NODE_HEADER,
    PEERS_HEADER,
    SUBPROTOCOL,
    LinkHost,
    _bind_timers,
    _LinkProtocolBase,
    _max_frame_size,
    read_past_wrappers,
)
from pubsubclub.net.nodelay import set_no_delay

log = Logger()


class PSCClientProtocol(_LinkProtocolBase, WebSocketClientProtocol):  # type: ignore[misc]
    """The dialling side of a PSC link; it pings."""

    #: This attempt's nonce for the cluster-secret exchange, when the cluster has one.
    _offer: Offer | None = None
    #: The frame proving the secret, sent first once the listener proved it too.
    _proof_frame: bytes | None = None
    #: The seal the exchange agreed, taken up once the proof frame is sent.
    _agreed_seal: LinkSeal | None = None
    #: Why the listener's answer to our proof was refused, if it was.
    _answer_refused: Refusal | None = None
    #: Whether the WebSocket handshake completed.
    _opened = False

    def connectionMade(self) -> None:  # noqa: N802 - Twisted API
        """Nagle off: Autobahn's own attempt never takes effect on a client connection (see nodelay)."""
        super().connectionMade()
        set_no_delay(self.transport)
        read_past_wrappers(self)

    def onConnecting(self, transport_details: Any) -> ConnectingRequest:
        """Handshake headers made per attempt: a proof must carry a fresh nonce."""
        factory = self.factory
        self.dialled = factory.url
        federation: LinkHost = factory.federation
        headers = {
            NODE_HEADER: federation.node_id,
            MAX_FRAME_HEADER: str(federation.limits.max_link_frame),
            **federation.client_headers(factory.url),
        }
        if federation.auth is not None:
            self._offer = federation.auth.offer(federation.node_id, factory.url)
            headers[AUTH_HEADER] = self._offer.header()
            headers[DIALLED_HEADER] = factory.url
        return ConnectingRequest(
            host=factory.host,
            port=factory.port,
            resource=factory.resource,
            headers=headers,
            useragent=factory.useragent,
            origin=factory.origin,
            protocols=factory.protocols,
        )

    def onConnect(self, response: ConnectionResponse) -> None:
        """Learn the server's node id from its handshake answer; check its proof."""
        self.peer_node = response.headers.get(NODE_HEADER)
        self._peer_said_max_frame = response.headers.get(MAX_FRAME_HEADER)
        self.heard = (response.headers.get(ADVERTISE_HEADER), response.headers.get(PEERS_HEADER))
        auth = self.factory.federation.auth
        if auth is not None and self._offer is not None:
            try:
                proven = auth.prove(self._offer, response.headers.get(AUTH_HEADER), self.peer_node or "")
            except AuthRefused as e:
                self._answer_refused = e.refusal
            else:
                self._proof_frame, self._agreed_seal, self._direct = proven.frame, proven.seal, proven.direct

    def onOpen(self) -> None:
        """Start the session in the role opposite to the listeners'."""
        self._opened = True
        federation: LinkHost = self.factory.federation
        if self._answer_refused is not None:
            # It accepted us without proving the secret: it is not a cluster
            # node, and anything it sent would be injected into our hub.
            log.warn(
                "{url} did not prove the cluster secret ({reason}); not linking to it",
                url=self.factory.url,
                reason=self._answer_refused.value,
            )
            federation.auth_refused(self.factory.url, self.peer_node, self._answer_refused, "not linked")
            self.sendClose(CLOSE_UNAUTHENTICATED, "listener did not prove the cluster secret")
            return
        if self.peer_node is not None and self.peer_node == federation.node_id:
            log.warn("{url} is this node itself; not linking to it", url=self.factory.url)
            federation.found_self(self.factory.url)
            self.sendClose(CLOSE_SELF, "a node never links to itself")
            return
        if self._proof_frame is not None:
            # First on the wire, before any PSC message of the session; sealed from the next frame on.
            self.sendMessage(self._proof_frame, isBinary=False)
            self._seal = self._agreed_seal
        self._start_session(federation.listen_role.opposite, self.factory.url)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Say why a connection ended before its WebSocket handshake (HTTP refusal, TLS failure)."""
        if not self._opened:
            why = getattr(self, "wasNotCleanReason", None) or reason.getErrorMessage()
            self.factory.federation.link_failed(self.factory.url, why, connected=True)
        super().connectionLost(reason)


class PSCClientFactory(WebSocketClientFactory):
    """Dials one configured server; one factory per URL, reused across reconnects."""

    protocol = PSCClientProtocol

    def __init__(self, federation: LinkHost, url: str, clock: IReactorTime, ping_interval: float) -> None:
        super().__init__(
            url,
            reactor=clock,
            protocols=[SUBPROTOCOL],
        )
        self.federation = federation
        self.setProtocolOptions(
            # Frames up to max-message-size plus the link headroom (plus the seal's
            # tag with a secret), both ways (Autobahn also refuses to send more than this).
            maxMessagePayloadSize=_max_frame_size(federation),
            maxFramePayloadSize=_max_frame_size(federation),
            # The spec: ping every 5 s; no pong before the next ping means dead.
            autoPingInterval=ping_interval,
            autoPingTimeout=ping_interval,
            openHandshakeTimeout=10,
            closeHandshakeTimeout=2,
            # Send the close frame (1009 for oversize, 1002, ...) rather than just dropping TCP.
            failByDrop=False,
        )
        _bind_timers(self, clock)
