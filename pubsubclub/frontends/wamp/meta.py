"""The WAMP meta API of the cluster: ``wamp.session.*``, ``wamp.subscription.*``, ``wamp.registration.*``.

Procedures (answered by the node the caller is on, for the whole cluster;
docs/architecture.md, "Meta API"):

- ``wamp.session.count/list/get``: the sessions of the caller's realm on
  every node, asked of each node over its PSC 0.7 link (below);
- ``wamp.subscription.list/lookup/match/get/list_subscribers/count_subscribers``:
  a subscription is one (match, URI) in the realm across the cluster; each
  node numbers it itself (the id its subscribers got in SUBSCRIBED), and any
  node's id names it; answers list one id per (match, URI), this node's when
  it has one; subscribers are those of every node;
- ``wamp.registration.list/lookup/match/get/list_callees/count_callees``:
  from the dealer's table, which holds every node's registrations already;
  a registration is the group of callees of one (match, procedure), named by
  any of its callees' ids; ``list_callees`` asks the callees' nodes for
  their session ids.

Events (``on_join``/``on_leave``, ``on_create``/``on_subscribe``/``on_unsubscribe``/
``on_delete``, ``on_create``/``on_register``/``on_unregister``/``on_delete``)
are published by the node of the session concerned on reserved hub topics
``$meta.<realm>#<uri>`` (:func:`meta_topic`), which the router maps WAMP
meta URIs to: the federation carries them like any topic (no client of any
front-end can publish on a ``$`` topic), and an event nobody on any node
subscribed to is not even built.

Asking the other nodes: a PSC403 (0.7 CALL) of procedure
``$pubsubclub.meta.query`` (no registration: the receiving node's
:class:`~pubsubclub.federation.rpc.ClusterRPC` hands it here) with args
``[query, params]``, answered by PSC404 ``[answer]`` or PSC405. Each node
answers at most ``max_results + 1`` items; a node that does not answer
within ``timeout`` (or whose link drops) is named in ERROR
``pubsubclub.error.meta_incomplete``, never waited on longer, and so is a
node known but not linked to be asked (``unasked``: still being dialled,
down, or linked in the other role only), at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from autobahn.wamp import message
from twisted.logger import Logger

from pubsubclub.core.compaction import Compaction
from pubsubclub.federation.psc_rpc import META_QUERY
from pubsubclub.frontends.wamp.publishing import wamp_envelope
from pubsubclub.frontends.wamp.registrations import _wildcard

if TYPE_CHECKING:
    from pubsubclub.frontends.wamp.broker import BrokerSession
    from pubsubclub.frontends.wamp.registrations import _Registration
    from pubsubclub.frontends.wamp.router import WampRouter

__all__ = ["META_PREFIXES", "QUERY_PROCEDURE", "MetaLimits", "WampMeta", "meta_topic"]

log = Logger()

#: WAMP URIs of the meta API; the router maps them to :func:`meta_topic` hub topics.
META_PREFIXES = ("wamp.session.", "wamp.subscription.", "wamp.registration.")
#: The procedure of a node-to-node meta query (a PSC403 for no registration; reserved: clients cannot call ``$``).
QUERY_PROCEDURE = META_QUERY
#: The registration id such a PSC403 carries (the codec wants one; nobody looks it up).
QUERY_REGISTRATION = 1

NO_SUCH_SESSION = "wamp.error.no_such_session"
NO_SUCH_SUBSCRIPTION = "wamp.error.no_such_subscription"
NO_SUCH_REGISTRATION = "wamp.error.no_such_registration"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
PAYLOAD_SIZE_EXCEEDED = "wamp.error.payload_size_exceeded"
#: A list answer would hold more than ``max_results`` items.
TOO_MANY_RESULTS = "pubsubclub.error.too_many_results"
#: More than ``max_queries`` meta queries to other nodes in flight on this node.
TOO_MANY_QUERIES = "pubsubclub.error.too_many_meta_queries"
#: Some node did not answer (in time): the answer would be incomplete.
INCOMPLETE = "pubsubclub.error.meta_incomplete"

_MATCHES = ("exact", "prefix", "wildcard")
#: Most nodes a relayed ``meta_incomplete`` may name (``kwargs.nodes``); a longer list is not taken apart.
MAX_NAMED_NODES = 1024
#: Longest node name (or URL) taken from such a list.
MAX_NODE_NAME = 512


def meta_topic(realm: str, uri: str) -> str:
    """The reserved hub topic of WAMP meta URI ``uri`` in ``realm``."""
    return f"$meta.{realm}#{uri}"


def _iso(seconds: float) -> str:
    """A time as WAMP meta details give it (ISO 8601, UTC, milliseconds)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _real_id(registration: _Registration) -> int:
    """The id the callee got in REGISTERED (on its own node)."""
    return registration.id if registration.remote_id is None else registration.remote_id


class _BadArgument(ValueError):
    """A meta call's (or query's) arguments are not what the procedure takes."""


@dataclass(frozen=True)
class MetaLimits:
    """Bounds of the meta API (``[wamp] meta-max-results``, ``meta-timeout``, ``meta-max-queries``)."""

    #: Most items one list answer holds; past it ERROR ``pubsubclub.error.too_many_results``.
    max_results: int = 10_000
    #: Seconds to wait for the other nodes' answers.
    timeout: float = 5.0
    #: Meta queries to other nodes in flight on this node at once.
    max_queries: int = 100


@dataclass(eq=False)
class _Subscription:
    """This node's subscription of one (match, URI) in a realm: what wamp.subscription.get tells."""

    id: int
    realm: str
    match: str
    uri: str
    created: float
    #: The router's key (hub topic or pattern), whose holders tell when it is deleted.
    key: Any

    def details(self) -> dict[str, Any]:
        """wamp.subscription.get's answer."""
        return {"id": self.id, "created": _iso(self.created), "uri": self.uri, "match": self.match}


@dataclass(eq=False)
class _Query:
    """One question to other nodes: who has not answered yet, and the answers so far."""

    done: Callable[[dict[str, Any], dict[str, str]], None]
    #: (link session, call id) -> node.
    waiting: dict[tuple[Any, int], str] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    #: Node -> why it gave no answer.
    missing: dict[str, str] = field(default_factory=dict)
    timer: Any = None


class WampMeta:
    """The meta API of one router: its hooks (sessions, subscriptions, registrations), calls and queries."""

    def __init__(self, router: WampRouter, limits: MetaLimits = MetaLimits()) -> None:  # noqa: B008 - frozen
        self.router = router
        self.limits = limits
        #: The cluster's RPC (federation/rpc.py): the links other nodes are asked over; None: one node.
        self.rpc: Any = None
        #: Whether another node subscribed to a hub topic (the federation's forwarding table).
        self.remote_wants: Callable[[str], bool] = lambda topic: False
        #: Nodes known (dialled, discovered, linked) but not among those asked: name -> why (relay.py).
        self.unasked: Callable[[set[str], Any], dict[str, str]] = lambda asked, source: {}
        #: Established sessions: id -> (session, authmethod, authprovider).
        self._sessions: dict[int, tuple[BrokerSession, str, str | None]] = {}
        #: This node's subscriptions by id, and by (realm, match, uri).
        self._subs: dict[int, _Subscription] = {}
        self._sub_keys: dict[tuple[str, str, str], int] = {}
        #: Both kinds of table are copied smaller once they have emptied (core/compaction.py).
        self._sessions_compaction = Compaction()
        self._subs_compaction = Compaction()
        #: Queries to other nodes in flight, and their calls by (link session, call id).
        self._queries: dict[_Query, None] = {}
        self._waiting: dict[tuple[Any, int], _Query] = {}
        self._procedures: dict[str, Callable[[BrokerSession, message.Call], None]] = {
            "wamp.session.count": self._session_count,
            "wamp.session.list": self._session_list,
            "wamp.session.get": self._session_get,
            "wamp.subscription.list": self._subscription_list,
            "wamp.subscription.lookup": self._subscription_lookup,
            "wamp.subscription.match": self._subscription_match,
            "wamp.subscription.get": self._subscription_get,
            "wamp.subscription.list_subscribers": self._list_subscribers,
            "wamp.subscription.count_subscribers": self._count_subscribers,
            "wamp.registration.list": self._registration_list,
            "wamp.registration.lookup": self._registration_lookup,
            "wamp.registration.match": self._registration_match,
            "wamp.registration.get": self._registration_get,
            "wamp.registration.list_callees": self._list_callees,
            "wamp.registration.count_callees": self._count_callees,
        }

    def attach(
        self,
        rpc: Any,
        remote_wants: Callable[[str], bool],
        unasked: Callable[[set[str], Any], dict[str, str]] | None = None,
    ) -> None:
        """Answer for the cluster: ask other nodes over ``rpc``'s links, publish events they subscribed to.

        ``unasked(asked, source)``: the nodes known but not linked to be asked
        (the federation's :meth:`~pubsubclub.federation.relay.Relay.unasked_nodes`);
        they are named in ``meta_incomplete``, never silently left out.
        """
        self.rpc = rpc
        rpc.meta = self
        self.remote_wants = remote_wants
        if unasked is not None:
            self.unasked = unasked

    @property
    def node_id(self) -> str:
        """This node's id (as other nodes name it)."""
        return self.router.hub.node_id

    def stats(self) -> dict[str, int]:
        """Entries in the meta API's tables (all 0 once every session has left)."""
        return {"sessions": len(self._sessions), "subscriptions": len(self._subs), "queries": len(self._queries)}

    # -- events ------------------------------------------------------------------------------

    def _publish(self, realm: str, uri: str, args: list[Any]) -> None:
        """Publish a meta event, if any session on any node subscribed to it."""
        topic = meta_topic(realm, uri)
        hub = self.router.hub
        if hub.subscribers(topic) or self.remote_wants(topic):
            hub.publish(wamp_envelope(hub, topic, args, None))

    def joined(self, session: BrokerSession, authmethod: str, authprovider: str | None) -> None:
        """A session was welcomed: on_join."""
        sid = session.session_id
        assert sid is not None and session.realm is not None
        self._sessions[sid] = (session, authmethod, authprovider)
        self._sessions_compaction.grown(len(self._sessions))
        self._publish(session.realm, "wamp.session.on_join", [self._details(sid)])

    def leaving(self, session: BrokerSession) -> None:
        """An established session is ending, its subscriptions still held: on_unsubscribe (and on_delete) for each."""
        for sub_id in list(session._subscriptions):  # the broker's own table, read once per leave
            self._unsubscribed(session, sub_id, leaving=True)

    def left(self, session: BrokerSession) -> None:
        """An established session ended (its subscriptions and registrations are gone): on_leave."""
        sid = session.session_id
        if sid is None or self._sessions.pop(sid, None) is None or session.realm is None:
            return
        if self._sessions_compaction.due(len(self._sessions)):
            self._sessions = dict(self._sessions)
        self._publish(session.realm, "wamp.session.on_leave", [sid, session.authid, session.authrole])

    def subscribed(self, session: BrokerSession, sub_id: int, match: str, uri: str, key: Any) -> None:
        """A session holds a new subscription: on_create if it is new on this node, then on_subscribe."""
        realm = session.realm
        assert realm is not None
        if uri.startswith("wamp."):
            return  # not for the meta API itself (as Crossbar): no events, not listed
        sub = self._subs.get(sub_id)
        if sub is None:
            sub = self._subs[sub_id] = _Subscription(sub_id, realm, match, uri, self.router.clock(), key)
            self._sub_keys[(realm, match, uri)] = sub_id
            self._subs_compaction.grown(len(self._subs))
            self._publish(realm, "wamp.subscription.on_create", [session.session_id, sub.details()])
        self._publish(realm, "wamp.subscription.on_subscribe", [session.session_id, sub_id])

    def unsubscribed(self, session: BrokerSession, sub_id: int) -> None:
        """A session dropped a subscription (UNSUBSCRIBE): on_unsubscribe, and on_delete if it was the last here."""
        self._unsubscribed(session, sub_id, leaving=False)

    def _unsubscribed(self, session: BrokerSession, sub_id: int, leaving: bool) -> None:
        sub = self._subs.get(sub_id)
        if sub is None:
            return
        holders = self.router.subscription_sessions(sub.key)
        # Leaving: the session still holds it (released right after); else it was released already.
        gone = holders <= (1 if leaving else 0)
        self._publish(sub.realm, "wamp.subscription.on_unsubscribe", [session.session_id, sub_id])
        if gone:
            del self._subs[sub_id]
            self._sub_keys.pop((sub.realm, sub.match, sub.uri), None)
            if self._subs_compaction.due(len(self._subs)):
                self._subs, self._sub_keys = dict(self._subs), dict(self._sub_keys)
            self._publish(sub.realm, "wamp.subscription.on_delete", [session.session_id, sub_id])

    # The dealer's observer (dealer.py): this node's own registrations only.

    def registered(self, registration: _Registration) -> None:
        """A local registration was made: on_create if its procedure had none in the cluster, then on_register."""
        sid = getattr(registration.callee, "session_id", None)
        group = self.router.dealer._by_procedure.get(  # the dealer's cluster-wide table
            (registration.realm, registration.match, registration.procedure), ()
        )
        if len(group) == 1:
            details = self._registration_details(registration)
            self._publish(registration.realm, "wamp.registration.on_create", [sid, details])
        self._publish(registration.realm, "wamp.registration.on_register", [sid, registration.id])

    def unregistered(self, registration: _Registration) -> None:
        """A local registration went: on_unregister, and on_delete if its procedure has none left in the cluster."""
        sid = getattr(registration.callee, "session_id", None)
        self._publish(registration.realm, "wamp.registration.on_unregister", [sid, registration.id])
        key = (registration.realm, registration.match, registration.procedure)
        if key not in self.router.dealer._by_procedure:
            self._publish(registration.realm, "wamp.registration.on_delete", [sid, registration.id])

    # -- calls from clients ------------------------------------------------------------------

    def call(self, session: BrokerSession, msg: message.Call) -> bool:
        """A CALL of a meta procedure (already authorized): answered here; False if it names none."""
        handler = self._procedures.get(msg.procedure)
        if handler is None:
            return False
        try:
            handler(session, msg)
        except _BadArgument as e:
            self._error(session, msg, INVALID_ARGUMENT, str(e))
        return True

    def _result(self, session: BrokerSession, msg: message.Call, value: Any) -> None:
        too_big = session.send_if_fits(message.Result(msg.request, args=[value]))
        if too_big is not None:
            size, limit = too_big
            text = f"the answer would be a message of {size} bytes, over this session's limit of {limit}"
            self._error(session, msg, PAYLOAD_SIZE_EXCEEDED, text, {"limit": "max-message-size", "max": limit})

    def _error(
        self, session: BrokerSession, msg: message.Call, uri: str, text: str, kwargs: dict[str, Any] | None = None
    ) -> None:
        session.send_message(message.Error(message.Call.MESSAGE_TYPE, msg.request, uri, args=[text], kwargs=kwargs))

    def _too_many(self, session: BrokerSession, msg: message.Call, what: str) -> None:
        limit = self.limits.max_results
        text = f"more than {limit} {what}: the limit of one meta answer (wamp.meta-max-results)"
        self.router.refused("too_many_results")
        self._error(session, msg, TOO_MANY_RESULTS, text, {"limit": "wamp.meta-max-results", "max": limit})

    def _incomplete(self, session: BrokerSession, msg: message.Call, missing: dict[str, str]) -> None:
        nodes = sorted(missing)
        why = "; ".join(f"{node}: {missing[node]}" for node in nodes)
        text = f"{len(nodes)} node(s) gave no answer, so the answer would be incomplete ({why})"
        self._error(session, msg, INCOMPLETE, text, {"nodes": nodes})

    def _gather(
        self,
        session: BrokerSession,
        msg: message.Call,
        query: str,
        params: dict[str, Any],
        finish: Callable[[dict[str, Any]], None],
        links: list[tuple[str, Any]] | None = None,
        local: bool = True,
    ) -> None:
        """Answer ``query`` here (``local``) and on the other nodes (``links``: all), then ``finish(answers)``.

        ``answers`` maps node -> answer; a node that gave none makes the call end
        with ERROR ``meta_incomplete`` instead.
        """
        answers: dict[str, Any] = {}
        if local:
            answers[self.node_id] = self._answer(query, params)

        def done(remote: dict[str, Any], missing: dict[str, str]) -> None:
            if missing:
                self._incomplete(session, msg, missing)
                return
            answers.update(remote)
            finish(answers)

        if not self._ask(query, params, done, links):
            limit = self.limits.max_queries
            text = f"this node already has {len(self._queries)} meta queries in flight, the limit is {limit}"
            self.router.refused("too_many_meta_queries")
            self._error(session, msg, TOO_MANY_QUERIES, text, {"limit": "wamp.meta-max-queries", "max": limit})

    # wamp.session.*

    def _roles(self, msg: message.Call) -> list[str] | None:
        roles = (msg.args or [None])[0]
        if roles is None:
            return None
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise _BadArgument("filter_authroles must be a list of role names")
        return roles

    def _session_count(self, session: BrokerSession, msg: message.Call) -> None:
        params = {"realm": session.realm, "roles": self._roles(msg)}
        self._gather(session, msg, "count", params, lambda answers: self._result(session, msg, _total(answers)))

    def _session_list(self, session: BrokerSession, msg: message.Call) -> None:
        params = {"realm": session.realm, "roles": self._roles(msg)}

        def finish(answers: dict[str, Any]) -> None:
            ids = _ids(answers)
            if len(ids) > self.limits.max_results:
                self._too_many(session, msg, "sessions")
            else:
                self._result(session, msg, ids)

        self._gather(session, msg, "sessions", params, finish)

    def _session_get(self, session: BrokerSession, msg: message.Call) -> None:
        sid = _int_arg(msg, "session")
        found = self._answer("session", {"realm": session.realm, "id": sid})
        if found is not None:
            self._result(session, msg, found)
            return

        def finish(answers: dict[str, Any]) -> None:
            for node in sorted(answers):
                if answers[node] is not None:
                    self._result(session, msg, answers[node])
                    return
            self._error(session, msg, NO_SUCH_SESSION, f"no session {sid} in this realm")

        self._gather(session, msg, "session", {"realm": session.realm, "id": sid}, finish, local=False)

    # wamp.subscription.*

    def _subscription_list(self, session: BrokerSession, msg: message.Call) -> None:
        def finish(answers: dict[str, Any]) -> None:
            merged = _merge_subscriptions(answers, self.node_id)
            if len(merged) > self.limits.max_results:
                self._too_many(session, msg, "subscriptions")
                return
            out: dict[str, list[int]] = {m: [] for m in _MATCHES}
            for (match, _uri), sub_id in merged.items():
                out[match].append(sub_id)
            self._result(session, msg, out)

        self._gather(session, msg, "sub_list", {"realm": session.realm}, finish)

    def _subscription_lookup(self, session: BrokerSession, msg: message.Call) -> None:
        uri = _str_arg(msg, "topic")
        match = _match_option(msg)
        params = {"realm": session.realm, "match": match, "uri": uri}
        found = self._answer("sub_lookup", params)
        if found is not None:
            self._result(session, msg, found)
            return

        def finish(answers: dict[str, Any]) -> None:
            ids = [answers[node] for node in sorted(answers) if answers[node] is not None]
            self._result(session, msg, ids[0] if ids else None)

        self._gather(session, msg, "sub_lookup", params, finish, local=False)

    def _subscription_match(self, session: BrokerSession, msg: message.Call) -> None:
        topic = _str_arg(msg, "topic")

        def finish(answers: dict[str, Any]) -> None:
            merged = _merge_subscriptions(answers, self.node_id)
            if len(merged) > self.limits.max_results:
                self._too_many(session, msg, "subscriptions")
            else:
                self._result(session, msg, list(merged.values()) or None)

        self._gather(session, msg, "sub_match", {"realm": session.realm, "topic": topic}, finish)

    def _resolve_subscription(
        self, session: BrokerSession, msg: message.Call, then: Callable[[dict[str, Any]], None]
    ) -> None:
        """Find subscription ``args[0]`` (this node's or another's) and call ``then(details)``, or answer ERROR."""
        sub_id = _int_arg(msg, "subscription")
        params = {"realm": session.realm, "id": sub_id}
        found = self._answer("sub_get", params)
        if found is not None:
            then(found)
            return

        def finish(answers: dict[str, Any]) -> None:
            for node in sorted(answers):
                found = answers[node]
                if isinstance(found, dict) and found.get("match") in _MATCHES and isinstance(found.get("uri"), str):
                    then(found)
                    return
            self._error(session, msg, NO_SUCH_SUBSCRIPTION, f"no subscription {sub_id} in this realm")

        self._gather(session, msg, "sub_get", params, finish, local=False)

    def _subscription_get(self, session: BrokerSession, msg: message.Call) -> None:
        self._resolve_subscription(session, msg, lambda details: self._result(session, msg, details))

    def _list_subscribers(self, session: BrokerSession, msg: message.Call) -> None:
        self._subscribers(session, msg, count=False)

    def _count_subscribers(self, session: BrokerSession, msg: message.Call) -> None:
        self._subscribers(session, msg, count=True)

    def _subscribers(self, session: BrokerSession, msg: message.Call, count: bool) -> None:
        def found(details: dict[str, Any]) -> None:
            params = {"realm": session.realm, "match": details["match"], "uri": details["uri"], "count": count}

            def finish(answers: dict[str, Any]) -> None:
                if count:
                    self._result(session, msg, _total(answers))
                    return
                ids = _ids(answers)
                if len(ids) > self.limits.max_results:
                    self._too_many(session, msg, "subscribers")
                else:
                    self._result(session, msg, ids)

            self._gather(session, msg, "subscribers", params, finish)

        self._resolve_subscription(session, msg, found)

    # wamp.registration.* (the dealer's table holds every node's registrations)

    def _groups(self, realm: str) -> dict[tuple[str, str, str], list[_Registration]]:
        table = self.router.dealer._by_procedure  # the dealer's cluster-wide table
        return {key: group for key, group in table.items() if key[0] == realm and group}

    def _find_registration(self, realm: str | None, reg_id: int) -> _Registration | None:
        dealer = self.router.dealer
        registration = dealer._by_id.get(reg_id)
        if registration is None:
            for own in dealer._remote.values():  # one dict per linked node
                registration = own.get(reg_id)
                if registration is not None:
                    break
        return registration if registration is not None and registration.realm == realm else None

    def _registration_details(self, registration: _Registration) -> dict[str, Any]:
        return {
            "id": _real_id(registration),
            "created": _iso(registration.created),
            "uri": registration.procedure,
            "match": registration.match,
            "invoke": registration.invoke,
        }

    def _registration_list(self, session: BrokerSession, msg: message.Call) -> None:
        groups = self._groups(session.realm or "")
        if len(groups) > self.limits.max_results:
            self._too_many(session, msg, "registrations")
            return
        out: dict[str, list[int]] = {m: [] for m in _MATCHES}
        for (_realm, match, _procedure), group in groups.items():
            out.setdefault(match, []).append(_real_id(group[0]))
        self._result(session, msg, out)

    def _registration_lookup(self, session: BrokerSession, msg: message.Call) -> None:
        procedure = _str_arg(msg, "procedure")
        group = self._groups(session.realm or "").get((session.realm or "", _match_option(msg), procedure))
        self._result(session, msg, _real_id(group[0]) if group else None)

    def _registration_match(self, session: BrokerSession, msg: message.Call) -> None:
        procedure = _str_arg(msg, "procedure")
        groups = self._groups(session.realm or "")
        group = groups.get((session.realm or "", "exact", procedure))
        if group is None:
            best: tuple[int, int, str] | None = None
            for (_realm, match, pattern), candidates in groups.items():
                rank: tuple[int, int, str] | None = None
                if match == "prefix" and procedure.startswith(pattern):
                    rank = (1, len(pattern), pattern)
                elif match == "wildcard" and _wildcard(pattern, procedure):
                    rank = (0, sum(1 for part in pattern.split(".") if part), pattern)
                if rank is not None and (best is None or rank > best):
                    best, group = rank, candidates
        self._result(session, msg, _real_id(group[0]) if group else None)

    def _registration_group(self, session: BrokerSession, msg: message.Call) -> list[_Registration] | None:
        reg_id = _int_arg(msg, "registration")
        registration = self._find_registration(session.realm, reg_id)
        group = None
        if registration is not None:
            key = (registration.realm, registration.match, registration.procedure)
            group = self.router.dealer._by_procedure.get(key)
        if not group:
            self._error(session, msg, NO_SUCH_REGISTRATION, f"no registration {reg_id} in this realm")
            return None
        return group

    def _registration_get(self, session: BrokerSession, msg: message.Call) -> None:
        registration = self._find_registration(session.realm, _int_arg(msg, "registration"))
        if registration is None:
            self._error(session, msg, NO_SUCH_REGISTRATION, f"no registration {msg.args[0]} in this realm")
            return
        self._result(session, msg, self._registration_details(registration))

    def _count_callees(self, session: BrokerSession, msg: message.Call) -> None:
        group = self._registration_group(session, msg)
        if group is not None:
            self._result(session, msg, len(group))

    def _list_callees(self, session: BrokerSession, msg: message.Call) -> None:
        group = self._registration_group(session, msg)
        if group is None:
            return
        if len(group) > self.limits.max_results:
            self._too_many(session, msg, "callees")
            return
        local = [getattr(r.callee, "session_id", None) for r in group if r.remote_id is None]
        # Another node's callees are that node's sessions: each such node is asked for their ids.
        links: dict[Any, str] = {}
        remote_ids: list[int] = []
        for r in group:
            if r.remote_id is not None:
                links.setdefault(r.callee, r.node)
                remote_ids.append(r.remote_id)
        if not links:
            self._result(session, msg, local)
            return

        def finish(answers: dict[str, Any]) -> None:
            self._result(session, msg, local + _ids(answers))

        params = {"ids": remote_ids}
        pairs = [(node, link) for link, node in links.items()]
        self._gather(session, msg, "callees", params, finish, links=pairs, local=False)

    # -- this node's answers (to its own callers and to other nodes) ------------------------------

    def _details(self, sid: int) -> dict[str, Any]:
        session, authmethod, authprovider = self._sessions[sid]
        transport = session._transport  # what kind of connection it came over
        kind = "rawsocket" if "RawSocket" in type(transport).__name__ else "websocket"
        return {
            "session": sid,
            "realm": session.realm,
            "authid": session.authid,
            "authrole": session.authrole,
            "authmethod": authmethod,
            "authprovider": authprovider,
            "transport": {"type": kind, "peer": session._source},
            "node": self.node_id,
        }

    def _answer(self, query: str, params: Any) -> Any:
        """This node's part of ``query`` (raises :class:`_BadArgument` for parameters it cannot take)."""
        if not isinstance(params, dict):
            raise _BadArgument("query parameters must be an object")
        limit = self.limits.max_results
        if query == "callees":
            return self._callees(params)
        realm = params.get("realm")
        if query in ("count", "sessions"):
            roles = params.get("roles")
            ids = [
                sid
                for sid, (s, _, _) in self._sessions.items()
                if s.realm == realm and (roles is None or s.authrole in roles)
            ]
            return len(ids) if query == "count" else ids[: limit + 1]
        if query == "session":
            entry = self._sessions.get(params.get("id"))  # type: ignore[arg-type]
            return None if entry is None or entry[0].realm != realm else self._details(entry[0].session_id or 0)
        if query == "sub_lookup":
            return self._sub_keys.get((realm, params.get("match"), params.get("uri")))  # type: ignore[arg-type]
        if query == "sub_get":
            sub = self._subs.get(params.get("id"))  # type: ignore[arg-type]
            return None if sub is None or sub.realm != realm else sub.details()
        if query == "sub_list":
            return [[s.id, s.match, s.uri] for s in self._subs.values() if s.realm == realm][: limit + 1]
        if query == "sub_match":
            topic = params.get("topic")
            if not isinstance(topic, str):
                raise _BadArgument("topic must be a string")
            return [[s.id, s.match, s.uri] for s in self._subs.values() if s.realm == realm and _matches(s, topic)][
                : limit + 1
            ]
        if query == "subscribers":
            sub_id = self._sub_keys.get((realm, params.get("match"), params.get("uri")))  # type: ignore[arg-type]
            if sub_id is None:
                return 0 if params.get("count") else []
            holders = [
                sid
                for sid, (s, _, _) in self._sessions.items()
                if sub_id in s._subscriptions  # the broker's own table
            ]
            return len(holders) if params.get("count") else holders[: limit + 1]
        raise _BadArgument(f"unknown meta query {str(query)[:40]!r}")

    def _callees(self, params: dict[str, Any]) -> list[int]:
        """The session ids of this node's callees among registrations ``params["ids"]``."""
        ids = params.get("ids")
        if not isinstance(ids, list):
            raise _BadArgument("callees takes a list of registration ids")
        table = self.router.dealer._by_id
        out = []
        for reg_id in ids[: self.limits.max_results + 1]:
            registration = table.get(reg_id) if type(reg_id) is int else None
            sid = getattr(registration.callee, "session_id", None) if registration is not None else None
            if sid is not None:
                out.append(sid)
        return out

    # -- node-to-node queries (federation/rpc.py hands these over) ------------------------------

    def _ask(
        self,
        query: str,
        params: dict[str, Any],
        done: Callable[[dict[str, Any], dict[str, str]], None],
        links: list[tuple[str, Any]] | None = None,
        unasked: dict[str, str] | None = None,
    ) -> bool:
        """Send ``query`` to every other node (or those of ``links``); ``done(answers, missing)`` once all answered.

        ``unasked``: nodes already known to be out of reach (named in ``missing``).
        False (nothing sent) past ``max_queries`` queries in flight.
        """
        unreachable: dict[str, str] = dict(unasked or {})
        if links is None:
            links = self.rpc.peers() if self.rpc is not None else []
            required = getattr(self.rpc, "required_peer", None)
            if required is not None:
                if all(node != required for node, _ in links):
                    # A worker whose primary is away (restarting) reaches no other process: say so, never undercount.
                    unreachable[required] = "the link to this node's primary worker is down"
            else:
                # Known nodes not linked (yet) to be asked: named, never left out of the answer silently.
                unreachable.update(self.unasked({node for node, _ in links}, None))
        if not links:
            done({}, unreachable)
            return True
        if len(self._queries) >= self.limits.max_queries:
            return False
        pending = _Query(done)
        pending.missing.update(unreachable)
        timeout = self.limits.timeout
        invocation_args = [query, params]
        seen: set[str] = set()
        for node, link in links:
            if node in seen:
                continue
            seen.add(node)
            key = (link.session, self._new_call_id(link.session))
            pending.waiting[key] = node
            self._waiting[key] = pending
            too_big = link.send_if_fits(
                message.Invocation(
                    key[1],
                    QUERY_REGISTRATION,
                    args=invocation_args,
                    timeout=int(timeout * 1000),
                    procedure=QUERY_PROCEDURE,
                )
            )
            if too_big is not None:
                self._waiting.pop(key, None)
                pending.waiting.pop(key, None)
                pending.missing[node] = "the query is too large for the link"
        if not pending.waiting:
            done(pending.answers, pending.missing)
            return True
        self._queries[pending] = None
        call_later = self.router.call_later
        if call_later is not None:
            pending.timer = call_later(timeout, lambda: self._expire(pending))
        return True

    def _new_call_id(self, link: Any) -> int:
        calls = self.router.dealer._calls  # never the id of a dealer call on the same link
        while True:
            call_id = self.router.new_id()
            if call_id not in calls and (link, call_id) not in self._waiting:
                return call_id

    def _expire(self, pending: _Query) -> None:
        pending.timer = None
        for node in pending.waiting.values():
            pending.missing[node] = f"no answer within {self.limits.timeout:g} s"
        self._finish(pending)

    def _finish(self, pending: _Query) -> None:
        if self._queries.pop(pending, False) is False:
            return
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()
        pending.timer = None
        for key in pending.waiting:
            self._waiting.pop(key, None)
        pending.waiting.clear()
        try:
            pending.done(pending.answers, pending.missing)
        except Exception:
            # Called from a link's message handling: a fault here must not end the link.
            log.failure("WAMP meta API: cannot answer a call from the nodes' answers")

    def answered(self, link: Any, call: int, result: list[Any] | None, error: str | None, kwargs: Any = None) -> bool:
        """A PSC404 (``result``) or PSC405 (``error``) on ``link``: True if it answers one of this node's queries.

        A ``meta_incomplete`` PSC405 from a relaying primary names (``kwargs.nodes``) the nodes it could not
        reach: those are named here in its place (at most :data:`MAX_NAMED_NODES`, strings of 1-256 chars).
        """
        key = (link, call)
        pending = self._waiting.pop(key, None)
        if pending is None:
            return False
        node = pending.waiting.pop(key)
        if error is not None:
            named = _named_nodes(error, kwargs)
            if named:
                for name in named:
                    pending.missing[name] = f"node {node} could not reach it"
            else:
                pending.missing[node] = error
        else:
            pending.answers[node] = (result or [None])[0]
        if not pending.waiting:
            self._finish(pending)
        return True

    def link_closed(self, link: Any) -> None:
        """A link went: the queries waiting on it will not be answered there."""
        for key in [key for key in self._waiting if key[0] is link]:
            pending = self._waiting.pop(key)
            node = pending.waiting.pop(key)
            pending.missing[node] = "the link to it was lost"
            if not pending.waiting:
                self._finish(pending)

    def serve(self, party: Any, call: int, args: Any) -> None:
        """A query from another node (``party``: its callers' stand-in): answer it (PSC404) or say why not (PSC405)."""
        try:
            if not isinstance(args, list) or len(args) != 2:
                raise _BadArgument("a meta query's args are [query, params]")
            answer = self._answer(args[0], args[1])
        except (_BadArgument, TypeError) as e:  # TypeError: an unhashable id or realm from a confused peer
            party.send_message(message.Error(message.Call.MESSAGE_TYPE, call, INVALID_ARGUMENT, args=[str(e)]))
            return
        if getattr(self.rpc, "relaying", False):
            self._serve_relayed(party, call, args[0], args[1], answer)
            return
        self._send_answer(party, call, answer)

    def _serve_relayed(self, party: Any, call: int, query: str, params: dict[str, Any], answer: Any) -> None:
        """The primary of a node with workers answers for what the asker reaches through it alone.

        A query from another node: this process and its workers; from a worker: this process,
        the other workers and the other nodes (split horizon, as messages are relayed). Their
        answers are combined into one, so the asker counts each session once.
        """
        asks: list[tuple[dict[str, Any], list[tuple[str, Any]], dict[str, str]]] = []
        if query == "callees":
            ids = params.get("ids")
            for link, (node, own_ids) in self.rpc.relay_callees(party, ids if isinstance(ids, list) else []).items():
                asks.append(({"ids": own_ids}, [(node, link)], {}))
        else:
            links = self.rpc.relay_peers(party)
            unasked = self.unasked({node for node, _ in links}, getattr(party, "session", None))
            if links or unasked:
                asks.append((params, links, unasked))
        if not asks:
            self._send_answer(party, call, answer)
            return
        answers: list[Any] = [answer]
        missing: dict[str, str] = {}
        left = [len(asks)]

        def done(remote: dict[str, Any], lost: dict[str, str]) -> None:
            answers.extend(remote[node] for node in sorted(remote))
            missing.update(lost)
            left[0] -= 1
            if left[0]:
                return
            if missing:
                why = "; ".join(f"{node}: {missing[node]}" for node in sorted(missing))
                text = f"node {self.node_id} could not answer for {', '.join(sorted(missing))} ({why})"
                nodes = {"nodes": sorted(missing)[:MAX_NAMED_NODES]}
                error = message.Error(message.Call.MESSAGE_TYPE, call, INCOMPLETE, args=[text], kwargs=nodes)
                party.send_message(error)
                return
            self._send_answer(party, call, _combine(query, params, answers, self.limits.max_results))

        for sub_params, links, unasked in asks:
            if not self._ask(query, sub_params, done, links, unasked):
                text = f"node {self.node_id} already has {len(self._queries)} meta queries in flight"
                party.send_message(message.Error(message.Call.MESSAGE_TYPE, call, TOO_MANY_QUERIES, args=[text]))
                return

    def _send_answer(self, party: Any, call: int, answer: Any) -> None:
        too_big = party.send_if_fits(message.Result(call, args=[answer]))
        if too_big is not None:
            text = f"node {self.node_id}'s answer would be {too_big[0]} bytes, over the link's limit of {too_big[1]}"
            party.send_message(message.Error(message.Call.MESSAGE_TYPE, call, PAYLOAD_SIZE_EXCEEDED, args=[text]))


def _combine(query: str, params: dict[str, Any], answers: list[Any], limit: int) -> Any:
    """One answer to ``query`` from several processes' (a relaying primary's and those it asked)."""
    if query == "count" or (query == "subscribers" and params.get("count")):
        return sum(n for n in answers if type(n) is int)
    if query in ("session", "sub_lookup", "sub_get"):
        return next((a for a in answers if a is not None), None)
    return [item for a in answers if isinstance(a, list) for item in a][: limit + 1]


def _named_nodes(error: str, kwargs: Any) -> list[str]:
    """The nodes a relayed ``meta_incomplete`` names (``kwargs.nodes``), if well formed; else none."""
    if not error.startswith(INCOMPLETE) or not isinstance(kwargs, dict):
        return []
    nodes = kwargs.get("nodes")
    if not isinstance(nodes, list) or len(nodes) > MAX_NAMED_NODES:
        return []
    if not all(isinstance(n, str) and 0 < len(n) <= MAX_NODE_NAME for n in nodes):
        return []
    return nodes


def _total(answers: dict[str, Any]) -> int:
    """The sum of the nodes' counts (a node without WAMP answers null: none)."""
    return sum(n for n in answers.values() if type(n) is int)


def _ids(answers: dict[str, Any]) -> list[int]:
    """The nodes' lists of ids, one after the other by node name (null: none)."""
    return [i for node in sorted(answers) if isinstance(answers[node], list) for i in answers[node] if type(i) is int]


def _matches(sub: _Subscription, topic: str) -> bool:
    if sub.match == "exact":
        return sub.uri == topic
    if sub.match == "prefix":
        return topic.startswith(sub.uri)
    return _wildcard(sub.uri, topic)


def _merge_subscriptions(answers: dict[str, Any], own: str) -> dict[tuple[str, str], int]:
    """(match, uri) -> one id, this node's when it has one, else the first node's (by name)."""
    merged: dict[tuple[str, str], int] = {}
    for node in sorted(answers, key=lambda n: (n != own, n)):
        for item in answers[node] or ():
            if isinstance(item, list) and len(item) == 3:
                merged.setdefault((item[1], item[2]), item[0])
    return merged


def _int_arg(msg: message.Call, name: str) -> int:
    value = (msg.args or [None])[0]
    if type(value) is not int:
        raise _BadArgument(f"{msg.procedure} takes the {name} id (an integer) as its first argument")
    return value


def _str_arg(msg: message.Call, name: str) -> str:
    value = (msg.args or [None])[0]
    if not isinstance(value, str):
        raise _BadArgument(f"{msg.procedure} takes the {name} URI (a string) as its first argument")
    return value


def _match_option(msg: message.Call) -> str:
    options = (msg.args or [None, None])[1:2]
    match = options[0].get("match", "exact") if options and isinstance(options[0], dict) else "exact"
    if match not in _MATCHES:
        raise _BadArgument(f"match must be one of {', '.join(_MATCHES)}")
    return str(match)
