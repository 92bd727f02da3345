"""Roles enforced by the WAMP broker, TEP and NSD front-ends, in memory on one hub.

The node-process tests (test_wamp_auth.py) show the same over real sockets;
these pin the per-front-end details: the session state machine, what reaches
the hub (and so the federation), and topic prefixes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from autobahn.wamp import message
from autobahn.wamp.role import RolePublisherFeatures, RoleSubscriberFeatures
from twisted.internet.testing import StringTransport

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.frontends.nsd import codec
from pubsubclub.frontends.nsd.protocol import NSDProtocol, NSDService, NSDSettings
from pubsubclub.frontends.nsd.store import NSDStore
from pubsubclub.frontends.tep.codec import TEPLimits
from pubsubclub.frontends.tep.protocol import UNAUTHORIZED_CLOSE, TEPClient, TEPServer
from pubsubclub.frontends.wamp.auth import AuthPolicy, Cryptosign, Principal, Role, Ticket
from pubsubclub.frontends.wamp.broker import WampRouter
from pubsubclub.testing import MemoryTEPTransport, MemoryWampTransport

POLICY = AuthPolicy(
    roles=(
        Role("guest", subscribe=("public.", "tep.public.", "nsd.public."), publish=("public.chat.", "nsd.public.me")),
        Role("writer", subscribe=("",), publish=("app.", "public.")),
    ),
    principals=(Principal("alice", "writer", Ticket("s3cret")),),
    anonymous="guest",
)
CLOSED = AuthPolicy(roles=POLICY.roles, principals=POLICY.principals, anonymous=None)


class Recorder:
    """A hub sink and publish listener: what was delivered locally and what the federation would forward."""

    def __init__(self) -> None:
        self.delivered: list[Envelope] = []
        self.forwarded: list[Envelope] = []

    def deliver(self, envelope: Envelope) -> None:
        self.delivered.append(envelope)

    def local_published(self, envelope: Envelope) -> None:
        self.forwarded.append(envelope)


def hub_with_recorder(*topics: str) -> tuple[Hub, Recorder]:
    """A hub whose recorder subscribes ``topics`` and listens to every local publish."""
    hub = Hub("n1")
    recorder = Recorder()
    for topic in topics:
        hub.subscribe(topic, recorder)
    hub.add_publish_listener(recorder)
    return hub, recorder


def wamp_session(router: WampRouter, **hello: Any) -> tuple[Any, MemoryWampTransport]:
    """A broker session that sent HELLO."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    roles = {"publisher": RolePublisherFeatures(), "subscriber": RoleSubscriberFeatures()}
    session.onMessage(message.Hello("realm1", roles, **hello))
    return session, transport


# -- WAMP ---------------------------------------------------------------------------------


def test_without_policy_the_broker_welcomes_anonymous_as_before() -> None:
    """No policy: WELCOME authrole/authmethod anonymous, no authid, every topic allowed."""
    hub, recorder = hub_with_recorder("app.x")
    session, transport = wamp_session(WampRouter(hub))
    welcome = transport.sent[0]
    assert isinstance(welcome, message.Welcome)
    assert (welcome.authid, welcome.authrole, welcome.authmethod) == (None, "anonymous", "anonymous")
    session.onMessage(message.Publish(1, "app.x", args=["ok"], acknowledge=True))
    assert isinstance(transport.sent[-1], message.Published)
    assert [e.payload for e in recorder.delivered] == ["ok"]


def test_refused_publish_and_subscribe_reach_neither_hub_nor_federation() -> None:
    """A guest's PUBLISH/SUBSCRIBE outside its prefixes: ERROR not_authorized, nothing delivered or forwarded."""
    hub, recorder = hub_with_recorder("app.x")
    session, transport = wamp_session(WampRouter(hub, auth=POLICY))
    welcome = transport.sent[0]
    assert (welcome.authid, welcome.authrole, welcome.authmethod) == ("anonymous", "guest", "anonymous")
    session.onMessage(message.Publish(1, "app.x", args=["no"], acknowledge=True))
    session.onMessage(message.Publish(2, "app.x", args=["no, unacknowledged"]))
    session.onMessage(message.Subscribe(3, "app.y"))
    errors = transport.sent[1:]
    assert [(type(e), e.request, e.error) for e in errors] == [
        (message.Error, 1, "wamp.error.not_authorized"),
        (message.Error, 3, "wamp.error.not_authorized"),
    ]
    assert errors[0].args == ["role 'guest' may not publish to 'app.x'"]
    assert recorder.delivered == [] and recorder.forwarded == []
    assert hub.subscribers("app.y") == 0
    session.onMessage(message.Publish(4, "public.chat.room", args=["yes"], acknowledge=True))
    assert isinstance(transport.sent[-1], message.Published)
    assert [e.topic for e in recorder.forwarded] == ["public.chat.room"]


def test_challenge_then_authenticate_then_established() -> None:
    """Ticket: CHALLENGE, then AUTHENTICATE gives WELCOME with alice/writer/ticket and the writer's rights."""
    hub, recorder = hub_with_recorder("app.x")
    session, transport = wamp_session(WampRouter(hub, auth=POLICY), authmethods=["ticket"], authid="alice")
    assert isinstance(transport.sent[0], message.Challenge) and transport.sent[0].method == "ticket"
    session.onMessage(message.Authenticate("s3cret"))
    welcome = transport.sent[1]
    assert isinstance(welcome, message.Welcome)
    assert (welcome.authid, welcome.authrole, welcome.authmethod, welcome.authprovider) == (
        "alice",
        "writer",
        "ticket",
        "static",
    )
    assert session.role == POLICY.role("writer")
    session.onMessage(message.Publish(1, "app.x", args=["ok"], acknowledge=True))
    assert [e.payload for e in recorder.delivered] == ["ok"]


def test_wrong_ticket_aborts_with_authentication_failed() -> None:
    """A wrong ticket: ABORT wamp.error.authentication_failed and the transport closes."""
    hub, _ = hub_with_recorder()
    session, transport = wamp_session(WampRouter(hub, auth=POLICY), authmethods=["ticket"], authid="alice")
    session.onMessage(message.Authenticate("guess"))
    abort = transport.sent[-1]
    assert isinstance(abort, message.Abort) and abort.reason == "wamp.error.authentication_failed"
    assert not transport.open


def test_anything_but_authenticate_after_challenge_is_a_protocol_violation() -> None:
    """PUBLISH while AUTHENTICATE is expected: ABORT protocol_violation, nothing published."""
    hub, recorder = hub_with_recorder("app.x")
    session, transport = wamp_session(WampRouter(hub, auth=POLICY), authmethods=["ticket"], authid="alice")
    session.onMessage(message.Publish(1, "app.x", args=["early"], acknowledge=True))
    abort = transport.sent[-1]
    assert isinstance(abort, message.Abort) and abort.reason == "wamp.error.protocol_violation"
    assert recorder.forwarded == []


def test_anonymous_refused_aborts_with_not_authorized() -> None:
    """With anonymous = false a HELLO without credentials gets ABORT not_authorized."""
    hub, _ = hub_with_recorder()
    _, transport = wamp_session(WampRouter(hub, auth=CLOSED))
    abort = transport.sent[0]
    assert isinstance(abort, message.Abort) and abort.reason == "wamp.error.not_authorized"
    assert not transport.open


def test_challenges_use_the_routers_randomness() -> None:
    """The router's injected random_bytes makes the cryptosign challenge (time and randomness injected)."""
    hub, _ = hub_with_recorder()
    key = "ab" * 32
    policy = AuthPolicy(roles=POLICY.roles, principals=(Principal("k", "guest", Cryptosign(key)),))
    router = WampRouter(hub, auth=policy, random_bytes=lambda n: b"\x07" * n)
    _, transport = wamp_session(router, authmethods=["cryptosign"], authid="k")
    assert transport.sent[0].extra["challenge"] == "07" * 32


# -- TEP ----------------------------------------------------------------------------------


def tep_client(server: TEPServer) -> tuple[TEPClient, MemoryTEPTransport]:
    """A TEP client of ``server`` on a memory transport."""
    transport = MemoryTEPTransport()
    return TEPClient(server, transport), transport


def test_tep_join_and_publish_follow_the_anonymous_role_with_the_prefix() -> None:
    """With tep_prefix "tep.", joins need "tep.<channel>" in subscribe prefixes; publishes need publish prefixes."""
    hub, recorder = hub_with_recorder("tep.app.x", "tep.public.a")
    server = TEPServer(hub, TEPLimits(), prefix="tep.", auth=POLICY)
    client, transport = tep_client(server)
    client.frame_received(b'{"topic": "join", "payload": ["public.a", "app.b", "public.a"]}')
    assert transport.sent == [
        {"topic": "@join", "payload": ["public.a"]},
        {"topic": "#join", "payload": ["app.b"]},
    ]
    assert hub.subscribers("tep.app.b") == 0
    client.frame_received(b'{"topic": "app.x", "payload": 1}')
    assert transport.sent[-1]["topic"] == "#error"
    assert transport.sent[-1]["payload"]["error"] == "not authorized: role 'guest' may not publish to channel 'app.x'"
    # "public.chat." is a guest publish prefix of hub topics; TEP channel public.chat.x is hub topic tep.public.chat.x.
    client.frame_received(b'{"topic": "public.chat.x", "payload": 2}')
    assert transport.sent[-1]["topic"] == "#error"
    assert recorder.delivered == [] and recorder.forwarded == []
    assert server.stats["not_authorized"] == 2


def test_tep_without_prefix_publishes_where_the_role_allows() -> None:
    """Without a prefix the channel is the hub topic: a guest may publish to public.chat.x."""
    hub, recorder = hub_with_recorder("public.chat.x")
    server = TEPServer(hub, TEPLimits(), auth=POLICY)
    client, transport = tep_client(server)
    client.frame_received(b'{"topic": "public.chat.x", "payload": 3}')
    assert transport.sent == []
    assert [e.payload for e in recorder.forwarded] == [3]


def test_tep_server_refuses_every_client_when_anonymous_is_refused() -> None:
    """anonymous = false: the TEP server is marked to refuse clients (the protocol sends #error and closes 3000)."""
    server = TEPServer(Hub("n1"), TEPLimits(), auth=CLOSED)
    assert server.refuse_clients and server.role is None
    assert UNAUTHORIZED_CLOSE == 3000
    assert not TEPServer(Hub("n1"), TEPLimits(), auth=POLICY).refuse_clients
    assert not TEPServer(Hub("n1"), TEPLimits()).refuse_clients


# -- NSD ----------------------------------------------------------------------------------


def nsd_service(tmp_path: Path, policy: AuthPolicy | None, prefix: str = "nsd.") -> tuple[NSDService, Hub]:
    """An NSD service with ``policy`` on a fresh hub and store."""
    hub = Hub("n1")
    service = NSDService(
        hub, NSDStore(str(tmp_path / "nsd.sqlite3")), lambda: 1.0, NSDSettings(prefix=prefix, auth=policy)
    )
    service.start()
    return service, hub


def ask(service: NSDService, request: dict[str, Any]) -> dict[str, Any]:
    """One request through the codec, the answer decoded."""
    return dict(json.loads(service.handle(codec.decode_request(orjson.dumps(request)))))


def test_nsd_requests_follow_the_anonymous_role_with_the_prefix(tmp_path: Path) -> None:
    """Open/Publish/Subscribe are checked on prefix + channel; refusals are NOT AUTHORIZED errors."""
    service, hub = nsd_service(tmp_path, POLICY)
    ok = {"_class": "SuccessResponse"}
    # public.me: the guest may publish (nsd.public.me) and subscribe (nsd.public.).
    assert ask(service, {"_class": "OpenRequest", "identity": "public.me"}) == ok
    # public.room: subscribe only; Open still succeeds.
    assert ask(service, {"_class": "OpenRequest", "identity": "public.room"}) == ok
    # app.x: neither.
    assert ask(service, {"_class": "OpenRequest", "identity": "app.x"}) == {
        "_class": "ErrorResponse",
        "error": "NOT AUTHORIZED: role 'guest' may neither publish nor subscribe to channel app.x",
    }
    message = {"_class": "Message", "from": "x", "when": 0, "body": "hi"}
    assert ask(service, {"_class": "PublishRequest", "identity": "public.me", "message": message}) == ok
    refused = ask(service, {"_class": "PublishRequest", "identity": "public.room", "message": message})
    assert refused["error"] == "NOT AUTHORIZED: role 'guest' may not publish to channel public.room"
    refused = ask(service, {"_class": "SubscribeRequest", "identity": "public.me", "channel": "app.x"})
    assert refused["error"].startswith("NOT AUTHORIZED: role 'guest' may not subscribe")
    assert ask(service, {"_class": "SubscribeRequest", "identity": "public.room", "channel": "public.me"}) == ok
    got = ask(service, {"_class": "GetRequest", "identity": "public.room", "after": 0})
    assert [m["body"] for m in got["messages"]] == ["hi"]
    assert service.stats["not_authorized"] == 3
    service.stop()


def test_nsd_get_leaves_out_channels_the_role_may_not_read(tmp_path: Path) -> None:
    """A subscription made before the policy (or elsewhere) does not let Get read a forbidden channel."""
    open_service, hub = nsd_service(tmp_path, None)
    message = {"_class": "Message", "from": "x", "when": 0, "body": "secret"}
    for request in (
        {"_class": "OpenRequest", "identity": "app.x"},
        {"_class": "PublishRequest", "identity": "app.x", "message": message},
        {"_class": "OpenRequest", "identity": "public.me"},
        {"_class": "SubscribeRequest", "identity": "public.me", "channel": "app.x"},
    ):
        assert ask(open_service, request) == {"_class": "SuccessResponse"}
    assert len(ask(open_service, {"_class": "GetRequest", "identity": "public.me", "after": 0})["messages"]) == 1
    open_service.stop()
    guarded, _ = nsd_service(tmp_path, POLICY)
    assert ask(guarded, {"_class": "GetRequest", "identity": "public.me", "after": 0})["messages"] == []
    guarded.stop()


def test_nsd_refuses_every_client_when_anonymous_is_refused(tmp_path: Path) -> None:
    """anonymous = false: the first request is answered NOT AUTHORIZED and the connection closed."""
    service, hub = nsd_service(tmp_path, CLOSED)
    protocol = NSDProtocol(service)
    transport = StringTransport()
    protocol.makeConnection(transport)
    protocol.dataReceived(b'{"_class": "OpenRequest", "identity": "public.me"}\n{"_class": "GetRequest"')
    answer = json.loads(transport.value())
    assert answer["_class"] == "ErrorResponse" and answer["error"].startswith("NOT AUTHORIZED: ")
    assert transport.disconnecting
    assert not service.store.has_channel("public.me")
    service.stop()
