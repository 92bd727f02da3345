"""The WAMP meta API across real node processes (three linked nodes), with Autobahn-Python sessions."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, RegisterOptions
from helpers.nodes import Cluster, NodeProcess, assert_clean_log, start_all
from helpers.polling import until
from helpers.ports import free_port
from helpers.wampclient import Recorder, connect, leave

pytestmark = pytest.mark.slow

POLICY = """
anonymous = "admin"
[roles.admin]
subscribe = [""]
publish = [""]
[roles.app]
subscribe = ["app."]
publish = ["app."]
[roles.monitor]
subscribe = ["$meta.realm1#wamp.session."]
publish = ["$meta.realm1#wamp.session."]
[[principals]]
authid = "bob"
role = "app"
ticket = "bob-ticket"
[[principals]]
authid = "mona"
role = "monitor"
ticket = "mona-ticket"
"""
#: ``--wamp-meta-max-results`` of the cluster: small, so a bounded list is cheap to overflow.
MAX_RESULTS = 8


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three linked nodes with one --auth policy (anonymous admins, an app and a monitor principal)."""
    tmp_path = tmp_path_factory.mktemp("meta")
    policy = tmp_path / "auth.toml"
    policy.write_text(POLICY)
    extra = ("--auth", str(policy), "--wamp-meta-max-results", str(MAX_RESULTS), "--wamp-meta-timeout", "3")
    nodes = [NodeProcess(f"node{i}", tmp_path, extra=extra) for i in (1, 2, 3)]
    for node in nodes:
        node.peers = [other.psc_url for other in nodes if other is not node]
    start_all(nodes)  # start-ups overlap
    cluster = Cluster(nodes)
    cluster.wait_linked()
    yield cluster
    for node in nodes:
        assert_clean_log(node)
        node.stop()


async def call_error(session: Any, procedure: str, *args: Any, **kwargs: Any) -> ApplicationError:
    """The ApplicationError a call ends with (fails if it returns)."""
    try:
        result = await session.call(procedure, *args, **kwargs)
    except ApplicationError as e:
        return e
    raise AssertionError(f"the call returned {result!r}")


async def meta_subscribed(cluster: Cluster, session: Any, uris: list[str], at: list[int]) -> Recorder:
    """Subscribe one recorder to meta event ``uris``; wait until nodes ``at`` forward them to node 1."""
    rec = Recorder()
    for uri in uris:
        await session.subscribe(lambda *args, uri=uri: rec(uri, *args), uri)
    for i in at:
        for uri in uris:
            topic = f"$meta.realm1#{uri}"
            await until(lambda i=i, t=topic: "node1" in cluster[i].stats()["remote_interest"].get(t, []), topic)
    return rec


@pytest_twisted.ensureDeferred
async def test_session_count_list_and_get_answer_for_every_node(trio: Cluster) -> None:
    """wamp.session.count/list/get on node 1 see the sessions of nodes 2 and 3, with an authrole filter."""
    a, b, c = [await connect(trio[i].wamp_url) for i in (0, 1, 2)]
    ids = {s._session_id for s in (a, b, c)}
    try:
        assert await a.call("wamp.session.count") == 3
        assert set(await a.call("wamp.session.list")) == ids
        details = await a.call("wamp.session.get", c._session_id)
        assert details["session"] == c._session_id and details["node"] == "node3"
        assert details["authrole"] == "admin" and details["transport"]["type"] == "websocket"
        error = await call_error(a, "wamp.session.get", 12345)
        assert error.error == "wamp.error.no_such_session"
        assert await c.call("wamp.session.count", ["app"]) == 0
        bob = await connect(trio[1].wamp_url, authid="bob", ticket="bob-ticket")
        assert await c.call("wamp.session.count", ["app"]) == 1
        assert await c.call("wamp.session.list", ["app"]) == [bob._session_id]
        await leave(bob)
        assert await a.call("wamp.session.count", ["app"]) == 0
        error = await call_error(a, "wamp.session.get", "not an id")
        assert error.error == "wamp.error.invalid_argument"
    finally:
        await leave(a, b, c)


@pytest_twisted.ensureDeferred
async def test_on_join_and_on_leave_reach_a_subscriber_on_another_node(trio: Cluster) -> None:
    """A session joining and leaving node 2 is seen by an on_join/on_leave subscriber on node 1 (whose own
    subscriptions to meta events are not listed)."""
    watcher = await connect(trio[0].wamp_url)
    try:
        rec = await meta_subscribed(trio, watcher, ["wamp.session.on_join", "wamp.session.on_leave"], [1])
        # The meta API's own subscriptions are not listed (as in Crossbar).
        assert await watcher.call("wamp.subscription.lookup", "wamp.session.on_join") is None
        guest = await connect(trio[1].wamp_url)
        sid = guest._session_id
        await rec.wait_until(lambda r: any(e[0][0] == "wamp.session.on_join" for e in r.events))
        [(uri, details)] = [e[0] for e in rec.events]
        assert uri == "wamp.session.on_join" and details["session"] == sid and details["node"] == "node2"
        await leave(guest)
        await rec.wait_for(2)
        assert rec.events[1][0] == ("wamp.session.on_leave", sid, details["authid"], "admin")
    finally:
        await leave(watcher)


@pytest_twisted.ensureDeferred
async def test_subscriptions_are_looked_up_and_listed_across_nodes(trio: Cluster) -> None:
    """Subscribers on nodes 1 and 2 are found from node 3 (lookup, get, match, list, list/count_subscribers),
    and on_subscribe on node 2 reaches a subscriber on node 1."""
    watcher, s1, s2, s3 = [await connect(trio[i].wamp_url) for i in (0, 0, 1, 2)]
    topic = "com.example.meta.topic"
    try:
        rec = await meta_subscribed(trio, watcher, ["wamp.subscription.on_subscribe"], [1])
        await s1.subscribe(lambda *a: None, topic)
        sub2 = await s2.subscribe(lambda *a: None, topic)
        await rec.wait_until(lambda r: any(e[0][1] == s2._session_id for e in r.events))
        assert ("wamp.subscription.on_subscribe", s2._session_id, sub2.id) in [e[0] for e in rec.events]
        sub_id = await s3.call("wamp.subscription.lookup", topic)
        assert isinstance(sub_id, int)
        assert set(await s3.call("wamp.subscription.list_subscribers", sub_id)) == {s1._session_id, s2._session_id}
        assert await s3.call("wamp.subscription.count_subscribers", sub_id) == 2
        # Node 2's own id names the same subscription.
        assert await s3.call("wamp.subscription.count_subscribers", sub2.id) == 2
        details = await s3.call("wamp.subscription.get", sub_id)
        assert details["uri"] == topic and details["match"] == "exact" and details["id"] == sub_id
        assert await s3.call("wamp.subscription.match", topic) == [sub_id]
        assert sub_id in (await s3.call("wamp.subscription.list"))["exact"]
        assert await s3.call("wamp.subscription.lookup", "com.example.meta.nobody") is None
        error = await call_error(s3, "wamp.subscription.get", 4242)
        assert error.error == "wamp.error.no_such_subscription"
        error = await call_error(s3, "wamp.subscription.list_subscribers", 4242)
        assert error.error == "wamp.error.no_such_subscription"
    finally:
        await leave(watcher, s1, s2, s3)


@pytest_twisted.ensureDeferred
async def test_registrations_and_their_callees_are_listed_across_nodes(trio: Cluster) -> None:
    """A single procedure on node 2 and a shared one on nodes 2 and 3: lookup, get, match, list,
    list_callees and count_callees answered on node 1."""
    caller, callee2, callee3 = [await connect(trio[i].wamp_url) for i in (0, 1, 2)]
    try:
        single = await callee2.register(lambda: 1, "com.example.meta.proc")
        shared = RegisterOptions(invoke="roundrobin")
        await callee2.register(lambda: 2, "com.example.meta.shared", options=shared)
        await callee3.register(lambda: 3, "com.example.meta.shared", options=shared)
        await until(lambda: trio[0].stats()["wamp"]["dealer"]["remote_registrations"] >= 3, "node 1 knows them")
        assert await caller.call("wamp.registration.lookup", "com.example.meta.proc") == single.id
        assert await caller.call("wamp.registration.match", "com.example.meta.proc") == single.id
        details = await caller.call("wamp.registration.get", single.id)
        assert details["uri"] == "com.example.meta.proc" and details["invoke"] == "single"
        assert await caller.call("wamp.registration.list_callees", single.id) == [callee2._session_id]
        shared_id = await caller.call("wamp.registration.lookup", "com.example.meta.shared")
        callees = await caller.call("wamp.registration.list_callees", shared_id)
        assert sorted(callees) == sorted([callee2._session_id, callee3._session_id])
        assert await caller.call("wamp.registration.count_callees", shared_id) == 2
        listed = await caller.call("wamp.registration.list")
        assert single.id in listed["exact"] and shared_id in listed["exact"]
        assert await caller.call("wamp.registration.lookup", "com.example.meta.none") is None
        error = await call_error(caller, "wamp.registration.get", 4242)
        assert error.error == "wamp.error.no_such_registration"
    finally:
        await leave(caller, callee2, callee3)


@pytest_twisted.ensureDeferred
async def test_register_and_unregister_events_reach_another_node(trio: Cluster) -> None:
    """REGISTER and UNREGISTER on node 2 give on_create, on_register, on_unregister, on_delete on node 1."""
    watcher, callee = await connect(trio[0].wamp_url), await connect(trio[1].wamp_url)
    uris = [f"wamp.registration.{e}" for e in ("on_create", "on_register", "on_unregister", "on_delete")]
    try:
        rec = await meta_subscribed(trio, watcher, uris, [1])
        registration = await callee.register(lambda: None, "com.example.meta.evented")
        await rec.wait_for(2)
        sid = callee._session_id
        (uri, who, details), second = rec.events[0][0], rec.events[1][0]
        assert (uri, who) == ("wamp.registration.on_create", sid)
        assert details["id"] == registration.id and details["uri"] == "com.example.meta.evented"
        assert second == ("wamp.registration.on_register", sid, registration.id)
        await registration.unregister()
        await rec.wait_for(4)
        assert [e[0] for e in rec.events[2:]] == [
            ("wamp.registration.on_unregister", sid, registration.id),
            ("wamp.registration.on_delete", sid, registration.id),
        ]
    finally:
        await leave(watcher, callee)


@pytest_twisted.ensureDeferred
async def test_meta_api_needs_a_role_allowed_to_use_it(trio: Cluster) -> None:
    """A role without the meta prefixes is refused calls and subscriptions; a monitor role gets only its part;
    nobody may publish a meta event or register a meta procedure."""
    bob = await connect(trio[0].wamp_url, authid="bob", ticket="bob-ticket")
    mona = await connect(trio[1].wamp_url, authid="mona", ticket="mona-ticket")
    admin = await connect(trio[2].wamp_url)
    try:
        assert (await call_error(bob, "wamp.session.count")).error == "wamp.error.not_authorized"
        with pytest.raises(ApplicationError) as refused:
            await bob.subscribe(lambda *a: None, "wamp.session.on_join")
        assert refused.value.error == "wamp.error.not_authorized"
        assert await mona.call("wamp.session.count") == 3
        assert (await call_error(mona, "wamp.registration.list")).error == "wamp.error.not_authorized"
        with pytest.raises(ApplicationError) as forged:
            await admin.publish("wamp.session.on_join", {"session": 1}, options=PublishOptions(acknowledge=True))
        assert forged.value.error == "wamp.error.invalid_uri"
        with pytest.raises(ApplicationError) as hijack:
            await admin.register(lambda: 0, "wamp.session.count")
        assert hijack.value.error == "wamp.error.invalid_uri"
    finally:
        await leave(bob, mona, admin)


@pytest_twisted.ensureDeferred
async def test_a_list_longer_than_the_limit_is_an_error(trio: Cluster) -> None:
    """More sessions than --wamp-meta-max-results: wamp.session.list is refused naming the limit; count still works."""
    sessions = [await connect(trio[i % 3].wamp_url) for i in range(MAX_RESULTS + 1)]
    try:
        error = await call_error(sessions[0], "wamp.session.list")
        assert error.error == "pubsubclub.error.too_many_results"
        assert error.kwargs == {"limit": "wamp.meta-max-results", "max": MAX_RESULTS}
        assert await sessions[0].call("wamp.session.count") == MAX_RESULTS + 1
    finally:
        await leave(*sessions)


@pytest_twisted.ensureDeferred
async def test_a_node_that_does_not_answer_is_named_not_waited_for(trio: Cluster) -> None:
    """With node 3 stopped (SIGSTOP), wamp.session.count on node 1 ends within the meta timeout with ERROR
    meta_incomplete naming node 3; once node 3 runs again the count answers."""
    a = await connect(trio[0].wamp_url)
    pid = trio[2].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        error = await call_error(a, "wamp.session.count")
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        assert error.error == "pubsubclub.error.meta_incomplete"
        assert error.kwargs == {"nodes": ["node3"]}
        assert await a.call("wamp.session.count") == 1
    finally:
        await leave(a)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two linked nodes without --auth (every session anonymous, allowed everything)."""
    tmp_path = tmp_path_factory.mktemp("meta-open")
    nodes = [NodeProcess(f"node{i}", tmp_path) for i in (1, 2)]
    nodes[0].peers, nodes[1].peers = [nodes[1].psc_url], [nodes[0].psc_url]
    start_all(nodes)  # start-ups overlap
    cluster = Cluster(nodes)
    cluster.wait_linked()
    yield cluster
    for node in nodes:
        assert_clean_log(node)
        node.stop()


@pytest_twisted.ensureDeferred
async def test_without_auth_anyone_may_use_the_meta_api_across_two_nodes(pair: Cluster) -> None:
    """No --auth (Crossbar's default): an anonymous session on node 1 counts, lists and looks up node 2's sessions,
    subscribers and callees."""
    a, b = await connect(pair[0].wamp_url), await connect(pair[1].wamp_url)
    try:
        sub = await b.subscribe(lambda *args: None, "com.example.open")
        reg = await b.register(lambda: None, "com.example.open.proc")
        await until(lambda: pair[0].stats()["wamp"]["dealer"]["remote_registrations"] == 1, "node 1 knows it")
        assert await a.call("wamp.session.count") == 2
        assert sorted(await a.call("wamp.session.list")) == sorted([a._session_id, b._session_id])
        assert (await a.call("wamp.session.get", b._session_id))["authrole"] == "anonymous"
        assert await a.call("wamp.subscription.lookup", "com.example.open") == sub.id
        assert await a.call("wamp.subscription.list_subscribers", sub.id) == [b._session_id]
        assert await a.call("wamp.registration.list_callees", reg.id) == [b._session_id]
    finally:
        await leave(a, b)


@pytest_twisted.ensureDeferred
async def test_a_peer_that_refuses_is_named_in_meta_incomplete(tmp_path: Any) -> None:
    """A node whose one peer refuses connections (never linked): wamp.session.count and wamp.session.list end
    with ERROR meta_incomplete naming the peer's URL (without waiting out the meta timeout), never with this
    node's sessions alone."""
    node = NodeProcess("lonely", tmp_path, extra=("--wamp-meta-timeout", "60"))
    down = f"ws://127.0.0.1:{free_port()}/psc"  # nothing listens there
    node.peers = [down]
    node.start()
    a = await connect(node.wamp_url)
    try:
        for procedure in ("wamp.session.count", "wamp.session.list"):
            error = await call_error(a, procedure)
            assert error.error == "pubsubclub.error.meta_incomplete"
            assert error.kwargs == {"nodes": [down]} and "not linked yet" in error.args[0]
    finally:
        await leave(a)
        node.stop()
