"""Several WAMP realms per node, isolated across real node processes (Autobahn-Python clients).

Three nodes with overlapping realm lists, given three ways: node1 by repeated
``--realm``, node2 by ``[wamp] realms`` in TOML (another order), node3 by one
``--realm``; all with ``--plain-realm realm1`` and one ``--auth`` file with
``[realms.NAME]`` tables.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import RegisterOptions, SubscribeOptions
from helpers.nodes import Cluster, NodeProcess, start_all
from helpers.polling import until, wait_until
from helpers.wampclient import Recorder, connect, leave, publish_acked, subscribe
from twisted.internet import threads

pytestmark = pytest.mark.slow

AUTH = """
anonymous = "everyone"
[roles.everyone]
subscribe = [""]
publish = [""]
[[principals]]
authid = "alice"
role = "everyone"
ticket = "alice-ticket"

[realms.a]
anonymous = "everyone"
[realms.a.roles.everyone]
subscribe = [""]
publish = [""]

[realms.b]
anonymous = "reader"
[realms.b.roles.reader]
subscribe = [""]
[realms.b.roles.writer]
subscribe = [""]
publish = [""]
[[realms.b.principals]]
authid = "bob"
role = "writer"
ticket = "bob-ticket"
"""

TOPIC = "com.example.same"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """node1: realm1, a, b, c (flags); node2: b, a (TOML); node3: b (one flag); linked both ways."""
    tmp = tmp_path_factory.mktemp("realms")
    auth = tmp / "auth.toml"
    auth.write_text(AUTH)
    toml = tmp / "node2.toml"
    toml.write_text('[wamp]\nrealms = ["b", "a"]\nplain-realm = "realm1"\n')
    common = ("--auth", str(auth))
    nodes = [
        NodeProcess("node1", tmp, extra=(*common, "--realm", "realm1", "--realm", "a", "--realm", "b",
                                         "--realm", "c", "--plain-realm", "realm1")),  # fmt: skip
        NodeProcess("node2", tmp, extra=(*common, "--config", str(toml))),
        NodeProcess("node3", tmp, extra=(*common, "--realm", "b", "--plain-realm", "realm1")),
    ]
    for node in nodes:
        node.peers = [other.psc_url for other in nodes if other is not node]
    try:
        start_all(nodes)  # start-ups overlap
        yield Cluster(nodes)
    finally:
        for node in nodes:
            node.stop()


def remote_registrations(node: NodeProcess) -> int:
    """Other nodes' registrations ``node``'s dealer holds."""
    return int(node.stats()["wamp"]["dealer"]["remote_registrations"])


async def join_error(url: str, realm: str, **kwargs: Any) -> str:
    """The text of a refused join (fails if the session joins)."""
    try:
        session = await connect(url, realm, **kwargs)
    except ConnectionError as e:
        return str(e)
    await leave(session)
    raise AssertionError(f"joined realm {realm!r}")


@pytest_twisted.ensureDeferred
async def test_events_stay_in_their_realm_across_nodes(cluster: Cluster) -> None:
    """The same topic in realms realm1, a and b on three nodes: each publish reaches only its realm's subscribers
    (exact, and a prefix subscription of realm b)."""
    await cluster.linked()
    n1, n2, n3 = cluster.nodes
    assert [n.stats()["wamp"]["realms"] for n in cluster.nodes] == [["realm1", "a", "b", "c"], ["b", "a"], ["b"]]
    assert {n.stats()["wamp"]["plain_realm"] for n in cluster.nodes} == {"realm1"}
    subs = {
        ("realm1", "node1"): await connect(n1.wamp_url, "realm1"),
        ("a", "node1"): await connect(n1.wamp_url, "a"),
        ("a", "node2"): await connect(n2.wamp_url, "a"),
        ("b", "node1"): await connect(n1.wamp_url, "b"),
        ("b", "node2"): await connect(n2.wamp_url, "b"),
        ("b", "node3"): await connect(n3.wamp_url, "b"),
    }
    recorders = {key: (await subscribe(session, TOPIC))[0] for key, session in subs.items()}
    # A prefix subscription in realm b on node2 matches realm b's topic only, whichever node publishes it.
    prefix = subs[("b", "node2 prefix")] = await connect(n2.wamp_url, "b")
    recorders[("b", "node2 prefix")] = rec = Recorder()
    await prefix.subscribe(rec, "com.example.", options=SubscribeOptions(match="prefix"))
    for node in (n1, n3):
        await until(lambda node=node: "prefix:$realm.b#com.example." in node.stats()["remote_patterns"], "pattern")
    # Every realm's interest has reached the publishers' nodes (the hub topics are the same on every node).
    await until(lambda: f"$realm.b#{TOPIC}" in n1.stats()["remote_interest"], "realm b interest on node1")
    await until(lambda: f"$realm.a#{TOPIC}" in n1.stats()["remote_interest"], "realm a interest on node1")
    await until(lambda: f"$realm.b#{TOPIC}" in n2.stats()["remote_interest"], "realm b interest on node2")

    # Publishers are sessions of their own (a publisher is not sent its own events).
    a1 = await connect(n1.wamp_url, "a")
    a2 = await connect(n2.wamp_url, "a")
    plain1 = await connect(n1.wamp_url, "realm1")
    b3 = await connect(n3.wamp_url, "b", authid="bob", ticket="bob-ticket")
    await publish_acked(a1, TOPIC, "in a")
    await publish_acked(plain1, TOPIC, "in realm1")
    await publish_acked(b3, TOPIC, "in b")
    await publish_acked(a2, TOPIC, "in a")
    # Markers after everything, one per realm, awaited everywhere: FIFO per (origin node, topic).
    await publish_acked(a1, TOPIC, "end a")
    await publish_acked(a2, TOPIC, "end a")
    await publish_acked(b3, TOPIC, "end b")
    await publish_acked(plain1, TOPIC, "end realm1")
    for (realm, _node), rec in recorders.items():
        ends = 2 if realm == "a" else 1
        await rec.wait_until(lambda r, realm=realm, ends=ends: r.args.count(f"end {realm}") == ends)
        want = {"a": ["in a"] * 2, "b": ["in b"], "realm1": ["in realm1"]}[realm] + [f"end {realm}"] * ends
        assert sorted(rec.args) == sorted(want), (realm, _node, rec.args)
    await leave(a1, a2, plain1, b3)
    await leave(*subs.values())


@pytest_twisted.ensureDeferred
async def test_procedures_stay_in_their_realm_across_nodes(cluster: Cluster) -> None:
    """One procedure name registered in realms a (node2) and b (node3): each realm's caller on node1 reaches its
    own callee; already_exists is per realm; a prefix registration in b is not called from a or realm1."""
    await cluster.linked()
    n1, n2, n3 = cluster.nodes
    before = remote_registrations(n1)
    callee_a = await connect(n2.wamp_url, "a")
    callee_b = await connect(n3.wamp_url, "b", authid="bob", ticket="bob-ticket")
    await callee_a.register(lambda: "from a", "com.example.proc")
    await callee_b.register(lambda: "from b", "com.example.proc")
    await callee_b.register(
        lambda details=None: f"b pattern {details.procedure}",
        "com.example.pat.",
        options=RegisterOptions(match="prefix", details_arg="details"),
    )
    await until(lambda: remote_registrations(n1) == before + 3, "node1 knows the three registrations")
    caller_a = await connect(n1.wamp_url, "a")
    caller_b = await connect(n1.wamp_url, "b", authid="bob", ticket="bob-ticket")
    caller_plain = await connect(n1.wamp_url, "realm1")
    assert await caller_a.call("com.example.proc") == "from a"
    assert await caller_b.call("com.example.proc") == "from b"
    assert await caller_b.call("com.example.pat.x") == "b pattern com.example.pat.x"
    for caller, procedure in ((caller_plain, "com.example.proc"), (caller_a, "com.example.pat.x"),
                              (caller_plain, "com.example.pat.x")):  # fmt: skip
        with pytest.raises(ApplicationError) as e:
            await caller.call(procedure)
        assert e.value.error == "wamp.error.no_such_procedure"
    # A second single registration of the name in realm a (on node1) clashes with node2's; in realm1 it does not.
    with pytest.raises(ApplicationError) as e:
        await caller_a.register(lambda: "again", "com.example.proc")
    assert e.value.error == "wamp.error.procedure_already_exists"
    await caller_plain.register(lambda: "from realm1", "com.example.proc")
    assert await caller_plain.call("com.example.proc") == "from realm1"
    assert await caller_a.call("com.example.proc") == "from a"
    before_shared_n1 = remote_registrations(n1)
    # Shared registrations of one name: roundrobin over nodes 1 and 2 in realm a, "first" in realm b (another
    # policy, which in one realm would be refused): each realm's calls go to its own callees.
    shared_a1 = await connect(n1.wamp_url, "a")
    before = remote_registrations(n3)
    await shared_a1.register(lambda: "a on node1", "com.example.shared", options=RegisterOptions(invoke="roundrobin"))
    await callee_a.register(lambda: "a on node2", "com.example.shared", options=RegisterOptions(invoke="roundrobin"))
    await callee_b.register(lambda: "b on node3", "com.example.shared", options=RegisterOptions(invoke="first"))
    await until(lambda: remote_registrations(n3) == before + 2, "node3 knows realm a's two shared registrations")
    await until(lambda: remote_registrations(n1) == before_shared_n1 + 2, "node1 knows the other two")
    got_a = {await caller_a.call("com.example.shared") for _ in range(4)}
    assert got_a == {"a on node1", "a on node2"}
    assert {await caller_b.call("com.example.shared") for _ in range(3)} == {"b on node3"}
    with pytest.raises(ApplicationError) as e:
        await caller_plain.call("com.example.shared")
    assert e.value.error == "wamp.error.no_such_procedure"
    await leave(callee_a, callee_b, caller_a, caller_b, caller_plain, shared_a1)


@pytest_twisted.ensureDeferred
async def test_roles_per_realm_and_unknown_realms(cluster: Cluster) -> None:
    """Each realm's [realms.NAME] table decides who joins it and what they may do; a realm without one admits
    nobody; a realm the node does not serve is ABORTed no_such_realm."""
    n1, _n2, n3 = cluster.nodes
    # alice is a principal of the plain realm only; bob of realm b only.
    alice = await connect(n1.wamp_url, "realm1", authid="alice", ticket="alice-ticket")
    assert alice.details.authrole == "everyone"
    assert "wamp.error" in await join_error(n1.wamp_url, "b", authid="alice", ticket="alice-ticket")
    assert "wamp.error" in await join_error(n1.wamp_url, "realm1", authid="bob", ticket="bob-ticket")
    # Anonymous in b is a reader: it may subscribe, not publish.
    reader = await connect(n3.wamp_url, "b")
    assert reader.details.authrole == "reader"
    await subscribe(reader, "com.example.read")
    with pytest.raises(ApplicationError) as e:
        await publish_acked(reader, "com.example.read", "no")
    assert e.value.error == "wamp.error.not_authorized"
    # c is served by node1 but has no table: nobody joins it.
    assert "wamp.error.not_authorized" in await join_error(n1.wamp_url, "c")
    # realm1 and a are not served by node3; "nope" by nobody.
    for node, realm in ((n3, "realm1"), (n3, "a"), (n1, "nope")):
        assert "wamp.error.no_such_realm" in await join_error(node.wamp_url, realm)
    await leave(alice, reader)


def test_a_node_with_another_plain_realm_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """A node whose plain realm differs dials node1: the link is refused (HTTP 409), both logs say why."""
    odd = NodeProcess("odd", tmp_path, extra=("--realm", "a", "--realm", "realm1"))
    odd.peers = [cluster[0].psc_url]
    odd.start()
    try:
        wait_until(lambda: "plain realm conflict" in cluster[0].log_path.read_text(), "node1 logs the conflict")
        wait_until(lambda: "409" in odd.log_path.read_text(), "the odd node logs the refusal")
        assert cluster[0].metric("pubsubclub_errors_total", component="psc", reason="plain_realm_conflict") >= 1
    finally:
        odd.stop()


@pytest_twisted.ensureDeferred
async def test_autobahn_js_subscriber_hears_only_its_realm(cluster: Cluster) -> None:
    """An autobahn-js subscriber in realm b on node2 (which lists b first): of realm a's, realm1's and realm b's
    publishes on node1 (in that order, the same topic) the first event it gets is realm b's."""
    node_js = shutil.which("node")
    if node_js is None:
        pytest.fail("node (Node.js) is not on PATH: the JS client tests need it (see the Makefile's js target)")
    await cluster.linked()
    n1, n2, _n3 = cluster.nodes
    topic = "com.example.js"
    script = Path(__file__).parent / "js" / "wamp_client.js"
    proc = subprocess.Popen(
        [node_js, str(script), "--url", n2.wamp_url, "--realm", "b", "subscribe", "--topic", topic, "--timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent,
    )  # fmt: skip
    assert proc.stdout is not None
    sessions = []
    try:
        assert json.loads(await threads.deferToThread(proc.stdout.readline)) == {"ready": True}
        await until(lambda: f"$realm.b#{topic}" in n1.stats()["remote_interest"], "realm b interest on node1")
        for realm in ("a", "realm1", "b"):
            kwargs = {"authid": "bob", "ticket": "bob-ticket"} if realm == "b" else {}
            session = await connect(n1.wamp_url, realm, **kwargs)
            sessions.append(session)
            await publish_acked(session, topic, f"from {realm}")
        line = await threads.deferToThread(proc.stdout.readline)
        assert json.loads(line) == {"args": ["from b"], "kwargs": {}}
        assert await threads.deferToThread(proc.wait, 20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await leave(*sessions)
