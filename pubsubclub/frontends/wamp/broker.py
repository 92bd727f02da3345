"""The WAMP v2 broker: router-side sessions that plug WAMP clients into the hub.

Modern Autobahn ships only client roles, so the broker is ours. It speaks the
Broker role of the WAMP Basic Profile (SUBSCRIBE/SUBSCRIBED,
UNSUBSCRIBE/UNSUBSCRIBED, PUBLISH/PUBLISHED, EVENT and ERROR) plus the
Advanced Profile's pattern-based subscriptions, subscriber black- and
whitelisting, publisher exclusion and publisher identification. The session
also hands REGISTER/UNREGISTER/CALL/YIELD to the Dealer
(pubsubclub/frontends/wamp/dealer.py), which reaches callees on other nodes over PSC 0.7.

The module split (each part a seam of its own):

- :mod:`~pubsubclub.frontends.wamp.session`: the session's life (transport
  contract, HELLO, authentication, WELCOME, GOODBYE/ABORT), which
  :class:`BrokerSession` extends;
- :mod:`~pubsubclub.frontends.wamp.router`: what the node's sessions share
  (:class:`WampRouter`, :class:`WampLimits`, broker-wide subscription ids);
- :mod:`~pubsubclub.frontends.wamp.publishing`: PUBLISH, its options and
  publisher disclosure, envelopes and EVENT bytes (payloads, hot path);
- :mod:`~pubsubclub.frontends.wamp.uris`: URIs, realm mapping, random ids.

Here: subscriptions and delivery.

Patterns
    A prefix or wildcard SUBSCRIBE becomes a hub pattern
    (:class:`~pubsubclub.core.patterns.Pattern`) under the same realm mapping as
    topics (:func:`hub_pattern`), so a pattern of one realm never matches
    another realm's topics. One subscription id per (match, pattern),
    broker-wide, like exact ones; its EVENTs carry the concrete WAMP topic in
    ``details.topic``. A session subscribed to a topic several ways gets one
    EVENT per matching subscription, as WAMP asks.

Authorization
    SUBSCRIBE and PUBLISH on a hub topic outside the role's prefixes get
    ERROR ``wamp.error.not_authorized`` (a PUBLISH only when acknowledged, as
    for every refused publish) and nothing is delivered or forwarded.
"""

from __future__ import annotations

from typing import Any

from autobahn.wamp import message
from autobahn.wamp.message import Message
from twisted.logger import Logger

from pubsubclub.core.counters import DropReason, Kind, Source
from pubsubclub.core.hub import Envelope, LimitExceeded
from pubsubclub.core.metrics import payload_size
from pubsubclub.core.patterns import MATCHES, Pattern
from pubsubclub.frontends.wamp.auth import NOT_AUTHORIZED
from pubsubclub.frontends.wamp.codec import _NO_DETAILS, EVENT, DisclosingCall, DisclosingRegister, PublishRequest
from pubsubclub.frontends.wamp.meta import META_PREFIXES
from pubsubclub.frontends.wamp.publishing import (
    DISCLOSE_ALWAYS,
    DISCLOSE_NEVER,
    PAYLOAD_SIZE_EXCEEDED,
    PUBLICATION,
    RETAINED,
    admits,
    event_arguments,
    event_bytes,
    publish,
    wamp_envelope,
)
from pubsubclub.frontends.wamp.router import WampLimits, WampRouter
from pubsubclub.frontends.wamp.session import (
    INVALID_ARGUMENT,
    INVALID_URI,
    TOO_MANY_FAILURES,
    State,
    WampSession,
    WampTransport,
)
from pubsubclub.frontends.wamp.uris import (
    GAP_EVENT_TOPIC,
    MAX_ID,
    META_TOPICS,
    URI_CACHE_SIZE,
    UriCheck,
    hub_pattern,
    hub_topic,
    pattern_problem,
    random_wamp_id,
    uri_problem,
    wamp_topic,
)

#: Read per delivered message: bound once.
_ESTABLISHED = State.ESTABLISHED

# Also the names other modules and tests import from here, kept since the module was split.
__all__ = [
    "GAP_EVENT_TOPIC",
    "MAX_ID",
    "META_TOPICS",
    "PAYLOAD_SIZE_EXCEEDED",
    "PUBLICATION",
    "TOO_MANY_FAILURES",
    "URI_CACHE_SIZE",
    "BrokerSession",
    "UriCheck",
    "WampLimits",
    "WampRouter",
    "WampTransport",
    "event_arguments",
    "hub_pattern",
    "hub_topic",
    "pattern_problem",
    "random_wamp_id",
    "uri_problem",
    "wamp_envelope",
    "wamp_topic",
]

log = Logger()

NO_SUCH_SUBSCRIPTION = "wamp.error.no_such_subscription"
TOO_MANY_SUBSCRIPTIONS = "pubsubclub.error.too_many_subscriptions"
#: SUBSCRIBE to a new topic past the node's ``max-subscribed-topics``.
TOO_MANY_TOPICS = "pubsubclub.error.too_many_topics"
#: A prefix or wildcard SUBSCRIBE of a new pattern past the node's pattern cap (``max-patterns-per-peer``).
TOO_MANY_PATTERNS = "pubsubclub.error.too_many_patterns"


class BrokerSession(WampSession):
    """One client's WAMP session once joined: its subscriptions, publishes and RPC; also its hub sink."""

    def __init__(self, router: WampRouter) -> None:
        super().__init__(router)
        #: subscription id -> hub topic or pattern, and back.
        self._subscriptions: dict[int, str | Pattern] = {}
        self._topics: dict[str, int] = {}
        self._patterns: dict[Pattern, int] = {}

    # -- the hub Sink ----------------------------------------------------------

    #: The hub counts what this sink delivers under the ``wamp`` front-end, once per message.
    counts_as = Source.WAMP
    #: The transport's object serializer, kept at the first EVENT (an instance attribute only from then on).
    _event_serializer: Any = None

    def deliver(self, envelope: Envelope) -> bool:
        """Send ``envelope`` as an EVENT, or drop this client if it lags too far; True if sent."""
        subscription = self._topics.get(envelope.topic)
        transport = self._transport
        if (
            subscription is None
            or transport is None
            or envelope.options is not None
            or self._state is not _ESTABLISHED
            or transport.unsent_bytes() > self._limits.max_send_buffer
        ):
            # Not subscribed, not established, publish options or a lagging client: the checks one by one.
            return self._send_event(envelope, subscription, None)
        try:
            serializer = self._event_serializer
            if serializer is None:
                # The transport's object serializer (a property), read at the first EVENT: fixed at its handshake.
                serializer = self._event_serializer = transport.object_serializer
            wire = envelope.wire
            if not wire and not envelope.wamp_wrapped:
                # event_bytes' first case without its call: the first EVENT of a plain publish (no options,
                # checked above; not retained: that is in ``wire``), the plain EVENT memoised as it memoises it.
                first = wire[PUBLICATION] = self._router.new_id()
                data = wire[(serializer.NAME, subscription)] = serializer.serialize(
                    [EVENT, subscription, first, _NO_DETAILS, [envelope.payload]]
                )
            else:
                # publishing.event_bytes without the router's wrapper (an exact subscription names no topic).
                data = event_bytes(envelope, subscription, serializer, self._router.new_id, None)
            transport.send_encoded(data)
            return True
        except Exception:
            return self._send_failed(envelope)

    #: The hub may hand this sink a remote message as its fields (:meth:`deliver_plain`).
    takes_plain = True

    def deliver_plain(self, topic: str, payload: Any, message_id: str | None) -> bool | None:
        """:meth:`deliver` of a plain remote message no one else receives, without its envelope.

        None, having done nothing, where :meth:`deliver` would not take its
        short path (not subscribed, not established, a lagging client): the
        hub then makes the envelope and calls :meth:`deliver`.
        """
        subscription = self._topics.get(topic)
        transport = self._transport
        if (
            subscription is None
            or transport is None
            or self._state is not _ESTABLISHED
            or transport.unsent_bytes() > self._limits.max_send_buffer
        ):
            return None
        try:
            serializer = self._event_serializer
            if serializer is None:
                serializer = self._event_serializer = transport.object_serializer
            # deliver's first EVENT of a plain publish: nothing to memoise, as no other recipient can ask.
            transport.send_encoded(
                serializer.serialize([EVENT, subscription, self._router.new_id(), _NO_DETAILS, [payload]])
            )
            return True
        except Exception:
            log.failure("WAMP session {session}: cannot send event {message_id}", session=self._session_id,
                        message_id=message_id)  # fmt: skip
            return False

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> bool:
        """Send ``envelope``, which matched ``pattern``, as an EVENT of that pattern subscription; True if sent."""
        return self._send_event(envelope, self._patterns.get(pattern), pattern)

    def _send_event(self, envelope: Envelope, subscription: int | None, pattern: Pattern | None) -> bool:
        if subscription is None or self._state is not State.ESTABLISHED or self._transport is None:
            return False
        # Publish options (eligible/exclude ...): only a publish that had some pays for the check.
        if envelope.options is not None and not admits(envelope, self._session_id, self._authid, self._authrole):
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
            return self._send_failed(envelope)

    def _send_failed(self, envelope: Envelope) -> bool:
        # Called from the hub's delivery loop: one bad recipient or
        # payload must not stop delivery to the others.
        log.failure(
            "WAMP session {session}: cannot send event {message_id}",
            session=self._session_id,
            message_id=envelope.message_id,
        )
        return False

    def _left(self) -> None:
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

    # -- once established --------------------------------------------------------

    def _established(self, msg: Message | PublishRequest) -> None:
        if isinstance(msg, message.Publish):
            self._on_publish(PublishRequest.from_message(msg))
        elif isinstance(msg, message.Subscribe):
            self._on_subscribe(msg)
        elif isinstance(msg, message.Unsubscribe):
            self._on_unsubscribe(msg)
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
            disclose_caller = type(msg) is DisclosingRegister
            self._router.dealer.register(self, self._realm, msg, self._interruptible, disclose_caller)
            return
        if msg.procedure.startswith(META_PREFIXES) and self._router.meta.call(self, msg):
            return
        # Caller disclosure ([wamp] disclose-caller), decided here on the caller's node.
        policy = self._router.disclose_caller
        if policy == DISCLOSE_NEVER:
            self._router.dealer.call(self, self._realm, msg)
        else:
            identity = (self.session_id, self.authid, self.authrole)
            disclose = policy == DISCLOSE_ALWAYS or type(msg) is DisclosingCall
            self._router.dealer.call(self, self._realm, msg, identity=identity, disclose=disclose)

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
            self._router.meta.subscribed(self, subscription, match, msg.topic, key)
        answer = message.Subscribed(msg.request, subscription)
        retained = msg.get_retained is True
        if self._router.await_interest:
            settled = self._hub.interest_settled(self._router.await_timeout)
            settled.addCallback(lambda _: self._subscribed(answer, key, retained))
        else:
            self._subscribed(answer, key, retained)

    def _subscribed(self, answer: message.Subscribed, key: str | Pattern, get_retained: bool) -> None:
        """SUBSCRIBED, then (``get_retained``) the retained event of each matching topic, as EVENTs."""
        self._send(answer)
        if not get_retained:
            return
        store = self._router.retained
        if isinstance(key, str):
            held = store.get(key)
            events = [] if held is None else [held]
            pattern = None
        else:
            events = store.matching(key)
            pattern = key
        for event in events:
            envelope = Envelope(
                event.topic,
                event.payload,
                event.origin,
                event.published_at,
                event.message_id,
                event.wamp_wrapped,
                options=event.options,
            )
            envelope.wire[RETAINED] = True
            # Publish options apply as to a live EVENT; a slow consumer is dropped as for one.
            self._send_event(envelope, answer.subscription, pattern)

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
        self._router.meta.unsubscribed(self, msg.subscription)
        self._send(message.Unsubscribed(msg.request))

    def _on_publish(self, msg: PublishRequest) -> None:
        """PUBLISH: checks, options and delivery are publishing.py's; the answer (if any) goes back."""
        answer = publish(self, msg)
        if answer is not None:
            self._send(answer)
