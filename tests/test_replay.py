"""PSC 0.3, replay after short outages: codec, the sans-IO streams, and links between Federations in memory.

The federation tests run on :class:`pubsubclub.testing.MemoryNetwork` (real
Autobahn protocols over iosim on one MemoryReactorClock). A partition is
modelled by :func:`pubsubclub.testing.partition`: nothing crosses the link any
more and the dialling consumer finds out only by its ping timeout, while the
producer keeps a ghost link it never hears about, as over a real network that
drops packets silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from twisted.logger import formatEvent, globalLogPublisher

from pubsubclub.config import ConfigError, build, load_toml
from pubsubclub.core.hub import GAP_TOPIC, Envelope
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation import Federation, LinkError, LinkSession, Role, psc
from pubsubclub.federation.psc import Meta, Position, PSCDecodeError, Publish, Resume, decode, encode
from pubsubclub.federation.replay import DUPLICATE, Inbox, Outbox, ReplaySettings
from pubsubclub.federation.session import CLOSE_BAD_MESSAGE, CLOSE_DUPLICATE
from pubsubclub.frontends.wamp.broker import GAP_EVENT_TOPIC, hub_topic
from pubsubclub.testing import Cut, MemoryLink, MemoryNetwork, RecordingSink, no_logged_errors, partition, psc_url

PING = MemoryNetwork.ping_interval
RETRY = MemoryNetwork.retry
REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)

# -- codec ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "wire"),
    [
        (Resume(None, 0, ()), b"[103,null,0,[]]"),
        (Resume("ab12-1", 42, ("t1", "t2")), b'[103,"ab12-1",42,["t1","t2"]]'),
        (Position("ab12-1", 42, 0), b'[104,"ab12-1",42,0]'),
        (Position("ab12-2", 0, None), b'[104,"ab12-2",0,null]'),
        (Publish("t", 1, Meta(origin="n1", seq=7)), b'[301,"t",1,{"o":"n1","s":7}]'),
    ],
)
def test_0_3_messages_have_exact_bytes_and_round_trip(message: psc.Message, wire: bytes) -> None:
    """PSC103, PSC104 and a numbered PSC301 encode to the documented arrays and decode back."""
    assert encode(message) == wire
    assert decode(wire) == message


@given(
    st.text(min_size=1, max_size=8),
    st.integers(0, 2**53 - 2),
    st.one_of(st.none(), st.builds(Meta, origin=st.none() | st.text(max_size=5), wamp_wrapped=st.booleans())),
)
def test_with_seq_appends_the_number_to_the_0_2_encoding(topic: str, seq: int, meta: Meta | None) -> None:
    """with_seq turns the 0.2 bytes into the 0.3 PSC301 carrying 's', whatever the metadata held."""
    meta = meta or Meta()
    data = psc.with_seq(psc.encode_publish(topic, [1], meta), seq + 1)
    decoded = decode(data)
    assert isinstance(decoded, Publish) and decoded.meta is not None
    assert decoded.meta.seq == seq + 1
    assert decoded == Publish(topic, [1], Meta(meta.origin, None, None, meta.wamp_wrapped, seq + 1))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"[103,null,0]", "PSC103 takes 3 parameters (4 with patterns), got 2"),
        (b'[103,null,0,"t"]', "PSC103 topics must be an array, got str"),
        (b"[103,null,5,[]]", "PSC103 without an epoch must have sequence number 0"),
        (b"[103,null,false,[]]", "PSC103 without an epoch must have sequence number 0"),
        (b'[103,"",0,[]]', "PSC103 epoch must be a non-empty string"),
        (b"[103,7,0,[]]", "PSC103 epoch must be a non-empty string"),
        (b'[103,"' + b"e" * 65 + b'",0,[]]', "PSC103 epoch of 65 characters is over the limit of 64"),
        (b'[103,"e",-1,[]]', "PSC103 sequence number must be an integer between 0 and 2**53-1"),
        (b'[103,"e",1.5,[]]', "PSC103 sequence number must be an integer"),
        (b'[103,"e",9007199254740992,[]]', "PSC103 sequence number must be an integer"),
        (b'[103,"e",1,[""]]', "topic must not be empty"),
        (b'[103,"e",1,[5]]', "topic must be a string, got int"),
        (b'[104,"e",1]', "PSC104 takes 3 parameter(s), got 2"),
        (b'[104,"e",1,-1]', "PSC104 lost count must be an integer"),
        (b'[104,"e",true,0]', "PSC104 sequence number must be an integer"),
        (b"[104,null,1,0]", "PSC104 epoch must be a non-empty string"),
        (b'[301,"t",1,{"s":0}]', "'s' (sequence number) must be an integer between 1 and 2**53-1"),
        (b'[301,"t",1,{"s":"1"}]', "'s' (sequence number) must be an integer"),
        (b'[301,"t",1,{"s":true}]', "'s' (sequence number) must be an integer"),
    ],
)
def test_bad_0_3_input_names_the_problem(data: bytes, problem: str) -> None:
    """Every malformed PSC103/PSC104/sequence number raises PSCDecodeError naming the problem."""
    with pytest.raises(PSCDecodeError) as info:
        decode(data)
    assert problem in str(info.value)


def test_psc103_topic_count_is_limited() -> None:
    """PSC103 carries at most max_topics_per_subscribe topics, like PSC201."""
    limits = psc.Limits(max_topics_per_subscribe=2)
    assert decode(b'[103,null,0,["a","b"]]', limits) == Resume(None, 0, ("a", "b"))
    with pytest.raises(PSCDecodeError, match="PSC103 with 3 topics is over the limit of 2"):
        decode(b'[103,null,0,["a","b","c"]]', limits)


# -- the sans-IO streams ----------------------------------------------------------


@dataclass(eq=False)
class Pipe:
    """One direction of a link in the model: what the producer sent and the consumer has not read."""

    peer: str = "consumer"
    peer_node: str | None = "consumer"
    inflight: list[bytes] = field(default_factory=list)

    def send_raw(self, data: bytes) -> None:
        """The producer writes ``data``."""
        self.inflight.append(data)


class Model:
    """A producer Outbox and a consumer Inbox joined by Pipes, with a settable clock."""

    def __init__(self, settings: ReplaySettings) -> None:
        self.now = 0.0
        self.outbox = Outbox(settings, lambda: self.now, boot="p")
        self.inbox = Inbox()
        self.published: list[int] = []
        self.delivered: list[int] = []
        #: Lost counts of the reported gaps (None: unknown).
        self.gaps: list[int | None] = []
        self.pipe: Pipe | None = None
        self._n = 0

    def connect(self) -> None:
        """A new link: PSC103 from the consumer's position, PSC104 and the replay back."""
        epoch, seq = self.inbox.position("producer")
        request = decode(encode(Resume(epoch, seq, ("t",))))
        assert isinstance(request, Resume)
        self.pipe = Pipe()
        plan = self.outbox.resume(self.pipe, "consumer", request)
        answer = decode(encode(plan.position))
        assert isinstance(answer, Position)
        gap = self.inbox.positioned("producer", answer)
        if gap is not None:
            self.gaps.append(gap.lost)
        self.pipe.inflight[:0] = plan.replay

    def publish(self) -> None:
        """The producer publishes the next number on ``t``."""
        self._n += 1
        self.published.append(self._n)
        for link, data in self.outbox.publish("t", psc.encode_publish("t", self._n, Meta(origin="producer"))):
            link.send_raw(data)

    def read(self, k: int) -> None:
        """The consumer reads up to ``k`` messages from the current link."""
        if self.pipe is None:
            return
        batch, self.pipe.inflight[:k] = self.pipe.inflight[:k], []
        for data in batch:
            message = decode(data)
            assert isinstance(message, Publish) and message.meta is not None and message.meta.seq is not None
            skipped = self.inbox.accept("producer", message.meta.seq)
            if skipped == DUPLICATE:
                continue
            if skipped:
                self.gaps.append(skipped)
            self.delivered.append(message.message)

    def drop(self, producer_notices: bool) -> None:
        """The link dies: what was in flight is lost; the producer may not notice (a ghost)."""
        if self.pipe is not None:
            if producer_notices:
                self.outbox.detach(self.pipe)
            self.pipe.inflight.clear()
            self.pipe = None


operations = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 5)),
        st.tuples(st.just("read"), st.integers(0, 6)),
        st.tuples(st.just("drop"), st.booleans()),
        st.tuples(st.just("connect"), st.just(0)),
        st.tuples(st.just("wait"), st.floats(0, 4)),
    ),
    max_size=60,
)


def _run(model: Model, ops: list[tuple[str, Any]]) -> None:
    model.connect()
    for op, arg in ops:
        if op == "publish":
            for _ in range(arg):
                model.publish()
        elif op == "read":
            model.read(arg)
        elif op == "drop":
            model.drop(arg)
        elif op == "connect":
            model.drop(False)
            model.connect()
        else:
            model.now += arg
    model.drop(False)
    model.connect()
    model.read(10**6)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_outages_within_the_window_lose_and_duplicate_nothing(ops: list[tuple[str, Any]]) -> None:
    """Whatever the drops and reconnects, with room in the buffer every message arrives once, in order."""
    model = Model(ReplaySettings(max_bytes=10**9, window=1000.0))
    _run(model, ops)
    assert model.delivered == model.published
    assert model.gaps == []


@settings(max_examples=300, deadline=None)
@example([("publish", 1), ("read", 1), ("drop", True), ("wait", 4.0)], 600, 1.0)
@given(operations, st.integers(60, 600), st.floats(1, 30))
def test_past_the_window_every_loss_is_counted(ops: list[tuple[str, Any]], max_bytes: int, window: float) -> None:
    """With small buffers messages go missing, but in order, never twice, and reported gaps add up to the loss."""
    model = Model(ReplaySettings(max_bytes=max_bytes, window=window))
    _run(model, ops)
    delivered = model.delivered
    assert delivered == sorted(set(delivered))
    assert set(delivered) <= set(model.published)
    known = sum(g for g in model.gaps if g is not None)
    if None in model.gaps:  # a gap of unknown size (the stream outlived the window): at most that many
        assert len(delivered) + known <= len(model.published)
    else:
        assert len(delivered) + known == len(model.published)


def test_resume_from_a_position_never_sent_is_refused() -> None:
    """A consumer claiming a sequence number past the last one sent is refused (ResumeRefused)."""
    from pubsubclub.federation.replay import ResumeRefused

    model = Model(REPLAY)
    model.connect()
    model.publish()
    assert model.pipe is not None
    epoch = model.outbox.resume(model.pipe, "consumer", Resume(None, 0, ("t",))).position.epoch
    with pytest.raises(ResumeRefused, match="PSC103 position 5 is past the last sequence number sent, 0"):
        model.outbox.resume(Pipe(), "consumer", Resume(epoch, 5, ("t",)))


def test_detached_streams_are_dropped_after_the_window_and_past_the_count_limit() -> None:
    """A consumer without a link keeps its stream for the window only; the oldest go first past the limit."""
    now = [0.0]
    outbox = Outbox(ReplaySettings(window=10.0, max_detached_streams=2), lambda: now[0], boot="p")
    pipes = {name: Pipe(peer=name, peer_node=name) for name in ("c1", "c2", "c3")}
    for name, pipe in pipes.items():
        outbox.resume(pipe, name, Resume(None, 0, ("t",)))
    outbox.publish("t", psc.encode_publish("t", 1, Meta()))
    for name in ("c1", "c2", "c3"):
        now[0] += 1
        outbox.detach(pipes[name])
    assert outbox.summary()["streams"] == 2  # c1, the oldest without a link, went first
    assert outbox.interest() == {"t": ["c2", "c3"]}
    now[0] += 9.5  # c2 has been without a link for 10.5 s, c3 for 9.5 s
    outbox.publish("t", psc.encode_publish("t", 2, Meta()))
    assert outbox.interest() == {"t": ["c3"]}
    now[0] += 1
    outbox.publish("t", psc.encode_publish("t", 3, Meta()))
    assert outbox.interest() == {} and outbox.summary()["streams"] == 0
    assert outbox.summary()["streams_expired"] == 3


def test_kept_messages_are_trimmed_to_the_byte_limit_and_the_window_and_counted() -> None:
    """Each stream keeps at most max_bytes and the window's messages; every one trimmed is counted once."""
    now = [0.0]
    one = len(psc.with_seq(psc.encode_publish("t", 1, Meta()), 1))
    outbox = Outbox(ReplaySettings(max_bytes=3 * one + 2, window=10.0), lambda: now[0], boot="p")
    pipes = [Pipe(peer=name, peer_node=name) for name in ("c1", "c2")]
    for pipe in pipes:
        outbox.resume(pipe, pipe.peer_node, Resume(None, 0, ("t",)))
    for i in range(1, 8):
        outbox.publish("t", psc.encode_publish("t", i, Meta()))
    assert outbox.summary()["kept_messages"] == 2 * 3 and outbox.summary()["trimmed"] == 2 * 4
    now[0] += 10.5  # all kept messages are now past the window: the next publish trims them
    outbox.publish("t", psc.encode_publish("t", 8, Meta()))
    assert outbox.summary()["kept_messages"] == 2 and outbox.summary()["trimmed"] == 2 * 7
    assert outbox.summary()["kept_bytes"] == 2 * one


def test_anonymous_consumer_stream_ends_with_its_link() -> None:
    """A consumer that sent no node id cannot be recognised later: its stream goes with its link."""
    outbox = Outbox(REPLAY, lambda: 0.0, boot="p")
    pipe = Pipe(peer_node=None)
    outbox.resume(pipe, None, Resume(None, 0, ("t",)))
    one = psc.encode_publish("t", 1, Meta())
    assert outbox.publish("t", one) == [(pipe, psc.with_seq(one, 1))]
    outbox.detach(pipe)
    assert outbox.summary()["streams"] == 0 and not outbox.wants("t")


def test_inbox_forgets_the_least_recent_producer_past_its_limit() -> None:
    """The consumer remembers at most max_positions producers."""
    inbox = Inbox(max_positions=2)
    for name in ("p1", "p2", "p3"):
        inbox.positioned(name, Position(f"{name}-1", 5, 0))
    assert inbox.position("p1") == (None, 0)
    assert inbox.position("p3") == ("p3-1", 5)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"max_bytes": 0}, "max_bytes"),
        ({"window": 0}, "window"),
        ({"max_detached_streams": 0}, "max_detached_streams"),
        ({"max_positions": -1}, "max_positions"),
    ],
)
def test_replay_settings_refuse_nonsense(kwargs: dict[str, Any], problem: str) -> None:
    """ReplaySettings names a limit that is not positive."""
    with pytest.raises(ValueError, match=problem):
        ReplaySettings(**kwargs)


# -- session rules ------------------------------------------------------------------


class Owner:
    """A LinkOwner that records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("link_"):
            raise AttributeError(name)
        return lambda session, *args: self.calls.append((name, args))


V03 = (psc.V0_1, psc.V0_2, psc.V0_3)


def _open_session(role: Role, version: psc.Version = psc.V0_3) -> tuple[LinkSession, Owner, list[bytes]]:
    sent: list[bytes] = []
    owner = Owner()
    session = LinkSession(role, sent.append, owner, "peer", versions=V03)  # type: ignore[arg-type]
    if role is Role.PRODUCER:
        session.receive(encode(psc.Hello((version,))))
    else:
        session.start()
        session.receive(encode(psc.ChooseVersion(version)))
    return session, owner, sent


@pytest.mark.parametrize(
    ("role", "messages", "reason"),
    [
        (Role.PRODUCER, [b'[201,"t"]'], "a 0.3 consumer must send PSC103 first, got Subscribe"),
        (Role.PRODUCER, [b"[103,null,0,[]]", b"[103,null,0,[]]"], "unexpected Resume from a consumer"),
        (Role.PRODUCER, [b'[104,"e",0,0]'], "must send PSC103 first, got Position"),
        (Role.CONSUMER, [b'[301,"t",1,{"s":1}]'], "PSC301 before PSC104 on a 0.3 link"),
        (Role.CONSUMER, [b'[104,"e",0,0]', b'[301,"t",1,{"o":"x"}]'], "needs metadata with a sequence number"),
        (Role.CONSUMER, [b'[104,"e",0,0]', b'[301,"t",1]'], "needs metadata with a sequence number"),
        (Role.CONSUMER, [b'[104,"e",0,0]', b'[104,"e",0,0]'], "unexpected Position from a producer"),
        (Role.CONSUMER, [b"[103,null,0,[]]"], "unexpected Resume from a producer"),
    ],
)
def test_0_3_session_rules(role: Role, messages: list[bytes], reason: str) -> None:
    """A 0.3 link opens with PSC103 then PSC104 exactly once, and numbers every PSC301; else 4400."""
    session, _, _ = _open_session(role)
    with pytest.raises(LinkError) as info:
        for data in messages:
            session.receive(data)
    assert info.value.code == CLOSE_BAD_MESSAGE
    assert reason in info.value.reason


@pytest.mark.parametrize("role", [Role.PRODUCER, Role.CONSUMER])
def test_0_2_session_knows_no_0_3_messages(role: Role) -> None:
    """On a 0.2 link PSC103 and PSC104 are unexpected messages (4400)."""
    session, owner, _ = _open_session(role, psc.V0_2)
    for data in (b"[103,null,0,[]]", b'[104,"e",0,0]'):
        with pytest.raises(LinkError, match="unexpected"):
            session.receive(data)
    assert [name for name, _ in owner.calls] == ["link_open"]


def test_0_3_producer_session_takes_resume_topics_as_interest() -> None:
    """PSC103's topics become the producer session's topics; PSC201/PSC202 then work as usual."""
    session, owner, _ = _open_session(Role.PRODUCER)
    session.receive(b'[103,null,0,["a","b"]]')
    session.receive(b'[201,"c"]')
    session.receive(b'[202,"a"]')
    assert session.topics == {"b", "c"}
    assert [name for name, _ in owner.calls] == ["link_open", "link_resume", "link_subscribed", "link_unsubscribed"]


# -- links between Federations, in memory -------------------------------------------


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


def _pair(
    net: MemoryNetwork, batch: bool = True, **producer: Any
) -> tuple[Federation, Federation, RecordingSink, RecordingSink, MemoryLink]:
    """Consumer ``a`` (subscribed to ``t``, and to gap reports) dials producer ``b``; both speak 0.3 (0.4: batched).

    0.5 (pattern interest) is off: these tests pin the 0.3 and 0.4 forms.
    """
    a = net.node("a", 9001, replay=REPLAY, batch=batch, patterns=False)
    b = net.node("b", 9002, **({"replay": REPLAY, "batch": batch, "patterns": False} | producer))
    sink, gaps = RecordingSink(), RecordingSink()
    a.hub.subscribe("t", sink)
    a.hub.subscribe(GAP_TOPIC, gaps)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    return a, b, sink, gaps, link


def _publish(federation: Federation, *payloads: Any, topic: str = "t") -> None:
    for payload in payloads:
        federation.hub.publish(federation.hub.envelope(topic, payload))


def _tick(net: MemoryNetwork, seconds: float, step: float = 0.5) -> None:
    """Advance in small steps, so timers set while advancing fire on time."""
    for _ in range(round(seconds / step)):
        net.advance(step)


def _outage(net: MemoryNetwork, link: MemoryLink, *, during: Any = None) -> Cut:
    """Partition ``link`` until the dialler's ping times out; ``during()`` runs while it is cut."""
    cut = partition(link)
    if during is not None:
        during()
    _tick(net, 2 * PING)  # the next ping goes unanswered, then it times out
    assert link.client.session is not None and link.client.session.state.value == "closed"
    return cut


def _reconnect(net: MemoryNetwork, cut: Cut) -> MemoryLink:
    """Heal, and answer the dialler's next attempt (made in the partition, or due soon after)."""
    cut.heal()
    net.flush()
    for _ in range(200):
        if net.dials() > len(net.links):
            break
        net.advance(0.1)
    [link] = net.answer()
    return link


def test_0_3_is_negotiated_and_every_publish_numbered(net: MemoryNetwork) -> None:
    """Two replay nodes pick 0.3: PSC103 follows PSC102, PSC104 answers it, PSC301 carries 's' 1, 2, 3."""
    a, b, sink, gaps, link = _pair(net, batch=False)
    _publish(b, "x", "y", "z")
    net.flush()
    consumer_said = link.client_wire.messages()
    producer_said = link.server_wire.messages()
    assert consumer_said == [psc.Hello(V03), Resume(None, 0, ("t",))]
    assert producer_said[0] == psc.ChooseVersion(psc.V0_3)
    position = producer_said[1]
    assert isinstance(position, Position) and (position.seq, position.lost) == (0, 0)
    numbered = producer_said[2:]
    assert [(m.message, m.meta.seq) for m in numbered] == [("x", 1), ("y", 2), ("z", 3)]  # type: ignore[union-attr]
    assert [e.payload for e in sink.got] == ["x", "y", "z"]
    assert gaps.got == []
    assert [r["version"] for r in a.links() + b.links()] == ["0.3", "0.3"]
    assert b.remote_interest() == {"t": ["a"]}
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_partition_within_the_window_resumes_without_loss_or_duplicates(net: MemoryNetwork) -> None:
    """Messages sent into a silent partition and while the consumer redials arrive once, in order, before live ones."""
    a, b, sink, gaps, link = _pair(net)
    _publish(b, 1, 2, 3)
    net.flush()
    cut = _outage(net, link, during=lambda: _publish(b, 4, 5, 6))
    assert a.open_links() == 0 and b.open_links() == 0  # both ends ping: neither keeps a ghost
    _publish(b, 7, 8)
    second = _reconnect(net, cut)
    _publish(b, 9)
    net.flush()
    assert [e.payload for e in sink.got] == list(range(1, 10))
    assert gaps.got == []
    position = second.server_wire.messages()[1]
    assert position == Position(position.epoch, 3, 0)  # type: ignore[union-attr]
    assert a.stats["duplicates_dropped"] == 0 and a.stats["gaps"] == 0
    assert b.hub.metrics.link_counts[("a", "replayed")] == 5
    assert b.open_links() == 1 and a.open_links() == 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_ghost_link_is_superseded_when_the_consumer_resumes(net: MemoryNetwork) -> None:
    """A producer that never saw the old link die closes it (4409) when the same node resumes on a new one.

    The producer pings too, so it would notice the silence by itself; here its
    pings are slower than the consumer's redial, as when the consumer restarts
    at once.
    """
    a, b, sink, gaps, link = _pair(net, ping_interval=60.0)
    partition(link)  # no heal: the ghost's end must come from the resume
    _tick(net, 2 * PING + RETRY.max_delay * (1 + RETRY.jitter))
    [second] = net.answer()
    assert link.server.session is not None and link.server.session.state.value == "closed"
    assert link.server.localCloseCode == CLOSE_DUPLICATE  # sent into the partition
    assert link.server.localCloseReason == b"superseded by a newer link from the same node"
    assert b.open_links() == 1 and b.outbox is not None and b.outbox.stats["streams_superseded"] == 1
    _tick(net, 5)  # the close handshake times out on the ghost
    _publish(b, "after")
    net.flush()
    assert [e.payload for e in sink.got] == ["after"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        (ReplaySettings(window=5.0), "window"),
        (ReplaySettings(max_bytes=400), "window"),
    ],
)
def test_gap_past_the_buffer_is_reported_and_counted(net: MemoryNetwork, limits: ReplaySettings, reason: str) -> None:
    """Past the age or byte limit the consumer gets what is left, in order, a gap report with the exact loss, a log."""
    warnings: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_level") is not None and event["log_level"].name == "warn":
            warnings.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    a, b, sink, gaps, link = _pair(net, replay=limits)
    _publish(b, 0)
    net.flush()
    cut = partition(link)
    for n in range(1, 21):  # one message every 0.5 s while cut
        _publish(b, n)
        net.advance(0.5)
    second = _reconnect(net, cut)
    _publish(b, 21)
    net.flush()
    got = [e.payload for e in sink.got]
    position = second.server_wire.messages()[1]
    assert isinstance(position, Position)
    lost = position.lost
    assert lost is not None and lost > 0
    assert got == [0, *range(1 + lost, 22)]
    assert [e.payload for e in gaps.got] == [{"origin": "b", "lost": lost, "reason": reason}]
    assert gaps.got[0].origin == "a"
    assert (a.stats["gaps"], a.stats["gap_messages"]) == (1, lost)
    assert a.hub.metrics.link_counts[("b", "gaps")] == 1 and a.hub.metrics.link_counts[("b", "lost")] == lost
    globalLogPublisher.removeObserver(observe)
    assert f"gap in the stream from b: {lost} messages lost ({reason})" in warnings
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_producer_keeps_buffering_for_a_consumer_without_a_link_within_the_window(net: MemoryNetwork) -> None:
    """A producer that saw the link close keeps numbering the consumer's topics; its return loses nothing."""
    a, b, sink, gaps, link = _pair(net, replay=ReplaySettings(window=5.0))
    _publish(b, 1)
    net.flush()
    a.remove_server(psc_url(9002))
    net.flush()
    assert b.open_links() == 0
    _publish(b, 2)
    net.advance(4)
    _publish(b, 3)
    a.add_server(psc_url(9002))
    net.answer()
    _publish(b, 4)
    net.flush()
    assert [e.payload for e in sink.got] == [1, 2, 3, 4]
    assert gaps.got == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_stream_of_a_consumer_gone_past_the_window_is_dropped_and_the_gap_unknown(net: MemoryNetwork) -> None:
    """A producer that saw the link close keeps the stream for the window only; after it the gap has no count."""
    a, b, sink, gaps, link = _pair(net, replay=ReplaySettings(window=5.0))
    a.remove_server(psc_url(9002))
    net.flush()
    assert b.open_links() == 0
    _publish(b, "kept a while")
    net.advance(6)
    _publish(b, "past the window")
    assert b.outbox is not None and b.outbox.summary()["streams"] == 0
    a.add_server(psc_url(9002))
    net.answer()
    _publish(b, "live")
    net.flush()
    assert [e.payload for e in sink.got] == ["live"]
    assert [e.payload for e in gaps.got] == [{"origin": "b", "lost": None, "reason": "restart"}]
    assert a.stats["gaps"] == 1 and a.stats["gap_messages"] == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_producer_restart_is_a_gap_of_unknown_size(net: MemoryNetwork) -> None:
    """A producer that restarted has a new epoch: the consumer's old position means messages may be lost."""
    a, b, sink, gaps, link = _pair(net)
    _publish(b, 1)
    net.flush()
    b.stop()
    net.flush()
    restarted = net.node("b", 9002, replay=REPLAY)
    net.advance(RETRY.initial * (1 + RETRY.jitter))
    [second] = net.answer()
    _publish(restarted, 2)
    net.flush()
    assert [e.payload for e in sink.got] == [1, 2]
    assert [e.payload for e in gaps.got] == [{"origin": "b", "lost": None, "reason": "restart"}]
    resume = second.client_wire.messages()[1]
    assert isinstance(resume, Resume) and resume.seq == 1 and resume.epoch is not None
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_consumer_restart_starts_a_fresh_stream_without_a_gap(net: MemoryNetwork) -> None:
    """A consumer that restarted holds no position: the producer drops the old stream and reports nothing lost."""
    a, b, sink, gaps, link = _pair(net)
    _publish(b, "to the old process")
    net.flush()
    a.stop()
    net.flush()
    _publish(b, "buffered for the old process")
    again = net.node("a", 9101, replay=REPLAY)
    fresh, fresh_gaps = RecordingSink(), RecordingSink()
    again.hub.subscribe("t", fresh)
    again.hub.subscribe(GAP_TOPIC, fresh_gaps)
    again.add_server(psc_url(9002))
    [second] = net.answer()
    _publish(b, "to the new process")
    net.flush()
    assert second.client_wire.messages()[1] == Resume(None, 0, ("t",))
    position = second.server_wire.messages()[1]
    assert isinstance(position, Position) and (position.seq, position.lost) == (0, 0)
    assert [e.payload for e in fresh.got] == ["to the new process"]
    assert fresh_gaps.got == [] and again.stats["gaps"] == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize(
    ("a_replay", "b_versions", "version"),
    [
        (True, (psc.V0_1, psc.V0_2), (0, 2)),
        (False, (psc.V0_1, psc.V0_2), (0, 2)),
        (True, (psc.V0_1,), (0, 1)),
    ],
)
def test_older_peers_get_their_version_unchanged(
    net: MemoryNetwork, a_replay: bool, b_versions: tuple[psc.Version, ...], version: psc.Version
) -> None:
    """A 0.1 or 0.2 peer (either side) sees exactly the old protocol: no PSC103/PSC104, no 's'."""
    a = net.node("a", 9001, **({"replay": REPLAY} if a_replay else {}))
    b = net.node("b", 9002, versions=b_versions, **({} if a_replay else {"replay": REPLAY}))
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    _publish(b, "m")
    net.flush()
    said = link.client_wire.messages()
    assert said[1:] == [psc.Subscribe(("t",))]
    assert link.server_wire.messages()[0] == psc.ChooseVersion(version)
    publish = link.server_wire.messages()[1]
    assert isinstance(publish, Publish)
    assert publish.meta is None if version == (0, 1) else publish.meta is not None and publish.meta.seq is None
    assert [e.payload for e in sink.got] == ["m"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_mixed_consumers_each_get_their_form_from_one_encoding(net: MemoryNetwork) -> None:
    """A producer serving a 0.2 and a 0.3 consumer sends each its own form of the same message."""
    b = net.node("b", 9002, replay=REPLAY)
    old = net.node("old", 9003, versions=(psc.V0_1, psc.V0_2))
    new = net.node("new", 9004, replay=REPLAY)
    sinks = {"old": RecordingSink(), "new": RecordingSink()}
    old.hub.subscribe("t", sinks["old"])
    new.hub.subscribe("t", sinks["new"])
    old.add_server(psc_url(9002))
    new.add_server(psc_url(9002))
    old_link, new_link = net.answer()
    _publish(b, "m")
    net.flush()
    old_form = old_link.server_wire.frames()[-1][1]
    new_form = new_link.server_wire.frames()[-1][1]
    assert new_form == psc.with_seq(old_form, 1)
    assert [e.payload for e in sinks["old"].got] == [e.payload for e in sinks["new"].got] == ["m"]
    assert b.stats["forwarded"] == 2
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_consumer_drops_a_duplicate_by_sequence_number(net: MemoryNetwork) -> None:
    """A PSC301 whose number the consumer already has is dropped and counted, then a marker still arrives."""
    a, b, sink, gaps, link = _pair(net)
    _publish(b, "one", "two")
    net.flush()
    link.server.sendMessage(b'[301,"t","two again",{"o":"b","s":2}]', isBinary=False)
    link.server.sendMessage(b'[301,"t","marker",{"o":"b","s":3}]', isBinary=False)
    net.flush()
    assert [e.payload for e in sink.got] == ["one", "two", "marker"]
    assert a.stats["duplicates_dropped"] == 1 and a.hub.metrics.link_counts[("b", "duplicates")] == 1
    assert gaps.got == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_skipped_sequence_numbers_are_reported_as_a_gap(net: MemoryNetwork) -> None:
    """A jump in the producer's numbers is delivered and reported as a gap of the skipped count."""
    a, b, sink, gaps, link = _pair(net)
    link.server.sendMessage(b'[301,"t","five",{"o":"b","s":5}]', isBinary=False)
    net.flush()
    assert [e.payload for e in sink.got] == ["five"]
    assert [e.payload for e in gaps.got] == [{"origin": "b", "lost": 4, "reason": "sequence"}]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_resume_past_what_was_sent_closes_the_link_4400(net: MemoryNetwork) -> None:
    """A consumer claiming a position the producer never reached is closed with 4400 and the reason."""
    a, b, sink, gaps, link = _pair(net)
    _publish(b, 1)
    net.flush()
    assert a.inbox is not None
    epoch, _ = a.inbox.position("b")
    a.inbox.positioned("b", Position(epoch or "", 99, 0))
    link.server_wire.loseConnection()
    net.flush()
    net.advance(RETRY.initial * (1 + RETRY.jitter))
    [second] = net.answer()
    code, reason = second.server_wire.close()  # type: ignore[misc]
    assert code == CLOSE_BAD_MESSAGE and "PSC103 position 99 is past the last sequence number sent, 1" in reason
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_interest_changed_while_down_is_taken_from_the_resume(net: MemoryNetwork) -> None:
    """PSC103 replaces the stream's topics: a topic dropped while down is no longer sent, a new one is."""
    a, b, sink, gaps, link = _pair(net)
    heard: list[tuple[str, str]] = []

    class Listener:
        def remote_subscribed(self, topic: str, peer: str) -> None:
            heard.append((topic, peer))

    b.hub.add_remote_interest_listener(Listener())
    cut = _outage(net, link)
    a.hub.unsubscribe("t", sink)
    a.hub.subscribe("u", sink)
    _reconnect(net, cut)
    assert b.remote_interest() == {"u": ["a"]}
    assert heard == [("u", "a")]
    forwarded = b.stats["forwarded"]
    _publish(b, "not wanted", topic="t")
    _publish(b, "wanted", topic="u")
    net.flush()
    assert [e.payload for e in sink.got] == ["wanted"]
    assert b.stats["forwarded"] == forwarded + 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_not_json_payload_is_dropped_without_using_a_number(net: MemoryNetwork) -> None:
    """A payload that cannot cross a JSON link is counted and takes no sequence number (no false gap)."""
    a, b, sink, gaps, link = _pair(net)
    b.hub.publish(Envelope("t", b"\x00bytes", origin="b"))
    _publish(b, "json")
    net.flush()
    assert b.stats["dropped_not_json"] == 1
    assert [e.payload for e in sink.got] == ["json"] and gaps.got == []
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- configuration and WAMP mapping -----------------------------------------------


def test_replay_config_defaults_flags_and_toml(tmp_path: Any) -> None:
    """Defaults are 16 MiB / 60 s; TOML keys and flags set them; bad values name the key."""
    config = build({}, {})
    assert (config.federation.replay_buffer_bytes, config.federation.replay_window_seconds) == (16 * 1024 * 1024, 60.0)
    path = tmp_path / "node.toml"
    path.write_text("replay-buffer-bytes = 1048576\nreplay-window-seconds = 5\n")
    config = build(load_toml(str(path)), {"replay_window_seconds": 30.0})
    assert (config.federation.replay_buffer_bytes, config.federation.replay_window_seconds) == (1048576, 30.0)
    for key, value in (("replay_buffer_bytes", 10), ("replay_window_seconds", -1.0), ("replay_window_seconds", 1e9)):
        with pytest.raises(ConfigError) as info:
            build({}, {key: value})
        assert info.value.key == key.replace("_", "-")
    path.write_text('replay-window-seconds = "long"\n')
    with pytest.raises(ConfigError, match="replay-window-seconds"):
        load_toml(str(path))


def test_replay_flags_reach_the_config() -> None:
    """--replay-buffer-bytes and --replay-window-seconds set the config; 0 turns the extension off."""
    from pubsubclub.cli.command import parser
    from pubsubclub.config import node_config

    args = parser().parse_args(["node", "--replay-buffer-bytes", "1048576", "--replay-window-seconds", "0"])
    config = node_config(args)
    assert (config.federation.replay_buffer_bytes, config.federation.replay_window_seconds) == (1048576, 0.0)
    node_parser = parser()._subparsers._group_actions[0].choices["node"]  # type: ignore[union-attr]
    help_text = " ".join(node_parser.format_help().split())
    assert "default: 16777216" in help_text and "(0: extension off) (default: 60.0" in help_text


def test_gap_meta_topic_is_the_same_hub_topic_in_every_realm() -> None:
    """WAMP subscribers of wamp.pubsubclub.gap in any realm listen to the reserved hub topic $cluster.gap."""
    assert hub_topic("realm1", GAP_EVENT_TOPIC, "realm1") == GAP_TOPIC
    assert hub_topic("other", GAP_EVENT_TOPIC, "realm1") == GAP_TOPIC
    assert hub_topic("other", "t", "realm1") == "$realm.other#t"


# -- liveness on both ends (issue: a frozen dialler left ghosts on the listener) ---------------


def test_listener_closes_a_silent_dialler_within_two_ping_intervals(net: MemoryNetwork) -> None:
    """The accepting side pings too: a dialler that goes silent is closed by the listener itself."""
    a = net.node("a", 9001, ping_interval=600.0)  # the dialler's own pings play no part
    b = net.node("b", 9002)
    a.hub.subscribe("t", RecordingSink())
    a.add_server(psc_url(9002))
    [link] = net.answer()
    partition(link)
    _tick(net, PING)
    assert b.open_links() == 1  # one ping sent, its answer still awaited
    _tick(net, PING)
    assert b.open_links() == 0 and a.open_links() == 1
    assert b.remote_interest() == {}  # nothing queues for the ghost any more
    a.remove_server(psc_url(9002))
    net.flush()
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_ghost_without_replay_is_superseded_when_the_dialler_subscribes_again(net: MemoryNetwork) -> None:
    """0.2: a listener that has not yet noticed a dialler's old link die closes it once the new link sends PSC201."""
    a = net.node("a", 9001)
    b = net.node("b", 9002, ping_interval=60.0)  # too slow to notice the ghost before the redial
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    assert link.server.session is not None and link.server.session.version == (0, 2)
    partition(link)
    _tick(net, 2 * PING + RETRY.max_delay * (1 + RETRY.jitter))
    [second] = net.answer()
    assert link.server.localCloseCode == CLOSE_DUPLICATE
    assert [(r["direction"], r["state"]) for r in b.links()] == [("in", "open")]
    assert b.hub.metrics.disconnects == {("psc", "superseded"): 1}
    _tick(net, 5)  # the close handshake times out on the ghost
    _publish(b, "after")
    net.flush()
    assert [e.payload for e in sink.got] == ["after"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_two_urls_of_one_node_keep_the_first_link(net: MemoryNetwork) -> None:
    """A dialler with two URLs for one node closes its newer link before using it; the listener keeps the first."""
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    net.listeners[9003] = b.server_factory()
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    a.add_server(psc_url(9002))
    [first] = net.answer()
    a.add_server(psc_url(9003))
    [second] = net.answer()
    assert second.client.localCloseCode == CLOSE_DUPLICATE
    assert first.server.session is not None and first.server.session.state.value == "open"
    assert b.hub.metrics.disconnects == {}
    _publish(b, "once")
    net.flush()
    assert [e.payload for e in sink.got] == ["once"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- PSC 0.4: batched frames ------------------------------------------------------------------------


def _frames_with_publishes(wire: Any) -> list[int]:
    """For each text frame with PSC301s in it, how many it holds."""
    counts = []
    for text in wire.texts():
        n = sum(1 for line in text.split(psc.BATCH_SEPARATOR) if line.startswith(b"[301"))
        if n:
            counts.append(n)
    return counts


def test_0_4_batches_a_turns_publishes_in_one_frame_and_keeps_order(net: MemoryNetwork) -> None:
    """Publishes of one turn leave as one frame, the next turn's as another; order is kept within and across."""
    a, b, sink, _gaps, link = _pair(net)
    assert [r["version"] for r in a.links() + b.links()] == ["0.4", "0.4"]
    _publish(b, 1, 2, 3)
    net.flush()
    _publish(b, 4, 5)
    net.flush()
    assert [e.payload for e in sink.got] == [1, 2, 3, 4, 5]
    assert _frames_with_publishes(link.server_wire) == [3, 2]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_0_4_adds_no_timer_a_lone_message_leaves_in_its_turn(net: MemoryNetwork) -> None:
    """Under light load a message is written at the end of the turn it was published in: a zero-delay call."""
    _a, b, sink, _gaps, link = _pair(net)
    net.flush()
    before = len(link.server_wire.texts())
    _publish(b, "now")
    [call] = [c for c in net.reactor.getDelayedCalls() if c.getTime() == net.reactor.seconds()]
    assert call.active() and len(link.server_wire.texts()) == before
    net.reactor.advance(0)  # the end of this turn: no time passes
    assert len(link.server_wire.texts()) == before + 1
    net.flush()
    assert [e.payload for e in sink.got] == ["now"]
    net.stop()
    assert net.reactor.getDelayedCalls() == []


@pytest.mark.parametrize("frame", [b'[301,"t",1,{"s":1}]\n\n[301,"t",2,{"s":2}]', b'[301,"t",1,{"s":1}]\nnot json'])
def test_0_4_malformed_batch_closes_the_link(net: MemoryNetwork, frame: bytes) -> None:
    """An empty line or a bad message in a batch is a protocol error: 4400, as for any bad PSC message."""
    a, _b, _sink, _gaps, link = _pair(net)
    net.flush()
    session = link.client.session
    assert session is not None and session.batched
    with pytest.raises(LinkError) as e:
        session.receive(frame)
    assert e.value.code == CLOSE_BAD_MESSAGE
    net.stop()


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_0_4_batch_drops_only_its_message_beyond_the_bounds(net: MemoryNetwork) -> None:
    """One PSC301 of a frame nested past the JSON bounds is dropped and counted; the rest of the frame arrives."""
    a, b, sink, _gaps, link = _pair(net)
    net.flush()
    _publish(b, 1, _nested(70), 2, _nested(64), 3)
    net.flush()
    assert _frames_with_publishes(link.server_wire) == [5]
    assert [e.payload for e in sink.got] == [1, 2, _nested(64), 3]
    assert a.stats["dropped_bounds"] == 1 and a.stats["received"] == 4
    dropped = [(key, n) for key, n, _ in a.hub.metrics.totals() if key[2] == "dropped"]
    assert dropped == [(("t", "psc", "dropped", "b", "bounds"), 1)]
    assert link.client_wire.close() is None and a.open_links() == 1
    net.stop()


def test_0_4_bad_line_closes_the_link_after_the_lines_before_it(net: MemoryNetwork) -> None:
    """Lines before a malformed one are delivered; then the link closes 4400 with the message's problem."""
    a, _b, sink, _gaps, link = _pair(net)
    net.flush()
    session = link.client.session
    assert session is not None and session.batched and session.resumed
    frame = b'[301,"t",1,{"s":1}]\n[301,"t",2,{"s":2}]\n[301,"t",3]\n[301,"t",4,{"s":4}]'
    with pytest.raises(LinkError) as e:
        session.receive(frame)
    assert (e.value.code, e.value.reason) == (
        CLOSE_BAD_MESSAGE,
        "PSC301 on a 0.3 link needs metadata with a sequence number 's'",
    )
    assert [m.payload for m in sink.got] == [1, 2]
    net.stop()


def test_0_4_batch_is_counted_as_the_same_messages_one_per_frame(net: MemoryNetwork) -> None:
    """Counters after a batched run equal those after the same messages one per frame (0.3): nothing counted twice."""
    counted = []
    for batch in (True, False):
        a, b, sink, _gaps, link = _pair(net, batch=batch)
        net.flush()
        _publish(b, *range(7))
        _publish(b, "x", topic="u")  # no subscriber on a: never asked for, never sent
        net.flush()
        assert [e.payload for e in sink.got] == list(range(7))
        sent = [line for text in link.server_wire.texts() for line in text.split(psc.BATCH_SEPARATOR)]
        wire_bytes = sum(len(line) for line in sent if line.startswith(b"[301"))
        totals = [(key, n, nbytes) for key, n, nbytes in a.hub.metrics.totals() if key[2] == "received"]
        assert totals == [(("t", "psc", "received", "b", None), 7, wire_bytes)]
        latency = a.hub.metrics.total_latency()["b"]
        counted.append((a.stats["received"], a.hub.stats["received"], a.hub.stats["delivered"], latency.count))
        net.stop()
        net = MemoryNetwork()
    assert counted[0] == counted[1] == (7, 7, 7, 7)


def test_0_4_batch_stops_when_its_link_closes_meanwhile(net: MemoryNetwork) -> None:
    """A sink that unlinks the producer while a frame is delivered: the frame's later messages are not handed on."""
    a, b, sink, _gaps, link = _pair(net)
    net.flush()

    class Unlinker:
        def deliver(self, envelope: Envelope) -> None:
            if envelope.payload == 2:
                a.remove_server(psc_url(9002))

    a.hub.subscribe("t", Unlinker())
    net.flush()
    _publish(b, 1, 2, 3, 4)
    net.flush()
    assert _frames_with_publishes(link.server_wire) == [4]
    assert [e.payload for e in sink.got] == [1, 2]
    assert a.stats["received"] == 2
    net.stop()


def test_0_4_and_0_3_nodes_deliver_everything_exactly_once(net: MemoryNetwork) -> None:
    """A batching node and one without the extension settle on 0.3; every message arrives once, in order."""
    a = net.node("a", 9001, replay=REPLAY)  # offers 0.4
    b = net.node("b", 9002, replay=REPLAY, batch=False)  # 0.3 at most
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    assert [r["version"] for r in a.links() + b.links()] == ["0.3", "0.3"]
    _publish(b, *range(10))
    net.flush()
    assert [e.payload for e in sink.got] == list(range(10))
    assert _frames_with_publishes(link.server_wire) == [1] * 10
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_0_4_frames_never_exceed_the_message_limit(net: MemoryNetwork) -> None:
    """Many messages in one turn are split into frames of at most the link frame limit; all arrive, in order."""
    limits = psc.Limits(max_message_size=3072, link_headroom=1024)
    a = net.node("a", 9001, replay=REPLAY, limits=limits)
    b = net.node("b", 9002, replay=REPLAY, limits=limits)
    sink = RecordingSink()
    a.hub.subscribe("t", sink)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    _publish(b, *(("x" * 300) + str(i) for i in range(100)))
    net.flush()
    assert [e.payload for e in sink.got] == [("x" * 300) + str(i) for i in range(100)]
    sizes = [len(t) for t in link.server_wire.texts()]
    assert max(sizes) <= 4096 and len(_frames_with_publishes(link.server_wire)) > 1
    net.stop()
    assert net.reactor.getDelayedCalls() == []


def test_0_5_stream_keeps_patterns_through_an_outage(net: MemoryNetwork) -> None:
    """A pattern subscriber's stream keeps its patterns while the link is down; the resume resends what matched."""
    a = net.node("a", 9001, replay=REPLAY)
    b = net.node("b", 9002, replay=REPLAY)
    sink = RecordingSink()
    pattern = Pattern("wildcard", "home..temp")
    a.hub.subscribe_pattern(pattern, sink)
    a.add_server(psc_url(9002))
    [link] = net.answer()
    _publish(b, "before", topic="home.k.temp")
    net.flush()
    cut = _outage(net, link, during=lambda: _publish(b, "during", topic="home.b.temp"))
    _publish(b, "ignored", topic="home.b.humidity")
    again = _reconnect(net, cut)
    said = again.client_wire.messages()
    assert isinstance(said[1], Resume) and said[1].patterns == (pattern,)
    _publish(b, "after", topic="home.x.temp")
    net.flush()
    assert [e.payload for e in sink.got] == ["before", "during", "after"]
    assert a.stats["gaps"] == 0
    net.stop()
    assert net.reactor.getDelayedCalls() == []


# -- the send path's counts, held back per read of the metrics ------------------


def _psc301_lines(wire: Any) -> list[bytes]:
    """The PSC301s written on ``wire``, as sent (a 0.4 batch frame split into its lines)."""
    head = b"[%d," % psc.PUBLISH
    return [line for text in wire.texts() for line in text.split(psc.BATCH_SEPARATOR) if line.startswith(head)]


def test_send_path_totals_and_order_equal_counting_each_message_at_once(net: MemoryNetwork) -> None:
    """Published, delivered, forwarded (per peer, with bytes) and trimmed are exactly the per-message totals.

    The producer holds these counts back until the metrics are read
    (``Metrics.settle``); reads in the middle of a reactor turn, between
    turns and at the end must each see every message so far, the interval
    counters must add up to the totals, and the messages must leave in
    publish order with consecutive sequence numbers.
    """
    small = ReplaySettings(max_bytes=2048, window=60.0)
    b = net.node("b", 9002, replay=small)
    a = net.node("a", 9001, replay=small)  # speaks 0.5: numbered, batched, kept and trimmed
    c = net.node("c", 9003)  # no replay: a plain 0.2 consumer of the same topic
    sinks = {"a": RecordingSink(), "c": RecordingSink()}
    for name, node in (("a", a), ("c", c)):
        node.hub.subscribe("t", sinks[name])
        node.add_server(psc_url(9002))
    links = net.answer()
    local = RecordingSink()
    b.hub.subscribe("t", local)
    metrics = b.hub.metrics
    before = dict(b.hub.stats), dict(b.stats), dict(b.outbox.stats if b.outbox else {})
    intervals: dict[Any, list[int]] = {}

    def take() -> None:
        for key, (n, nbytes) in metrics.take_interval(0.0)[1].items():
            cell = intervals.setdefault(key, [0, 0])
            cell[0] += n
            cell[1] += nbytes

    sent = 0
    for turn in range(12):
        for i in range(25):
            _publish(b, {"n": sent, "pad": "x" * (i * 7 % 40)})
            sent += 1
            if i == 10:  # mid-turn: nothing is on the wire yet, everything is counted
                assert b.hub.stats["published"] - before[0]["published"] == sent
                assert b.stats["forwarded"] - before[1]["forwarded"] == 2 * sent
                assert b.hub.stats["delivered"] - before[0]["delivered"] == sent
        if turn % 3 == 0:
            take()
        net.flush()
    take()
    assert b.hub.stats["published"] - before[0]["published"] == sent
    assert b.hub.stats["delivered"] - before[0]["delivered"] == sent
    assert b.stats["forwarded"] - before[1]["forwarded"] == 2 * sent
    assert [e.payload["n"] for e in local.got] == list(range(sent))
    for name, sink in sinks.items():
        assert [e.payload["n"] for e in sink.got] == list(range(sent)), name
    by_peer = {}
    for link in links:
        peer = "a" if link.client.factory.federation is a else "c"
        lines = _psc301_lines(link.server_wire)
        by_peer[peer] = lines
        assert intervals[("t", "psc", "forwarded", peer, None)] == [len(lines), sum(len(line) for line in lines)]
        assert len(lines) == sent
    numbered = [decode(line) for line in by_peer["a"]]
    assert [m.meta.seq for m in numbered if isinstance(m, Publish) and m.meta] == list(range(1, sent + 1))
    assert b.outbox is not None
    summary = b.outbox.summary()
    assert 0 < summary["kept_messages"] < sent
    assert summary["trimmed"] - before[2].get("trimmed", 0) == sent - summary["kept_messages"]
    assert sum(n for (_, _, kind, _, _), (n, _) in intervals.items() if kind == "forwarded") == 2 * sent
    net.stop()
