"""RPC through a bridge: the router's procedures in the cluster, the cluster's in the router (docs/bridge.md, "RPC").

Why it exists: a bridge node has a dealer of its own (pubsubclub/frontends/wamp/dealer.py)
attached to the cluster's RPC (federation/rpc.py, PSC 0.7) but no WAMP clients;
this module gives that dealer the router's callees and callers, so a
procedure on either side is callable from the other, each call crossing the
bridge at most once each way:

- **Router -> cluster (mirrors).** The router's registration meta API
  (``wamp.registration.list``/``get``/``list_callees`` when the bridge becomes
  active, then ``on_create``/``on_register``/``on_unregister``/``on_delete``)
  is read into a :class:`~pubsubclub.frontends.bridge.interest.RouterInterest`
  (the same bookkeeping as subscriptions): a registration counts while a
  callee that is not a bridge holds it. Each counted one is registered in the
  bridge's dealer (same URI, ``match`` and ``invoke``) with one stand-in
  party, :class:`_Mirrors`, as callee; the dealer announces it to every node
  (PSC401). An INVOCATION for it becomes a CALL on the router; its RESULTs
  (progressive too) and ERROR go back as YIELD/ERROR, an INTERRUPT cancels
  the router call (Autobahn sends CANCEL).
- **Cluster -> router (forwarding registrations).** Every other node's
  registration in the bridge's realm (``Dealer.remote_procedures``) is
  registered on the router by the bridge session (same URI, ``match``,
  ``invoke``). Its invocation becomes a CALL into the bridge's dealer with
  :class:`_Callers` as caller, never routed to a mirror (``exclude``), so a
  call from the router never goes back into it through the bridge.
- **No loop.** The bridge's own registrations (its session, and every session
  with the bridge role) are never mirrored; mirrors are local registrations of
  the bridge's dealer, and only other nodes' registrations are forwarded.

Bounded: at most ``[bridge] max-calls`` calls in flight each way; one more
gets ERROR ``pubsubclub.error.too_many_calls`` at once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, CallResult, RegisterOptions
from twisted.internet import defer
from twisted.logger import Logger

from pubsubclub.core.counters import BridgeEvent
from pubsubclub.frontends.bridge.interest import EXACT, Interest, InterestStep, RouterInterest, router_role
from pubsubclub.frontends.wamp.dealer import NO_SUCH_PROCEDURE, TOO_MANY_CALLS, Dealer

log = Logger()

#: The registration meta events a bridge follows (``on_delete`` comes through the bridge, which follows it anyway).
REGISTRATION_EVENTS = (
    "wamp.registration.on_create",
    "wamp.registration.on_register",
    "wamp.registration.on_unregister",
)
#: Meta-API calls in flight at once while the router's registrations are read.
READ_BATCH = 64
#: ERROR for a call whose router connection went away before the router answered.
ROUTER_LOST = "pubsubclub.error.router_unreachable"


def _routable(uri: str) -> bool:
    return not uri.startswith("$") and not uri.startswith("wamp.")


class _Mirrors:
    """The router's callees as one dealer party: INVOCATIONs for mirrored registrations become router CALLs."""

    __slots__ = ("_rpc",)

    def __init__(self, rpc: RouterRPC) -> None:
        self._rpc = rpc

    def send_message(self, msg: message.Message) -> None:
        """REGISTERED/ERROR for our REGISTERs, UNREGISTERED (a revoked mirror), INTERRUPT."""
        self._rpc._to_mirrors(self, msg)

    def send_if_fits(self, msg: message.Message) -> tuple[int, int] | None:
        """An INVOCATION: call the router (its own size limit applies there)."""
        self._rpc._invoke_router(self, msg)
        return None


class _Callers:
    """The router's callers as one dealer party: the dealer's RESULTs and ERRORs answer their calls."""

    __slots__ = ("_rpc",)

    def __init__(self, rpc: RouterRPC) -> None:
        self._rpc = rpc

    def send_message(self, msg: message.Message) -> None:
        """A RESULT or ERROR for a call from the router."""
        self._rpc._answer_router(self, msg)

    def send_if_fits(self, msg: message.Message) -> tuple[int, int] | None:
        """Likewise (the router applies its own size limit)."""
        self._rpc._answer_router(self, msg)
        return None


@dataclass(slots=True)
class _FromRouter:
    """A call from a router caller waiting for the cluster's answer."""

    deferred: defer.Deferred[Any]
    progress: Any


class RouterRPC:
    """The active bridge's RPC both ways; see the module's docstring."""

    def __init__(self, dealer: Dealer, realm: str, role: str, max_calls: int, reactor: Any, event: Any) -> None:
        self.dealer = dealer
        self.realm = realm
        self.role = role
        self.max_calls = max_calls
        self._reactor = reactor
        self._event = event
        self.session: Any = None
        self._interest: RouterInterest | None = None
        self._synced: RouterInterest | None = None
        #: ``(match, uri)`` -> invoke policy, as the router described its registrations.
        self._invokes: dict[Interest, str] = {}
        self._mirrors = _Mirrors(self)
        self._callers = _Callers(self)
        #: ``(match, uri)`` -> the mirror's registration id in the dealer.
        self._mirrored: dict[Interest, int] = {}
        self._mirror_keys: dict[int, Interest] = {}
        #: REGISTER request id -> the key being mirrored (the dealer answers at once).
        self._mirroring: dict[int, Interest] = {}
        #: Keys the dealer refused to mirror (already registered in the cluster), tried again on a change.
        self._mirror_refused: set[Interest] = set()
        #: ``(match, uri)`` -> forwarding registration on the router (or the Deferred of one being made).
        self._forwarding: dict[Interest, Any] = {}
        #: Keys the router refused to take (a router client holds them), tried again when one is deleted.
        self._forward_refused: set[Interest] = set()
        self._from_router: dict[int, _FromRouter] = {}
        #: Invocation id -> the router call answering it.
        self._into_router: dict[int, defer.Deferred[Any]] = {}
        self._requests = itertools.count(1)
        self._reconcile_call: Any = None
        dealer.remote_changed = self._schedule

    def stats(self) -> dict[str, Any]:
        """What crosses the bridge for RPC (``/stats`` -> ``bridge.rpc``)."""
        return {
            "mirrored": sorted([match, uri] for match, uri in self._mirrored),
            "forwarding": sorted([match, uri] for (match, uri), r in self._forwarding.items() if not _pending(r)),
            "calls_from_router": len(self._from_router),
            "calls_into_router": len(self._into_router),
        }

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, session: Any) -> None:
        """The bridge became active on ``session``: read the router's registrations, mirror and forward.

        A router that refuses the bridge its registration meta API (an older role configuration) gets
        no RPC through the bridge, said once in the log; publish/subscribe carries on.
        """
        self.session = session
        interest = self._interest = RouterInterest(int(session._session_id or 0), self.role)
        try:
            for topic in REGISTRATION_EVENTS:
                await session.subscribe(self._meta_event(interest, topic), topic)
            listing = await session.call("wamp.registration.list")
        except ApplicationError as e:
            if self._interest is interest:
                self._interest = None
                self.session = None
            log.warn(
                "bridge: no RPC through the bridge: the router refused its registration meta API ({error});"
                " see docs/bridge.md for the bridge role's permissions",
                error=e.error,
            )
            return
        ids = [reg_id for kind in ("exact", "prefix", "wildcard") for reg_id in (listing or {}).get(kind, ())]
        for start in range(0, len(ids), READ_BATCH):
            batch = ids[start : start + READ_BATCH]
            await defer.gatherResults([defer.ensureDeferred(self._read_one(session, interest, i)) for i in batch])
        if self._interest is not interest:
            return
        self._synced = interest
        self._reconcile()

    def stop(self) -> None:
        """The router session ended or the bridge stands by: mirrors leave the cluster, calls in flight end."""
        self.session = None
        self._interest = self._synced = None
        self._mirrored.clear()
        self._mirror_keys.clear()
        self._mirror_refused.clear()
        self._forwarding.clear()
        self._forward_refused.clear()
        pending, self._from_router = self._from_router, {}
        self._into_router.clear()
        self.dealer.left(self._mirrors)  # callers elsewhere get ERROR wamp.error.canceled
        self.dealer.left(self._callers)
        for call in pending.values():
            if not call.deferred.called:
                call.deferred.errback(ApplicationError(ROUTER_LOST, "the bridge left the router"))

    def deleted(self, registration_id: int) -> None:
        """``wamp.registration.on_delete`` (followed by the bridge): a registration is gone from the router."""
        interest = self._interest
        if interest is None:
            return
        self._forward_refused.clear()
        self._apply(interest, interest.deleted(registration_id))
        self._schedule()

    # -- router registrations -> the bridge's dealer ----------------------------------------

    async def _read_one(self, session: Any, interest: RouterInterest, reg_id: int) -> None:
        try:
            described = await session.call("wamp.registration.get", reg_id)
            callees = await session.call("wamp.registration.list_callees", reg_id)
        except ApplicationError:  # deleted meanwhile
            self._apply(interest, interest.deleted(reg_id))
            return
        if isinstance(described, dict):
            self._note_invoke(described)
            self._apply(interest, interest.listed(described, callees or ()))

    def _note_invoke(self, details: dict[str, Any]) -> None:
        key = (str(details.get("match") or EXACT), str(details.get("uri")))
        self._invokes[key] = str(details.get("invoke") or "single")

    def _meta_event(self, interest: RouterInterest, topic: str) -> Any:
        def handle(session_id: int, arg: Any, *rest: Any, **kwargs: Any) -> None:
            if self._interest is not interest:
                return
            if topic.endswith("on_create"):
                if isinstance(arg, dict):
                    self._note_invoke(arg)
                    self._apply(interest, interest.created(session_id, arg))
            elif topic.endswith("on_register"):
                self._apply(interest, interest.subscribed(session_id, arg))
            else:
                self._apply(interest, interest.unsubscribed(session_id, arg))

        return handle

    def _apply(self, interest: RouterInterest, step: InterestStep) -> None:
        if self._synced is interest and self._interest is interest:
            for key in step.removed:
                self._unmirror(key)
            for key in step.added:
                self._mirror(key)
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

    def _mirror(self, key: Interest) -> None:
        match, uri = key
        if key in self._mirrored or not _routable(uri):
            return
        invoke = self._invokes.get(key, "single")
        request = next(self._requests)
        self._mirroring[request] = key
        register = message.Register(
            request, uri, match=None if match == EXACT else match, invoke=None if invoke == "single" else invoke
        )
        self.dealer.register(self._mirrors, self.realm, register, interruptible=True)
        self._mirroring.pop(request, None)

    def _unmirror(self, key: Interest) -> None:
        self._mirror_refused.discard(key)
        reg_id = self._mirrored.pop(key, None)
        if reg_id is not None:
            del self._mirror_keys[reg_id]
            self.dealer.unregister(self._mirrors, message.Unregister(next(self._requests), reg_id))

    def _to_mirrors(self, party: _Mirrors, msg: message.Message) -> None:
        if party is not self._mirrors:
            return
        if isinstance(msg, message.Registered):
            key = self._mirroring.get(msg.request)
            if key is not None:
                self._mirrored[key] = msg.registration
                self._mirror_keys[msg.registration] = key
                self._mirror_refused.discard(key)
        elif isinstance(msg, message.Error) and msg.request_type == message.Register.MESSAGE_TYPE:
            key = self._mirroring.get(msg.request)
            if key is not None and key not in self._mirror_refused:
                self._mirror_refused.add(key)
                self._event(BridgeEvent.REGISTRATIONS_REFUSED)
                log.info(
                    "bridge: the router's {uri} is not offered to the cluster: {error} {why}",
                    uri=key[1],
                    error=msg.error,
                    why=" ".join(str(a) for a in msg.args or ()),
                )
        elif isinstance(msg, message.Unregistered) and msg.registration is not None:
            key = self._mirror_keys.pop(msg.registration, None)  # revoked: an earlier one elsewhere won
            if key is not None:
                self._mirrored.pop(key, None)
                self._mirror_refused.add(key)
        elif isinstance(msg, message.Interrupt):
            call = self._into_router.pop(msg.request, None)
            if call is not None:
                call.cancel()

    def _invoke_router(self, party: _Mirrors, msg: message.Message) -> None:
        """An INVOCATION of a mirror: a CALL on the router, its answer a YIELD or ERROR to the dealer."""
        assert isinstance(msg, message.Invocation)
        session = self.session
        key = self._mirror_keys.get(msg.registration)
        procedure = msg.procedure or (None if key is None else key[1])
        if party is not self._mirrors or session is None or procedure is None:
            self._fail_later(party, msg.request, NO_SUCH_PROCEDURE, "the procedure left the bridged router")
            return
        if len(self._into_router) >= self.max_calls:
            self._event(BridgeEvent.CALLS_REFUSED)
            text = f"the bridge already has {len(self._into_router)} calls in flight into its router"
            self._fail_later(
                party, msg.request, TOO_MANY_CALLS, text, {"limit": "bridge.max-calls", "max": self.max_calls}
            )
            return
        invocation = msg.request

        def progress(*args: Any, **kwargs: Any) -> None:
            if self._into_router.get(invocation) is d:
                self.dealer.yielded(party, message.Yield(invocation, args=list(args), kwargs=kwargs, progress=True))

        options = CallOptions(timeout=msg.timeout or None, on_progress=progress if msg.receive_progress else None)
        try:
            d = session.call(procedure, *(msg.args or ()), options=options, **(msg.kwargs or {}))
        except Exception as e:  # the connection is going
            self._fail_later(party, invocation, ROUTER_LOST, f"calling the router failed: {e}")
            return
        self._into_router[invocation] = d
        self._event(BridgeEvent.CALLS_INTO_ROUTER)

        def done(result: Any) -> None:
            if self._into_router.get(invocation) is not d:
                return
            del self._into_router[invocation]
            if isinstance(result, CallResult):
                answer = message.Yield(invocation, args=list(result.results), kwargs=result.kwresults or None)
            else:
                answer = message.Yield(invocation, args=[result])
            self.dealer.yielded(party, answer)

        def failed(failure: Any) -> None:
            if self._into_router.get(invocation) is not d:
                return  # interrupted, or the session ended (the dealer has answered the caller)
            del self._into_router[invocation]
            e = failure.value
            if isinstance(e, ApplicationError):
                error = message.Error(
                    message.Invocation.MESSAGE_TYPE, invocation, e.error, args=list(e.args), kwargs=e.kwargs or None
                )
            else:
                error = message.Error(
                    message.Invocation.MESSAGE_TYPE, invocation, ROUTER_LOST, args=[failure.getErrorMessage()]
                )
            self.dealer.invocation_error(party, error)

        d.addCallbacks(done, failed)

    def _fail_later(
        self, party: Any, invocation: int, uri: str, text: str, kwargs: dict[str, Any] | None = None
    ) -> None:
        # Not from inside the dealer's INVOCATION: it has not finished setting the call up.
        error = message.Error(message.Invocation.MESSAGE_TYPE, invocation, uri, args=[text], kwargs=kwargs)
        self._reactor.callLater(0, self.dealer.invocation_error, party, error)

    # -- the cluster's registrations -> the router --------------------------------------------

    def _schedule(self) -> None:
        if self._reconcile_call is None or not self._reconcile_call.active():
            self._reconcile_call = self._reactor.callLater(0, self._reconcile)

    def _reconcile(self) -> None:
        """Forwarding registrations on the router for exactly the other nodes' procedures; refused mirrors retried."""
        session, interest = self.session, self._synced
        if session is None or interest is None or self._interest is not interest:
            return
        for key in sorted(interest.wanted()):
            if key not in self._mirrored:
                self._mirror(key)
        wanted = {k: v for k, v in self.dealer.remote_procedures(self.realm).items() if _routable(k[1])}
        for key in [k for k in self._forwarding if k not in wanted]:
            registration = self._forwarding.pop(key)
            if not _pending(registration) and registration.active:
                registration.unregister().addErrback(lambda _: None)
        for key, invoke in sorted(wanted.items()):
            if key not in self._forwarding and key not in self._forward_refused:
                self._forward(session, key, invoke)

    def _forward(self, session: Any, key: Interest, invoke: str) -> None:
        match, uri = key
        options = RegisterOptions(
            match=None if match == EXACT else match,
            invoke=None if invoke == "single" else invoke,
            details_arg="details",
        )
        d = session.register(self._endpoint(uri), uri, options=options)
        self._forwarding[key] = d

        def made(registration: Any) -> None:
            if self.session is not session:
                return
            if self._forwarding.get(key) is d:
                self._forwarding[key] = registration
            else:  # no longer wanted while it was being made
                registration.unregister().addErrback(lambda _: None)

        def failed(failure: Any) -> None:
            if self._forwarding.get(key) is d:
                del self._forwarding[key]
                self._forward_refused.add(key)
                self._event(BridgeEvent.REGISTRATIONS_REFUSED)
            log.info(
                "bridge: the cluster's {uri} is not offered on the router: {error}",
                uri=uri,
                error=failure.getErrorMessage(),
            )

        d.addCallbacks(made, failed)

    def _endpoint(self, uri: str) -> Any:
        def forward(*args: Any, details: Any = None, **kwargs: Any) -> defer.Deferred[Any]:
            if len(self._from_router) >= self.max_calls:
                self._event(BridgeEvent.CALLS_REFUSED)
                raise ApplicationError(
                    TOO_MANY_CALLS,
                    f"the bridge already has {len(self._from_router)} calls in flight into the cluster",
                    limit="bridge.max-calls",
                    max=self.max_calls,
                )
            request = next(self._requests)
            d: defer.Deferred[Any] = defer.Deferred(lambda _: self._canceled(request))
            progress = None if details is None else details.progress
            self._from_router[request] = _FromRouter(d, progress)
            self._event(BridgeEvent.CALLS_FROM_ROUTER)
            procedure = uri if details is None or not details.procedure else str(details.procedure)
            call = message.Call(
                request,
                procedure,
                args=list(args) or None,
                kwargs=kwargs or None,
                receive_progress=True if progress is not None else None,
            )
            self.dealer.call(self._callers, self.realm, call, exclude=self._mirrors)
            return d

        return forward

    def _canceled(self, request: int) -> None:
        """The router INTERRUPTed a call from one of its callers (Autobahn cancels its Deferred)."""
        if self._from_router.pop(request, None) is not None:
            self.dealer.cancel(self._callers, message.Cancel(request, mode=message.Cancel.KILLNOWAIT))

    def _answer_router(self, party: _Callers, msg: message.Message) -> None:
        if party is not self._callers:
            return
        if isinstance(msg, message.Result):
            call = self._from_router.get(msg.request)
            if call is None:
                return
            if msg.progress:
                if call.progress is not None:
                    call.progress(*(msg.args or ()), **(msg.kwargs or {}))
                return
            del self._from_router[msg.request]
            call.deferred.callback(CallResult(*(msg.args or ()), **(msg.kwargs or {})))
        elif isinstance(msg, message.Error):
            found = self._from_router.pop(msg.request, None)
            if found is not None:
                error = ApplicationError(msg.error, *(msg.args or ()), **(msg.kwargs or {}))
                found.deferred.errback(error)


def _pending(registration: Any) -> bool:
    return isinstance(registration, defer.Deferred)
