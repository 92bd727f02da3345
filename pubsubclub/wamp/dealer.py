"""A node-local WAMP Dealer (Basic Profile RPC) for the sessions of one node.

REGISTER/UNREGISTER, CALL -> INVOCATION -> YIELD/ERROR -> RESULT/ERROR, with:

- one callee per procedure and realm (exact match): a second REGISTER gets
  ERROR ``wamp.error.procedure_already_exists``;
- a CALL of a procedure nobody registered on this node gets ERROR
  ``wamp.error.no_such_procedure`` (RPC is not federated: a procedure
  registered on another node is unknown here; docs/architecture.md);
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
- only exact, single registrations: REGISTER with ``match`` prefix/wildcard
  or an ``invoke`` policy other than ``single`` gets ERROR
  ``wamp.error.invalid_argument`` (neither feature is announced);
- with ``--auth``, a role may REGISTER and CALL the URIs it may publish to;
- at most ``max_pending_calls`` calls in flight per caller (``[wamp]
  max-pending-calls``): one more gets ERROR ``pubsubclub.error.too_many_calls``
  at once, so a callee that never answers cannot make the node hold calls
  without bound.

Sans-IO apart from the injected ``call_later`` for timeouts: sessions are any
objects with ``send(msg)`` (the broker's sessions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from autobahn.wamp import message

NO_SUCH_PROCEDURE = "wamp.error.no_such_procedure"
PROCEDURE_ALREADY_EXISTS = "wamp.error.procedure_already_exists"
NO_SUCH_REGISTRATION = "wamp.error.no_such_registration"
CANCELED = "wamp.error.canceled"
TIMEOUT = "wamp.error.timeout"
NOT_AUTHORIZED = "wamp.error.not_authorized"
TOO_MANY_CALLS = "pubsubclub.error.too_many_calls"
INVALID_ARGUMENT = "wamp.error.invalid_argument"
#: INTERRUPT mode: the dealer has already answered the caller and will not wait for the callee.
KILL_NO_WAIT = "killnowait"


class Party(Protocol):
    """A session as the dealer sees it."""

    def send_message(self, msg: message.Message) -> None:
        """Send one WAMP message to this session's client."""


@dataclass(eq=False)
class _Registration:
    id: int
    realm: str
    procedure: str
    callee: Party
    #: The callee announced call canceling: it is sent INTERRUPT for calls that end without it.
    interruptible: bool = False


@dataclass(eq=False)
class _Call:
    """One CALL in flight: who asked, who answers, and the timer ending it."""

    caller: Party
    request: int
    callee: Party
    registration: _Registration
    timer: Any = None


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
    _by_procedure: dict[tuple[str, str], _Registration] = field(default_factory=dict)
    _by_id: dict[int, _Registration] = field(default_factory=dict)
    #: Invocation request id -> the call it answers.
    _calls: dict[int, _Call] = field(default_factory=dict)
    #: Calls in flight per caller (only callers with at least one).
    _pending: dict[Party, int] = field(default_factory=dict)
    #: (caller, CALL request id) -> invocation request id, for CANCEL.
    _by_request: dict[tuple[Party, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_pending_calls, int) or self.max_pending_calls <= 0:
            raise ValueError(f"max_pending_calls must be a positive int, not {self.max_pending_calls!r}")

    # -- callee side ----------------------------------------------------------------

    def register(self, callee: Party, realm: str, msg: message.Register, interruptible: bool = False) -> None:
        """REGISTER: REGISTERED, or ERROR when the procedure already has a callee or asks what is not offered.

        ``interruptible``: the callee announced call canceling (it understands INTERRUPT).
        """
        problem = _unoffered(msg)
        if problem is not None:
            callee.send_message(
                message.Error(message.Register.MESSAGE_TYPE, msg.request, INVALID_ARGUMENT, args=[problem])
            )
            return
        key = (realm, msg.procedure)
        if key in self._by_procedure:
            callee.send_message(
                message.Error(
                    message.Register.MESSAGE_TYPE,
                    msg.request,
                    PROCEDURE_ALREADY_EXISTS,
                    args=[f"procedure {msg.procedure!r} is already registered"],
                )
            )
            return
        registration = _Registration(self.new_id(), realm, msg.procedure, callee, interruptible)
        self._by_procedure[key] = registration
        self._by_id[registration.id] = registration
        callee.send_message(message.Registered(msg.request, registration.id))

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
        call = self._calls.get(msg.request)
        if call is None or call.callee is not callee:
            return  # the caller left, or the call timed out: nothing to answer
        progress = bool(msg.progress)
        if not progress:
            self._finish(msg.request)
        call.caller.send_message(message.Result(call.request, args=msg.args, kwargs=msg.kwargs, progress=progress))

    def invocation_error(self, callee: Party, msg: message.Error) -> None:
        """ERROR for an INVOCATION: the caller gets ERROR for its CALL with the callee's URI and arguments."""
        call = self._calls.get(msg.request)
        if call is None or call.callee is not callee:
            return
        self._finish(msg.request)
        call.caller.send_message(
            message.Error(message.Call.MESSAGE_TYPE, call.request, msg.error, args=msg.args, kwargs=msg.kwargs)
        )

    # -- caller side ----------------------------------------------------------------------

    def call(self, caller: Party, realm: str, msg: message.Call) -> None:
        """CALL: an INVOCATION to the callee, or ERROR when there is none."""
        registration = self._by_procedure.get((realm, msg.procedure))
        if registration is None:
            caller.send_message(
                message.Error(
                    message.Call.MESSAGE_TYPE,
                    msg.request,
                    NO_SUCH_PROCEDURE,
                    args=[f"no procedure {msg.procedure!r} is registered on this node"],
                )
            )
            return
        pending = self._pending.get(caller, 0)
        if pending >= self.max_pending_calls:
            caller.send_message(
                message.Error(
                    message.Call.MESSAGE_TYPE,
                    msg.request,
                    TOO_MANY_CALLS,
                    args=[f"this session already has {pending} calls in flight, the limit is {self.max_pending_calls}"],
                )
            )
            return
        self._pending[caller] = pending + 1
        invocation = self.new_id()
        call = self._calls[invocation] = _Call(caller, msg.request, registration.callee, registration)
        self._by_request[(caller, msg.request)] = invocation
        seconds = [s for s in ((msg.timeout or 0) / 1000.0, self.max_call_seconds) if s > 0]
        if seconds and self.call_later is not None:
            call.timer = self.call_later(min(seconds), lambda: self._time_out(invocation))
        registration.callee.send_message(
            message.Invocation(
                invocation,
                registration.id,
                args=msg.args,
                kwargs=msg.kwargs,
                timeout=msg.timeout,
                receive_progress=msg.receive_progress,
            )
        )

    def cancel(self, caller: Party, msg: message.Cancel) -> None:
        """CANCEL: the caller's pending call ends with ERROR ``wamp.error.canceled``; a call already over is ignored."""
        invocation = self._by_request.get((caller, msg.request))
        if invocation is None:
            return  # answered, timed out or never made: the spec says to ignore it
        call = self._calls[invocation]
        self._finish(invocation)
        caller.send_message(
            message.Error(
                message.Call.MESSAGE_TYPE, call.request, CANCELED, args=["the call was canceled by its caller"]
            )
        )
        if msg.mode != message.Cancel.SKIP:
            self._interrupt(invocation, call)

    def _interrupt(self, invocation: int, call: _Call) -> None:
        """Tell an interruptible callee to stop working on a call whose caller has been answered."""
        if call.registration.interruptible:
            call.callee.send_message(message.Interrupt(invocation, mode=KILL_NO_WAIT))

    def _time_out(self, invocation: int) -> None:
        call = self._take(invocation)
        if call is None:
            return
        call.timer = None
        call.caller.send_message(
            message.Error(message.Call.MESSAGE_TYPE, call.request, TIMEOUT, args=["the call took too long"])
        )
        self._interrupt(invocation, call)

    def _take(self, invocation: int) -> _Call | None:
        """Forget a call in flight and count it off its caller's pending calls."""
        call = self._calls.pop(invocation, None)
        if call is not None:
            key = (call.caller, call.request)
            if self._by_request.get(key) == invocation:
                del self._by_request[key]
            left = self._pending.get(call.caller, 0) - 1
            if left > 0:
                self._pending[call.caller] = left
            else:
                self._pending.pop(call.caller, None)
        return call

    def _finish(self, invocation: int) -> None:
        call = self._take(invocation)
        if call is not None and call.timer is not None:
            call.timer.cancel()
            call.timer = None

    # -- sessions leaving ---------------------------------------------------------------------

    def left(self, party: Party) -> None:
        """A session ended: its registrations go (their callers get ERROR), its own calls are forgotten."""
        for registration in [r for r in self._by_id.values() if r.callee is party]:
            self._drop_registration(registration, "the callee left during the call")
        for invocation, call in list(self._calls.items()):
            if call.caller is party:
                self._finish(invocation)

    def _drop_registration(self, registration: _Registration, why: str) -> None:
        self._by_id.pop(registration.id, None)
        self._by_procedure.pop((registration.realm, registration.procedure), None)
        for invocation, call in list(self._calls.items()):
            if call.registration is registration:
                self._finish(invocation)
                call.caller.send_message(message.Error(message.Call.MESSAGE_TYPE, call.request, CANCELED, args=[why]))

    def registrations(self) -> int:
        """Procedures registered (for /stats)."""
        return len(self._by_id)

    def calls_in_flight(self) -> int:
        """Calls waiting for their callee's answer."""
        return len(self._calls)


def _unoffered(msg: message.Register) -> str | None:
    """Why a REGISTER asks for something this dealer does not offer, or None."""
    if msg.match not in (None, message.Register.MATCH_EXACT):
        return f"this dealer offers only exact registrations, not match {msg.match!r}"
    if msg.invoke not in (None, message.Register.INVOKE_SINGLE):
        return f"this dealer offers no shared registrations (invoke {msg.invoke!r}); only 'single'"
    return None
