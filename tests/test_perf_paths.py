"""The per-message fast paths (docs/benchmarks.md, "Cross-node CPU: fewer calls per message") and their fallbacks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from helpers.linkowner import open_consumer, outcome
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.federation import psc
from pubsubclub.federation.session import LinkSession, Role
from pubsubclub.net import wsframes

V06 = (psc.V0_1, psc.V0_2, psc.V0_3, psc.V0_4, psc.V0_5, psc.V0_6)


class _Owner:
    """A LinkOwner recording the PSC301 runs it is handed."""

    def __init__(self) -> None:
        self.received: list[psc.Publish] = []

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        self.received += messages

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("link_"):
            raise AttributeError(name)
        return lambda *args: None


def _consumer() -> tuple[LinkSession, _Owner]:
    owner = _Owner()
    session = LinkSession(Role.CONSUMER, lambda data: None, owner, "peer", versions=V06)  # type: ignore[arg-type]
    session.start()
    session.receive(psc.encode(psc.ChooseVersion(psc.V0_6)))
    session.receive(b'[104,"e",0,0]')
    return session, owner


_META = {"o": "n1", "t": 1.5, "i": "n1-b-1"}
#: PSC301 lines the in-place read must leave to psc.decode: each differs from what decode makes of it
#: if it were read in place (an integer publish time, a routing object, binary values).
_SLOW = [
    {"o": "n1", "t": 5, "i": "n1-b-1"},
    {**_META, "p": {"e": [7]}},
    {**_META, "p": {"d": {"publisher": 9, "publisher_authid": "a", "publisher_authrole": None}}},
    {**_META, "b": 1},
]


@pytest.mark.parametrize("fields", [_META, {**_META, "w": 1}, *_SLOW])
def test_batch_reads_each_psc301_as_decode_does(fields: dict[str, Any]) -> None:
    """A 0.4 batch's PSC301s (in place or through decode) give exactly decode's Publish, types included."""
    session, owner = _consumer()
    message: Any = {"args": [1], "kwargs": {"k": "\u0000AAE="}} if fields.get("w") else "\u0000AAE="
    lines = [orjson.dumps([psc.PUBLISH, "t", message, {**fields, "s": n}]) for n in (1, 2)]
    session.receive(psc.BATCH_SEPARATOR.join(lines))
    expected = [psc.decode(line) for line in lines]
    assert owner.received == expected
    for got, want in zip(owner.received, expected, strict=True):
        assert got.meta is not None and want.meta is not None
        assert type(got.meta.published_at) is type(want.meta.published_at) is float
        assert got.meta.options == want.meta.options
        assert got.meta.binary == want.meta.binary
        assert got.message == want.message and type(got.message) is type(want.message)


class _Transport:
    """What a protocol writes to, recorded."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


class _Stats:
    def __init__(self) -> None:
        self.outgoingWebSocketMessages = self.outgoingOctetsAppLevel = self.outgoingOctetsWebSocketLevel = 0
        self.outgoingWebSocketFrames = self.outgoingOctetsWireLevel = 0


class _Factory:
    isServer = True


class _Protocol:
    """The attributes send_message/send_held read of an Autobahn server protocol (open, plain)."""

    state = wsframes._OPEN
    factory = _Factory()
    maskServerFrames = False
    _perMessageCompress: Any = None
    trackedTimings = False
    logFrames = False
    send_queue: Any = None
    autoFragmentSize = 0

    def __init__(self) -> None:
        self.transport = _Transport()
        self.trafficStats = _Stats()
        self.sent: list[bytes] = []

    def sendMessage(self, payload: bytes, binary: bool) -> None:  # noqa: N802 - Autobahn API
        self.transport.write(b"autobahn:" + payload)


def test_held_frames_leave_in_one_write_at_release() -> None:
    """During a hold a connection's frames are held (and counted as unsent) and written once, in order, at release."""
    protocol = _Protocol()
    assert wsframes.hold_writes()
    try:
        assert not wsframes.hold_writes()  # nested: the outer hold releases
        wsframes.send_held(protocol, b"1", False)
        wsframes.send_held(protocol, b"22", False)
        assert protocol.transport.writes == []
        assert wsframes.held_bytes(protocol) == 7
    finally:
        wsframes.release_writes()
    assert protocol.transport.writes == [b"\x81\x011\x81\x0222"]
    assert wsframes.held_bytes(protocol) == 0


def test_a_frame_sent_unheld_during_a_hold_goes_after_the_held_ones() -> None:
    """send_message during a hold first writes what is held for that connection: the order on the wire is kept."""
    protocol = _Protocol()
    wsframes.hold_writes()
    try:
        wsframes.send_held(protocol, b"1", False)
        wsframes.send_message(protocol, b"2", False)
        wsframes.send_held(protocol, b"3", False)
    finally:
        wsframes.release_writes()
    assert protocol.transport.writes == [b"\x81\x011", b"\x81\x012", b"\x81\x013"]


def test_held_write_falls_back_to_autobahn_where_send_message_would() -> None:
    """A connection with compression negotiated gets Autobahn's sendMessage at once, held or not."""
    protocol = _Protocol()
    protocol._perMessageCompress = object()
    wsframes.hold_writes()
    try:
        wsframes.send_held(protocol, b"1", False)
        assert protocol.transport.writes == [b"autobahn:1"]
    finally:
        wsframes.release_writes()
    assert protocol.transport.writes == [b"autobahn:1"]


# -- the broker: a publish's hub topic remembered, an EVENT written without its layers ---------------------


def _joined(router: Any, realm: str = "realm1") -> tuple[Any, Any]:
    """A joined session on a fake transport."""
    from autobahn.wamp import message
    from autobahn.wamp.role import RolePublisherFeatures, RoleSubscriberFeatures

    from pubsubclub.testing import MemoryWampTransport

    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    roles = {"publisher": RolePublisherFeatures(), "subscriber": RoleSubscriberFeatures()}
    session.onMessage(message.Hello(realm, roles))
    assert isinstance(transport.sent[-1], message.Welcome)
    transport.sent.clear()
    return session, transport


def _publish(topic: str, payload: Any = None, request: int = 1) -> Any:
    from pubsubclub.frontends.wamp.codec import PublishRequest

    return PublishRequest(request, topic, None if payload is not None else [1], None, True, None, payload, 20)


def test_payload_transparency_is_refused_on_a_topic_already_published_on() -> None:
    """A topic remembered as good still gets the payload-transparency refusal: the memo skips URI checks only."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter

    router = WampRouter(Hub())
    session, transport = _joined(router)
    session.onMessage(_publish("com.example.t"))
    assert isinstance(transport.sent.pop(), message.Published)
    assert ("realm1", "com.example.t") in router.publish_topics
    session.onMessage(_publish("com.example.t", payload=b"opaque", request=2))
    refused = transport.sent.pop()
    assert isinstance(refused, message.Error) and refused.error == "wamp.error.invalid_argument"


def test_a_refused_topic_is_never_remembered_and_the_memo_is_per_realm() -> None:
    """Bad and reserved URIs are refused every time (never remembered); a topic maps to its own realm's hub topic."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.uris import URI_CACHE_SIZE

    router = WampRouter(Hub(), ("realm1", "realm2"))
    one, one_t = _joined(router, "realm1")
    two, two_t = _joined(router, "realm2")
    for topic in ("wamp.session.x", "bad topic", "$cluster.x"):
        for _ in range(2):
            one.onMessage(_publish(topic))
            assert isinstance(one_t.sent.pop(), message.Error)
    one.onMessage(_publish("com.example.t"))
    two.onMessage(_publish("com.example.t"))
    assert router.publish_topics == {
        ("realm1", "com.example.t"): "com.example.t",
        ("realm2", "com.example.t"): "$realm.realm2#com.example.t",
    }
    for i in range(URI_CACHE_SIZE + 5):
        one.onMessage(_publish(f"com.example.n{i}"))
    assert len(router.publish_topics) == URI_CACHE_SIZE


def test_events_with_options_or_for_a_lagging_client_take_the_checks_one_by_one() -> None:
    """deliver's short path leaves publish options (exclusion) and a client over its send buffer to the full checks."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.frontends.wamp import WampRouter

    router = WampRouter(Hub())
    session, transport = _joined(router)
    session.onMessage(message.Subscribe(1, "com.example.t"))
    assert isinstance(transport.sent.pop(), message.Subscribed)
    excluded = Envelope("com.example.t", 1, "n", options={"x": [session.session_id]})
    assert session.deliver(excluded) is False
    assert transport.sent == []
    assert session.deliver(Envelope("com.example.t", 2, "n")) is True
    assert transport.sent.pop().args == [2]
    transport.unsent = router.limits.max_send_buffer + 1
    assert session.deliver(Envelope("com.example.t", 3, "n")) is False
    assert transport.dropped is not None and "slow consumer" in transport.dropped


@pytest.mark.parametrize(
    ("payload", "wrapped", "args", "kwargs"),
    [
        (5, False, [5], None),
        ({"args": [1, 2], "kwargs": {"k": 3}}, True, [1, 2], {"k": 3}),
        ({"args": [1]}, False, [{"args": [1]}], None),
    ],
)
def test_event_bytes_short_path_agrees_with_event_message(payload: Any, wrapped: bool, args: Any, kwargs: Any) -> None:
    """An EVENT made by the plain-value short path or by event_arguments has the args/kwargs the publish had."""
    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.frontends.wamp import WampRouter

    router = WampRouter(Hub())
    session, transport = _joined(router)
    from autobahn.wamp import message

    session.onMessage(message.Subscribe(1, "com.example.t"))
    transport.sent.clear()
    assert session.deliver(Envelope("com.example.t", payload, "n", wamp_wrapped=wrapped))
    event = transport.sent.pop()
    assert (event.args, event.kwargs) == (args, kwargs)


@pytest.mark.parametrize("acknowledge", [True, False])
def test_one_publication_id_per_publish_acknowledged_or_not(acknowledge: bool) -> None:
    """The PUBLISHED answer and every EVENT of a publish (exact and pattern subscriptions) carry the same id."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.codec import PublishRequest

    router = WampRouter(Hub())
    publisher, publisher_t = _joined(router)
    exact, exact_t = _joined(router)
    prefix, prefix_t = _joined(router)
    exact.onMessage(message.Subscribe(1, "com.example.t"))
    prefix.onMessage(message.Subscribe(1, "com.example", match="prefix"))
    exact_t.sent.clear()
    prefix_t.sent.clear()
    publisher.onMessage(PublishRequest(5, "com.example.t", [1], None, acknowledge, None, None, 20))
    (exact_event,) = exact_t.sent
    (prefix_event,) = prefix_t.sent
    assert exact_event.publication == prefix_event.publication
    if acknowledge:
        (published,) = publisher_t.sent
        assert isinstance(published, message.Published) and published.publication == exact_event.publication
    else:
        assert publisher_t.sent == []


def test_batch_line_missing_a_metadata_field_goes_through_decode() -> None:
    """A PSC301 without its message id (or origin, or time) is decode's to read, not the in-place read's."""
    session, owner = _consumer()
    lines = [orjson.dumps([psc.PUBLISH, "t", n, {"o": "n1", "t": 1.5, "s": n}]) for n in (1, 2)]
    session.receive(psc.BATCH_SEPARATOR.join(lines))
    assert owner.received == [psc.decode(line) for line in lines]


def test_first_event_of_a_retained_envelope_keeps_its_retained_detail() -> None:
    """event_bytes' first-EVENT path leaves an envelope with anything memoised (the retained flag) to the checks."""
    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.publishing import RETAINED

    router = WampRouter(Hub())
    session, transport = _joined(router)
    from autobahn.wamp import message

    session.onMessage(message.Subscribe(1, "com.example.t"))
    transport.sent.clear()
    envelope = Envelope("com.example.t", 7, "n")
    envelope.wire[RETAINED] = True
    assert session.deliver(envelope)
    event = transport.sent.pop()
    assert event.args == [7] and event.retained is True


def _producer_side() -> tuple[Any, Any, list[bytes]]:
    """A federation with replay and one open 0.6 producer link (its frames in the returned list)."""
    from twisted.internet.task import Clock

    from pubsubclub.core.hub import Hub
    from pubsubclub.federation import Federation
    from pubsubclub.federation.replay import ReplaySettings
    from pubsubclub.federation.session import LinkState

    hub = Hub("n1")
    federation = Federation(hub, reactor=Clock(), replay=ReplaySettings())
    sent: list[bytes] = []
    link = LinkSession(Role.PRODUCER, sent.append, federation, "peer", versions=V06)
    link._speak(psc.V0_6)
    link.state = LinkState.OPEN
    return federation, link, sent


def _expected(envelope: Any, seq: int | None, binary: bool = False) -> bytes:
    return psc.encode_publish_meta(
        envelope.topic, envelope.payload, envelope.origin, envelope.published_at, envelope.message_id,
        envelope.wamp_wrapped, seq=seq, binary=binary, options=envelope.options,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "wrapped", "options", "binary"),
    [
        (5, False, None, False),
        ("100%d %s", False, None, False),
        ({"args": [1], "kwargs": {"k": 2}}, True, None, False),
        (5, False, {"e": [7]}, False),
        (b"\x00\x01", False, None, True),
    ],
)
def test_forwarding_to_streams_sends_what_the_general_path_sends(
    payload: Any, wrapped: bool, options: Any, binary: bool
) -> None:
    """local_published's stream path gives each stream encode_publish_meta's bytes ("%", wrapped, options, bytes)."""
    federation, link, sent = _producer_side()
    federation.outbox.resume(link, "n2", psc.Resume(None, 0, ("t",)))
    envelopes = [federation.hub.envelope("t", payload, wamp_wrapped=wrapped, options=options) for _ in range(2)]
    for envelope in envelopes:
        federation.local_published(envelope)
    assert sent[-2:] == [_expected(e, n, binary) for n, e in enumerate(envelopes, 1)]


def test_forwarding_reaches_a_stream_that_takes_the_topic_by_a_pattern() -> None:
    """A stream that holds only a pattern matching the topic gets the message (the stream path steps aside)."""
    from pubsubclub.core.patterns import PREFIX, Pattern

    federation, link, sent = _producer_side()
    federation.outbox.resume(link, "n2", psc.Resume(None, 0, (), (Pattern(PREFIX, "com."),)))
    envelope = federation.hub.envelope("com.t", 1)
    federation.local_published(envelope)
    assert sent[-1:] == [_expected(envelope, 1)]


def test_forwarding_reaches_a_link_without_replay_next_to_a_stream() -> None:
    """A 0.2 link that asked for the topic gets the message as well as the 0.6 stream (the stream path steps aside)."""
    from pubsubclub.federation.session import LinkState

    federation, link, sent = _producer_side()
    federation.outbox.resume(link, "n2", psc.Resume(None, 0, ("com.t",)))
    old_sent: list[bytes] = []
    old = LinkSession(Role.PRODUCER, old_sent.append, federation, "old", versions=V06)
    old._speak(psc.V0_2)
    old.state = LinkState.OPEN
    federation.link_subscribed(old, ("com.t",))
    envelope = federation.hub.envelope("com.t", 1)
    federation.local_published(envelope)
    assert sent[-1:] == [_expected(envelope, 1)]
    assert old_sent == [_expected(envelope, None)]


def test_a_relayed_message_leaves_the_stream_path_for_split_horizon() -> None:
    """A primary relaying to 0.3+ streams takes the general path: a worker's message goes to the other node's and
    the other worker's streams (encode_publish_meta's bytes), not back to its worker; a node's, to workers only."""
    from pubsubclub.core.hub import Envelope
    from pubsubclub.federation.session import LinkState

    federation, node_link, node_sent = _producer_side()
    federation.enable_relay("n1.w", set())

    def link(role: Role, name: str, sent: list[bytes], worker: bool) -> LinkSession:
        session = LinkSession(role, sent.append, federation, name, versions=V06)
        session._speak(psc.V0_6)
        session.state = LinkState.OPEN
        session.peer_node, session.worker = name, worker
        return session

    w1_sent: list[bytes] = []
    w2_sent: list[bytes] = []
    streams = {"n2": node_link, "n1.w1": link(Role.PRODUCER, "n1.w1", w1_sent, True)}
    streams["n1.w2"] = link(Role.PRODUCER, "n1.w2", w2_sent, True)
    for name, session in streams.items():
        federation.outbox.resume(session, name, psc.Resume(None, 0, ("t",)))
    before = {"n2": len(node_sent), "n1.w1": len(w1_sent), "n1.w2": len(w2_sent)}
    from_w1 = Envelope("t", 5, "n1.w1", 1.5, "n1.w1-b-1")
    federation.local_published(from_w1, link(Role.CONSUMER, "n1.w1", [], True))
    from_n3 = Envelope("t", 6, "n3", 1.5, "n3-b-1")
    federation.local_published(from_n3, link(Role.CONSUMER, "n3", [], False))
    assert node_sent[before["n2"] :] == [_expected(from_w1, 1)]
    assert w1_sent[before["n1.w1"] :] == [_expected(from_n3, 1)]
    assert w2_sent[before["n1.w2"] :] == [_expected(from_w1, 1), _expected(from_n3, 2)]


# -- the plain PUBLISH path: JSON [16, id, {}, topic, [value]] straight to publish_plain ---------------------


class _Connection:
    """A transport connection as feed_session sees it."""

    def __init__(self, session: Any) -> None:
        self._session = session


def _json() -> Any:
    import copy

    from pubsubclub.core.jsonbounds import JSONBounds
    from pubsubclub.frontends.wamp.transport import bounded_serializers

    return copy.copy({s.SERIALIZER_ID: s for s in bounded_serializers(JSONBounds(max_depth=8))}["json"])


def _plain_outcome(frame: bytes, fast: bool, setup: Any = None) -> tuple[Any, ...]:
    """What a publisher's ``frame`` did (to it, a subscriber, the metrics): fed, or decoded and dispatched."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.transport import _BoundedJsonObjectSerializer, feed_session

    router = WampRouter(Hub(node_id="n"))
    publisher, publisher_t = _joined(router)
    subscriber, subscriber_t = _joined(router)
    subscriber.onMessage(message.Subscribe(1, "com.example.t"))
    subscriber_t.sent.clear()
    serializer = _json()
    feed_session(_Connection(publisher), serializer, b'[16,1,{},"com.example.t",[0]]', None)  # the topic now known
    subscriber_t.sent.clear()
    if setup is not None:
        setup(router, publisher)
    if not fast:
        # A subclass is not the serializer feed_session reads JSON itself for: decode's path, as before it.
        class General(_BoundedJsonObjectSerializer):  # type: ignore[misc]
            pass

        serializer._serializer = General(serializer._serializer._bounds)
    feed_session(_Connection(publisher), serializer, frame, None)
    _, counters, _ = router.hub.metrics.take_interval(0.0)
    events = [(m.args, m.kwargs, m.publisher == publisher.session_id, m.publisher_authrole) for m in subscriber_t.sent]
    answers = [(type(m).__name__, getattr(m, "reason", None), getattr(m, "error", None)) for m in publisher_t.sent]
    return events, answers, publisher._state.name, sorted((k, v) for k, v in counters.items() if k[2] != "delivered")


def test_a_plain_json_publish_goes_to_publish_plain_without_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain JSON PUBLISH reaches publish_plain without decode or a PublishRequest, and does what publish did."""
    from pubsubclub.frontends.wamp import transport

    frame = b'[16,7,{},"com.example.t",["v"]]'
    expected = _plain_outcome(frame, fast=False)
    assert expected[0] == [(["v"], None, False, None)]

    def refuse(*_: Any) -> Any:
        raise AssertionError("decoded through the general path")

    monkeypatch.setattr(transport, "decode", refuse)
    monkeypatch.setattr(transport, "decoded", refuse)
    assert _plain_outcome(frame, fast=True) == expected


def test_the_lean_latency_runs_publish_takes_the_plain_road(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean clients' paced PUBLISH is the Autobahn run's shape (one argument), so a node takes its plain road for
    both clients alike: fed with decode refused, it does what the general path does."""
    from pubsubclub.bench.lean import latency_publish
    from pubsubclub.frontends.wamp import transport

    frame = latency_publish(7, b"{}", b"com.example.t", 6, 1764259200.123456, b"x" * 100)
    expected = _plain_outcome(frame, fast=False)
    assert expected[0] == [([{"i": 6, "t": 1764259200.123456, "p": "x" * 100}], None, False, None)]

    def refuse(*_: Any) -> Any:
        raise AssertionError("decoded through the general path")

    monkeypatch.setattr(transport, "decode", refuse)
    monkeypatch.setattr(transport, "decoded", refuse)
    assert _plain_outcome(frame, fast=True) == expected


def _deny(router: Any, publisher: Any) -> None:
    class Role:
        name = "reader"

        def may_publish(self, topic: str) -> bool:
            return False

    publisher._role = Role()


def _too_large(router: Any, publisher: Any) -> None:
    router.hub.set_forward_check(lambda envelope: "too large for the links", 10)


def _disclose(router: Any, publisher: Any) -> None:
    router.disclose_publisher = "always"


def _raising_clock(router: Any, publisher: Any) -> None:
    def fail() -> float:
        raise RuntimeError("boom")

    router.hub._clock = fail


@pytest.mark.parametrize(
    ("frame", "setup"),
    [
        (b'[16,7,{},"com.example.t",["v"]]', _deny),
        (b'[16,7,{},"com.example.t",["v"]]', _too_large),
        (b'[16,7,{},"com.example.t",["v"]]', _disclose),
        (b'[16,7,{},"com.example.t",["v"]]', _raising_clock),
        (b'[16,7,{},"wamp.reserved",["v"]]', None),
        (b'[16,7,{},"com.example.new",["v"]]', None),
        (b'[16,7,{},"com..bad",["v"]]', None),
        (b'[16,7,{},"com.example.t",[[[[[[[[[1]]]]]]]]]]', None),
        (b'[16,7,{},"com.example.t",[[' + b",".join([b"[]"] * 20) + b"]]]", None),
        (b'[16,7,{},"com.example.t",[123456789012345678901234]]', None),
        (b'[16,7,{},"com.example.t",[1234567890123456789]]', None),
        (b'[16,7,{},"com.example.t",["\\u0000AAE="]]', None),
        (b'[16,7,{},"com.example.t",[1,2]]', None),
        (b'[16,7,{},"com.example.t",[]]', None),
        (b'[16,7,{"acknowledge":true},"com.example.t",["v"]]', None),
        (b'[16,7,{"exclude_me":false},"com.example.t",["v"]]', None),
        (b'[16,-1,{},"com.example.t",["v"]]', None),
        (b'[16,9007199254740993,{},"com.example.t",["v"]]', None),
        (b'[16.0,7,{},"com.example.t",["v"]]', None),
        (b'[16,7,[],"com.example.t",["v"]]', None),
        (b'[16,7,{},"com.example.t",{"a":1}]', None),
        (b'[16,true,{},"com.example.t",["v"]]', None),
        (b'[16,7,{},"com.example.t",["v"]', None),
        (b"null", None),
    ],
)
def test_the_plain_path_refuses_and_answers_as_the_general_path(frame: bytes, setup: Any) -> None:
    """Role, size, disclosure, a raising hub, URIs, bounds, binary values, other shapes: as the general path does."""
    assert _plain_outcome(frame, fast=True, setup=setup) == _plain_outcome(frame, fast=False, setup=setup)


def test_a_plain_publish_before_welcome_is_refused_as_before() -> None:
    """A plain PUBLISH on a session that has not joined is a protocol violation (ABORT), as onMessage makes it."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.transport import feed_session
    from pubsubclub.testing import MemoryWampTransport

    router = WampRouter(Hub())
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    feed_session(_Connection(session), _json(), b'[16,7,{},"com.example.t",["v"]]', None)
    (abort,) = transport.sent
    assert isinstance(abort, message.Abort) and abort.reason == "wamp.error.protocol_violation"


def _fixed_producer_side() -> tuple[Any, Any, list[bytes]]:
    """_producer_side with a fixed clock and message-id prefix: two of them publish the same bytes."""
    from twisted.internet.task import Clock

    from pubsubclub.core.hub import Hub
    from pubsubclub.federation import Federation
    from pubsubclub.federation.replay import ReplaySettings
    from pubsubclub.federation.session import LinkState

    hub = Hub("n1", clock=lambda: 1.5)
    hub._id_prefix = "n1-b-"
    federation = Federation(hub, reactor=Clock(), replay=ReplaySettings())
    sent: list[bytes] = []
    link = LinkSession(Role.PRODUCER, sent.append, federation, "peer", versions=V06)
    link._speak(psc.V0_6)
    link.state = LinkState.OPEN
    return federation, link, sent


def _stream_on(topic: str) -> Any:
    def setup(federation: Any, link: Any) -> None:
        federation.outbox.resume(link, "n2", psc.Resume(None, 0, (topic,)))

    return setup


_STREAM_ON_T = _stream_on("t")
_stream_on_other = _stream_on("other")


def _pattern_stream(federation: Any, link: Any) -> None:
    from pubsubclub.core.patterns import PREFIX, Pattern

    federation.outbox.resume(link, "n2", psc.Resume(None, 0, (), (Pattern(PREFIX, "t"),)))


def _old_link_too(federation: Any, link: Any) -> None:
    from pubsubclub.federation.session import LinkState

    federation.outbox.resume(link, "n2", psc.Resume(None, 0, ("t",)))
    old = LinkSession(Role.PRODUCER, link._send, federation, "old", versions=V06)
    old._speak(psc.V0_2)
    old.state = LinkState.OPEN
    federation.link_subscribed(old, ("t",))


@pytest.mark.parametrize("payload", [5, "100%d %s", b"\x00\x01", {"k": [1, None]}])
@pytest.mark.parametrize("setup", [_STREAM_ON_T, _stream_on_other, _pattern_stream, _old_link_too])
def test_hub_publish_plain_forwards_and_counts_what_publish_of_an_envelope_does(payload: Any, setup: Any) -> None:
    """publish_plain (no envelope for a forward-only publish) sends, numbers and counts as publish(envelope())."""
    outcomes = []
    for plain in (True, False):
        federation, link, sent = _fixed_producer_side()
        setup(federation, link)
        hub = federation.hub
        for _ in range(2):
            if plain:
                assert hub.publish_plain("t", payload, 9) == 0
            else:
                assert hub.publish(hub.envelope("t", payload, size=9)) == 0
        _, counters, _ = hub.metrics.take_interval(0.0)
        outcomes.append((sent, sorted(counters.items()), hub.stats, federation.outbox.summary()))
    assert outcomes[0] == outcomes[1]
    assert bool(outcomes[0][0]) is (setup is not _stream_on_other)


def test_hub_publish_plain_makes_the_envelope_publish_would_for_whoever_needs_it() -> None:
    """A local sink, a listener without the plain method and one that declines it get publish(envelope())'s envelope;
    the excluded sink gets nothing; a raising listener is isolated and counted."""
    from pubsubclub.core.hub import Envelope, Hub

    got: list[tuple[str, Envelope]] = []

    class Sink:
        def __init__(self, name: str) -> None:
            self.name = name

        def deliver(self, envelope: Envelope) -> None:
            got.append((self.name, envelope))

    class Listener:
        def local_published(self, envelope: Envelope) -> None:
            got.append(("listener", envelope))

    class Declining(Listener):
        def local_published_plain(self, *fields: Any) -> bool:
            got.append(("declined", fields))  # type: ignore[arg-type]
            return False

    class Raising:
        def local_published_plain(self, *fields: Any) -> bool:
            raise RuntimeError("boom")

        def local_published(self, envelope: Envelope) -> None:
            raise RuntimeError("boom")

    hub = Hub("n1", clock=lambda: 1.5)
    publisher, other = Sink("publisher"), Sink("other")
    for listener in (Raising(), Declining(), Listener()):
        hub.add_publish_listener(listener)  # type: ignore[arg-type]
    hub.publish_plain("t", 5, 9)  # no sink: the envelope made for the listeners
    hub.subscribe("t", publisher)
    hub.subscribe("t", other)
    assert hub.publish_plain("t", 6, 9, exclude=publisher) == 1
    first = Envelope("t", 5, "n1", 1.5, f"{hub._id_prefix}1", False, 9)
    second = Envelope("t", 6, "n1", 1.5, f"{hub._id_prefix}2", False, 9)
    assert got == [
        ("declined", ("t", 5, "n1", 1.5, first.message_id)),
        ("listener", first),
        ("listener", first),
        ("other", second),
        ("listener", second),
        ("listener", second),
    ]
    assert [e.size for _, e in got if isinstance(e, Envelope)] == [9] * 5
    assert hub.metrics.sink_errors == {"Raising": 2} and hub.stats["published"] == 2


def test_publish_plain_counts_are_held_bounded_and_added_before_every_read() -> None:
    """publish_plain's published counts reach every read of the metrics in full, held for at most 1,024 topics."""
    from pubsubclub.core.counters import Source
    from pubsubclub.core.hub import MAX_HELD_PUBLISHED, Hub

    hub = Hub("n1")
    for i in range(MAX_HELD_PUBLISHED + 5):
        hub.publish_plain(f"t{i}", i, 10, counted_as=Source.WAMP)
        assert len(hub._published_counts) <= MAX_HELD_PUBLISHED
    hub.publish_plain("t0", 0, 7, counted_as=Source.WAMP)
    hub.publish_plain("t0", 0, 7)  # not counted by the hub: the caller counts
    _, counters, _ = hub.metrics.take_interval(0.0)
    published = {k[0]: v for k, v in counters.items() if k[1:] == ("wamp", "published", None, None)}
    assert len(published) == MAX_HELD_PUBLISHED + 5 and published["t0"] == [2, 17] and published["t9"] == [1, 10]
    assert hub.stats["published"] == MAX_HELD_PUBLISHED + 7


def test_a_raise_in_the_plain_path_aborts_the_session_as_onmessage_does() -> None:
    """An internal error while publishing plainly is logged and answered with ABORT, the session closed."""
    events, answers, state, _ = _plain_outcome(b'[16,7,{},"com.example.t",["v"]]', fast=True, setup=_raising_clock)
    assert events == [] and answers == [("Abort", "wamp.error.protocol_violation", None)] and state == "CLOSED"


def test_a_link_frame_asks_the_queue_cap_only_with_bytes_queued_and_drops_the_link_past_it() -> None:
    """_write_frame: nothing queued writes without asking the cap; queued past the cap drops the link unwritten."""
    from pubsubclub.federation.transport import _LinkProtocolBase

    asked: list[Any] = []

    class Federation:
        def queue_cap(self, session: Any) -> int:
            asked.append(session)
            return 100

        def link_overflow(self, session: Any, queued: int) -> None:
            asked.append(("overflow", queued))

    class Factory(_Factory):
        federation = Federation()

    class Backlog:
        paused = False
        since_pause = 0
        queued = 0

        def unsent(self) -> int:
            return self.queued

    class Link(_Protocol):
        _seal = None
        _overflowed = False
        session = "s"
        dropped: Any = None

        def dropConnection(self, abort: bool) -> None:  # noqa: N802 - Autobahn API
            self.dropped = abort

    link = Link()
    link.factory = Factory()
    backlog = link._backlog = Backlog()
    _LinkProtocolBase._write_frame(link, b"one")  # type: ignore[arg-type]
    assert asked == [] and link.transport.writes == [b"\x81\x03one"]
    backlog.queued, backlog.paused = 50, True
    _LinkProtocolBase._write_frame(link, b"two")  # type: ignore[arg-type]
    assert asked == ["s"] and backlog.since_pause == 3 and len(link.transport.writes) == 2
    backlog.queued = 101
    _LinkProtocolBase._write_frame(link, b"three")  # type: ignore[arg-type]
    assert asked == ["s", "s", ("overflow", 101)] and link.dropped is True and len(link.transport.writes) == 2


_DEEP = b"[" * 70 + b"1" + b"]" * 70
_LONE = [
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1}]',  # the in-place read
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1,"w":1}]',
    b'[301,"t",1,{"o":"n1","t":1,"i":"x","s":1}]',  # integer time: decode's
    b'[301,"t",1]',  # no metadata
    b'[301,"t",' + _DEEP + b',{"o":"n1","t":1.5,"i":"x","s":1}]',  # too deep: dropped
    b'[301,"t",12345678901234567890123,{"o":"n1","t":1.5,"i":"x","s":1}]',  # beyond 64 bits: dropped
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":0}]',  # bad sequence number
    b'[301,"t",1,{"o":"n1","t":-1.0,"i":"x","s":1}]',  # publish time out of range: dropped
    b'[301,"",1,{"o":"n1","t":1.5,"i":"x","s":1}]',  # empty topic
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1},5]',
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1,"p":{"e":[7]}}]',  # routing object
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1,"b":1}]',
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1,"b":null}]',
    b'[104,"e",5,0]',  # a PSC104 (first or second)
    b'[201,"t"]',  # a consumer never takes PSC201
    b"[402,1,{},[1]]",  # an RPC message
    b"",
    b"not json",
    b'{"a":1}',
    b"[]",
    b'["301","t",1]',
    b'[301,"t",1,{"o":"n1","t":1.5,"i":"x","s":1}]' + b" " * 2_000_000,  # over the frame limit
]


@pytest.mark.parametrize("frame", _LONE)
@pytest.mark.parametrize(("version", "position"), [(psc.V0_6, True), (psc.V0_6, False), (psc.V0_2, False),
                                                   (psc.V0_1, False)])  # fmt: skip
def test_a_lone_frame_on_the_fast_path_has_the_slow_paths_outcome(
    frame: bytes, version: psc.Version, position: bool
) -> None:
    """A lone frame on an open consumer link (the batch reader's path) ends as _receive_one's did: errors, drops."""
    fast_session, fast_owner = open_consumer(version, position)
    slow_session, slow_owner = open_consumer(version, position)
    assert outcome(fast_session, fast_owner, fast_session.receive, frame) == outcome(
        slow_session, slow_owner, slow_session._receive_one, frame
    )


def test_a_dialled_link_reads_past_the_endpoint_wrappers_and_still_redials() -> None:
    """The dialled side's endpoint wrapper hands reads straight to the link; its loss still makes the service redial."""
    from functools import partial

    from pubsubclub.testing import MemoryNetwork, RecordingSink, psc_url

    net = MemoryNetwork()
    a = net.node("a", 9001)
    b = net.node("b", 9002)
    b.add_server(psc_url(9001))
    [link] = net.answer()
    read = vars(link.pump.client)["dataReceived"]  # the endpoint's _WrappingProtocol, as the transport calls it
    assert type(read) is partial and read.func is wsframes.receive_data and read.args == (link.client,)
    sink = RecordingSink()
    b.hub.subscribe("t", sink)
    net.flush()
    a.hub.publish(a.hub.envelope("t", 1))
    net.flush()
    assert [e.payload for e in sink.got] == [1]
    link.server_wire.loseConnection()
    net.flush()
    assert b.open_links() == 0 and net.dials() == 1
    net.advance(MemoryNetwork.retry.initial * 1.5)
    assert net.dials() == 2
    [again] = net.answer()
    a.hub.publish(a.hub.envelope("t", 2))
    net.flush()
    assert [e.payload for e in sink.got] == [1, 2] and b.open_links() == 1
    net.stop()


def _receiving(replay: bool) -> tuple[Any, LinkSession, Any, Any]:
    """A federation (its clock at 100 s) with one open consumer link from node "a"; sinks on "t" and the gap topic."""
    from twisted.internet.task import Clock

    from pubsubclub.core.hub import GAP_TOPIC, Hub
    from pubsubclub.federation import Federation
    from pubsubclub.federation.replay import ReplaySettings
    from pubsubclub.federation.session import LinkState
    from pubsubclub.testing import RecordingSink

    clock = Clock()
    clock.advance(100.0)
    federation = Federation(Hub("b"), reactor=clock, replay=ReplaySettings() if replay else None)
    sink, gaps = RecordingSink(), RecordingSink()
    federation.hub.subscribe("t", sink)
    federation.hub.subscribe(GAP_TOPIC, gaps)
    session = LinkSession(Role.CONSUMER, lambda data: None, federation, "ws://a", versions=V06)
    session.peer_node = "a"
    session._speak(psc.V0_6 if replay else psc.V0_2)
    session.state = LinkState.OPEN
    if replay:
        session.resumed = True
        federation.inbox.positioned("a", psc.Position("e", 0, 0))
    return federation, session, sink, gaps


@pytest.mark.parametrize("replay", [True, False])
def test_a_lone_psc301_is_received_as_a_batch_of_it_would_be(replay: bool) -> None:
    """One message at a time (_received_one) gives the batch path's deliveries, gaps, duplicates and metrics."""
    meta = psc.Meta
    messages = [
        psc.Publish("t", 1, meta("n1", 99.5, "n1-b-1", False, 1 if replay else None)),
        psc.Publish("t", {"args": [2], "kwargs": {}}, meta("n1", 99.0, "n1-b-2", True, 2 if replay else None)),
        psc.Publish("t", 3, meta("n1", 99.0, "n1-b-3", False, 2 if replay else None)),  # a duplicate with replay
        psc.Publish("t", 4, meta(None, 98.0, "n1-b-4", False, 5 if replay else None, options={"e": [7]})),  # a gap
        psc.Publish("u", 5, meta("n3", None, "n3-b-1", False, 6 if replay else None)),  # no subscriber, no time
    ]
    if not replay:
        messages.append(psc.Publish("t", 6))
    sizes = [40 + n for n in range(len(messages))]
    results = []
    for lone in (True, False):
        federation, session, sink, gaps = _receiving(replay)
        if lone:
            for message, size in zip(messages, sizes, strict=True):
                federation.link_received_batch(session, [message], [size])
        else:
            federation.link_received_batch(session, messages, sizes)
        metrics = federation.hub.metrics
        _, counts, latencies = metrics.take_interval(200.0)
        results.append((
            [(e.topic, e.payload, e.origin, e.published_at, e.message_id, e.wamp_wrapped, e.size, e.options)
             for e in sink.got],
            [e.payload for e in gaps.got],
            metrics.view("federation"), metrics.view("hub"), dict(metrics.link_counts), counts,
            {origin: (h.counts, h.count, h.sum_ms) for origin, h in latencies.items()},
        ))  # fmt: skip
    assert results[0] == results[1]
    assert [p for _, p, *_ in results[0][0]][:2] == [1, {"args": [2], "kwargs": {}}]


@pytest.mark.parametrize("size", [5, 126, 70_000])
def test_websocket_send_encoded_holds_what_send_held_would(size: int) -> None:
    """During a hold a WAMP WebSocket EVENT is held (bytes, traffic counters) exactly as send_held holds it."""
    from test_wsslim import joined

    got = []
    for direct in (True, False):
        protocol, wire, _ = joined()
        data = b'"' + b"x" * size + b'"'
        before = protocol.trafficStats.outgoingOctetsWireLevel  # WELCOME's length varies with its session id
        assert wsframes.hold_writes()
        try:
            if direct:
                protocol.send_encoded(data)
                protocol.send_encoded(data)
            else:
                wsframes.send_held(protocol, data, False)
                wsframes.send_held(protocol, data, False)
            held = list(wsframes._held[protocol])  # type: ignore[index]
            assert protocol.unsent_bytes() == held[0]
        finally:
            wsframes.release_writes()
        stats = protocol.trafficStats
        got.append((held, wire.value(), stats.outgoingWebSocketMessages, stats.outgoingOctetsWireLevel - before))
    assert got[0] == got[1] and got[0][1]


def test_websocket_send_encoded_leaves_a_queueing_connection_to_send_held() -> None:
    """A connection with frames queued in Autobahn (chopped sends) is not held past them: send_held's fallback."""
    from test_wsslim import joined

    protocol, wire, _ = joined()
    protocol._slim_queue = [b"queued"]  # what a chopped send leaves queued
    calls = []
    protocol.sendMessage = lambda payload, binary: calls.append(payload)
    assert wsframes.hold_writes()
    try:
        protocol.send_encoded(b"[36]")
        assert wsframes._held == {}
    finally:
        wsframes.release_writes()
    assert calls == [b"[36]"]


class _CountedSink:
    """A hub sink answering ``answer`` (True, False, None, a fan-out count) or raising, counted as WAMP."""

    def __init__(self, answer: Any) -> None:
        from pubsubclub.core.counters import Source

        self.counts_as = Source.WAMP
        self.answer = answer
        self.got: list[Any] = []

    def deliver(self, envelope: Any) -> Any:
        self.got.append(envelope.payload)
        if self.answer == "raise":
            raise RuntimeError("sink bug")
        return self.answer


def test_remote_delivery_to_exact_subscribers_counts_as_the_general_path() -> None:
    """deliver_remote_batch's loop (no pattern) delivers and counts as _deliver_to does, raising sinks too."""
    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.core.patterns import PREFIX, Pattern
    from pubsubclub.testing import RecordingSink

    results = []
    for with_pattern in (False, True):
        hub = Hub("b")
        sinks = [_CountedSink(a) for a in (True, False, None, 3, "raise")]
        for sink in sinks:
            hub.subscribe("t", sink)  # type: ignore[arg-type]
        if with_pattern:  # a pattern that matches: the general path, _deliver_to
            hub.subscribe_pattern(Pattern(PREFIX, "t"), RecordingSink())
        delivered = hub.deliver_remote_batch([Envelope("t", n, "a", size=10 + n) for n in range(2)])
        _, counts, _ = hub.metrics.take_interval(1.0)
        results.append((delivered - 2 * with_pattern, [s.got for s in sinks], counts, hub.metrics.sink_errors,
                        hub.metrics.view("hub")["delivered"] - 2 * with_pattern))  # fmt: skip
    assert results[0] == results[1]
    assert results[0][0] == 8


def test_random_wamp_id_draws_in_the_spec_range_without_a_python_frame() -> None:
    """random_wamp_id gives distinct ints in 1..2**53 and runs no Python function (one per EVENT)."""
    import sys

    from pubsubclub.frontends.wamp.uris import random_wamp_id

    frames: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        ids = [random_wamp_id() for _ in range(1000)]
    finally:
        sys.setprofile(None)
    assert frames == [] or set(frames) == {"<listcomp>"}
    assert all(type(i) is int and 1 <= i <= 2**53 for i in ids) and len(set(ids)) == 1000


_MULTILINE = [
    b'[301,"t",' + b"[\n" * 70 + b"1" + b"]" * 70 + b',{"o":"n1","t":1.5,"i":"x"}]',  # too deep, a bracket a line
    b'[301,"t",\n' + b"[" * 70 + b"1" + b"]" * 70 + b"]",
    b'[301,\n"t",\n{"k": [1,\n2]},\n{"o":"n1","t":1.5,"i":"x"}\n]',  # pretty-printed, within bounds
]


@pytest.mark.parametrize("frame", _MULTILINE)
@pytest.mark.parametrize("version", [psc.V0_2, psc.V0_1])
def test_a_multiline_frame_on_a_link_without_batches_is_one_message_checked_whole(
    frame: bytes, version: psc.Version
) -> None:
    """Before 0.4 a frame with newlines is one message: the fast path checks its bounds whole, as decode does."""
    fast_session, fast_owner = open_consumer(version, False)
    slow_session, slow_owner = open_consumer(version, False)
    fast = outcome(fast_session, fast_owner, fast_session.receive, frame)
    assert fast == outcome(slow_session, slow_owner, slow_session._receive_one, frame)
    if frame.count(b"[") > 64:
        assert fast[1][0][0] == "dropped"


# -- node B's relayed PSC301 -> EVENT: the lone message as its fields, the EVENT without its layers --------------


class _AsBatch(list):  # type: ignore[type-arg]
    """One message that link_received_batch takes for several: its general branch (_envelopes, the hub's batch)."""

    def __len__(self) -> int:
        return 2


def _serializers() -> dict[str, Any]:
    import copy

    from pubsubclub.core.jsonbounds import JSONBounds
    from pubsubclub.frontends.wamp.transport import bounded_serializers

    return {s.SERIALIZER_ID: copy.copy(s) for s in bounded_serializers(JSONBounds())}


def _relayed_outcome(frames: list[bytes], fast: bool, replay: bool, setup: str) -> tuple[tuple[Any, ...], int, int]:
    """What ``frames`` on B's link did to B's WAMP subscribers, the link and the metrics; plain reads, plain EVENTs."""
    import itertools

    from autobahn.wamp import message

    from pubsubclub.federation.receiving import Receiving
    from pubsubclub.frontends.wamp import WampRouter

    federation, session, _, _ = _receiving(replay)
    hub = federation.hub
    router = WampRouter(hub, new_id=itertools.count(1000).__next__)
    subscribers = []
    names = ("json", "json", "msgpack")
    if setup.startswith("single"):
        names = ("msgpack",) if setup == "single-msgpack" else ("json",)
    for name in names:
        subscriber, transport = _joined(router)
        transport.serializer = _serializers()[name]
        subscriber.onMessage(message.Subscribe(1, "com.example.t"))
        subscribers.append((subscriber, transport))
    if setup == "single-lagging":
        subscribers[0][1].unsent = 10**9
    elif setup == "single-raising":
        transport = subscribers[0][1]
        encoded = transport.send_encoded

        def raising(data: bytes) -> None:
            if b"boom" in data:
                raise RuntimeError("transport bug")
            encoded(data)

        transport.send_encoded = raising  # type: ignore[method-assign]
    if setup == "pattern":
        subscriber, transport = subscribers[2]
        subscriber.onMessage(message.Subscribe(2, "com.example", match="prefix"))
    elif setup == "lagging":
        subscribers[1][1].unsent = 10**9
    elif setup == "closed":
        subscribers[0][1].open = False
        subscribers[0][0].onClose(False)
    elif setup == "unpositioned" and federation.inbox is not None:
        federation.inbox._positions.clear()  # no PSC104 heard: the inbox counts from the first message
    for _, transport in subscribers:
        transport.sent.clear()
        transport.encoded.clear()
    plain: list[bytes] = []
    plain_events: list[bool] = []
    if fast:
        taken = session._received_plain
        assert taken is not None

        def counted(*args: Any) -> None:
            plain.append(args[1])
            taken(*args)

        session._received_plain = counted
        for subscriber, _ in subscribers:
            sent_plain = subscriber.deliver_plain

            def deliver_plain(*args: Any, sent_plain: Any = sent_plain) -> Any:
                sent = sent_plain(*args)
                if sent is not None:
                    plain_events.append(sent)
                return sent

            subscriber.deliver_plain = deliver_plain
    else:
        session._received_plain = None
        federation.link_received_batch = (  # type: ignore[method-assign]
            lambda s, messages, sizes: Receiving.link_received_batch(federation, s, _AsBatch(messages), sizes)
        )
    topic = router.hub_topic("realm1", "com.example.t")
    results = []
    for frame in frames:
        try:
            session.receive(frame.replace(b'"T"', orjson.dumps(topic)))
            results.append(None)
        except Exception as e:  # noqa: BLE001 - compared, whatever it is
            results.append((type(e), getattr(e, "code", None), str(e)))
    metrics = hub.metrics
    _, counts, latencies = metrics.take_interval(200.0)
    return (
        results, [(t.encoded, t.dropped) for _, t in subscribers], session.state, session.last_size,
        metrics.view("federation"), metrics.view("hub"), dict(metrics.link_counts), counts,
        {origin: (h.counts, h.count, h.sum_ms) for origin, h in latencies.items()}, dict(metrics.sink_errors),
    ), len(plain), len(plain_events)  # fmt: skip


_RELAYED = [
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":1}]',  # the plain path
    b'[301,"T",{"args":[2,3],"kwargs":{"k":1}},{"o":"n1","t":99.5,"i":"x","s":2,"w":1}]',  # wrapped
    b'[301,"T",{"args":7},{"o":"n1","t":99.5,"i":"x","s":3,"w":1}]',  # "wrapped", but not a wrapper
    b'[301,"T","\\u0000AAE=",{"o":"","t":99.5,"i":"x","s":4}]',  # a binary-looking string; no origin
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":4}]',  # a duplicate
    b'[301,"T",[1,{"a":null}],{"o":"n1","t":101.0,"i":"x","s":9}]',  # a gap; published "after" now
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":10,"w":2}]',  # bad "w"
    b'[301,"T",' + _DEEP + b',{"o":"n1","t":99.5,"i":"x","s":11}]',  # too deep for the link
    b'[301,"T",[[[[[[[[[1]]]]]]]]],{"o":"n1","t":99.5,"i":"x","s":12}]',  # deeper than the clients' bound
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":13,"p":{"e":[7]}}]',  # a routing object: decode's
    b'[301,"T",1,{"o":"n1","t":99,"i":"x","s":14}]',  # an integer time: decode's
    b'[301,"T",1,{"o":7,"t":99.5,"i":"x","s":15}]',  # a bad origin
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":16}]  ',  # trailing blanks
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":17,"s":18}]',  # a repeated key
    b'[301,"T",1e400,{"o":"n1","t":99.5,"i":"x","s":19}]',  # not a number orjson reads
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x"}]',  # no sequence number on a replay link
    b'[301,"com.example.other",1,{"o":"n1","t":99.5,"i":"x","s":20}]',  # nobody subscribed
    b'[301,"T","boom",{"o":"n1","t":99.5,"i":"x","s":21}]',  # a transport that raises on it (single-raising)
    b'[301,"T",1,{"o":"n1","t":99.5,"i":"x","s":22}]',
]


_SINGLE = ["single", "single-msgpack", "single-lagging", "single-raising"]


@pytest.mark.parametrize("setup", ["plain", "pattern", "lagging", "closed", "unpositioned", *_SINGLE])
@pytest.mark.parametrize("replay", [True, False])
def test_a_relayed_psc301_reaches_wamp_subscribers_as_the_general_path_sends_it(replay: bool, setup: str) -> None:
    """Hostile lone PSC301s as fields (link_received_plain, deliver_remote_plain/one, EVENTs): the general outcome."""
    frames = _RELAYED if replay else [f.replace(b',"s":', b',"_":') for f in _RELAYED]
    (fast, plain, plain_events), (general, none, no_events) = (
        _relayed_outcome(frames, f, replay, setup) for f in (True, False)
    )
    assert fast == general
    assert (plain, none) == (12 if replay else 13, 0)  # the plain path was taken where it applies, and only there
    # Without an envelope only to a lone subscriber that can take it (8 plain values, 10 without replay's checks).
    taking = setup in ("single", "single-msgpack", "single-raising")
    assert (plain_events, no_events) == ((8 if replay else 10) if taking else 0, 0)
    if setup not in ("single-msgpack", "single-lagging"):
        events = fast[1][1][0] if setup == "closed" else fast[1][0][0]
        assert [orjson.loads(e)[3:] for e in events[:2]] == [[{}, [1]], [{}, [2, 3], {"k": 1}]]
    if setup == "single-raising":
        # The send failed inside the session (logged, not a sink error), and the next message went out.
        assert fast[-1] == {} and all(b"boom" not in e for e in fast[1][0][0]) and fast[1][0][0][-1].endswith(b"[1]]")


@pytest.mark.parametrize("with_pattern", [False, True])
def test_deliver_remote_one_delivers_and_counts_as_a_batch_of_it(with_pattern: bool) -> None:
    """deliver_remote_one (no tuple, tally or lists) delivers, counts and fails as a batch of one, any sink."""
    from pubsubclub.core.counters import Source
    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.core.patterns import PREFIX, Pattern
    from pubsubclub.testing import RecordingSink

    results = []
    for one in (True, False):
        hub = Hub("b")
        sinks = [_CountedSink(a) for a in (True, 0, False, None, 3, "raise", 2)]
        sinks[1].counts_as = sinks[4].counts_as = Source.TEP  # a second front-end, one of whose sinks reaches no one
        sinks.append(RecordingSink())  # not counted by the hub
        for sink in sinks:
            hub.subscribe("t", sink)  # type: ignore[arg-type]
        if with_pattern:
            hub.subscribe_pattern(Pattern(PREFIX, "t"), _CountedSink(True))  # type: ignore[arg-type]
        envelopes = [Envelope("t", n, "a", size=10 + n) for n in range(3)] + [Envelope("u", 9, "a", size=None)]
        delivered = [hub.deliver_remote_one(e) if one else hub.deliver_remote_batch([e]) for e in envelopes]
        _, counts, _ = hub.metrics.take_interval(1.0)
        results.append((delivered, [getattr(s, "got", None) for s in sinks], counts, dict(hub.metrics.sink_errors),
                        hub.metrics.view("hub")))  # fmt: skip
    assert results[0] == results[1]
    if not with_pattern:  # WAMP: 1 + 1 + 2 clients per message, TEP: 3
        counts = results[0][2]
        assert counts[("t", "wamp", "delivered", None, None)] == [12, 4 * (10 + 11 + 12)]
        assert counts[("t", "tep", "delivered", None, None)] == [9, 3 * (10 + 11 + 12)]


def test_held_delivered_and_received_counts_are_bounded_and_added_before_every_read() -> None:
    """The relayed path's held delivered/received counts reach every read in full, held for at most 1,024 keys each."""
    from pubsubclub.core.hub import MAX_HELD_PUBLISHED, Envelope
    from pubsubclub.federation.receiving import MAX_HELD_RECEIVED

    federation, session, _, _ = _receiving(replay=False)
    hub = federation.hub
    for i in range(MAX_HELD_RECEIVED + 5):
        hub.subscribe(f"t{i}", _CountedSink(True))  # type: ignore[arg-type]
        federation.link_received_plain(session, f"t{i}", i, "n1", 99.0, "x", False, None, 10)
        assert len(federation._received_counts) <= MAX_HELD_RECEIVED
        assert len(hub._delivered_counts) <= MAX_HELD_PUBLISHED
    hub.deliver_remote_one(Envelope("t0", 0, "n1", size=7))
    _, counters, latencies = hub.metrics.take_interval(200.0)
    received = {k[0]: v for k, v in counters.items() if k[1:] == ("psc", "received", "a", None)}
    delivered = {k[0]: v for k, v in counters.items() if k[1:] == ("wamp", "delivered", None, None)}
    assert len(received) == len(delivered) == MAX_HELD_RECEIVED + 5
    assert received["t0"] == [1, 10] and delivered["t0"] == [2, 17] and delivered["t9"] == [1, 10]
    assert hub.metrics.view("federation")["received"] == len(received) == latencies["n1"].count
    assert federation._received_counts == {} and hub._delivered_counts == {}


def test_the_json_serializer_writes_through_a_c_callable_the_methods_bytes() -> None:
    """The bounded JSON serializer's serialize is a C callable giving the method's bytes (binary values too)."""
    import types

    from pubsubclub.frontends.wamp.transport import _BoundedJsonObjectSerializer

    serializer = _serializers()["json"]._serializer
    assert type(serializer) is _BoundedJsonObjectSerializer
    assert not isinstance(serializer.serialize, (types.FunctionType, types.MethodType))
    for value in ([36, 1, 2, {}, [b"\x00\x01", {"k": [1.5, None, "\u0000x", "é"]}]], [36, 1, 2, {}, [2**63 - 1]]):
        assert serializer.serialize(value) == _BoundedJsonObjectSerializer.serialize(serializer, value)
    with pytest.raises(TypeError):
        serializer.serialize([{1, 2}])

    class Own(_BoundedJsonObjectSerializer):  # type: ignore[misc]
        def serialize(self, obj: Any) -> bytes:
            return b"own"

    assert Own(serializer._bounds).serialize([1]) == b"own"  # a subclass's own method is left alone


@pytest.mark.parametrize("name", ["json", "msgpack", "cbor"])
@pytest.mark.parametrize("setup", ["plain", "wrapped", "retained", "second"])
def test_the_inline_first_event_is_what_event_bytes_makes(name: str, setup: str) -> None:
    """BrokerSession.deliver's own first EVENT: event_bytes' bytes, memo and publication id, any wire format."""
    import itertools

    from autobahn.wamp import message

    from pubsubclub.core.hub import Envelope, Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.publishing import PUBLICATION, RETAINED, event_bytes

    payloads = [1, "\u0000AAE=", b"\x00\x01", {"args": [1], "kwargs": {"k": [None, 2.5]}}, [1, {"a": "é"}]]
    for payload in payloads:
        router = WampRouter(Hub(), new_id=itertools.count(7).__next__)
        session, transport = _joined(router)
        transport.serializer = _serializers()[name]
        session.onMessage(message.Subscribe(1, "com.example.t"))
        subscription = session._topics["com.example.t"]
        made = [Envelope("com.example.t", payload, "n", wamp_wrapped=setup == "wrapped") for _ in range(2)]
        if setup == "retained":
            for envelope in made:
                envelope.wire[RETAINED] = True
        if setup == "second":  # another subscriber's EVENT made first: the memo holds the publication
            for envelope in made:
                envelope.wire[PUBLICATION] = 99
        transport.encoded.clear()
        assert session.deliver(made[0]) is True
        drawn = router.new_id() - 1  # the id deliver drew, if it drew one: the one before this draw
        same_id = itertools.repeat(drawn).__next__
        expected = event_bytes(made[1], subscription, transport.object_serializer, same_id, None)
        assert transport.encoded == [expected] and made[0].wire == made[1].wire


class _PlainSink(_CountedSink):
    """A _CountedSink that also takes plain values: answers ``plain`` (True, False, None: the envelope) or raises."""

    takes_plain = True

    def __init__(self, answer: Any, plain: Any) -> None:
        super().__init__(answer)
        self.plain = plain

    def deliver_plain(self, topic: str, payload: Any, message_id: str | None) -> Any:
        if self.plain is not None:
            self.got.append(payload)
        if self.plain == "raise":
            raise RuntimeError("sink bug")
        return self.plain


@pytest.mark.parametrize(("answer", "plain"), [(True, True), (False, False), (True, None), (False, None),
                                               ("raise", "raise"), (True, "raise")])  # fmt: skip
def test_deliver_remote_plain_delivers_and_counts_as_deliver_remote_one(answer: Any, plain: Any) -> None:
    """Without an envelope (a lone sink taking plain values) or with one: the same deliveries, counts and failures."""
    from pubsubclub.core.hub import Envelope, Hub

    results = []
    for fields in (True, False):
        hub = Hub("b")
        sink = _PlainSink(answer, plain if plain != "raise" or fields else "raise")
        if not fields and plain == "raise":
            sink.answer = "raise"  # what a raise in deliver_plain stands for: deliver raising
        hub.subscribe("t", sink)  # type: ignore[arg-type]
        if fields:
            delivered = hub.deliver_remote_plain("t", 5, "a", 1.0, "a-1", False, 12)
        else:
            delivered = hub.deliver_remote_one(Envelope("t", 5, "a", 1.0, "a-1", False, 12))
        _, counts, _ = hub.metrics.take_interval(1.0)
        results.append((delivered, sink.got, counts, dict(hub.metrics.sink_errors), hub.metrics.view("hub")))
    assert results[0] == results[1]


# -- node A: a plain PUBLISH to the link, the link's batch at the turn end --------------------------------


def _publishing_outcome(frames: list[bytes], fast: bool, setup: Any = None) -> tuple[Any, ...]:
    """What a publisher's ``frames`` did on node A (link bytes, metrics, answers), fed plainly or through decode."""
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.transport import _BoundedJsonObjectSerializer, feed_session

    federation, link, sent = _fixed_producer_side()
    router = WampRouter(federation.hub)
    federation.outbox.resume(link, "n2", psc.Resume(None, 0, (router.hub_topic("realm1", "com.example.t"),)))
    publisher, publisher_t = _joined(router)
    publisher._session_id = 4242  # random per session: one id on both routes (a disclosed publisher's bytes)
    serializer = _json()
    feed_session(_Connection(publisher), serializer, b'[16,1,{},"com.example.t",[0]]', None)  # the topic now known
    if setup is not None:
        setup(router, publisher)
    if not fast:
        class General(_BoundedJsonObjectSerializer):  # type: ignore[misc]
            pass

        serializer._serializer = General(serializer._serializer._bounds)
    before = len(sent)
    for frame in frames:
        feed_session(_Connection(publisher), serializer, frame, None)
    _, counters, _ = federation.hub.metrics.take_interval(0.0)
    answers = [(type(m).__name__, getattr(m, "reason", None), getattr(m, "error", None)) for m in publisher_t.sent]
    metrics = federation.hub.metrics
    views = metrics.view("federation"), metrics.view("hub")
    return sent[before:], sorted(counters.items()), views, federation.hub.stats, federation.outbox.summary(), answers


@pytest.mark.parametrize("setup", [None, _deny, _too_large, _disclose, _raising_clock])
def test_a_plain_publish_reaches_the_link_as_the_general_path_sends_it(setup: Any) -> None:
    """Node A: plain PUBLISHes (good, new topic, bad URI, reserved, "%") leave the same link bytes, counts, answers."""
    frames = [
        b'[16,7,{},"com.example.t",["v"]]',
        b'[16,8,{},"com.example.t",["100%d %s"]]',
        b'[16,9,{},"com.example.t",[{"k":[1,null]}]]',
        b'[16,10,{},"com.example.new",["v"]]',
        b'[16,11,{},"com..bad",["v"]]',
        b'[16,12,{},"wamp.reserved",["v"]]',
        b'[16,13,{},"com.example.t",["' + b"x" * 300 + b'"]]',
    ]
    fast = _publishing_outcome(frames, fast=True, setup=setup)
    assert fast == _publishing_outcome(frames, fast=False, setup=setup)
    assert bool(fast[0]) is (setup not in (_too_large, _deny, _raising_clock))


def test_an_acknowledged_publish_a_local_subscriber_takes_names_its_events_publication() -> None:
    """A local subscriber (exact or pattern) gets the EVENT whose publication id the publisher's PUBLISHED names."""
    from autobahn.wamp import message

    from pubsubclub.core.hub import Hub
    from pubsubclub.frontends.wamp import WampRouter
    from pubsubclub.frontends.wamp.transport import feed_session

    for subscribe in (message.Subscribe(1, "com.example.t"), message.Subscribe(1, "com.example", match="prefix")):
        router = WampRouter(Hub(node_id="n"))
        publisher, publisher_t = _joined(router)
        subscriber, subscriber_t = _joined(router)
        subscriber.onMessage(subscribe)
        subscriber_t.sent.clear()
        serializer = _json()
        feed_session(_Connection(publisher), serializer, b'[16,1,{},"com.example.t",[0]]', None)  # the topic known
        subscriber_t.sent.clear()
        feed_session(_Connection(publisher), serializer, b'[16,7,{"acknowledge":true},"com.example.t",["v"]]', None)
        (event,) = subscriber_t.sent
        (published,) = publisher_t.sent
        assert isinstance(published, message.Published) and published.request == 7
        assert isinstance(event, message.Event) and event.args == ["v"] and event.publication == published.publication


class _LinkFactory:
    """A link protocol's factory: the reactor it asks for the turn's end."""

    isServer = True

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor


class _Batched:
    batched = True


def _batching_link(reactor: Any) -> Any:
    """A link protocol (open, plain, 0.4+ session) on ``reactor``, writing to a recording transport."""
    from pubsubclub.federation.transport import _LinkProtocolBase

    class Link(_LinkProtocolBase, _Protocol):  # type: ignore[misc]
        pass

    link = Link()
    link.factory = _LinkFactory(reactor)
    link.session = _Batched()  # type: ignore[assignment]
    return link


def test_a_link_batch_asks_the_turn_end_once_per_turn_without_a_python_call() -> None:
    """On the node's reactor a turn's messages leave as one frame at its end, asked once per turn through the list's
    append; on another reactor (callLater(0)) the same frames leave."""
    from twisted.internet.testing import MemoryReactorClock

    from pubsubclub.net.reactor import TurnReactor

    turn = TurnReactor.__new__(TurnReactor)  # its end-of-turn list only: no epoll, no waker to leave open
    turn._turn_end = []
    link = _batching_link(turn)
    for data in (b"a", b"bb", b"c"):
        link._send_text(data)
    assert len(turn._turn_end) == 1 and type(link._ask_turn_end).__name__ == "builtin_function_or_method"
    turn._end_turn()
    link._send_text(b"d")
    assert len(turn._turn_end) == 1
    turn._end_turn()
    on_turn = link.transport.writes
    clock = MemoryReactorClock()
    link = _batching_link(clock)
    for data in (b"a", b"bb", b"c"):
        link._send_text(data)
    assert len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    link._send_text(b"d")
    clock.advance(0)
    assert on_turn == link.transport.writes == [b"\x81\x06a\nbb\nc", b"\x81\x01d"]


def test_a_link_frame_on_a_guarded_connection_asks_the_cap_only_with_bytes_queued() -> None:
    """_write_frame on a listener's link (EdgeConnection): its queued bytes as unsent() counts them, 0 once closing."""
    from pubsubclub.federation.transport import _LinkProtocolBase
    from pubsubclub.net.edge import EdgeConnection

    asked: list[Any] = []

    class Federation:
        def queue_cap(self, session: Any) -> int:
            asked.append(session)
            return 100

        def link_overflow(self, session: Any, queued: int) -> None:
            asked.append(("overflow", queued))

    class Factory(_Factory):
        federation = Federation()

    class Buffer:
        dataBuffer = b"xxxxxxxxxx"  # noqa: N815 - Twisted's name
        offset = 4
        _tempDataLen = 0

    class Backlog:
        paused = False
        since_pause = 0

    class Link(_Protocol):
        _seal = None
        _overflowed = False
        session = "s"
        dropped: Any = None

        def dropConnection(self, abort: bool) -> None:  # noqa: N802 - Autobahn API
            self.dropped = abort

    link = Link()
    link.factory = Factory()
    link._backlog = Backlog()  # type: ignore[attr-defined]
    edge = EdgeConnection.__new__(EdgeConnection)
    edge.transport = wire = _Transport()
    edge._buffer, edge.closing, edge._cap = None, False, 0
    link.transport = edge  # type: ignore[assignment]
    _LinkProtocolBase._write_frame(link, b"one")  # type: ignore[arg-type]
    assert asked == [] and wire.writes == [b"\x81\x03one"]
    buffer = edge._buffer = Buffer()
    _LinkProtocolBase._write_frame(link, b"two")  # type: ignore[arg-type]
    assert asked == ["s"] and len(wire.writes) == 2
    buffer._tempDataLen = 95  # 6 + 95 queued: past the cap of 100
    assert edge.unsent() == 101
    edge.closing = True  # closing: nothing counts as queued, and the guard writes nothing more
    _LinkProtocolBase._write_frame(link, b"three")  # type: ignore[arg-type]
    assert asked == ["s"] and len(wire.writes) == 2 and link.dropped is None
    edge.closing = False
    _LinkProtocolBase._write_frame(link, b"four")  # type: ignore[arg-type]
    assert asked == ["s", "s", ("overflow", 101)] and link.dropped is True and len(wire.writes) == 2


def test_a_known_topic_skips_the_uri_match_and_a_new_one_is_matched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain PUBLISH on a topic the router remembers makes no URI match; on a new one it matches, as before."""
    from pubsubclub.frontends.wamp import transport

    matched: list[str] = []

    class Spy:
        def fullmatch(self, topic: str) -> Any:
            matched.append(topic)
            return _LOOSE.fullmatch(topic)

    _LOOSE = transport._LOOSE_URI
    monkeypatch.setattr(transport, "_LOOSE_URI", Spy())
    frames = [b'[16,7,{},"com.example.t",["v"]]', b'[16,8,{},"com.example.new",["v"]]',
              b'[16,9,{},"com.example.new",["w"]]', b'[16,10,{},"com..bad",["v"]]']  # fmt: skip
    fast = _publishing_outcome(frames, fast=True)
    assert matched == ["com.example.t", "com.example.new", "com..bad"]  # the first: the warm-up publish, unknown
    monkeypatch.setattr(transport, "_LOOSE_URI", _LOOSE)
    assert fast == _publishing_outcome(frames, fast=False) and len(fast[0]) == 1  # the stream takes com.example.t


@given(st.text(max_size=12))
@settings(max_examples=300, deadline=None)
def test_every_topic_the_router_remembers_is_one_the_plain_path_would_match(topic: str) -> None:
    """What the router's URI check passes (and so may remember for publish) the plain path's expression matches."""
    from pubsubclub.frontends.wamp.codec import _LOOSE_URI
    from pubsubclub.frontends.wamp.uris import uri_problem

    for uri in (topic, f"com.{topic}", f"{topic}.x", f"a.{topic}\n", f"b\u00a0{topic}", f"c\x85{topic}"):
        if uri_problem(uri, 1000) is None:
            assert _LOOSE_URI.fullmatch(uri) is not None, uri
