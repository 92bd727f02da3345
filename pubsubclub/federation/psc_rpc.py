"""PSC 0.7 codec: RPC across the cluster (sans-IO: no Twisted, no sockets).

Six messages, each a JSON array whose first item is its type
(docs/protocol.md, "Extension: version 0.7, RPC"):

- PSC401 ``[401, registration, realm, procedure, match, invoke, created]``
  (producer to consumer): a registration on the producer's node;
- PSC402 ``[402, registration]`` (producer to consumer): it is gone;
- PSC403 ``[403, call, registration, procedure, args, kwargs, options]``
  (consumer to producer): invoke that registration;
- PSC404 ``[404, call, args, kwargs, options]`` (producer to consumer): a
  result, progressive when ``options`` holds ``"p": 1``;
- PSC405 ``[405, call, error, args, kwargs, options]`` (producer to
  consumer): the call ended with an error;
- PSC406 ``[406, call, mode]`` (consumer to producer): cancel a call.

``args`` is a list or null, ``kwargs`` an object or null. When they hold
binary values ``options`` has ``"b": 1`` and they are written in WAMP's JSON
convention (:mod:`pubsubclub.core.binaryjson`), as 0.6's PSC301 is. Decoding
raises :class:`pubsubclub.federation.psc.PSCDecodeError`, the one decode
error of PSC; importing this module registers the decoders with
:func:`pubsubclub.federation.psc.decode`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from pubsubclub.core import binaryjson, jsonbounds
from pubsubclub.federation import psc
from pubsubclub.federation.psc import ExtensionMessage, Limits, PSCDecodeError

REGISTER = 401
UNREGISTER = 402
CALL = 403
RESULT = 404
ERROR = 405
CANCEL = 406

MATCHES = ("exact", "prefix", "wildcard")
INVOKES = ("single", "roundrobin", "random", "first", "last")
CANCEL_MODES = ("skip", "kill", "killnowait")
#: WAMP ids are integers in [1, 2**53].
MAX_ID = 2**53
#: A call whose args or kwargs cannot cross a link (JSON bounds, a bad binary value) ends with this ERROR.
INVALID_PAYLOAD = "wamp.error.invalid_payload"


#: The procedure of a node-to-node WAMP meta query: a PSC403 for no registration (docs/protocol.md, 0.7,
#: "Meta queries"); ``$`` is reserved, so no client can register or call it.
META_QUERY = "$pubsubclub.meta.query"


@dataclass(frozen=True, slots=True)
class Register(ExtensionMessage):
    """PSC401: a registration of the sender's node (``created``: its registration time, the race rule's key)."""

    registration: int
    realm: str
    procedure: str
    match: str
    invoke: str
    created: float

    def encode(self) -> bytes:
        """The bytes of this message."""
        return orjson.dumps(
            [REGISTER, self.registration, self.realm, self.procedure, self.match, self.invoke, self.created]
        )


@dataclass(frozen=True, slots=True)
class Unregister(ExtensionMessage):
    """PSC402: the registration is gone."""

    registration: int

    def encode(self) -> bytes:
        """The bytes of this message."""
        return orjson.dumps([UNREGISTER, self.registration])


@dataclass(frozen=True, slots=True)
class Call(ExtensionMessage):
    """PSC403: invoke ``registration`` for ``procedure`` (the URI the caller called) as call ``call``."""

    call: int
    registration: int
    procedure: str
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    #: The caller's ``timeout`` option, in milliseconds.
    timeout: int | None = None
    receive_progress: bool = False
    #: Caller disclosure (session id, authid, authrole), when the caller's node discloses it.
    caller: int | None = None
    caller_authid: str | None = None
    caller_authrole: str | None = None
    #: The caller's node discloses the caller whatever the registration asked (option ``"d"``).
    disclose: bool = False
    #: Why the call cannot be made (its args or kwargs broke the JSON bounds; never encoded): the
    #: callee's node answers PSC405 ``wamp.error.invalid_payload`` for just this call.
    problem: str | None = None

    def encode(self) -> bytes:
        """The bytes of this message."""
        options: dict[str, Any] = {}
        if self.timeout:
            options["t"] = self.timeout
        if self.receive_progress:
            options["p"] = 1
        if self.caller is not None:
            options["c"] = self.caller
        if self.caller_authid is not None:
            options["ca"] = self.caller_authid
        if self.caller_authrole is not None:
            options["cr"] = self.caller_authrole
        if self.disclose:
            options["d"] = 1
        return _dumps([CALL, self.call, self.registration, self.procedure], self.args, self.kwargs, options)


@dataclass(frozen=True, slots=True)
class Result(ExtensionMessage):
    """PSC404: the callee's result for call ``call`` (``progress``: more follow)."""

    call: int
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    progress: bool = False

    def encode(self) -> bytes:
        """The bytes of this message."""
        return _dumps([RESULT, self.call], self.args, self.kwargs, {"p": 1} if self.progress else {})


@dataclass(frozen=True, slots=True)
class Error(ExtensionMessage):
    """PSC405: call ``call`` ended with the error URI ``error`` (the callee's, or the dealer's)."""

    call: int
    error: str
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None

    def encode(self) -> bytes:
        """The bytes of this message."""
        return _dumps([ERROR, self.call, self.error], self.args, self.kwargs, {})


@dataclass(frozen=True, slots=True)
class Cancel(ExtensionMessage):
    """PSC406: the caller's node gave up on call ``call`` (``mode``: the caller's CANCEL mode, or ``killnowait``)."""

    call: int
    mode: str = "killnowait"

    def encode(self) -> bytes:
        """The bytes of this message."""
        return orjson.dumps([CANCEL, self.call, self.mode])


#: Sent by the producer (the callee's node) / by the consumer (the caller's node).
FROM_PRODUCER = (Register, Unregister, Result, Error)
FROM_CONSUMER = (Call, Cancel)


def _dumps(head: list[Any], args: Any, kwargs: Any, options: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps([*head, args, kwargs, options])
    except TypeError:
        pass  # bytes inside: the binary carrier (rare, so JSON payloads pay nothing)
    options = {**options, "b": 1}
    return orjson.dumps([*head, binaryjson.to_json(args), binaryjson.to_json(kwargs), options])


# -- decoding -------------------------------------------------------------------------


def _arity(name: str, params: list[Any], n: int) -> None:
    if len(params) != n:
        raise PSCDecodeError(f"{name} takes {n} parameters, got {len(params)}")


def _id(name: str, value: Any) -> int:
    if type(value) is not int or not 1 <= value <= MAX_ID:
        raise PSCDecodeError(f"{name} must be an integer in [1, 2**53], got {str(value)[:40]}")
    return value


def _uri(name: str, value: Any, limits: Limits) -> str:
    if type(value) is not str or not value or len(value) > limits.max_topic_length:
        raise PSCDecodeError(f"{name} must be a non-empty string of at most {limits.max_topic_length} characters")
    return value


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed or type(value) is not str:
        raise PSCDecodeError(f"{name} must be one of {', '.join(allowed)}, got {str(value)[:40]!r}")
    return value  # type: ignore[no-any-return]


def _payload(
    name: str, params: list[Any], limits: Limits, data: bytes | str
) -> tuple[Any, Any, dict[str, Any], str | None]:
    """``args``, ``kwargs``, ``options`` (the last three items) checked, binary values restored, and a problem.

    A message of the wrong shape raises :class:`PSCDecodeError` (the link closes); args or kwargs that
    break the JSON bounds, or a bad binary value, only spoil the one call: the problem is returned
    (args and kwargs None) and the call ends with ERROR ``wamp.error.invalid_payload``.
    """
    args, kwargs, options = params[-3], params[-2], params[-1]
    if args is not None and type(args) is not list:
        raise PSCDecodeError(f"{name} args must be a list or null")
    if kwargs is not None and type(kwargs) is not dict:
        raise PSCDecodeError(f"{name} kwargs must be an object or null")
    if type(options) is not dict:
        raise PSCDecodeError(f"{name} options must be an object")
    binary = options.get("b")
    if binary is not None and (binary != 1 or type(binary) is not int):
        raise PSCDecodeError(f'{name} option "b" must be 1')
    try:
        # Measured on the whole message's text: ids, URIs and known options are checked on their own,
        # so what breaks the bounds is the payload (or an unknown option, ignored anyway).
        jsonbounds.check_decoded(data, params, limits.json, wrapper_depth=1)
    except jsonbounds.BoundsError as e:
        return None, None, options, f"{name} args or kwargs: {e}"
    if binary is not None:
        try:
            args, kwargs = binaryjson.from_json(args), binaryjson.from_json(kwargs)
        except binaryjson.BinaryDecodeError as e:
            return None, None, options, f"{name} args or kwargs: {e}"
    return args, kwargs, options, None


def _flag(name: str, options: dict[str, Any], key: str) -> bool:
    value = options.get(key)
    if value is None:
        return False
    if value != 1 or type(value) is not int:
        raise PSCDecodeError(f'{name} option "{key}" must be 1')
    return True


def _register(params: list[Any], limits: Limits, data: bytes | str) -> Register:
    _arity("PSC401", params, 6)
    created = params[5]
    if type(created) not in (int, float) or not math.isfinite(created) or created < 0:
        raise PSCDecodeError("PSC401 created must be a finite number >= 0")
    return Register(
        _id("PSC401 registration", params[0]),
        _uri("PSC401 realm", params[1], limits),
        _uri("PSC401 procedure", params[2], limits),
        _one_of("PSC401 match", params[3], MATCHES),
        _one_of("PSC401 invoke", params[4], INVOKES),
        float(created),
    )


def _unregister(params: list[Any], limits: Limits, data: bytes | str) -> Unregister:
    _arity("PSC402", params, 1)
    return Unregister(_id("PSC402 registration", params[0]))


def _call(params: list[Any], limits: Limits, data: bytes | str) -> Call:
    _arity("PSC403", params, 6)
    call = _id("PSC403 call", params[0])
    registration = _id("PSC403 registration", params[1])
    procedure = _uri("PSC403 procedure", params[2], limits)
    args, kwargs, options, problem = _payload("PSC403", params, limits, data)
    timeout = options.get("t")
    if timeout is not None and (type(timeout) is not int or not 0 <= timeout <= MAX_ID):
        raise PSCDecodeError('PSC403 option "t" must be an integer of milliseconds')
    caller = options.get("c")
    if caller is not None:
        caller = _id("PSC403 caller", caller)
    authid, authrole = options.get("ca"), options.get("cr")
    for key, value in (("ca", authid), ("cr", authrole)):
        if value is not None and (type(value) is not str or len(value) > limits.max_topic_length):
            raise PSCDecodeError(f'PSC403 option "{key}" must be a string')
    progress, disclose = _flag("PSC403", options, "p"), _flag("PSC403", options, "d")
    return Call(
        call, registration, procedure, args, kwargs, timeout, progress, caller, authid, authrole, disclose, problem
    )


def _result(params: list[Any], limits: Limits, data: bytes | str) -> Result | Error:
    _arity("PSC404", params, 4)
    call = _id("PSC404 call", params[0])
    args, kwargs, options, problem = _payload("PSC404", params, limits, data)
    progress = _flag("PSC404", options, "p")
    if problem is not None:
        return Error(call, INVALID_PAYLOAD, [f"the callee's result cannot cross the link: {problem}"])
    return Result(call, args, kwargs, progress)


def _error(params: list[Any], limits: Limits, data: bytes | str) -> Error:
    _arity("PSC405", params, 5)
    call = _id("PSC405 call", params[0])
    uri = _uri("PSC405 error", params[1], limits)
    args, kwargs, _, problem = _payload("PSC405", params, limits, data)
    if problem is not None:
        return Error(call, INVALID_PAYLOAD, [f"the callee's error {uri} cannot cross the link: {problem}"])
    return Error(call, uri, args, kwargs)


def _cancel(params: list[Any], limits: Limits, data: bytes | str) -> Cancel:
    _arity("PSC406", params, 2)
    return Cancel(_id("PSC406 call", params[0]), _one_of("PSC406 mode", params[1], CANCEL_MODES))


psc.EXTENSION_DECODERS.update(
    {REGISTER: _register, UNREGISTER: _unregister, CALL: _call, RESULT: _result, ERROR: _error, CANCEL: _cancel}
)
