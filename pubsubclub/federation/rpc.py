"""RPC across the cluster over PSC 0.7 links (docs/protocol.md, "Extension: version 0.7, RPC").

The node's WAMP dealer (pubsubclub/frontends/wamp/dealer.py) holds every
registration of the cluster in one table: its own, and each other node's
with a *stand-in* for that node's callees as the callee. A stand-in is a
dealer party like a WAMP session, so the dealer routes, times out, cancels
and bounds a call to another node exactly as one to a local callee; the
stand-ins turn the dealer's messages into PSC messages and back:

- on a link where this node is the **consumer**, a :class:`_CalleeLink`
  stands for the callees of the producer node: it receives PSC401/PSC402
  (their registrations), sends an INVOCATION as PSC403 and an INTERRUPT as
  PSC406, and hands PSC404/PSC405 to the dealer as YIELD/ERROR;
- on a link where this node is the **producer**, a :class:`_CallerLink`
  stands for the callers of the consumer node: this node's registrations go
  out as PSC401/PSC402, a PSC403 becomes a call of the registration it
  names, and the dealer's RESULT/ERROR for it go back as PSC404/PSC405.

So each pair of nodes carries the calls from A to B's callees on the link
where B is the producer, and those from B to A's on the other one. A link
that closes ends the calls in flight over it at once: on the caller's node
with ERROR ``pubsubclub.error.node_unreachable`` to each caller (and the
node's registrations leave the table until the link is back), on the
callee's node the calls are forgotten and interruptible callees get INTERRUPT.

A node with workers (``--workers N``, docs/architecture.md, "Workers") is one
dealer to the cluster: its primary *relays* (:attr:`ClusterRPC.relaying`). It
re-announces each registration learned on one link, under an id of its own,
on the links split horizon allows (one from a worker: to the other nodes and
the other workers; one from another node: to the workers), and a PSC403 for
such an id goes on over the registration's link as a call the primary's
dealer makes (:meth:`Dealer.relayed_call`), so its answers, cancels, timeouts
and a link's loss come back as for any call.

Sans-IO: links are :class:`~pubsubclub.federation.session.LinkSession`
objects (``send_raw``), the dealer is injected with :meth:`ClusterRPC.attach`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autobahn.wamp import message
from twisted.internet import defer
from twisted.logger import Logger

from pubsubclub.federation import psc, psc_rpc
from pubsubclub.federation.session import CLOSE_BAD_MESSAGE, LinkError, LinkSession, Role
from pubsubclub.frontends.wamp.registrations import DisclosedInvocation

if TYPE_CHECKING:
    from pubsubclub.frontends.wamp.dealer import Dealer, _Registration


log = Logger()

#: Longest a relaying primary holds a pong for its own round trips when ``[wamp] await-interest`` is off here.
HOLD_SECONDS = 5.0
#: Re-exported: the node-to-node meta query's procedure (defined with the codec, psc_rpc.py).
META_QUERY = psc_rpc.META_QUERY


class _CalleeLink:
    """The callees of the node at the other end of a consumer link, as one dealer party."""

    __slots__ = ("limit", "session")

    def __init__(self, session: LinkSession, limit: int) -> None:
        self.session = session
        self.limit = limit

    def send_message(self, msg: message.Message) -> None:
        """An INTERRUPT: the caller has been answered; tell the callee's node (PSC406)."""
        if isinstance(msg, message.Interrupt):
            self.session.send_raw(psc_rpc.Cancel(msg.request, msg.mode or "killnowait").encode())

    def send_if_fits(self, msg: message.Message) -> tuple[int, int] | None:
        """An INVOCATION as PSC403, unless it would be over the link's frame limit."""
        assert isinstance(msg, message.Invocation)
        data = psc_rpc.Call(
            msg.request,
            msg.registration,
            msg.procedure,
            msg.args,
            msg.kwargs,
            msg.timeout or None,
            bool(msg.receive_progress),
            msg.caller,
            msg.caller_authid,
            msg.caller_authrole,
            isinstance(msg, DisclosedInvocation),
        ).encode()
        if len(data) > self.limit:
            return len(data), self.limit
        self.session.send_raw(data)
        return None


class _CallerLink:
    """The callers of the node at the other end of a producer link, as one dealer party."""

    __slots__ = ("limit", "session")

    def __init__(self, session: LinkSession, limit: int) -> None:
        self.session = session
        self.limit = limit

    def _encode(self, msg: message.Message) -> bytes | None:
        if isinstance(msg, message.Result):
            return psc_rpc.Result(msg.request, msg.args, msg.kwargs, bool(msg.progress)).encode()
        if isinstance(msg, message.Error):
            return psc_rpc.Error(msg.request, msg.error, msg.args, msg.kwargs).encode()
        return None

    def send_message(self, msg: message.Message) -> None:
        """The dealer's ERROR (or RESULT) for a call from that node."""
        data = self._encode(msg)
        if data is not None:
            self.session.send_raw(data)

    def send_if_fits(self, msg: message.Message) -> tuple[int, int] | None:
        """A RESULT or the callee's ERROR, unless it would be over the link's frame limit."""
        data = self._encode(msg)
        if data is None:
            return None
        if len(data) > self.limit:
            return len(data), self.limit
        self.session.send_raw(data)
        return None


class ClusterRPC:
    """This node's side of RPC on all its 0.7 links; see the module's docstring."""

    def __init__(self, node_id: str, limits: psc.Limits = psc.DEFAULT_LIMITS) -> None:
        self.node_id = node_id
        self.limit = limits.max_link_frame
        self.dealer: Dealer | None = None
        #: Open 0.7 links where we are the producer: our registrations go there, calls come from there.
        self._callers: dict[LinkSession, _CallerLink] = {}
        #: Open 0.7 links where we are the consumer: the other node's registrations come from there.
        self._callees: dict[LinkSession, _CalleeLink] = {}
        #: The WAMP meta API's queries to and from other nodes (frontends/wamp/meta.py); None: not served.
        self.meta: Any = None
        #: The primary of a node with workers: other links' registrations are re-announced (relay.py).
        self.relaying = False
        #: A worker other than the primary: the primary's node id, without whose link the cluster is out of reach.
        self.required_peer: str | None = None
        #: Re-announced registrations by the id this node announced them with, and that id by registration.
        self._relayed: dict[int, _Registration] = {}
        self._relay_ids: dict[_Registration, int] = {}
        #: Past the cap of registrations one node announces (logged once until there is room again).
        self._relay_full = False
        #: ``round_trips(links, timeout)``: fires True once each has handled all we sent, False past
        #: ``timeout`` (the federation's pings); None: nothing to wait for.
        self.round_trips: Callable[[list[LinkSession], float], defer.Deferred[bool]] | None = None
        #: A relaying primary: the links it re-announced registrations on, by the link they came over,
        #: since that link's last round trip (whose pong waits for these links' own, :meth:`pong_hold`).
        self._relayed_from: dict[LinkSession, set[LinkSession]] = {}

    def attach(self, dealer: Dealer) -> None:
        """Serve ``dealer``'s registrations to the cluster and route its calls to other nodes."""
        self.dealer = dealer
        dealer.cluster = self
        dealer.relay = _Relayed(self)
        dealer.node_id = self.node_id
        dealer.settle = self.settled
        for session in self._callers:
            self._announce_all(session)

    def peers(self) -> list[tuple[str, _CalleeLink]]:
        """Each other node (by name) with the stand-in a call to it goes through (the meta API asks them)."""
        return [(session.peer_node or session.peer, link) for session, link in self._callees.items()]

    def relay_peers(self, party: Any) -> list[tuple[str, _CalleeLink]]:
        """:meth:`peers` a relaying primary asks for a query that came over ``party``'s link (split horizon)."""
        source = getattr(party, "session", None)
        if not self.relaying or source is None:
            return []
        return [(s.peer_node or s.peer, link) for s, link in self._callees.items() if _split(source, s)]

    def relay_callees(self, party: Any, ids: list[Any]) -> dict[_CalleeLink, tuple[str, list[int]]]:
        """Of registration ids a consumer link (``party``) asks about, the re-announced: per link, their own ids."""
        source = getattr(party, "session", None)
        found: dict[_CalleeLink, tuple[str, list[int]]] = {}
        for reg_id in ids:
            registration = self._relayed.get(reg_id) if type(reg_id) is int else None
            if registration is None or source is None or not _relays(registration, source):
                continue
            link = registration.callee
            assert isinstance(link, _CalleeLink) and registration.remote_id is not None
            found.setdefault(link, (registration.node, []))[1].append(registration.remote_id)
        return found

    def stats(self) -> dict[str, int]:
        """Open links carrying RPC, by direction."""
        return {"rpc_caller_links": len(self._callers), "rpc_callee_links": len(self._callees)}

    # -- links (called by the federation) ---------------------------------------------

    def link_open(self, session: LinkSession) -> None:
        """A 0.7 link is open: a producer announces all its registrations on it."""
        if session.role is Role.PRODUCER:
            self._callers[session] = _CallerLink(session, self.limit)
            self._announce_all(session)
        else:
            self._callees[session] = _CalleeLink(session, self.limit)

    def _announce_all(self, session: LinkSession) -> None:
        if self.dealer is not None:
            for registration in self.dealer.local_registrations():
                session.send_raw(_announcement(registration))
            for reg_id, registration in self._relayed.items():
                if _relays(registration, session):
                    session.send_raw(_announcement(registration, reg_id))

    def settled(self, timeout: float) -> defer.Deferred[bool]:
        """True once every node we announce to has handled all we announced so far, False past ``timeout`` s.

        The ping of a round trip follows the PSC401 on the same link and is
        answered after it was handled; a relaying primary answers it only once
        it relayed the PSC401 on and its own round trips came back
        (:meth:`pong_hold`), so a worker's REGISTERED waits for the whole node.
        """
        if self.round_trips is None or not self._callers:
            return defer.succeed(True)
        return self.round_trips(list(self._callers), timeout)

    def pong_hold(self, session: LinkSession) -> defer.Deferred[Any] | None:
        """What a ping on ``session`` waits for: a round trip on each link its registrations went on to, or None.

        The ping follows the PSC401s on its link, so they have been relayed
        (and their frames written) when it is read: one round trip per link
        then covers them all, however many there were. Bounded by the
        dealer's ``await_seconds`` (``HOLD_SECONDS`` when that is off).
        """
        targets = self._relayed_from.pop(session, None)
        if not targets or self.round_trips is None:
            return None
        live = [target for target in targets if target in self._callers]
        bound = self.dealer.await_seconds if self.dealer is not None and self.dealer.await_seconds > 0 else HOLD_SECONDS
        return self.round_trips(live, bound) if live else None

    def link_closed(self, session: LinkSession) -> None:
        """A link closed: the calls in flight over it end, the other node's registrations leave the table."""
        self._relayed_from.pop(session, None)
        if self.meta is not None:
            self.meta.link_closed(session)
        caller = self._callers.pop(session, None)
        if caller is not None and self.dealer is not None:
            self.dealer.left(caller)
        callee = self._callees.pop(session, None)
        if callee is not None and self.dealer is not None:
            node = session.peer_node or session.peer
            self.dealer.remote_left(callee, f"the link to node {node}, where the callee is, was lost")

    def receive(self, session: LinkSession, msg: psc.ExtensionMessage) -> None:
        """A PSC401-PSC406 from ``session`` (the session checked its direction)."""
        dealer = self.dealer
        callee = self._callees.get(session)
        if callee is not None:
            answer = isinstance(msg, (psc_rpc.Result, psc_rpc.Error))
            if answer and self.meta is not None and self._meta_answer(session, msg):  # type: ignore[arg-type]
                return
            if dealer is None:
                return  # no WAMP here: nobody can call, so other nodes' registrations are not kept
            if isinstance(msg, psc_rpc.Result):
                dealer.yielded(callee, message.Yield(msg.call, args=msg.args, kwargs=msg.kwargs, progress=msg.progress))
            elif isinstance(msg, psc_rpc.Error):
                error = message.Error(
                    message.Invocation.MESSAGE_TYPE, msg.call, msg.error, args=msg.args, kwargs=msg.kwargs
                )
                dealer.invocation_error(callee, error)
            elif isinstance(msg, psc_rpc.Register):
                node = session.peer_node or session.peer
                try:
                    dealer.remote_registered(
                        callee, msg.registration, msg.realm, msg.procedure, msg.match, msg.invoke, msg.created, node
                    )
                except ValueError as e:
                    raise LinkError(CLOSE_BAD_MESSAGE, f"PSC401 {e}") from None
            elif isinstance(msg, psc_rpc.Unregister):
                dealer.remote_unregistered(callee, msg.registration)
            return
        caller = self._callers.get(session)
        if caller is None:
            return
        if isinstance(msg, psc_rpc.Call):
            if msg.problem is not None:
                # Its args or kwargs broke the JSON bounds: this call fails, the link carries on.
                caller.send_message(
                    message.Error(message.Call.MESSAGE_TYPE, msg.call, psc_rpc.INVALID_PAYLOAD, args=[msg.problem])
                )
            elif msg.procedure == META_QUERY:
                if self.meta is not None:
                    self.meta.serve(caller, msg.call, msg.args)
                else:
                    # No WAMP here: no sessions, subscriptions or callees to tell of.
                    caller.send_message(message.Result(msg.call, args=[None]))
                return
            if dealer is None:
                caller.send_message(
                    message.Error(
                        message.Call.MESSAGE_TYPE,
                        msg.call,
                        "wamp.error.no_such_procedure",
                        args=[f"node {self.node_id} has no WAMP dealer"],
                    )
                )
                return
            call = message.Call(
                msg.call,
                msg.procedure,
                args=msg.args,
                kwargs=msg.kwargs,
                timeout=msg.timeout,
                receive_progress=msg.receive_progress or None,
            )
            disclosed = (msg.caller, msg.caller_authid, msg.caller_authrole)
            relayed = self._relayed.get(msg.registration)
            if relayed is not None and _relays(relayed, session):
                dealer.relayed_call(caller, relayed, call, disclosed, msg.disclose)
            else:
                dealer.remote_call(caller, msg.call, msg.registration, call, disclosed, msg.disclose)
        elif isinstance(msg, psc_rpc.Cancel) and dealer is not None:
            dealer.cancel(caller, message.Cancel(msg.call, mode=msg.mode))

    def _meta_answer(self, session: LinkSession, msg: psc_rpc.Result | psc_rpc.Error) -> bool:
        """A PSC404/PSC405 answering one of the meta API's queries: handed to it (True); else False."""
        if isinstance(msg, psc_rpc.Result):
            return bool(self.meta.answered(session, msg.call, msg.args, None))
        text = msg.error if not msg.args else f"{msg.error}: {str(msg.args[0])[:200]}"
        return bool(self.meta.answered(session, msg.call, None, text, msg.kwargs))

    # -- the dealer's own registrations (ClusterListener) ------------------------------------

    def registered(self, registration: _Registration) -> None:
        """A local registration: PSC401 to every node."""
        data = _announcement(registration)
        for session in self._callers:
            session.send_raw(data)

    def unregistered(self, registration: _Registration) -> None:
        """A local registration went: PSC402 to every node."""
        data = psc_rpc.Unregister(registration.id).encode()
        for session in self._callers:
            session.send_raw(data)

    # -- other links' registrations, re-announced by a relaying primary ----------------------

    def relay_registered(self, registration: _Registration) -> None:
        """Another link's registration: re-announced where split horizon allows (a relaying primary only)."""
        dealer = self.dealer
        if not self.relaying or not isinstance(registration.callee, _CalleeLink) or dealer is None:
            return
        if len(self._relayed) + dealer.registrations() >= dealer.max_node_registrations:
            # What a node announces on one link is capped by every node at max-registrations-per-node:
            # past it the registration stays callable from here and its own worker only.
            if not self._relay_full:
                log.warn(
                    "not re-announcing {procedure} from {node}: this node already announces {n} registrations, "
                    "the limit of wamp.max-registrations-per-node",
                    procedure=registration.procedure,
                    node=registration.node,
                    n=len(self._relayed) + dealer.registrations(),
                )
            self._relay_full = True
            return
        self._relay_full = False
        reg_id = dealer.new_id()
        while reg_id in self._relayed:
            reg_id = dealer.new_id()
        self._relayed[reg_id] = registration
        self._relay_ids[registration] = reg_id
        data = _announcement(registration, reg_id)
        targets = [session for session in self._callers if _relays(registration, session)]
        for session in targets:
            session.send_raw(data)
        if targets:
            # A round trip from the node that announced it is answered once these links answered theirs.
            self._relayed_from.setdefault(registration.callee.session, set()).update(targets)

    def relay_unregistered(self, registration: _Registration) -> None:
        """A re-announced registration went: PSC402 where it was announced."""
        reg_id = self._relay_ids.pop(registration, None)
        if reg_id is None:
            return
        del self._relayed[reg_id]
        data = psc_rpc.Unregister(reg_id).encode()
        for session in self._callers:
            if _relays(registration, session):
                session.send_raw(data)


class _Relayed:
    """The dealer's listener for other links' registrations: :class:`ClusterRPC`'s relay methods."""

    __slots__ = ("rpc",)

    def __init__(self, rpc: ClusterRPC) -> None:
        self.rpc = rpc

    def registered(self, registration: _Registration) -> None:
        """Another link's registration came."""
        self.rpc.relay_registered(registration)

    def unregistered(self, registration: _Registration) -> None:
        """It went."""
        self.rpc.relay_unregistered(registration)


def _relays(registration: _Registration, target: LinkSession) -> bool:
    """Split horizon: whether a registration learned on its link goes to ``target`` (a consumer link).

    A worker's goes to the other nodes and the other workers; another node's to the workers only.
    """
    return _split(registration.callee.session, target)  # type: ignore[attr-defined]


def _split(source: LinkSession, target: LinkSession) -> bool:
    """Split horizon of a relaying primary: whether what came over ``source`` goes on over ``target``."""
    if target.worker:
        return bool(source.peer_node != target.peer_node)
    return bool(source.worker)


def _announcement(registration: Any, reg_id: int | None = None) -> bytes:
    return psc_rpc.Register(
        registration.id if reg_id is None else reg_id,
        registration.realm,
        registration.procedure,
        registration.match,
        registration.invoke,
        registration.created,
    ).encode()
