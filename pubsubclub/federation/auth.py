"""Link authentication: a challenge-response proof of the cluster secret, sans-IO.

Three messages, on the WebSocket handshake and the link's first frame
(docs/protocol.md, "Link authentication"):

1. The dialler's request carries ``X-PubSubClub-Auth: v2:<dialler-nonce>``.
2. The listener answers (HTTP 101) ``X-PubSubClub-Auth: v2:<listener-nonce>:<answer-mac>``:
   an HMAC over its own node id, the dialler's node id and both nonces. The
   dialler checks it before it proves anything, so an address that does not
   hold the secret (a stale peer, a spoofed Consul entry) harvests no proof.
3. The dialler's first WebSocket frame is ``PSC-AUTH v2:<proof-mac>``: an
   HMAC over its node id, the listener's node id and both nonces. The
   listener reads no PSC message before this frame checks out.

A proof names the node it is for and the listener's fresh nonce, so it opens
one connection to one node, once: replaying it to another node, to the same
node later, or after a restart fails, with no replay cache and no clock.
The secret never crosses the wire. This module does no I/O and imports no
Twisted: randomness is injected.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: HTTP header carrying the nonces and the answer, in the request and in the response.
AUTH_HEADER = "x-pubsubclub-auth"
#: What the dialler's proof frame starts with; the MAC follows.
PROOF_PREFIX = b"PSC-AUTH v2:"
#: Longest ``X-PubSubClub-Auth`` value read; longer is malformed.
MAX_HEADER_LENGTH = 256
#: Shortest cluster secret accepted, in bytes: shorter ones fall to offline guessing
#: from one overheard exchange.
MIN_SECRET_LENGTH = 16
#: Random bytes in a nonce (sent as hex).
NONCE_BYTES = 16
#: Connections answered but not yet proven, at most; past it new ones get HTTP 503.
DEFAULT_MAX_PENDING = 256
#: Seconds the listener waits for the proof frame before closing the connection.
DEFAULT_PROOF_TIMEOUT = 10.0

_VERSION = "v2"
_REQUEST_LABEL = b"pubsubclub link-auth v2 proof"
_ANSWER_LABEL = b"pubsubclub link-auth v2 answer"
_OFFER_RE = re.compile(r"v2:([0-9a-f]{32})")
_ANSWER_RE = re.compile(r"v2:([0-9a-f]{32}):([0-9a-f]{64})")
_PROOF_RE = re.compile(rb"PSC-AUTH v2:([0-9a-f]{64})")


class Refusal(enum.Enum):
    """Why a proof was refused; the value is the reason given to the peer and the log."""

    #: No ``X-PubSubClub-Auth`` header at all (HTTP 401).
    MISSING = "no cluster secret proof"
    #: Not in the form of its step.
    MALFORMED = "malformed cluster secret proof"
    #: A ``v1:`` proof from a node that predates challenge-response (HTTP 403).
    OLD_VERSION = "link proof v1 is no longer accepted; upgrade the dialling node"
    #: The MAC does not match: another secret, or a proof made for another node or connection.
    BAD_MAC = "wrong cluster secret proof"
    #: No proof frame came within the timeout.
    TIMEOUT = "no cluster secret proof in time"
    #: Too many connections are waiting to prove the secret; refuse rather than hold more.
    BUSY = "too many link attempts; try again later"

    @property
    def http_status(self) -> int:
        """401 when no proof came, 503 when busy, else 403."""
        if self is Refusal.MISSING:
            return 401
        if self is Refusal.BUSY:
            return 503
        return 403


class AuthRefused(Exception):
    """A step was refused; ``refusal`` says why."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal


@dataclass(frozen=True)
class Offer:
    """The dialler's side of one connection attempt: its node id and fresh nonce."""

    node_id: str
    nonce: str

    def header(self) -> str:
        """The request's ``X-PubSubClub-Auth`` value."""
        return f"{_VERSION}:{self.nonce}"


@dataclass(frozen=True, eq=False)
class Challenge:
    """The listener's side of one connection: who claims to dial, both nonces, the answer sent."""

    dialler_id: str
    listener_id: str
    dialler_nonce: str
    listener_nonce: str
    answer_mac: str = field(repr=False)

    def header(self) -> str:
        """The response's ``X-PubSubClub-Auth`` value."""
        return f"{_VERSION}:{self.listener_nonce}:{self.answer_mac}"


def _fields(*fields: str) -> bytes:
    # Newline-separated: a header value cannot hold a newline, and each side
    # checks its own fields, so the encoding is unambiguous.
    for value in fields:
        if "\n" in value or "\r" in value:
            raise ValueError(f"a line break in an authenticated field: {value!r}")
    return "\n".join(fields).encode()


def _mac(secret: bytes, label: bytes, message: bytes) -> str:
    return hmac.new(secret, label + b"\n" + message, hashlib.sha256).hexdigest()


def answer_mac(secret: bytes, listener_id: str, dialler_id: str, dialler_nonce: str, listener_nonce: str) -> str:
    """The MAC with which a listener proves the secret to a dialler."""
    return _mac(secret, _ANSWER_LABEL, _fields(listener_id, dialler_id, dialler_nonce, listener_nonce))


def proof_mac(secret: bytes, dialler_id: str, listener_id: str, dialler_nonce: str, listener_nonce: str) -> str:
    """The MAC with which a dialler proves the secret to the listener ``listener_id``."""
    return _mac(secret, _REQUEST_LABEL, _fields(dialler_id, listener_id, dialler_nonce, listener_nonce))


class LinkAuth:
    """Makes and checks proofs of one cluster secret; one per node (it counts pending challenges)."""

    def __init__(
        self,
        secret: bytes,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        max_pending: int = DEFAULT_MAX_PENDING,
        proof_timeout: float = DEFAULT_PROOF_TIMEOUT,
    ) -> None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"the cluster secret must be at least {MIN_SECRET_LENGTH} bytes")
        self._secret = secret
        self._random_bytes = random_bytes
        self.max_pending = max_pending
        #: Seconds a listener waits for the proof frame (the transport runs the timer).
        self.proof_timeout = proof_timeout
        self._pending: set[Challenge] = set()

    # -- dialling side -------------------------------------------------------

    def offer(self, node_id: str) -> Offer:
        """A fresh nonce for one connection attempt."""
        _fields(node_id)
        return Offer(node_id, self._random_bytes(NONCE_BYTES).hex())

    def prove(self, offer: Offer, header: str | None, listener_id: str) -> bytes:
        """Check the listener's answer to ``offer``; return the proof frame to send first.

        Raises :class:`AuthRefused` when the listener did not prove the
        secret: then nothing may be sent to it, the proof least of all.
        """
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        match = _ANSWER_RE.fullmatch(header.strip())
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        listener_nonce, mac = match.group(1), match.group(2)
        try:
            expected = answer_mac(self._secret, listener_id, offer.node_id, offer.nonce, listener_nonce)
        except ValueError:
            raise AuthRefused(Refusal.MALFORMED) from None
        if not hmac.compare_digest(mac, expected):
            raise AuthRefused(Refusal.BAD_MAC)
        return PROOF_PREFIX + proof_mac(self._secret, offer.node_id, listener_id, offer.nonce, listener_nonce).encode()

    # -- listening side ------------------------------------------------------

    def challenge(self, header: str | None, dialler_id: str, listener_id: str) -> Challenge:
        """Answer a dialler's offer; raise :class:`AuthRefused` (refuse at the handshake) when unusable.

        The challenge stays pending until :meth:`check_proof` or
        :meth:`settle`; at most ``max_pending`` are held.
        """
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        if len(header) > MAX_HEADER_LENGTH:
            raise AuthRefused(Refusal.MALFORMED)
        value = header.strip()
        if value.startswith("v1:"):
            raise AuthRefused(Refusal.OLD_VERSION)
        match = _OFFER_RE.fullmatch(value)
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        if len(self._pending) >= self.max_pending:
            raise AuthRefused(Refusal.BUSY)
        listener_nonce = self._random_bytes(NONCE_BYTES).hex()
        try:
            mac = answer_mac(self._secret, listener_id, dialler_id, match.group(1), listener_nonce)
        except ValueError:
            raise AuthRefused(Refusal.MALFORMED) from None
        challenge = Challenge(dialler_id, listener_id, match.group(1), listener_nonce, mac)
        self._pending.add(challenge)
        return challenge

    def check_proof(self, challenge: Challenge, frame: bytes) -> None:
        """Accept the dialler's first frame as its proof, or raise :class:`AuthRefused`; settles ``challenge``."""
        self.settle(challenge)
        match = _PROOF_RE.fullmatch(frame)
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        expected = proof_mac(
            self._secret, challenge.dialler_id, challenge.listener_id, challenge.dialler_nonce, challenge.listener_nonce
        )
        if not hmac.compare_digest(match.group(1).decode(), expected):
            raise AuthRefused(Refusal.BAD_MAC)

    def settle(self, challenge: Challenge) -> None:
        """Stop counting ``challenge`` as pending (proven, refused or gone); idempotent."""
        self._pending.discard(challenge)

    def pending(self) -> int:
        """How many answered connections have not yet proven the secret."""
        return len(self._pending)
