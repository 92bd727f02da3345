"""The WAMP router: what a node's WAMP sessions share (realms, limits, subscription ids, the dealer).

:class:`WampRouter` is the node-wide half of the WAMP front-end; each client's
session (:class:`~pubsubclub.frontends.wamp.broker.BrokerSession`) holds a
reference to it. Subscription ids are broker-wide per hub topic or pattern
(every session subscribed to a topic gets the same id), so one EVENT serves
every recipient of an envelope (:func:`~pubsubclub.frontends.wamp.publishing.event_bytes`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pubsubclub.core.compaction import Compaction
from pubsubclub.core.counters import Source
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.jsonbounds import DEFAULT_BOUNDS, JSONBounds
from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.core.patterns import Pattern
from pubsubclub.core.retained import RetainedStore
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
from pubsubclub.frontends.wamp.dealer import Dealer
from pubsubclub.frontends.wamp.meta import META_PREFIXES, WampMeta, meta_topic
from pubsubclub.frontends.wamp.publishing import DISCLOSE_ON_REQUEST, DISCLOSURES, event_bytes
from pubsubclub.frontends.wamp.uris import UriCheck, hub_pattern, hub_prefix, hub_topic, random_wamp_id, wamp_topic

if TYPE_CHECKING:
    from pubsubclub.frontends.wamp.broker import BrokerSession
    from pubsubclub.frontends.wamp.session import WampSession

__all__ = ["WampLimits", "WampRouter"]


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
    #: Topics with a retained event, the cluster's table as this node holds it (``[wamp] max-retained-topics``).
    max_retained_topics: int = 10_000
    #: Payload bytes of all retained events together (``[wamp] max-retained-bytes``).
    max_retained_bytes: int = 64 * 1024 * 1024
    #: RPC calls in flight from one other node (one link) on this node (``[wamp] max-calls-per-link``).
    max_calls_per_link: int = 10_000
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
            "max_retained_topics",
            "max_retained_bytes",
            "max_calls_per_link",
            "max_send_buffer",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"WampLimits.{name} must be a positive int, not {value!r}")



def realm_policy(auth: AuthPolicy, realm: str, plain_realm: str) -> AuthPolicy | None:
    """``realm``'s policy (authpolicy.py) with its roles' WAMP topic prefixes as hub-topic prefixes; None: nobody.

    The plain realm's prefixes are hub prefixes already; another realm's
    ``"orders."`` becomes ``"$realm.<realm>#orders."``, so no role of one
    realm reaches another realm's topics or procedures.
    """
    policy = auth.for_realm(realm, plain_realm)
    if policy is None or realm == plain_realm:
        return policy
    roles = tuple(
        Role(
            role.name,
            subscribe=tuple(hub_prefix(realm, p, plain_realm) for p in role.subscribe),
            publish=tuple(hub_prefix(realm, p, plain_realm) for p in role.publish),
        )
        for role in policy.roles
    )
    return replace(policy, roles=roles)


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
        disclose_publisher: str = DISCLOSE_ON_REQUEST,
        plain_realm: str | None = None,
        disclose_caller: str = DISCLOSE_ON_REQUEST,
    ) -> None:
        if not realms:
            raise ValueError("WampRouter needs at least one realm")
        for realm in (*realms, *(() if plain_realm is None else (plain_realm,))):
            if not isinstance(realm, str) or not realm or "#" in realm:
                raise ValueError(f"invalid WAMP realm name {realm!r}")
        if len(set(realms)) != len(realms):
            raise ValueError(f"a realm is listed twice in {list(realms)}")
        if disclose_publisher not in DISCLOSURES:
            raise ValueError(f"disclose_publisher must be one of {', '.join(DISCLOSURES)}, not {disclose_publisher!r}")
        #: When a publisher is named in its EVENTs (``[wamp] disclose-publisher``; publishing.py).
        self.disclose_publisher = disclose_publisher
        if disclose_caller not in DISCLOSURES:
            raise ValueError(f"disclose_caller must be one of {', '.join(DISCLOSURES)}, not {disclose_caller!r}")
        #: When a caller is named in its INVOCATIONs (``[wamp] disclose-caller``; broker.py, dealer.py).
        self.disclose_caller = disclose_caller
        self.hub = hub
        self.realms: tuple[str, ...] = tuple(realms)
        #: The realm whose WAMP topics are the plain hub topics, the same on every node (uris.py); it may be
        #: a realm this node does not serve.
        self.plain_realm: str = realms[0] if plain_realm is None else plain_realm
        self.limits = limits
        #: The URI check of every PUBLISH, SUBSCRIBE and REGISTER, remembering good URIs.
        self.uri_problem = UriCheck(limits.max_uri_length)
        #: (realm, WAMP topic) -> hub topic of topics published on and found good (publishing.py); at most
        #: URI_CACHE_SIZE, oldest out first. Only what the router's own settings decide: never stale.
        self.publish_topics: dict[tuple[str | None, str], str] = {}
        self.new_id = new_id
        #: Who may connect and what each role may do; None: everyone, anonymously, everything.
        self.auth = auth
        #: Each served realm's policy, its prefixes mapped into the realm's hub topics; None: nobody may join.
        self.realm_auth: dict[str, AuthPolicy | None] = {} if auth is None else {
            realm: realm_policy(auth, realm, self.plain_realm) for realm in self.realms
        }
        #: Randomness for authentication challenges, and the clock stamping them.
        self.random_bytes = random_bytes
        self.clock = clock
        #: Locks out a source address after failed logins (docs/security.md); None: no throttle.
        self.login_throttle = login_throttle
        #: Hold SUBSCRIBED until the hub says every linked node has the interest (``Hub.interest_settled``).
        self.await_interest = await_interest
        #: Longest SUBSCRIBED (and, in the dealer, REGISTERED) is held for it (``[wamp] await-interest-timeout``).
        self.await_timeout = 5.0
        #: ``call_later(seconds, fn)`` for timers (join timeout); None: no timers (sans-IO tests).
        self.call_later = call_later
        #: Node-local RPC (pubsubclub/frontends/wamp/dealer.py); calls time out through ``call_later`` when given.
        self.dealer = Dealer(
            new_id,
            call_later=call_later,
            max_call_seconds=max_call_seconds,
            max_pending_calls=max_pending_calls,
            max_node_calls=limits.max_calls,
            max_link_calls=limits.max_calls_per_link,
            max_registrations=limits.max_registrations_per_session,
            max_node_registrations=limits.max_registrations,
            refused=self.refused,
        )
        #: Retained events by hub topic, this node's replica of the cluster's (core/retained.py).
        self.retained = RetainedStore(limits.max_retained_topics, limits.max_retained_bytes)
        #: Hub topic (exact) or hub pattern -> its broker-wide subscription.
        self._subscriptions: dict[str | Pattern, _TopicSubscription] = {}
        self._subscription_ids: set[int] = set()
        self._subscriptions_compaction = Compaction()
        #: Sessions with an open transport.
        self.sessions: dict[WampSession, None] = {}
        #: The meta API (wamp.session.* ...; pubsubclub/frontends/wamp/meta.py), told of the dealer's registrations.
        self.meta = WampMeta(self)
        self.dealer.observer = self.meta

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
        from pubsubclub.frontends.wamp.broker import BrokerSession  # the session module imports this one

        return BrokerSession(self)

    def hub_topic(self, realm: str, topic: str) -> str:
        """The hub topic for WAMP ``topic`` in ``realm``."""
        if topic.startswith(META_PREFIXES):
            return meta_topic(realm, topic)  # reserved: only the router publishes meta events
        return hub_topic(realm, topic, self.plain_realm)

    def hub_pattern(self, realm: str, match: str, uri: str) -> Pattern:
        """The hub pattern for WAMP pattern ``uri`` in ``realm``."""
        return hub_pattern(realm, match, uri, self.plain_realm)

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

    def subscription_sessions(self, topic: str | Pattern) -> int:
        """Sessions holding the broker-wide subscription of hub ``topic`` (or pattern); 0 if none."""
        sub = self._subscriptions.get(topic)
        return 0 if sub is None else sub.sessions

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
        concrete WAMP topic in ``details.topic``.
        """
        key = (serializer.NAME, subscription)
        data = envelope.wire.get(key)
        if data is None:
            topic = None if realm is None else wamp_topic(realm, envelope.topic, self.plain_realm)
            data = event_bytes(envelope, subscription, serializer, self.new_id, topic)
        return data  # type: ignore[no-any-return]
