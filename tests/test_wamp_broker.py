"""The WAMP broker end to end: real Autobahn clients and a raw WebSocket client."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable, Generator, Sequence
from typing import Any, cast

import msgpack
import pytest
import pytest_twisted
import websockets
from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WampWebSocketClientFactory
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError, InvalidUriError, ProtocolError
from autobahn.wamp.role import RoleSubscriberFeatures
from autobahn.wamp.serializer import JsonSerializer, MsgPackSerializer
from autobahn.wamp.types import ComponentConfig, PublishOptions, SubscribeOptions
from helpers.hostile import hostile_values, json_text
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer, threads
from twisted.internet import reactor as _reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.logger import ILogObserver, globalLogPublisher

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.jsonbounds import JSONBounds, check
from pubsubclub.frontends.wamp import WampLimits, WampRouter, wamp_site
from pubsubclub.frontends.wamp.broker import hub_topic, uri_problem
from pubsubclub.frontends.wamp.transport import bounded_serializers, feed_session
from pubsubclub.testing import MemoryWampTransport

reactor: Any = _reactor

SERIALIZERS = {"json": JsonSerializer, "msgpack": MsgPackSerializer}

HELLO = [1, "realm1", {"roles": {"subscriber": {}, "publisher": {}}}]


class Inbox:
    """Collects items and hands them out through Deferreds, in order."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._waiting: list[defer.Deferred[Any]] = []

    def put(self, item: Any) -> None:
        """Add ``item``, waking the oldest waiter."""
        if self._waiting:
            self._waiting.pop(0).callback(item)
        else:
            self.items.append(item)

    def get(self) -> defer.Deferred[Any]:
        """The next item, now or when it arrives."""
        if self.items:
            return defer.succeed(self.items.pop(0))
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiting.append(d)
        return d

    def handler(self, *args: Any, **kwargs: Any) -> None:
        """A WAMP event handler recording ``(args, kwargs)``."""
        self.put((args, kwargs))


class Client(ApplicationSession):
    """An Autobahn session exposing its life as Deferreds."""

    def __init__(self, config: ComponentConfig) -> None:
        super().__init__(config)
        self.joined: defer.Deferred[Any] = defer.Deferred()
        self.left: defer.Deferred[Any] = defer.Deferred()
        self.gone: defer.Deferred[None] = defer.Deferred()

    def onJoin(self, details: Any) -> None:  # noqa: N802
        """Joined: fire ``joined``."""
        self.joined.callback(details)

    def onLeave(self, details: Any) -> None:  # noqa: N802
        """Left (or aborted): fire ``left`` and disconnect."""
        if not self.left.called:
            self.left.callback(details)
        self.disconnect()

    def onDisconnect(self) -> None:  # noqa: N802
        """Transport gone: fire ``gone``."""
        if not self.gone.called:
            self.gone.callback(None)


class Server:
    """A WAMP site on 127.0.0.1 with its hub, plus the clients connected to it."""

    def __init__(self, limits: WampLimits, realms: tuple[str, ...]) -> None:
        self.hub = Hub(node_id="test")
        self.router = WampRouter(self.hub, realms, limits)
        self.port: Any = None
        self.protocols: list[Any] = []

    @property
    def url(self) -> str:
        """The WebSocket URL of the WAMP endpoint."""
        return f"ws://127.0.0.1:{self.port.getHost().port}/ws"

    @defer.inlineCallbacks
    def connect(self, serializer: str = "json", realm: str = "realm1") -> Generator[defer.Deferred[Any], Any, Client]:
        """A connected (not necessarily joined) Autobahn client session."""
        session = Client(ComponentConfig(realm=realm))
        factory = WampWebSocketClientFactory(lambda: session, url=self.url, serializers=[SERIALIZERS[serializer]()])
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", self.port.getHost().port)
        protocol = yield endpoint.connect(factory)  # type: ignore[arg-type]  # zope interface
        self.protocols.append(protocol)
        return session

    @defer.inlineCallbacks
    def join(self, serializer: str = "json", realm: str = "realm1") -> Generator[defer.Deferred[Any], Any, Client]:
        """A client session that has joined ``realm``."""
        session = yield self.connect(serializer, realm)
        yield session.joined
        return session


@pytest.fixture
def make_server() -> Generator[Callable[..., Server], None, None]:
    """Start servers on demand; stop them and their clients afterwards."""
    servers: list[Server] = []

    def make(limits: WampLimits = WampLimits(), realms: tuple[str, ...] = ("realm1", "realm2")) -> Server:
        server = Server(limits, realms)
        # listenTCP rather than an endpoint: tests call this from inside the
        # reactor's greenlet, where blocking on a Deferred is not allowed.
        server.port = reactor.listenTCP(0, wamp_site(server.router), interface="127.0.0.1")
        servers.append(server)
        return server

    yield make

    for server in servers:
        closing = []
        for protocol in server.protocols:
            if protocol.transport is not None and protocol.transport.connected:
                protocol.transport.resumeProducing()
                closing.append(protocol.is_closed)
                protocol.transport.abortConnection()
        pytest_twisted.blockon(defer.DeferredList(closing))
        pytest_twisted.blockon(server.port.stopListening())


@pytest.fixture
def server(make_server: Callable[..., Server]) -> Server:
    """One server with default limits and realms ``realm1`` and ``realm2``."""
    return make_server()


@pytest.fixture(params=["json", "msgpack"])
def serializer(request: pytest.FixtureRequest) -> str:
    """Each WAMP serializer in turn."""
    return str(request.param)


class RecordingSink:
    """A hub sink that records envelopes."""

    def __init__(self) -> None:
        self.inbox = Inbox()

    def deliver(self, envelope: Envelope) -> None:
        """Record ``envelope``."""
        self.inbox.put(envelope)


ACK = PublishOptions(acknowledge=True)


# -- real Autobahn clients ----------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_subscribe_publish_event(server: Server, serializer: str) -> Any:
    """A publish reaches another session's subscription."""
    sub = yield server.join(serializer)
    pub = yield server.join(serializer)
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.topic")
    yield pub.publish("com.example.topic", "hello", options=ACK)
    assert (yield inbox.get()) == (("hello",), {})


@pytest_twisted.inlineCallbacks
def test_welcome_details(server: Server, serializer: str) -> Any:
    """WELCOME carries a session id in 1..2**53, the realm and the broker role."""
    session = yield server.connect(serializer)
    details = yield session.joined
    assert 1 <= details.session <= 2**53
    assert details.realm == "realm1"
    assert "broker" in session._router_roles
    assert session._router_roles["broker"].publisher_exclusion is True
    assert session._router_roles["broker"].pattern_based_subscription is True


@pytest_twisted.inlineCallbacks
def test_mixed_serializers_encode_once_per_format(server: Server) -> Any:
    """JSON and MessagePack subscribers share one EVENT, encoded once per format."""
    captured: list[Envelope] = []

    class Listener:
        def local_published(self, envelope: Envelope) -> None:
            captured.append(envelope)

    server.hub.add_publish_listener(Listener())
    inboxes = []
    for name in ("json", "json", "msgpack", "msgpack"):
        session = yield server.join(name)
        inbox = Inbox()
        yield session.subscribe(inbox.handler, "com.example.mixed")
        inboxes.append(inbox)
    pub = yield server.join("json")
    yield pub.publish("com.example.mixed", {"n": 1}, options=ACK)
    for inbox in inboxes:
        assert (yield inbox.get()) == (({"n": 1},), {})
    (envelope,) = captured
    assert envelope.payload == {"n": 1}
    assert not envelope.wamp_wrapped
    # One encoding per wire format, memoised under (serializer, subscription id).
    assert sorted(key[0] for key in envelope.wire if isinstance(key, tuple)) == ["json", "msgpack"]


@pytest_twisted.inlineCallbacks
def test_same_topic_same_subscription_id(server: Server) -> Any:
    """Every session subscribed to a topic gets the same subscription id."""
    first = yield server.join("json")
    second = yield server.join("msgpack")
    a = yield first.subscribe(Inbox().handler, "com.example.shared")
    b = yield second.subscribe(Inbox().handler, "com.example.shared")
    c = yield second.subscribe(Inbox().handler, "com.example.other")
    assert a.id == b.id
    assert c.id != a.id


@pytest_twisted.inlineCallbacks
def test_exclude_me_default(server: Server, serializer: str) -> Any:
    """By default a publisher does not receive its own publish."""
    a = yield server.join(serializer)
    b = yield server.join(serializer)
    a_inbox, b_inbox = Inbox(), Inbox()
    yield a.subscribe(a_inbox.handler, "com.example.chat")
    yield b.subscribe(b_inbox.handler, "com.example.chat")
    yield a.publish("com.example.chat", "from a", options=ACK)
    assert (yield b_inbox.get()) == (("from a",), {})
    # b's publish is ordered after a's on the server, so if a had received
    # its own message it would come first.
    yield b.publish("com.example.chat", "from b", options=ACK)
    assert (yield a_inbox.get()) == (("from b",), {})
    assert b_inbox.items == []


@pytest_twisted.inlineCallbacks
def test_exclude_me_false(server: Server, serializer: str) -> Any:
    """With exclude_me=False the publisher receives its own publish."""
    a = yield server.join(serializer)
    inbox = Inbox()
    yield a.subscribe(inbox.handler, "com.example.echo")
    yield a.publish("com.example.echo", 42, options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == ((42,), {})


@pytest_twisted.inlineCallbacks
def test_acknowledge_published(server: Server, serializer: str) -> Any:
    """PUBLISH with acknowledge gets PUBLISHED with the id the EVENT carries."""
    sub = yield server.join(serializer)
    pub = yield server.join(serializer)
    ids = Inbox()

    def handler(value: Any, details: Any) -> None:
        ids.put(details.publication)

    from autobahn.wamp.types import SubscribeOptions

    yield sub.subscribe(handler, "com.example.ack", options=SubscribeOptions(details_arg="details"))
    publication = yield pub.publish("com.example.ack", 1, options=ACK)
    assert 1 <= publication.id <= 2**53
    assert (yield ids.get()) == publication.id


@pytest_twisted.inlineCallbacks
def test_unsubscribe_stops_flow(server: Server, serializer: str) -> Any:
    """After UNSUBSCRIBE no more events arrive for that subscription."""
    a = yield server.join(serializer)
    pub = yield server.join(serializer)
    stopped, marker = Inbox(), Inbox()
    subscription = yield a.subscribe(stopped.handler, "com.example.stop")
    yield a.subscribe(marker.handler, "com.example.marker")
    yield subscription.unsubscribe()
    assert server.hub.subscribers("com.example.stop") == 0
    yield pub.publish("com.example.stop", "lost", options=ACK)
    yield pub.publish("com.example.marker", "after", options=ACK)
    assert (yield marker.get()) == (("after",), {})
    assert stopped.items == []


@pytest_twisted.inlineCallbacks
def test_leave_unsubscribes_everything(server: Server) -> Any:
    """A session that leaves is removed from every hub topic."""
    a = yield server.join()
    yield a.subscribe(Inbox().handler, "com.example.one")
    yield a.subscribe(Inbox().handler, "com.example.two")
    assert server.hub.topics() == ["com.example.one", "com.example.two"]
    yield a.leave()
    details = yield a.left
    assert details.reason == "wamp.close.goodbye_and_out"
    yield a.gone
    assert server.hub.topics() == []


@pytest_twisted.inlineCallbacks
def test_unknown_realm_aborts(server: Server, serializer: str) -> Any:
    """HELLO to an unknown realm is answered with ABORT no_such_realm."""
    session = yield server.connect(serializer, realm="nosuchrealm")
    details = yield session.left
    assert details.reason == "wamp.error.no_such_realm"
    assert not session.joined.called


@pytest_twisted.inlineCallbacks
def test_invalid_topic_uri(make_server: Callable[..., Server], serializer: str) -> Any:
    """Topics that are not (loose) WAMP URIs, or too long, get ERROR invalid_uri."""
    server = make_server(WampLimits(max_uri_length=40))
    session = yield server.join(serializer)
    for topic in ("com..topic", ".com", "$tep.broadcast", "com.example." + "x" * 40):
        with pytest.raises(ApplicationError) as info:
            yield session.subscribe(Inbox().handler, topic)
        assert info.value.error == "wamp.error.invalid_uri"
    with pytest.raises(ApplicationError) as info:
        yield session.publish("com.example." + "x" * 40, 1, options=ACK)
    assert info.value.error == "wamp.error.invalid_uri"
    with pytest.raises(ApplicationError) as info:
        yield session.publish("wamp.session.on_join", 1, options=ACK)
    assert info.value.error == "wamp.error.invalid_uri"
    # The session is still usable.
    yield session.subscribe(Inbox().handler, "com.example.fine")


@pytest_twisted.inlineCallbacks
def test_too_many_subscriptions(make_server: Callable[..., Server]) -> Any:
    """Subscribing past the per-session limit gets a clear ERROR."""
    server = make_server(WampLimits(max_subscriptions_per_session=2))
    session = yield server.join()
    yield session.subscribe(Inbox().handler, "com.example.a")
    yield session.subscribe(Inbox().handler, "com.example.b")
    with pytest.raises(ApplicationError) as info:
        yield session.subscribe(Inbox().handler, "com.example.c")
    assert info.value.error == "pubsubclub.error.too_many_subscriptions"
    # Re-subscribing to a held topic is not a new subscription.
    yield session.subscribe(Inbox().handler, "com.example.a")


@pytest.mark.parametrize(
    ("args", "kwargs", "payload", "wrapped"),
    [
        ((1,), {}, 1, False),
        (({"a": [1, 2]},), {}, {"a": [1, 2]}, False),
        ((1, "two", None), {}, {"args": [1, "two", None], "kwargs": {}}, True),
        ((), {"x": 1}, {"args": [], "kwargs": {"x": 1}}, True),
        (("a",), {"y": True}, {"args": ["a"], "kwargs": {"y": True}}, True),
        ((), {}, {"args": [], "kwargs": {}}, True),
    ],
)
@pytest_twisted.inlineCallbacks
def test_args_kwargs_round_trip(
    server: Server, serializer: str, args: tuple[Any, ...], kwargs: dict[str, Any], payload: Any, wrapped: bool
) -> Any:
    """Args/kwargs survive WAMP -> hub -> WAMP; one plain arg stays unwrapped in the hub."""
    sink = RecordingSink()
    server.hub.subscribe("com.example.shape", sink)
    sub = yield server.join(serializer)
    pub = yield server.join(serializer)
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.shape")
    yield pub.publish("com.example.shape", *args, options=ACK, **kwargs)
    assert (yield inbox.get()) == (args, kwargs)
    envelope = yield sink.inbox.get()
    assert (envelope.payload, envelope.wamp_wrapped) == (payload, wrapped)


@pytest_twisted.inlineCallbacks
def test_hub_publish_reaches_wamp(server: Server, serializer: str) -> Any:
    """A message published into the hub by another front-end arrives as args=[payload]."""
    sub = yield server.join(serializer)
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.hub")
    server.hub.publish(server.hub.envelope("com.example.hub", {"from": "psc"}))
    server.hub.deliver_remote(server.hub.envelope("com.example.hub", [1, 2]))
    assert (yield inbox.get()) == (({"from": "psc"},), {})
    assert (yield inbox.get()) == (([1, 2],), {})


@pytest_twisted.inlineCallbacks
def test_second_realm_is_prefixed_and_isolated(server: Server) -> Any:
    """Realm 2's topics live under '$realm.realm2#' in the hub and do not leak into realm 1."""
    sink = RecordingSink()
    server.hub.subscribe("$realm.realm2#com.example.t", sink)
    one = yield server.join(realm="realm1")
    two = yield server.join(realm="realm2")
    one_inbox, two_inbox = Inbox(), Inbox()
    yield one.subscribe(one_inbox.handler, "com.example.t")
    yield two.subscribe(two_inbox.handler, "com.example.t")
    publisher = yield server.join(realm="realm2")
    yield publisher.publish("com.example.t", "r2", options=ACK)
    assert (yield two_inbox.get()) == (("r2",), {})
    assert (yield sink.inbox.get()).payload == "r2"
    yield one.publish("com.example.t", "r1", options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield one_inbox.get()) == (("r1",), {})
    assert two_inbox.items == []


@pytest_twisted.inlineCallbacks
def test_slow_consumer_is_dropped(make_server: Callable[..., Server]) -> Any:
    """A client that stops reading is dropped once its backlog passes the limit."""
    server = make_server(WampLimits(max_send_buffer=256 * 1024, max_message_size=2 * 1024 * 1024))
    dropped: defer.Deferred[str] = defer.Deferred()

    class Interest:
        def topic_added(self, topic: str) -> None:
            pass

        def topic_removed(self, topic: str) -> None:
            if not dropped.called:
                dropped.callback(topic)

    server.hub.add_interest_listener(Interest())
    reasons: list[str] = []

    def observe(event: dict[str, Any]) -> None:
        if "slow consumer" in str(event.get("reason", "")):
            reasons.append(event["reason"])

    globalLogPublisher.addObserver(cast(ILogObserver, observe))
    slow = yield server.join()
    yield slow.subscribe(Inbox().handler, "com.example.firehose")
    # Stop reading from the socket: the server's buffers fill up.
    server.protocols[-1].transport.pauseProducing()
    pub = yield server.join()
    blob = "x" * (512 * 1024)
    for _ in range(400):
        yield pub.publish("com.example.firehose", blob, options=ACK)
        if dropped.called:
            break
    assert (yield dropped) == "com.example.firehose"
    globalLogPublisher.removeObserver(cast(ILogObserver, observe))
    assert reasons and "limit is 262144" in reasons[0]
    # The publisher is unaffected.
    inbox = Inbox()
    yield pub.subscribe(inbox.handler, "com.example.after")
    yield pub.publish("com.example.after", 1, options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == ((1,), {})


# -- raw WebSocket (the independent `websockets` library, in a thread) ----------


async def _raw_session(
    url: str, frames: Sequence[str | bytes], replies: int, subprotocol: str
) -> tuple[list[str | bytes], int | None, str | None]:
    """Send ``frames``; read up to ``replies`` messages or until the server closes."""
    received: list[str | bytes] = []
    async with websockets.connect(url, subprotocols=[websockets.Subprotocol(subprotocol)], max_size=None) as ws:
        for frame in frames:
            await ws.send(frame)
        try:
            while len(received) < replies:
                received.append(await ws.recv())
            if replies:
                await ws.close()
            else:
                await ws.wait_closed()
        except websockets.ConnectionClosed:
            pass
        code = ws.close_code
        reason = ws.close_reason
    return received, code, reason


def raw(
    server: Server, frames: Sequence[str | bytes], replies: int = 10, subprotocol: str = "wamp.2.json"
) -> defer.Deferred[tuple[list[Any], int | None, str | None]]:
    """Run a raw WebSocket exchange in a thread; decoded replies, close code, reason."""

    def run() -> tuple[list[Any], int | None, str | None]:
        received, code, reason = asyncio.run(_raw_session(server.url, frames, replies, subprotocol))
        decoded = [msgpack.unpackb(m) if isinstance(m, bytes) else json.loads(m) for m in received]
        return decoded, code, reason

    return threads.deferToThread(run)


def j(msg: Any) -> str:
    """One WAMP message as JSON text."""
    return json.dumps(msg)


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        (["this is not json"], "invalid serialization"),
        ([j({"a": 1})], "invalid type"),
        ([j([])], "missing message type"),
        ([j([999, 1])], "invalid WAMP message type"),
        ([j([1, "realm1"])], "invalid message length"),
        ([b"\x91\x01"], "binary"),
        ([j([32, 1, {}, "com.example.t"])], "SUBSCRIBE received before the session was established"),
        ([j(HELLO), j(HELLO)], "HELLO is not allowed"),
        ([j(HELLO), j([69, 1, {}])], "INTERRUPT is not allowed"),
        ([j(HELLO), j([8, 32, 1, {}, "wamp.error.x"])], "ERROR is not allowed"),
    ],
)
@pytest_twisted.inlineCallbacks
def test_bad_input_aborts(server: Server, frames: list[str | bytes], problem: str) -> Any:
    """Malformed or out-of-state WAMP is answered with ABORT protocol_violation, then a close."""
    replies, code, _ = yield raw(server, frames)
    abort = replies[-1]
    assert abort[0] == 3
    assert abort[2] == "wamp.error.protocol_violation"
    assert problem in abort[1]["message"]
    assert code == 1000
    # A good client on the same server still works.
    sub = yield server.join()
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.still")
    yield sub.publish("com.example.still", "ok", options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == (("ok",), {})


@pytest_twisted.inlineCallbacks
def test_raw_msgpack_bad_input_aborts(server: Server) -> Any:
    """Undecodable MessagePack is answered with a MessagePack ABORT."""
    replies, code, _ = yield raw(server, [b"\xc1\xc1"], subprotocol="wamp.2.msgpack")
    assert replies[-1][0] == 3
    assert replies[-1][2] == "wamp.error.protocol_violation"
    assert code == 1000


@pytest_twisted.inlineCallbacks
def test_raw_unsubscribe_unknown_id(server: Server) -> Any:
    """UNSUBSCRIBE of an unknown subscription gets ERROR no_such_subscription."""
    replies, _, _ = yield raw(server, [j(HELLO), j([34, 7, 123456])], replies=2)
    welcome, error = replies
    assert welcome[0] == 2
    assert error[:4] == [8, 34, 7, {}]
    assert error[4] == "wamp.error.no_such_subscription"


@pytest_twisted.inlineCallbacks
def test_raw_loose_invalid_uri(server: Server) -> Any:
    """A topic Autobahn cannot even parse still gets ERROR invalid_uri on SUBSCRIBE."""
    frames = [
        j(HELLO),
        j([32, 5, {}, "bad topic"]),
        j([16, 6, {}, "bad topic", ["ignored"]]),
        j([16, 7, {"acknowledge": True}, "bad topic", ["x"]]),
    ]
    replies, _, _ = yield raw(server, frames, replies=3)
    assert replies[1][:2] == [8, 32]
    assert replies[1][2] == 5
    assert replies[1][4] == "wamp.error.invalid_uri"
    assert replies[2][:3] == [8, 16, 7]
    assert replies[2][4] == "wamp.error.invalid_uri"


@pytest_twisted.inlineCallbacks
def test_raw_goodbye(server: Server) -> Any:
    """GOODBYE is answered with GOODBYE goodbye_and_out, then the server closes."""
    replies, code, _ = yield raw(server, [j(HELLO), j([6, {}, "wamp.close.normal"])])
    assert [m[0] for m in replies] == [2, 6]
    assert replies[1][2] == "wamp.close.goodbye_and_out"
    assert code == 1000


@pytest_twisted.inlineCallbacks
def test_oversize_frame_closes_1009(make_server: Callable[..., Server]) -> Any:
    """A frame above max_message_size closes the connection with 1009; others carry on."""
    server = make_server(WampLimits(max_message_size=64 * 1024))
    big = j([16, 1, {}, "com.example.big", ["x" * (65 * 1024)]])
    replies, code, _ = yield raw(server, [j(HELLO), big])
    assert [m[0] for m in replies] == [2]
    assert code == 1009
    sub = yield server.join()
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.after")
    yield sub.publish("com.example.after", "ok", options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == (("ok",), {})


@pytest_twisted.inlineCallbacks
def test_unknown_subprotocol_refused(server: Server) -> Any:
    """A WebSocket client offering no WAMP subprotocol is refused at the handshake."""
    with pytest.raises(websockets.InvalidStatus):
        yield raw(server, [], subprotocol="wamp.2.flatbuffers")


def test_limits_validated() -> None:
    """Non-positive limits are refused with a message naming the field."""
    with pytest.raises(ValueError, match="max_send_buffer"):
        WampLimits(max_send_buffer=0)


def test_router_rejects_bad_realm() -> None:
    """A realm name containing the hub separator is refused."""
    with pytest.raises(ValueError, match="a#b"):
        WampRouter(Hub(), ("realm1", "a#b"))


# -- the session on a fake transport ---------------------------------------------


def joined_session(router: WampRouter) -> tuple[Any, MemoryWampTransport]:
    """A session on a fake transport that has completed HELLO/WELCOME."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    session.onMessage(message.Hello("realm1", {"subscriber": RoleSubscriberFeatures()}))
    assert isinstance(transport.sent[-1], message.Welcome)
    return session, transport


def test_fake_slow_consumer_dropped() -> None:
    """deliver() drops the client, with a reason, once unsent bytes pass the limit."""
    hub = Hub()
    router = WampRouter(hub, limits=WampLimits(max_send_buffer=100))
    session, transport = joined_session(router)
    session.onMessage(message.Subscribe(1, "com.example.t"))
    hub.publish(hub.envelope("com.example.t", 1))
    assert isinstance(transport.sent[-1], message.Event)
    transport.unsent = 101
    hub.publish(hub.envelope("com.example.t", 2))
    assert transport.dropped is not None and "slow consumer" in transport.dropped
    assert hub.topics() == []


def test_fake_event_built_once_per_envelope() -> None:
    """All sessions on a topic are sent the very same EVENT bytes."""
    hub = Hub()
    router = WampRouter(hub)
    transports = []
    for _ in range(3):
        session, transport = joined_session(router)
        session.onMessage(message.Subscribe(1, "com.example.t"))
        transports.append(transport)
    hub.publish(hub.envelope("com.example.t", "x"))
    encoded = [t.encoded[-1] for t in transports]
    assert all(e is encoded[0] for e in encoded)
    assert transports[0].sent[-1].args == ["x"]


def test_fake_input_after_close_ignored() -> None:
    """After ABORT from the peer the session closes and ignores further input."""
    hub = Hub()
    session, transport = joined_session(WampRouter(hub))
    session.onMessage(message.Subscribe(1, "com.example.t"))
    sent = len(transport.sent)
    session.onMessage(message.Abort("wamp.close.normal"))
    session.onMessage(message.Subscribe(2, "com.example.u"))
    assert len(transport.sent) == sent
    assert not transport.open
    assert hub.topics() == []


@pytest_twisted.inlineCallbacks
def test_raw_unknown_match_policy_gets_invalid_argument(server: Server) -> Any:
    """A SUBSCRIBE with a match policy the broker does not know gets ERROR invalid_argument; the session goes on."""
    frames = [
        j(HELLO),
        j([32, 5, {"match": "regex"}, "com.example"]),
        j([32, 6, {"match": 3}, "com.example"]),
        j([32, 7, {"match": "prefix"}, "com.example."]),
    ]
    replies, _, _ = yield raw(server, frames, replies=4)
    assert [r[:3] for r in replies[1:3]] == [[8, 32, 5], [8, 32, 6]]
    assert replies[1][4] == replies[2][4] == "wamp.error.invalid_argument"
    assert "unknown match policy 'regex'" in replies[1][5][0]
    assert replies[3][:2] == [33, 7]


@pytest_twisted.inlineCallbacks
def test_prefix_and_wildcard_subscribers_get_the_concrete_topic(server: Server, serializer: str) -> Any:
    """Autobahn prefix and wildcard subscribers receive matching publishes with details.topic set."""
    sub = yield server.join(serializer)
    pub = yield server.join(serializer)
    by_prefix, by_wildcard = Inbox(), Inbox()
    yield sub.subscribe(by_prefix.handler, "com.example.", options=SubscribeOptions(match="prefix", details=True))
    yield sub.subscribe(by_wildcard.handler, "com..temp", options=SubscribeOptions(match="wildcard", details=True))
    yield pub.publish("com.other.x", "no", options=ACK)
    yield pub.publish("com.example.kitchen.x", "p", options=ACK)
    yield pub.publish("com.kitchen.temp", "w", options=ACK)
    (args, kwargs) = yield by_prefix.get()
    assert args == ("p",) and kwargs["details"].topic == "com.example.kitchen.x"
    (args, kwargs) = yield by_wildcard.get()
    assert args == ("w",) and kwargs["details"].topic == "com.kitchen.temp"
    assert by_prefix.items == [] and by_wildcard.items == []


@given(st.text(max_size=30))
def test_uri_problem_accepts_only_loose_uris(uri: str) -> None:
    """Accepted URIs are loose WAMP URIs, short enough, and never contain the realm separator."""
    if uri_problem(uri, 20) is None:
        assert len(uri) <= 20
        assert "#" not in uri and not uri.startswith("$")
        assert all(part and not any(c.isspace() for c in part) for part in uri.split("."))


def test_hub_topic_mapping() -> None:
    """The first realm maps topics unchanged; others go to the reserved '$realm.<realm>#' space."""
    assert hub_topic("realm1", "a.b", "realm1") == "a.b"
    assert hub_topic("realm2", "a.b", "realm1") == "$realm.realm2#a.b"


# -- hostile input: depth, numbers, surrogates -------------------------------------


def deep_list(levels: int) -> Any:
    """``levels`` nested lists."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        ([j(HELLO), j([32, 5, {}, "a\ud800"])], "lone surrogate"),
        ([j(HELLO), j([16, 6, {}, "com.example.t", [float("nan")]])], "non-finite number"),
        ([j(HELLO), j([16, 6, {}, "com.example.t", [float("inf")]])], "non-finite number"),
        ([j(HELLO), j([16, 6, {}, "com.example.t", [2**64]])], "integer of 65 bits is out of range"),
        ([j(HELLO), j([16, 6, {}, "com.example.t", [], {"k": -(2**63) - 1}])], "out of range"),
        ([j(HELLO), j([16, 6, {}, "com.example.t", [deep_list(100)]])], "nested deeper than 64 levels"),
        ([j([1, "realm1", {"roles": {"publisher": {}}, "x": deep_list(200)}])], "nested deeper than 64 levels"),
        ([j(HELLO), '[16, 6, {"\\udc00": 1}, "com.example.t", []]'], "lone surrogate"),
    ],
)
@pytest_twisted.inlineCallbacks
def test_hostile_json_aborts_with_the_problem(server: Server, frames: list[str], problem: str) -> Any:
    """Deep, huge, non-finite or surrogate JSON is answered with ABORT naming the problem; others carry on."""
    replies, code, _ = yield raw(server, frames)
    abort = replies[-1]
    assert abort[0] == 3 and abort[2] == "wamp.error.protocol_violation", replies
    assert problem in abort[1]["message"]
    assert code == 1000
    assert server.hub.topics() == []
    sub = yield server.join()
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.still")
    yield sub.publish("com.example.still", "ok", options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == (("ok",), {})


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ([float("inf")], "non-finite number"),
        ([msgpack.Timestamp(1, 0)], "type Timestamp is not JSON"),
        ([msgpack.ExtType(5, b"x")], "type ExtType is not JSON"),
        ([deep_list(100)], "nested deeper than 64 levels"),
        ([2**64 - 1], "integer of 64 bits is out of range"),
    ],
)
@pytest_twisted.inlineCallbacks
def test_hostile_msgpack_aborts_with_the_problem(server: Server, payload: list[Any], problem: str) -> Any:
    """MessagePack carries what JSON cannot (infinities, extension types, 2**64 - 1): ABORT naming it."""
    hello = msgpack.packb(HELLO)
    publish = msgpack.packb([16, 6, {}, "com.example.t", payload], datetime=False)
    replies, code, _ = yield raw(server, [hello, publish], subprotocol="wamp.2.msgpack")
    abort = replies[-1]
    assert abort[0] == 3 and abort[2] == "wamp.error.protocol_violation", replies
    assert problem in abort[1]["message"]
    assert code == 1000


@pytest_twisted.inlineCallbacks
def test_msgpack_binary_payloads_still_pass(server: Server) -> Any:
    """The bounds let MessagePack's binary values through (they are WAMP payloads, not JSON)."""
    sub = yield server.join("msgpack")
    inbox = Inbox()
    yield sub.subscribe(inbox.handler, "com.example.bin")
    yield sub.publish("com.example.bin", b"\x00\xff", options=PublishOptions(acknowledge=True, exclude_me=False))
    assert (yield inbox.get()) == ((b"\x00\xff",), {})


def test_uri_problem_refuses_lone_surrogates() -> None:
    """A topic with a lone surrogate is not a URI, even if it reached the broker some other way."""
    assert "lone surrogate" in (uri_problem("a\ud800", 100) or "")
    assert uri_problem("caf\u00e9.\U0001f600", 100) is None


@given(hostile_values)
def test_fuzz_bounded_serializers_only_raise_protocol_error(value: Any) -> None:
    """Hostile JSON and MessagePack give Autobahn's declared errors or messages within the bounds."""
    msgpack_serializer, json_serializer = (copy.copy(s) for s in bounded_serializers(JSONBounds())[:2])
    frames = [[16, 1, {}, "com.example.t", [value]], [32, 1, {}, value], [1, "realm1", {"roles": {}, "x": value}]]
    for frame in frames:
        wire: list[tuple[Any, bytes, bool]] = [(json_serializer, json_text(frame), False)]
        try:
            wire.append((msgpack_serializer, msgpack.packb(frame), True))
        except (OverflowError, ValueError, UnicodeEncodeError, TypeError):
            pass  # MessagePack cannot carry it at all
        for serializer, data, binary in wire:
            try:
                [decoded] = serializer.unserialize(data, binary)
            except (ProtocolError, InvalidUriError):  # what WampServerProtocol answers with ABORT/ERROR
                continue
            topic = decoded.topic if isinstance(decoded, message.Subscribe) else None
            for part in (getattr(decoded, "args", None), getattr(decoded, "kwargs", None), topic):
                check(part, binary=True)


class _CountingEncoder:
    """An object serializer that counts the messages it encodes (and decodes like the one it wraps)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.NAME = inner.NAME
        self.BINARY = inner.BINARY
        self.encoded: list[Any] = []

    def serialize(self, obj: Any) -> bytes:
        self.encoded.append(obj)
        return cast(bytes, self.inner.serialize(obj))

    def unserialize(self, payload: bytes) -> list[Any]:
        return cast(list[Any], self.inner.unserialize(payload))


@pytest.mark.parametrize("subscribers", [1, 7, 50])
def test_fake_event_encoded_once_per_format_whatever_the_subscribers(subscribers: int) -> None:
    """N subscribers per wire format: one EVENT encoding per format and publish, the same bytes to each."""
    hub = Hub()
    router = WampRouter(hub)
    counters = {}
    transports = []
    for serializer in cast(list[Any], bounded_serializers(JSONBounds())):
        serializer = copy.copy(serializer)
        counters[serializer.SERIALIZER_ID] = serializer._serializer = _CountingEncoder(serializer._serializer)
        for _ in range(subscribers):
            session = router.session_factory()
            transport = MemoryWampTransport(serializer)
            session.onOpen(transport)
            session.onMessage(message.Hello("realm1", {"subscriber": RoleSubscriberFeatures()}))
            session.onMessage(message.Subscribe(1, "com.example.t"))
            transports.append(transport)
    for counter in counters.values():
        counter.encoded.clear()  # WELCOME and SUBSCRIBED went through Autobahn's Message path
    hub.publish(hub.envelope("com.example.t", {"n": b"\x01"}))
    assert {name: len(c.encoded) for name, c in counters.items()} == {"json": 1, "msgpack": 1, "cbor": 1}
    bytes_sent: dict[str, set[int]] = {}
    for transport in transports:
        event = transport.sent[-1]
        assert isinstance(event, message.Event) and event.args == [{"n": b"\x01"}]
        bytes_sent.setdefault(transport.serializer.SERIALIZER_ID, set()).add(id(transport.encoded[-1]))
    assert {name: len(objects) for name, objects in bytes_sent.items()} == {"json": 1, "msgpack": 1, "cbor": 1}
    hub.publish(hub.envelope("com.example.t", 2))
    assert {name: len(c.encoded) for name, c in counters.items()} == {"json": 2, "msgpack": 2, "cbor": 2}


@pytest.mark.parametrize("name", ["json", "msgpack"])
@pytest.mark.parametrize("options", [{"acknowledge": True}, {"acknowledge": True, "retain": False}])
def test_fake_publish_bytes_counted_from_the_frame(name: str, options: dict[str, Any]) -> None:
    """A PUBLISH fed as bytes (decoded fast, or by Autobahn for ``retain``) is counted with its frame's size."""
    hub = Hub()
    router = WampRouter(hub)
    serializer = copy.copy({s.SERIALIZER_ID: s for s in bounded_serializers(JSONBounds())}[name])
    subscriber, _ = joined_session(router)
    subscriber.onMessage(message.Subscribe(1, "com.example.t"))
    publisher, sent = joined_session(router)

    class Owner:
        _session = publisher

    frame = serializer._serializer.serialize([16, 5, options, "com.example.t", [{"p": "x" * 100}]])
    feed_session(Owner(), serializer, frame, name == "msgpack")
    assert isinstance(sent.sent[-1], message.Published)
    _, counters, _ = hub.metrics.take_interval(0.0)
    assert counters[("com.example.t", "wamp", "published", None, None)] == [1, len(frame)]
    assert counters[("com.example.t", "wamp", "delivered", None, None)] == [1, len(frame)]
