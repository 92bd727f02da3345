"""Names of every counter a node keeps: one dependency-free module for the node, /stats, /metrics and the report.

:class:`pubsubclub.core.metrics.Metrics` is the only place counts live. Message
counters are keyed by (topic, :class:`Source`, :class:`Kind`, peer,
:class:`DropReason`) and written to the dumps; event counters by one of the
component enums below (``hub``, ``federation``, ``tep``, ``nsd``, ``replay``,
``bridge``, ``sysv``). Call sites pass these enums, never strings: ``Metrics``'
parameters are typed with them (mypy refuses a ``str``) and
tests/test_metrics_vocabulary.py refuses a string literal where one belongs. ``/stats`` shows each
component's events as a dict (:meth:`Metrics.view`), ``/metrics`` as
``pubsubclub_events_total{component, event}``, so the two cannot disagree.
The report's schema (pubsubclub/reports/schema.py) takes its record types
and counter kinds from here. Values are the strings on the wire and in
/stats; renaming one is a schema change.
"""

from __future__ import annotations

import enum


class RecordType(enum.StrEnum):
    """Record types of the metrics dumps, schema version 1."""

    COUNTER = "counter"
    LATENCY = "latency"
    GAUGE = "gauge"
    LINK = "link"


class Kind(enum.StrEnum):
    """What happened to the messages a counter counts."""

    #: A client of this node published it.
    PUBLISHED = "published"
    #: Sent to a local subscriber.
    DELIVERED = "delivered"
    #: Sent to another node over a link.
    FORWARDED = "forwarded"
    #: Came in from another node over a link.
    RECEIVED = "received"
    #: Not delivered; ``reason`` says why.
    DROPPED = "dropped"


class Source(enum.StrEnum):
    """The front-end (or the links) a message counter belongs to."""

    WAMP = "wamp"
    PSC = "psc"
    NSD = "nsd"
    TEP = "tep"
    STREAM = "stream"
    SYSV = "sysv"
    #: A bridge's WAMP router (``pubsubclub bridge``).
    BRIDGE = "bridge"


class DropReason(enum.StrEnum):
    """Why a ``dropped`` message counter's messages were not delivered (its ``reason``)."""

    #: A PSC301 beyond the JSON bounds (from a peer node).
    BOUNDS = "bounds"
    #: A payload that is not JSON (MessagePack bytes) for a JSON-only recipient.
    NOT_JSON = "not_json"
    #: A publish bigger than some link accepts: refused before it was acknowledged.
    TOO_LARGE_FOR_LINKS = "too_large_for_links"
    #: The recipient did not read fast enough.
    SLOW_CONSUMER = "slow_consumer"
    #: SysV: the queue was full, or gone.
    QUEUE_FULL = "queue_full"
    QUEUE_GONE = "queue_gone"
    #: A bridge with no router session.
    NO_ROUTER = "no_router"
    #: Stream: the log's disk cap, or an I/O error.
    DISK_FULL = "disk_full"
    LOG_ERROR = "log_error"
    #: Stream: a publish before Connect, a bad checksum, any other rejected frame.
    NOT_CONNECTED = "not_connected"
    CHECKSUM = "checksum"
    REJECTED = "rejected"
    #: The client's role may not publish there.
    NOT_AUTHORIZED = "not_authorized"
    #: Stream: over the links' limit; past the node's topic cap.
    TOO_LARGE = "too_large"
    TOPIC_LIMIT = "topic_limit"


class LinkCount(enum.StrEnum):
    """Per-link replay counters (PSC 0.3): the kinds of ``Metrics.link_count``."""

    GAPS = "gaps"
    LOST = "lost"
    REPLAYED = "replayed"
    DUPLICATES = "duplicates"


class HubEvent(enum.StrEnum):
    """The hub's own counts."""

    PUBLISHED = "published"
    DELIVERED = "delivered"
    RECEIVED = "received"
    SINK_ERRORS = "sink_errors"


class FederationEvent(enum.StrEnum):
    """Links and what crossed them."""

    FORWARDED = "forwarded"
    RECEIVED = "received"
    LINKS_OPENED = "links_opened"
    LINKS_REFUSED = "links_refused"
    DROPPED_NOT_JSON = "dropped_not_json"
    #: A message over what a peer's link accepts (an older node with a smaller limit): not sent to it.
    DROPPED_TOO_LARGE = "dropped_too_large"
    AUTH_REFUSED = "auth_refused"
    GAPS = "gaps"
    GAP_MESSAGES = "gap_messages"
    DUPLICATES_DROPPED = "duplicates_dropped"
    DROPPED_BOUNDS = "dropped_bounds"
    HANDLER_ERRORS = "handler_errors"


class ReplayEvent(enum.StrEnum):
    """The PSC 0.3 replay buffers."""

    REPLAYED = "replayed"
    TRIMMED = "trimmed"
    STREAMS_EXPIRED = "streams_expired"
    STREAMS_SUPERSEDED = "streams_superseded"
    DUPLICATES = "duplicates"


class TEPEvent(enum.StrEnum):
    """The TEP front-end."""

    FRAMES_RECEIVED = "frames_received"
    BAD_FRAMES = "bad_frames"
    PUBLISHED = "published"
    EVENTS_SENT = "events_sent"
    BROADCASTS_SENT = "broadcasts_sent"
    UNDELIVERABLE = "undeliverable"
    DROPPED_SLOW = "dropped_slow"
    REFUSED_CLIENTS = "refused_clients"
    NOT_AUTHORIZED = "not_authorized"


class NSDEvent(enum.StrEnum):
    """The NSD front-end and its store."""

    REQUESTS = "requests"
    ERRORS = "errors"
    TRANSFERS_SENT = "transfers_sent"
    TRANSFERS_APPLIED = "transfers_applied"
    NOT_AUTHORIZED = "not_authorized"
    FOREIGN_STORED = "foreign_stored"
    REJECTED = "rejected"
    REPAIRED = "repaired"


class BridgeEvent(enum.StrEnum):
    """``pubsubclub bridge``: its router session and what crossed it (docs/bridge.md)."""

    JOINS = "joins"
    WRONG_ROLE = "wrong_role"
    ACTIVATIONS = "activations"
    DEACTIVATIONS = "deactivations"
    FROM_ROUTER = "from_router"
    INTO_ROUTER = "into_router"
    DROPPED_NO_ROUTER = "dropped_no_router"
    PUBLISH_ERRORS = "publish_errors"
    LOOPS_DROPPED = "loops_dropped"
    #: RPC through the bridge (docs/bridge.md, "RPC"): calls each way, refusals past ``[bridge] max-calls``,
    #: router registrations the cluster or the router refused to take.
    CALLS_FROM_ROUTER = "calls_from_router"
    CALLS_INTO_ROUTER = "calls_into_router"
    CALLS_REFUSED = "calls_refused"
    REGISTRATIONS_REFUSED = "registrations_refused"


class SysVEvent(enum.StrEnum):
    """The SysV front-end (its /stats counters, as ``pubsubclub_events_total{component="sysv"}`` too)."""

    REQUESTS = "requests"
    BAD_REQUESTS = "bad_requests"
    REPLIES = "replies"
    DELIVERIES = "deliveries"
    DROPPED = "dropped"
    CLIENTS_GONE = "clients_gone"
    STRAYS_REMOVED = "strays_removed"


#: Component name -> its event enum (the ``component`` label, and the /stats key).
COMPONENTS: dict[str, type[enum.StrEnum]] = {
    "hub": HubEvent,
    "federation": FederationEvent,
    "replay": ReplayEvent,
    "tep": TEPEvent,
    "nsd": NSDEvent,
    "bridge": BridgeEvent,
    "sysv": SysVEvent,
}

#: Enum class -> component name.
COMPONENT_OF: dict[type[enum.StrEnum], str] = {cls: name for name, cls in COMPONENTS.items()}

#: Every event counter, as (component, event) pairs.
AnyEvent = HubEvent | FederationEvent | ReplayEvent | TEPEvent | NSDEvent | BridgeEvent | SysVEvent
