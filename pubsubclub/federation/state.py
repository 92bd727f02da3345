"""The state the federation's parts share (federation.py builds it; each part declares nothing again).

:class:`~pubsubclub.federation.federation.Federation` inherits its parts
(``Dialling``, ``Interest``, ``Forwarding``, ``Receiving``); each part reads
and writes the attributes declared here, which ``Federation.__init__`` sets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twisted.internet.interfaces import IStreamClientEndpoint

    from pubsubclub.core.hub import Hub
    from pubsubclub.core.patterns import Pattern
    from pubsubclub.federation import psc
    from pubsubclub.federation.replay import Inbox, Outbox
    from pubsubclub.federation.retry import RetryPolicy
    from pubsubclub.federation.servers import Link, _Server
    from pubsubclub.federation.session import LinkSession


class FederationState:
    """The attributes of one federation, declared once for all its parts (set by ``Federation.__init__``)."""

    hub: Hub
    node_id: str
    limits: psc.Limits
    advertise_url: str | None
    announce_url: str | None
    learn_peers: bool
    outbox: Outbox | None
    inbox: Inbox | None
    _reactor: Any
    _ping_interval: float
    _retry: RetryPolicy
    _rand: Callable[[], float]
    _endpoint_factory: Callable[[Any, str], IStreamClientEndpoint]
    _servers: dict[str, _Server]
    _links: dict[LinkSession, Link]
    _producers: dict[LinkSession, None]
    _by_topic: dict[str, dict[LinkSession, None]]
    _remote_topics_listeners: list[Callable[[], None]]
    _announced: dict[Pattern, None]
    _held: dict[Pattern, None]
    _forwarded: dict[tuple[str, Any], list[int]]
    _forwarded_n: int
    #: The primary worker's workers' node id prefix (federation/relay.py); None: no relaying.
    worker_prefix: str | None
    #: Dial the URLs peers tell in their handshakes (off in a node's workers other than the primary).
    learn_from_peers: bool
    #: Ask producers for gap reports too (a node's workers other than the primary: the primary's, relay.py).
    asks_gaps: bool
    #: Server URLs never told to peers (the primary's workers).
    unlisted: set[str]
    #: Relay: what each producer was last asked for.
    _relay_sent: dict[LinkSession, set[str]]
    #: Relay: the topics whose consumers changed, when only those did (else None: look at everything).
    _relay_hint: tuple[str, ...] | None
    #: Relay: which patterns each 0.5 producer was last asked for.
    _relay_sent_patterns: dict[LinkSession, set[Pattern]]
