"""What a :class:`~pubsubclub.federation.Federation` is configured with: one frozen dataclass.

The node makes one from its ``[federation]`` section plus the node-wide limits
(``node/node.py``, ``federation_settings``); the mixin and tests pass the same
fields as keyword arguments to ``Federation(hub, **fields)``. Collaborators
(the reactor, the retry policy, randomness, how a URL is dialled) are not
settings and stay constructor arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from pubsubclub.federation import psc
from pubsubclub.federation.auth import DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_PER_SOURCE, DEFAULT_PROOF_TIMEOUT
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.federation.session import Role

#: Bytes a link may have written but not yet sent to its peer; past it the link is dropped.
DEFAULT_MAX_LINK_QUEUE = 16 * 1024 * 1024


@dataclass(frozen=True)
class FederationSettings:
    """A federation's settings (docs/configuration.md, ``[federation]``)."""

    #: Which role listens, cluster-wide.
    listen_role: Role = Role.PRODUCER
    #: Seconds between WebSocket pings on a link (no pong before the next: the link is dead).
    ping_interval: float = 5.0
    #: PSC versions offered (the replay, batch and pattern extensions add theirs).
    versions: tuple[psc.Version, ...] = psc.SUPPORTED_VERSIONS
    #: Frame, JSON and pattern bounds of the links.
    limits: psc.Limits = psc.DEFAULT_LIMITS
    #: The PSC URL other nodes use for this node (None: the listener's, set when it is up).
    advertise_url: str | None = None
    #: The cluster secret links prove and are sealed with; None: links are not authenticated.
    secret: bytes | None = None
    #: With a secret: seconds a dialler has to send its proof.
    proof_timeout: float = DEFAULT_PROOF_TIMEOUT
    #: With a secret: links answered but not yet proven, at most ...
    max_pending_proofs: int = DEFAULT_MAX_PENDING
    #: ... and of those, from one source address.
    max_pending_proofs_per_source: int = DEFAULT_MAX_PENDING_PER_SOURCE
    #: PSC 0.3 replay after short outages; None: not offered.
    replay: ReplaySettings | None = None
    #: A link with more queued for its peer is dropped.
    max_link_queue: int = DEFAULT_MAX_LINK_QUEUE
    #: Tell peers whom we know and dial whom they know.
    learn_peers: bool = True
    #: Offer PSC 0.4 batching (with replay).
    batch: bool = True
    #: Offer PSC 0.5 patterns (with batching and replay).
    patterns: bool = True
    #: The node's plain WAMP realm, told and checked in every link's handshake (federation/realmcheck.py);
    #: None: neither (the mixin, a node without WAMP realms to keep apart).
    plain_realm: str | None = None
