"""Publish options across two real nodes (issue 20, point 2), with Autobahn-Python sessions.

``eligible``/``exclude`` by session id, authid and authrole, ``exclude_me`` and
publisher disclosure (``disclose_me``) are applied on the subscriber's node:
the options cross the link in the PSC301 metadata (PSC 0.6, ``"p"``). A
publisher on node A, subscribers on A and on B; absence is proven with a
plain marker publish sent after the restricted one (same publisher, same
topic: it arrives after it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp import message
from autobahn.wamp.types import PublishOptions, SubscribeOptions
from helpers.nodes import Cluster, NodeProcess, share_logs, start_all, unshare_logs
from helpers.polling import until
from helpers.wampclient import Recorder, connect, leave

from pubsubclub.federation import psc

pytestmark = pytest.mark.slow

POLICY = """\
anonymous = "guest"
[roles.guest]
subscribe = [""]
publish = [""]
[roles.writer]
subscribe = [""]
publish = [""]
[roles.reader]
subscribe = [""]
publish = [""]
[[principals]]
authid = "alice"
role = "writer"
ticket = "alice-ticket"
[[principals]]
authid = "bob"
role = "reader"
ticket = "bob-ticket"
[[principals]]
authid = "carol"
role = "reader"
ticket = "carol-ticket"
"""
MARKER = "marker"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two linked nodes with the same --auth policy (anonymous guests and three ticket principals).

    Shared by the module's tests: each uses its own topic and sessions.
    """
    tmp_path = tmp_path_factory.mktemp("options")
    policy = tmp_path / "auth.toml"
    policy.write_text(POLICY)
    nodes = [NodeProcess(f"node{i}", tmp_path, extra=("--auth", str(policy))) for i in (1, 2)]
    nodes[0].peers, nodes[1].peers = [nodes[1].psc_url], [nodes[0].psc_url]
    share_logs(nodes)
    try:
        start_all(nodes)
        cluster = Cluster(nodes)
        cluster.wait_linked()
        yield cluster
    finally:
        for node in nodes:
            node.stop()
        unshare_logs(nodes)


async def user(node: NodeProcess, name: str | None) -> ApplicationSession:
    """A session on ``node``: the ticket principal ``name``, or an anonymous guest for None."""
    if name is None:
        return await connect(node.wamp_url)
    return await connect(node.wamp_url, authid=name, ticket=f"{name}-ticket")


async def subscribed(pair: Cluster, topic: str, sessions: list[ApplicationSession]) -> list[Recorder]:
    """Subscribe a recorder (with event details) for each session; wait until node 1 knows node 2's interest."""
    recorders = []
    for session in sessions:
        rec = Recorder()
        await session.subscribe(rec, topic, options=SubscribeOptions(details=True))
        recorders.append(rec)
    await until(lambda: "node2" in pair[0].stats()["remote_interest"].get(topic, []), f"interest in {topic}")
    return recorders


async def received(recorders: list[Recorder], markers: int) -> list[list[Any]]:
    """What each recorder got besides the markers, once it has all ``markers`` of them (every one must arrive)."""
    for rec in recorders:
        await rec.wait_until(lambda r: r.args.count(MARKER) == markers)
    return [[arg for arg in rec.args if arg != MARKER] for rec in recorders]


async def publish_then_marker(publisher: ApplicationSession, topic: str, value: Any, **options: Any) -> None:
    """Publish ``value`` with ``options`` (acknowledged), then the plain marker."""
    await publisher.publish(topic, value, options=PublishOptions(acknowledge=True, **options))
    await publisher.publish(topic, MARKER, options=PublishOptions(acknowledge=True))


def session_id(session: ApplicationSession) -> int:
    """The session's WAMP id, from its WELCOME."""
    return int(session.details.session)


@pytest_twisted.ensureDeferred
async def test_exclude_and_eligible_name_sessions_on_both_nodes(pair: Cluster) -> None:
    """exclude and eligible by session id hold for subscribers on the publisher's node and on the other node."""
    publisher = await user(pair[0], None)
    near, far1, far2 = await user(pair[0], None), await user(pair[1], None), await user(pair[1], None)
    recs = await subscribed(pair, "opts.ids", [near, far1, far2])
    await publish_then_marker(publisher, "opts.ids", "not far1", exclude=[session_id(far1)])
    await publish_then_marker(publisher, "opts.ids", "near and far2", eligible=[session_id(near), session_id(far2)])
    both = [session_id(far1), session_id(far2)]
    await publish_then_marker(publisher, "opts.ids", "far2 only", eligible=both, exclude=[session_id(far1)])
    got = await received(recs, 3)
    assert got == [
        ["not far1", "near and far2"],  # near (node 1)
        [],  # far1 (node 2)
        ["not far1", "near and far2", "far2 only"],  # far2 (node 2)
    ]
    await leave(publisher, near, far1, far2)


@pytest_twisted.ensureDeferred
async def test_authid_and_authrole_lists_across_nodes(pair: Cluster) -> None:
    """eligible/exclude by authid and authrole are applied on node 2 to its own subscribers."""
    publisher = await user(pair[0], "alice")
    alice, bob, carol, guest = [await user(pair[1], name) for name in ("alice", "bob", "carol", None)]
    recs = await subscribed(pair, "opts.names", [alice, bob, carol, guest])
    await publish_then_marker(publisher, "opts.names", "no bob", exclude_authid=["bob"])
    await publish_then_marker(publisher, "opts.names", "bob and carol", eligible_authid=["bob", "carol"])
    await publish_then_marker(publisher, "opts.names", "readers", eligible_authrole=["reader"])
    await publish_then_marker(publisher, "opts.names", "no readers", exclude_authrole=["reader"])
    await publish_then_marker(
        publisher, "opts.names", "readers but carol", eligible_authrole=["reader"], exclude_authid=["carol"]
    )
    got = await received(recs, 5)
    assert got == [
        ["no bob", "no readers"],  # alice (writer)
        ["bob and carol", "readers", "readers but carol"],  # bob (reader)
        ["no bob", "bob and carol", "readers"],  # carol (reader)
        ["no bob", "no readers"],  # the guest (anonymous)
    ]
    await leave(publisher, alice, bob, carol, guest)


@pytest_twisted.ensureDeferred
async def test_exclude_me_false_delivers_to_the_publisher_itself(pair: Cluster) -> None:
    """exclude_me defaults to true; with exclude_me=False the publisher gets its own event, the far node too."""
    publisher, far = await user(pair[0], None), await user(pair[1], None)
    own, remote = await subscribed(pair, "opts.me", [publisher, far])
    await publish_then_marker(publisher, "opts.me", "not me")
    await publish_then_marker(publisher, "opts.me", "me too", exclude_me=False)
    await remote.wait_until(lambda r: r.args.count(MARKER) == 2)
    await publisher.publish("opts.me", "end", options=PublishOptions(acknowledge=True, exclude_me=False))
    await own.wait_until(lambda r: "end" in r.args)
    assert own.args == ["me too", "end"]
    assert remote.args[:4] == ["not me", MARKER, "me too", MARKER]
    await leave(publisher, far)


class _DisclosingPublish(message.Publish):  # type: ignore[misc]
    """A PUBLISH with ``disclose_me: true`` (Autobahn-Python's PublishOptions has no such option)."""

    def marshal(self) -> list[Any]:
        raw: list[Any] = super().marshal()
        raw[2]["disclose_me"] = True
        return raw


@pytest_twisted.ensureDeferred
async def test_disclose_me_names_the_publisher_on_the_other_node(pair: Cluster) -> None:
    """disclose_me (honoured by default) gives EVENT details publisher/authid/authrole on both nodes; else none."""
    publisher = await user(pair[0], "alice")
    near, far = await user(pair[0], "bob"), await user(pair[1], "carol")
    recs = await subscribed(pair, "opts.who", [near, far])
    publisher._transport.send(_DisclosingPublish(publisher._request_id_gen.next(), "opts.who", args=["named"]))
    await publish_then_marker(publisher, "opts.who", "anonymous")
    for rec in recs:
        await rec.wait_until(lambda r: MARKER in r.args)
        named, plain = (kwargs["details"] for _, kwargs in rec.events[:2])
        assert rec.args[:2] == ["named", "anonymous"]
        assert (named.publisher, named.publisher_authid, named.publisher_authrole) == (
            session_id(publisher),
            "alice",
            "writer",
        )
        assert (plain.publisher, plain.publisher_authid, plain.publisher_authrole) == (None, None, None)
    await leave(publisher, near, far)


@pytest_twisted.ensureDeferred
async def test_welcome_announces_the_broker_features(pair: Cluster) -> None:
    """WELCOME's broker role lists subscriber_blackwhite_listing, publisher_identification and publisher_exclusion."""
    session = await user(pair[1], None)
    broker = session._router_roles["broker"]
    assert broker.subscriber_blackwhite_listing is True
    assert broker.publisher_identification is True
    assert broker.publisher_exclusion is True
    assert broker.pattern_based_subscription is True
    await leave(session)


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"x": [1, "2"]}, "'x' must be a list of WAMP session ids"),
        ({"e": [0]}, "'e' must be a list of WAMP session ids"),
        ({"ea": "alice"}, "'ea' must be a list of strings"),
        ({"zz": []}, "unknown key 'zz'"),
        ({}, "must be a non-empty object"),
        ({"d": {"publisher": 1}}, "'d' must be an object of publisher, publisher_authid and publisher_authrole"),
    ],
)
def test_a_routing_object_a_node_does_not_understand_drops_the_message(options: Any, problem: str) -> None:
    """PSC301 metadata "p" is checked strictly: an unknown key or a wrong type drops that message, never ignored."""
    frame = psc.encode_publish_meta("t", 1, "node1", 1.0, "m-1", options=options)
    with pytest.raises(psc.PSCPayloadError, match=problem):
        psc.decode(frame)


def test_routing_object_round_trips_with_binary_values() -> None:
    """A message with bytes and publish options crosses as 0.6 ("b" and "p") and comes back the same."""
    disclosed = {"publisher": 5, "publisher_authid": None, "publisher_authrole": "r"}
    options = {"x": [2**53], "er": ["reader"], "d": disclosed}
    frame = psc.encode_publish_meta("t", [b"\x00\x01", "\x00s"], "node1", 1.0, "m-1", binary=True, options=options)
    decoded = psc.decode(frame)
    assert isinstance(decoded, psc.Publish) and decoded.meta is not None
    assert decoded.message == [b"\x00\x01", "\x00s"]
    assert decoded.meta.options == options and decoded.meta.binary
