"""Issue 20's "done means": one application spread over three nodes and a bridged Crossbar works as on one router.

A small shop: the order service's callee on node 3 (progressive results, a callee
ERROR, caller disclosure), a shared ``roundrobin`` stock service with callees on
node 1 and on Crossbar.io (reached through ``pubsubclub bridge``), clients on
node 2 (Autobahn-Python and one autobahn-js caller), events with
``eligible``/``exclude`` and ``disclose_me`` across nodes, prefix and wildcard
subscriptions, a retained status topic read by a late subscriber on another node,
``wamp.session.count``/``list`` seeing every node's sessions, and a second realm
on nodes 1 and 2 kept apart. The processes are shared by the module; each test
leaves its sessions. Absence is proven by a marker published after.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp import message
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, PublishOptions, RegisterOptions, SubscribeOptions
from helpers.bridgeproc import BridgeProcess
from helpers.nodes import Cluster, NodeProcess, assert_clean_log, start_all
from helpers.polling import WAIT_SECONDS, until
from helpers.wampclient import Recorder, connect, leave
from twisted.internet import reactor, threads
from twisted.internet.task import deferLater

from pubsubclub.testing.crossbar import CrossbarProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CALL_JS = REPO / "tests" / "js" / "one_router_call.js"
#: The second realm, served by nodes 1 and 2 only.
SHOP2 = "shop2"
_markers = itertools.count()


class Shop:
    """Three linked nodes, a Crossbar router and its bridge, linked with every node."""

    def __init__(self, nodes: list[NodeProcess], router: CrossbarProcess, bridge: BridgeProcess) -> None:
        self.n1, self.n2, self.n3 = nodes
        self.nodes = nodes
        self.router = router
        self.bridge = bridge

    async def router_client(self) -> Any:
        """An Autobahn session on Crossbar (role ``app``)."""
        return await connect(self.router.url, authid="client-1", ticket="ticket-of-client-1")


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory, crossbar_routers: list[CrossbarProcess]) -> Iterator[Shop]:
    """node1, node2 (discloses callers): realm1 and shop2; node3: realm1; Crossbar (the run's shared router) +
    bridge (realm1); all linked."""
    tmp = Path(tmp_path_factory.mktemp("one-router"))
    router = crossbar_routers[0]
    two_realms = ("--realm", "realm1", "--realm", SHOP2, "--plain-realm", "realm1")
    nodes = [
        NodeProcess("node1", tmp, extra=two_realms),
        # Autobahn-Python has no disclose_me call option: node 2 discloses its callers (decided on the caller's node).
        NodeProcess("node2", tmp, extra=(*two_realms, "--wamp-disclose-caller", "always")),
        NodeProcess("node3", tmp, extra=("--realm", "realm1")),
    ]
    bridge = BridgeProcess("bridge1", tmp, router, "bridge-1")
    members: list[NodeProcess] = [*nodes, bridge]
    for member in members:
        member.peers = [other.psc_url for other in members if other is not member]
    started: list[NodeProcess] = []
    try:
        started += members
        start_all(started)  # start-ups overlap
        Cluster(members).wait_linked()
        yield Shop(nodes, router, bridge)
        for node in nodes:
            assert_clean_log(node)
    finally:
        for member in started:
            member.stop()


class _DisclosingPublish(message.Publish):  # type: ignore[misc]
    """A PUBLISH with ``disclose_me: true`` (Autobahn-Python's PublishOptions has no such option)."""

    def marshal(self) -> list[Any]:
        raw: list[Any] = super().marshal()
        raw[2]["disclose_me"] = True
        return raw


async def all_see(publisher: Any, topic: str, recorders: list[Recorder]) -> None:
    """Publish markers on ``topic`` until every recorder got one (interest has crossed the cluster); bounded."""
    marker = f"warm-{next(_markers)}"
    for _ in range(100):
        await publisher.publish(topic, marker, options=PublishOptions(acknowledge=True))
        try:
            await until(lambda: all(marker in r.args for r in recorders), "markers everywhere", timeout=0.3)
            return
        except AssertionError:
            continue
    raise AssertionError(f"not every subscriber of {topic} got a marker")


async def meta_until(session: Any, check: Any, procedure: str, *args: Any) -> Any:
    """Call meta ``procedure`` every 20 ms until ``check(answer)`` holds (bounded); the answer."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        got = await session.call(procedure, *args)
        if check(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {procedure}{args} still answers {got!r}")
        await deferLater(reactor, 0.02, lambda: None)


async def registered_everywhere(sessions: list[Any], procedure: str) -> None:
    """Until ``wamp.registration.lookup`` finds ``procedure`` from each of ``sessions``' nodes."""
    for session in sessions:
        await meta_until(session, lambda got: got is not None, "wamp.registration.lookup", procedure)


@pytest_twisted.ensureDeferred
async def test_order_service_across_nodes_and_the_bridge(shop: Shop) -> None:
    """Node 2 callers (Python, autobahn-js) reach node 3's order callee (progress, ERROR, disclosed caller) and a
    roundrobin stock service shared by node 1 and a Crossbar callee."""
    await Cluster([*shop.nodes, shop.bridge]).linked()
    orders = await connect(shop.n3.wamp_url)
    stock_node = await connect(shop.n1.wamp_url)
    stock_router = await shop.router_client()
    client = await connect(shop.n2.wamp_url)
    try:
        callers: list[Any] = []

        async def place(item: str, qty: int, details: Any = None) -> Any:
            callers.append(details.caller)
            if item == "unobtainium":
                raise ApplicationError("shop.error.out_of_stock", "no stock", item, wanted=qty)
            for step in ("reserved", "packed"):
                details.progress(step, item=item)
            return {"order": f"{item}x{qty}"}

        reg = RegisterOptions(details_arg="details")
        await orders.register(place, "shop.order.place", options=reg)
        shared = RegisterOptions(invoke="roundrobin")
        await stock_node.register(lambda item: "node1", "shop.stock.check", options=shared)
        await stock_router.register(lambda item: "crossbar", "shop.stock.check", options=shared)
        await registered_everywhere([client], "shop.order.place")

        progress: list[Any] = []
        got = await client.call(
            "shop.order.place",
            "tea",
            2,
            options=CallOptions(on_progress=lambda *a, **kw: progress.append((a, kw))),
        )
        assert got == {"order": "teax2"}
        assert progress == [(("reserved",), {"item": "tea"}), (("packed",), {"item": "tea"})]
        assert callers == [client._session_id], "node 2 discloses its caller to node 3"

        with pytest.raises(ApplicationError) as err:
            await client.call("shop.order.place", "unobtainium", 5)
        assert (err.value.error, list(err.value.args), err.value.kwargs) == (
            "shop.error.out_of_stock",
            ["no stock", "unobtainium"],
            {"wanted": 5},
        )

        # The shared stock service: calls from node 2 are spread over node 1's callee and Crossbar's.
        await registered_everywhere([client], "shop.stock.check")
        reg_id = await client.call("wamp.registration.lookup", "shop.stock.check")
        # Until node 2 sees both callees: node 1's and the bridge's mirror of Crossbar's.
        await meta_until(client, lambda n: n == 2, "wamp.registration.count_callees", reg_id)
        seen = [await client.call("shop.stock.check", "tea") for _ in range(6)]
        assert {"node1", "crossbar"} <= set(seen), seen

        # One autobahn-js caller on node 2: progressive results and the callee's ERROR, as the Python caller.
        node = shutil.which("node") or "node"
        lines: list[list[dict[str, Any]]] = []
        for item in ("jam", "unobtainium"):
            run = await threads.deferToThread(
                subprocess.run,
                [
                    node,
                    str(CALL_JS),
                    "--url",
                    shop.n2.wamp_url,
                    "--procedure",
                    "shop.order.place",
                    "--args",
                    json.dumps([item, 1]),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert run.returncode == 0, run.stderr
            lines.append([json.loads(line) for line in run.stdout.splitlines()])
        assert lines[0] == [
            {"progress": ["reserved"]},
            {"progress": ["packed"]},
            {"result": {"args": [{"order": "jamx1"}], "kwargs": {}}},
        ], lines[0]
        assert lines[1] == [
            {"error": "shop.error.out_of_stock", "args": ["no stock", "unobtainium"], "kwargs": {"wanted": 1}}
        ], lines[1]
    finally:
        await leave(client, orders, stock_node, stock_router)


@pytest_twisted.ensureDeferred
async def test_events_with_lists_disclosure_and_patterns_across_nodes(shop: Shop) -> None:
    """A node 2 publisher's eligible/exclude lists pick subscribers on nodes 1 and 3, disclose_me names it there;
    prefix (node 2) and wildcard (node 3) subscriptions get node and Crossbar publications."""
    sub1 = await connect(shop.n1.wamp_url)
    sub3 = await connect(shop.n3.wamp_url)
    watcher2 = await connect(shop.n2.wamp_url)
    pub = await connect(shop.n2.wamp_url)
    on_router = await shop.router_client()
    try:
        opts = SubscribeOptions(details_arg="details")
        rec1, rec3, prefix, wildcard = Recorder(), Recorder(), Recorder(), Recorder()
        await sub1.subscribe(rec1, "shop.event.shipped", options=opts)
        await sub3.subscribe(rec3, "shop.event.shipped", options=opts)
        await watcher2.subscribe(prefix, "shop.event.", options=SubscribeOptions(match="prefix", details_arg="details"))
        wild = SubscribeOptions(match="wildcard", details_arg="details")
        await sub3.subscribe(wildcard, "shop..shipped", options=wild)
        await all_see(pub, "shop.event.shipped", [rec1, rec3, prefix, wildcard])
        await all_see(on_router, "shop.event.restocked", [prefix])

        s1, s3 = sub1._session_id, sub3._session_id
        # Whitelisted both, blacklisted node 3's, disclose_me (sent raw; acknowledged publishes after it keep the
        # order): only node 1's subscriber (of the exact ones) gets it, naming the publisher.
        pub._transport.send(
            _DisclosingPublish(
                pub._request_id_gen.next(), "shop.event.shipped", args=["order-1"], eligible=[s1, s3], exclude=[s3]
            )
        )
        # Whitelisted node 3's only: node 1's subscriber and the pattern subscribers get nothing.
        await pub.publish("shop.event.shipped", "order-2", options=PublishOptions(acknowledge=True, eligible=[s3]))
        # A Crossbar client's publication reaches the prefix subscriber on node 2 through the bridge.
        await on_router.publish("shop.event.restocked", "tea", options=PublishOptions(acknowledge=True))
        await pub.publish("shop.event.shipped", "end", options=PublishOptions(acknowledge=True))
        for rec in (rec1, rec3, wildcard):
            await rec.wait_until(lambda r: "end" in r.args)
        await prefix.wait_until(lambda r: "end" in r.args and "tea" in r.args)

        def real(rec: Recorder) -> list[Any]:
            return [a for a in rec.args if not str(a).startswith("warm-")]

        assert real(rec1) == ["order-1", "end"]
        assert real(rec3) == ["order-2", "end"]
        assert real(wildcard) == ["order-2", "end"], "the wildcard subscriber's session is node 3's (s3)"
        assert sorted(real(prefix)) == ["end", "tea"]
        details = rec1.events[rec1.args.index("order-1")][1]["details"]
        assert details.publisher == pub._session_id
        assert rec3.events[rec3.args.index("order-2")][1]["details"].publisher is None
        assert prefix.events[prefix.args.index("tea")][1]["details"].topic == "shop.event.restocked"
    finally:
        await leave(sub1, sub3, watcher2, pub, on_router)


@pytest_twisted.ensureDeferred
async def test_retained_status_reaches_a_late_subscriber_on_another_node(shop: Shop) -> None:
    """Status retained on node 1 with no subscriber anywhere: a later subscriber on node 3 gets it, retained."""
    pub = await connect(shop.n1.wamp_url)
    await pub.publish("shop.status", {"open": True}, options=PublishOptions(acknowledge=True, retain=True))
    await leave(pub)
    late = await connect(shop.n3.wamp_url)
    try:
        got: list[Any] = []
        for _ in range(100):  # bounded: until node 3 holds the replica (each round one subscription)
            rec = Recorder()
            sub = await late.subscribe(rec, "shop.status", options=SubscribeOptions(get_retained=True, details=True))
            marker = f"marker-{next(_markers)}"
            await late.publish("shop.status", marker, options=PublishOptions(acknowledge=True, exclude_me=False))
            await rec.wait_until(lambda r, m=marker: m in r.args)
            await sub.unsubscribe()
            got = rec.events[: rec.args.index(marker)]
            if got:
                break
        assert len(got) == 1, got
        args, kwargs = got[0]
        assert args == ({"open": True},)
        assert kwargs["details"].retained is True
    finally:
        await leave(late)


@pytest_twisted.ensureDeferred
async def test_meta_api_sees_every_nodes_sessions_and_callees(shop: Shop) -> None:
    """wamp.session.count/list from node 2 count sessions of all three nodes; registration lookup from node 1 finds
    node 3's procedure."""
    asker = await connect(shop.n2.wamp_url)
    before = await asker.call("wamp.session.count")
    sessions = [await connect(node.wamp_url) for node in shop.nodes]
    callee = sessions[2]
    try:
        assert await asker.call("wamp.session.count") == before + 3
        listed = set(await asker.call("wamp.session.list"))
        assert {s._session_id for s in sessions} | {asker._session_id} <= listed
        # Another realm's sessions are not counted in realm1.
        other = await connect(shop.n1.wamp_url, SHOP2)
        assert await asker.call("wamp.session.count") == before + 3
        await leave(other)

        await callee.register(lambda: None, "shop.meta.ping")
        await registered_everywhere([sessions[0]], "shop.meta.ping")
        reg_id = await sessions[0].call("wamp.registration.lookup", "shop.meta.ping")
        assert await sessions[0].call("wamp.registration.list_callees", reg_id) == [callee._session_id]
    finally:
        await leave(asker, *sessions)


@pytest_twisted.ensureDeferred
async def test_second_realm_is_kept_apart(shop: Shop) -> None:
    """Realm shop2 on nodes 1 and 2: the same procedure and topic as realm1 answer and deliver within their realm;
    node 3 does not serve it."""
    callee1 = await connect(shop.n3.wamp_url)
    callee2 = await connect(shop.n1.wamp_url, SHOP2)
    caller1 = await connect(shop.n2.wamp_url)
    caller2 = await connect(shop.n2.wamp_url, SHOP2)
    try:
        await callee1.register(lambda: "realm1", "shop.realm.name")
        await callee2.register(lambda: SHOP2, "shop.realm.name")
        await registered_everywhere([caller1, caller2], "shop.realm.name")
        assert await caller1.call("shop.realm.name") == "realm1"
        assert await caller2.call("shop.realm.name") == SHOP2

        rec = Recorder()
        await caller2.subscribe(rec, "shop.status")
        await all_see(callee2, "shop.status", [rec])
        pub1 = await connect(shop.n1.wamp_url)
        await pub1.publish("shop.status", "realm1 only", options=PublishOptions(acknowledge=True))
        await leave(pub1)
        await callee2.publish("shop.status", "end", options=PublishOptions(acknowledge=True))
        await rec.wait_until(lambda r: "end" in r.args)
        assert "realm1 only" not in rec.args

        with pytest.raises(ConnectionError, match="no_such_realm"):
            await connect(shop.n3.wamp_url, SHOP2)
    finally:
        await leave(callee1, callee2, caller1, caller2)


def readme_blocks() -> list[str]:
    """The Python blocks of README.md's "A first call across nodes" (callee, caller)."""
    section = (REPO / "README.md").read_text().split("## A first call across nodes", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest_twisted.ensureDeferred
async def test_readme_first_call_across_nodes_runs(shop: Shop, tmp_path: Path) -> None:
    """README's callee (node 1) and caller (node 2) print what the README says."""
    callee_code, caller_code = readme_blocks()
    (tmp_path / "callee.py").write_text(callee_code.replace("127.0.0.1:8080", f"127.0.0.1:{shop.n1.wamp_port}"))
    (tmp_path / "caller.py").write_text(caller_code.replace("127.0.0.1:8081", f"127.0.0.1:{shop.n2.wamp_port}"))
    callee = subprocess.Popen(
        [sys.executable, "callee.py"], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    watcher = await connect(shop.n2.wamp_url)
    try:
        await registered_everywhere([watcher], "demo.order")
        run = await threads.deferToThread(
            subprocess.run, [sys.executable, "caller.py"], cwd=tmp_path, capture_output=True, text=True, timeout=30
        )
        assert run.returncode == 0, run.stderr[-2000:]
        printed = [line for line in run.stdout.splitlines() if not re.match(r"\d{4}-\d\d-\d\dT", line)]
        assert printed == [
            "packing tea",
            "shipped tea",
            "error demo.error.out_of_stock ('unobtainium',)",
        ], run.stdout
    finally:
        callee.terminate()
        callee.wait(10)
        await leave(watcher)
