"""The primary worker's relay: a node with ``--workers N`` is one node to the cluster.

Part of :class:`~pubsubclub.federation.federation.Federation`, on in the
primary worker only (:meth:`Relay.enable_relay`). Workers 1..N-1 are ordinary
federations whose one peer is the primary, linked over Unix sockets
(pubsubclub/node/workers.py); a plain node never re-forwards what it receives,
so the primary alone relays, with split horizon:

- a message from a worker link goes to the primary's clients, the remote
  consumers and the *other* workers that asked for its topic;
- a message from a remote node goes to the primary's clients and the workers
  that asked for it, never to another remote node;
- the primary asks remote producers for its own topics and its workers', and
  each worker for its own, the other workers' and the remote consumers' topics.

Each message still crosses one hop between nodes: no loops, no duplicates.
Cost: a message between two workers, or between a worker and another node,
crosses one more local socket (and is parsed once more) in the primary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from twisted.internet.address import UNIXAddress
from twisted.logger import Logger

from pubsubclub.core.hub import GAP_TOPIC, Envelope
from pubsubclub.federation import psc
from pubsubclub.federation.session import CLOSE_SELF, LinkState
from pubsubclub.federation.state import FederationState

log = Logger()

if TYPE_CHECKING:
    from pubsubclub.core.patterns import Pattern
    from pubsubclub.federation.replay import Stream
    from pubsubclub.federation.session import LinkSession


class Relay(FederationState):
    """Relaying between a node's workers and the cluster (a part of :class:`Federation`)."""

    if TYPE_CHECKING:
        from pubsubclub.federation.logins import ClusterLogins
        from pubsubclub.federation.retained import ClusterRetained
        from pubsubclub.federation.rpc import ClusterRPC

        rpc: ClusterRPC
        retained: ClusterRetained
        logins: ClusterLogins

        def local_published(self, envelope: Envelope, relayed_from: LinkSession | None = None) -> None:
            """Forward a message to the consumers that asked for its topic (forwarding.py)."""

        def remote_interest(self) -> dict[str, list[str]]:
            """topic -> the peers that asked us for it (interest.py)."""

        def add_remote_topics_listener(self, listener: Any) -> None:
            """Call ``listener()`` when other nodes' interest may have changed (interest.py)."""

    def enable_relay(self, worker_prefix: str, unlisted: set[str]) -> None:
        """Relay for workers named ``<worker_prefix><index>``; ``unlisted``: their URLs, never told to peers."""
        self.worker_prefix = worker_prefix
        self.unlisted = unlisted
        self.add_remote_topics_listener(self._remote_changed)
        # Registrations and retained events cross the node's links with the same split horizon.
        self.rpc.relaying = True
        self.retained.relaying = True
        self.logins.relaying = True

    def is_worker_name(self, name: str | None) -> bool:
        """Whether ``name`` is one of this node's workers' node ids."""
        prefix = self.worker_prefix
        return prefix is not None and name is not None and name.startswith(prefix) and name[len(prefix) :].isdigit()

    def mark_worker(self, session: LinkSession, transport: Any) -> bool:
        """Mark ``session`` as a worker link: a worker's node id, over a Unix socket (the 0700 folder).

        False when the link must close: a peer that names itself one of our
        workers over anything else (it would otherwise supersede the real
        worker's link as "the same node dialling again").
        """
        if self.worker_prefix is None or not self.is_worker_name(session.peer_node):
            return True
        host = getattr(getattr(transport, "transport", None), "getHost", lambda: None)()
        session.worker = isinstance(host, UNIXAddress)
        if not session.worker:
            log.warn(
                "refused a PSC link from {peer}: it names itself {node}, one of this node's workers",
                peer=session.peer,
                node=session.peer_node,
            )
            if transport is not None:
                transport.close_link(CLOSE_SELF, f"node id {session.peer_node} belongs to one of this node's workers")
        return session.worker

    # -- the meta API: nodes a cluster-wide question could not reach ----------------

    def unasked_nodes(self, asked: set[str], source: LinkSession | None = None) -> dict[str, str]:
        """Nodes this node knows of that a meta query asked of ``asked`` leaves out: name -> why.

        Known: every server it dials (static peers, discovery, learned; named
        by the node id its link last gave, else by URL until a first
        handshake) and every node linked to it in either role. Left out: those
        not in ``asked`` (no open 0.7 link on which they are the producer).
        ``source``: the link a relayed query came over (a relaying primary
        answers for what split horizon gives that asker), None for our own
        clients. docs/architecture.md, "Meta API".
        """
        found: dict[str, str] = {}

        def reaches(name: str, worker: bool) -> bool:
            if name in asked or name == self.node_id:
                return False
            if source is None:
                return True
            if source.worker:
                return name != source.peer_node
            return worker

        for url, server in self._servers.items():
            name = server.node or url
            worker = url in self.unlisted or self.is_worker_name(server.node)
            if not reaches(name, worker):
                continue
            if server.node is None:
                last = f": {server.last_failure}" if server.last_failure else ""
                found[name] = f"not linked yet (dialling {url}{last})"
            elif server.link is None or server.link.session.state is not LinkState.OPEN:
                found[name] = f"its link ({url}) is down"
        for session in self._links:
            peer = session.peer_node
            if peer is None or peer in found or session.state is not LinkState.OPEN:
                continue
            if reaches(peer, bool(session.worker)):
                found[peer] = "linked, but on no open link where it answers queries (PSC 0.7+, it the producer)"
        return found

    # -- interest -----------------------------------------------------------------

    def relay_wanted(self, producer: LinkSession) -> set[str]:
        """What to ask ``producer`` for: our clients' topics, and those of consumers it does not reach itself.

        A worker reaches no one but us: it is asked for every topic someone
        else (a remote node, another worker) asked us for. A remote node
        reaches the other nodes itself: it is asked for our workers' topics.
        """
        wanted = {topic for topic in self.hub.topics() if topic != GAP_TOPIC}
        for topic, peers in self.remote_interest().items():
            if topic in wanted or topic == GAP_TOPIC:
                continue
            if producer.worker:
                if any(peer != producer.peer_node for peer in peers):
                    wanted.add(topic)
            elif any(self.is_worker_name(peer) for peer in peers):
                wanted.add(topic)
        return wanted

    def relay_wanted_patterns(self, producer: LinkSession) -> set[Pattern]:
        """The patterns (PSC 0.5) to ask ``producer`` for, as :meth:`relay_wanted` for topics.

        At most ``max-patterns-per-peer``: ours first, then our consumers'.
        """
        wanted = set(self._announced)
        limit = self.limits.max_patterns_per_peer
        if self.outbox is None:
            return wanted
        for pattern, peers in self.outbox.pattern_interest().items():
            if len(wanted) >= limit:
                break
            if pattern in wanted:
                continue
            if producer.worker:
                if any(peer != producer.peer_node for peer in peers):
                    wanted.add(pattern)
            elif any(self.is_worker_name(peer) for peer in peers):
                wanted.add(pattern)
        return wanted

    def relay_patterns(self, producer: LinkSession) -> tuple[Pattern, ...]:
        """The patterns of a new 0.5 consumer link's PSC103 (remembered as sent)."""
        wanted = self.relay_wanted_patterns(producer)
        self._relay_sent_patterns[producer] = wanted
        return tuple(wanted)

    def relay_topics(self, producer: LinkSession) -> list[str]:
        """The topics of a new consumer link's first PSC201/PSC103 (remembered as sent)."""
        wanted = self.relay_wanted(producer)
        self._relay_sent[producer] = wanted
        return sorted(wanted)

    def _remote_changed(self) -> None:
        """Consumers' interest changed: in the hinted topics only (a PSC201/202), else anywhere (links, streams)."""
        hint, self._relay_hint = self._relay_hint, None
        if hint is None:
            self.sync_relay_interest()
        else:
            self.sync_relay_topics(hint)

    def relay_wants(self, producer: LinkSession, topic: str) -> bool:
        """:meth:`relay_wanted` for one topic: a look at its own subscribers and consumers, not the whole interest."""
        if topic == GAP_TOPIC:
            return False
        if self.hub.subscribers(topic):
            return True
        peers = [s.peer_node or s.peer for s in self._by_topic.get(topic, ())]
        if self.outbox is not None:
            streams = self.outbox.streams_for(topic) or ()
            peers += [stream.consumer or "?" for stream in streams if topic in stream.topics]
        if producer.worker:
            return any(peer != producer.peer_node for peer in peers)
        return any(self.is_worker_name(peer) for peer in peers)

    def sync_relay_topics(self, topics: tuple[str, ...]) -> None:
        """:meth:`sync_relay_interest` for ``topics`` only: what a subscribe or unsubscribe changes, in O(topics)."""
        for session in self._producers:
            told = self._relay_sent.get(session)
            if told is None:
                continue  # its link is opening: its first message carries the whole set
            added = []
            for topic in topics:
                if self.relay_wants(session, topic):
                    if topic not in told:
                        told.add(topic)
                        added.append(topic)
                elif topic in told:
                    told.discard(topic)
                    session.send(psc.Unsubscribe(topic))
            if added:
                session.send(psc.Subscribe(tuple(added)))

    def sync_relay_interest(self) -> None:
        """Tell every producer what it is now asked for, as PSC201/PSC202 differences from what it was told.

        Runs when links, streams or patterns change (rarely): a walk of the
        node's whole interest per producer, off the message path. A subscribe
        or unsubscribe (ours or a consumer's) takes :meth:`sync_relay_topics`.
        """
        sent = self._relay_sent
        for session in [s for s in sent if s not in self._producers]:
            del sent[session]
        for session in self._producers:
            told = sent.get(session)
            if told is None:
                continue  # its link is opening: its first message carries the whole set
            wanted = self.relay_wanted(session)
            added = wanted - told
            if added:
                session.send(psc.Subscribe(tuple(sorted(added))))
            for topic in told - wanted:
                session.send(psc.Unsubscribe(topic))
            sent[session] = wanted
        sent_patterns = self._relay_sent_patterns
        for session in [s for s in sent_patterns if s not in self._producers]:
            del sent_patterns[session]
        for session in self._producers:
            told_patterns = sent_patterns.get(session)
            if told_patterns is None or not session.with_patterns:
                continue
            wanted_patterns = self.relay_wanted_patterns(session)
            for pattern in told_patterns - wanted_patterns:
                session.send(psc.UnsubscribePattern(pattern))
            for pattern in wanted_patterns - told_patterns:
                session.send(psc.SubscribePattern(pattern))
            sent_patterns[session] = wanted_patterns

    # -- messages -------------------------------------------------------------------

    def relayed(self, session: LinkSession, envelopes: Iterator[Envelope]) -> Iterator[Envelope]:
        """``envelopes`` received on ``session``, each forwarded on (split horizon) once delivered here."""
        for envelope in envelopes:
            yield envelope
            self.local_published(envelope, session)

    def relay_gap(self, envelope: Envelope) -> None:
        """A gap report this primary made (another node's stream): to the workers that asked, never to a node."""
        if self.worker_prefix is not None:
            self.local_published(envelope, _FROM_A_NODE)  # type: ignore[arg-type]

    def relay_targets(
        self,
        origin: LinkSession,
        sessions: dict[LinkSession, None] | None,
        streams: dict[Stream, None] | None,
    ) -> tuple[dict[LinkSession, None] | None, dict[Stream, None] | None]:
        """Of the consumers of a message received on ``origin``, those it is relayed to (split horizon)."""
        if origin.worker:
            source = origin.peer_node
            kept = {s: None for s in sessions or () if s.peer_node != source}
            kept_streams = {s: None for s in streams or () if s.consumer != source}
        else:
            kept = {s: None for s in sessions or () if s.worker}
            kept_streams = {s: None for s in streams or () if self._worker_stream(s)}
        return kept, kept_streams

    def _worker_stream(self, stream: Stream) -> bool:
        link = stream.link
        if link is not None:
            return bool(link.worker)
        return self.is_worker_name(stream.consumer)


class _FromANode:
    """The origin :meth:`Relay.relay_gap` names: another node's link (split horizon then keeps the workers only)."""

    worker = False
    peer_node = None


_FROM_A_NODE = _FromANode()
