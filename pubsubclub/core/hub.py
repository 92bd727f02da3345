"""The node core: which local sink wants which topic.

The hub knows nothing about front-ends or federation. Front-ends register
sinks; the federation registers an :class:`InterestListener` (to hear about a
topic's first and last local subscriber) and a :class:`PublishListener` (to
forward local publishes to other nodes).

Besides exact topics a sink may hold patterns (:mod:`pubsubclub.core.patterns`:
WAMP prefix and wildcard matching over hub topics); it is then a
:class:`PatternSink`, handed each matching message once per matching
pattern, and a :class:`PatternInterestListener` (the federation) hears about
each pattern's first and last holder. Only the WAMP broker subscribes by
pattern today; the other front-ends are exact-only.

Faults are isolated: a sink or listener that raises is logged and counted
(``Metrics.sink_errors``, ``pubsubclub_sink_errors_total``) and the others
still get the message; nothing it raises reaches the publisher's front-end
or the PSC link the message came from.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import field
from typing import Any, Protocol

from twisted.logger import Logger

from pubsubclub.core.compaction import Compaction
from pubsubclub.core.counters import HubEvent, Kind, Source
from pubsubclub.core.hotmessage import hot_message
from pubsubclub.core.metrics import Metrics, payload_size
from pubsubclub.core.patterns import Pattern, PatternIndex

#: Reserved hub topic on which the federation tells local subscribers that
#: messages from another node were lost (PSC 0.3 gap reports, docs/protocol.md).
GAP_TOPIC = "$cluster.gap"
#: Topics with local subscribers a node holds at most (a client's subscribe to one more is refused).
#: As many as one PSC103/PSC201 may carry (``psc.Limits.max_topics_per_subscribe``), so the node's
#: whole interest always fits the links.
DEFAULT_MAX_TOPICS = 100_000
#: Patterns with local holders a node holds at most: as many as it may announce to a peer
#: (``psc.Limits.max_patterns_per_peer``), so no pattern is held that other nodes never hear of.
DEFAULT_MAX_PATTERNS = 10_000
#: :attr:`Hub.checked_from` while no forward check is set: no size is refused.
NEVER_CHECKED = 1 << 62
log = Logger()
# Counted per message: bound once, as reading a member off its enum class costs more than the count.
_PUBLISHED, _RECEIVED, _DELIVERED = HubEvent.PUBLISHED, HubEvent.RECEIVED, HubEvent.DELIVERED
_KIND_DELIVERED = Kind.DELIVERED
#: Most (topic, front-end) publish counts :meth:`Hub.publish_plain` holds back between reads of the metrics.
MAX_HELD_PUBLISHED = 1024


def random_node_id() -> str:
    """A node id for a node whose configuration names none."""
    return os.urandom(6).hex()


@hot_message
class Envelope:
    """One published message as it travels through a node and the cluster."""

    topic: str
    #: Any JSON value: the message itself.
    payload: Any
    #: Node id of the node where the message was first published.
    origin: str | None = None
    #: Publish time at the origin, in seconds since the epoch.
    published_at: float | None = None
    #: Cluster-unique message id (``<origin>-<boot>-<counter>``).
    message_id: str | None = None
    #: True when ``payload`` is a WAMP ``{"args": [...], "kwargs": {...}}``
    #: wrapper rather than a single value (see docs/protocol-mapping.md).
    wamp_wrapped: bool = False
    #: Bytes of the message as it reached this node (the WAMP PUBLISH or the PSC301 that carried it),
    #: from the decoder that read them; None when unknown (then metrics count the payload's JSON size).
    size: int | None = field(default=None, compare=False)
    #: Memoised encodings, keyed by wire format (a string, or a tuple such as
    #: WAMP's ``(serializer, subscription id)``); shared by every recipient.
    wire: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    #: WAMP routing object (publish options and a disclosed publisher; PSC 0.6 metadata ``"p"``),
    #: applied by each node's WAMP broker to its own subscribers; None for a plain publish.
    options: dict[str, Any] | None = field(default=None, compare=False)


class LimitExceeded(Exception):
    """A client's subscribe would grow one of the node's tables past its cap; nothing was changed.

    The one refusal every front-end translates into its own error (WAMP
    ERROR, TEP ``#join``, NSD ``ErrorResponse``); ``limit`` names the setting
    and ``value`` is its value.
    """

    def __init__(self, limit: str, value: int, text: str) -> None:
        super().__init__(text)
        self.limit = limit
        self.value = value
        self.text = text


class Sink(Protocol):
    """Anything that can receive messages for the topics it subscribed to.

    A sink whose class sets ``counts_as`` to its front-end's
    :class:`~pubsubclub.core.counters.Source` has its deliveries counted by the
    hub at hand-off, once per message for all such sinks together
    (``delivered`` in the metrics; docs/metrics.md, "Who counts a delivery").
    Its ``deliver`` says how many clients it sent the message to: None or
    True for one, False for none (a slow consumer dropped), an int for a sink
    that fans out to several (SysV's channel sink). A sink whose class sets
    ``takes_plain`` may be handed a remote message as its fields instead
    (:meth:`Hub.deliver_remote_plain`: ``deliver_plain(topic, payload, message_id)``).
    """

    def deliver(self, envelope: Envelope) -> bool | int | None:
        """Hand one message to the client behind this sink."""


class InterestListener(Protocol):
    """Told when the node's set of locally wanted topics changes."""

    def topic_added(self, topic: str) -> None:
        """``topic`` just got its first local subscriber."""

    def topic_removed(self, topic: str) -> None:
        """``topic`` just lost its last local subscriber."""


class PatternSink(Protocol):
    """A sink that holds patterns: told which of its patterns each message matched."""

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> bool | int | None:
        """Hand one message that matched ``pattern`` to the client behind this sink."""


class PatternInterestListener(Protocol):
    """Told when the node's set of locally held patterns changes."""

    def pattern_added(self, pattern: Pattern) -> None:
        """``pattern`` just got its first local holder."""

    def pattern_removed(self, pattern: Pattern) -> None:
        """``pattern`` just lost its last local holder."""


class PublishListener(Protocol):
    """Told about every publish that originated on this node."""

    def local_published(self, envelope: Envelope) -> None:
        """``envelope`` was published by a local client."""


class PlainPublishListener(PublishListener, Protocol):
    """A publish listener that can take a plain local publish as its fields (:meth:`Hub.publish_plain`)."""

    def local_published_plain(
        self, topic: str, payload: Any, origin: str, published_at: float, message_id: str
    ) -> bool:
        """:meth:`local_published` of a plain envelope of these fields (True), or False: it needs the envelope."""


class RemoteInterestListener(Protocol):
    """Told when another node starts listening to one of this node's topics."""

    def remote_subscribed(self, topic: str, peer: str) -> None:
        """Node ``peer`` asked this node for ``topic`` (a PSC201 arrived)."""


class Hub:
    """Topic -> local sinks, plus the node's identity for new envelopes."""

    def __init__(
        self,
        node_id: str | None = None,
        clock: Callable[[], float] = time.time,
        *,
        metrics: Metrics | None = None,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_patterns: int = DEFAULT_MAX_PATTERNS,
    ) -> None:
        for name, value in (("max_topics", max_topics), ("max_patterns", max_patterns)):
            if type(value) is not int or value <= 0:
                raise ValueError(f"Hub {name} must be a positive int, not {value!r}")
        self.node_id = node_id or random_node_id()
        #: Topics (and patterns) with local subscribers that a client's subscribe may bring the node to.
        self.max_topics = max_topics
        self.max_patterns = max_patterns
        #: The wall clock that stamps local publishes (``published_at``); injected by tests.
        self._clock = clock
        self._sinks: dict[str, dict[Sink, None]] = {}
        #: Per topic, what :meth:`_deliver` walks; dropped whenever the topic's sinks change.
        self._snapshots: dict[str, tuple[tuple[Sink, Source | None], ...]] = {}
        #: ``_sinks`` is copied when it has emptied from a peak, so memory returns when clients leave.
        self._sinks_compaction = Compaction()
        self._interest: list[InterestListener] = []
        self._publish: list[PublishListener] = []
        #: The same, each with its ``local_published_plain`` (None without one): what publish_plain walks.
        self._publish_plain: list[tuple[PublishListener, Callable[..., bool] | None]] = []
        self._remote_interest: list[RemoteInterestListener] = []
        self._patterns: PatternIndex[PatternSink] = PatternIndex()
        #: Whether any sink holds a pattern (kept with ``_patterns``: read per publish).
        self._any_patterns = False
        self._pattern_listeners: list[PatternInterestListener] = []
        #: Why a local publish cannot reach other nodes, or None (the federation's check; see :meth:`refusal`).
        self._forward_check: Callable[[Envelope], str | None] | None = None
        #: Publishes of fewer bytes than this always fit the links: no check.
        self._unchecked_below = 0
        #: Publishes of this many bytes or more may be refused by :meth:`refusal`; smaller ones never are
        #: (a front-end's plain publish path skips the call below it). No check set: none is refused.
        self.checked_from = NEVER_CHECKED
        self._counter = itertools.count(1)
        # Message ids stay unique across restarts of a node with the same id.
        self._boot = os.urandom(3).hex()
        self._id_prefix = f"{self.node_id}-{self._boot}-"
        #: The node's metrics counters; every front-end and the federation count here. The node makes
        #: them and hands them down (node/node.py); a hub built alone (a library user's, a test's) makes its own.
        self.metrics = metrics if metrics is not None else Metrics(self.node_id)
        #: Local publishes not yet added to ``metrics`` (added before any read: Metrics.settle).
        self._published = 0
        #: Deliveries (of local and remote messages) not yet added to ``metrics`` (likewise).
        self._delivered = 0
        #: (topic, front-end) -> [messages, bytes] of :meth:`publish_plain`'s counts not yet added (likewise).
        self._published_counts: dict[tuple[str, Source], list[int]] = {}
        #: (topic, front-end) -> [messages, bytes] of :meth:`deliver_remote_one`'s counts not yet added (likewise).
        self._delivered_counts: dict[tuple[str, Source], list[int]] = {}
        #: Messages received from other nodes not yet added to ``metrics`` (likewise).
        self._received = 0
        self.metrics.add_settler(self._settle)

    # -- listeners ---------------------------------------------------------

    def add_interest_listener(self, listener: InterestListener) -> None:
        """Register ``listener`` for first/last subscriber notifications."""
        self._interest.append(listener)

    def add_pattern_listener(self, listener: PatternInterestListener) -> None:
        """Register ``listener`` for first/last holder notifications of patterns."""
        self._pattern_listeners.append(listener)

    def interest_settled(self, timeout: float | None = None) -> Any:
        """A Deferred that fires once the node's interest so far has reached every linked node.

        Interest listeners that can tell (the federation: a round trip on each
        link to the nodes it asked for topics) are asked; without them it fires
        at once. A publish made on any node after it fired reaches this node's
        subscribers of those topics.
        """
        from twisted.internet import defer

        asked = [listener for listener in self._interest if hasattr(listener, "interest_settled")]
        # ``timeout``: how long a listener waits at most (its own default if None).
        waits = [
            listener.interest_settled() if timeout is None else listener.interest_settled(timeout) for listener in asked
        ]
        return defer.gatherResults(waits, consumeErrors=True).addCallback(lambda _: None)

    def add_publish_listener(self, listener: PublishListener) -> None:
        """Register ``listener`` for every local publish."""
        self._publish.append(listener)
        self._publish_plain.append((listener, getattr(listener, "local_published_plain", None)))

    def set_forward_check(self, check: Callable[[Envelope], str | None], unchecked_below: int) -> None:
        """Have :meth:`refusal` ask ``check`` about publishes of ``unchecked_below`` bytes or more."""
        self._forward_check = check
        self._unchecked_below = unchecked_below
        self.checked_from = unchecked_below

    def refusal(self, envelope: Envelope, size: int) -> str | None:
        """Why a front-end must refuse ``envelope`` before acknowledging it (it could not reach other nodes), or None.

        ``size``: the bytes (or characters) the client sent for it. Small
        messages are never measured; a large one has its PSC301 made once, here,
        and kept for forwarding. Nothing acknowledged is then lost on a link for
        its size (docs/protocol.md, "Message sizes").
        """
        check = self._forward_check
        if check is None or size < self._unchecked_below:
            return None
        return check(envelope)

    def add_remote_interest_listener(self, listener: RemoteInterestListener) -> None:
        """Register ``listener`` for other nodes' new interest in this node's topics."""
        self._remote_interest.append(listener)

    def remote_subscribed(self, topic: str, peer: str) -> None:
        """Called by the federation: ``peer`` now wants ``topic`` from this node."""
        for listener in self._remote_interest:
            self._isolated(listener, listener.remote_subscribed, topic, peer)

    def _isolated(self, owner: object, call: Callable[..., None], topic: Any, *args: Any) -> None:
        """Call ``call(topic, *args)``; if it raises, log and count instead of unwinding into our caller."""
        try:
            call(topic, *args)
        except Exception:
            self._failed(owner, getattr(call, "__name__", "call"), str(topic))

    @property
    def stats(self) -> dict[str, int]:
        """The hub's event counters (a view of :attr:`metrics`)."""
        return self.metrics.view("hub")

    def _settle(self) -> None:
        n = self._published
        if n:
            self._published = 0
            self.metrics.event(_PUBLISHED, n)
        n = self._delivered
        if n:
            self._delivered = 0
            self.metrics.event(_DELIVERED, n)
        counts = self._published_counts
        if counts:
            for (topic, source), (n, nbytes) in counts.items():
                self.metrics.count(topic, source, Kind.PUBLISHED, n, nbytes)
            counts.clear()
        counts = self._delivered_counts
        if counts:
            for (topic, source), (n, nbytes) in counts.items():
                self.metrics.count(topic, source, _KIND_DELIVERED, n, nbytes)
            counts.clear()
        n = self._received
        if n:
            self._received = 0
            self.metrics.event(_RECEIVED, n)

    def _failed(self, owner: object, what: str, topic: str) -> None:
        name = type(owner).__name__
        self.metrics.event(HubEvent.SINK_ERRORS)
        self.metrics.sink_error(name)
        log.failure("{sink}.{what} raised on topic {topic!r}; isolated", sink=name, what=what, topic=topic)

    # -- subscriptions -----------------------------------------------------

    def topics(self) -> list[str]:
        """Every topic with at least one local subscriber."""
        return list(self._sinks)

    def subscribers(self, topic: str) -> int:
        """Number of local sinks subscribed to ``topic``."""
        return len(self._sinks.get(topic, ()))

    def subscribe(self, topic: str, sink: Sink, *, limited: bool = False) -> None:
        """Add ``sink`` to ``topic``; idempotent.

        ``limited``: a client asked for it, so a new topic past :attr:`max_topics`
        raises :class:`LimitExceeded` (nothing changed). The node's own sinks
        (NSD history, replication, the TEP broadcast) are not limited.
        """
        sinks = self._sinks.get(topic)
        if sinks is None and limited and len(self._sinks) >= self.max_topics:
            raise LimitExceeded(
                "max-subscribed-topics",
                self.max_topics,
                f"this node already has subscribers on {len(self._sinks)} topics, the limit is {self.max_topics}",
            )
        self._snapshots.pop(topic, None)
        if sinks is None:
            self._sinks[topic] = {sink: None}
            self._sinks_compaction.grown(len(self._sinks))
            for listener in self._interest:
                self._isolated(listener, listener.topic_added, topic)
        else:
            sinks[sink] = None

    def unsubscribe(self, topic: str, sink: Sink) -> None:
        """Remove ``sink`` from ``topic``; idempotent."""
        sinks = self._sinks.get(topic)
        if sinks is None or sink not in sinks:
            return
        del sinks[sink]
        self._snapshots.pop(topic, None)
        if not sinks:
            del self._sinks[topic]
            if self._sinks_compaction.due(len(self._sinks)):
                self._sinks = dict(self._sinks)
                self._snapshots = dict(self._snapshots)
            for listener in self._interest:
                self._isolated(listener, listener.topic_removed, topic)

    def unsubscribe_all(self, sink: Any) -> None:
        """Remove ``sink`` from every topic and pattern (a client went away)."""
        for topic in [t for t, sinks in self._sinks.items() if sink in sinks]:
            self.unsubscribe(topic, sink)
        if len(self._patterns):
            for pattern in [p for p in self._patterns.patterns() if sink in self._patterns.holders(p)]:
                self.unsubscribe_pattern(pattern, sink)

    # -- pattern subscriptions ---------------------------------------------

    def patterns(self) -> list[Pattern]:
        """Every pattern with at least one local holder."""
        return self._patterns.patterns()

    def pattern_holders(self, pattern: Pattern) -> int:
        """Number of local sinks holding ``pattern``."""
        return len(self._patterns.holders(pattern))

    def room_for(self, topic: str) -> bool:
        """Whether a limited :meth:`subscribe` to ``topic`` would be accepted now."""
        return topic in self._sinks or len(self._sinks) < self.max_topics

    def subscribe_pattern(self, pattern: Pattern, sink: PatternSink, *, limited: bool = False) -> None:
        """Add ``sink`` to ``pattern``; idempotent (``limited``: as for :meth:`subscribe`, :attr:`max_patterns`)."""
        if limited and pattern not in self._patterns and len(self._patterns) >= self.max_patterns:
            raise LimitExceeded(
                "federation.max-patterns-per-peer",
                self.max_patterns,
                f"this node already holds {len(self._patterns)} patterns, the limit is {self.max_patterns}",
            )
        added = self._patterns.add(pattern, sink)
        self._any_patterns = len(self._patterns) > 0
        if added:
            for listener in self._pattern_listeners:
                self._isolated(listener, listener.pattern_added, pattern)

    def unsubscribe_pattern(self, pattern: Pattern, sink: PatternSink) -> None:
        """Remove ``sink`` from ``pattern``; idempotent."""
        removed = self._patterns.discard(pattern, sink)
        self._any_patterns = len(self._patterns) > 0
        if removed:
            for listener in self._pattern_listeners:
                self._isolated(listener, listener.pattern_removed, pattern)

    # -- publishing --------------------------------------------------------

    def envelope(
        self,
        topic: str,
        payload: Any,
        wamp_wrapped: bool = False,
        size: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> Envelope:
        """A new envelope for a message published on this node (``size``: its bytes as received, if known)."""
        return Envelope(
            topic,
            payload,
            self.node_id,
            self._clock(),
            f"{self._id_prefix}{next(self._counter)}",
            wamp_wrapped,
            size,
            options=options,
        )

    def publish(self, envelope: Envelope, exclude: Sink | None = None) -> int:
        """Deliver a local publish locally, then tell the federation.

        Returns the number of local deliveries. Counted as published once per
        read of the metrics, not per message (:meth:`Metrics.settle`).
        """
        self._published += 1
        # No local sink and no pattern held (a publishing node's usual case): nothing to look up.
        delivered = self._deliver(envelope, exclude) if self._any_patterns or envelope.topic in self._sinks else 0
        for listener in self._publish:
            try:
                listener.local_published(envelope)
            except Exception:
                self._failed(listener, "local_published", envelope.topic)
        return delivered

    def publish_plain(
        self, topic: str, payload: Any, size: int, exclude: Sink | None = None, counted_as: Source | None = None
    ) -> int:
        """:meth:`publish` of ``self.envelope(topic, payload, size=size)`` (a plain value, no options).

        ``counted_as``: the front-end whose ``published`` count (``size`` bytes)
        this is, as ``metrics.count(topic, counted_as, Kind.PUBLISHED, 1, size)``
        would add it; held back and added before any read of the metrics.

        The envelope is made only when something needs it: a local sink or
        pattern, or a publish listener without ``local_published_plain`` (or
        whose ``local_published_plain`` answers False: it did nothing and wants
        the envelope). A publish only other nodes take (a publishing node's
        usual case) goes to the federation as its fields, without an envelope
        made and taken apart again.
        """
        origin, published_at = self.node_id, self._clock()
        message_id = f"{self._id_prefix}{next(self._counter)}"
        if counted_as is not None:
            counts = self._published_counts
            cell = counts.get((topic, counted_as))
            if cell is None:
                if len(counts) >= MAX_HELD_PUBLISHED:
                    self._settle()  # bounded: publishing on ever new topics must not grow the node
                counts[(topic, counted_as)] = [1, size]
            else:
                cell[0] += 1
                cell[1] += size
        self._published += 1
        envelope: Envelope | None = None
        delivered = 0
        if self._any_patterns or topic in self._sinks:
            envelope = Envelope(topic, payload, origin, published_at, message_id, False, size)
            delivered = self._deliver(envelope, exclude)
        for listener, plain in self._publish_plain:
            try:
                if envelope is None:
                    if plain is not None and plain(topic, payload, origin, published_at, message_id):
                        continue
                    envelope = Envelope(topic, payload, origin, published_at, message_id, False, size)
                listener.local_published(envelope)
            except Exception:
                self._failed(listener, "local_published", topic)
        return delivered

    def deliver_remote(self, envelope: Envelope) -> int:
        """Deliver a message received from another node, locally only (a batch of one)."""
        return self.deliver_remote_batch((envelope,))

    def deliver_remote_batch(self, envelopes: Iterable[Envelope]) -> int:
        """Deliver messages received from another node (one frame's), locally only, in order.

        :meth:`deliver_remote` for each, with the hub's counters added up over
        the batch and counted once (the same totals). Returns the number of
        local deliveries.
        """
        metrics = self.metrics
        received = delivered = 0
        tally: dict[tuple[str, Source], list[int]] = {}
        snapshots, sinks, patterns = self._snapshots, self._sinks, self._patterns
        try:
            for envelope in envelopes:
                received += 1
                topic = envelope.topic
                # _targets and the pattern match without their calls when the snapshot is made / no pattern is held.
                targets = snapshots.get(topic)
                if targets is None:
                    targets = self._targets(topic) if topic in sinks else ()
                matched = patterns.match(topic) if self._any_patterns else ()
                if matched:
                    delivered += self._deliver_to(envelope, targets, matched, None, tally)
                elif targets:
                    # _deliver_to without its call, for the usual case: no pattern matched, nothing excluded.
                    sources: list[Source] = []
                    for sink, source in targets:
                        try:
                            sent = sink.deliver(envelope)
                        except Exception:
                            # One failing sink must not cost the others this message.
                            self._failed(sink, "deliver", topic)
                            continue
                        delivered += 1
                        if source is not None and sent is not False:
                            if sent is None or sent is True:
                                sources.append(source)
                            else:  # a sink that fans out: ``sent`` clients
                                sources += [source] * sent
                    if sources:
                        size = envelope.size
                        if size is None:
                            size = payload_size(envelope)
                        for source in sources:
                            cell = tally.get((topic, source))
                            if cell is None:
                                tally[(topic, source)] = [1, size]
                            else:
                                cell[0] += 1
                                cell[1] += size
        finally:
            # Added to the metrics when they are read (Metrics.settle), as local publishes are.
            self._received += received
            self._delivered += delivered
            for (topic, source), (n, nbytes) in tally.items():
                metrics.count(topic, source, Kind.DELIVERED, n, nbytes)
        return delivered

    def deliver_remote_one(self, envelope: Envelope) -> int:
        """:meth:`deliver_remote_batch` of one message, without the batch's tuple, tally dict and lists.

        The same deliveries and the same counts: the delivered count of each
        front-end once per message (summed as the batch's tally sums it).
        """
        topic = envelope.topic
        targets = self._snapshots.get(topic)
        if targets is None:
            targets = self._targets(topic) if topic in self._sinks else ()
        delivered = 0
        matched = self._patterns.match(topic) if self._any_patterns else ()
        if matched:
            tally: dict[tuple[str, Source], list[int]] = {}
            try:
                delivered = self._deliver_to(envelope, targets, matched, None, tally)
            finally:
                self._received += 1
                self._delivered += delivered
                for (name, counted), (n, nbytes) in tally.items():
                    self.metrics.count(name, counted, _KIND_DELIVERED, n, nbytes)
            return delivered
        # The tally of one message: its first front-end's count here, any other front-end's in ``others``.
        first: Source | None = None
        n = 0
        others: dict[Source, int] | None = None
        try:
            for sink, source in targets:
                try:
                    sent = sink.deliver(envelope)
                except Exception:
                    # One failing sink must not cost the others this message.
                    self._failed(sink, "deliver", topic)
                    continue
                delivered += 1
                if source is not None and sent is not False:
                    k = 1 if sent is None or sent is True else sent
                    if k <= 0:  # a fan-out to no client: not counted, as the batch's ``[source] * 0``
                        continue
                    if first is None or source is first:
                        first = source
                        n += k
                    else:
                        if others is None:
                            others = {}
                        others[source] = others.get(source, 0) + k
        finally:
            self._received += 1
            self._delivered += delivered
            if first is not None:
                size = envelope.size
                if size is None:
                    size = payload_size(envelope)
                # metrics.count(topic, first, DELIVERED, n, n * size), held back as publish_plain holds its count.
                counts = self._delivered_counts
                cell = counts.get((topic, first))
                if cell is None:
                    if len(counts) >= MAX_HELD_PUBLISHED:
                        self._settle()  # bounded: delivering on ever new topics must not grow the node
                    counts[(topic, first)] = [n, n * size]
                else:
                    cell[0] += n
                    cell[1] += n * size
                if others:
                    for other, k in others.items():
                        self.metrics.count(topic, other, _KIND_DELIVERED, k, k * size)
        return delivered

    def deliver_remote_plain(
        self,
        topic: str,
        payload: Any,
        origin: str | None,
        published_at: float | None,
        message_id: str | None,
        wamp_wrapped: bool,
        size: int,
    ) -> int:
        """:meth:`deliver_remote_one` of ``Envelope(topic, payload, origin, published_at, message_id, ...)``.

        Without the envelope when nothing could look at it: the topic's only
        sink takes plain values (``takes_plain``: its ``deliver_plain(topic,
        payload, message_id)`` answers True or False as ``deliver`` would, or
        None, having done nothing, when it needs the envelope), no pattern is
        held, and the payload is not a WAMP wrapper. The same deliveries and
        counts either way.
        """
        targets = self._snapshots.get(topic)
        if targets is None:
            targets = self._targets(topic) if topic in self._sinks else ()
        if len(targets) == 1 and not self._any_patterns and not wamp_wrapped:
            sink, source = targets[0]
            if getattr(sink, "takes_plain", False):
                try:
                    sent = sink.deliver_plain(topic, payload, message_id)  # type: ignore[attr-defined]
                except Exception:
                    # As deliver_remote_one's loop: the failure counted and logged, the message not delivered.
                    self._received += 1
                    self._failed(sink, "deliver", topic)
                    return 0
                if sent is not None:
                    self._received += 1
                    self._delivered += 1
                    if source is not None and sent is True:
                        counts = self._delivered_counts  # deliver_remote_one's held count
                        cell = counts.get((topic, source))
                        if cell is None:
                            if len(counts) >= MAX_HELD_PUBLISHED:
                                self._settle()
                            counts[(topic, source)] = [1, size]
                        else:
                            cell[0] += 1
                            cell[1] += size
                    return 1
        return self.deliver_remote_one(Envelope(topic, payload, origin, published_at, message_id, wamp_wrapped, size))

    def _targets(self, topic: str) -> tuple[tuple[Sink, Source | None], ...]:
        """``topic``'s sinks with their ``counts_as``, made once per change of its subscribers, not per message.

        A snapshot: a sink may unsubscribe (or subscribe) while a message is
        being delivered; that delivery goes on to the sinks it started with.
        """
        targets = self._snapshots.get(topic)
        if targets is None:
            sinks = self._sinks.get(topic)
            if not sinks:
                return ()  # not kept: publishing on ever new topics must not grow the node
            targets = self._snapshots[topic] = tuple((sink, getattr(sink, "counts_as", None)) for sink in sinks)
        return targets

    def _deliver(self, envelope: Envelope, exclude: Any) -> int:
        topic = envelope.topic
        targets = self._snapshots.get(topic)  # _targets, without its call when the snapshot is made or no sink
        if targets is None:
            targets = self._targets(topic) if topic in self._sinks else ()
        matched = self._patterns.match(topic)
        if not targets and not matched:
            return 0
        tally: dict[tuple[str, Source], list[int]] = {}
        count = self._deliver_to(envelope, targets, matched, exclude, tally)
        self._delivered += count
        if tally:
            # Once per message and front-end, however many recipients (docs/metrics.md).
            for (topic, source), (n, nbytes) in tally.items():
                self.metrics.count(topic, source, _KIND_DELIVERED, n, nbytes)
        return count

    def _deliver_to(
        self,
        envelope: Envelope,
        targets: tuple[tuple[Sink, Source | None], ...],
        matched: tuple[Pattern, ...],
        exclude: Any,
        tally: dict[tuple[str, Source], list[int]],
    ) -> int:
        """Hand ``envelope`` to ``targets`` and the holders of ``matched``; add what is counted to ``tally``.

        ``tally`` maps (topic, front-end) to [messages, bytes]: one count per
        front-end however many of its sinks got the message (docs/metrics.md).
        """
        topic = envelope.topic
        count = 0
        sources: list[Source] = []
        for sink, source in targets:
            if sink is exclude:
                continue
            try:
                sent = sink.deliver(envelope)
            except Exception:
                # One failing sink must not cost the others this message.
                self._failed(sink, "deliver", topic)
                continue
            count += 1
            if source is not None and sent is not False:
                if sent is None or sent is True:
                    sources.append(source)
                else:  # a sink that fans out: ``sent`` clients
                    sources += [source] * sent
        # One delivery per matching pattern, as WAMP asks of a client subscribed several ways.
        for pattern in matched:
            for holder in list(self._patterns.holders(pattern)):
                if holder is exclude:
                    continue
                try:
                    sent = holder.deliver_matched(envelope, pattern)
                except Exception:
                    self._failed(holder, "deliver_matched", topic)
                    continue
                count += 1
                source = getattr(holder, "counts_as", None)
                if source is not None and sent is not False:
                    if sent is None or sent is True:
                        sources.append(source)
                    else:
                        sources += [source] * sent
        if sources:
            size = envelope.size
            if size is None:
                size = payload_size(envelope)
            for source in sources:
                cell = tally.get((topic, source))
                if cell is None:
                    tally[(topic, source)] = [1, size]
                else:
                    cell[0] += 1
                    cell[1] += size
        return count
