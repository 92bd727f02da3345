"""The listening side of a PSC link: the upgrade and the cluster-secret challenge and its proof.

:class:`PSCServerProtocol` is the shared link protocol
(:class:`~pubsubclub.federation.transport._LinkProtocolBase`) on Autobahn's server
protocol; :class:`PSCServerFactory` builds it at the federation listener. Both stay
importable from :mod:`pubsubclub.federation.transport`.
"""

from __future__ import annotations

from autobahn.twisted.websocket import (
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.types import ConnectionRequest
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure

from pubsubclub.federation.auth import (
    AuthRefused,
    Challenge,
    Refusal,
)
from pubsubclub.federation.session import (
    CLOSE_SELF,
    CLOSE_UNAUTHENTICATED,
)
from pubsubclub.federation.transport import (
    _OPEN,
    ADVERTISE_HEADER,
    MAX_FRAME_HEADER,
    NODE_HEADER,
    PEERS_HEADER,
    SUBPROTOCOL,
    LinkHost,
    _bind_timers,
    _LinkProtocolBase,
    _max_frame_size,
)
from pubsubclub.net.edge import handshake_done
from pubsubclub.net.websocket import unfinished_input


# Autobahn's own base classes disagree on two attribute types (its typing, not ours).
class PSCServerProtocol(_LinkProtocolBase, WebSocketServerProtocol):  # type: ignore[misc]
    """The listening side of a PSC link; it pings too, so a peer that froze after dialling is noticed."""

    accepted = True
    #: The cluster-secret challenge the dialler's first frame must answer (None: no secret, or answered).
    _challenge: Challenge | None = None
    #: Closes the connection when the proof frame is overdue.
    _proof_timer: IDelayedCall | None = None

    def pending_input(self) -> int:
        """Unfinished input held (the connection layer's hook)."""
        return unfinished_input(self)

    def onConnect(self, request: ConnectionRequest) -> tuple[str | None, dict[str, str]]:
        """Learn the peer's node id, check its offer; answer with ours, the challenge and the subprotocol."""
        federation: LinkHost = self.factory.federation
        self.peer_node = request.headers.get(NODE_HEADER)
        self._peer_said_max_frame = request.headers.get(MAX_FRAME_HEADER)
        # Raises ConnectionDeny (HTTP 401/403/503) when no usable offer came.
        # A node dialling itself holds the secret, so it passes and learns
        # from our node header that it should drop the URL
        # (PSCClientProtocol.onOpen) instead of retrying forever.
        peer = self.transport.getPeer()  # type: ignore[union-attr]
        source = getattr(peer, "host", None) or str(peer)
        answer, self._challenge = federation.check_request(request, source, self._evicted)
        self.heard = (request.headers.get(ADVERTISE_HEADER), request.headers.get(PEERS_HEADER))
        protocol = SUBPROTOCOL if SUBPROTOCOL in request.protocols else None
        # Whom we dial is for cluster members only: with a secret, the dialler
        # has proven nothing yet (our peers learn it when we dial them).
        told = federation.peer_headers() if self._challenge is None else {}
        sizes = {MAX_FRAME_HEADER: str(federation.limits.max_link_frame)}
        return protocol, {NODE_HEADER: federation.node_id, **sizes, **answer, **told}

    def onOpen(self) -> None:
        """Start the session in the cluster's listening role, once the dialler proved the secret."""
        # Upgraded: the connection layer's handshake deadline is over; the proof has its own.
        handshake_done(self.transport)
        federation: LinkHost = self.factory.federation
        if self.peer_node == federation.node_id:
            self._settle_challenge()
            self.sendClose(CLOSE_SELF, "a node never links to itself")
            return
        if self._challenge is not None and federation.auth is not None:
            self._proof_timer = self.factory.clock.callLater(federation.auth.proof_timeout, self._proof_overdue)
            return
        self._start_session(federation.listen_role, str(self.peer))

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        """The first frame of a dialler that must prove the secret is its proof; then PSC messages."""
        challenge = self._challenge
        if challenge is None:
            super().onMessage(payload, isBinary)
            return
        federation: LinkHost = self.factory.federation
        self._settle_challenge()
        try:
            if isBinary or federation.auth is None:
                raise AuthRefused(Refusal.MALFORMED)
            self._seal = federation.auth.check_proof(challenge, payload)
        except AuthRefused as e:
            self._refuse(e.refusal)
            return
        self._direct = challenge.direct
        self._start_session(federation.listen_role, str(self.peer))

    def _evicted(self) -> None:
        """Newer link attempts took this one's pending slot (auth.LinkAuth's caps): close it."""
        self._challenge = None  # already settled by the eviction
        self._settle_challenge()
        if self.state == _OPEN:  # type: ignore[attr-defined]
            self._refuse(Refusal.EVICTED)
        else:
            federation: LinkHost = self.factory.federation
            federation.auth_refused(str(self.peer), self.peer_node, Refusal.EVICTED, "dropped")
            self.dropConnection(abort=True)  # type: ignore[attr-defined]

    def _proof_overdue(self) -> None:
        self._proof_timer = None
        self._settle_challenge()
        self._refuse(Refusal.TIMEOUT)

    def _refuse(self, refusal: Refusal) -> None:
        federation: LinkHost = self.factory.federation
        federation.auth_refused(str(self.peer), self.peer_node, refusal, f"closed {CLOSE_UNAUTHENTICATED}")
        self.sendClose(CLOSE_UNAUTHENTICATED, refusal.value)

    def _settle_challenge(self) -> None:
        """Stop waiting for a proof: cancel the timer, free the pending slot."""
        if self._proof_timer is not None:
            if self._proof_timer.active():
                self._proof_timer.cancel()
            self._proof_timer = None
        challenge, self._challenge = self._challenge, None
        federation: LinkHost = self.factory.federation
        if challenge is not None and federation.auth is not None:
            federation.auth.settle(challenge)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """A dialler that leaves before proving the secret frees its slot (it proved nothing)."""
        if self._challenge is not None:
            federation: LinkHost = self.factory.federation
            federation.auth_refused(str(self.peer), self.peer_node, Refusal.GONE, "connection lost")
        self._settle_challenge()
        super().connectionLost(reason)


class PSCServerFactory(WebSocketServerFactory):
    """Accepts PSC links at the federation listener."""

    protocol = PSCServerProtocol

    def __init__(self, federation: LinkHost, clock: IReactorTime, ping_interval: float) -> None:
        super().__init__(reactor=clock)
        self.federation = federation
        self.clock = clock
        self.setProtocolOptions(
            # Frames up to max-message-size plus the link headroom (plus the seal's
            # tag with a secret), both ways (Autobahn also refuses to send more than this).
            maxMessagePayloadSize=_max_frame_size(federation),
            maxFramePayloadSize=_max_frame_size(federation),
            # Both ends ping: a dialler that froze or vanished (SIGSTOP, a
            # partition) is closed within two intervals, not kept as a ghost
            # that everything published for it queues behind.
            autoPingInterval=ping_interval,
            autoPingTimeout=ping_interval,
            openHandshakeTimeout=10,
            closeHandshakeTimeout=2,
            # Send the close frame (1009 for oversize, 1002, ...) rather than just dropping TCP.
            failByDrop=False,
        )
        _bind_timers(self, clock)
