"""The dealer's calls in flight: INVOCATION out, YIELD/ERROR back, CANCEL, timeouts and the caps on calls.

Split from pubsubclub/frontends/wamp/dealer.py (issue 22): the Dealer keeps
the registration table (who may be called, and which callee a CALL picks),
and hands the call it picked to :class:`CallsInFlight`, which keeps the call
until its caller has been answered. Each call is found from its invocation
id, its caller, its registration and its caller's request id (for CANCEL),
so a session or a registration that goes ends its calls without a scan of
the node's. The URIs of the errors a call can end with are defined here and
re-exported by dealer.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from autobahn.wamp import message

from pubsubclub.core.compaction import Compaction
from pubsubclub.frontends.wamp.registrations import (
    DisclosedInvocation,
    Identity,
    Party,
    _Call,
    _forget,
    _Registration,
)

CANCELED = "wamp.error.canceled"
TIMEOUT = "wamp.error.timeout"
TOO_MANY_CALLS = "pubsubclub.error.too_many_calls"
#: A message for one session would be over its message-size limit (Autobahn's ApplicationError name).
PAYLOAD_SIZE_EXCEEDED = "wamp.error.payload_size_exceeded"
#: INTERRUPT mode: the dealer has already answered the caller and will not wait for the callee.
KILL_NO_WAIT = "killnowait"


def _limit_error(request_type: int, request: int, uri: str, text: str, limit: str, value: int) -> message.Error:
    """ERROR naming the limit that refused a request: a sentence, and ``{"limit": ..., "max": ...}``."""
    return message.Error(request_type, request, uri, args=[text], kwargs={"limit": limit, "max": value})


class CallSettings(Protocol):
    """What the calls in flight read from their dealer at each call (the Dealer's own fields)."""

    @property
    def new_id(self) -> Callable[[], int]:
        """A fresh invocation id."""

    @property
    def call_later(self) -> Callable[[float, Callable[[], None]], Any] | None:
        """``call_later(seconds, fn)`` for call timeouts; None: none."""

    @property
    def max_call_seconds(self) -> float:
        """Longest a call may take (0: only the caller's own ``timeout``)."""

    @property
    def max_node_calls(self) -> int:
        """Calls the node may have in flight at once."""

    @property
    def refused(self) -> Callable[[str], None] | None:
        """Told the reason of every refusal past a limit."""


@dataclass
class CallsInFlight:
    """Every call the dealer has handed to a callee and not yet answered, with their indexes."""

    settings: CallSettings
    #: Invocation request id -> the call it answers.
    calls: dict[int, _Call] = field(default_factory=dict)
    #: Invocation ids in flight per caller (only callers with at least one).
    by_caller: dict[Party, dict[int, None]] = field(default_factory=dict)
    #: Invocation ids in flight per registration (only registrations with at least one).
    by_registration: dict[int, dict[int, None]] = field(default_factory=dict)
    #: (caller, CALL request id) -> invocation request id, for CANCEL.
    by_request: dict[tuple[Party, int], int] = field(default_factory=dict)
    compaction: Compaction = field(default_factory=Compaction)

    def refuse(self, party: Party, reason: str, error: message.Error) -> None:
        """Send ``party`` an ERROR past a limit, counted through the dealer's ``refused``."""
        refused = self.settings.refused
        if refused is not None:
            refused(reason)
        party.send_message(error)

    def over_caps(self, caller: Party, msg: message.Call, per_caller: int, limit: str) -> bool:
        """Refuse a CALL (True) past ``per_caller`` calls of ``caller`` or the node's cap; else False."""
        pending = self.by_caller.get(caller)
        if pending is not None and len(pending) >= per_caller:
            who = "this session" if limit == "wamp.max-pending-calls" else "the calling node"
            text = f"{who} already has {len(pending)} calls in flight, the limit is {per_caller}"
            self._refuse_call(caller, msg, text, limit, per_caller)
            return True
        cap = self.settings.max_node_calls
        if len(self.calls) >= cap:
            text = f"this node already has {len(self.calls)} calls in flight, the limit is {cap}"
            self._refuse_call(caller, msg, text, "wamp.max-calls-per-node", cap)
            return True
        return False

    def _refuse_call(self, caller: Party, msg: message.Call, text: str, limit: str, value: int) -> None:
        error = _limit_error(message.Call.MESSAGE_TYPE, msg.request, TOO_MANY_CALLS, text, limit, value)
        self.refuse(caller, "too_many_calls", error)

    def invoke(
        self,
        caller: Party,
        msg: message.Call,
        registration: _Registration,
        disclosed: Identity,
        disclose: bool = False,
    ) -> None:
        """INVOCATION to ``registration``'s callee (or over its link), or ERROR if it would be too big."""
        settings = self.settings
        invocation = settings.new_id()
        call = self.calls[invocation] = _Call(caller, msg.request, registration.callee, registration)
        pending = self.by_caller.get(caller)
        if pending is None:
            pending = self.by_caller[caller] = {}
        pending[invocation] = None
        self.by_registration.setdefault(registration.id, {})[invocation] = None
        self.by_request[(caller, msg.request)] = invocation
        self.compaction.grown(len(self.calls))
        remote = registration.remote_id is not None
        too_big = registration.callee.send_if_fits(
            (DisclosedInvocation if disclose else message.Invocation)(
                invocation,
                registration.remote_id if remote else registration.id,
                args=msg.args,
                kwargs=msg.kwargs,
                timeout=msg.timeout,
                receive_progress=msg.receive_progress,
                caller=disclosed[0],
                caller_authid=disclosed[1],
                caller_authrole=disclosed[2],
                # A pattern's callee learns what was called; another node's always does (it picks its own way).
                procedure=msg.procedure if remote or registration.match != "exact" else None,
            )
        )
        if too_big is not None:
            self.take(invocation)
            size, limit = too_big
            where = "the link to the callee's node" if remote else "the callee"
            text = f"the INVOCATION would be a message of {size} bytes, over the limit of {limit} of {where}"
            error = _limit_error(
                message.Call.MESSAGE_TYPE, msg.request, PAYLOAD_SIZE_EXCEEDED, text, "max-message-size", limit
            )
            self.refuse(caller, "payload_size_exceeded", error)
            return
        seconds = [s for s in ((msg.timeout or 0) / 1000.0, settings.max_call_seconds) if s > 0]
        if seconds and settings.call_later is not None:
            call.timer = settings.call_later(min(seconds), lambda: self._time_out(invocation))

    def yielded(self, callee: Party, msg: message.Yield) -> None:
        """YIELD: the caller gets RESULT (a progressive YIELD a progressive RESULT)."""
        call = self.calls.get(msg.request)
        if call is None or call.callee is not callee:
            return  # the caller left, or the call timed out: nothing to answer
        progress = bool(msg.progress)
        if not progress:
            self.finish(msg.request)
        result = message.Result(call.request, args=msg.args, kwargs=msg.kwargs, progress=progress)
        if not self._answer(call, result, "RESULT") and progress:
            # The caller was answered with an error: the callee's further work is for nobody.
            self.finish(msg.request)
            self.interrupt(msg.request, call)

    def invocation_error(self, callee: Party, msg: message.Error) -> None:
        """ERROR for an INVOCATION: the caller gets ERROR for its CALL with the callee's URI and arguments."""
        call = self.calls.get(msg.request)
        if call is None or call.callee is not callee:
            return
        self.finish(msg.request)
        error = message.Error(message.Call.MESSAGE_TYPE, call.request, msg.error, args=msg.args, kwargs=msg.kwargs)
        self._answer(call, error, "ERROR")

    def _answer(self, call: _Call, answer: message.Result | message.Error, kind: str) -> bool:
        """Send the caller its RESULT or ERROR; one over the caller's size limit becomes ERROR PAYLOAD_SIZE_EXCEEDED."""
        too_big = call.caller.send_if_fits(answer)
        if too_big is None:
            return True
        size, limit = too_big
        text = f"the callee's {kind} would be a message of {size} bytes, over this session's limit of {limit}"
        error = _limit_error(
            message.Call.MESSAGE_TYPE, call.request, PAYLOAD_SIZE_EXCEEDED, text, "max-message-size", limit
        )
        self.refuse(call.caller, "payload_size_exceeded", error)
        return False

    def cancel(self, caller: Party, msg: message.Cancel) -> None:
        """CANCEL: the caller's pending call ends with ERROR ``wamp.error.canceled``; a call already over is ignored."""
        invocation = self.by_request.get((caller, msg.request))
        if invocation is None:
            return  # answered, timed out or never made: the spec says to ignore it
        call = self.calls[invocation]
        self.finish(invocation)
        caller.send_message(
            message.Error(
                message.Call.MESSAGE_TYPE, call.request, CANCELED, args=["the call was canceled by its caller"]
            )
        )
        if msg.mode != message.Cancel.SKIP:
            self.interrupt(invocation, call)

    def interrupt(self, invocation: int, call: _Call) -> None:
        """Tell an interruptible callee to stop working on a call whose caller has been answered."""
        if call.registration.interruptible:
            call.callee.send_message(message.Interrupt(invocation, mode=KILL_NO_WAIT))

    def _time_out(self, invocation: int) -> None:
        call = self.take(invocation)
        if call is None:
            return
        call.timer = None
        call.caller.send_message(
            message.Error(message.Call.MESSAGE_TYPE, call.request, TIMEOUT, args=["the call took too long"])
        )
        self.interrupt(invocation, call)

    def take(self, invocation: int) -> _Call | None:
        """Forget a call in flight: off its caller's, its registration's and the node's tables."""
        call = self.calls.pop(invocation, None)
        if call is None:
            return None
        key = (call.caller, call.request)
        if self.by_request.get(key) == invocation:
            del self.by_request[key]
        _forget(self.by_caller, call.caller, invocation)
        _forget(self.by_registration, call.registration.id, invocation)
        if self.compaction.due(len(self.calls)):
            self.calls = dict(self.calls)
            self.by_request = dict(self.by_request)
            self.by_caller = dict(self.by_caller)
            self.by_registration = dict(self.by_registration)
        return call

    def finish(self, invocation: int) -> None:
        """Forget a call in flight and stop its timer."""
        call = self.take(invocation)
        if call is not None and call.timer is not None:
            call.timer.cancel()
            call.timer = None

    def caller_left(self, party: Party) -> None:
        """A caller (a session, a link's stand-in) is gone: its calls are forgotten, their callees interrupted."""
        for invocation in list(self.by_caller.get(party, ())):
            call = self.calls[invocation]
            self.finish(invocation)
            self.interrupt(invocation, call)

    def registration_gone(self, registration: _Registration, why: str, uri: str) -> None:
        """A registration left the table: each of its calls in flight ends with ERROR ``uri``."""
        for invocation in list(self.by_registration.get(registration.id, ())):
            call = self.calls[invocation]
            self.finish(invocation)
            call.caller.send_message(message.Error(message.Call.MESSAGE_TYPE, call.request, uri, args=[why]))

    def tables(self) -> dict[str, int]:
        """Entries in each table of calls (all 0 once every session has left)."""
        return {
            "calls": len(self.calls),
            "callers": len(self.by_caller),
            "requests": len(self.by_request),
            "registrations_called": len(self.by_registration),
        }
