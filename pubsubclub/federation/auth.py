"""Link authentication: proving the cluster secret at the WebSocket handshake, sans-IO.

The dialling node sends ``X-PubSubClub-Auth: v1:<unix-time>:<nonce>:<mac>``
where ``mac`` is HMAC-SHA256, keyed with the cluster secret, over the
dialler's node id, the time, the nonce, and the ``Host`` and path of the
request. The listener recomputes it, accepts the time within a window, and
refuses a nonce it has already seen inside that window. It answers with
``X-PubSubClub-Auth: v1:<mac>``, an HMAC over its own node id and the
dialler's proof, so the dialler knows the listener holds the secret too
(otherwise anyone answering on the dialled address could feed it publishes).

The secret never crosses the wire. This module does no I/O and imports no
Twisted: time and randomness are injected. See docs/protocol.md, "Link
authentication".
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

#: HTTP header carrying the proofs, in the request and in the answer.
AUTH_HEADER = "x-pubsubclub-auth"
#: Proofs whose time is further than this from the listener's clock (seconds) are refused.
DEFAULT_WINDOW = 60.0
#: Nonces remembered at most (each for one window); past it, new proofs are refused.
DEFAULT_MAX_NONCES = 10_000
#: Longest ``X-PubSubClub-Auth`` value read; longer is malformed.
MAX_HEADER_LENGTH = 256
#: Shortest cluster secret accepted, in bytes: shorter ones fall to offline guessing
#: from one overheard proof.
MIN_SECRET_LENGTH = 16
#: Random bytes in a nonce (sent as hex).
NONCE_BYTES = 16

_VERSION = "v1"
_REQUEST_LABEL = b"pubsubclub link-auth v1 request"
_ANSWER_LABEL = b"pubsubclub link-auth v1 answer"
_REQUEST_RE = re.compile(r"v1:(\d{1,12}):([0-9a-f]{32}):([0-9a-f]{64})")
_ANSWER_RE = re.compile(r"v1:([0-9a-f]{64})")


class Refusal(enum.Enum):
    """Why a proof was refused; the value is the reason given to the peer and the log."""

    #: No proof at all (HTTP 401).
    MISSING = "no cluster secret proof"
    #: Not ``v1:<time>:<nonce>:<mac>`` (or not ``v1:<mac>`` in an answer).
    MALFORMED = "malformed cluster secret proof"
    #: The MAC does not match: another secret, or a changed node id, host or path.
    BAD_MAC = "wrong cluster secret proof"
    #: The proof's time is more than the window behind the listener's clock.
    EXPIRED = "cluster secret proof expired (check clocks)"
    #: The proof's time is more than the window ahead of the listener's clock.
    FUTURE = "cluster secret proof from the future (check clocks)"
    #: This nonce was already used inside the window.
    REPLAYED = "cluster secret proof replayed"
    #: The replay cache is full of live nonces; refuse rather than forget one.
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
    """A proof was refused; ``refusal`` says why."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal


@dataclass(frozen=True)
class Proof:
    """One dialler's proof, as sent or as accepted."""

    node_id: str
    timestamp: int
    nonce: str
    mac: str

    def header(self) -> str:
        """The ``X-PubSubClub-Auth`` value."""
        return f"{_VERSION}:{self.timestamp}:{self.nonce}:{self.mac}"


def _fields(*fields: str) -> bytes:
    # Newline-separated: a header value cannot hold a newline, and the dialler
    # checks its own fields, so the encoding is unambiguous.
    for field in fields:
        if "\n" in field or "\r" in field:
            raise ValueError(f"a line break in an authenticated field: {field!r}")
    return "\n".join(fields).encode()


def _mac(secret: bytes, label: bytes, message: bytes) -> str:
    return hmac.new(secret, label + b"\n" + message, hashlib.sha256).hexdigest()


def request_mac(secret: bytes, node_id: str, timestamp: int, nonce: str, host: str, path: str) -> str:
    """The MAC of a dialler's proof."""
    return _mac(secret, _REQUEST_LABEL, _fields(node_id, str(timestamp), nonce, host.lower(), path))


def answer_mac(secret: bytes, listener_id: str, proof: Proof) -> str:
    """The MAC of a listener's answer to ``proof``."""
    return _mac(secret, _ANSWER_LABEL, _fields(listener_id, proof.header()))


class LinkAuth:
    """Makes and checks proofs of one cluster secret; one per node (it holds the replay cache)."""

    def __init__(
        self,
        secret: bytes,
        *,
        clock: Callable[[], float] = time.time,
        random_bytes: Callable[[int], bytes] = os.urandom,
        window: float = DEFAULT_WINDOW,
        max_nonces: int = DEFAULT_MAX_NONCES,
    ) -> None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"the cluster secret must be at least {MIN_SECRET_LENGTH} bytes")
        self._secret = secret
        self._clock = clock
        self._random_bytes = random_bytes
        self.window = window
        self._max_nonces = max_nonces
        #: nonce -> the time after which its proof expires anyway.
        self._seen: dict[str, float] = {}

    # -- dialling side -------------------------------------------------------

    def prove(self, node_id: str, host: str, path: str) -> Proof:
        """A fresh proof (new nonce, current time) for one connection attempt."""
        timestamp = int(self._clock())
        nonce = self._random_bytes(NONCE_BYTES).hex()
        return Proof(node_id, timestamp, nonce, request_mac(self._secret, node_id, timestamp, nonce, host, path))

    def check_answer(self, header: str | None, listener_id: str, proof: Proof) -> None:
        """Raise :class:`AuthRefused` unless ``header`` is the listener's answer to ``proof``."""
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        match = _ANSWER_RE.fullmatch(header.strip())
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        if not hmac.compare_digest(match.group(1), answer_mac(self._secret, listener_id, proof)):
            raise AuthRefused(Refusal.BAD_MAC)

    # -- listening side ------------------------------------------------------

    def check(self, header: str | None, node_id: str, host: str, path: str) -> Proof:
        """The accepted proof in ``header``; raise :class:`AuthRefused` with the reason otherwise.

        The MAC is checked before the time, so only holders of the secret
        learn that their clock is off; a nonce is remembered only once the
        MAC is good, so strangers cannot fill the replay cache.
        """
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        if len(header) > MAX_HEADER_LENGTH:
            raise AuthRefused(Refusal.MALFORMED)
        match = _REQUEST_RE.fullmatch(header.strip())
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        timestamp, nonce, mac = int(match.group(1)), match.group(2), match.group(3)
        try:
            expected = request_mac(self._secret, node_id, timestamp, nonce, host, path)
        except ValueError:
            raise AuthRefused(Refusal.MALFORMED) from None
        if not hmac.compare_digest(mac, expected):
            raise AuthRefused(Refusal.BAD_MAC)
        now = self._clock()
        if timestamp < now - self.window:
            raise AuthRefused(Refusal.EXPIRED)
        if timestamp > now + self.window:
            raise AuthRefused(Refusal.FUTURE)
        self._remember(nonce, timestamp + self.window, now)
        return Proof(node_id, timestamp, nonce, mac)

    def answer(self, listener_id: str, proof: Proof) -> str:
        """The ``X-PubSubClub-Auth`` value answering an accepted ``proof``."""
        return f"{_VERSION}:{answer_mac(self._secret, listener_id, proof)}"

    def _remember(self, nonce: str, expires: float, now: float) -> None:
        if nonce in self._seen:
            raise AuthRefused(Refusal.REPLAYED)
        if len(self._seen) >= self._max_nonces:
            self._seen = {n: t for n, t in self._seen.items() if t >= now}
            if len(self._seen) >= self._max_nonces:
                raise AuthRefused(Refusal.BUSY)
        self._seen[nonce] = expires

    def remembered(self) -> int:
        """How many nonces the replay cache holds (for tests and stats)."""
        return len(self._seen)
