"""Replay after short outages (PSC 0.3), sans-IO: streams on the producer, positions on the consumer.

On a 0.3 link the producer numbers every PSC301 it sends to a consumer
*node* (not link): one :class:`Stream` per consumer node id, on an ``epoch``
that names this producer process and stream. The stream keeps what it sent
in a replay buffer bounded by bytes and age (:class:`ReplaySettings`), and
keeps numbering and buffering the consumer's last known topics while the
consumer has no link, for at most the window.

When a link comes back the consumer sends PSC103 with the last ``(epoch,
seq)`` it received and its whole interest; :meth:`Outbox.resume` answers
with PSC104 (where the stream continues and how many messages are lost)
and the buffered messages that follow, then the link is live again. The
consumer side (:class:`Inbox`) remembers positions per producer node, drops
any duplicate by sequence number and reports gaps.

No I/O and no Twisted here: time comes from an injected clock, the epoch
prefix from the caller. The outbox holds bytes and sequence numbers only: it
answers what to send on which link (the link a stream is attached to, an
opaque key), and the federation sends and counts.
See docs/protocol.md, "Extension: version 0.3".
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pubsubclub.core.counters import ReplayEvent
from pubsubclub.core.metrics import Metrics
from pubsubclub.core.patterns import Pattern, PatternIndex
from pubsubclub.federation import psc

# Counted per message once a stream's buffer is full: bound once (a member read off its enum class costs more).
_TRIMMED = ReplayEvent.TRIMMED

#: :meth:`Inbox.accept` result for a message already received: drop it.
DUPLICATE = -1


@dataclass(frozen=True)
class ReplaySettings:
    """Named limits of the replay buffers (docs/security.md, "Short outages")."""

    #: Bytes of sent PSC301s kept per consumer node.
    max_bytes: int = 16 * 1024 * 1024
    #: Seconds a message is kept, and a consumer node without a link keeps its stream.
    window: float = 60.0
    #: Streams of consumer nodes without a link kept at once (the oldest go first).
    max_detached_streams: int = 1024
    #: Producer nodes whose position a consumer remembers (the least recent go first).
    max_positions: int = 4096

    def __post_init__(self) -> None:
        if not isinstance(self.max_bytes, int) or self.max_bytes < 1:
            raise ValueError(f"ReplaySettings.max_bytes must be a positive int, not {self.max_bytes!r}")
        if not isinstance(self.window, (int, float)) or not self.window > 0:
            raise ValueError(f"ReplaySettings.window must be a positive number of seconds, not {self.window!r}")
        for name in ("max_detached_streams", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ReplaySettings.{name} must be a positive int, not {value!r}")


class ResumeRefused(Exception):
    """A consumer asked to resume from a position the producer never sent."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(eq=False, slots=True)
class Stream:
    """Everything a producer sent to one consumer node, numbered, with the recent part kept."""

    #: Node id of the consumer; None for a peer that gave none (the stream ends with its link).
    consumer: str | None
    epoch: str
    #: The last sequence number given out (0: none yet).
    seq: int = 0
    #: The consumer's topics: from its link, or the last known while it has none.
    topics: set[str] = field(default_factory=set)
    #: The consumer's patterns (0.5), kept like its topics.
    patterns: set[Pattern] = field(default_factory=set)
    #: ``(seq, time sent, bytes)`` of the kept messages, oldest first.
    buffer: deque[tuple[int, float, bytes]] = field(default_factory=deque)
    #: Sum of the lengths in ``buffer``.
    nbytes: int = 0
    #: The link the stream is sent on; None while the consumer has none.
    link: Any = None
    #: When the stream lost its link (clock seconds); None while it has one.
    detached_at: float | None = None
    #: The consumer's last link spoke 0.6: messages holding binary values are sent to it.
    binary: bool = False

    def first_kept(self) -> int:
        """The sequence number of the oldest message still kept (``seq + 1`` when none is)."""
        return self.buffer[0][0] if self.buffer else self.seq + 1


@dataclass(frozen=True)
class Resumption:
    """What a producer sends on a link that resumed, in this order, before any live message."""

    #: The PSC104 answer.
    position: psc.Position
    #: The kept PSC301s after the consumer's position (or all kept ones after a gap).
    replay: list[bytes]
    #: An older link the stream was attached to (a ghost of the same node); close it.
    superseded: Any


class Outbox:
    """The producer side: one :class:`Stream` per consumer node, fed with every forwarded publish."""

    def __init__(
        self, settings: ReplaySettings, clock: Callable[[], float], boot: str, metrics: Metrics | None = None
    ) -> None:
        self.settings = settings
        #: Where the counts go (the node's; a private one when used alone).
        self.metrics = metrics if metrics is not None else Metrics("replay")
        self._clock = clock
        self._boot = boot
        self._epochs = itertools.count(1)
        #: Consumer node id -> its stream.
        self._streams: dict[str, Stream] = {}
        #: Attached link -> its stream (anonymous streams live only here).
        self._by_link: dict[Any, Stream] = {}
        #: Topic -> the streams that want it, attached or not.
        self._by_topic: dict[str, dict[Stream, None]] = {}
        #: Pattern -> the streams that want it, attached or not (0.5).
        self._patterns: PatternIndex[Stream] = PatternIndex()
        #: Messages trimmed from full buffers not yet in the metrics (added before any read: Metrics.settle).
        self._trimmed = 0
        self.metrics.add_settler(self._settle)

    def _settle(self) -> None:
        n = self._trimmed
        if n:
            self._trimmed = 0
            self.metrics.event(_TRIMMED, n)

    @property
    def stats(self) -> dict[str, int]:
        """The producer side's counters (a view of :attr:`metrics`)."""
        return {k: v for k, v in self.metrics.view("replay").items() if k != ReplayEvent.DUPLICATES}

    # -- interest ---------------------------------------------------------------

    def wants(self, topic: str) -> bool:
        """Whether any stream (with or without a link) takes ``topic``, exactly or by a pattern."""
        return bool(self.streams_for(topic))

    def streams_for(self, topic: str) -> dict[Stream, None] | None:
        """The streams that take ``topic`` (each once, however many ways); None or empty when none does.

        What :meth:`forward` sends to; the caller may pass it on, to find them once per message.
        """
        streams = self._by_topic.get(topic)
        matched = self._patterns.match(topic)
        if matched:
            # A stream that takes the topic several ways still gets it once.
            union = dict(streams) if streams else {}
            for pattern in matched:
                union.update(self._patterns.holders(pattern))
            streams = union
        return streams

    def topics(self) -> set[str]:
        """Every topic some stream wants."""
        return set(self._by_topic)

    def subscribe(self, link: Any, topics: tuple[str, ...]) -> None:
        """The consumer on ``link`` asked for ``topics`` (PSC201)."""
        stream = self._by_link.get(link)
        if stream is not None:
            for topic in topics:
                self._add_topic(stream, topic)

    def unsubscribe(self, link: Any, topic: str) -> None:
        """The consumer on ``link`` no longer wants ``topic`` (PSC202)."""
        stream = self._by_link.get(link)
        if stream is not None:
            self._remove_topic(stream, topic)

    def subscribe_pattern(self, link: Any, pattern: Pattern) -> None:
        """The consumer on ``link`` asked for ``pattern`` (PSC203)."""
        stream = self._by_link.get(link)
        if stream is not None:
            stream.patterns.add(pattern)
            self._patterns.add(pattern, stream)

    def unsubscribe_pattern(self, link: Any, pattern: Pattern) -> None:
        """The consumer on ``link`` no longer wants ``pattern`` (PSC204)."""
        stream = self._by_link.get(link)
        if stream is not None:
            stream.patterns.discard(pattern)
            self._patterns.discard(pattern, stream)

    def pattern_interest(self) -> dict[Pattern, list[str]]:
        """Pattern -> consumer node ids of the streams that take it (for /stats)."""
        return {p: sorted(s.consumer or "?" for s in self._patterns.holders(p)) for p in self._patterns.patterns()}

    def interest(self) -> dict[str, list[str]]:
        """Topic -> consumer node ids of the streams that take it (for /stats)."""
        return {topic: sorted(s.consumer or "?" for s in streams) for topic, streams in self._by_topic.items()}

    # -- links ------------------------------------------------------------------

    def resume(self, link: Any, consumer: str | None, request: psc.Resume) -> Resumption:
        """Attach ``link`` to the consumer's stream from the position in ``request`` (PSC103).

        Raises :class:`ResumeRefused` when the consumer claims a sequence
        number this stream never gave out.
        """
        now = self._clock()
        self._expire(now)
        stream = self._streams.get(consumer) if consumer is not None else None
        replay: list[bytes] = []
        lost: int | None
        if stream is not None and request.epoch == stream.epoch:
            if request.seq > stream.seq:
                raise ResumeRefused(
                    f"PSC103 position {request.seq} is past the last sequence number sent, {stream.seq}"
                )
            first = stream.first_kept()
            after = max(request.seq, first - 1)
            lost = after - request.seq
            replay = [data for seq, _, data in stream.buffer if seq > after]
        else:
            # Nothing to resume from: a first link, a consumer that restarted
            # (no epoch), or an epoch of ours that is gone (we restarted, or
            # the stream outlived the window). Only the last loses messages,
            # and how many is not known.
            if stream is not None:
                self._drop(stream)
            stream = self._new_stream(consumer)
            after = 0
            lost = 0 if request.epoch is None else None
        superseded = stream.link if stream.link is not None and stream.link is not link else None
        if superseded is not None:
            del self._by_link[superseded]
            self.metrics.event(ReplayEvent.STREAMS_SUPERSEDED)
        stream.link = link
        stream.detached_at = None
        stream.binary = getattr(link, "with_binary", False) is True
        self._by_link[link] = stream
        for topic in stream.topics - set(request.topics):
            self._remove_topic(stream, topic)
        for topic in request.topics:
            self._add_topic(stream, topic)
        patterns = set(request.patterns or ())
        for pattern in stream.patterns - patterns:
            self._patterns.discard(pattern, stream)
        for pattern in patterns:
            self._patterns.add(pattern, stream)
        stream.patterns = patterns
        self.metrics.event(ReplayEvent.REPLAYED, len(replay))
        return Resumption(psc.Position(stream.epoch, after, lost), replay, superseded)

    def detach(self, link: Any) -> None:
        """``link`` closed: its stream keeps buffering the last known topics for the window."""
        stream = self._by_link.pop(link, None)
        if stream is None:
            return
        now = self._clock()
        stream.link = None
        stream.detached_at = now
        if stream.consumer is None:
            self._drop(stream)
        self._expire(now)

    # -- publishing -------------------------------------------------------------

    def publish(self, topic: str, publish_02: bytes) -> list[tuple[Any, bytes]]:
        """:meth:`forward` of one PSC301 to every stream that takes ``topic``: what to send, on which link.

        ``publish_02`` is the message's 0.2 encoding (:func:`psc.encode_publish`).
        """
        return self.forward(psc.seq_template(publish_02), self.streams_for(topic))

    def forward(self, template: bytes, streams: dict[Stream, None] | None) -> list[tuple[Any, bytes]]:
        """Number and keep one message in each of ``streams``; the ``(link, bytes)`` to send, for those with a link.

        ``template`` is the message's bytes with a ``%d`` where its sequence
        number goes, made once (:func:`psc.seq_template`): each stream's copy
        differs only by its number. ``streams``: :meth:`streams_for` its topic.
        Nothing is sent here: the caller sends and counts (streams without a
        link only keep it).
        """
        sends: list[tuple[Any, bytes]] = []
        if not streams:
            return sends
        now = self._clock()
        settings = self.settings
        window = settings.window
        limit, oldest = settings.max_bytes, now - window
        expired: list[Stream] | None = None
        trimmed = 0
        for stream in streams:
            detached_at = stream.detached_at
            if detached_at is not None and now - detached_at > window:
                expired = [*(expired or ()), stream]
                continue
            seq = stream.seq = stream.seq + 1
            data = template % seq
            # Keep it; past the byte limit or the window the oldest go (every message, once the buffer is full).
            buffer = stream.buffer
            buffer.append((seq, now, data))
            nbytes = stream.nbytes + len(data)
            while nbytes > limit or buffer[0][1] < oldest:
                nbytes -= len(buffer.popleft()[2])
                trimmed += 1
                if not buffer:
                    break
            stream.nbytes = nbytes
            link = stream.link
            if link is not None:
                sends.append((link, data))
        self._trimmed += trimmed
        for stream in expired or ():
            self._drop(stream)
            self.metrics.event(ReplayEvent.STREAMS_EXPIRED)
        return sends

    def summary(self) -> dict[str, int]:
        """Streams, kept messages and bytes, and the counters (for /stats)."""
        streams = set(self._streams.values()) | set(self._by_link.values())
        return {
            "streams": len(streams),
            "detached": sum(1 for s in streams if s.link is None),
            "kept_messages": sum(len(s.buffer) for s in streams),
            "kept_bytes": sum(s.nbytes for s in streams),
            **self.stats,
        }

    # -- internals --------------------------------------------------------------

    def _new_stream(self, consumer: str | None) -> Stream:
        stream = Stream(consumer, f"{self._boot}-{next(self._epochs)}")
        if consumer is not None:
            self._streams[consumer] = stream
        return stream

    def _add_topic(self, stream: Stream, topic: str) -> None:
        stream.topics.add(topic)
        self._by_topic.setdefault(topic, {})[stream] = None

    def _remove_topic(self, stream: Stream, topic: str) -> None:
        stream.topics.discard(topic)
        streams = self._by_topic.get(topic)
        if streams is not None:
            streams.pop(stream, None)
            if not streams:
                del self._by_topic[topic]

    def _drop(self, stream: Stream) -> None:
        for topic in list(stream.topics):
            self._remove_topic(stream, topic)
        for pattern in stream.patterns:
            self._patterns.discard(pattern, stream)
        stream.patterns = set()
        if stream.consumer is not None and self._streams.get(stream.consumer) is stream:
            del self._streams[stream.consumer]
        if stream.link is not None:
            self._by_link.pop(stream.link, None)
        stream.buffer.clear()
        stream.nbytes = 0

    def _expire(self, now: float) -> None:
        """Drop streams without a link for longer than the window, and the oldest past the count limit."""
        detached = [s for s in self._streams.values() if s.detached_at is not None]
        excess = len(detached) - self.settings.max_detached_streams
        if excess > 0:
            detached.sort(key=lambda s: s.detached_at or 0.0)
        for i, stream in enumerate(detached):
            assert stream.detached_at is not None
            if i < excess or now - stream.detached_at > self.settings.window:
                self._drop(stream)
                self.metrics.event(ReplayEvent.STREAMS_EXPIRED)


@dataclass(frozen=True)
class Gap:
    """Messages from a producer node that this node will never get."""

    #: The producer node (its id, else its link's address).
    producer: str
    #: How many; None when unknown (the producer restarted or dropped the stream).
    lost: int | None
    #: ``window`` (past the producer's buffer), ``restart`` (its stream is gone) or ``sequence`` (numbers skipped).
    reason: str


class Inbox:
    """The consumer side: the last position received from each producer node, across links."""

    def __init__(self, max_positions: int = ReplaySettings.max_positions, metrics: Metrics | None = None) -> None:
        self._max = max_positions
        #: Where the counts go (the node's; a private one when used alone).
        self.metrics = metrics if metrics is not None else Metrics("replay")
        #: Producer -> [epoch, last sequence number received].
        self._positions: dict[str, list[Any]] = {}

    @property
    def stats(self) -> dict[str, int]:
        """The consumer side's counters (a view of :attr:`metrics`)."""
        return {ReplayEvent.DUPLICATES.value: self.metrics.view("replay")[ReplayEvent.DUPLICATES]}

    def position(self, producer: str) -> tuple[str | None, int]:
        """What to put in PSC103 for ``producer``: ``(None, 0)`` when we hold no position."""
        pos = self._positions.get(producer)
        return (None, 0) if pos is None else (pos[0], pos[1])

    def positioned(self, producer: str, answer: psc.Position) -> Gap | None:
        """The producer answered PSC104: where its stream continues; the gap it reports, if any."""
        old = self._positions.pop(producer, None)
        seq = answer.seq
        if old is not None and old[0] == answer.epoch:
            seq = max(seq, old[1])  # anything it sends again is dropped as a duplicate
        self._positions[producer] = [answer.epoch, seq]
        if len(self._positions) > self._max:
            del self._positions[next(iter(self._positions))]
        if answer.lost is None:
            return Gap(producer, None, "restart")
        if answer.lost:
            return Gap(producer, answer.lost, "window")
        return None

    def accept(self, producer: str, seq: int) -> int:
        """How many sequence numbers were skipped before ``seq`` (0: in order), or DUPLICATE."""
        pos = self._positions.get(producer)
        if pos is None:
            # No PSC104 yet (the session refuses this); count from here.
            pos = self._positions[producer] = [None, seq - 1]
        last = pos[1]
        if seq <= last:
            self.metrics.event(ReplayEvent.DUPLICATES)
            return DUPLICATE
        pos[1] = seq
        return seq - last - 1
