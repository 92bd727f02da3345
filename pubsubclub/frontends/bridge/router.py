"""``pubsubclub bridge``: a cluster node whose local side is an unmodified WAMP router (docs/bridge.md).

Why it exists: Crossbar.io cannot take a broker class, so the mixin cannot reach
it; a bridge joins the router as an ordinary WAMP client instead and is, on the
cluster side, a full node (the node's hub and federation, no client listeners).

Two directions, each exactly once:

- **Router -> cluster.** Which topics the router's clients want comes from the
  router's subscription meta API (``wamp.subscription.list``/``get``/
  ``list_subscribers`` at join, then the ``on_create``/``on_subscribe``/
  ``on_unsubscribe``/``on_delete`` events), kept by :class:`RouterInterest`
  (sans-IO, pubsubclub/frontends/bridge/interest.py). Sessions with the bridge role (``--bridge-role``, checked with
  ``wamp.session.get``) are bridges and never count, so two bridges on one
  router cannot keep interest alive for each other. The bridge subscribes its
  hub sink to those topics and patterns (prefix, wildcard: PSC 0.5), so the
  federation asks the other nodes for them;
  what arrives is published into the router with ``exclude_me`` and
  ``exclude_authrole=[bridge role]``.
- **Cluster -> router.** The bridge subscribes on the router to the topics and
  patterns the other nodes asked it for (:meth:`Federation.remote_topics`,
  :meth:`Federation.remote_pattern_set`) and publishes each event into the hub
  as a local publish (the hub forwards it once, one hop); an event matching
  several of its subscriptions is forwarded once (by publication id). Events
  from bridge-role publishers (when the router discloses them) and retained
  events are dropped.

Crossbar 26.10's router-wide ``wamp.subscription.list`` leaves wildcard
subscriptions out (a FIXME in its ``service.py``); the bridge then reads each
session's list for them.

One active bridge per router: several bridges on one router would each carry
every message (duplicates). The active bridge holds a registration of the
lock procedure (``--bridge-lock``); the router's Dealer refuses a second one
(``wamp.error.procedure_already_exists``), so at most one bridge is active at
a time. The others wait on standby, without interest or router subscriptions,
and try again whenever a registration is deleted (``wamp.registration.on_delete``,
which the router sends when the active bridge leaves or dies).

Reconnects: a :class:`~twisted.application.internet.ClientService` with the
federation's backoff. A new router session re-reads the subscription list
(interest found unchanged is not churned on the cluster), subscribes again and
republishes nothing, so nothing is duplicated; while the router is away,
messages from the cluster are dropped and counted.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from autobahn.twisted.websocket import WampWebSocketClientFactory
from autobahn.wamp import auth as wamp_auth
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.serializer import JsonSerializer, MsgPackSerializer
from autobahn.wamp.types import ComponentConfig, PublishOptions, SubscribeOptions
from twisted.application.internet import ClientService
from twisted.internet import defer
from twisted.logger import Logger

from pubsubclub.config import BridgeSection, bridge_credentials
from pubsubclub.core.counters import BridgeEvent, DropReason, Kind, Source
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import payload_size
from pubsubclub.core.patterns import MATCHES
from pubsubclub.federation import Federation
from pubsubclub.federation.federation import endpoint_for_url
from pubsubclub.federation.hints import ReportingEndpoint
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.frontends.base import FrontendBase
from pubsubclub.frontends.bridge.interest import EXACT, Interest, InterestStep, RouterInterest, router_role
from pubsubclub.frontends.bridge.realm import RealmMap
from pubsubclub.frontends.bridge.rpc import RouterRPC
from pubsubclub.frontends.bridge.session import _BridgeSession, _RouterSink
from pubsubclub.frontends.wamp.broker import event_arguments, wamp_envelope
from pubsubclub.net.nodelay import set_no_delay

log = Logger()

#: The subscription meta events a bridge follows.
META_EVENTS = (
    "wamp.subscription.on_create",
    "wamp.subscription.on_subscribe",
    "wamp.subscription.on_unsubscribe",
    "wamp.subscription.on_delete",
)
#: Seconds a clean stop waits for the router's GOODBYE before closing the connection.
LEAVE_TIMEOUT = 3.0
#: Meta-API calls in flight at once while a bridge reads a router's subscriptions.
READ_BATCH = 64
#: Router publication ids remembered to drop the copies of an event matching several subscriptions.
RECENT_PUBLICATIONS = 256


def _pending(subscription: Any) -> bool:
    """Whether a router subscription is still being made (a Deferred, not yet a Subscription)."""
    return isinstance(subscription, defer.Deferred)


class RouterBridge(FrontendBase):
    """The router as the bridge node's only front-end: one WAMP client session, kept joined."""

    name = "router"

    def __init__(
        self,
        hub: Hub,
        federation: Federation,
        section: BridgeSection,
        reactor: Any,
        *,
        realm: str,
        cluster_realm: str | None = None,
        plain_realm: str | None = None,
        trust_root: Any = None,
        retry: RetryPolicy = RetryPolicy(),
        rand: Any = random.random,
        rpc: RouterRPC | None = None,
    ) -> None:
        super().__init__()
        assert section.router is not None, "a bridge needs --router"
        self.url = section.router
        self.realm = realm
        #: Router topics <-> the hub topics of the cluster realm they are carried onto (realm.py).
        plain = plain_realm if plain_realm is not None else (cluster_realm or realm)
        self.realm_map = RealmMap(cluster_realm if cluster_realm is not None else plain, plain)
        self.role = section.role
        self.lock = section.lock
        self.authid = section.authid
        self.ticket, self.cra_secret = bridge_credentials(section)
        self._hub = hub
        self._federation = federation
        self._reactor = reactor
        self._retry = retry
        self._rand = rand
        self._trust_root = trust_root
        self._sink = _RouterSink(self)
        self._metrics = hub.metrics
        #: The joined router session, or None.
        self.session: _BridgeSession | None = None
        #: This bridge holds the lock: it carries messages both ways.
        self.active = False
        self._interest: RouterInterest | None = None
        #: The interest whose listing has been read (facts about it apply to the hub one by one).
        self._synced: RouterInterest | None = None
        #: What our sink holds in the hub (the router's clients' interest as the cluster sees it).
        self._hub_topics: set[Interest] = set()
        #: ``(match, uri)`` -> router subscription (or the Deferred of one being made).
        self._router_subs: dict[Interest, Any] = {}
        #: The envelope last published into the router (an exact and a pattern subscription both match it).
        self._last_envelope: Envelope | None = None
        #: Publication ids of the latest router events (one per matching subscription of ours).
        self._recent_publications: deque[int] = deque(maxlen=RECENT_PUBLICATIONS)
        self._reconcile_call: Any = None
        self._failures = 0
        #: The session whose REGISTER of the lock is on the way, if any.
        self._leading: _BridgeSession | None = None
        self._service: ClientService | None = None
        self._stopping = False
        federation.add_remote_topics_listener(self._remote_topics_changed)
        #: RPC both ways through the active bridge (pubsubclub/frontends/bridge/rpc.py); None: no dealer.
        self.rpc = rpc

    # -- lifecycle --------------------------------------------------------------------------

    async def listen(self) -> dict[str, str]:
        """Start joining the router (in the background, retried); its URL as ``router``."""
        factory = WampWebSocketClientFactory(
            lambda: _BridgeSession(ComponentConfig(self.realm), self),
            url=self.url,
            serializers=[JsonSerializer(), MsgPackSerializer()],
        )
        factory.setProtocolOptions(autoPingInterval=5.0, autoPingTimeout=5.0)
        endpoint = ReportingEndpoint(
            endpoint_for_url(self._reactor, self.url, self._trust_root),
            lambda why: log.warn("bridge: cannot reach the router at {url}: {reason}", url=self.url, reason=why),
        )

        def retry_delay(attempt: int) -> float:
            self._failures += 1
            return self._retry.delay(self._failures, self._rand)

        # Nagle off: Autobahn's own attempt never takes effect on a client connection (see nodelay).
        self._service = ClientService(
            endpoint,
            factory,
            retryPolicy=retry_delay,
            clock=self._reactor,
            prepareConnection=lambda protocol: set_no_delay(getattr(protocol, "transport", None)),
        )
        self._service.startService()
        log.info("bridge: joining {url} realm {realm}", url=self.url, realm=self.realm)
        return {"router": self.url}

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Leave the router (which releases the lock at once), then stop reconnecting."""
        self._stopping = True
        session = self.session
        service = self._service

        async def goodbye() -> None:
            if session is not None and session.is_attached():
                closed = session.leave("wamp.close.system_shutdown", reason)
                if isinstance(closed, defer.Deferred):
                    closed.addTimeout(LEAVE_TIMEOUT, self._reactor)
                    try:
                        await closed
                    except Exception:  # no GOODBYE in time: the connection is closed below
                        pass
            if service is not None:
                await service.stopService()

        return defer.ensureDeferred(goodbye())

    def stats(self) -> dict[str, Any]:
        """Router session, role, interest and subscriptions, for /stats."""
        interest = self._interest
        return {
            "router": self.url,
            "realm": self.realm,
            "joined": self.session is not None,
            "session": None if self.session is None else self.session._session_id,
            "active": self.active,
            "interest": sorted(uri for match, uri in self._hub_topics if match == EXACT),
            "interest_patterns": sorted([match, uri] for match, uri in self._hub_topics if match != EXACT),
            "router_subscriptions": sorted(
                uri for (match, uri), s in self._router_subs.items() if match == EXACT and not _pending(s)
            ),
            "router_patterns": sorted(
                [match, uri] for (match, uri), s in self._router_subs.items() if match != EXACT and not _pending(s)
            ),
            "subscriptions_seen": None if interest is None else interest.subscriptions(),
            "events": self._metrics.view("bridge"),
            "rpc": None if self.rpc is None else self.rpc.stats(),
        }

    # -- credentials ------------------------------------------------------------------------

    def authmethods(self) -> list[str]:
        """The methods offered in HELLO (none: anonymous)."""
        return (["ticket"] if self.ticket is not None else []) + (["wampcra"] if self.cra_secret is not None else [])

    def answer(self, challenge: Any) -> str:
        """AUTHENTICATE for a CHALLENGE: the ticket, or the WAMP-CRA signature (salted keys derived)."""
        if challenge.method == "ticket" and self.ticket is not None:
            return self.ticket
        if challenge.method == "wampcra" and self.cra_secret is not None:
            key: bytes | str = self.cra_secret.encode()
            extra = challenge.extra
            if "salt" in extra:
                key = wamp_auth.derive_key(key, extra["salt"], extra.get("iterations"), extra.get("keylen"))
            return str(wamp_auth.compute_wcs(key, extra["challenge"]).decode("ascii"))
        raise ApplicationError("wamp.error.authentication_failed", f"cannot answer a {challenge.method} challenge")

    # -- router session ---------------------------------------------------------------------

    async def joined(self, session: _BridgeSession, details: Any) -> None:
        """Joined: check our role, then try to become the router's active bridge."""
        if self._stopping:
            session.leave("wamp.close.system_shutdown", "bridge shutting down")
            return
        self._metrics.event(BridgeEvent.JOINS)
        if details.authrole != self.role:
            log.error(
                "bridge: the router gave this bridge the role {got!r}, not {want!r}: bridges must have their own"
                " role (see docs/bridge.md); leaving",
                got=details.authrole,
                want=self.role,
            )
            self._metrics.event(BridgeEvent.WRONG_ROLE)
            session.leave("wamp.error.not_authorized", f"bridge role must be {self.role}")
            return
        self.session = session
        log.info(
            "bridge: joined {url} realm {realm} as session {session} ({authid}, role {role})",
            url=self.url,
            realm=self.realm,
            session=details.session,
            authid=details.authid,
            role=details.authrole,
        )
        try:
            await session.subscribe(self._registration_deleted, "wamp.registration.on_delete")
            await self._try_lead(session)
        except Exception as e:  # e.g. the role may not use the meta API: say so, back off, try again
            if self.session is session:
                log.warn("bridge: setting up the router session failed: {error}; reconnecting", error=e)
                session.disconnect()
        else:
            self._failures = 0  # the backoff starts again only after a session that worked

    def left(self, session: _BridgeSession, details: Any) -> None:
        """The router session ended (GOODBYE, ABORT or a lost connection); the service reconnects."""
        if self.session is not session:
            if details is not None and not self._stopping:
                # ABORT before WELCOME: bad credentials, unknown realm, ... worth an operator's eye.
                log.warn(
                    "bridge: {url} ended the session before it was usable: {reason} {message}",
                    url=self.url,
                    reason=details.reason,
                    message=details.message or "",
                )
            return
        self.session = None
        was_active = self.active
        self.active = False
        self._interest = None
        self._synced = None
        self._router_subs.clear()
        if self.rpc is not None:
            self.rpc.stop()
        if not self._stopping:
            log.info(
                "bridge: left {url}{reason}; reconnecting (interest kept until the router is read again)",
                url=self.url,
                reason="" if details is None else f" ({details.reason})",
            )
        if was_active:
            self._metrics.event(BridgeEvent.DEACTIVATIONS)

    def _registration_deleted(self, session_id: int, registration_id: int) -> None:
        """A registration went away: if it was the lock, a standby bridge may now become active."""
        if self.rpc is not None:
            self.rpc.deleted(registration_id)
        session = self.session
        if session is not None and not self.active and not self._stopping:
            defer.ensureDeferred(self._try_lead(session)).addErrback(
                lambda f: log.warn("bridge: taking over failed: {error}", error=f.getErrorMessage())
            )

    async def _try_lead(self, session: _BridgeSession) -> None:
        """Register the lock procedure: success makes us active, ``procedure_already_exists`` standby.

        One attempt at a time per session: a second REGISTER while ours is on
        the way would be refused by our own registration.
        """
        if self._leading is session or self.active:
            return
        self._leading = session
        try:
            await session.register(self._lock_called, self.lock)
        except ApplicationError as e:
            if e.error != ApplicationError.PROCEDURE_ALREADY_EXISTS:
                raise
            if self._hub_topics:
                log.info("bridge: another bridge is active on {url}; standing by", url=self.url)
            if self.session is session:
                self._sync_hub(set())
            return
        finally:
            if self._leading is session:
                self._leading = None
        if self.session is not session:
            return
        self.active = True
        self._metrics.event(BridgeEvent.ACTIVATIONS)
        log.info("bridge: active on {url} (holds {lock})", url=self.url, lock=self.lock)
        await self._read_interest(session)
        if self.rpc is not None and self.session is session:
            await self.rpc.start(session)

    def _lock_called(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The lock procedure answers who holds it (handy for operators)."""
        return {"node": self._hub.node_id, "session": None if self.session is None else self.session._session_id}

    async def _read_interest(self, session: _BridgeSession) -> None:
        """Follow the meta events, then read every existing subscription; then match the hub to it.

        Meta events that arrive while the listing is read update the interest
        but not the hub; once it is read, the hub is set to the whole interest
        (topics found unchanged after a reconnect are not churned) and later
        facts apply one by one.
        """
        interest = self._interest = RouterInterest(int(session._session_id or 0), self.role)
        for topic in META_EVENTS:
            await session.subscribe(self._meta_event(interest, topic), topic)
        listing = await session.call("wamp.subscription.list")
        ids = [sub_id for kind in ("exact", "prefix", "wildcard") for sub_id in listing.get(kind, ())]
        if not listing.get("wildcard"):
            # Crossbar 26.10 leaves wildcard subscriptions out of the router-wide list
            # (a FIXME in crossbar/router/service.py); the per-session list has them.
            ids += await self._wildcards_by_session(session, set(ids))
        for start in range(0, len(ids), READ_BATCH):
            batch = ids[start : start + READ_BATCH]
            await defer.gatherResults([defer.ensureDeferred(self._read_one(session, interest, i)) for i in batch])
        if self._interest is not interest:
            return
        self._sync_hub(interest.wanted())
        self._synced = interest
        self._schedule_reconcile()

    async def _wildcards_by_session(self, session: _BridgeSession, known: set[int]) -> list[int]:
        """Wildcard subscription ids from ``wamp.subscription.list(session)`` of every session."""
        found: dict[int, None] = {}
        sessions = await session.call("wamp.session.list")
        for start in range(0, len(sessions or ()), READ_BATCH):
            batch = sessions[start : start + READ_BATCH]
            answers = await defer.gatherResults(
                [defer.ensureDeferred(self._session_subscriptions(session, s)) for s in batch]
            )
            for answer in answers:
                for sub_id in answer.get("wildcard", ()) if isinstance(answer, dict) else ():
                    if sub_id not in known:
                        found[sub_id] = None
        return list(found)

    async def _session_subscriptions(self, session: _BridgeSession, session_id: int) -> Any:
        try:
            return await session.call("wamp.subscription.list", session_id)
        except ApplicationError:  # left meanwhile, or a restricted session
            return {}

    async def _read_one(self, session: _BridgeSession, interest: RouterInterest, sub_id: int) -> None:
        try:
            described = await session.call("wamp.subscription.get", sub_id)
            members = await session.call("wamp.subscription.list_subscribers", sub_id)
        except ApplicationError:  # deleted meanwhile
            self._apply(interest, interest.deleted(sub_id))
            return
        if isinstance(described, dict):
            self._apply(interest, interest.listed(described, members or ()))

    def _meta_event(self, interest: RouterInterest, topic: str) -> Any:
        def handle(session_id: int, arg: Any, *rest: Any, **kwargs: Any) -> None:
            if self._interest is not interest:
                return
            if topic.endswith("on_create"):
                step = interest.created(session_id, arg)
            elif topic.endswith("on_subscribe"):
                step = interest.subscribed(session_id, arg)
            elif topic.endswith("on_unsubscribe"):
                step = interest.unsubscribed(session_id, arg)
            else:
                step = interest.deleted(arg)
            self._apply(interest, step)

        return handle

    def _apply(self, interest: RouterInterest, step: InterestStep) -> None:
        """Carry out an interest step: hub (un)subscriptions once the listing is read, role questions."""
        if self._synced is interest and self._interest is interest and self.active:
            for topic in step.added:
                self._hub_subscribe(topic)
            for topic in step.removed:
                self._hub_unsubscribe(topic)
        for session_id in step.lookup:
            defer.ensureDeferred(self._ask_role(interest, session_id))

    async def _ask_role(self, interest: RouterInterest, session_id: int) -> None:
        session = self.session
        if session is None:
            return
        try:
            role = await router_role(session, session_id)
        except Exception as e:  # our own session went away meanwhile
            log.debug("bridge: wamp.session.get {session} failed: {error}", session=session_id, error=e)
            return
        self._apply(interest, interest.role_known(session_id, role))

    # -- interest: router clients -> hub ----------------------------------------------------

    def _sync_hub(self, wanted: set[Interest]) -> None:
        """Make what our sink holds in the hub equal to ``wanted`` (no churn for unchanged interest)."""
        for interest in sorted(self._hub_topics - wanted):
            self._hub_unsubscribe(interest)
        for interest in sorted(wanted - self._hub_topics):
            self._hub_subscribe(interest)

    def _hub_subscribe(self, interest: Interest) -> None:
        match, uri = interest
        if interest in self._hub_topics or match not in (EXACT, *MATCHES):
            return
        hub = self.realm_map.to_hub(uri) if match == EXACT else self.realm_map.to_hub_pattern(match, uri)
        if hub is None:
            return
        self._hub_topics.add(interest)
        if isinstance(hub, str):
            self._hub.subscribe(hub, self._sink)
        else:
            self._hub.subscribe_pattern(hub, self._sink)

    def _hub_unsubscribe(self, interest: Interest) -> None:
        if interest not in self._hub_topics:
            return
        self._hub_topics.discard(interest)
        match, uri = interest
        hub = self.realm_map.to_hub(uri) if match == EXACT else self.realm_map.to_hub_pattern(match, uri)
        if isinstance(hub, str):
            self._hub.unsubscribe(hub, self._sink)
        elif hub is not None:
            self._hub.unsubscribe_pattern(hub, self._sink)

    # -- cluster -> router ------------------------------------------------------------------

    def publish_into_router(self, envelope: Envelope) -> bool:
        """Publish a message from the cluster into the router for its clients (never back to a bridge)."""
        if envelope is self._last_envelope:
            return False
        topic = self.realm_map.from_hub(envelope.topic)
        if topic is None:
            return False
        self._last_envelope = envelope
        session = self.session
        if session is None or not self.active or not session.is_attached():
            self._metrics.event(BridgeEvent.DROPPED_NO_ROUTER)
            self._metrics.count(
                envelope.topic, Source.BRIDGE, Kind.DROPPED, 1, payload_size(envelope), reason=DropReason.NO_ROUTER
            )
            return False
        args, kwargs = event_arguments(envelope)
        options = PublishOptions(acknowledge=True, exclude_me=True, exclude_authrole=[self.role])
        try:
            d = session.publish(topic, *args, options=options, **(kwargs or {}))
        except Exception as e:  # the connection is going (TransportLost) or the router's serializer refused it
            self._metrics.event(BridgeEvent.PUBLISH_ERRORS)
            log.warn("bridge: publishing on {topic} into the router failed: {error}", topic=envelope.topic, error=e)
            return False
        self._metrics.event(BridgeEvent.INTO_ROUTER)
        if d is not None:
            d.addErrback(self._publish_failed, envelope.topic)
        return True

    def _publish_failed(self, failure: Any, topic: str) -> None:
        self._metrics.event(BridgeEvent.PUBLISH_ERRORS)
        log.warn(
            "bridge: publishing on {topic} into the router failed: {error}",
            topic=topic,
            error=failure.getErrorMessage(),
        )

    # -- router -> cluster ------------------------------------------------------------------

    def _remote_topics_changed(self) -> None:
        self._schedule_reconcile()

    def _schedule_reconcile(self) -> None:
        if self._reconcile_call is None or not self._reconcile_call.active():
            self._reconcile_call = self._reactor.callLater(0, self._reconcile)

    def _reconcile(self) -> None:
        """Subscribe on the router to exactly the topics other nodes want from us (active bridge only)."""
        session = self.session
        if session is None or not self.active or self._stopping:
            return
        federation = self._federation
        realm = self.realm_map
        wanted = {(EXACT, t) for t in map(realm.from_hub, federation.remote_topics()) if t is not None}
        wanted |= {
            (p.match, uri) for p in federation.remote_pattern_set() if (uri := realm.from_hub(p.pattern)) is not None
        }
        for interest in sorted(set(self._router_subs) - wanted):
            self._router_unsubscribe(interest)
        for interest in sorted(wanted - set(self._router_subs)):
            self._router_subscribe(session, interest)

    def _router_subscribe(self, session: _BridgeSession, interest: Interest) -> None:
        match, topic = interest
        options = SubscribeOptions(details=True, match=None if match == EXACT else match)
        d = session.subscribe(self._router_event(topic), topic, options=options)
        self._router_subs[interest] = d

        def made(subscription: Any) -> None:
            if self.session is not session:
                return
            if self._router_subs.get(interest) is d:
                self._router_subs[interest] = subscription
            else:  # no longer wanted while it was being made
                subscription.unsubscribe().addErrback(lambda _: None)

        def failed(failure: Any) -> None:
            if self._router_subs.get(interest) is d:
                del self._router_subs[interest]
            log.warn(
                "bridge: subscribing to {topic} on the router failed: {error}",
                topic=topic,
                error=failure.getErrorMessage(),
            )

        d.addCallbacks(made, failed)

    def _router_unsubscribe(self, interest: Interest) -> None:
        subscription = self._router_subs.pop(interest)
        if not _pending(subscription) and subscription.active:
            subscription.unsubscribe().addErrback(lambda _: None)

    def _router_event(self, topic: str) -> Any:
        def handle(*args: Any, details: Any = None, **kwargs: Any) -> None:
            if details is not None:
                if details.publisher_authrole == self.role or details.retained:
                    self._metrics.event(BridgeEvent.LOOPS_DROPPED)
                    return
                # One publication matching several of our subscriptions arrives once per subscription.
                if details.publication in self._recent_publications:
                    return
                self._recent_publications.append(details.publication)
            concrete = topic if details is None or not details.topic else str(details.topic)
            hub_topic = self.realm_map.to_hub(concrete)
            if hub_topic is None:
                return
            envelope = wamp_envelope(self._hub, hub_topic, args, kwargs)
            self._metrics.event(BridgeEvent.FROM_ROUTER)
            self._metrics.count(hub_topic, Source.BRIDGE, Kind.PUBLISHED, 1, payload_size(envelope))
            self._hub.publish(envelope, exclude=self._sink)

        return handle
