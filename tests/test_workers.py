"""A node with ``--workers 2``: one node to the cluster, clients on both workers, restarts and stops.

One node for messages, RPC (registrations, calls, shared registrations, a dying worker's calls), retained
events, the meta API and gap reports: the primary relays them (federation/relay.py, rpc.py, retained.py).

Real processes: a 2-worker node ``wk`` and a plain node ``other`` linked to it,
Autobahn-Python sessions on both. Which worker a session landed on is read
from the node's /stats (``workers``: each worker's WAMP sessions).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, RegisterOptions, SubscribeOptions
from helpers.nodes import REPO, NodeProcess, start_all
from helpers.polling import WAIT_SECONDS, until, wait_until
from helpers.prometheus import metric_value
from helpers.rawws import RECV_SECONDS, Wamp
from helpers.wampclient import Recorder, connect, leave, publish_acked, subscribe
from twisted.internet import defer, reactor, task
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow

TOPIC = "com.example.workers"
#: Most sessions opened to land one on a given worker (the kernel picks a worker per connection).
MAX_TRIES = 40


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    """``wk`` (2 workers) and ``other`` (1 process), each the other's peer."""
    tmp = tmp_path_factory.mktemp("workers")
    wk = NodeProcess("wk", tmp, extra=("--workers", "2", "--shutdown-timeout", "3"))
    other = NodeProcess("other", tmp)
    wk.peers = [other.psc_url]
    other.peers = [wk.psc_url]
    start_all([wk, other])  # start-ups overlap
    yield wk, other
    other.stop()
    wk.stop()


def rows(node: NodeProcess) -> list[dict[str, Any]]:
    """The node's workers as /stats lists them."""
    return list(node.stats()["workers"])


def sessions_by_worker(node: NodeProcess) -> list[int]:
    """WAMP sessions open on each worker (-1 for one that does not answer)."""
    return [row["wamp_sessions"] if row["state"] == "up" else -1 for row in rows(node)]


async def session_on(node: NodeProcess, index: int, extra: list[Any]) -> Any:
    """A session that landed on worker ``index``; sessions that landed elsewhere go to ``extra`` (still open)."""
    for _ in range(MAX_TRIES):
        before = sessions_by_worker(node)
        expected = sum(before) + 1
        session = await connect(node.wamp_url)
        await until(lambda n=expected: sum(sessions_by_worker(node)) == n, "the session counted")
        after = sessions_by_worker(node)
        if after[index] == before[index] + 1:
            return session
        extra.append(session)
    raise AssertionError(f"no session landed on worker {index} in {MAX_TRIES} tries")


def wants(node: NodeProcess, index: int, topic: str, peer: str) -> bool:
    """Whether worker ``index`` of ``node`` knows that ``peer`` wants ``topic`` from it."""
    row = rows(node)[index]
    return row["state"] == "up" and peer in (row["remote_interest"] or {}).get(topic, [])


@pytest_twisted.ensureDeferred
async def test_each_worker_gets_other_nodes_and_other_workers_messages_once(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """A client on each worker gets a message published on another node, and one from the other worker, once."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    topic = f"{TOPIC}.once"
    rec0, _ = await subscribe(s0, topic)
    rec1, _ = await subscribe(s1, topic)
    rec_remote, _ = await subscribe(remote, topic)
    # Each worker knows the others want the topic; other knows wk does, and wk (the primary) knows other does.
    await until(lambda: wants(wk, 1, topic, "wk"), "worker 1 to learn the primary's interest")
    await until(lambda: "wk.w1" in wk.stats()["remote_interest"].get(topic, []), "the primary: worker 1's interest")
    await until(lambda: "wk" in other.stats()["remote_interest"].get(topic, []), "other: wk's interest")
    await until(lambda: "other" in wk.stats()["remote_interest"].get(topic, []), "wk: other's interest")
    for i in range(5):
        await publish_acked(remote, topic, "remote", i)
    await publish_acked(remote, topic, "remote", "end")
    for i in range(5):
        await publish_acked(s1, topic, "w1", i)
    await publish_acked(s1, topic, "w1", "end")
    for i in range(5):
        await publish_acked(s0, topic, "w0", i)
    await publish_acked(s0, topic, "w0", "end")

    def got(rec: Any, origin: str) -> list[Any]:
        return [args[1] for args, _ in rec.events if args[0] == origin]

    expected = [0, 1, 2, 3, 4, "end"]
    await rec0.wait_until(lambda r: "end" in got(r, "remote") and "end" in got(r, "w1"))
    await rec1.wait_until(lambda r: "end" in got(r, "remote") and "end" in got(r, "w0"))
    await rec_remote.wait_until(lambda r: "end" in got(r, "w1") and "end" in got(r, "w0"))
    # FIFO per (origin, topic): a duplicate would have come before "end".
    assert got(rec0, "remote") == expected and got(rec0, "w1") == expected and got(rec0, "w0") == []
    assert got(rec1, "remote") == expected and got(rec1, "w0") == expected and got(rec1, "w1") == []
    assert got(rec_remote, "w0") == expected and got(rec_remote, "w1") == expected
    # To the other node wk is one node: one link each way, no worker URL learned.
    assert other.stats()["servers"] == [wk.psc_url]
    assert sorted(link["peer_node"] for link in other.stats()["links"] if link["state"] == "open") == ["wk", "wk"]
    await leave(s0, s1, remote, *extra)


def received_from(node: NodeProcess, peer: str) -> int:
    """Messages the node's primary received from ``peer`` (a worker or another node)."""
    return int(node.stats()["traffic"]["peers"].get(peer, {}).get("received", 0))


@pytest_twisted.ensureDeferred
async def test_a_topic_nobody_else_wants_stays_in_its_worker(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """Interest is as tight as between nodes: worker 1's publishes on a topic no other worker wants stay there."""
    wk, _ = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    marker = f"{TOPIC}.tight.marker"
    rec0, _ = await subscribe(s0, marker)
    await until(lambda: wants(wk, 1, marker, "wk"), "worker 1 to learn the primary's interest in the marker")
    before = received_from(wk, "wk.w1")
    for i in range(5):
        await publish_acked(s1, f"{TOPIC}.tight.unwanted", i)
    await publish_acked(s1, marker, "end")
    await rec0.wait_for(1)
    assert received_from(wk, "wk.w1") == before + 1  # the marker only
    await leave(s0, s1, *extra)


def wants_pattern(node: NodeProcess, index: int, prefix: str, peer: str) -> bool:
    """Whether worker ``index`` of ``node`` knows that ``peer`` holds the prefix pattern ``prefix``."""
    row = rows(node)[index]
    return row["state"] == "up" and peer in (row["remote_patterns"] or {}).get(f"prefix:{prefix}", [])


@pytest_twisted.ensureDeferred
async def test_prefix_subscriptions_span_workers_and_nodes(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """A prefix subscription on worker 1 and one on another node each get every matching message once."""
    wk, other = nodes
    prefix = f"{TOPIC}.p."
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    rec1, rec_remote = Recorder(), Recorder()
    await s1.subscribe(rec1, prefix, options=SubscribeOptions(match="prefix"))
    await remote.subscribe(rec_remote, prefix, options=SubscribeOptions(match="prefix"))
    await until(lambda: wants_pattern(wk, 0, prefix, "wk.w1"), "the primary: worker 1's pattern")
    await until(lambda: wants_pattern(wk, 0, prefix, "other"), "the primary: other's pattern")
    await until(lambda: wants_pattern(wk, 1, prefix, "wk"), "worker 1: the primary's pattern")
    await until(lambda: "wk" in other.stats()["remote_patterns"].get(f"prefix:{prefix}", []), "other: wk's pattern")
    await publish_acked(remote, f"{prefix}a", "remote")
    await publish_acked(s0, f"{prefix}b", "w0")
    await publish_acked(s1, f"{prefix}c", "w1")
    await publish_acked(remote, f"{prefix}a", "end")
    await publish_acked(s0, f"{prefix}b", "end")
    await publish_acked(s1, f"{prefix}c", "end")
    await rec1.wait_until(lambda r: r.args.count("end") == 2)
    await rec_remote.wait_until(lambda r: r.args.count("end") == 2)
    assert sorted(rec1.args) == sorted(["remote", "w0", "end", "end"])
    assert sorted(rec_remote.args) == sorted(["w0", "w1", "end", "end"])
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_stats_sum_the_workers(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """/stats counts the node as a whole (hub counters, WAMP sessions summed); /metrics labels each worker's."""
    wk, _ = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    await publish_acked(s0, f"{TOPIC}.sum", 1)
    await publish_acked(s1, f"{TOPIC}.sum", 2)
    stats = wk.stats()
    workers = stats["workers"]
    assert [row["index"] for row in workers] == [0, 1] and all(row["state"] == "up" for row in workers)
    assert workers[0]["hub"]["published"] >= 1 and workers[1]["hub"]["published"] >= 1
    assert stats["hub"]["published"] == sum(row["hub"]["published"] for row in workers)
    assert stats["wamp"]["sessions"] == sum(row["wamp_sessions"] for row in workers) == 2 + len(extra)
    assert wk.health()[1]["workers"] == {"count": 2, "linked": 2}
    # The collector: each worker's own figures in its row, the node's counts added, its longest the maximum.
    collectors = [row["gc"] for row in workers]
    assert all(gc["frozen"] > 0 for gc in collectors)
    assert stats["gc"]["frozen"] == sum(gc["frozen"] for gc in collectors)
    assert stats["gc"]["max_full_ms"] == max(gc["max_full_ms"] for gc in collectors)
    # /metrics: every worker's series, labelled by worker.
    text = wk.metrics()
    published = [metric_value(text, "pubsubclub_events_total", event="published", worker=w) for w in ("0", "1")]
    assert published[0] >= 1 and published[1] >= 1
    await leave(s0, s1, *extra)


def linked_both_ways(node: NodeProcess, peer: str) -> bool:
    """Whether ``node`` (its primary) has an open link to ``peer`` in each role."""
    links = node.stats()["links"]
    roles = sorted(link["role"] for link in links if link["peer_node"] == peer and link["state"] == "open")
    return roles == ["consumer", "producer"]


async def call_soon(session: Any, procedure: str, *args: Any) -> Any:
    """The result of calling ``procedure``, called again while its registration has not reached the caller (bounded)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            return await session.call(procedure, *args)
        except ApplicationError as e:
            if e.error != "wamp.error.no_such_procedure" or time.monotonic() > deadline:
                raise
        await task.deferLater(reactor, 0.02, lambda: None)


async def call_error(session: Any, procedure: str, *args: Any) -> ApplicationError:
    """The ApplicationError a call ends with (fails if it returns)."""
    with pytest.raises(ApplicationError) as raised:
        await session.call(procedure, *args)
    return raised.value


@pytest_twisted.ensureDeferred
async def test_callee_on_worker_1_is_called_from_the_other_node_and_from_worker_0(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """A procedure registered on worker 1 answers callers on another node and on worker 0, errors included,
    and is one single registration cluster-wide (procedure_already_exists on the other node)."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    procedure = f"{TOPIC}.rpc.on_w1"

    def on_w1(x: int) -> list[Any]:
        if x < 0:
            raise ApplicationError("com.example.negative", x, why="below zero")
        return ["w1", x]

    await s1.register(on_w1, procedure)
    assert await call_soon(remote, procedure, 1) == ["w1", 1]
    assert await call_soon(s0, procedure, 2) == ["w1", 2]
    error = await call_error(remote, procedure, -1)
    assert error.error == "com.example.negative" and error.args == (-1,) and error.kwargs == {"why": "below zero"}
    # The meta API on the other node names worker 1's session as the callee.
    reg_id = await remote.call("wamp.registration.lookup", procedure)
    assert await remote.call("wamp.registration.list_callees", reg_id) == [s1.details.session]
    assert await remote.call("wamp.registration.count_callees", reg_id) == 1
    refused = Recorder()
    with pytest.raises(ApplicationError) as taken:
        await remote.register(refused, procedure)
    assert taken.value.error == "wamp.error.procedure_already_exists"
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_caller_on_worker_1_calls_a_callee_on_the_other_node(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """A client of worker 1 calls a procedure registered on another node, and one registered on worker 0."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    await remote.register(lambda x: ["other", x], f"{TOPIC}.rpc.on_other")
    await s0.register(lambda x: ["w0", x], f"{TOPIC}.rpc.on_w0")
    assert await call_soon(s1, f"{TOPIC}.rpc.on_other", 3) == ["other", 3]
    assert await call_soon(s1, f"{TOPIC}.rpc.on_w0", 4) == ["w0", 4]
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_roundrobin_registration_spreads_over_both_workers_and_the_other_node(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """One roundrobin procedure with a callee on each worker and on the other node: callers on the other
    node and on worker 1 reach each callee in turn."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    procedure = f"{TOPIC}.rpc.rr"
    shared = RegisterOptions(invoke="roundrobin")
    for name, session in (("w0", s0), ("w1", s1), ("other", remote)):
        await session.register(lambda name=name: name, procedure, options=shared)
    for caller in (remote, s1):
        seen: set[str] = set()
        deadline = time.monotonic() + WAIT_SECONDS
        while seen != {"w0", "w1", "other"}:  # until the caller's node knows all three callees (bounded)
            assert time.monotonic() < deadline, f"only {sorted(seen)} reached"
            seen.add(await call_soon(caller, procedure))
        got = [await caller.call(procedure) for _ in range(6)]
        assert sorted(got) == ["other", "other", "w0", "w0", "w1", "w1"] and got[:3] == got[3:]
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_retained_event_of_worker_1_reaches_the_other_node_and_worker_0(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """A retained publish on worker 1 is given to get_retained subscribers on the other node and on worker 0,
    and one on the other node to those on worker 1."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    # Worker links speak 0.8 (retained events) as links between nodes do.
    assert {link["version"] for link in wk.stats()["links"] if link["peer_node"] == "wk.w1"} == {"0.8"}
    retain = PublishOptions(acknowledge=True, retain=True)
    await s1.publish(f"{TOPIC}.ret.w1", "from w1", options=retain)
    await remote.publish(f"{TOPIC}.ret.other", "from other", options=retain)

    async def retained(session: Any, topic: str) -> list[Any]:
        """What a new get_retained subscription to ``topic`` gets, asked again until it gets something (bounded)."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            rec = Recorder()
            sub = await session.subscribe(rec, topic, options=SubscribeOptions(get_retained=True))
            await session.publish(topic, "marker", options=PublishOptions(acknowledge=True, exclude_me=False))
            await rec.wait_until(lambda r: "marker" in r.args)
            await sub.unsubscribe()
            got = rec.args[: rec.args.index("marker")]
            if got or time.monotonic() > deadline:
                return got
            await task.deferLater(reactor, 0.05, lambda: None)

    assert await retained(remote, f"{TOPIC}.ret.w1") == ["from w1"]
    assert await retained(s0, f"{TOPIC}.ret.w1") == ["from w1"]
    assert await retained(s1, f"{TOPIC}.ret.other") == ["from other"]
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_session_count_from_the_other_node_counts_both_workers_sessions(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """wamp.session.count asked on the other node or on worker 1 counts every session of both workers once;
    wamp.session.list/get and wamp.subscription.lookup/count_subscribers find worker 1's from the other node."""
    wk, other = nodes
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    # The meta API asks the nodes it is linked to as consumer: wait for wk's link to other (dialled at start).
    await until(lambda: linked_both_ways(wk, "other"), "wk linked to other both ways")
    expected = sum(sessions_by_worker(wk)) + int(other.stats()["wamp"]["sessions"])
    assert sessions_by_worker(wk)[1] >= 1
    assert await remote.call("wamp.session.count") == expected
    assert await s1.call("wamp.session.count") == expected
    assert await s0.call("wamp.session.count") == expected
    listed = await remote.call("wamp.session.list")
    assert len(listed) == expected and s1.details.session in listed and s0.details.session in listed
    details = await remote.call("wamp.session.get", s1.details.session)
    assert details["node"] == "wk.w1"
    # A subscription on worker 1 only: the other node finds it and counts its subscriber.
    topic = f"{TOPIC}.meta.only_w1"
    await subscribe(s1, topic)
    sub_id = await remote.call("wamp.subscription.lookup", topic)
    assert sub_id is not None and await remote.call("wamp.subscription.count_subscribers", sub_id) == 1
    assert await remote.call("wamp.subscription.list_subscribers", sub_id) == [s1.details.session]
    await leave(s0, s1, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_meta_events_of_each_worker_reach_the_other_node_and_the_other_worker(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """wamp.session.on_join of a session on worker 1 reaches a subscriber on the other node; one of a session
    on the other node reaches a subscriber on worker 1."""
    wk, other = nodes
    extra: list[Any] = []
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    on_join = "wamp.session.on_join"
    rec_remote, _ = await subscribe(remote, on_join)
    rec1, _ = await subscribe(s1, on_join)
    hub_topic = f"$meta.realm1#{on_join}"
    await until(lambda: wants(wk, 1, hub_topic, "wk"), "worker 1 to learn the other node's interest in on_join")
    await until(lambda: "wk" in other.stats()["remote_interest"].get(hub_topic, []), "other: worker 1's interest")
    joined = await session_on(wk, 1, extra)
    newcomer = await connect(other.wamp_url)

    def joins(rec: Recorder) -> list[int]:
        return [args[0]["session"] for args, _ in rec.events]

    await rec_remote.wait_until(lambda r: joined.details.session in joins(r))
    await rec1.wait_until(lambda r: newcomer.details.session in joins(r))
    assert joins(rec_remote).count(joined.details.session) == 1
    await leave(s1, remote, joined, newcomer, *extra)


@pytest_twisted.ensureDeferred
async def test_worker_1_asks_the_primary_for_gap_reports_and_no_node_is_asked(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """A gap subscriber on worker 1 makes it ask the primary for the primary's gap reports (which the primary
    forwards to workers only); the other node is never asked for them."""
    wk, other = nodes
    extra: list[Any] = []
    s1 = await session_on(wk, 1, extra)
    await subscribe(s1, "wamp.pubsubclub.gap")
    await until(lambda: "wk.w1" in wk.stats()["remote_interest"].get("$cluster.gap", []), "the primary: w1 asks")
    marker = f"{TOPIC}.gap.marker"
    await subscribe(s1, marker)
    await until(lambda: "wk" in other.stats()["remote_interest"].get(marker, []), "other: wk's later interest")
    assert "$cluster.gap" not in other.stats()["remote_interest"]
    await leave(s1, *extra)


@pytest_twisted.ensureDeferred
async def test_killed_worker_is_restarted_and_its_clients_come_back_without_duplicates(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """kill -9 of worker 1: it is restarted, its clients reconnect, and the others get each message once;
    a call from another node in flight to a callee of worker 1 ends with ERROR node_unreachable."""
    wk, other = nodes
    topic = f"{TOPIC}.restart"
    extra: list[Any] = []
    s0 = await session_on(wk, 0, extra)
    s1 = await session_on(wk, 1, extra)
    remote = await connect(other.wamp_url)
    rec0, _ = await subscribe(s0, topic)
    rec_remote, _ = await subscribe(remote, topic)
    invoked: list[int] = []

    def hang() -> defer.Deferred[None]:
        invoked.append(1)
        return defer.Deferred()

    await s1.register(hang, f"{TOPIC}.rpc.hang")
    deadline = time.monotonic() + WAIT_SECONDS
    pending = remote.call(f"{TOPIC}.rpc.hang")
    while not invoked:  # until the callee has the call (its registration may still be on its way)
        assert time.monotonic() < deadline, "the call never reached worker 1"
        if pending.called:
            pending.addErrback(lambda _: None)
            pending = remote.call(f"{TOPIC}.rpc.hang")
        await task.deferLater(reactor, 0.02, lambda: None)
    old_pid = rows(wk)[1]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    with pytest.raises(ApplicationError) as lost:
        await pending
    assert lost.value.error == "pubsubclub.error.node_unreachable"
    await until(lambda: rows(wk)[1].get("pid") not in (None, old_pid), "worker 1 restarted", timeout=WAIT_SECONDS)
    assert wk.proc is not None and wk.proc.poll() is None  # the node itself lives on
    await until(lambda: not s1.is_attached(), "worker 1's old client to see its connection end")
    back = await session_on(wk, 1, extra)
    await until(lambda: wants(wk, 1, topic, "wk"), "the new worker 1 to learn the primary's interest")
    await until(lambda: "wk" in other.stats()["remote_interest"].get(topic, []), "other: wk's interest")
    for i in range(3):
        await publish_acked(back, topic, "w1", i)
    await publish_acked(back, topic, "w1", "end")
    await publish_acked(remote, topic, "remote", "end")

    def got(rec: Any, origin: str) -> list[Any]:
        return [args[1] for args, _ in rec.events if args[0] == origin]

    await rec0.wait_until(lambda r: "end" in got(r, "w1") and "end" in got(r, "remote"))
    await rec_remote.wait_until(lambda r: "end" in got(r, "w1"))
    assert got(rec0, "w1") == [0, 1, 2, "end"] and got(rec0, "remote") == ["end"]
    assert got(rec_remote, "w1") == [0, 1, 2, "end"]
    await leave(s0, back, remote, *extra)


def answers(predicate: Any) -> Any:
    """``predicate``, false while the node's ops listener does not answer (its primary is restarting)."""

    def check() -> bool:
        try:
            return bool(predicate())
        except OSError:
            return False

    return check


@pytest_twisted.ensureDeferred
async def test_killed_primary_is_restarted_and_the_other_worker_reaches_the_cluster_again(
    nodes: tuple[NodeProcess, NodeProcess],
) -> None:
    """kill -9 of the primary (worker 0): it is restarted; a client of worker 1 that stayed trades messages once,
    and its registration is callable from the other node again."""
    wk, other = nodes
    topic = f"{TOPIC}.primary"
    extra: list[Any] = []
    s1 = await session_on(wk, 1, extra)
    await s1.register(lambda: "w1", f"{TOPIC}.rpc.survives")
    old_pid = rows(wk)[0]["pid"]
    os.kill(old_pid, signal.SIGKILL)
    await until(answers(lambda: rows(wk)[0].get("pid") not in (None, old_pid)), "worker 0 restarted")
    await until(answers(lambda: wk.health()[1]["workers"]["linked"] == 2), "worker 1 linked to the new primary")
    assert s1.is_attached()  # worker 1 and its clients lived on
    rec1, _ = await subscribe(s1, topic)
    remote = await connect(other.wamp_url)
    rec_remote, _ = await subscribe(remote, topic)
    await until(answers(lambda: wants(wk, 1, topic, "wk")), "worker 1: the primary's interest")
    await until(answers(lambda: "wk" in other.stats()["remote_interest"].get(topic, [])), "other: wk's interest")
    await until(answers(lambda: "other" in wk.stats()["remote_interest"].get(topic, [])), "wk: other's interest")
    await publish_acked(remote, topic, "remote")
    await publish_acked(remote, topic, "end")
    await publish_acked(s1, topic, "w1")
    await publish_acked(s1, topic, "end")
    await rec1.wait_until(lambda r: "end" in r.args)
    await rec_remote.wait_until(lambda r: "end" in r.args)
    assert rec1.args == ["remote", "end"] and rec_remote.args == ["w1", "end"]  # a duplicate would precede "end"
    # Worker 1's registration came back with the new primary, which announces it to the other node again.
    assert await call_soon(remote, f"{TOPIC}.rpc.survives") == "w1"
    await leave(s1, remote, *extra)


@pytest.fixture(scope="module")
def wk3(nodes: tuple[NodeProcess, NodeProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """``wk3`` (3 workers), a consumer of ``other`` (it dials other; other does not dial it)."""
    _, other = nodes
    node = NodeProcess("wk3", tmp_path_factory.mktemp("workers3"), extra=("--workers", "3", "--shutdown-timeout", "3"))
    node.peers = [other.psc_url]
    node.start()
    yield node
    node.stop()


async def one_on_each(node: NodeProcess, count: int, extra: list[Any]) -> list[Any]:
    """A session on each of ``node``'s ``count`` workers, in worker order."""
    return [await session_on(node, index, extra) for index in range(count)]


@pytest_twisted.ensureDeferred
async def test_three_workers_each_get_every_other_workers_and_the_other_nodes_messages_once_in_order(
    nodes: tuple[NodeProcess, NodeProcess], wk3: NodeProcess
) -> None:
    """3 workers: a client on each gets the messages of a client on each other worker (relayed worker to worker
    through the primary) and of one on another node, each once and in publish order."""
    _, other = nodes
    extra: list[Any] = []
    sessions = await one_on_each(wk3, 3, extra)
    remote = await connect(other.wamp_url)
    topic = f"{TOPIC}.three"
    recs = [(await subscribe(s, topic))[0] for s in sessions]
    names = ["w0", "w1", "w2"]
    for index in (1, 2):
        await until(lambda i=index: wants(wk3, i, topic, "wk3"), f"worker {index}: the primary's interest")
        peer = f"wk3.w{index}"
        await until(lambda p=peer: p in wk3.stats()["remote_interest"].get(topic, []), f"the primary: {peer}'s")
    await until(lambda: "wk3" in other.stats()["remote_interest"].get(topic, []), "other: wk3's interest")
    expected = [0, 1, 2, 3, 4, "end"]
    for name, session in [*zip(names, sessions, strict=True), ("remote", remote)]:
        for i in expected:
            await publish_acked(session, topic, name, i)

    def got(rec: Any, origin: str) -> list[Any]:
        return [args[1] for args, _ in rec.events if args[0] == origin]

    for me, rec in zip(names, recs, strict=True):
        others = [name for name in [*names, "remote"] if name != me]
        await rec.wait_until(lambda r, o=others: all("end" in got(r, name) for name in o))
        # FIFO per publisher, and a duplicate would have come before "end"; nothing of its own (exclude_me).
        assert {name: got(rec, name) for name in [*names, "remote"]} == {
            **{name: expected for name in others},
            me: [],
        }
    await leave(*sessions, remote, *extra)


@pytest_twisted.ensureDeferred
async def test_three_workers_a_topic_one_worker_wants_reaches_no_other_worker(
    nodes: tuple[NodeProcess, NodeProcess], wk3: NodeProcess
) -> None:
    """3 workers: messages on a topic only worker 2 wants, published on the primary, on worker 2 and on another
    node, never reach worker 1, and worker 2's own stay in worker 2 (counted by /stats, proved by a marker)."""
    _, other = nodes
    extra: list[Any] = []
    s0, s1, s2 = await one_on_each(wk3, 3, extra)
    remote = await connect(other.wamp_url)
    only, marker = f"{TOPIC}.three.only_w2", f"{TOPIC}.three.marker"
    rec2, _ = await subscribe(s2, only)
    rec1, _ = await subscribe(s1, marker)
    await until(lambda: "wk3.w2" in wk3.stats()["remote_interest"].get(only, []), "the primary: worker 2's interest")
    await until(lambda: "wk3" in other.stats()["remote_interest"].get(only, []), "other: wk3's interest")
    await until(lambda: wants(wk3, 2, marker, "wk3"), "worker 2: the primary's interest in the marker")
    await until(lambda: "wk3" in other.stats()["remote_interest"].get(marker, []), "other: wk3's marker interest")
    received_before = [row["hub"]["received"] for row in rows(wk3)]
    from_w2_before = received_from(wk3, "wk3.w2")
    for name, session in (("w0", s0), ("w2", s2), ("remote", remote)):
        for i in range(3):
            await publish_acked(session, only, name, i)
    for session in (s0, s2, remote):
        await publish_acked(session, marker, "end")
    await rec1.wait_for(3)
    await rec2.wait_until(lambda r: len(r.events) == 6)  # w0's and remote's, not its own (exclude_me)
    received = [row["hub"]["received"] for row in rows(wk3)]
    assert received[1] - received_before[1] == 3  # the three markers only
    assert received[2] - received_before[2] == 6  # w0's and remote's messages on the topic, relayed by the primary
    assert received_from(wk3, "wk3.w2") - from_w2_before == 1  # worker 2's marker; its own messages stayed there
    await leave(s0, s1, s2, remote, *extra)


def test_tcp_peer_calling_itself_a_worker_is_refused(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """A peer that names itself wk.w1 over TCP is closed (4508) and the real worker 1 stays linked."""
    wk, _ = nodes
    ws = ws_connect(
        wk.psc_url, subprotocols=["pubsubclub"], open_timeout=5, close_timeout=2, legacy=True,
        additional_headers={"x-pubsubclub-node": "wk.w1"},
    )  # fmt: skip
    try:
        ws.send(json.dumps([101, [0, 1]]))
        assert json.loads(ws.recv(timeout=RECV_SECONDS)) == [102, [0, 1]]
        with pytest.raises(ConnectionClosed) as closed:  # closed at once, before its first PSC201
            ws.recv(timeout=RECV_SECONDS)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4508
    finally:
        ws.close()
    assert wk.health()[1]["workers"] == {"count": 2, "linked": 2}
    worker_links = sorted(link["peer"] for link in wk.stats()["links"] if link["peer_node"] == "wk.w1")
    assert worker_links == ["unix", "ws://w1.workers.invalid:2/psc"]


def test_listener_in_use_stops_the_start_with_an_error(tmp_path: Any) -> None:
    """A client port already taken: the supervisor exits 2, naming the flag, and starts no worker."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "pubsubclub", "node", "--workers", "2", "--wamp", f"tcp:{port}:interface=127.0.0.1",
             "--psc", "tcp:0:interface=127.0.0.1"],
            cwd=REPO, capture_output=True, text=True, timeout=WAIT_SECONDS,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"--wamp tcp:{port}:interface=127.0.0.1: cannot listen" in result.stderr
    assert "supervising" not in result.stderr


#: The capped node's --edge-max-connections and --edge-max-per-address (node-wide; split 2+2 and 3+2).
CAPPED_CONNECTIONS, CAPPED_PER_ADDRESS = 4, 5
#: Connections tried against it: enough that each worker gets more than its share (hashing spreads them).
CAPPED_TRIES = 16


def wamp_hello(node: NodeProcess) -> Wamp | None:
    """A WAMP WebSocket session joined to realm1 on a bare socket; None if the node refused the connection.

    A refused upgrade may end in a reset before its 503 is read (the node closes with the request unread).
    """
    try:
        return Wamp(node)
    except (AssertionError, OSError):
        return None


def test_connection_caps_are_the_nodes_not_each_workers(tmp_path: Any) -> None:
    """A 2-worker node with --edge-max-connections 4 accepts 4 WAMP sessions in all (2 per worker), never 8;
    the others get the usual 503 "too many connections", counted; /stats shows each worker's share."""
    node = NodeProcess("capped", tmp_path, extra=(
        "--workers", "2", "--shutdown-timeout", "3",
        "--edge-max-connections", str(CAPPED_CONNECTIONS), "--edge-max-per-address", str(CAPPED_PER_ADDRESS),
    ))  # fmt: skip
    node.start()
    answers: list[Wamp | None] = []
    try:
        answers = [wamp_hello(node) for _ in range(CAPPED_TRIES)]
        refused = answers.count(None)
        assert CAPPED_TRIES - refused == CAPPED_CONNECTIONS
        # Both workers are full: one more connection (whichever worker it reaches) reads the usual refusal.
        with socket.create_connection(("127.0.0.1", node.wamp_port), timeout=RECV_SECONDS) as extra:
            answer = b""
            while chunk := extra.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 ") and b"too many connections" in answer, answer[:120]
        stats = node.stats()
        assert stats["wamp"]["sessions"] == CAPPED_CONNECTIONS
        assert [row["edge_caps"] for row in stats["workers"]] == [
            {"max_connections": 2, "max_per_address": 3},
            {"max_connections": 2, "max_per_address": 2},
        ]
        count = node.metric("pubsubclub_refused_connections_total", listener="wamp", reason="listener_cap")
        assert count == refused + 1
    finally:
        for session in answers:
            if session is not None:
                session.close()
        node.stop()


def test_a_cap_below_the_worker_count_stops_the_start_with_an_error(tmp_path: Any) -> None:
    """--edge-max-connections 1 with --workers 2: the supervisor exits 2, naming the flag (a share of 0 is off)."""
    result = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "node", "--workers", "2", "--wamp", "tcp:0:interface=127.0.0.1",
         "--psc", "tcp:0:interface=127.0.0.1", "--edge-max-connections", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=WAIT_SECONDS,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--edge-max-connections 1 is below --workers 2" in result.stderr
    assert "supervising" not in result.stderr


def test_sigterm_stops_every_worker(nodes: tuple[NodeProcess, NodeProcess]) -> None:
    """SIGTERM to the node stops every worker within the shutdown bound; no process is left (runs last)."""
    wk, _ = nodes
    pids = [row["pid"] for row in rows(wk)]
    assert len(pids) == 2 and all(pids)
    assert wk.stop() == 0

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(lambda: all(gone(pid) for pid in pids), "every worker gone")
