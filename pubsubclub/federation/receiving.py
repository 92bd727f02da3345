"""The federation's receiving: what producers send us, delivered here and never forwarded again.

Part of :class:`~pubsubclub.federation.federation.Federation`: one path for
PSC301s (a single message is a batch of one), replay positions and gaps
(PSC103/PSC104), and messages dropped for their bounds.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from twisted.logger import Logger

from pubsubclub.core.counters import DropReason, FederationEvent, Kind, LinkCount, Source
from pubsubclub.core.hub import GAP_TOPIC, Envelope
from pubsubclub.core.metrics import LATENCY_BOUNDS_MS
from pubsubclub.federation import psc
from pubsubclub.federation.replay import DUPLICATE, Gap, ResumeRefused
from pubsubclub.federation.session import (
    CLOSE_BAD_MESSAGE,
    CLOSE_DUPLICATE,
    LinkError,
    LinkSession,
    LinkState,
)
from pubsubclub.federation.state import FederationState
from pubsubclub.net import wsframes
from pubsubclub.net.wsframes import hold_writes, release_writes

log = Logger()
# Counted per message: bound once, as reading a member off its enum class costs more than the count.
_RECEIVED = FederationEvent.RECEIVED
_CLOSED = LinkState.CLOSED
#: Most (topic, peer) received counts :meth:`Receiving.link_received_plain` holds back between reads of the metrics.
MAX_HELD_RECEIVED = 1024


class Receiving(FederationState):
    """Receiving from producers (a part of :class:`Federation`)."""

    #: PSC301s received and not yet added to the metrics' RECEIVED event (:meth:`_settle_received`).
    _received_n = 0
    #: (topic, peer) -> [messages, bytes] of :meth:`link_received_plain`'s PSC ``received`` counts not yet
    #: added to the metrics (:meth:`_settle_received`; made by Federation.__init__).
    _received_counts: dict[tuple[str, str], list[int]]

    if TYPE_CHECKING:

        def _remote_topics_changed(self) -> None:
            """Tell the remote-topics listeners (:class:`~pubsubclub.federation.interest.Interest`)."""

        def relayed(self, session: LinkSession, envelopes: Iterator[Envelope]) -> Iterator[Envelope]:
            """Relay: ``envelopes``, each forwarded on once delivered (relay.py)."""

        def relay_gap(self, envelope: Envelope) -> None:
            """Relay: a gap report to the workers that asked (relay.py)."""

    def link_resume(self, session: LinkSession, message: psc.Resume) -> None:
        """0.3: a consumer resumes its stream; answer PSC104, resend what it missed, then go live."""
        assert self.outbox is not None  # 0.3 is offered only with an outbox
        try:
            plan = self.outbox.resume(session, session.peer_node, message)
        except ResumeRefused as e:
            raise LinkError(CLOSE_BAD_MESSAGE, e.reason) from None
        session.send(plan.position)
        for data in plan.replay:
            session.send_raw(data)
        peer = session.peer_node or session.peer
        log.info(
            "PSC stream to {peer}: epoch {epoch}, resumed after {seq}, {replayed} resent, {lost} lost",
            peer=peer,
            epoch=plan.position.epoch,
            seq=plan.position.seq,
            replayed=len(plan.replay),
            lost=plan.position.lost,
        )
        if plan.replay:
            self.hub.metrics.link_count(peer, LinkCount.REPLAYED, len(plan.replay))
        old = self._links.get(plan.superseded)
        if old is not None:
            old.close(CLOSE_DUPLICATE, "superseded by a newer link from the same node")
        for topic in message.topics:
            self.hub.remote_subscribed(topic, peer)
        self._remote_topics_changed()

    def link_position(self, session: LinkSession, message: psc.Position) -> None:
        """0.3: the producer said where its stream continues; report a gap it announces."""
        assert self.inbox is not None
        gap = self.inbox.positioned(session.peer_node or session.peer, message)
        if gap is not None:
            self._report_gap(gap)

    def _report_gap(self, gap: Gap) -> None:
        """Log, count and tell local subscribers of GAP_TOPIC that messages from a producer are lost."""
        self.hub.metrics.event(FederationEvent.GAPS)
        self.hub.metrics.event(FederationEvent.GAP_MESSAGES, gap.lost or 0)
        self.hub.metrics.link_count(gap.producer, LinkCount.GAPS, 1)
        if gap.lost:
            self.hub.metrics.link_count(gap.producer, LinkCount.LOST, gap.lost)
        log.warn(
            "gap in the stream from {peer}: {lost} messages lost ({reason})",
            peer=gap.producer,
            lost="an unknown number of" if gap.lost is None else gap.lost,
            reason=gap.reason,
        )
        now = self._reactor.seconds()
        payload = {"origin": gap.producer, "lost": gap.lost, "reason": gap.reason}
        report = Envelope(GAP_TOPIC, payload, origin=self.node_id, published_at=now)
        self.hub.deliver_remote(report)
        self.relay_gap(report)

    def link_dropped(self, session: LinkSession, error: psc.PSCPayloadError) -> None:
        """A producer sent a PSC301 whose message breaks the JSON bounds: count it, keep the link."""
        peer = session.peer_node or session.peer
        self.hub.metrics.event(FederationEvent.DROPPED_BOUNDS)
        self.hub.metrics.count(
            error.topic, Source.PSC, Kind.DROPPED, 1, session.last_size, peer=peer, reason=DropReason.BOUNDS
        )
        log.warn("dropped a PSC301 from {peer}: {problem}", peer=peer, problem=str(error))

    def link_error(self, session: LinkSession) -> None:
        """Handling a message from ``session`` raised (logged by the transport); the link stays."""
        self.hub.metrics.event(FederationEvent.HANDLER_ERRORS)
        self.hub.metrics.error(Source.PSC, "handler_error")

    def link_received(self, session: LinkSession, message: psc.Publish) -> None:
        """A producer sent a message: deliver it here, never forward it (a batch of one)."""
        self.link_received_batch(session, [message], [session.last_size])

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        """A producer sent PSC301s (one frame's, or one): deliver them here in order, never forward them.

        The one remote-receive path: the counters are added up over the run
        and counted once, with one clock reading for its latencies (the frame
        arrived at once).
        """
        hub = self.hub
        metrics = hub.metrics
        if len(messages) == 1 and self.worker_prefix is None:
            # One message (a paced link's usual frame), not relayed: the steps below in the same order
            # (hold, replay check, delivery, release, counts), without the generator and the dicts.
            message, size = messages[0], sizes[0]
            if session.state is LinkState.CLOSED:
                return
            peer_node = session.peer_node
            # wsframes.hold_writes, without its call (a hold already on is left to its owner).
            holding = wsframes._held is None
            if holding:
                wsframes._held = {}
            counted = False
            origin: str | None = None
            published_at: float | None = None
            now = 0.0
            try:
                meta = message.meta
                if meta is None:
                    envelope = Envelope(message.topic, message.message, peer_node, size=size)
                else:
                    now = self._reactor.seconds()  # before the replay check, as _envelopes reads it
                    inbox = self.inbox
                    if inbox is not None and session.with_replay and meta.seq is not None:
                        peer = peer_node or session.peer
                        skipped = inbox.accept(peer, meta.seq)
                        if skipped:
                            if skipped == DUPLICATE:
                                metrics.event(FederationEvent.DUPLICATES_DROPPED)
                                metrics.link_count(peer, LinkCount.DUPLICATES, 1)
                                return
                            self._report_gap(Gap(peer, skipped, "sequence"))
                    origin = meta.origin or peer_node
                    published_at = meta.published_at
                    envelope = Envelope(
                        message.topic, message.message, origin, published_at, meta.message_id, meta.wamp_wrapped, size,
                        options=meta.options,
                    )  # fmt: skip
                counted = True
                hub.deliver_remote_one(envelope)
            finally:
                if holding:
                    if wsframes._held:
                        release_writes()
                    else:
                        wsframes._held = None
                if counted:
                    metrics.count(message.topic, Source.PSC, Kind.RECEIVED, 1, size, peer=peer_node or session.peer)
                    self._received_n += 1
                    if published_at is not None and origin is not None:
                        metrics.latency(origin, now - published_at)
            return
        received: dict[str, list[int]] = {}
        latencies: dict[str, list[float]] = {}
        envelopes = self._envelopes(session, messages, sizes, received, latencies)
        if self.worker_prefix is not None:  # the primary worker: relayed on as well (relay.py)
            envelopes = self.relayed(session, envelopes)
        # The batch's EVENTs (and other frames written through wsframes.send_held) leave in one
        # write per client connection when its delivery is done, not one write each.
        holding = hold_writes()
        try:
            hub.deliver_remote_batch(envelopes)
        finally:
            if holding:
                release_writes()
            n = 0
            peer = session.peer_node or session.peer
            for topic, (count, nbytes) in received.items():
                n += count
                metrics.count(topic, Source.PSC, Kind.RECEIVED, count, nbytes, peer=peer)
            self._received_n += n  # added to the metrics when they are read (_settle_received)
            for origin, seconds in latencies.items():
                metrics.latencies(origin, seconds)

    def link_received_plain(
        self,
        session: LinkSession,
        topic: str,
        payload: object,
        origin: str,
        published_at: float,
        message_id: str,
        wamp_wrapped: bool,
        seq: int | None,
        size: int,
    ) -> None:
        """A lone PSC301 as its fields (LinkOwner): :meth:`link_received_batch` of it, without Publish and Meta.

        The same steps in the same order as the batch of one (hold, replay
        check, delivery, release, counts); relayed on by a primary worker
        through the batch path itself.
        """
        if self.worker_prefix is not None:
            meta = psc.Meta(origin, published_at, message_id, wamp_wrapped, seq)
            self.link_received_batch(session, [psc.Publish(topic, payload, meta)], [size])
            return
        if session.state is _CLOSED:
            return
        hub = self.hub
        metrics = hub.metrics
        peer_node = session.peer_node
        holding = wsframes._held is None  # wsframes.hold_writes, without its call
        if holding:
            wsframes._held = {}
        counted = False
        source: str | None = None
        now = self._reactor.seconds()  # before the replay check, as _envelopes reads it
        try:
            inbox = self.inbox
            if inbox is not None and session.with_replay and seq is not None:
                peer = peer_node or session.peer
                position = inbox._positions.get(peer)
                if position is not None and position[1] == seq - 1:
                    position[1] = seq  # Inbox.accept's in-order case (it answers 0), without its call
                    skipped = 0
                else:
                    skipped = inbox.accept(peer, seq)
                if skipped:
                    if skipped == DUPLICATE:
                        metrics.event(FederationEvent.DUPLICATES_DROPPED)
                        metrics.link_count(peer, LinkCount.DUPLICATES, 1)
                        return
                    self._report_gap(Gap(peer, skipped, "sequence"))
            source = origin or peer_node
            counted = True
            # hub.deliver_remote_one(Envelope(...)), the envelope made only if something needs it.
            hub.deliver_remote_plain(topic, payload, source, published_at, message_id, wamp_wrapped, size)
        finally:
            if holding:
                # wsframes.release_writes, without its call (once per relayed message: its EVENT's write).
                held = wsframes._held
                wsframes._held = None
                if held:
                    for protocol, (_, frames) in held.items():
                        transport = protocol.transport
                        if transport is not None:
                            transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
            if counted:
                # metrics.count(topic, PSC, RECEIVED, 1, size, peer=...), held back to the next read of the metrics.
                counts = self._received_counts
                key = (topic, peer_node or session.peer)
                cell = counts.get(key)
                if cell is None:
                    if len(counts) >= MAX_HELD_RECEIVED:
                        self._settle_received()  # bounded: ever new topics must not grow the node
                    counts[key] = [1, size]
                else:
                    cell[0] += 1
                    cell[1] += size
                self._received_n += 1
                if source is not None:
                    seconds = now - published_at
                    hist = metrics._interval_latency.get(source)
                    if hist is None:
                        metrics.latency(source, seconds)
                    else:
                        # Metrics.latency, without its call once the interval has a histogram for ``source``.
                        ms = seconds * 1000.0 if seconds > 0.0 else 0.0
                        hist.counts[bisect_left(LATENCY_BOUNDS_MS, ms)] += 1
                        hist.count += 1
                        hist.sum_ms += ms

    def _settle_received(self) -> None:
        """Add the received messages held back since the last read of the metrics (run by ``Metrics.settle``)."""
        n = self._received_n
        if n:
            self._received_n = 0
            self.hub.metrics.event(_RECEIVED, n)
        counts = self._received_counts
        if counts:
            count = self.hub.metrics.count
            for (topic, peer), (n, nbytes) in counts.items():
                count(topic, Source.PSC, Kind.RECEIVED, n, nbytes, peer=peer)
            counts.clear()

    def _envelopes(
        self,
        session: LinkSession,
        messages: list[psc.Publish],
        sizes: list[int],
        received: dict[str, list[int]],
        latencies: dict[str, list[float]],
    ) -> Iterator[Envelope]:
        """:meth:`link_received_batch`'s envelopes, one at a time; stops when the session closes.

        Adds each to ``received`` (topic -> [messages, bytes]) and its latency to ``latencies`` (by origin).
        """
        peer_node = session.peer_node
        peer = peer_node or session.peer
        inbox = self.inbox if session.with_replay else None
        now = self._reactor.seconds()
        closed = LinkState.CLOSED
        for message, size in zip(messages, sizes, strict=True):
            if session.state is closed:
                return
            meta = message.meta
            if meta is None:
                envelope = Envelope(message.topic, message.message, peer_node, size=size)
            else:
                if inbox is not None and meta.seq is not None:
                    skipped = inbox.accept(peer, meta.seq)
                    if skipped:
                        if skipped == DUPLICATE:
                            self.hub.metrics.event(FederationEvent.DUPLICATES_DROPPED)
                            self.hub.metrics.link_count(peer, LinkCount.DUPLICATES, 1)
                            continue
                        self._report_gap(Gap(peer, skipped, "sequence"))
                origin = meta.origin or peer_node
                published_at = meta.published_at
                envelope = Envelope(
                    message.topic, message.message, origin, published_at, meta.message_id, meta.wamp_wrapped, size,
                    options=meta.options,
                )  # fmt: skip
                if published_at is not None and origin is not None:
                    waits = latencies.get(origin)
                    if waits is None:
                        waits = latencies[origin] = []
                    waits.append(now - published_at)
            cell = received.get(message.topic)
            if cell is None:
                received[message.topic] = [1, size]
            else:
                cell[0] += 1
                cell[1] += size
            yield envelope
