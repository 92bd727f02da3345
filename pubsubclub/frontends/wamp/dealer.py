"""A node-local WAMP Dealer (Basic Profile RPC) for the sessions of one node.

REGISTER/UNREGISTER, CALL -> INVOCATION -> YIELD/ERROR -> RESULT/ERROR, with:

- registrations per realm and procedure, ``match`` exact, prefix or wildcard:
  a single one (``invoke: single``), or shared ones with one ``invoke`` policy
  (roundrobin, random, first, last); a second single REGISTER, or a shared one
  of another policy, gets ERROR ``wamp.error.procedure_already_exists``; a CALL
  goes to the exact registration, else the longest matching prefix, else a
  matching wildcard, with ``details.procedure`` for a pattern;
- across the cluster (PSC 0.7, pubsubclub/federation/rpc.py): the other
  nodes' registrations are held here too, their callee a stand-in for the
  link (``remote_registered``), so one table answers ``already_exists`` and
  picks among callees on every node; two single registrations made at once on
  two nodes are settled by the earlier ``(created, node id)``, the later one
  revoked on its own node (UNREGISTERED with reason
  ``wamp.error.procedure_already_exists``);
- with ``await_seconds`` (``[wamp] await-interest``) REGISTERED waits until
  every linked node has handled the announcement (``settle``, a ping round
  trip per link), at most that long, then goes anyway (counted
  ``registered_unconfirmed``); a call reaching the callee first releases it;
- a CALL of a procedure nobody registered gets ERROR
  ``wamp.error.no_such_procedure``;
- a callee's ERROR reaches the caller with the callee's URI, args and kwargs;
- a callee that leaves mid-call leaves its callers ERROR ``wamp.error.canceled``,
  never a hang; a caller that leaves has its pending calls forgotten (a late
  YIELD or ERROR from the callee is dropped);
- the CALL option ``timeout`` (milliseconds), and a node-wide upper bound
  (``[wamp] call-timeout``), end a call with ERROR ``wamp.error.timeout``;
- CANCEL (call canceling, announced in WELCOME, since Autobahn sends CANCEL
  whenever a call's Deferred is cancelled): the caller gets ERROR
  ``wamp.error.canceled`` at once, whatever the mode (``kill`` is served as
  ``killnowait``: the dealer never waits for a callee); a callee that
  announced call canceling gets INTERRUPT (mode ``killnowait``) unless the
  caller asked ``skip``, and so does it when its call times out;
- with ``--auth``, a role may REGISTER and CALL the URIs it may publish to;
- at most ``max_pending_calls`` calls in flight per caller (``[wamp]
  max-pending-calls``) and ``max_node_calls`` on the node (``[wamp]
  max-calls-per-node``): one more gets ERROR ``pubsubclub.error.too_many_calls``
  at once, so callees that never answer cannot make the node hold calls
  without bound;
- at most ``max_registrations`` registrations per session and
  ``max_node_registrations`` on the node (``[wamp] max-registrations``,
  ``max-registrations-per-node``): one more gets ERROR
  ``pubsubclub.error.too_many_registrations``;
- an INVOCATION, RESULT or callee ERROR whose encoding is over the receiving
  session's message-size limit is never sent: the caller gets ERROR
  ``wamp.error.payload_size_exceeded`` and both sessions carry on.

Every refusal names its limit: ERROR ``args`` hold a sentence, ``kwargs``
``{"limit": <setting>, "max": <value>}``, and it is counted through
``refused(reason)``. Everything a session made is found from the session
(no scan of the node's tables when it leaves), and the tables are copied
smaller once they have emptied (pubsubclub/core/compaction.py), so memory returns
when sessions leave.

The calls in flight (INVOCATION to answer, timeouts, CANCEL, the call caps) are
``CallsInFlight`` in calls.py; this module keeps the registration table.

Sans-IO apart from the injected ``call_later`` for timeouts: sessions are any
objects with ``send_message(msg)`` and ``send_if_fits(msg)`` (the broker's sessions).
"""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from autobahn.wamp import message
from twisted.logger import Logger

from pubsubclub.core.compaction import Compaction
from pubsubclub.frontends.wamp.calls import CANCELED as CANCELED
from pubsubclub.frontends.wamp.calls import KILL_NO_WAIT as KILL_NO_WAIT
from pubsubclub.frontends.wamp.calls import PAYLOAD_SIZE_EXCEEDED as PAYLOAD_SIZE_EXCEEDED
from pubsubclub.frontends.wamp.calls import TIMEOUT as TIMEOUT
from pubsubclub.frontends.wamp.calls import TOO_MANY_CALLS as TOO_MANY_CALLS
from pubsubclub.frontends.wamp.calls import CallsInFlight, _limit_error
from pubsubclub.frontends.wamp.registrations import (
    NO_IDENTITY,
    ClusterListener,
    Identity,
    Party,
    PatternIndex,
    _forget,
    _Registration,
    _unoffered,
)

NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
PROCEDURE_ALREADY_EXISTS = "wamp.error.procedure_already_exists"
NO_SUCH_REGISTRATION = "wamp.error.no_such_registration"
NOT_AUTHORIZED = "wamp.error.not_authorized"
TOO_MANY_REGISTRATIONS = "pubsubclub.error.too_many_registrations"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
#: A call's callee was on a node that became unreachable (its link dropped) before it answered.
NODE_UNREACHABLE = "pubsubclub.error.node_unreachable"
#: Counted (``refused``) for each REGISTERED sent after ``await_seconds`` without every node's acknowledgement.
REGISTERED_UNCONFIRMED = "registered_unconfirmed"

log = Logger()


@dataclass
class Dealer:
    """The RPC state of one router (all its realms)."""

    new_id: Callable[[], int]
    #: ``call_later(seconds, fn)`` -> an object with ``cancel()``; None: no timeouts.
    call_later: Callable[[float, Callable[[], None]], Any] | None = None
    #: Longest a call may take, in seconds (0: only the caller's own ``timeout`` option).
    max_call_seconds: float = 0.0
    #: Calls one caller may have in flight at once; one more gets ERROR ``TOO_MANY_CALLS``.
    max_pending_calls: int = 1000
    #: Calls the node may have in flight at once, all callers together; likewise.
    max_node_calls: int = 10_000
    #: Calls from one other node (one link's stand-in) in flight here at once; likewise.
    max_link_calls: int = 10_000
    #: Registrations one session may hold; one more gets ERROR ``TOO_MANY_REGISTRATIONS``.
    max_registrations: int = 1000
    #: Registrations the node may hold, all sessions together; likewise.
    max_node_registrations: int = 50_000
    #: Told the reason of every refusal past a limit (the router counts it in the node's metrics).
    refused: Callable[[str], None] | None = None
    #: This node's id and clock: a registration's place in the cluster-wide order.
    node_id: str = ""
    clock: Callable[[], float] = time.time
    #: Picks a callee of an ``invoke: random`` registration.
    choose: Callable[[Sequence[Any]], Any] = random.choice
    #: Told of local registrations (the cluster's RPC, federation/rpc.py); None: a single router.
    cluster: ClusterListener | None = None
    #: Also told of local registrations (the meta API's events, meta.py); None: nobody.
    observer: ClusterListener | None = None
    #: Told whenever another node's registrations change (a bridge mirrors them into its router).
    remote_changed: Callable[[], None] | None = None
    #: Told of each other node's registration coming and going (the primary of a node with workers
    #: re-announces them, federation/rpc.py); None: nobody.
    relay: ClusterListener | None = None
    #: Hold REGISTERED until every linked node has the registration, at most this long (``[wamp]
    #: await-interest``, ``await-interest-timeout``); 0: REGISTERED at once.
    await_seconds: float = 0.0
    #: ``settle(timeout)``: a Deferred firing True once every linked node has handled what this node
    #: announced so far, False past ``timeout`` (federation/rpc.py); None: no other node to wait for.
    settle: Callable[[float], Any] | None = None
    #: REGISTERED held for the other nodes, by registration id.
    _held: dict[int, message.Registered] = field(default_factory=dict)
    #: (realm, match, procedure) -> its registrations on every node, in their cluster-wide order.
    _by_procedure: dict[tuple[str, str, str], list[_Registration]] = field(default_factory=dict)
    #: The keys of ``_by_procedure`` with a prefix or wildcard match (searched when no exact one matches).
    _patterns: dict[tuple[str, str, str], None] = field(default_factory=dict)
    #: The same keys, indexed so that a CALL finds its pattern without a scan of them all.
    _pattern_index: PatternIndex = field(default_factory=PatternIndex)
    #: Round-robin position per shared procedure.
    _turns: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: Other nodes' registrations per link stand-in: remote id -> registration.
    _remote: dict[Party, dict[int, _Registration]] = field(default_factory=dict)
    _remote_ids: int = 0
    _by_id: dict[int, _Registration] = field(default_factory=dict)
    #: Registrations per callee (only callees with at least one).
    _by_callee: dict[Party, dict[int, _Registration]] = field(default_factory=dict)
    _registrations_compaction: Compaction = field(default_factory=Compaction)
    #: The calls handed to a callee and not yet answered (calls.py), reading this dealer's settings.
    _inflight: CallsInFlight = field(init=False)

    def __post_init__(self) -> None:
        for name in (
            "max_pending_calls",
            "max_node_calls",
            "max_link_calls",
            "max_registrations",
            "max_node_registrations",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        self._inflight = CallsInFlight(self)

    @property
    def _calls(self) -> dict[int, Any]:
        """Invocation request id -> the call in flight (the meta API never reuses one on a link)."""
        return self._inflight.calls

    @property
    def _by_request(self) -> dict[tuple[Party, int], int]:
        return self._inflight.by_request

    # -- callee side ----------------------------------------------------------------

    def register(
        self,
        callee: Party,
        realm: str,
        msg: message.Register,
        interruptible: bool = False,
        disclose_caller: bool = False,
    ) -> None:
        """REGISTER: REGISTERED, or ERROR when the procedure already has a callee or asks what is not offered.

        ``interruptible``: the callee announced call canceling (it understands INTERRUPT);
        ``disclose_caller``: it asked for its callers' identity.
        """
        problem = _unoffered(msg)
        if problem is not None:
            callee.send_message(
                message.Error(message.Register.MESSAGE_TYPE, msg.request, INVALID_ARGUMENT, args=[problem])
            )
            return
        match, invoke = msg.match or "exact", msg.invoke or "single"
        key = (realm, match, msg.procedure)
        group = self._by_procedure.get(key)
        if group:
            head = group[0]
            if head.invoke == "single" or head.invoke != invoke:
                where = "" if head.remote_id is None else f" on node {head.node}"
                how = "" if head.invoke == "single" else f" with invoke {head.invoke!r}"
                callee.send_message(
                    message.Error(
                        message.Register.MESSAGE_TYPE,
                        msg.request,
                        PROCEDURE_ALREADY_EXISTS,
                        args=[f"procedure {msg.procedure!r} is already registered{how}{where}"],
                    )
                )
                return
        own = self._by_callee.get(callee)
        if own is not None and len(own) >= self.max_registrations:
            text = f"this session already has {len(own)} registrations, the limit is {self.max_registrations}"
            self._refuse_registration(callee, msg, text, "wamp.max-registrations", self.max_registrations)
            return
        if len(self._by_id) >= self.max_node_registrations:
            text = f"this node already has {len(self._by_id)} registrations, the limit is {self.max_node_registrations}"
            self._refuse_registration(callee, msg, text, "wamp.max-registrations-per-node", self.max_node_registrations)
            return
        registration = _Registration(
            self.new_id(), realm, msg.procedure, callee, interruptible, match, invoke, self.clock(), self.node_id,
            disclose_caller=disclose_caller,
        )  # fmt: skip
        self._insert(key, registration)
        self._by_id[registration.id] = registration
        if own is None:
            own = self._by_callee[callee] = {}
        own[registration.id] = registration
        self._registrations_compaction.grown(len(self._by_id))
        answer = message.Registered(msg.request, registration.id)
        held = self.await_seconds > 0 and self.settle is not None
        if not held:
            callee.send_message(answer)
        if self.cluster is not None:
            self.cluster.registered(registration)
        if self.observer is not None:
            self.observer.registered(registration)
        if held and self.settle is not None:
            # After the announcement: the other nodes' acknowledgements follow it on each link.
            self._held[registration.id] = answer
            self.settle(self.await_seconds).addCallback(lambda done: self._answer_held(registration, done))

    def _answer_held(self, registration: _Registration, confirmed: bool | None) -> None:
        """Send a held REGISTERED: every node confirmed, the bound passed (False), or a call came first (None)."""
        answer = self._held.pop(registration.id, None)
        if answer is None:
            return  # already sent, or the registration is gone
        if confirmed is False:
            log.warn(
                "REGISTERED for {procedure} sent without every node's acknowledgement after {seconds} s"
                " (wamp.await-interest-timeout)",
                procedure=registration.procedure,
                seconds=self.await_seconds,
            )
            if self.refused is not None:
                self.refused(REGISTERED_UNCONFIRMED)
        registration.callee.send_message(answer)

    def _insert(self, key: tuple[str, str, str], registration: _Registration) -> None:
        group = self._by_procedure.get(key)
        if group is None:
            group = self._by_procedure[key] = []
            if key[1] != "exact":
                self._patterns[key] = None
                self._pattern_index.add(key)
        orders = [r.order for r in group]
        group.insert(bisect.bisect(orders, registration.order), registration)

    def local_registrations(self) -> list[_Registration]:
        """This node's own registrations (announced to a node whose link comes up)."""
        return list(self._by_id.values())

    # -- other nodes' registrations (federation/rpc.py) ------------------------------------------

    def remote_registered(
        self,
        link: Party,
        remote_id: int,
        realm: str,
        procedure: str,
        match: str,
        invoke: str,
        created: float,
        node: str,
    ) -> None:
        """A registration of the node behind ``link`` (its stand-in); a local one it beats is revoked.

        Raises ValueError past ``max_node_registrations`` from one link (the link is closed: that
        node holds more than any node may).
        """
        own = self._remote.get(link)
        if own is not None and remote_id in own:
            self._drop_registration(own[remote_id], "re-announced by its node", CANCELED)
            own = self._remote.get(link)
        if own is not None and len(own) >= self.max_node_registrations:
            raise ValueError(f"over {self.max_node_registrations} registrations from one node")
        self._remote_ids += 1
        registration = _Registration(
            -self._remote_ids, realm, procedure, link, True, match, invoke, created, node, remote_id
        )
        if own is None:
            own = self._remote[link] = {}
        own[remote_id] = registration
        key = (realm, match, procedure)
        self._insert(key, registration)
        if self.relay is not None:
            self.relay.registered(registration)
        group = self._by_procedure[key]
        head = group[0]
        for other in list(group):
            loses = head.invoke == "single" or other.invoke != head.invoke
            if other.remote_id is None and other is not head and loses:
                # Made at the same time as an earlier one on another node: the earlier one wins everywhere.
                answer = self._held.pop(other.id, None)
                other.callee.send_message(
                    message.Unregistered(0, registration=other.id, reason=PROCEDURE_ALREADY_EXISTS)
                    if answer is None
                    else message.Error(
                        message.Register.MESSAGE_TYPE,
                        answer.request,
                        PROCEDURE_ALREADY_EXISTS,
                        args=[f"procedure {procedure!r} was registered earlier on node {head.node}"],
                    )
                )
                self._drop_registration(other, f"procedure {procedure!r} was registered earlier on node {head.node}")
        if self.remote_changed is not None:
            self.remote_changed()

    def remote_unregistered(self, link: Party, remote_id: int) -> None:
        """The node behind ``link`` dropped a registration: its calls in flight there end as that node says."""
        registration = self._remote.get(link, {}).get(remote_id)
        if registration is not None:
            self._drop_registration(registration, "procedure unregistered by its callee", CANCELED)

    def remote_left(self, link: Party, why: str) -> None:
        """The link to a node is gone: its registrations go, and its calls in flight end with ERROR ``why``."""
        for registration in list(self._remote.get(link, {}).values()):
            self._drop_registration(registration, why, NODE_UNREACHABLE)
        self.left(link)

    def remote_call(
        self,
        link: Party,
        request: int,
        registration_id: int,
        msg: message.Call,
        caller: Identity = NO_IDENTITY,
        disclose: bool = False,
    ) -> None:
        """A call from another node (``link``: its stand-in) for a registration of this node, picked there.

        ``caller``: the identity the caller's node lets be known; ``disclose``: that node discloses it
        whatever the registration asked (else only a ``disclose_caller`` registration is told).
        """
        registration = self._by_id.get(registration_id)
        if registration is not None and self._held:
            self._answer_held(registration, None)  # a callee learns its registration before its first call
        if registration is None:
            link.send_message(
                message.Error(
                    message.Call.MESSAGE_TYPE,
                    request,
                    NO_SUCH_PROCEDURE,
                    args=[f"procedure {msg.procedure!r} is no longer registered on node {self.node_id}"],
                )
            )
            return
        # The calls from one node together have their own cap (the caller's node holds each caller to its own).
        if self._inflight.over_caps(link, msg, self.max_link_calls, "wamp.max-calls-per-link"):
            return
        disclosed = caller if disclose or registration.disclose_caller else NO_IDENTITY
        self._inflight.invoke(link, msg, registration, disclosed)

    def relayed_call(
        self,
        link: Party,
        registration: _Registration,
        msg: message.Call,
        caller: Identity = NO_IDENTITY,
        disclose: bool = False,
    ) -> None:
        """A call from another node or worker (``link``) for a registration of a third, which this node re-announced.

        The primary of a node with workers (federation/rpc.py): the call goes on over the
        registration's own link with the caller's node's identity and decision, as one made here would.
        """
        if self._inflight.over_caps(link, msg, self.max_link_calls, "wamp.max-calls-per-link"):
            return
        self._inflight.invoke(link, msg, registration, caller, disclose)

    def _refuse_registration(self, callee: Party, msg: message.Register, text: str, limit: str, value: int) -> None:
        error = _limit_error(message.Register.MESSAGE_TYPE, msg.request, TOO_MANY_REGISTRATIONS, text, limit, value)
        self._inflight.refuse(callee, "too_many_registrations", error)

    def unregister(self, callee: Party, msg: message.Unregister) -> None:
        """UNREGISTER: UNREGISTERED, or ERROR for a registration that is not this session's."""
        registration = self._by_id.get(msg.registration)
        if registration is None or registration.callee is not callee:
            callee.send_message(
                message.Error(
                    message.Unregister.MESSAGE_TYPE,
                    msg.request,
                    NO_SUCH_REGISTRATION,
                    args=[f"no registration {msg.registration} in this session"],
                )
            )
            return
        self._drop_registration(registration, "procedure unregistered by its callee")
        callee.send_message(message.Unregistered(msg.request))

    def yielded(self, callee: Party, msg: message.Yield) -> None:
        """YIELD: the caller gets RESULT (a progressive YIELD a progressive RESULT)."""
        self._inflight.yielded(callee, msg)

    def invocation_error(self, callee: Party, msg: message.Error) -> None:
        """ERROR for an INVOCATION: the caller gets ERROR for its CALL with the callee's URI and arguments."""
        self._inflight.invocation_error(callee, msg)

    # -- caller side ----------------------------------------------------------------------

    def call(
        self,
        caller: Party,
        realm: str,
        msg: message.Call,
        exclude: Party | None = None,
        identity: Identity = NO_IDENTITY,
        disclose: bool = False,
    ) -> None:
        """CALL: an INVOCATION to the callee (on this node or, over its link, another), or ERROR if there is none.

        ``exclude``: a callee never picked for this call (a bridge's calls from its router never go
        back to the router through the bridge's own mirror registrations). ``identity``: the caller
        as its node lets it be known (``[wamp] disclose-caller`` not ``never``); ``disclose``: name it
        to every callee, else only to one whose registration asked ``disclose_caller``.
        """
        registration = self._lookup(realm, msg.procedure, exclude)
        if registration is None:
            caller.send_message(
                message.Error(
                    message.Call.MESSAGE_TYPE,
                    msg.request,
                    NO_SUCH_PROCEDURE,
                    args=[f"no procedure {msg.procedure!r} is registered"],
                )
            )
            return
        if self._inflight.over_caps(caller, msg, self.max_pending_calls, "wamp.max-pending-calls"):
            return
        if registration.remote_id is not None:
            # The callee's node knows whether its registration asked: it gets the identity and our decision.
            self._inflight.invoke(caller, msg, registration, identity, disclose)
        else:
            if self._held:
                self._answer_held(registration, None)  # a callee learns its registration before its first call
            self._inflight.invoke(
                caller, msg, registration, identity if disclose or registration.disclose_caller else NO_IDENTITY
            )

    def _lookup(self, realm: str, procedure: str, exclude: Party | None = None) -> _Registration | None:
        """The callee for ``procedure``: exact, else the longest matching prefix, else a matching wildcard."""
        key = (realm, "exact", procedure)
        group = self._by_procedure.get(key)
        if exclude is not None and group is not None and all(r.callee is exclude for r in group):
            group = None
        if group is None and self._patterns:
            found = self._pattern_index.find(realm, procedure, self._by_procedure, exclude)
            if found is not None:
                key, group = found, self._by_procedure[found]
        if exclude is not None and group:
            group = [r for r in group if r.callee is not exclude]
        if not group:
            return None
        head = group[0]
        if head.invoke == "single":
            return head
        callees = [r for r in group if r.invoke == head.invoke]
        if head.invoke == "first":
            return callees[0]
        if head.invoke == "last":
            return callees[-1]
        if head.invoke == "random":
            return self.choose(callees)  # type: ignore[no-any-return]
        turn = self._turns.get(key, 0)
        self._turns[key] = turn + 1
        return callees[turn % len(callees)]

    def cancel(self, caller: Party, msg: message.Cancel) -> None:
        """CANCEL: the caller's pending call ends with ERROR ``wamp.error.canceled``; a call already over is ignored."""
        self._inflight.cancel(caller, msg)

    # -- sessions leaving ---------------------------------------------------------------------

    def left(self, party: Party) -> None:
        """A session ended: its registrations go (their callers get ERROR), its own calls are forgotten."""
        for registration in list(self._by_callee.get(party, {}).values()):
            self._drop_registration(registration, "the callee left during the call")
        self._inflight.caller_left(party)

    def _drop_registration(self, registration: _Registration, why: str, uri: str = CANCELED) -> None:
        relayed: ClusterListener | None = None
        key = (registration.realm, registration.match, registration.procedure)
        group = self._by_procedure.get(key)
        if group is not None and registration in group:
            group.remove(registration)
            if not group:
                del self._by_procedure[key]
                if self._patterns.pop(key, 0) is None:
                    self._pattern_index.remove(key)
                self._turns.pop(key, None)
        if registration.remote_id is None:
            self._by_id.pop(registration.id, None)
            self._held.pop(registration.id, None)
            _forget(self._by_callee, registration.callee, registration.id)
            if self.cluster is not None:
                self.cluster.unregistered(registration)
            if self.observer is not None:
                self.observer.unregistered(registration)
        else:
            own = self._remote.get(registration.callee)
            if own is not None and own.get(registration.remote_id) is registration:
                _forget(self._remote, registration.callee, registration.remote_id)
                relayed = self.relay
            if self.remote_changed is not None:
                self.remote_changed()
        if self._registrations_compaction.due(len(self._by_id)):
            self._by_id = dict(self._by_id)
            self._by_procedure = dict(self._by_procedure)
            self._by_callee = dict(self._by_callee)
        self._inflight.registration_gone(registration, why, uri)
        if relayed is not None:
            # After its calls' ERRORs: a node that re-announced it ends them with this node's reason.
            relayed.unregistered(registration)

    def remote_procedures(self, realm: str) -> dict[tuple[str, str], str]:
        """``(match, procedure)`` -> invoke policy of every other node's registration in ``realm``."""
        found: dict[tuple[str, str], str] = {}
        for own in self._remote.values():
            for r in own.values():
                if r.realm == realm:
                    found.setdefault((r.match, r.procedure), r.invoke)
        return found

    def registrations(self) -> int:
        """Procedures registered (for /stats)."""
        return len(self._by_id)

    def calls_in_flight(self) -> int:
        """Calls waiting for their callee's answer."""
        return len(self._inflight.calls)

    def tables(self) -> dict[str, int]:
        """Entries in each of the dealer's tables (all 0 once every session has left)."""
        return {
            "registrations": len(self._by_id),
            "procedures": len(self._by_procedure),
            "callees": len(self._by_callee),
            **self._inflight.tables(),
            "remote_links": len(self._remote),
            "remote_registrations": sum(len(own) for own in self._remote.values()),
            "turns": len(self._turns),
            "patterns": len(self._patterns),
            "registered_held": len(self._held),
        }
