"""The federation's forwarding: a local publish to every consumer that asked for its topic.

Part of :class:`~pubsubclub.federation.federation.Federation`: each
message's PSC301 is made once (``Envelope.wire``), measured against the link
limit before the front-end acknowledges it, sent on 0.1/0.2 links and
numbered by the replay :class:`~pubsubclub.federation.replay.Outbox` for 0.3
streams; sent here and counted once per read of the metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from twisted.logger import Logger

from pubsubclub.core.counters import DropReason, FederationEvent, Kind, Source
from pubsubclub.core.hub import Envelope
from pubsubclub.core.metrics import payload_size
from pubsubclub.federation import psc
from pubsubclub.federation.replay import Stream
from pubsubclub.federation.session import (
    LinkSession,
    LinkState,
)
from pubsubclub.federation.state import FederationState

log = Logger()
# Counted per message: bound once, as reading a member off its enum class costs more than the count.
_FORWARDED = FederationEvent.FORWARDED


#: Most (topic, link) forward counts held back between reads of the metrics; past it they are added at once.
MAX_HELD_COUNTS = 1024


#: How many times larger a message's JSON may be than the client's bytes for it: MessagePack's
#: one-byte ``false`` or control character is six bytes of JSON (``false,``, ``\u0001``); JSON's
#: ``1e15`` becomes ``1000000000000000.0``. Below the bound a publish needs no check (``unchecked_below``).
MAX_REENCODING_GROWTH = 6


#: Bytes a PSC301 may add around the re-encoded message: topic, origin, time, message id, JSON.
PSC_OVERHEAD_ALLOWANCE = 8 * 1024


#: Room for the sequence number a 0.3 stream adds to a PSC301's metadata (``,"s":<integer>``).
SEQ_ALLOWANCE = 32


#: ``Envelope.wire`` key of a local publish's PSC301 with metadata, made once (the size check, then forwarding).
_PSC_RICH = "psc301"


#: ``Envelope.wire`` key of the same in the 0.6 binary form, for a message holding bytes (0.6 links only).
_PSC_BINARY = "psc301-binary"


class Forwarding(FederationState):
    """Forwarding local publishes over the links (a part of :class:`Federation`)."""

    def forwards(self, topic: str) -> bool:
        """Whether a local publish on ``topic`` would go to some other node (a consumer or replay stream wants it)."""
        outbox = self.outbox
        return bool(self._by_topic.get(topic)) or (outbox is not None and outbox.wants(topic))

    if TYPE_CHECKING:

        def relay_targets(
            self, origin: LinkSession, sessions: dict[LinkSession, None] | None, streams: dict[Stream, None] | None
        ) -> tuple[dict[LinkSession, None] | None, dict[Stream, None] | None]:
            """Relay: the consumers a message received on ``origin`` goes on to (relay.py)."""

    def forward_problem(self, envelope: Envelope) -> str | None:
        """Why a local publish cannot cross the links (its PSC301 is over the link frame limit), or None.

        Front-ends ask (through :meth:`Hub.refusal`) before they acknowledge.
        The PSC301 made here is kept on the envelope and sent as it is.
        """
        try:
            rich = self._rich(envelope)
        except TypeError:
            try:
                rich = self._rich_binary(envelope)  # bytes measured as they cross: "\0" + base64
            except TypeError:
                return None  # not JSON even so (non-string keys): never forwarded (dropped, not_json)
        size = len(rich) + SEQ_ALLOWANCE
        limits = self.limits
        if size <= limits.max_link_frame:
            return None
        return (
            f"message is {size} bytes as a PSC301, over the link limit of {limits.max_link_frame} bytes"
            f" (max-message-size {limits.max_message_size} + link-headroom {limits.link_headroom})"
        )

    @staticmethod
    def _rich(envelope: Envelope) -> bytes:
        """``envelope``'s PSC301 with metadata (0.2 and later), made once per message.

        Raises TypeError when the message is not JSON (bytes in it: see :meth:`_rich_binary`).
        """
        wire = envelope.wire
        rich: bytes | None = wire.get(_PSC_RICH)
        if rich is None:
            rich = wire[_PSC_RICH] = psc.encode_publish_meta(
                envelope.topic, envelope.payload, envelope.origin, envelope.published_at, envelope.message_id,
                envelope.wamp_wrapped, options=envelope.options,
            )  # fmt: skip
        return rich

    def _rich_options(self, envelope: Envelope) -> bytes:
        """The 0.6 PSC301 of a message with WAMP publish options (``"p"``), with ``"b": 1`` too if it holds bytes."""
        try:
            return self._rich(envelope)
        except TypeError:
            return self._rich_binary(envelope)

    @staticmethod
    def _rich_binary(envelope: Envelope) -> bytes:
        """``envelope``'s PSC301 in the 0.6 binary form (``"b": 1``), made once; only after :meth:`_rich` refused it.

        Raises TypeError when the message is not JSON even with its bytes
        written as ``"\0"`` + base64 (e.g. MessagePack maps with non-string keys).
        """
        wire = envelope.wire
        rich: bytes | None = wire.get(_PSC_BINARY)
        if rich is None:
            rich = wire[_PSC_BINARY] = psc.encode_publish_meta(
                envelope.topic, envelope.payload, envelope.origin, envelope.published_at, envelope.message_id,
                envelope.wamp_wrapped, binary=True, options=envelope.options,
            )  # fmt: skip
        return rich

    def local_published(self, envelope: Envelope, relayed_from: LinkSession | None = None) -> None:
        """Forward a local publish to each consumer that asked for its topic.

        Counted as forwarded in :attr:`_forwarded`, added to the metrics before
        any read of them (:meth:`_settle`): the same totals, no per-message call.
        ``relayed_from``: the primary worker relays a message received on that
        link, to the consumers split horizon leaves (federation/relay.py).
        """
        topic = envelope.topic
        outbox = self.outbox
        if (
            relayed_from is None
            and outbox is not None
            and envelope.options is None
            and not envelope.wamp_wrapped
            and not outbox._patterns._holders
            and topic not in self._by_topic
        ):
            # The common case, in one call: a plain local publish, only 0.3+ streams take its topic
            # (exactly: no stream pattern held, no link without replay wants it). What streams_for,
            # _rich, seq_template and _send do, without their calls; anything else: the general path.
            streams = outbox._by_topic.get(topic)
            if not streams:
                return
            origin, published_at, message_id = envelope.origin, envelope.published_at, envelope.message_id
            wire = envelope.wire
            known = wire.get(_PSC_RICH)
            if known is None and origin is not None and published_at is not None and message_id is not None:
                # encode_publish_meta's bytes for these fields (same keys, same order).
                try:
                    known = orjson.dumps([psc.PUBLISH, topic, envelope.payload, {"o": origin, "t": published_at,
                                                                                "i": message_id}])  # fmt: skip
                except TypeError:  # not JSON (bytes in it): nothing sent yet
                    self._forward_binary(envelope, None, streams)
                    return
                wire[_PSC_RICH] = known
            if known is not None and known.find(b"%") < 0 and known[-3:-2] != b"{":
                self._forward_known(topic, known, streams)
                return
        sessions = self._by_topic.get(topic)
        streams = None if outbox is None else outbox.streams_for(topic)
        if not sessions and not streams:
            return
        if relayed_from is not None:
            sessions, streams = self.relay_targets(relayed_from, sessions, streams)
            if not sessions and not streams:
                return
        plain: bytes | None = None
        rich: bytes | None = None
        forwarded = self._forwarded
        if len(forwarded) >= MAX_HELD_COUNTS:
            self._settle()  # bounded: publishing on ever new topics must not grow the node
        if envelope.options is not None:
            # WAMP publish options (PSC 0.6 "p"): only links that apply them get the message.
            self._forward_binary(envelope, sessions, streams)
            return
        sent = 0
        try:
            if streams:
                assert outbox is not None
                rich = self._rich(envelope)
                sent = self._send(topic, outbox.forward(psc.seq_template(rich), streams))
            for session in sessions or ():
                if session.with_metadata:
                    if rich is None:
                        rich = self._rich(envelope)
                    data = rich
                else:
                    if plain is None:
                        plain = psc.encode_publish(topic, envelope.payload)
                    data = plain
                session.send_raw(data)
                cell = forwarded.get((topic, session))
                if cell is None:
                    cell = forwarded[(topic, session)] = [0, 0]
                cell[0] += 1
                cell[1] += len(data)
                sent += 1
        except TypeError:  # orjson: the payload is not JSON (bytes in it); raised before anything was sent
            self._forward_binary(envelope, sessions, streams)
            return
        self._forwarded_n += sent

    def local_published_plain(
        self, topic: str, payload: Any, origin: str, published_at: float, message_id: str
    ) -> bool:
        """:meth:`local_published` of a plain local publish given as its fields (:meth:`Hub.publish_plain`).

        Its common case (only 0.3+ streams take the topic: no stream pattern
        held, no link without replay wants it) without an envelope: the PSC301
        made from the fields and numbered per stream. Anything else answers
        False, with nothing sent: the hub makes the envelope and calls
        :meth:`local_published`.
        """
        outbox = self.outbox
        if outbox is None or outbox._patterns._holders or topic in self._by_topic:
            return False
        streams = outbox._by_topic.get(topic)
        if not streams:
            return True  # no other node takes it
        try:  # encode_publish_meta's bytes for these fields (same keys, same order)
            known = orjson.dumps([psc.PUBLISH, topic, payload, {"o": origin, "t": published_at, "i": message_id}])
        except TypeError:  # not JSON (bytes in it): the binary form, the envelope's path
            return False
        # find, not ``in``: bytes ``in`` raises and clears a TypeError per check (wamp transport.py, _NUL_ESCAPE).
        if known.find(b"%") >= 0 or known[-3:-2] == b"{":
            return False  # seq_template's escaping: the envelope's path
        # _forward_known and _send, without their calls (once per published message).
        forwarded = self._forwarded
        if len(forwarded) >= MAX_HELD_COUNTS:
            self._settle()  # bounded: publishing on ever new topics must not grow the node
        open_ = LinkState.OPEN
        sends = outbox.forward(known[:-2] + b',"s":%d}]', streams)
        for link, data in sends:
            if link.state is open_:  # LinkSession.send_raw, without its call
                link._send(data)
            cell = forwarded.get((topic, link))
            if cell is None:
                cell = forwarded[(topic, link)] = [0, 0]
            cell[0] += 1
            cell[1] += len(data)
        self._forwarded_n += len(sends)
        return True

    def _forward_known(self, topic: str, known: bytes, streams: Any) -> None:
        """Number the PSC301 ``known`` (no ``%``, metadata last) for ``streams``, send it on open links, count it.

        What streams_for, _rich and seq_template do for the common plain publish, in one call.
        """
        if len(self._forwarded) >= MAX_HELD_COUNTS:
            self._settle()  # bounded: publishing on ever new topics must not grow the node
        sends = self.outbox.forward(known[:-2] + b',"s":%d}]', streams)  # type: ignore[union-attr]
        self._forwarded_n += self._send(topic, sends)

    def _send(self, topic: str, sends: list[tuple[Any, bytes]]) -> int:
        """Send what the outbox numbered for its streams' links; add each to :attr:`_forwarded`; how many were sent."""
        forwarded = self._forwarded
        open_ = LinkState.OPEN
        for link, data in sends:
            if link.state is open_:  # LinkSession.send_raw, without its call
                link._send(data)
            cell = forwarded.get((topic, link))
            if cell is None:
                cell = forwarded[(topic, link)] = [0, 0]
            cell[0] += 1
            cell[1] += len(data)
        return len(sends)

    def _forward_binary(
        self, envelope: Envelope, sessions: dict[LinkSession, None] | None, streams: dict[Stream, None] | None
    ) -> None:
        """:meth:`local_published` for a message holding bytes or WAMP publish options: to 0.6 links only.

        Older links (below 0.6: ``sessions`` all are, and streams whose
        consumer did not speak 0.6) cannot carry it and are counted as
        dropped (``not_json``), as is everyone when it is not JSON even so.
        """
        topic = envelope.topic
        try:
            binary = self._rich_binary(envelope) if envelope.options is None else self._rich_options(envelope)
        except TypeError as e:
            takers: dict[Stream, None] = {}
            error = str(e)
        else:
            takers = {stream: None for stream in streams or () if stream.binary}
            error = "binary values or publish options, and the link is older than PSC 0.6"
        missed = len(sessions or ()) + len(streams or ()) - len(takers)
        if takers:
            assert self.outbox is not None
            self._forwarded_n += self._send(topic, self.outbox.forward(psc.seq_template(binary), takers))
        if missed:
            self.hub.metrics.event(FederationEvent.DROPPED_NOT_JSON)
            self.hub.metrics.count(
                topic, Source.PSC, Kind.DROPPED, missed, payload_size(envelope), reason=DropReason.NOT_JSON
            )
            log.warn(
                "not forwarding a message on {topic} to {missed} links: payload is not JSON ({error})",
                topic=topic,
                missed=missed,
                error=error,
            )

    def _settle(self) -> None:
        """Add the forwards held back since the last read of the metrics (run by ``Metrics.settle``)."""
        metrics = self.hub.metrics
        n = self._forwarded_n
        if n:
            self._forwarded_n = 0
            metrics.event(_FORWARDED, n)
        forwarded = self._forwarded
        if forwarded:
            for (topic, session), (count, nbytes) in forwarded.items():
                metrics.count(topic, Source.PSC, Kind.FORWARDED, count, nbytes, peer=session.peer_node or session.peer)
            forwarded.clear()  # in place: a read in the middle of local_published leaves its reference valid
