"""Several realms per node, in memory: the settings, the realm mapping, per-realm auth tables, the handshake check."""

from __future__ import annotations

from pathlib import Path

import pytest
from autobahn.wamp import message
from autobahn.wamp.role import (
    RoleCalleeFeatures,
    RoleCallerFeatures,
    RolePublisherFeatures,
    RoleSubscriberFeatures,
)
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.cli.command import parser
from pubsubclub.config import ConfigError, build, load_toml, node_config
from pubsubclub.core.hub import Hub
from pubsubclub.core.patterns import Pattern
from pubsubclub.federation.realmcheck import PLAIN_REALM_HEADER, realm_conflict, realm_header
from pubsubclub.frontends.bridge.realm import RealmMap
from pubsubclub.frontends.wamp import WampRouter
from pubsubclub.frontends.wamp.auth import AuthFileError, parse_auth
from pubsubclub.frontends.wamp.uris import hub_topic, split_hub_topic, wamp_topic
from pubsubclub.testing import MemoryWampTransport


def node(*args: str) -> object:
    """The configuration of ``pubsubclub node ARGS``."""
    return node_config(parser().parse_args(["node", *args]))


def test_repeated_realm_flag_serves_every_realm() -> None:
    """``--realm a --realm b`` serves both (the last no longer wins); one --realm is the old single realm."""
    config = node("--realm", "a", "--realm", "b")
    assert config.wamp.realms == ("a", "b") and config.wamp.realm == "a"  # type: ignore[attr-defined]
    assert node("--realm", "solo").wamp.realms == ("solo",)  # type: ignore[attr-defined]
    assert node().wamp.realms == ("realm1",) and node().wamp.plain == "realm1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "realms"),
    [
        ('[wamp]\nrealms = ["a", "b"]\n', ("a", "b")),
        ('[wamp]\nrealm = "old"\n', ("old",)),
        ('[wamp]\nrealms = "one"\n', ("one",)),
        ('realm = "flat"\n', ("flat",)),
    ],
)
def test_toml_realms_list_and_the_old_single_key(tmp_path: Path, text: str, realms: tuple[str, ...]) -> None:
    """``[wamp] realms = [...]``, the old ``[wamp] realm`` and the flat ``realm`` key all set the realms."""
    path = tmp_path / "node.toml"
    path.write_text(text)
    assert build(load_toml(str(path)), {}).wamp.realms == realms


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("--realm", "a", "--realm", "a"), "realm"),
        (("--realm", "bad#realm"), "realm"),
        (("--realm", "with space"), "realm"),
        (("--plain-realm", "x#y"), "plain-realm"),
    ],
)
def test_bad_realm_lists_are_refused(args: tuple[str, ...], key: str) -> None:
    """A realm listed twice, or a name with '#' or whitespace, is a ConfigError naming the key."""
    with pytest.raises(ConfigError) as e:
        node(*args)
    assert e.value.key == key


def test_an_empty_realm_list_is_refused(tmp_path: Path) -> None:
    """``[wamp] realms = []`` is a ConfigError naming the key, not a crash at start."""
    path = tmp_path / "node.toml"
    path.write_text("[wamp]\nrealms = []\n")
    with pytest.raises(ConfigError) as e:
        build(load_toml(str(path)), {})
    assert e.value.key == "realm"


def test_both_toml_keys_at_once_are_refused(tmp_path: Path) -> None:
    """``realm`` and ``realms`` in one [wamp] section: set twice, the message names both."""
    path = tmp_path / "node.toml"
    path.write_text('[wamp]\nrealm = "a"\nrealms = ["b"]\n')
    with pytest.raises(ConfigError, match="realms, realm"):
        load_toml(str(path))


def test_a_bridge_joins_one_realm() -> None:
    """``pubsubclub bridge`` with two realms is refused (it joins one router realm)."""
    with pytest.raises(ConfigError, match="one realm"):
        build({}, {"wamp.realms": ("a", "b"), "bridge.router": "ws://127.0.0.1:8080/ws"})


def test_several_realms_without_a_plain_realm_are_warned_about(tmp_path: Path) -> None:
    """Several realms and no plain-realm: a warning says the first is plain and every node must agree."""
    warned = build({}, {"wamp.realms": ("a", "b")}).warnings
    assert any("plain-realm" in w and "'a'" in w for w in warned), warned
    assert not build({}, {"wamp.realms": ("a", "b"), "wamp.plain-realm": "realm1"}).warnings


def test_mapping_is_the_same_whatever_else_a_node_serves() -> None:
    """Routers serving [realm1, a, b], [b, a] and [b] with plain realm realm1 map each realm's topic alike."""
    routers = [
        WampRouter(Hub(), realms, plain_realm="realm1") for realms in (("realm1", "a", "b"), ("b", "a"), ("b",))
    ]
    for realm in ("a", "b"):
        mapped = {r.hub_topic(realm, "t.x") for r in routers if realm in r.realms}
        assert mapped == {f"$realm.{realm}#t.x"}
    assert routers[0].hub_topic("realm1", "t.x") == "t.x"
    # Without a plain realm the first served is plain (the old rule): two of these would disagree on b.
    assert WampRouter(Hub(), ("b",)).hub_topic("b", "t.x") == "t.x"


@given(
    realm=st.text(st.characters(blacklist_characters="#", blacklist_categories=("Cs",)), min_size=1, max_size=20),
    topic=st.text(min_size=1, max_size=30).filter(lambda t: not t.startswith("$")),
)
def test_split_hub_topic_inverts_hub_topic(realm: str, topic: str) -> None:
    """For any realm and topic, split_hub_topic gives back (realm, topic); wamp_topic the topic."""
    for plain in ("realm1", realm):
        hub = hub_topic(realm, topic, plain)
        assert split_hub_topic(hub, plain) == (realm, topic)
        assert wamp_topic(realm, hub, plain) == topic
    assert split_hub_topic("$nsd.replication", "realm1") is None


AUTH = """
anonymous = "guest"
[roles.guest]
subscribe = ["public."]
[realms.sales]
anonymous = "clerk"
[realms.sales.roles.clerk]
subscribe = ["orders."]
publish = ["orders."]
"""


def welcome_or_abort(router: WampRouter, realm: str) -> message.Message:
    """What an anonymous HELLO to ``realm`` is answered with."""
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    session.onMessage(message.Hello(realm, {"subscriber": RoleSubscriberFeatures()}))
    return transport.sent[0]  # type: ignore[no-any-return]


def test_each_realm_has_its_own_roles_mapped_into_its_topics() -> None:
    """[realms.sales] roles act on sales' WAMP topics only; a realm without a table ABORTs; the plain realm uses
    the top level."""
    router = WampRouter(Hub(), ("realm1", "sales", "hr"), auth=parse_auth(AUTH), plain_realm="realm1")
    policy = router.realm_auth["sales"]
    assert policy is not None and policy.may_publish("clerk", "$realm.sales#orders.1")
    assert not policy.may_publish("clerk", "orders.1")  # the plain realm's topic of that name
    assert not policy.may_subscribe("clerk", "$realm.hr#orders.1")
    assert isinstance(welcome_or_abort(router, "sales"), message.Welcome)
    assert isinstance(welcome_or_abort(router, "realm1"), message.Welcome)
    refused = welcome_or_abort(router, "hr")
    assert isinstance(refused, message.Abort) and refused.reason == "wamp.error.not_authorized"
    assert "[realms.hr]" in (refused.message or "")
    unknown = welcome_or_abort(router, "nope")
    assert isinstance(unknown, message.Abort) and unknown.reason == "wamp.error.no_such_realm"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[realms]\nsales = 3\n", 2, "must be a table"),
        ("[realms.sales]\nanonymous = \"nobody\"\n", 2, "not defined"),
        ("[realms.sales]\nbogus = 1\n", 2, "unknown key 'bogus'"),
        ("[realms.sales.roles.r]\npublish = [1]\n", 2, "topic-prefix"),
        ('[realms."a#b"]\n', 1, "realm names"),
    ],
)
def test_bad_realm_tables_name_the_line(text: str, line: int, words: str) -> None:
    """A wrong [realms.NAME] table is an AuthFileError naming its line."""
    with pytest.raises(AuthFileError) as e:
        parse_auth(text)
    assert e.value.line == line and words in e.value.problem


def test_a_table_for_the_plain_realm_is_refused(tmp_path: Path) -> None:
    """[realms.realm1] while realm1 is plain: refused (its roles are the top level, shared with NSD and TEP)."""
    path = tmp_path / "auth.toml"
    path.write_text('[realms.realm1]\nanonymous = false\n')
    with pytest.raises(ConfigError, match="plain realm"):
        build({}, {"auth": str(path)})
    assert build({}, {"auth": str(path), "wamp.realms": ("x",), "wamp.plain-realm": "other"}).warnings


def test_plain_realm_conflict_rule() -> None:
    """Same plain realm, or a peer that says nothing: link; another one: refused with both names."""
    told = realm_header("réalm one")[PLAIN_REALM_HEADER]
    assert told.isascii() and realm_conflict("réalm one", told) is None
    assert realm_conflict("realm1", None) is None and realm_conflict(None, told) is None
    why = realm_conflict("realm1", realm_header("a")[PLAIN_REALM_HEADER])
    assert why is not None and "'realm1'" in why and "'a'" in why
    assert realm_conflict("realm1", "x" * 100_000) is not None


def test_bridge_realm_map_carries_one_cluster_realm() -> None:
    """A bridge onto cluster realm sales maps router t <-> $realm.sales#t and lets no other realm or reserved topic
    cross; onto the plain realm it is the identity, as before."""
    sales = RealmMap("sales", "realm1")
    assert sales.to_hub("com.t") == "$realm.sales#com.t"
    assert sales.from_hub("$realm.sales#com.t") == "com.t"
    assert sales.to_hub_pattern("prefix", "com.") == Pattern("prefix", "$realm.sales#com.")
    for hub in ("com.t", "$realm.other#com.t", "$realm.sales#wamp.x", "$nsd.x", "$realm.sales#$x"):
        assert sales.from_hub(hub) is None, hub
    assert sales.to_hub("wamp.session.on_join") is None and sales.to_hub("$x") is None
    plain = RealmMap("realm1", "realm1")
    assert plain.to_hub("com.t") == plain.from_hub("com.t") == "com.t"
    assert plain.from_hub("$realm.sales#com.t") is None


def test_cluster_realm_needs_an_explicit_plain_realm() -> None:
    """``[bridge] cluster-realm`` without ``[wamp] plain-realm`` is refused (the mapping would be a guess)."""
    bridge = {"bridge.router": "ws://127.0.0.1:8080/ws", "bridge.cluster-realm": "sales"}
    with pytest.raises(ConfigError) as e:
        build({}, bridge)
    assert e.value.key == "cluster-realm"
    assert build({}, {**bridge, "wamp.plain-realm": "realm1"}).bridge.cluster_realm == "sales"


def test_a_client_cannot_name_another_realms_hub_topics() -> None:
    """In realm a, PUBLISH, SUBSCRIBE (exact and prefix), REGISTER and CALL of ``$realm.b#...`` are refused, and a
    realm name holding '#' is no realm."""
    router = WampRouter(Hub(), ("a", "b"), plain_realm="realm1")
    session = router.session_factory()
    transport = MemoryWampTransport()
    session.onOpen(transport)
    session.onMessage(
        message.Hello("a", {"subscriber": RoleSubscriberFeatures(), "publisher": RolePublisherFeatures(),
                            "callee": RoleCalleeFeatures(), "caller": RoleCallerFeatures()})  # fmt: skip
    )
    assert isinstance(transport.sent[0], message.Welcome)
    forged = "$realm.b#com.t"
    session.onMessage(message.Publish(1, forged, acknowledge=True))
    session.onMessage(message.Subscribe(2, forged))
    session.onMessage(message.Subscribe(3, "$realm.b#", match="prefix"))
    session.onMessage(message.Register(4, forged))
    session.onMessage(message.Call(5, forged))
    answers = transport.sent[1:]
    assert [type(m).__name__ for m in answers] == ["Error"] * 5, answers
    assert all(m.error in ("wamp.error.invalid_uri", "wamp.error.no_such_procedure") for m in answers), answers
    assert not any(t.startswith("$realm.b#") for t in router.hub.topics())
    assert isinstance(welcome_or_abort(router, "a#b"), message.Abort)
