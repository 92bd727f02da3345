"""Pattern-based subscriptions in the WAMP broker, driven message by message on fake transports."""

from __future__ import annotations

from typing import Any

import pytest
from autobahn.wamp import message
from autobahn.wamp.role import RoleSubscriberFeatures

from pubsubclub.core.hub import Hub
from pubsubclub.core.patterns import Pattern
from pubsubclub.frontends.wamp import WampLimits, WampRouter
from pubsubclub.frontends.wamp.auth import AuthPolicy, Role
from pubsubclub.frontends.wamp.broker import hub_pattern, pattern_problem, wamp_topic
from pubsubclub.testing import MemoryWampTransport

REALMS = ("realm1", "realm2")


def joined(router: WampRouter, realm: str = "realm1") -> tuple[Any, MemoryWampTransport]:
    """A session on a fake transport that has joined ``realm``."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    session.onMessage(message.Hello(realm, {"subscriber": RoleSubscriberFeatures()}))
    assert isinstance(transport.sent[-1], message.Welcome)
    return session, transport


def subscribe(session: Any, transport: MemoryWampTransport, request: int, topic: str, match: str | None = None) -> Any:
    """SUBSCRIBE and return the answer (SUBSCRIBED or ERROR)."""
    session.onMessage(message.Subscribe(request, topic, match=match))
    return transport.sent[-1]


def events(transport: MemoryWampTransport) -> list[message.Event]:
    """The EVENTs sent so far, then forget them."""
    found = [m for m in transport.sent if isinstance(m, message.Event)]
    transport.sent.clear()
    return found


def test_welcome_announces_pattern_based_subscription() -> None:
    """WELCOME's broker features include pattern_based_subscription."""
    _, transport = joined(WampRouter(Hub()))
    welcome = transport.sent[0]
    assert welcome.roles["broker"].pattern_based_subscription is True


@pytest.mark.parametrize(
    ("match", "uri", "problem"),
    [
        ("prefix", "", "an empty prefix pattern is not allowed"),
        ("wildcard", "", "an empty wildcard pattern is not allowed"),
        ("prefix", "com..app", "is not a WAMP prefix pattern"),
        ("prefix", ".com", "is not a WAMP prefix pattern"),
        ("prefix", "com app", "is not a WAMP prefix pattern"),
        ("wildcard", "com. .x", "is not a WAMP wildcard pattern"),
        ("prefix", "$realm.realm2#", "reserved"),
        ("wildcard", "$cluster.", "reserved"),
        ("prefix", "x" * 513, "the limit is 512"),
        (None, "app..temp", "is not a WAMP URI"),  # exact: empty components are not allowed
    ],
)
def test_bad_patterns_get_invalid_uri(match: str | None, uri: str, problem: str) -> None:
    """Pattern URIs follow the WAMP spec: prefixes may end with '.', wildcards may have empty components."""
    session, transport = joined(WampRouter(Hub()))
    answer = subscribe(session, transport, 1, uri, match)
    assert isinstance(answer, message.Error) and answer.error == "wamp.error.invalid_uri"
    assert problem in answer.args[0]


@pytest.mark.parametrize(
    ("match", "uri"),
    [("prefix", "com.app."), ("prefix", "com.app"), ("wildcard", "app..temp"), ("wildcard", ".."), ("wildcard", "a.b")],
)
def test_good_patterns_are_accepted(match: str, uri: str) -> None:
    """Valid prefix and wildcard patterns are subscribed."""
    assert pattern_problem(match, uri, 512) is None
    session, transport = joined(WampRouter(Hub()))
    assert isinstance(subscribe(session, transport, 1, uri, match), message.Subscribed)


def test_one_event_per_matching_subscription_with_the_concrete_topic() -> None:
    """Subscribed exactly and by two patterns: three EVENTs, each with its own id; pattern ones carry the topic."""
    hub = Hub()
    session, transport = joined(WampRouter(hub))
    exact = subscribe(session, transport, 1, "app.k.temp").subscription
    prefix = subscribe(session, transport, 2, "app.", "prefix").subscription
    wild = subscribe(session, transport, 3, "app..temp", "wildcard").subscription
    assert len({exact, prefix, wild}) == 3
    transport.sent.clear()
    hub.deliver_remote(hub.envelope("app.k.temp", {"c": 21}))
    got = {e.subscription: e for e in events(transport)}
    assert set(got) == {exact, prefix, wild}
    assert got[exact].topic is None
    assert got[prefix].topic == got[wild].topic == "app.k.temp"
    assert all(e.args == [{"c": 21}] for e in got.values())
    assert len({e.publication for e in got.values()}) == 1  # one publication, seen three ways
    hub.deliver_remote(hub.envelope("app.x", 1))
    assert [(e.subscription, e.topic) for e in events(transport)] == [(prefix, "app.x")]
    hub.deliver_remote(hub.envelope("apple", 1))
    assert events(transport) == []


def test_one_id_per_match_and_pattern_broker_wide_and_encoded_once() -> None:
    """Sessions share a pattern's id; the same string under another match is another subscription."""
    hub = Hub()
    router = WampRouter(hub)
    one, t1 = joined(router)
    two, t2 = joined(router)
    a = subscribe(one, t1, 1, "app.", "prefix").subscription
    assert subscribe(two, t2, 1, "app.", "prefix").subscription == a
    assert subscribe(one, t1, 2, "app.", "prefix").subscription == a  # twice in one session: the same
    assert subscribe(two, t2, 2, "app.", "wildcard").subscription != a
    assert subscribe(two, t2, 3, "app.x").subscription != a
    t1.sent.clear()
    t2.sent.clear()
    hub.deliver_remote(hub.envelope("app.y", 1))
    [e1] = events(t1)
    e2 = [e for e in events(t2) if e.subscription == a]
    assert [(e.subscription, e.topic, e.args) for e in e2] == [(a, "app.y", [1])]
    assert (e1.subscription, e1.topic, e1.args) == (a, "app.y", [1])
    assert any(b is t1.encoded[-1] for b in t2.encoded)  # the same bytes object: encoded once, shared


def test_unsubscribe_and_leaving_drop_the_pattern() -> None:
    """UNSUBSCRIBE of a pattern, or the session ending, removes it from the hub and frees the id."""
    hub = Hub()
    router = WampRouter(hub)
    session, transport = joined(router)
    other, t2 = joined(router)
    sub = subscribe(session, transport, 1, "app..temp", "wildcard").subscription
    subscribe(other, t2, 1, "app.", "prefix")
    assert set(hub.patterns()) == {Pattern("wildcard", "app..temp"), Pattern("prefix", "app.")}
    session.onMessage(message.Unsubscribe(2, sub))
    assert isinstance(transport.sent[-1], message.Unsubscribed)
    assert hub.patterns() == [Pattern("prefix", "app.")]
    transport.sent.clear()
    hub.deliver_remote(hub.envelope("app.k.temp", 1))
    assert events(transport) == []
    other.onClose(True)
    assert hub.patterns() == [] and router._subscriptions == {}


def test_patterns_stay_in_their_realm() -> None:
    """A pattern in realm2 matches only realm2's topics, and its EVENT names the topic without the realm."""
    hub = Hub()
    router = WampRouter(hub, REALMS)
    two, t2 = joined(router, "realm2")
    one, t1 = joined(router, "realm1")
    p2 = subscribe(two, t2, 1, "com.", "prefix").subscription
    w2 = subscribe(two, t2, 2, ".t", "wildcard").subscription
    w1 = subscribe(one, t1, 1, ".t", "wildcard").subscription
    p1 = subscribe(one, t1, 2, "com.", "prefix").subscription
    assert hub.patterns() == [
        Pattern("prefix", "$realm.realm2#com."),
        Pattern("wildcard", "$realm.realm2#.t"),
        Pattern("wildcard", ".t"),
        Pattern("prefix", "com."),
    ]
    t1.sent.clear()
    t2.sent.clear()
    hub.deliver_remote(hub.envelope("com.t", 1))
    assert events(t2) == []
    assert sorted((e.subscription, e.topic) for e in events(t1)) == sorted([(w1, "com.t"), (p1, "com.t")])
    hub.deliver_remote(hub.envelope("$realm.realm2#com.t", 2))
    assert sorted((e.subscription, e.topic) for e in events(t2)) == sorted([(p2, "com.t"), (w2, "com.t")])
    assert events(t1) == []
    # Reserved topics are never caught by a wildcard's empty component.
    hub.deliver_remote(hub.envelope("$tep.t", 3))
    assert events(t1) == []


def test_realm_mapping_helpers() -> None:
    """hub_pattern maps like hub_topic; wamp_topic strips the realm again."""
    assert hub_pattern("realm1", "prefix", "a.", "realm1") == Pattern("prefix", "a.")
    assert hub_pattern("r2", "wildcard", "a..b", "realm1") == Pattern("wildcard", "$realm.r2#a..b")
    assert wamp_topic("r2", "$realm.r2#a.x.b", "realm1") == "a.x.b"
    assert wamp_topic("realm1", "a.x.b", "realm1") == "a.x.b"


def test_pattern_permissions_check_the_literal_head() -> None:
    """With --auth a pattern is allowed only if every topic it can match is: its literal head is checked."""
    policy = AuthPolicy(roles=(Role("guest", subscribe=("app.",)),), anonymous="guest")
    session, transport = joined(WampRouter(Hub(), auth=policy))
    assert isinstance(subscribe(session, transport, 1, "app.x", "prefix"), message.Subscribed)
    assert isinstance(subscribe(session, transport, 2, "app..temp", "wildcard"), message.Subscribed)
    for request, (uri, match) in enumerate([("ap", "prefix"), (".temp", "wildcard"), ("app", "wildcard")], 3):
        answer = subscribe(session, transport, request, uri, match)
        assert isinstance(answer, message.Error) and answer.error == "wamp.error.not_authorized", uri


def test_pattern_subscriptions_count_toward_the_session_limit() -> None:
    """Patterns are subscriptions like any other for max_subscriptions_per_session."""
    session, transport = joined(WampRouter(Hub(), limits=WampLimits(max_subscriptions_per_session=2)))
    subscribe(session, transport, 1, "a.", "prefix")
    subscribe(session, transport, 2, "a", "wildcard")
    answer = subscribe(session, transport, 3, "b.", "prefix")
    assert isinstance(answer, message.Error) and answer.error == "pubsubclub.error.too_many_subscriptions"


def test_publisher_exclusion_covers_pattern_subscriptions() -> None:
    """A publisher subscribed by pattern does not get its own publish by default."""
    hub = Hub()
    session, transport = joined(WampRouter(hub))
    subscribe(session, transport, 1, "app.", "prefix")
    session.onMessage(message.Publish(2, "app.x", args=["mine"]))
    session.onMessage(message.Publish(3, "app.x", args=["seen"], exclude_me=False))
    assert [e.args for e in events(transport)] == [["seen"]]
