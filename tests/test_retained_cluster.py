"""Retained events across real node processes (issue 20, point 5), with Autobahn-Python sessions.

Three nodes share one module (a fourth starts later in one test). A retained
event is asked for by a SUBSCRIBE with ``get_retained``; what a subscriber
got is read once a marker arrives: the subscriber itself publishes the marker
(acknowledged, ``exclude_me=False``) after SUBSCRIBED, and the node sends the
retained events right after SUBSCRIBED, so they come before it on the same
connection. The cap test runs last: it fills the cluster's table.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import PublishOptions, SubscribeOptions
from helpers.nodes import REPO, Cluster, NodeProcess, assert_clean_log, start_cluster
from helpers.polling import until
from helpers.wampclient import Recorder, connect, leave

pytestmark = pytest.mark.slow

#: Topics the module's cluster may retain (small, so the cap test is quick).
CAP = 12
MARKER = "marker"
WAMP_CLIENT_JS = REPO / "tests" / "js" / "wamp_client.js"
_markers = itertools.count()


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three linked nodes retaining at most CAP topics each, naming every publisher in its EVENTs."""
    extra = ("--wamp-max-retained-topics", str(CAP), "--wamp-disclose-publisher", "always")
    cluster = start_cluster(tmp_path_factory.mktemp("retained"), 3, extra=extra)
    cluster.wait_linked()
    yield cluster
    for node in cluster.nodes:
        assert_clean_log(node)
        node.stop()


def retained_topics(node: NodeProcess) -> int:
    """Topics with a retained event in ``node``'s table."""
    return int(node.stats()["wamp"]["retained"]["topics"])


async def everywhere(cluster: Cluster, n: int) -> None:
    """Until every node holds at least ``n`` retained topics."""
    await until(lambda: all(retained_topics(node) >= n for node in cluster.nodes), f"{n} retained topics everywhere")


async def retained(
    node: NodeProcess, topic: str, match: str | None = None, session: Any = None, get_retained: bool = True
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The EVENTs a new subscription to ``topic`` on ``node`` gets before its marker: (args, kwargs and details)."""
    own = session is None
    if own:
        session = await connect(node.wamp_url)
    rec = Recorder()
    options = SubscribeOptions(match=match, get_retained=get_retained, details=True)
    sub = await session.subscribe(rec, topic, options=options)
    marker_topic = topic if match is None else topic.rstrip(".") + f".marker{next(_markers)}"
    await session.publish(marker_topic, MARKER, options=PublishOptions(acknowledge=True, exclude_me=False))
    await rec.wait_until(lambda r: MARKER in r.args)
    await sub.unsubscribe()
    if own:
        await leave(session)
    return [(args, kwargs) for args, kwargs in rec.events[: rec.args.index(MARKER)]]


async def retained_soon(node: NodeProcess, topic: str, session: Any = None) -> list[Any]:
    """:func:`retained`, asked again until ``node`` has a retained event for ``topic`` (bounded)."""
    got: list[Any] = []
    for _ in range(200):  # each round is one subscription: well under the polling bound in all
        got = await retained(node, topic, session=session)
        if got:
            break
    return got


async def retain(node: NodeProcess, topic: str, *args: Any, serializer: str = "json", **options: Any) -> int:
    """Publish ``args`` on ``topic`` from a session on ``node`` with ``retain=True`` (acknowledged); its session id."""
    session = await connect(node.wamp_url, serializer=serializer)
    await session.publish(topic, *args, options=PublishOptions(acknowledge=True, retain=True, **options))
    await leave(session)
    return int(session.details.session)


@pytest_twisted.ensureDeferred
async def test_retained_on_one_node_reaches_later_subscribers_on_the_others(trio: Cluster) -> None:
    """Retained on node 1 with no subscriber anywhere: node 2 (exact) and node 3 (prefix) get it with
    details.retained; without get_retained nothing; WELCOME announces event_retention."""
    session = await connect(trio[0].wamp_url)
    assert session._router_roles["broker"].event_retention is True
    await session.publish("ret.one", 1, "x", k=True, options=PublishOptions(acknowledge=True, retain=True))
    await everywhere(trio, 1)
    [(args, kwargs)] = await retained(trio[1], "ret.one")
    details = kwargs.pop("details")
    assert args == (1, "x") and kwargs == {"k": True} and details.retained is True
    [(args, kwargs)] = await retained(trio[2], "ret.", match="prefix")
    assert args == (1, "x") and kwargs["details"].topic == "ret.one" and kwargs["details"].retained is True
    assert await retained(trio[1], "ret.one", get_retained=False) == []
    assert await retained(trio[2], "ret.none") == []
    await leave(session)


def test_an_autobahn_js_subscriber_gets_the_retained_event(trio: Cluster) -> None:
    """An autobahn-js client on node 3 subscribing with get_retained gets the event retained on node 1."""
    js = subprocess.run(
        [shutil.which("node") or "node", str(WAMP_CLIENT_JS), "--url", trio[2].wamp_url, "subscribe",
         "--topic", "ret.one", "--count", "1", "--get-retained", "1", "--timeout", "20"],
        capture_output=True, text=True, timeout=30, cwd=REPO,
    )  # fmt: skip
    assert js.returncode == 0, js.stderr
    lines = [json.loads(line) for line in js.stdout.splitlines()]
    assert {"args": [1, "x"], "kwargs": {"k": True}, "retained": True} in lines


@pytest_twisted.ensureDeferred
async def test_binary_payload_crosses_serializers(trio: Cluster) -> None:
    """A MessagePack publisher's bytes, retained on node 1, reach JSON (node 3) and CBOR (node 2) subscribers as
    bytes."""
    await retain(trio[0], "retbin.x", b"\x00\xffraw", serializer="msgpack")
    [(args, _)] = await retained_soon(trio[2], "retbin.x")
    assert args == (b"\x00\xffraw",)
    cbor = await connect(trio[1].wamp_url, serializer="cbor")
    [(args, _)] = await retained_soon(trio[1], "retbin.x", session=cbor)
    assert args == (b"\x00\xffraw",)
    await leave(cbor)


@pytest_twisted.ensureDeferred
async def test_publish_options_apply_to_retained_delivery(trio: Cluster) -> None:
    """A retained event published with eligible=[one session on node 2] reaches only that session, naming
    its publisher (the nodes disclose every publisher)."""
    chosen, other = await connect(trio[1].wamp_url), await connect(trio[1].wamp_url)
    before = retained_topics(trio[1])
    publisher = await retain(trio[0], "retopt.x", "only you", eligible=[int(chosen.details.session)])
    await until(lambda: retained_topics(trio[1]) > before, "retained on node 2")
    [(args, kwargs)] = await retained(trio[1], "retopt.x", session=chosen)
    assert args == ("only you",) and kwargs["details"].retained is True
    assert kwargs["details"].publisher == publisher
    assert await retained(trio[1], "retopt.x", session=other) == []
    await leave(chosen, other)


@pytest_twisted.ensureDeferred
async def test_two_retainers_on_different_nodes_leave_one_winner_everywhere(trio: Cluster) -> None:
    """Nodes 1 and 2 retain the same topic at once: every node ends up giving the same one of the two."""
    s1, s2 = await connect(trio[0].wamp_url), await connect(trio[1].wamp_url)
    options = PublishOptions(acknowledge=True, retain=True)
    first = s1.publish("retrace.x", "from node1", options=options)
    second = s2.publish("retrace.x", "from node2", options=options)
    await first
    await second
    seen: list[set[Any]] = []
    for _ in range(100):  # bounded: each round is three subscriptions, well under a second
        values = {(await retained(node, "retrace.x"))[0][0][0] for node in trio.nodes}
        seen.append(values)
        if len(values) == 1:
            break
    assert len(seen[-1]) == 1 and seen[-1] <= {"from node1", "from node2"}, seen
    await leave(s1, s2)


@pytest_twisted.ensureDeferred
async def test_a_node_started_later_gets_the_running_clusters_retained_events(
    trio: Cluster, tmp_path: Path
) -> None:
    """A fourth node started after the retains gets each of them from the nodes it links to; restarted,
    it gets them again, its own retained event included."""
    await retain(trio[2], "retlate.x", "before node4")
    await everywhere(trio, retained_topics(trio[2]))
    late = NodeProcess("node4", tmp_path, extra=("--wamp-max-retained-topics", str(CAP)))
    late.peers = [node.psc_url for node in trio.nodes]
    late.start()
    try:
        await until(lambda: retained_topics(late) == retained_topics(trio[0]), "node4 has the cluster's table")
        [(args, _)] = await retained(late, "retlate.x")
        assert args == ("before node4",)
        [(args, _)] = await retained(late, "ret.one")
        assert args == (1, "x")
        await retain(late, "retlate.own", "from node4")
        await everywhere(trio, retained_topics(late))
        late.stop()
        late.start()
        await until(lambda: retained_topics(late) == retained_topics(trio[0]), "restarted node4 has the table")
        [(args, _)] = await retained(late, "retlate.own")
        assert args == ("from node4",)
        assert_clean_log(late)
    finally:
        late.stop()


@pytest_twisted.ensureDeferred
async def test_past_the_cap_a_retaining_publish_gets_an_error_on_every_node(trio: Cluster) -> None:
    """With CAP topics retained, a retain on a new topic gets ERROR too_many_retained (naming the limit) on
    node 1 and on node 3; replacing a retained topic still works."""
    session = await connect(trio[0].wamp_url)
    options = PublishOptions(acknowledge=True, retain=True)
    for i in range(CAP - retained_topics(trio[0])):
        await session.publish(f"retcap.t{i}", i, options=options)
    with pytest.raises(ApplicationError) as refused:
        await session.publish("retcap.one-more", 1, options=options)
    assert refused.value.error == "pubsubclub.error.too_many_retained"
    assert refused.value.kwargs == {"limit": "wamp.max-retained-topics", "max": CAP}
    await everywhere(trio, CAP)
    far = await connect(trio[2].wamp_url)
    with pytest.raises(ApplicationError) as refused:
        await far.publish("retcap.two-more", 1, options=options)
    assert refused.value.error == "pubsubclub.error.too_many_retained"
    await far.publish("retcap.t0", "replaced", options=options)
    for _ in range(200):  # bounded: until node 1 has the replacement (each round a subscription there)
        [(args, _)] = await retained(trio[0], "retcap.t0")
        if args == ("replaced",):
            break
    assert args == ("replaced",)
    await leave(session, far)
