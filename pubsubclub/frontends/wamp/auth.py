"""WAMP authentication: the authenticator of one session's opening handshake, sans-IO.

The policy it checks credentials against (roles, principals, the ``--auth``
TOML file and its parser) is in :mod:`pubsubclub.frontends.wamp.authpolicy`;
its names (:class:`AuthPolicy`, :class:`Role`, :func:`parse_auth`,
:func:`load_auth`...) stay importable from here.

:class:`Authenticator` is the router side of one session's opening
handshake: ``hello()`` answers HELLO with a :class:`Welcome`, a
:class:`Challenge` or a :class:`Deny`, and ``authenticate()`` answers
AUTHENTICATE. It reads no socket and starts no timer; randomness and the
clock are injected. WAMP-CRA uses Autobahn's ``compute_wcs`` (the client's
own helper), cryptosign PyNaCl's Ed25519 check, which is what Autobahn's
``CryptosignKey`` signs with (Autobahn ships no router-side verifier).
"""

from __future__ import annotations

import binascii
import datetime
import enum
import hmac
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autobahn.wamp.auth import compute_wcs

from pubsubclub.frontends.wamp.authpolicy import (  # noqa: F401 (re-exported)
    _CREDENTIAL_KEYS,
    MAX_AUTH_FILE,
    MAX_NAME_LENGTH,
    AuthFileError,
    AuthPolicy,
    Credential,
    Cryptosign,
    Principal,
    Role,
    Ticket,
    WampCra,
    load_auth,
    parse_auth,
)

__all__ = [
    "ANONYMOUS",
    "AUTHENTICATION_FAILED",
    "NOT_AUTHORIZED",
    "AuthFileError",
    "AuthPolicy",
    "AuthState",
    "AuthStateError",
    "Authenticator",
    "Challenge",
    "Cryptosign",
    "Deny",
    "Principal",
    "Role",
    "Ticket",
    "WampCra",
    "Welcome",
    "load_auth",
    "parse_auth",
]

#: WELCOME ``authmethod`` (and HELLO method name) of a session without credentials.
ANONYMOUS = "anonymous"
#: ABORT reason for a credential that does not check out.
AUTHENTICATION_FAILED = "wamp.error.authentication_failed"
#: ABORT reason when nobody could be authenticated at all (unknown authid, no
#: acceptable method, anonymous refused), and ERROR of a refused PUBLISH/SUBSCRIBE.
NOT_AUTHORIZED = "wamp.error.not_authorized"
#: WELCOME ``authprovider``: principals come from the static policy file.
AUTHPROVIDER = "static"
#: Random bytes of a WAMP-cryptosign challenge (the spec's 32).
CRYPTOSIGN_CHALLENGE_BYTES = 32
#: Random bytes of the nonce inside a WAMP-CRA challenge.
WAMPCRA_NONCE_BYTES = 16


class AuthStateError(RuntimeError):
    """The :class:`Authenticator` was driven out of order (our bug, not the peer's)."""


# -- the authenticator ------------------------------------------------------------------


@dataclass(frozen=True)
class Welcome:
    """Authenticated: send WELCOME with these details."""

    authid: str
    authrole: str
    authmethod: str
    authprovider: str = AUTHPROVIDER


@dataclass(frozen=True)
class Challenge:
    """Send CHALLENGE ``method`` with ``extra``, then wait for AUTHENTICATE."""

    method: str
    extra: Mapping[str, Any]


@dataclass(frozen=True)
class Deny:
    """Refused: send ABORT ``reason`` with ``message``."""

    reason: str
    message: str


class AuthState(enum.Enum):
    """Where an :class:`Authenticator` is."""

    #: Nothing received yet; HELLO comes next.
    AWAIT_HELLO = "await_hello"
    #: CHALLENGE sent; AUTHENTICATE must answer it.
    AWAIT_AUTHENTICATE = "await_authenticate"
    #: A Welcome or Deny was given; the authenticator is spent.
    DONE = "done"


@dataclass(frozen=True)
class _Pending:
    """What the AUTHENTICATE after a CHALLENGE is checked against."""

    principal: Principal
    #: The exact challenge sent: the WAMP-CRA string, or the cryptosign bytes.
    challenge: bytes


class Authenticator:
    """The router side of one session's HELLO / CHALLENGE / AUTHENTICATE exchange.

    Methods are tried in the order the client lists them (WAMP's rule); the
    first one the policy can serve wins. ``random_bytes`` makes challenges
    (fresh for every session), ``clock`` stamps WAMP-CRA challenges.
    """

    def __init__(
        self,
        policy: AuthPolicy,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._policy = policy
        self._random_bytes = random_bytes
        self._clock = clock
        self.state = AuthState.AWAIT_HELLO
        self._pending: _Pending | None = None

    def hello(
        self,
        authmethods: Sequence[Any] | None,
        authid: Any = None,
        authextra: Mapping[str, Any] | None = None,
        session_id: int = 0,
    ) -> Welcome | Challenge | Deny:
        """Answer a HELLO offering ``authmethods`` (None: anonymous only) for ``authid``."""
        if self.state is not AuthState.AWAIT_HELLO:
            raise AuthStateError(f"hello() called in state {self.state.name}")
        self.state = AuthState.DONE
        methods = [m for m in dict.fromkeys(authmethods or [ANONYMOUS]) if isinstance(m, str)]
        extra = authextra if isinstance(authextra, Mapping) else {}
        claimed = authid if isinstance(authid, str) and authid else None
        policy = self._policy
        unknown_principal = False
        for method in methods:
            if method == ANONYMOUS:
                if policy.anonymous is not None:
                    return Welcome(ANONYMOUS, policy.anonymous, ANONYMOUS)
                continue
            if method not in _CREDENTIAL_KEYS:
                continue
            principal = self._find(method, claimed, extra)
            if principal is None:
                unknown_principal = True
                continue
            if principal.credential.method != method:
                continue
            if method == "cryptosign" and extra.get("channel_binding") is not None:
                return Deny(NOT_AUTHORIZED, "cryptosign channel binding is not supported by this router")
            return self._challenge(principal, session_id)
        return Deny(NOT_AUTHORIZED, self._why_not(methods, claimed, unknown_principal))

    def _find(self, method: str, authid: str | None, extra: Mapping[str, Any]) -> Principal | None:
        if authid is not None:
            return self._policy.principal(authid)
        pubkey = extra.get("pubkey")
        if method == "cryptosign" and isinstance(pubkey, str):
            return self._policy.principal_by_key(pubkey)
        return None

    def _why_not(self, methods: list[str], authid: str | None, unknown_principal: bool) -> str:
        if unknown_principal:
            if authid is None:
                return "no principal matches the credentials offered (ticket and wampcra need an authid)"
            return f"no principal {authid!r} here"
        if methods == [ANONYMOUS]:
            return "anonymous sessions are refused here: authenticate with ticket, wampcra or cryptosign"
        offered = ", ".join(methods) or "none"
        who = "" if authid is None else f" for {authid!r}"
        return f"no acceptable authmethod{who} among those offered ({offered})"

    def _challenge(self, principal: Principal, session_id: int) -> Challenge:
        self.state = AuthState.AWAIT_AUTHENTICATE
        credential = principal.credential
        if isinstance(credential, Ticket):
            self._pending = _Pending(principal, b"")
            return Challenge("ticket", {})
        if isinstance(credential, WampCra):
            stamp = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC)
            text = json.dumps(
                {
                    "authid": principal.authid,
                    "authrole": principal.role,
                    "authmethod": "wampcra",
                    "authprovider": AUTHPROVIDER,
                    "nonce": binascii.b2a_hex(self._random_bytes(WAMPCRA_NONCE_BYTES)).decode("ascii"),
                    "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                    "session": session_id,
                },
                sort_keys=True,
            )
            self._pending = _Pending(principal, text.encode("utf-8"))
            extra: dict[str, Any] = {"challenge": text}
            if credential.salt is not None:
                extra.update(salt=credential.salt, iterations=credential.iterations, keylen=credential.keylen)
            return Challenge("wampcra", extra)
        challenge = self._random_bytes(CRYPTOSIGN_CHALLENGE_BYTES)
        self._pending = _Pending(principal, challenge)
        return Challenge(
            "cryptosign", {"challenge": binascii.b2a_hex(challenge).decode("ascii"), "channel_binding": None}
        )

    def authenticate(self, signature: Any, extra: Mapping[str, Any] | None = None) -> Welcome | Deny:
        """Answer the AUTHENTICATE that followed our CHALLENGE."""
        pending = self._pending
        if self.state is not AuthState.AWAIT_AUTHENTICATE or pending is None:
            raise AuthStateError(f"authenticate() called in state {self.state.name}")
        self.state = AuthState.DONE
        self._pending = None
        principal = pending.principal
        credential = principal.credential
        ok = isinstance(signature, str) and _verify(credential, pending.challenge, signature)
        if not ok:
            return Deny(AUTHENTICATION_FAILED, f"{credential.method} authentication failed for {principal.authid!r}")
        return Welcome(principal.authid, principal.role, credential.method)


def _verify(credential: Credential, challenge: bytes, signature: str) -> bool:
    """True if ``signature`` answers ``challenge`` for ``credential``."""
    if isinstance(credential, Ticket):
        return hmac.compare_digest(signature.encode("utf-8"), credential.ticket.encode("utf-8"))
    if isinstance(credential, WampCra):
        expected = compute_wcs(credential.secret.encode("utf-8"), challenge)
        return hmac.compare_digest(signature.encode("utf-8"), expected)
    return _verify_cryptosign(credential.public_key, challenge, signature)


def _verify_cryptosign(public_key: str, challenge: bytes, signature: str) -> bool:
    """The spec's check: a 64-byte Ed25519 signature (+ the 32 challenge bytes) in hex."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    try:
        signed = binascii.a2b_hex(signature)
    except (binascii.Error, ValueError):
        return False
    if len(signed) == 64:
        # Only the signature was sent; the message is our challenge.
        signed += challenge
    if len(signed) != 96:
        return False
    try:
        message = VerifyKey(binascii.a2b_hex(public_key)).verify(signed)
    except BadSignatureError:
        return False
    return hmac.compare_digest(message, challenge)
