"""PubSubClub links over Autobahn WebSocket: what both sides of a link share.

Three modules, one link: here the shared part (:class:`LinkHost`, what the
transport asks of the federation; the handshake headers; the injected-clock
timers; ``_LinkProtocolBase``, the link protocol both sides mix into Autobahn's
classes), :mod:`pubsubclub.federation.linkserver` the listening side
(:class:`PSCServerProtocol`, :class:`PSCServerFactory`: the upgrade, the
cluster-secret challenge and its proof) and :mod:`pubsubclub.federation.linkclient`
the dialling side (:class:`PSCClientProtocol`, :class:`PSCClientFactory`). The four
stay importable from here, looked up when asked (both modules import this one).

Parsing and protocol rules live in :mod:`pubsubclub.federation.session`; the
transport only moves bytes, learns the peer's node id from the handshake headers,
carries the cluster-secret proofs that :mod:`pubsubclub.federation.auth` makes
and checks, and turns :class:`~pubsubclub.federation.session.LinkError` into a close frame
with a reason. Nothing else closes a link: any other error while handling a
message is logged and counted, and the link stays.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from autobahn.websocket.protocol import WebSocketProtocol
from autobahn.websocket.types import ConnectionRequest
from twisted.application._client_service import _ReconnectingProtocolProxy
from twisted.internet import defer
from twisted.internet.endpoints import _WrappingProtocol
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure

from pubsubclub.federation import psc
from pubsubclub.federation.auth import (
    Challenge,
    LinkAuth,
    Refusal,
)
from pubsubclub.federation.seal import SEAL_OVERHEAD, LinkSeal, SealError
from pubsubclub.federation.session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_UNAUTHENTICATED,
    LinkError,
    LinkOwner,
    LinkSession,
    LinkState,
    Role,
)
from pubsubclub.net import wsframes
from pubsubclub.net.edge import EdgeConnection, unsent_bytes
from pubsubclub.net.reactor import turn_end_hook
from pubsubclub.net.sendbuffer import SendBacklog, watch_send_buffer
from pubsubclub.net.wsframes import _FIN_TEXT, _LONG, _MEDIUM, receive_data, send_message


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

    def link_failed(self, url: str, reason: str, connected: bool = False) -> None:
        """Dialling ``url`` failed: log ``reason`` with a hint (federation/hints.py)."""

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

    def pong_hold(self, session: LinkSession) -> defer.Deferred[Any] | None:
        """What a round trip's pong on ``session`` waits for (a relaying primary's relayed announcements), or None."""


#: How this node's round-trip pings begin (a peer's auto-pings are never held, only these).
ROUND_TRIP_PING = b"psc-rt-"
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
#: Read per message received: bound once, as a member read off its enum class goes through EnumType.__getattr__'s
#: slot (a few hundred instructions).
_CLOSED = LinkState.CLOSED


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
    #: This reactor turn's messages waiting for one frame (0.4), their bytes with separators.
    _batch: list[bytes] | None = None
    _batch_bytes = 0
    #: A flush is asked for at this reactor turn's end (pubsubclub.net.reactor).
    _batch_due = False
    #: How this link asks for the end of a turn: turn_end_hook(factory.reactor), made at the first batch.
    _ask_turn_end: Callable[[Callable[[], None]], None] | None = None
    #: The largest frame the peer accepts (its X-PubSubClub-Max-Frame, at most ours), set once per link.
    _max_frame = psc.DEFAULT_LIMITS.max_message_size
    #: With a cluster secret, seals every frame after the proof and opens the peer's (None: plain link).
    _seal: LinkSeal | None = None
    #: With a cluster secret: the dialled URL is the listener's advertised one (both MACs say so).
    _direct = False
    #: What the peer's handshake said in X-PubSubClub-Max-Frame (None: nothing, an older node).
    _peer_said_max_frame: str | None = None

    #: Twisted's ``dataReceived(data)``: whole ordinary frames straight to ``onMessage``, everything else through
    #: Autobahn (see wsframes); the function itself, without a method calling it (an accepted link's every read).
    dataReceived = receive_data  # noqa: N815 - Twisted API

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
        if not self._batch_due:
            # No timer of any length: flushed when this reactor turn's work is done,
            # so a lone message leaves as soon as it would have unbatched.
            self._batch_due = True
            ask = self._ask_turn_end
            if ask is None:
                ask = self._ask_turn_end = turn_end_hook(self.factory.reactor)
            ask(self._turn_ended)  # at_turn_end(reactor, ...), without its calls

    def _turn_ended(self) -> None:
        # _flush_batch, without its call (once per turn a link sent in).
        self._batch_due = False
        pending = self._batch
        self._batch = None
        self._batch_bytes = 0
        if not pending or self.state != _OPEN:  # type: ignore[attr-defined]
            return
        data = pending[0] if len(pending) == 1 else psc.BATCH_SEPARATOR.join(pending)
        # _write_frame, send_message and EdgeConnection.write, without their calls, for the usual frame: a listener's
        # link (a guarded TCP connection; messages flow from the listening node), plain, nothing queued, a frame
        # send_message would write itself. Anything else is _write_frame's.
        edge: Any = self.transport  # type: ignore[attr-defined]
        backlog = self._backlog
        buffer = edge._buffer if type(edge) is EdgeConnection else None
        options: Any = self
        length = len(data)
        if (
            buffer is None
            or backlog is None
            or self._overflowed
            or self._seal is not None
            or edge.closing
            or len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen
            or wsframes._held
            or not options.factory.isServer
            or options.maskServerFrames
            or options._perMessageCompress is not None
            or options.trackedTimings
            or options.logFrames
            or options.send_queue
            or 0 < options.autoFragmentSize < length
        ):
            self._write_frame(data)
            return
        if length <= 125:
            frame = bytes((_FIN_TEXT, length)) + data
        elif length <= 0xFFFF:
            frame = _MEDIUM(_FIN_TEXT, 126, length) + data
        else:
            frame = _LONG(_FIN_TEXT, 127, length) + data
        stats = options.trafficStats
        stats.outgoingWebSocketMessages += 1
        stats.outgoingOctetsAppLevel += length
        stats.outgoingOctetsWebSocketLevel += length
        stats.outgoingWebSocketFrames += 1
        edge.transport.write(frame)
        cap = edge._cap
        if cap and len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen > cap:
            edge._slow_consumer()
        stats.outgoingOctetsWireLevel += len(frame)
        if backlog.paused:  # SendBacklog.written, without its call
            backlog.since_pause += length

    def _flush_batch(self) -> None:
        """Send the gathered messages as one frame, one per line."""
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
            transport = self.transport  # type: ignore[attr-defined]
            if type(transport) is EdgeConnection:
                # EdgeConnection.unsent, without its call (a guarded connection: every listener's).
                buffer = transport._buffer
                if buffer is None or transport.closing:
                    queued = 0
                else:
                    queued = len(buffer.dataBuffer) - buffer.offset + buffer._tempDataLen
            else:
                queued = unsent_bytes(transport, backlog)
            federation: LinkHost = self.factory.federation
            # Nothing queued is never over a cap (a cap is at least 0): the usual frame asks no cap.
            if queued and queued > federation.queue_cap(self.session):
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
        if backlog is not None and backlog.paused:  # SendBacklog.written, without its call
            backlog.since_pause += len(data)

    def queued(self) -> int:
        """Bytes written to this link and not yet taken by the peer (what the queue cap measures)."""
        backlog = self._backlog
        return 0 if backlog is None else unsent_bytes(self.transport, backlog)  # type: ignore[attr-defined]

    def round_trip(self) -> defer.Deferred[None]:
        """Fires when the peer has read everything sent on this link so far (a ping, answered in order).

        WebSocket control frames are read in order with data frames, and the
        peer handles each data frame as it reads it, so its pong comes after
        it handled our earlier messages (PSC201 included). Fires too when the
        link goes down (nothing is left to wait for there).
        """
        waiting: dict[bytes, defer.Deferred[None]] = self.__dict__.setdefault("_round_trips", {})
        self._round_trip_count = getattr(self, "_round_trip_count", 0) + 1
        key = ROUND_TRIP_PING + b"%d" % self._round_trip_count
        done: defer.Deferred[None] = defer.Deferred()
        if self.state != WebSocketProtocol.STATE_OPEN:  # type: ignore[attr-defined]
            done.callback(None)
            return done
        waiting[key] = done
        # This turn's batch first: the ping must follow what was sent before it, not overtake it.
        self._flush_batch()
        self.sendPing(key)  # type: ignore[attr-defined]
        return done

    def onPing(self, payload: bytes) -> None:  # noqa: N802 - Autobahn API
        """A peer's round trip is answered once what it sent us has gone on as far as it must (relaying primary)."""
        session = self.session
        if session is not None and payload.startswith(ROUND_TRIP_PING):
            hold = getattr(self.factory.federation, "pong_hold", None)
            held = None if hold is None else hold(session)
            if held is not None:
                held.addBoth(lambda _: self._pong(payload))
                return
        self._pong(payload)

    def _pong(self, payload: bytes) -> None:
        super().onPing(payload)  # type: ignore[misc]

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
        if session is None or session.state is _CLOSED:
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
        self._batch = None
        super().connectionLost(reason)  # type: ignore[misc]
        call = getattr(self, "closeHandshakeTimeoutCall", None)
        if call is not None:
            call.cancel()
            self.closeHandshakeTimeoutCall = None


def read_past_wrappers(protocol: _LinkProtocolBase) -> None:
    """Let the transport hand a dialled link's reads straight to ``protocol``, past the forwarding layers.

    A dialled connection's reads pass the endpoint's ``_WrappingProtocol`` and
    ``ClientService``'s proxy (its ``__getattr__``), two calls per read that
    only forward. The wrapper's ``dataReceived`` becomes the link's own read
    (an instance attribute, so a read is one call fewer still); everything
    else (``connectionLost`` and the reconnect it notifies) still goes through
    both. Nothing changes for a wrapping this does not recognise (TLS reads
    reach the inner wrapper, found through the TLS protocol).
    """
    transport = protocol.transport  # type: ignore[attr-defined]
    read: Any = protocol.dataReceived
    if getattr(read, "__func__", None) is _LinkProtocolBase.dataReceived:
        read = partial(receive_data, protocol)
    for outer in (getattr(transport, "wrappedProtocol", None), getattr(transport, "protocol", None)):
        if type(outer) is _WrappingProtocol:
            inner = outer._wrappedProtocol
            if inner is protocol or (type(inner) is _ReconnectingProtocolProxy and inner._protocol is protocol):
                outer.dataReceived = read  # type: ignore[method-assign]
                return


def _max_frame_size(federation: LinkHost) -> int:
    """The largest WebSocket payload on a link: the link frame limit, plus the seal's tag with a secret."""
    return federation.limits.max_link_frame + (0 if federation.auth is None else SEAL_OVERHEAD)


#: The names of the two sides, by their old path: name -> module that defines it.
_SIDES = {
    "PSCServerProtocol": "pubsubclub.federation.linkserver",
    "PSCServerFactory": "pubsubclub.federation.linkserver",
    "PSCClientProtocol": "pubsubclub.federation.linkclient",
    "PSCClientFactory": "pubsubclub.federation.linkclient",
}


def __getattr__(name: str) -> Any:
    """The protocols and factories of both sides by their old path (their modules import this one)."""
    module = _SIDES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
