"""PubSubClub links over Autobahn WebSocket: protocols and factories.

Parsing and protocol rules live in :mod:`pubsubclub.federation.session`; this
module only moves bytes, learns the peer's node id from the handshake headers,
carries the cluster-secret proofs that :mod:`pubsubclub.federation.auth` makes
and checks, and turns :class:`~pubsubclub.federation.session.LinkError` into a close frame
with a reason. Nothing else closes a link: any other error while handling a
message is logged and counted, and the link stays.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectingRequest, ConnectionRequest, ConnectionResponse
from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.federation import psc
from pubsubclub.federation.auth import (
    AUTH_HEADER,
    DIALLED_HEADER,
    AuthRefused,
    Challenge,
    LinkAuth,
    Offer,
    Refusal,
)
from pubsubclub.federation.seal import SEAL_OVERHEAD, LinkSeal, SealError
from pubsubclub.federation.session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_SELF,
    CLOSE_UNAUTHENTICATED,
    LinkError,
    LinkOwner,
    LinkSession,
    LinkState,
    Role,
)
from pubsubclub.net.edge import handshake_done, unsent_bytes
from pubsubclub.net.nodelay import set_no_delay
from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer
from pubsubclub.net.websocket import unfinished_input
from pubsubclub.net.wsframes import receive_data, send_message


class LinkHost(LinkOwner, Protocol):
    """What a link's transport needs of the node's federation (and all it may touch).

    :class:`~pubsubclub.federation.federation.Federation` provides it; the
    transport hands each link's session and events over and never reaches
    into the federation's records.
    """

    node_id: str
    versions: tuple[psc.Version, ...]
    limits: psc.Limits
    listen_role: Role
    auth: LinkAuth | None

    def check_request(
        self, request: ConnectionRequest, source: str, on_evict: Callable[[], None]
    ) -> tuple[dict[str, str], Challenge | None]:
        """Refuse at the handshake (ConnectionDeny) or answer headers and the challenge to settle."""

    def auth_refused(self, peer: str, node: str | None, refusal: Refusal, how: str) -> None:
        """Log (rate-limited) and count a refused proof."""

    def client_headers(self, url: str) -> dict[str, str]:
        """Extra request headers when dialling ``url``."""

    def peer_headers(self) -> dict[str, str]:
        """Peer-learning headers."""

    def found_self(self, url: str) -> None:
        """``url`` is this node."""

    def link_started(self, session: LinkSession, transport: Any, dialled: str | None) -> None:
        """A session exists on ``transport``; ``dialled`` is the server URL it was dialled for (None: accepted)."""

    def link_closed(self, session: LinkSession) -> None:
        """The transport closed."""

    def link_error(self, session: LinkSession) -> None:
        """Handling a message raised (not the peer's protocol error)."""

    def link_overflow(self, session: LinkSession, queued: int) -> None:
        """Too much queued for the peer: the link is being dropped."""

    def queue_cap(self, session: LinkSession | None) -> int:
        """Bytes that may be queued for ``session``'s peer."""

    def link_too_large(self, session: LinkSession, size: int, limit: int) -> None:
        """A message of ``size`` bytes is over what ``session``'s peer accepts: not sent, counted."""

#: HTTP header carrying a node's id in both directions of the WebSocket handshake.
NODE_HEADER = "x-pubsubclub-node"
#: WebSocket subprotocol name of PSC links.
SUBPROTOCOL = "pubsubclub"
#: HTTP header with the PSC URL other nodes should dial to reach the sender (peer learning, docs/protocol.md).
ADVERTISE_HEADER = "x-pubsubclub-advertise"
#: HTTP header with the PSC URLs the sender dials, space-separated (peer learning).
PEERS_HEADER = "x-pubsubclub-peers"
#: HTTP header with the largest link frame the sender accepts, in bytes (docs/protocol.md, "Message sizes").
MAX_FRAME_HEADER = "x-pubsubclub-max-frame"
#: The least a peer's ``X-PubSubClub-Max-Frame`` is taken as (the smallest ``--max-message-size``).
MIN_PEER_FRAME = 1024


def peer_max_frame(said: str | None, limits: psc.Limits) -> int:
    """The largest frame to send a peer whose handshake said ``said`` (its X-PubSubClub-Max-Frame).

    Never more than this node's own frame limit (Autobahn refuses to send more
    than it would accept). A peer that says nothing is a node from before the
    header, whose limit was its ``--max-message-size``: ours, in a cluster
    that shares one.
    """
    own = limits.max_link_frame
    if said is None or not said.isdigit() or len(said) > 12:
        return min(limits.max_message_size, own)
    return max(MIN_PEER_FRAME, min(int(said), own))

log = Logger()
_OPEN = WebSocketProtocol.STATE_OPEN


class _ClockTimer:
    """Autobahn's batched-timer interface on an injected clock: one delayed call per timer.

    ``txaio.with_config(loop=...)`` ignores its loop under Twisted (txaio has a
    single global reactor and raises if handed another one), and its batched
    timer floors every deadline to a whole second. A node has tens of links,
    not tens of thousands, so there is nothing to batch.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock

    def call_later(self, delay: float, func: Callable[..., Any], *args: Any, **kwargs: Any) -> _Timer:
        """Call ``func`` after ``delay`` seconds of the clock."""
        return _Timer(self._clock.callLater(delay, func, *args, **kwargs))


class _Timer:
    """A cancellable timer; cancelling one that already ran or was cancelled is a no-op, as in txaio."""

    def __init__(self, call: IDelayedCall) -> None:
        self._call = call

    def cancel(self) -> None:
        """Stop the timer if it is still pending."""
        if self._call.active():
            self._call.cancel()


def _bind_timers(factory: Any, clock: IReactorTime) -> None:
    """Make Autobahn's protocol timers (auto-ping, handshake timeouts) use ``clock``.

    Autobahn takes them from txaio's global loop; binding them to the injected
    clock keeps links testable with ``task.Clock`` and free of global state.
    """
    factory._batched_timer = _ClockTimer(clock)


class _LinkProtocolBase:
    """What the client and server protocols share; mixed into Autobahn's classes."""

    factory: Any
    session: LinkSession | None = None
    peer_node: str | None = None
    #: True on the listening side of a link (it was dialled in to us).
    accepted = False
    #: How far behind the peer is in taking what we send (None: transport cannot tell).
    _backlog: SendBacklog | None = None
    #: The link was dropped for queueing too much; nothing more is written.
    _overflowed = False
    #: What the peer's handshake said about the cluster: (its advertised URL, the URLs it dials).
    heard: tuple[str | None, str | None] = (None, None)
    #: The server URL this connection was dialled for; None on the listening side.
    dialled: str | None = None
    #: This reactor turn's messages waiting for one frame (0.4), their bytes with separators, and the flush call.
    _batch: list[bytes] | None = None
    _batch_bytes = 0
    _batch_call: IDelayedCall | None = None
    #: The largest frame the peer accepts (its X-PubSubClub-Max-Frame, at most ours), set once per link.
    _max_frame = psc.DEFAULT_LIMITS.max_message_size
    #: With a cluster secret, seals every frame after the proof and opens the peer's (None: plain link).
    _seal: LinkSeal | None = None
    #: With a cluster secret: the dialled URL is the listener's advertised one (both MACs say so).
    _direct = False
    #: What the peer's handshake said in X-PubSubClub-Max-Frame (None: nothing, an older node).
    _peer_said_max_frame: str | None = None

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        """Whole ordinary frames straight to ``onMessage``; everything else through Autobahn (see wsframes)."""
        receive_data(self, data)

    def _start_session(self, role: Role, peer: str) -> None:
        federation: LinkHost = self.factory.federation
        self._max_frame = peer_max_frame(self._peer_said_max_frame, federation.limits)
        self.session = LinkSession(
            role,
            self._send_text,
            federation,
            peer,
            versions=federation.versions,
            limits=federation.limits,
        )
        self.session.peer_node = self.peer_node
        self.session.direct = self._direct
        self._backlog = watch_send_buffer(self.transport, "PSC")  # type: ignore[attr-defined]
        federation.link_started(self.session, self, self.dialled)
        self.session.start()

    def _send_text(self, data: bytes) -> None:
        """Send one encoded message; on a 0.4 link, gather it into this reactor turn's batch frame."""
        if self.state != _OPEN:  # type: ignore[attr-defined]
            # Closing (a ping timed out, an overflow): the session ends with
            # the connection; until then there is nowhere to write.
            return
        if len(data) > self._max_frame:
            # More than the peer accepts (front-ends refuse what cannot fit our own
            # links, so: a peer with a smaller limit). Dropped alone, counted; the
            # batch gathered so far and the messages after it go on as usual.
            if self.session is not None:
                self.factory.federation.link_too_large(self.session, len(data), self._max_frame)
            return
        pending = self._batch
        if pending:
            # This turn's batch has begun (so the link is 0.4): most messages stop here.
            size = self._batch_bytes + 1 + len(data)
            if size <= self._max_frame:
                pending.append(data)
                self._batch_bytes = size
                return
            self._flush_batch()  # a frame never exceeds what the peer accepts
        else:
            session = self.session
            if session is None or not session.batched:
                self._write_frame(data)
                return
        self._batch = [data]
        self._batch_bytes = len(data)
        if self._batch_call is None:
            # No timer of any length: flushed when this reactor turn's work is done,
            # so a lone message leaves as soon as it would have unbatched.
            self._batch_call = self.factory.reactor.callLater(0, self._flush_batch)

    def _flush_batch(self) -> None:
        """Send the gathered messages as one frame, one per line."""
        call = self._batch_call
        if call is not None and call.active():
            call.cancel()
        self._batch_call = None
        pending = self._batch
        self._batch = None
        self._batch_bytes = 0
        if pending and self.state == _OPEN:  # type: ignore[attr-defined]
            self._write_frame(pending[0] if len(pending) == 1 else psc.BATCH_SEPARATOR.join(pending))

    def _write_frame(self, data: bytes) -> None:
        backlog = self._backlog
        if backlog is not None:
            if self._overflowed:
                return
            queued = unsent_bytes(self.transport, backlog)  # type: ignore[attr-defined]
            federation: LinkHost = self.factory.federation
            if queued > federation.queue_cap(self.session):
                # A frozen or overwhelmed peer: drop it rather than queue for it
                # without bound. A close frame would queue behind the backlog.
                # The session ends when the connection is lost (a later reactor
                # turn), never inside the delivery loop that is calling us.
                self._overflowed = True
                if self.session is not None:
                    federation.link_overflow(self.session, queued)
                self.dropConnection(abort=True)  # type: ignore[attr-defined]
                return
        seal = self._seal
        if seal is None:
            send_message(self, data, False)
        else:
            # One seal per frame (a 0.4 frame carries a turn's messages), binary on the wire.
            send_message(self, seal.seal(data), True)
        if backlog is not None:
            backlog.written(len(data))

    def round_trip(self) -> defer.Deferred[None]:
        """Fires when the peer has read everything sent on this link so far (a ping, answered in order).

        WebSocket control frames are read in order with data frames, and the
        peer handles each data frame as it reads it, so its pong comes after
        it handled our earlier messages (PSC201 included). Fires too when the
        link goes down (nothing is left to wait for there).
        """
        waiting: dict[bytes, defer.Deferred[None]] = self.__dict__.setdefault("_round_trips", {})
        self._round_trip_count = getattr(self, "_round_trip_count", 0) + 1
        key = b"psc-rt-%d" % self._round_trip_count
        done: defer.Deferred[None] = defer.Deferred()
        if self.state != WebSocketProtocol.STATE_OPEN:  # type: ignore[attr-defined]
            done.callback(None)
            return done
        waiting[key] = done
        self.sendPing(key)  # type: ignore[attr-defined]
        return done

    def onPong(self, payload: bytes) -> None:
        """A pong: fire the round trip that sent it (auto-ping pongs are Autobahn's own)."""
        done = self.__dict__.get("_round_trips", {}).pop(payload, None)
        if done is not None and not done.called:
            done.callback(None)

    def _end_round_trips(self) -> None:
        waiting = self.__dict__.pop("_round_trips", {})
        for done in waiting.values():
            if not done.called:
                done.callback(None)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        session = self.session
        if session is None or session.state is LinkState.CLOSED:
            return
        try:
            seal = self._seal
            if seal is not None:
                if not isBinary:
                    raise LinkError(CLOSE_UNAUTHENTICATED, "a text frame on a sealed link")
                try:
                    payload = seal.open(payload)
                except SealError as e:
                    raise LinkError(CLOSE_UNAUTHENTICATED, str(e)) from None
            elif isBinary:
                raise LinkError(CLOSE_BAD_MESSAGE, "binary frames are not part of the PSC protocol")
            session.receive(payload)
        except LinkError as e:
            log.warn("closing PSC link to {peer}: {reason}", peer=session.peer, reason=e.reason)
            self.close_link(e.code, e.reason)
        except Exception:
            # Only the peer's protocol error (LinkError) closes a link; a fault
            # of ours while handling a valid message costs that message only.
            log.failure("PSC link to {peer}: error handling a message; the link stays", peer=session.peer)
            self.factory.federation.link_error(session)

    def close_link(self, code: int, reason: str) -> None:
        """Close with a reason the peer can read (after the batch gathered so far); stop handling its messages."""
        self._flush_batch()
        session = self.session
        if session is not None:
            self.factory.federation.link_closed(session)
            session.close()
        self.sendClose(code, reason[:120])  # type: ignore[attr-defined]

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        session = self.session
        if session is not None:
            if session.state is not LinkState.CLOSED:
                log.info(
                    "PSC link to {peer} closed (code={code}, reason={reason})",
                    peer=session.peer,
                    code=code,
                    reason=reason,
                )
            self.factory.federation.link_closed(session)
            session.close()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        """Also cancel the close-handshake timer, which Autobahn leaves running when TCP goes first."""
        self._end_round_trips()
        call = self._batch_call
        if call is not None and call.active():
            call.cancel()
        self._batch_call = None
        self._batch = None
        super().connectionLost(reason)  # type: ignore[misc]
        call = getattr(self, "closeHandshakeTimeoutCall", None)
        if call is not None:
            call.cancel()
            self.closeHandshakeTimeoutCall = None


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
            log.warn(
                "could not link to {url}: {reason}",
                url=self.factory.url,
                reason=getattr(self, "wasNotCleanReason", None) or reason.getErrorMessage(),
            )
        super().connectionLost(reason)


def _max_frame_size(federation: LinkHost) -> int:
    """The largest WebSocket payload on a link: the link frame limit, plus the seal's tag with a secret."""
    return federation.limits.max_link_frame + (0 if federation.auth is None else SEAL_OVERHEAD)


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
