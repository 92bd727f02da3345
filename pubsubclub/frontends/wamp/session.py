"""A WAMP session's life on the router: transport contract, HELLO and authentication, GOODBYE/ABORT (sans-IO).

:class:`WampSession` is the session state machine every client connection
drives (WebSocket and RawSocket alike): HELLO (maybe CHALLENGE/AUTHENTICATE,
with the login throttle), then WELCOME or ABORT; input the transport could not
decode; the join timeout; GOODBYE and closing. Once established, it hands every
message to its subclass, :class:`~pubsubclub.frontends.wamp.broker.BrokerSession`
(pub/sub, and RPC through the node's dealer).

Authentication and authorization
    Without a policy every HELLO is welcomed as anonymous with full access
    (as before ``--auth`` existed). With an :class:`~pubsubclub.frontends.wamp.auth.AuthPolicy`
    the session runs a :class:`~pubsubclub.frontends.wamp.auth.Authenticator` (HELLO,
    maybe CHALLENGE/AUTHENTICATE, then WELCOME or ABORT) and keeps the
    :class:`~pubsubclub.frontends.wamp.auth.Role` it was welcomed with.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from autobahn.wamp import message
from autobahn.wamp.message import Message
from autobahn.wamp.role import RoleBrokerFeatures, RoleDealerFeatures
from twisted.logger import Logger

from pubsubclub.core.patterns import MATCHES
from pubsubclub.frontends.wamp.auth import (
    AUTHENTICATION_FAILED,
    NOT_AUTHORIZED,
    Authenticator,
    AuthPolicy,
    Challenge,
    Deny,
    Role,
    Welcome,
)
from pubsubclub.frontends.wamp.codec import PublishRequest
from pubsubclub.frontends.wamp.router import WampRouter
from pubsubclub.frontends.wamp.uris import MAX_ID
from pubsubclub.net.edge import handshake_done

__all__ = ["State", "WampSession", "WampTransport"]

log = Logger()

INVALID_URI = "wamp.error.invalid_uri"
NO_SUCH_REALM = "wamp.error.no_such_realm"
PROTOCOL_VIOLATION = "wamp.error.protocol_violation"
#: ABORT reason for a client that does not join within ``WampLimits.join_timeout``.
JOIN_TIMEOUT = "wamp.error.timeout"
#: ABORT reason for a HELLO or AUTHENTICATE from a source locked out after failed logins.
TOO_MANY_FAILURES = "pubsubclub.error.too_many_auth_failures"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
GOODBYE_AND_OUT = "wamp.close.goodbye_and_out"


class WampTransport(Protocol):
    """What a :class:`BrokerSession` needs from its transport.

    Autobahn's ``ITransport`` (``send``, ``close``, ``isOpen``) plus the two
    things the broker adds: how much is still unsent, and a hard drop.
    """

    def send(self, msg: Message) -> None:
        """Serialize and send one WAMP message."""

    @property
    def object_serializer(self) -> Any:
        """The connection's Autobahn object serializer (``NAME``, ``serialize(list) -> bytes``)."""

    def send_encoded(self, data: bytes) -> None:
        """Send one WAMP message already encoded with :attr:`object_serializer`."""

    def close(self) -> None:
        """Close the transport gracefully."""

    def isOpen(self) -> bool:  # noqa: N802 - Autobahn's ITransport name
        """True while messages can still be sent."""

    def unsent_bytes(self) -> int:
        """Bytes handed to the transport that the peer has not yet taken."""

    def drop(self, reason: str) -> None:
        """Abort the connection at once, logging ``reason``."""


def _peer_host(transport: Any) -> str:
    """The remote address of a WAMP transport (WebSocket or RawSocket protocol); "?" if it has none."""
    get_peer = getattr(getattr(transport, "transport", None), "getPeer", None)
    host = getattr(get_peer(), "host", None) if get_peer is not None else None
    return host if isinstance(host, str) else "?"


def _kind(msg: Message | PublishRequest) -> str:
    """The message's WAMP name (``PUBLISH``, ``HELLO``, ...) for error texts."""
    return "PUBLISH" if type(msg) is PublishRequest else type(msg).__name__.upper()


class State(enum.Enum):
    """Where a :class:`BrokerSession` is in its life."""

    #: Transport open; the first message must be HELLO.
    AWAIT_HELLO = "await_hello"
    #: CHALLENGE sent; the next message must be AUTHENTICATE.
    AWAIT_AUTHENTICATE = "await_authenticate"
    #: WELCOME sent: pub/sub allowed.
    ESTABLISHED = "established"
    #: ABORT or GOODBYE sent, or the transport is gone; input is ignored.
    CLOSED = "closed"


#: Read per message: bound once.
_ESTABLISHED = State.ESTABLISHED



class WampSession:
    """One client's WAMP session on the router, up to and after WELCOME; subclassed by the broker.

    Follows the router-side half of Autobahn's transport contract
    (``onOpen``/``onMessage``/``onClose``), as driven by
    ``autobahn.wamp.websocket.WampWebSocketProtocol``.
    """

    def __init__(self, router: WampRouter) -> None:
        self._router = router
        self._hub = router.hub
        self._limits = router.limits
        self._state = State.AWAIT_HELLO
        self._transport: WampTransport | None = None
        self._realm: str | None = None
        #: Read by Autobahn's transport for its trace logging.
        self._session_id: int | None = None
        self._authid: str | None = None
        self._authrole: str | None = None
        #: The role welcomed with; None without an auth policy (everything allowed).
        self._role: Role | None = None
        #: The joined realm's policy (router.realm_auth), once HELLO named a realm that admits someone.
        self._policy: AuthPolicy | None = None
        self._authenticator: Authenticator | None = None
        #: The client's address (the login throttle counts failures per source).
        self._source = "?"
        #: Ends a session that has not joined within ``limits.join_timeout``.
        self._join_timer: Any = None
        #: Its HELLO announced callee call canceling: the dealer may send it INTERRUPT.
        self._interruptible = False

    @property
    def session_id(self) -> int | None:
        """The WAMP session id (drawn at HELLO; the session is up once WELCOME was sent)."""
        return self._session_id

    @property
    def realm(self) -> str | None:
        """The realm joined, once WELCOME was sent."""
        return self._realm

    @property
    def role(self) -> Role | None:
        """The role this session was welcomed with (None without an auth policy)."""
        return self._role

    @property
    def router(self) -> WampRouter:
        """The node's router this session belongs to."""
        return self._router

    @property
    def authid(self) -> str | None:
        """The authid welcomed with (None: anonymous without an auth policy)."""
        return self._authid

    @property
    def authrole(self) -> str | None:
        """The authrole welcomed with (``anonymous`` without an auth policy); None before WELCOME."""
        return self._authrole

    # -- Autobahn's router-side transport contract ----------------------------

    def onOpen(self, transport: WampTransport) -> None:  # noqa: N802 - Autobahn API
        """The transport is up: wait for HELLO."""
        self._transport = transport
        self._source = _peer_host(transport)
        self._router.sessions[self] = None
        if self._router.call_later is not None:
            self._join_timer = self._router.call_later(self._limits.join_timeout, self._join_timed_out)

    def _join_timed_out(self) -> None:
        self._join_timer = None
        if self._state in (State.AWAIT_HELLO, State.AWAIT_AUTHENTICATE):
            text = f"no WELCOME within {self._limits.join_timeout:g} s of connecting (HELLO or AUTHENTICATE missing)"
            log.info("WAMP session closed: {text}", text=text)
            self.abort(JOIN_TIMEOUT, text)

    def _cancel_join_timer(self) -> None:
        timer, self._join_timer = self._join_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def onClose(self, wasClean: bool) -> None:  # noqa: N802, N803 - Autobahn API
        """The transport is gone: drop every subscription."""
        log.debug(
            "WAMP session {session} closed (clean={clean})",
            session=self._session_id,
            clean=wasClean,
        )
        self._end()
        self._transport = None
        self._router.sessions.pop(self, None)

    def onMessage(self, msg: Message | PublishRequest) -> None:  # noqa: N802 - Autobahn API
        """Handle one decoded WAMP message; never raises."""
        try:
            if type(msg) is PublishRequest and self._state is _ESTABLISHED:
                self._on_publish(msg)  # the hot path (_dispatch's first case, without its call)
            else:
                self._dispatch(msg)
        except Exception:
            self.internal_error(type(msg).__name__)

    def internal_error(self, msg_type: str) -> None:
        """Handling a ``msg_type`` message raised (called in its ``except``): log it, ABORT and close."""
        log.failure(
            "WAMP session {session}: internal error handling {msg_type}",
            session=self._session_id,
            msg_type=msg_type,
        )
        self.abort(PROTOCOL_VIOLATION, "internal error while handling the message")

    # -- called by the transport for input it could not decode ----------------

    def protocol_violation(self, problem: str) -> None:
        """The peer sent something that is not valid WAMP: ABORT and close."""
        log.info(
            "WAMP session {session}: protocol violation: {problem}",
            session=self._session_id,
            problem=problem,
        )
        self.abort(PROTOCOL_VIOLATION, problem)

    def invalid_uri(self, raw: Any, problem: str) -> None:
        """A message was well-formed except for a URI Autobahn refused to parse.

        ``raw`` is the undecoded message list when the transport could get it.
        SUBSCRIBE (and acknowledged PUBLISH) get ERROR ``wamp.error.invalid_uri``
        as the spec asks; anything else is a protocol violation.
        """
        if self._state is State.ESTABLISHED and isinstance(raw, list) and len(raw) >= 3:
            msg_type, request, options = raw[0], raw[1], raw[2]
            if isinstance(request, int) and 0 < request <= MAX_ID:
                if msg_type == message.Subscribe.MESSAGE_TYPE:
                    self._error(message.Subscribe.MESSAGE_TYPE, request, INVALID_URI, problem)
                    return
                if msg_type == message.Publish.MESSAGE_TYPE:
                    if isinstance(options, dict) and options.get("acknowledge") is True:
                        self._error(message.Publish.MESSAGE_TYPE, request, INVALID_URI, problem)
                    return
        self.protocol_violation(problem)

    def unparsable(self, raw: Any, problem: str) -> None:
        """A message Autobahn refused to parse (its ``ProtocolError``).

        A SUBSCRIBE whose match policy is unknown (Autobahn refuses it while
        parsing) gets ERROR ``wamp.error.invalid_argument``, as the spec asks
        of a broker for an option it does not support; anything else is a
        protocol violation.
        """
        if self._state is State.ESTABLISHED and isinstance(raw, list) and len(raw) == 4:
            msg_type, request, options = raw[0], raw[1], raw[2]
            if (
                msg_type == message.Subscribe.MESSAGE_TYPE
                and type(request) is int
                and 0 < request <= MAX_ID
                and isinstance(options, dict)
                and options.get("match", message.Subscribe.MATCH_EXACT) not in (message.Subscribe.MATCH_EXACT, *MATCHES)
            ):
                match = str(options["match"])[:40]
                text = f"unknown match policy {match!r}; this broker offers exact, prefix, wildcard"
                self._error(message.Subscribe.MESSAGE_TYPE, request, INVALID_ARGUMENT, text)
                return
        self.protocol_violation(problem)


    # -- closing ---------------------------------------------------------------

    # -- closing ---------------------------------------------------------------

    def goodbye(self, reason: str, text: str) -> None:
        """End an established session from the router's side (GOODBYE), or just close it."""
        if self._state is State.ESTABLISHED:
            self._send(message.Goodbye(reason, text))
        self._end()
        self._close_transport()

    def abort(self, reason: str, text: str) -> None:
        """Send ABORT ``reason`` with ``text``, then close the transport."""
        self._send(message.Abort(reason, text))
        self._end()
        self._close_transport()

    def _end(self) -> None:
        self._cancel_join_timer()
        if self._state is State.CLOSED:
            return
        # The meta API hears of established sessions only (meta.py): subscriptions' events, then on_leave.
        meta = self._router.meta if self._state is State.ESTABLISHED else None
        self._state = State.CLOSED
        if meta is not None:
            meta.leaving(self)  # type: ignore[arg-type]
        self._router.dealer.left(self)
        self._left()
        if meta is not None:
            meta.left(self)  # type: ignore[arg-type]

    def _left(self) -> None:
        """The session ended: drop what it holds (the broker's subscriptions)."""

    def _close_transport(self) -> None:
        transport = self._transport
        if transport is not None and transport.isOpen():
            transport.close()

    def _send(self, msg: Message) -> None:
        transport = self._transport
        if transport is not None and transport.isOpen():
            transport.send(msg)

    def send_message(self, msg: Message) -> None:
        """Send one message to this session's client (the dealer's view of a session)."""
        self._send(msg)

    def send_if_fits(self, msg: Message) -> tuple[int, int] | None:
        """Send ``msg`` if it fits this session's message-size limit: None; else ``(size, limit)`` and nothing sent.

        The limit is the node's ``max-message-size``, or less when the client
        said it takes less (a RawSocket client's handshake); a message over it
        would make the client (or the transport) end the session.
        """
        transport = self._transport
        if transport is None or not transport.isOpen():
            return None
        data = transport.object_serializer.serialize(msg.marshal())
        limit = self._limits.max_message_size
        client = getattr(transport, "max_send_size", None)
        if client:
            limit = min(limit, client)
        if len(data) > limit:
            return len(data), limit
        transport.send_encoded(data)
        return None

    def _error(self, request_type: int, request: int, uri: str, text: str) -> None:
        self._send(message.Error(request_type, request, uri, args=[text]))

    def _refuse(self, request_type: int, request: int, uri: str, text: str, limit: str, value: int) -> None:
        """ERROR for a request refused past a limit: ``args`` a sentence, ``kwargs`` the limit's name and value."""
        log.debug("WAMP session {session}: refused: {text}", session=self._session_id, text=text)
        self._router.refused(uri.rsplit(".", 1)[-1])
        self._send(message.Error(request_type, request, uri, args=[text], kwargs={"limit": limit, "max": value}))

    # -- dispatch ----------------------------------------------------------------

    def _dispatch(self, msg: Message | PublishRequest) -> None:
        state = self._state
        if type(msg) is PublishRequest and state is State.ESTABLISHED:
            # The hot path: a PUBLISH the codec decoded without an Autobahn Message.
            self._on_publish(msg)
            return
        if state is State.CLOSED:
            return
        if isinstance(msg, message.Abort):
            # The peer gave up; nothing to answer.
            log.info(
                "WAMP session {session} aborted by peer: {reason}",
                session=self._session_id,
                reason=msg.reason,
            )
            self._end()
            self._close_transport()
        elif state is State.AWAIT_HELLO:
            if isinstance(msg, message.Hello):
                self._on_hello(msg)
            else:
                self.protocol_violation(f"{_kind(msg)} received before the session was established")
        elif state is State.AWAIT_AUTHENTICATE:
            if isinstance(msg, message.Authenticate):
                self._on_authenticate(msg)
            else:
                self.protocol_violation(f"{_kind(msg)} received while AUTHENTICATE was expected")
        elif isinstance(msg, message.Goodbye):
            self._on_goodbye(msg)
        else:
            self._established(msg)

    def _on_publish(self, msg: PublishRequest) -> None:
        """PUBLISH, once established (the broker's)."""
        raise NotImplementedError

    def _established(self, msg: Message | PublishRequest) -> None:
        """Any other message once established (the broker's)."""
        raise NotImplementedError

    def _on_hello(self, msg: message.Hello) -> None:
        realm = msg.realm if msg.realm is not None else self._router.realms[0]
        if realm not in self._router.realms:
            log.info("WAMP HELLO for unknown realm {realm!r}", realm=realm)
            self.abort(NO_SUCH_REALM, f"no realm {realm!r} on this router")
            return
        self._realm = realm
        self._session_id = self._router.new_id()
        callee = (msg.roles or {}).get("callee")
        self._interruptible = bool(getattr(callee, "call_canceling", False))
        if self._router.auth is None:
            self._welcome(None, "anonymous", "anonymous", None)
            return
        policy = self._policy = self._router.realm_auth[realm]
        if policy is None:
            text = f"realm {realm!r} admits nobody: the --auth file has no [realms.{realm}] table"
            log.info("WAMP session {session} refused: {text}", session=self._session_id, text=text)
            self.abort(NOT_AUTHORIZED, text)
            return
        self._authenticator = Authenticator(policy, random_bytes=self._router.random_bytes, clock=self._router.clock)
        self._answer(self._authenticator.hello(msg.authmethods, msg.authid, msg.authextra, self._session_id))

    def _on_authenticate(self, msg: message.Authenticate) -> None:
        assert self._authenticator is not None
        if self._locked_out():
            return  # checked again here: a guesser may hold many challenges open at once
        outcome = self._authenticator.authenticate(msg.signature, msg.extra)
        throttle = self._router.login_throttle
        if throttle is not None and isinstance(outcome, Deny) and outcome.reason == AUTHENTICATION_FAILED:
            throttle.failed(self._source)
        self._answer(outcome)

    def _locked_out(self) -> bool:
        """ABORT if this client's address is locked out after failed logins; True if it was."""
        throttle = self._router.login_throttle
        left = 0.0 if throttle is None else throttle.locked(self._source)
        if left <= 0.0:
            return False
        text = f"too many failed logins from {self._source}: try again in {left:.1f} s"
        log.info("WAMP session {session} refused: {text}", session=self._session_id, text=text)
        self.abort(TOO_MANY_FAILURES, text)
        return True

    def _answer(self, outcome: Welcome | Challenge | Deny) -> None:
        """Carry out the authenticator's answer: WELCOME, CHALLENGE or ABORT."""
        if isinstance(outcome, Challenge):
            if self._locked_out():
                return
            self._state = State.AWAIT_AUTHENTICATE
            self._send(message.Challenge(outcome.method, dict(outcome.extra)))
        elif isinstance(outcome, Deny):
            log.info(
                "WAMP session {session} refused: {reason}: {text}",
                session=self._session_id,
                reason=outcome.reason,
                text=outcome.message,
            )
            self.abort(outcome.reason, outcome.message)
        else:
            assert self._policy is not None
            self._role = self._policy.role(outcome.authrole)
            self._welcome(outcome.authid, outcome.authrole, outcome.authmethod, outcome.authprovider)

    def _welcome(self, authid: str | None, authrole: str, authmethod: str, authprovider: str | None) -> None:
        self._authenticator = None
        self._authid = authid
        self._authrole = authrole
        self._state = State.ESTABLISHED
        self._cancel_join_timer()
        # Joined: the connection layer's handshake deadline no longer applies (pubsubclub.net.edge).
        handshake_done(getattr(self._transport, "transport", None))
        self._send(
            message.Welcome(
                session=self._session_id,
                roles={
                    "broker": RoleBrokerFeatures(
                        publisher_exclusion=True,
                        pattern_based_subscription=True,
                        subscriber_blackwhite_listing=True,
                        publisher_identification=True,
                        event_retention=True,
                    ),
                    "dealer": RoleDealerFeatures(
                        caller_identification=True,
                        call_timeout=True,
                        progressive_call_results=True,
                        call_canceling=True,
                        shared_registration=True,
                        pattern_based_registration=True,
                    ),
                },
                realm=self._realm,
                authid=authid,
                authrole=authrole,
                authmethod=authmethod,
                authprovider=authprovider,
            )
        )
        self._router.meta.joined(self, authmethod, authprovider)  # type: ignore[arg-type]
        log.debug(
            "WAMP session {session} joined realm {realm} as {authid} ({authrole}, {authmethod})",
            session=self._session_id,
            realm=self._realm,
            authid=authid,
            authrole=authrole,
            authmethod=authmethod,
        )

    def _on_goodbye(self, msg: message.Goodbye) -> None:
        log.debug(
            "WAMP session {session} said goodbye: {reason}",
            session=self._session_id,
            reason=msg.reason,
        )
        self._send(message.Goodbye(reason=GOODBYE_AND_OUT))
        self._end()
        self._close_transport()

