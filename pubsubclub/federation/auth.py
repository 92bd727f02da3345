"""Link authentication: a challenge-response proof of the cluster secret, sans-IO.

Three messages, on the WebSocket handshake and the link's first frame
(docs/protocol.md, "Link authentication"):

1. The dialler's request carries ``X-PubSubClub-Auth: v3:<dialler-nonce>``
   and the URL it dialled (``X-PubSubClub-Dialled``).
2. The listener answers (HTTP 101)
   ``X-PubSubClub-Auth: v3:<listener-nonce>:<route>:<answer-mac>``: ``route``
   says whether the dialled URL is the one the listener advertises
   (``direct``) or not (``indirect``: an alias, a load balancer, or a relay),
   and the HMAC covers both node ids, both nonces, the dialled URL and the
   route. The dialler checks it before it proves anything, so an address
   that does not hold the secret (a stale peer, a spoofed Consul entry)
   harvests no proof.
3. The dialler's first WebSocket frame is ``PSC-AUTH v3:<proof-mac>``: an
   HMAC over the same fields. The listener reads no PSC message before this
   frame checks out.

A proof names the node it is for and the listener's fresh nonce, so it opens
one connection to one node, once: replaying it to another node, to the same
node later, or after a restart fails, with no replay cache and no clock.
After the proof every frame is sealed with keys derived from the secret and
the same fields (:mod:`pubsubclub.federation.seal`). The secret never
crosses the wire.

A listener holds at most ``max_pending`` answered-but-unproven connections,
and at most ``max_pending_per_source`` from one address; a new one past
either bound evicts the oldest of its own address, else the oldest of the
address holding the most, so connections that never prove cost their sender
slots, not the cluster its links.

This module does no I/O and imports no Twisted: randomness is injected, and
an evicted connection is closed by the callback its transport registered.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from pubsubclub.federation.seal import LinkSeal, derive_keys

#: HTTP header carrying the nonces and the answer, in the request and in the response.
AUTH_HEADER = "x-pubsubclub-auth"
#: HTTP request header carrying the URL the dialler dialled (a field of both MACs and of the keys).
DIALLED_HEADER = "x-pubsubclub-dialled"
#: What the dialler's proof frame starts with; the MAC follows.
PROOF_PREFIX = b"PSC-AUTH v3:"
#: Longest dialled URL accepted; longer is malformed.
MAX_URL_LENGTH = 512
#: Longest ``X-PubSubClub-Auth`` value read; longer is malformed.
MAX_HEADER_LENGTH = 256
#: Shortest cluster secret accepted, in bytes: shorter ones fall to offline guessing
#: from one overheard exchange.
MIN_SECRET_LENGTH = 16
#: Random bytes in a nonce (sent as hex).
NONCE_BYTES = 16
#: Connections answered but not yet proven, at most; past it a new one evicts the oldest of the biggest holder.
DEFAULT_MAX_PENDING = 256
#: Of those, at most this many from one source address; past it a new one evicts that address's oldest.
DEFAULT_MAX_PENDING_PER_SOURCE = 16
#: Seconds the listener waits for the proof frame before closing the connection.
DEFAULT_PROOF_TIMEOUT = 5.0
#: ``route`` values: the dialled URL is the listener's advertised one, or it is not.
DIRECT, INDIRECT = "direct", "indirect"

_VERSION = "v3"
_REQUEST_LABEL = b"pubsubclub link-auth v3 proof"
_ANSWER_LABEL = b"pubsubclub link-auth v3 answer"
_OFFER_RE = re.compile(r"v3:([0-9a-f]{32})")
_ANSWER_RE = re.compile(r"v3:([0-9a-f]{32}):(direct|indirect):([0-9a-f]{64})")
_PROOF_RE = re.compile(rb"PSC-AUTH v3:([0-9a-f]{64})")
_OLD_VERSIONS = {"v1:": "v1", "v2:": "v2"}


class Refusal(enum.Enum):
    """Why a proof was refused; the value is the reason given to the peer and the log."""

    #: No ``X-PubSubClub-Auth`` header at all (HTTP 401).
    MISSING = "no cluster secret proof"
    #: Not in the form of its step.
    MALFORMED = "malformed cluster secret proof"
    #: A ``v1:`` or ``v2:`` offer from a node that predates sealed links (HTTP 403).
    OLD_VERSION = "link proof v1/v2 is no longer accepted (links are sealed since v3); upgrade the dialling node"
    #: The MAC does not match: another secret, or a proof made for another node or connection.
    BAD_MAC = "wrong cluster secret proof"
    #: No proof frame came within the timeout.
    TIMEOUT = "no cluster secret proof in time"
    #: Newer connections from the same address (or the biggest holder) took its pending slot.
    EVICTED = "too many link attempts pending proof; evicted, the oldest first"
    #: The connection ended before its proof frame came.
    GONE = "ended before proving the cluster secret"

    @property
    def http_status(self) -> int:
        """401 when no proof came, else 403."""
        if self is Refusal.MISSING:
            return 401
        return 403


class AuthRefused(Exception):
    """A step was refused; ``refusal`` says why."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.value)
        self.refusal = refusal


@dataclass(frozen=True)
class Offer:
    """The dialler's side of one connection attempt: its node id, fresh nonce and the URL it dials."""

    node_id: str
    nonce: str
    url: str = ""

    def header(self) -> str:
        """The request's ``X-PubSubClub-Auth`` value (the URL goes in ``X-PubSubClub-Dialled``)."""
        return f"{_VERSION}:{self.nonce}"


@dataclass(frozen=True, eq=False)
class Exchange:
    """What both ends of one connection agreed on; both MACs and the link's keys cover all of it."""

    dialler_id: str
    listener_id: str
    dialler_nonce: str
    listener_nonce: str
    #: The URL the dialler dialled, as it said ("" when it said none).
    dialled_url: str
    #: :data:`DIRECT` when that URL is the listener's advertised one, else :data:`INDIRECT`.
    route: str

    @property
    def direct(self) -> bool:
        """Whether the dialler dialled the URL the listener advertises (not an alias or a relay)."""
        return self.route == DIRECT

    def fields(self, first: str, second: str) -> bytes:
        """The MAC input: ``first`` and ``second`` node ids, then the rest, one per line."""
        return _fields(first, second, self.dialler_nonce, self.listener_nonce, self.dialled_url, self.route)

    def seal_for(self, secret: bytes, dialler: bool) -> LinkSeal:
        """This end's :class:`LinkSeal`: HKDF over the secret, salted with both nonces (docs/protocol.md)."""
        salt = bytes.fromhex(self.dialler_nonce) + bytes.fromhex(self.listener_nonce)
        to_listener, to_dialler = derive_keys(secret, salt, self.fields(self.dialler_id, self.listener_id))
        return LinkSeal(to_listener, to_dialler) if dialler else LinkSeal(to_dialler, to_listener)


@dataclass(frozen=True, eq=False)
class Challenge(Exchange):
    """The listener's side of one connection: the exchange, the answer sent, and where it came from."""

    answer_mac: str = field(default="", repr=False)
    #: The dialler's address (host), for the per-source cap.
    source: str = ""

    def header(self) -> str:
        """The response's ``X-PubSubClub-Auth`` value."""
        return f"{_VERSION}:{self.listener_nonce}:{self.route}:{self.answer_mac}"


@dataclass(frozen=True, eq=False)
class Proven:
    """The dialler's side once the listener proved the secret: the frame to send first and the link's seal."""

    frame: bytes
    seal: LinkSeal = field(repr=False)
    #: The listener says (under its MAC) that the dialled URL is its advertised one.
    direct: bool


def _fields(*fields: str) -> bytes:
    # Newline-separated: a header value cannot hold a newline, and each side
    # checks its own fields, so the encoding is unambiguous.
    for value in fields:
        if "\n" in value or "\r" in value:
            raise ValueError(f"a line break in an authenticated field: {value!r}")
    return "\n".join(fields).encode()


def _mac(secret: bytes, label: bytes, message: bytes) -> str:
    return hmac.new(secret, label + b"\n" + message, hashlib.sha256).hexdigest()


def answer_mac(secret: bytes, exchange: Exchange) -> str:
    """The MAC with which a listener proves the secret to a dialler."""
    return _mac(secret, _ANSWER_LABEL, exchange.fields(exchange.listener_id, exchange.dialler_id))


def proof_mac(secret: bytes, exchange: Exchange) -> str:
    """The MAC with which a dialler proves the secret to the listener ``exchange.listener_id``."""
    return _mac(secret, _REQUEST_LABEL, exchange.fields(exchange.dialler_id, exchange.listener_id))


class LinkAuth:
    """Makes and checks proofs of one cluster secret; one per node (it counts pending challenges)."""

    def __init__(
        self,
        secret: bytes,
        *,
        random_bytes: Callable[[int], bytes] = os.urandom,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_pending_per_source: int = DEFAULT_MAX_PENDING_PER_SOURCE,
        proof_timeout: float = DEFAULT_PROOF_TIMEOUT,
    ) -> None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ValueError(f"the cluster secret must be at least {MIN_SECRET_LENGTH} bytes")
        if max_pending < 1 or max_pending_per_source < 1:
            raise ValueError("the pending-proof caps must be at least 1")
        self._secret = secret
        self._random_bytes = random_bytes
        self.max_pending = max_pending
        self.max_pending_per_source = max_pending_per_source
        #: Seconds a listener waits for the proof frame (the transport runs the timer).
        self.proof_timeout = proof_timeout
        #: Pending challenges, oldest first, each with what closes its connection when evicted.
        self._pending: dict[Challenge, Callable[[], None] | None] = {}
        self._by_source: dict[str, int] = {}
        #: Pending challenges evicted so far (their connections closed).
        self.evicted = 0

    # -- dialling side -------------------------------------------------------

    def offer(self, node_id: str, url: str = "") -> Offer:
        """A fresh nonce for one connection attempt to ``url``."""
        _fields(node_id, url)
        return Offer(node_id, self._random_bytes(NONCE_BYTES).hex(), url)

    def prove(self, offer: Offer, header: str | None, listener_id: str) -> Proven:
        """Check the listener's answer to ``offer``; return the proof frame to send first and the link's seal.

        Raises :class:`AuthRefused` when the listener did not prove the
        secret: then nothing may be sent to it, the proof least of all.
        """
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        match = _ANSWER_RE.fullmatch(header.strip())
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        listener_nonce, route, mac = match.group(1), match.group(2), match.group(3)
        exchange = Exchange(offer.node_id, listener_id, offer.nonce, listener_nonce, offer.url, route)
        try:
            expected = answer_mac(self._secret, exchange)
        except ValueError:
            raise AuthRefused(Refusal.MALFORMED) from None
        if not hmac.compare_digest(mac, expected):
            raise AuthRefused(Refusal.BAD_MAC)
        frame = PROOF_PREFIX + proof_mac(self._secret, exchange).encode()
        return Proven(frame, exchange.seal_for(self._secret, dialler=True), exchange.direct)

    # -- listening side ------------------------------------------------------

    def challenge(
        self,
        header: str | None,
        dialler_id: str,
        listener_id: str,
        *,
        dialled_url: str | None = None,
        own_urls: Collection[str] = (),
        source: str = "",
        on_evict: Callable[[], None] | None = None,
    ) -> Challenge:
        """Answer a dialler's offer; raise :class:`AuthRefused` (refuse at the handshake) when unusable.

        ``dialled_url`` is the URL the dialler says it dialled; the route is
        direct when it is one of ``own_urls`` (what this node advertises).
        The challenge stays pending until :meth:`check_proof` or
        :meth:`settle`. Past ``max_pending_per_source`` from ``source``, or
        ``max_pending`` in all, an older pending one is evicted first: its
        ``on_evict`` is called (the transport closes that connection).
        """
        if header is None:
            raise AuthRefused(Refusal.MISSING)
        if len(header) > MAX_HEADER_LENGTH:
            raise AuthRefused(Refusal.MALFORMED)
        value = header.strip()
        if value[:3] in _OLD_VERSIONS:
            raise AuthRefused(Refusal.OLD_VERSION)
        match = _OFFER_RE.fullmatch(value)
        url = (dialled_url or "").strip()
        if match is None or len(url) > MAX_URL_LENGTH:
            raise AuthRefused(Refusal.MALFORMED)
        route = DIRECT if url and url in own_urls else INDIRECT
        listener_nonce = self._random_bytes(NONCE_BYTES).hex()
        exchange = Exchange(dialler_id, listener_id, match.group(1), listener_nonce, url, route)
        try:
            mac = answer_mac(self._secret, exchange)
        except ValueError:
            raise AuthRefused(Refusal.MALFORMED) from None
        self._make_room(source)
        challenge = Challenge(dialler_id, listener_id, exchange.dialler_nonce, listener_nonce, url, route, mac, source)
        self._pending[challenge] = on_evict
        self._by_source[source] = self._by_source.get(source, 0) + 1
        return challenge

    def _make_room(self, source: str) -> None:
        """Evict one pending challenge if ``source``'s or the node's cap is reached."""
        if self._by_source.get(source, 0) >= self.max_pending_per_source:
            victim_source = source
        elif len(self._pending) >= self.max_pending:
            by_source = self._by_source
            victim_source = max(by_source, key=by_source.__getitem__)
        else:
            return
        victim = next(c for c in self._pending if c.source == victim_source)
        on_evict = self._pending[victim]
        self.settle(victim)
        self.evicted += 1
        if on_evict is not None:
            on_evict()

    def check_proof(self, challenge: Challenge, frame: bytes) -> LinkSeal:
        """Accept the dialler's first frame as its proof (else :class:`AuthRefused`); the link's seal.

        Settles ``challenge``.
        """
        self.settle(challenge)
        match = _PROOF_RE.fullmatch(frame)
        if match is None:
            raise AuthRefused(Refusal.MALFORMED)
        expected = proof_mac(self._secret, challenge)
        if not hmac.compare_digest(match.group(1).decode(), expected):
            raise AuthRefused(Refusal.BAD_MAC)
        return challenge.seal_for(self._secret, dialler=False)

    def settle(self, challenge: Challenge) -> None:
        """Stop counting ``challenge`` as pending (proven, refused, evicted or gone); idempotent."""
        if self._pending.pop(challenge, _ABSENT) is _ABSENT:
            return
        left = self._by_source[challenge.source] - 1
        if left:
            self._by_source[challenge.source] = left
        else:
            del self._by_source[challenge.source]

    def pending(self, source: str | None = None) -> int:
        """How many answered connections (from ``source``, or in all) have not yet proven the secret."""
        if source is None:
            return len(self._pending)
        return self._by_source.get(source, 0)


_ABSENT: Any = object()
