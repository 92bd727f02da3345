"""The WAMP v2 broker: router-side sessions that plug WAMP clients into the hub.

Modern Autobahn ships only client roles, so the broker is ours. It speaks the
Broker role of the WAMP Basic Profile: HELLO/WELCOME/ABORT/GOODBYE,
SUBSCRIBE/SUBSCRIBED, UNSUBSCRIBE/UNSUBSCRIBED, PUBLISH/PUBLISHED, EVENT and
ERROR, plus the Advanced Profile's pattern-based subscriptions (``match:
"prefix"`` and ``"wildcard"``; see "Patterns" below). The session also
hands REGISTER/UNREGISTER/CALL/YIELD to the Dealer
(pubsubclub/frontends/wamp/dealer.py), which reaches callees on other nodes over PSC 0.7.

Realms and topics
    The router serves a fixed list of realms. The *first* realm maps WAMP
    topic ``t`` to hub topic ``t``; every other realm ``r`` maps it to hub
    topic ``f"$realm.{r}#{t}"``. Topics starting with ``$`` are reserved for the
    cluster's own use (no front-end accepts them from clients), so the
    mapping never collides. :func:`hub_topic` is the one place that does this.

Patterns
    A prefix or wildcard SUBSCRIBE becomes a hub pattern
    (:class:`~pubsubclub.core.patterns.Pattern`) under the same realm mapping as
    topics (:func:`hub_pattern`), so a pattern of one realm never matches
    another realm's topics. One subscription id per (match, pattern),
    broker-wide, like exact ones; its EVENTs carry the concrete WAMP topic in
    ``details.topic``. A session subscribed to a topic several ways gets one
    EVENT per matching subscription, as WAMP asks.

Payloads
    A PUBLISH with exactly one positional argument and no keyword arguments
    becomes an envelope whose payload is that argument, so WAMP, the cluster
    and the other front-ends all see the plain value. Any other shape
    becomes ``{"args": [...], "kwargs": {...}}`` with
    ``Envelope.wamp_wrapped`` set. On delivery a wrapped envelope is unpacked
    back into EVENT args/kwargs; anything else is sent as ``args=[payload]``.

Authentication and authorization
    Without a policy every HELLO is welcomed as anonymous with full access
    (as before ``--auth`` existed). With an :class:`~pubsubclub.frontends.wamp.auth.AuthPolicy`
    the session runs a :class:`~pubsubclub.frontends.wamp.auth.Authenticator` (HELLO,
    maybe CHALLENGE/AUTHENTICATE, then WELCOME or ABORT) and keeps the
    :class:`~pubsubclub.frontends.wamp.auth.Role` it was welcomed with; SUBSCRIBE and
    PUBLISH on a hub topic outside the role's prefixes get ERROR
    ``wamp.error.not_authorized`` (a PUBLISH only when acknowledged, as for
    every refused publish) and nothing is delivered or forwarded.

Hot path
    A plainly valid PUBLISH reaches the session as a
    :class:`~pubsubclub.frontends.wamp.codec.PublishRequest`, without an Autobahn
    ``Message`` (``codec.decode``). Subscription ids are broker-wide per hub
    topic (every session subscribed to a topic gets the same id), so one
    EVENT serves every recipient of an envelope: its bytes are encoded once
    per wire format and subscription id, memoised in ``envelope.wire`` under
    ``(serializer name, subscription id)``, and handed to each transport's
    ``send_encoded``.

Why one long module: it is the whole broker role (session state machine,
subscriptions, publish, realms); splitting it would spread one state machine
over files.
"""

from __future__ import annotations

import enum
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autobahn.wamp import message
from autobahn.wamp.message import Message
from autobahn.wamp.role import RoleBrokerFeatures, RoleDealerFeatures
from twisted.logger import Logger

from pubsubclub.core.compaction import Compaction
from pubsubclub.core.counters import DropReason, Kind, Source
from pubsubclub.core.hub import GAP_TOPIC, Envelope, Hub, LimitExceeded
from pubsubclub.core.jsonbounds import DEFAULT_BOUNDS, JSONBounds
from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.core.metrics import payload_size
from pubsubclub.core.patterns import MATCHES, PREFIX, Pattern
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
from pubsubclub.frontends.wamp.codec import PUBLISH, PublishRequest, event_message
from pubsubclub.frontends.wamp.dealer import Dealer
from pubsubclub.net.edge import handshake_done

__all__ = [
    "BrokerSession",
    "WampLimits",
    "WampRouter",
    "UriCheck",
    "WampTransport",
    "hub_pattern",
    "hub_topic",
    "uri_problem",
]

log = Logger()

#: Largest WAMP id (the spec's 2**53); ids are drawn from 1..MAX_ID.
MAX_ID = 2**53
#: ``envelope.wire`` key of the WAMP publication id, drawn once per envelope.
PUBLICATION = "wamp.publication"

INVALID_URI = "wamp.error.invalid_uri"
NO_SUCH_REALM = "wamp.error.no_such_realm"
NO_SUCH_SUBSCRIPTION = "wamp.error.no_such_subscription"
PROTOCOL_VIOLATION = "wamp.error.protocol_violation"
#: ABORT reason for a client that does not join within ``WampLimits.join_timeout``.
JOIN_TIMEOUT = "wamp.error.timeout"
#: ABORT reason for a HELLO or AUTHENTICATE from a source locked out after failed logins.
TOO_MANY_FAILURES = "pubsubclub.error.too_many_auth_failures"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
#: ERROR for a PUBLISH that could not reach other nodes for its size (docs/protocol.md, "Message sizes").
PAYLOAD_SIZE_EXCEEDED = "wamp.error.payload_size_exceeded"
#: Taken as a PUBLISH's size when its transport did not measure it: always checked.
_UNMEASURED = 1 << 62
GOODBYE_AND_OUT = "wamp.close.goodbye_and_out"
TOO_MANY_SUBSCRIPTIONS = "pubsubclub.error.too_many_subscriptions"
#: SUBSCRIBE to a new topic past the node's ``max-subscribed-topics``.
TOO_MANY_TOPICS = "pubsubclub.error.too_many_topics"
#: A prefix or wildcard SUBSCRIBE of a new pattern past the node's pattern cap (``max-patterns-per-peer``).
TOO_MANY_PATTERNS = "pubsubclub.error.too_many_patterns"
#: The router's meta event for lost cross-node messages (docs/protocol.md, "Gap reports").
GAP_EVENT_TOPIC = "wamp.pubsubclub.gap"

#: WAMP meta topics the router publishes itself -> their reserved hub topics (the same in every realm).
#: Clients may subscribe to them; publishing to ``wamp.*`` is refused, so they cannot be forged.
META_TOPICS = {GAP_EVENT_TOPIC: GAP_TOPIC}

#: Strict WAMP URI (spec: "URIs"): lower-case letters, digits and ``_`` in
#: non-empty dot-separated components.
# The WAMP spec's loose URI rule: dot-separated non-empty components without
# whitespace, '.' or '#'. Loose, not strict, because the topic space is shared
# with NSD channels and TEP channels, whose names are not lower-case URIs.
_LOOSE_URI = re.compile(r"^([^\s\.#]+\.)*[^\s\.#]+$")
#: Pattern URIs (WAMP spec, "Pattern-based Subscriptions"): a prefix may end
#: with '.', a wildcard may have empty components anywhere.
_PATTERN_URI = {
    "prefix": re.compile(r"^([^\s\.#]+\.)*[^\s\.#]*$"),
    "wildcard": re.compile(r"^(([^\s\.#]+\.)|\.)*[^\s\.#]*$"),
}


@dataclass(frozen=True)
class WampLimits:
    """Hard limits applied to every WAMP client."""

    #: Largest WebSocket frame or message accepted, in bytes (else close 1009).
    max_message_size: int = 1024 * 1024
    #: Longest topic URI accepted, in characters.
    max_uri_length: int = 512
    #: Subscriptions one session may hold at once (``[wamp] max-subscriptions``).
    max_subscriptions_per_session: int = 1000
    #: Registrations one session may hold at once (``[wamp] max-registrations``).
    max_registrations_per_session: int = 1000
    #: Registrations the node may hold, all sessions together (``[wamp] max-registrations-per-node``).
    max_registrations: int = 50_000
    #: RPC calls the node may have in flight, all callers together (``[wamp] max-calls-per-node``).
    max_calls: int = 10_000
    #: Unsent bytes queued for one client before it is dropped as too slow.
    max_send_buffer: int = 16 * 1024 * 1024
    #: Depth, integer range, floats and strings of every message (docs/security.md).
    json: JSONBounds = DEFAULT_BOUNDS
    #: Seconds a client connection may take from TCP accept to WELCOME (WebSocket
    #: upgrade, RawSocket handshake, HELLO and any authentication), else it is closed.
    join_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not isinstance(self.join_timeout, (int, float)) or not self.join_timeout > 0:
            raise ValueError(f"WampLimits.join_timeout must be a positive number, not {self.join_timeout!r}")
        for name in (
            "max_message_size",
            "max_uri_length",
            "max_subscriptions_per_session",
            "max_registrations_per_session",
            "max_registrations",
            "max_calls",
            "max_send_buffer",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"WampLimits.{name} must be a positive int, not {value!r}")


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


def hub_topic(realm: str, topic: str, default_realm: str) -> str:
    """The hub topic for WAMP ``topic`` in ``realm`` (see module docstring)."""
    meta = META_TOPICS.get(topic)
    if meta is not None:
        return meta
    if realm == default_realm:
        return topic
    return f"$realm.{realm}#{topic}"


def hub_pattern(realm: str, match: str, uri: str, default_realm: str) -> Pattern:
    """The hub pattern for WAMP pattern ``uri`` in ``realm``: mapped like a topic, so it stays in its realm."""
    return Pattern(match, uri if realm == default_realm else f"$realm.{realm}#{uri}")


def wamp_topic(realm: str, topic: str, default_realm: str) -> str:
    """The WAMP topic a client of ``realm`` knows for hub ``topic`` (the inverse of :func:`hub_topic`)."""
    if realm == default_realm:
        return topic
    return topic.removeprefix(f"$realm.{realm}#")


def pattern_problem(match: str, uri: str, max_length: int) -> str | None:
    """Why ``uri`` is not an acceptable prefix or wildcard pattern, or None if it is."""
    if len(uri) > max_length:
        return f"URI is {len(uri)} characters long; the limit is {max_length}"
    if not uri:
        return f"an empty {match} pattern is not allowed (it would match every topic)"
    if uri.startswith("$"):
        return f"URI {uri!r:.80} is reserved: topics starting with '$' are the cluster's own"
    if not uri.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in uri):
        return f"URI {uri!r:.80} holds a lone surrogate, which is not valid Unicode text"
    if not _PATTERN_URI[match].fullmatch(uri):
        shape = "components" if match == PREFIX else "components or empty ones"
        return f"URI {uri!r:.80} is not a WAMP {match} pattern (dot-separated non-empty {shape}, no whitespace or '#')"
    return None


def uri_problem(uri: str, max_length: int) -> str | None:
    """Why ``uri`` is not an acceptable (loose) WAMP URI, or None if it is."""
    if len(uri) > max_length:
        return f"URI is {len(uri)} characters long; the limit is {max_length}"
    if uri.startswith("$"):
        return f"URI {uri!r:.80} is reserved: topics starting with '$' are the cluster's own"
    if not uri.isascii() and any(0xD800 <= ord(c) <= 0xDFFF for c in uri):
        return f"URI {uri!r:.80} holds a lone surrogate, which is not valid Unicode text"
    if not _LOOSE_URI.fullmatch(uri):
        return f"URI {uri!r:.80} is not a WAMP URI (dot-separated non-empty components without whitespace or '#')"
    return None


#: Good URIs a router remembers (``UriCheck``); past it the oldest is forgotten first.
URI_CACHE_SIZE = 4096


class UriCheck:
    """:func:`uri_problem` for one length limit, with the URIs found good remembered.

    A client publishes on the same few topics over and over; the check
    (length, reserved prefix, surrogates, a regular expression) ran for each
    PUBLISH. Only good URIs are kept, at most ``size`` (oldest first out), and
    nothing else decides the answer, so nothing is ever stale.
    """

    def __init__(self, max_length: int, size: int = URI_CACHE_SIZE) -> None:
        self.max_length = max_length
        self.size = size
        self._good: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self._good)

    def __call__(self, uri: str) -> str | None:
        """Why ``uri`` is not an acceptable WAMP URI, or None if it is."""
        good = self._good
        if uri in good:
            return None
        problem = uri_problem(uri, self.max_length)
        if problem is None:
            if len(good) >= self.size:
                del good[next(iter(good))]
            good[uri] = None
        return problem


def random_wamp_id() -> int:
    """A random WAMP id in the spec's global range 1..2**53 (uniform: 53 random bits, plus one)."""
    return _random.getrandbits(53) + 1


# Drawn uniformly as the spec asks, from a generator seeded once from the OS:
# SystemRandom would cost a getrandom() syscall per publication. WAMP ids are
# identifiers, not secrets (authentication challenges use os.urandom).
_random = random.Random(os.urandom(32))


def event_arguments(envelope: Envelope) -> tuple[list[Any], dict[str, Any] | None]:
    """EVENT ``(args, kwargs)`` for ``envelope`` (see module docstring)."""
    payload = envelope.payload
    if envelope.wamp_wrapped and isinstance(payload, dict):
        args = payload.get("args")
        kwargs = payload.get("kwargs")
        if isinstance(args, list) and isinstance(kwargs, dict):
            return args, kwargs or None
    return [payload], None


def wamp_envelope(
    hub: Hub, topic: str, args: Sequence[Any] | None, kwargs: dict[str, Any] | None, size: int | None = None
) -> Envelope:
    """A new envelope for a WAMP publish of ``args``/``kwargs`` (the inverse of :func:`event_arguments`).

    ``size``: the message's bytes as received, if known.
    """
    if args is not None and len(args) == 1 and not kwargs:
        return hub.envelope(topic, args[0], size=size)
    return hub.envelope(topic, {"args": list(args or []), "kwargs": dict(kwargs or {})}, wamp_wrapped=True, size=size)


def _kind(msg: Message | PublishRequest) -> str:
    """The message's WAMP name (``PUBLISH``, ``HELLO``, ...) for error texts."""
    return "PUBLISH" if type(msg) is PublishRequest else type(msg).__name__.upper()


class _State(enum.Enum):
    """Where a :class:`BrokerSession` is in its life."""

    #: Transport open; the first message must be HELLO.
    AWAIT_HELLO = "await_hello"
    #: CHALLENGE sent; the next message must be AUTHENTICATE.
    AWAIT_AUTHENTICATE = "await_authenticate"
    #: WELCOME sent: pub/sub allowed.
    ESTABLISHED = "established"
    #: ABORT or GOODBYE sent, or the transport is gone; input is ignored.
    CLOSED = "closed"


@dataclass(slots=True)
class _TopicSubscription:
    """One broker-wide subscription: its id and how many sessions hold it."""

    id: int
    sessions: int


class WampRouter:
    """Serves WAMP sessions for a set of realms on top of one :class:`Hub`."""

    def __init__(
        self,
        hub: Hub,
        realms: Sequence[str] = ("realm1",),
        limits: WampLimits = WampLimits(),  # noqa: B008 - frozen, so sharing is safe
        *,
        new_id: Callable[[], int] = random_wamp_id,
        auth: AuthPolicy | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
        clock: Callable[[], float] = time.time,
        await_interest: bool = False,
        call_later: Callable[[float, Callable[[], None]], Any] | None = None,
        max_call_seconds: float = 0.0,
        max_pending_calls: int = 1000,
        login_throttle: LoginThrottle | None = None,
    ) -> None:
        if not realms:
            raise ValueError("WampRouter needs at least one realm")
        for realm in realms:
            if not isinstance(realm, str) or not realm or "#" in realm:
                raise ValueError(f"invalid WAMP realm name {realm!r}")
        self.hub = hub
        self.realms: tuple[str, ...] = tuple(realms)
        self.limits = limits
        #: The URI check of every PUBLISH, SUBSCRIBE and REGISTER, remembering good URIs.
        self.uri_problem = UriCheck(limits.max_uri_length)
        self.new_id = new_id
        #: Who may connect and what each role may do; None: everyone, anonymously, everything.
        self.auth = auth
        #: Randomness for authentication challenges, and the clock stamping them.
        self.random_bytes = random_bytes
        self.clock = clock
        #: Locks out a source address after failed logins (docs/security.md); None: no throttle.
        self.login_throttle = login_throttle
        #: Hold SUBSCRIBED until the hub says every linked node has the interest (``Hub.interest_settled``).
        self.await_interest = await_interest
        #: ``call_later(seconds, fn)`` for timers (join timeout); None: no timers (sans-IO tests).
        self.call_later = call_later
        #: Node-local RPC (pubsubclub/frontends/wamp/dealer.py); calls time out through ``call_later`` when given.
        self.dealer = Dealer(
            new_id,
            call_later=call_later,
            max_call_seconds=max_call_seconds,
            max_pending_calls=max_pending_calls,
            max_node_calls=limits.max_calls,
            max_registrations=limits.max_registrations_per_session,
            max_node_registrations=limits.max_registrations,
            refused=self.refused,
        )
        #: Hub topic (exact) or hub pattern -> its broker-wide subscription.
        self._subscriptions: dict[str | Pattern, _TopicSubscription] = {}
        self._subscription_ids: set[int] = set()
        self._subscriptions_compaction = Compaction()
        #: Sessions with an open transport.
        self.sessions: dict[BrokerSession, None] = {}

    def refused(self, reason: str) -> None:
        """Count one request refused past a limit (``pubsubclub_errors_total{component="wamp",reason}``)."""
        self.hub.metrics.error(Source.WAMP, reason)

    def shutdown(self, text: str = "node shutting down") -> int:
        """Say GOODBYE (``wamp.close.system_shutdown``) to every session and close it."""
        sessions = list(self.sessions)
        for session in sessions:
            session.goodbye("wamp.close.system_shutdown", text)
        return len(sessions)

    def session_factory(self) -> BrokerSession:
        """A new router-side session for one transport."""
        return BrokerSession(self)

    def hub_topic(self, realm: str, topic: str) -> str:
        """The hub topic for WAMP ``topic`` in ``realm``."""
        return hub_topic(realm, topic, self.realms[0])

    def hub_pattern(self, realm: str, match: str, uri: str) -> Pattern:
        """The hub pattern for WAMP pattern ``uri`` in ``realm``."""
        return hub_pattern(realm, match, uri, self.realms[0])

    # -- broker-wide subscription ids ---------------------------------------

    def acquire_subscription(self, topic: str | Pattern) -> int:
        """Count one more session on hub ``topic`` (or pattern); return its subscription id."""
        sub = self._subscriptions.get(topic)
        if sub is None:
            sub_id = self.new_id()
            while sub_id in self._subscription_ids:
                sub_id = self.new_id()
            sub = self._subscriptions[topic] = _TopicSubscription(sub_id, 0)
            self._subscription_ids.add(sub_id)
            self._subscriptions_compaction.grown(len(self._subscriptions))
        sub.sessions += 1
        return sub.id

    def release_subscription(self, topic: str | Pattern) -> None:
        """Count one session fewer on hub ``topic`` (or pattern); forget the id at zero."""
        sub = self._subscriptions.get(topic)
        if sub is None:
            return
        sub.sessions -= 1
        if sub.sessions <= 0:
            del self._subscriptions[topic]
            self._subscription_ids.discard(sub.id)
            if self._subscriptions_compaction.due(len(self._subscriptions)):
                self._subscriptions = dict(self._subscriptions)
                self._subscription_ids = set(self._subscription_ids)

    def event_bytes(self, envelope: Envelope, subscription: int, serializer: Any, realm: str | None = None) -> bytes:
        """The EVENT for ``envelope`` on ``subscription`` as ``serializer`` encodes it; once per format and id.

        ``realm`` is given for a pattern subscription (all its sessions are in
        that realm: the realm is part of the hub pattern): its EVENT names the
        concrete WAMP topic in ``details.topic``. The publication id is the one
        every subscription of this message sees.
        """
        wire = envelope.wire
        key = (serializer.NAME, subscription)
        data = wire.get(key)
        if data is None:
            publication = wire.get(PUBLICATION)
            if publication is None:
                publication = wire[PUBLICATION] = self.new_id()
            args, kwargs = event_arguments(envelope)
            details = None if realm is None else {"topic": wamp_topic(realm, envelope.topic, self.realms[0])}
            data = wire[key] = serializer.serialize(event_message(subscription, publication, args, kwargs, details))
        return data  # type: ignore[no-any-return]


class BrokerSession:
    """One client's WAMP session on the router; also its hub sink.

    Follows the router-side half of Autobahn's transport contract
    (``onOpen``/``onMessage``/``onClose``), as driven by
    ``autobahn.wamp.websocket.WampWebSocketProtocol``.
    """

    def __init__(self, router: WampRouter) -> None:
        self._router = router
        self._hub = router.hub
        self._limits = router.limits
        self._state = _State.AWAIT_HELLO
        self._transport: WampTransport | None = None
        self._realm: str | None = None
        #: Read by Autobahn's transport for its trace logging.
        self._session_id: int | None = None
        self._authid: str | None = None
        #: The role welcomed with; None without an auth policy (everything allowed).
        self._role: Role | None = None
        self._authenticator: Authenticator | None = None
        #: The client's address (the login throttle counts failures per source).
        self._source = "?"
        #: subscription id -> hub topic or pattern, and back.
        self._subscriptions: dict[int, str | Pattern] = {}
        self._topics: dict[str, int] = {}
        self._patterns: dict[Pattern, int] = {}
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
        if self._state in (_State.AWAIT_HELLO, _State.AWAIT_AUTHENTICATE):
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
            self._dispatch(msg)
        except Exception:
            log.failure(
                "WAMP session {session}: internal error handling {msg_type}",
                session=self._session_id,
                msg_type=type(msg).__name__,
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
        if self._state is _State.ESTABLISHED and isinstance(raw, list) and len(raw) >= 3:
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
        if self._state is _State.ESTABLISHED and isinstance(raw, list) and len(raw) == 4:
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

    # -- the hub Sink ----------------------------------------------------------

    #: The hub counts what this sink delivers under the ``wamp`` front-end, once per message.
    counts_as = Source.WAMP

    def deliver(self, envelope: Envelope) -> bool:
        """Send ``envelope`` as an EVENT, or drop this client if it lags too far; True if sent."""
        return self._send_event(envelope, self._topics.get(envelope.topic), None)

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> bool:
        """Send ``envelope``, which matched ``pattern``, as an EVENT of that pattern subscription; True if sent."""
        return self._send_event(envelope, self._patterns.get(pattern), pattern)

    def _send_event(self, envelope: Envelope, subscription: int | None, pattern: Pattern | None) -> bool:
        if subscription is None or self._state is not _State.ESTABLISHED or self._transport is None:
            return False
        transport = self._transport
        unsent = transport.unsent_bytes()
        if unsent > self._limits.max_send_buffer:
            reason = f"slow consumer: {unsent} bytes unsent, limit is {self._limits.max_send_buffer}"
            log.warn(
                "dropping WAMP session {session}: {reason}",
                session=self._session_id,
                reason=reason,
            )
            self._hub.metrics.count(
                envelope.topic, Source.WAMP, Kind.DROPPED, 1, payload_size(envelope), reason=DropReason.SLOW_CONSUMER
            )
            self._hub.metrics.disconnect(Source.WAMP, "slow_consumer")
            self._end()
            transport.drop(reason)
            return False
        try:
            realm = None if pattern is None else self._realm
            transport.send_encoded(self._router.event_bytes(envelope, subscription, transport.object_serializer, realm))
            return True
        except Exception:
            # Called from the hub's delivery loop: one bad recipient or
            # payload must not stop delivery to the others.
            log.failure(
                "WAMP session {session}: cannot send event {message_id}",
                session=self._session_id,
                message_id=envelope.message_id,
            )
            return False

    # -- closing ---------------------------------------------------------------

    def goodbye(self, reason: str, text: str) -> None:
        """End an established session from the router's side (GOODBYE), or just close it."""
        if self._state is _State.ESTABLISHED:
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
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        self._router.dealer.left(self)
        # Its own subscriptions only: no scan of every topic on the node per session leaving.
        hub = self._hub
        for topic in self._subscriptions.values():
            if isinstance(topic, str):
                hub.unsubscribe(topic, self)
            else:
                hub.unsubscribe_pattern(topic, self)
            self._router.release_subscription(topic)
        self._subscriptions.clear()
        self._topics.clear()
        self._patterns.clear()

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

    def _on_rpc(self, msg: message.Register | message.Call) -> None:
        """REGISTER or CALL: checked like a publish (URI, role), then the node's dealer."""
        request_type = msg.MESSAGE_TYPE
        match = msg.match if isinstance(msg, message.Register) and msg.match in MATCHES else None
        problem = (
            self._topic_problem(msg.procedure)
            if match is None
            else pattern_problem(match, msg.procedure, self._limits.max_uri_length)
        )
        if problem is None and msg.procedure.startswith("wamp.") and isinstance(msg, message.Register):
            problem = "procedures starting with 'wamp.' are reserved"
        if problem is not None:
            self._error(request_type, msg.request, INVALID_URI, problem)
            return
        assert self._realm is not None
        role = self._role
        # Checked on the hub topic, as PUBLISH is: in a further realm that is ``$realm.<realm>#<uri>``.
        # A pattern registration: checked on the head every procedure it can match starts with.
        hub_uri = (
            self._router.hub_topic(self._realm, msg.procedure)
            if match is None
            else self._router.hub_pattern(self._realm, match, msg.procedure).head
        )
        if role is not None and not role.may_publish(hub_uri):
            verb = "register" if isinstance(msg, message.Register) else "call"
            text = f"role {role.name!r} may not {verb} {msg.procedure!r}"
            self._error(request_type, msg.request, NOT_AUTHORIZED, text)
            return
        if isinstance(msg, message.Register):
            self._router.dealer.register(self, self._realm, msg, interruptible=self._interruptible)
        else:
            self._router.dealer.call(self, self._realm, msg)

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
        if type(msg) is PublishRequest and state is _State.ESTABLISHED:
            # The hot path: a PUBLISH the codec decoded without an Autobahn Message.
            self._on_publish(msg)
            return
        if state is _State.CLOSED:
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
        elif state is _State.AWAIT_HELLO:
            if isinstance(msg, message.Hello):
                self._on_hello(msg)
            else:
                self.protocol_violation(f"{_kind(msg)} received before the session was established")
        elif state is _State.AWAIT_AUTHENTICATE:
            if isinstance(msg, message.Authenticate):
                self._on_authenticate(msg)
            else:
                self.protocol_violation(f"{_kind(msg)} received while AUTHENTICATE was expected")
        elif isinstance(msg, message.Publish):
            self._on_publish(PublishRequest.from_message(msg))
        elif isinstance(msg, message.Subscribe):
            self._on_subscribe(msg)
        elif isinstance(msg, message.Unsubscribe):
            self._on_unsubscribe(msg)
        elif isinstance(msg, message.Goodbye):
            self._on_goodbye(msg)
        elif isinstance(msg, (message.Register, message.Call)):
            self._on_rpc(msg)
        elif isinstance(msg, message.Unregister):
            self._router.dealer.unregister(self, msg)
        elif isinstance(msg, message.Yield):
            self._router.dealer.yielded(self, msg)
        elif isinstance(msg, message.Error) and msg.request_type == message.Invocation.MESSAGE_TYPE:
            self._router.dealer.invocation_error(self, msg)
        elif isinstance(msg, message.Cancel):
            self._router.dealer.cancel(self, msg)
        else:
            self.protocol_violation(f"{type(msg).__name__.upper()} is not allowed once the session is established")

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
        policy = self._router.auth
        if policy is None:
            self._welcome(None, "anonymous", "anonymous", None)
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
            self._state = _State.AWAIT_AUTHENTICATE
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
            assert self._router.auth is not None
            self._role = self._router.auth.role(outcome.authrole)
            self._welcome(outcome.authid, outcome.authrole, outcome.authmethod, outcome.authprovider)

    def _welcome(self, authid: str | None, authrole: str, authmethod: str, authprovider: str | None) -> None:
        self._authenticator = None
        self._authid = authid
        self._state = _State.ESTABLISHED
        self._cancel_join_timer()
        # Joined: the connection layer's handshake deadline no longer applies (pubsubclub.net.edge).
        handshake_done(getattr(self._transport, "transport", None))
        self._send(
            message.Welcome(
                session=self._session_id,
                roles={
                    "broker": RoleBrokerFeatures(publisher_exclusion=True, pattern_based_subscription=True),
                    "dealer": RoleDealerFeatures(
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

    def _topic_problem(self, topic: str) -> str | None:
        return self._router.uri_problem(topic)

    def _on_subscribe(self, msg: message.Subscribe) -> None:
        request_type = message.Subscribe.MESSAGE_TYPE
        match = msg.match or message.Subscribe.MATCH_EXACT
        if match != message.Subscribe.MATCH_EXACT and match not in MATCHES:
            self._error(request_type, msg.request, INVALID_ARGUMENT, f"unknown match policy {str(match)[:40]!r}")
            return
        exact = match == message.Subscribe.MATCH_EXACT
        if exact:
            problem = self._topic_problem(msg.topic)
        else:
            problem = pattern_problem(match, msg.topic, self._limits.max_uri_length)
        if problem is not None:
            self._error(request_type, msg.request, INVALID_URI, problem)
            return
        assert self._realm is not None
        key: str | Pattern
        if exact:
            key = topic = self._router.hub_topic(self._realm, msg.topic)
        else:
            key = self._router.hub_pattern(self._realm, match, msg.topic)
            # Every topic the pattern can match starts with its literal head.
            topic = key.head
        role = self._role
        if role is not None and not role.may_subscribe(topic):
            log.debug(
                "WAMP session {session}: role {role} may not subscribe to {topic}",
                session=self._session_id,
                role=role.name,
                topic=topic,
            )
            self._error(
                request_type, msg.request, NOT_AUTHORIZED, f"role {role.name!r} may not subscribe to {msg.topic!r}"
            )
            return
        subscription = self._topics.get(key) if isinstance(key, str) else self._patterns.get(key)
        if subscription is None:
            limit = self._limits.max_subscriptions_per_session
            if len(self._subscriptions) >= limit:
                text = f"this session already has {len(self._subscriptions)} subscriptions, the limit is {limit}"
                self._refuse(request_type, msg.request, TOO_MANY_SUBSCRIPTIONS, text, "wamp.max-subscriptions", limit)
                return
            try:
                # First, so a full node table refuses before anything of the session's changes.
                if isinstance(key, str):
                    self._hub.subscribe(key, self, limited=True)
                else:
                    self._hub.subscribe_pattern(key, self, limited=True)
            except LimitExceeded as e:
                uri = TOO_MANY_TOPICS if isinstance(key, str) else TOO_MANY_PATTERNS
                self._refuse(request_type, msg.request, uri, e.text, e.limit, e.value)
                return
            subscription = self._router.acquire_subscription(key)
            self._subscriptions[subscription] = key
            if isinstance(key, str):
                self._topics[key] = subscription
            else:
                self._patterns[key] = subscription
        answer = message.Subscribed(msg.request, subscription)
        if self._router.await_interest:
            self._hub.interest_settled().addCallback(lambda _: self._send(answer))
        else:
            self._send(answer)

    def _on_unsubscribe(self, msg: message.Unsubscribe) -> None:
        topic = self._subscriptions.pop(msg.subscription, None)
        if topic is None:
            self._error(
                message.Unsubscribe.MESSAGE_TYPE,
                msg.request,
                NO_SUCH_SUBSCRIPTION,
                f"no subscription {msg.subscription} in this session",
            )
            return
        if isinstance(topic, str):
            del self._topics[topic]
            self._hub.unsubscribe(topic, self)
        else:
            del self._patterns[topic]
            self._hub.unsubscribe_pattern(topic, self)
        self._router.release_subscription(topic)
        self._send(message.Unsubscribed(msg.request))

    def _on_publish(self, msg: PublishRequest) -> None:
        request_type = PUBLISH
        acknowledge = msg.acknowledge is True
        problem = self._topic_problem(msg.topic)
        if problem is None and msg.topic.startswith("wamp."):
            problem = "topics starting with 'wamp.' are reserved"
        if problem is None and msg.payload is not None:
            problem = "payload transparency (encrypted or passthru payloads) is not supported"
            error_uri = INVALID_ARGUMENT
        else:
            error_uri = INVALID_URI
        if problem is not None:
            log.debug(
                "WAMP session {session}: publish refused: {problem}",
                session=self._session_id,
                problem=problem,
            )
            # Without acknowledge the publisher expects no answer at all.
            if acknowledge:
                self._error(request_type, msg.request, error_uri, problem)
            return

        assert self._realm is not None
        topic = self._router.hub_topic(self._realm, msg.topic)
        role = self._role
        if role is not None and not role.may_publish(topic):
            log.debug(
                "WAMP session {session}: role {role} may not publish to {topic}",
                session=self._session_id,
                role=role.name,
                topic=topic,
            )
            if acknowledge:
                self._error(
                    request_type, msg.request, NOT_AUTHORIZED, f"role {role.name!r} may not publish to {msg.topic!r}"
                )
            return
        hub = self._hub
        envelope = wamp_envelope(hub, topic, msg.args, msg.kwargs, size=msg.size)
        too_large = hub.refusal(envelope, _UNMEASURED if msg.size is None else msg.size)
        if too_large is not None:
            # Refused before anyone gets it, here or on other nodes: one outcome everywhere.
            log.debug("WAMP session {session}: publish refused: {problem}", session=self._session_id, problem=too_large)
            hub.metrics.count(
                topic, Source.WAMP, Kind.DROPPED, 1, payload_size(envelope), reason=DropReason.TOO_LARGE_FOR_LINKS
            )
            if acknowledge:
                self._error(request_type, msg.request, PAYLOAD_SIZE_EXCEEDED, too_large)
            return
        publication = envelope.wire[PUBLICATION] = self._router.new_id()
        hub.metrics.count(topic, Source.WAMP, Kind.PUBLISHED, 1, payload_size(envelope))
        hub.publish(envelope, exclude=None if msg.exclude_me is False else self)
        if acknowledge:
            self._send(message.Published(msg.request, publication))
