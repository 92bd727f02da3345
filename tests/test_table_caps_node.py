"""Every table has a cap that answers, on real node processes with Autobahn, TEP and NSD clients.

Past each cap the client gets its protocol's error naming the limit, never a
silent success; what sessions made is gone when they leave.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.rawsocket import WampRawSocketClientFactory, WampRawSocketClientProtocol
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.serializer import JsonSerializer
from autobahn.wamp.types import ComponentConfig, SubscribeOptions
from helpers.nodes import NodeProcess
from helpers.nsdclient import NSDClient
from helpers.polling import until
from helpers.ports import free_port
from helpers.wampclient import TIMEOUT, connect, leave
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow


async def refused(call: Any, uri: str, limit: str, value: int) -> ApplicationError:
    """Await ``call`` (a Deferred or coroutine); it must fail with ERROR ``uri`` naming ``limit`` = ``value``."""
    try:
        result = await call
    except ApplicationError as e:
        assert e.error == uri, e
        assert e.kwargs == {"limit": limit, "max": value}, e.kwargs
        return e
    raise AssertionError(f"answered {result!r}, not ERROR {uri}")


def errors(node: NodeProcess) -> dict[str, int]:
    """The node's refusal and fault counters from /stats."""
    return dict(node.stats()["errors"])


@pytest_twisted.ensureDeferred
async def test_prefix_subscribe_past_the_pattern_cap_gets_an_error(tmp_path: Path) -> None:
    """Past the node's pattern cap a prefix SUBSCRIBE gets ERROR too_many_patterns (it got SUBSCRIBED and then
    nothing from other nodes); held patterns and exact topics still subscribe; the refusal is counted."""
    node = NodeProcess("patterns", tmp_path, extra=("--max-patterns-per-peer", "2")).start()
    try:
        a, b = await connect(node.wamp_url), await connect(node.wamp_url)
        prefix = SubscribeOptions(match="prefix")
        await a.subscribe(lambda *_: None, "app.one.", options=prefix)
        await a.subscribe(lambda *_: None, "app..temp", options=SubscribeOptions(match="wildcard"))
        e = await refused(
            b.subscribe(lambda *_: None, "app.three.", options=prefix),
            "pubsubclub.error.too_many_patterns",
            "federation.max-patterns-per-peer",
            2,
        )
        assert "the limit is 2" in str(e.args[0])
        await b.subscribe(lambda *_: None, "app.one.", options=prefix)
        await b.subscribe(lambda *_: None, "app.three.x")
        assert errors(node)["wamp.too_many_patterns"] == 1
        await leave(a, b)
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_registrations_are_capped_per_session_and_per_node(tmp_path: Path) -> None:
    """REGISTER past the session's cap and past the node's gets ERROR too_many_registrations naming which limit;
    a session leaving gives its places back."""
    extra = ("--wamp-max-registrations", "3", "--wamp-max-registrations-per-node", "5")
    node = NodeProcess("rpc", tmp_path, extra=extra).start()
    try:
        a, b = await connect(node.wamp_url), await connect(node.wamp_url)
        for n in range(3):
            await a.register(lambda: None, f"com.a.p{n}")
        await refused(
            a.register(lambda: None, "com.a.p3"),
            "pubsubclub.error.too_many_registrations",
            "wamp.max-registrations",
            3,
        )
        for n in range(2):
            await b.register(lambda: None, f"com.b.p{n}")
        await refused(
            b.register(lambda: None, "com.b.p2"),
            "pubsubclub.error.too_many_registrations",
            "wamp.max-registrations-per-node",
            5,
        )
        assert errors(node)["wamp.too_many_registrations"] == 2
        await leave(a)
        await until(lambda: node.stats()["wamp"]["dealer"]["registrations"] == 2, "a's registrations gone")
        await b.register(lambda: None, "com.b.p2")
        await leave(b)
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_calls_in_flight_are_capped_per_node(tmp_path: Path) -> None:
    """Callers that each stay under their own cap still cannot make the node hold more calls than
    wamp.max-calls-per-node: one more CALL gets ERROR too_many_calls at once."""
    node = NodeProcess("calls", tmp_path, extra=("--wamp-max-calls-per-node", "2")).start()
    try:
        callee = await connect(node.wamp_url)
        callers = [await connect(node.wamp_url) for _ in range(3)]
        held: list[defer.Deferred[str]] = []
        invoked: list[defer.Deferred[None]] = [defer.Deferred() for _ in range(2)]

        def hold() -> defer.Deferred[str]:
            held.append(defer.Deferred())
            invoked[len(held) - 1].callback(None)
            return held[-1]

        await callee.register(hold, "com.example.hold")
        first, second = callers[0].call("com.example.hold"), callers[1].call("com.example.hold")
        await defer.gatherResults(invoked).addTimeout(TIMEOUT, reactor)
        e = await refused(
            callers[2].call("com.example.hold"),
            "pubsubclub.error.too_many_calls",
            "wamp.max-calls-per-node",
            2,
        )
        assert "this node already has 2 calls in flight" in str(e.args[0])
        held[0].callback("one")
        held[1].callback("two")
        assert (await first, await second) == ("one", "two")
        assert errors(node)["wamp.too_many_calls"] == 1
        await leave(callee, *callers)
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_hub_topic_cap_answers_wamp_tep_and_nsd(tmp_path: Path) -> None:
    """Past max-subscribed-topics a new topic is refused on every front-end in its own way (WAMP ERROR
    too_many_topics, TEP ``#join`` and ``#error``, NSD ``TOO MANY CHANNELS``); topics already held still subscribe,
    and a session leaving makes room."""
    cap = 12
    node = NodeProcess("topics", tmp_path, extra=("--max-subscribed-topics", str(cap)), frontends=True).start()
    try:
        tep = ws_connect(node.tep_url, open_timeout=5, close_timeout=2, compression=None, legacy=True)
        wamp, other = await connect(node.wamp_url), await connect(node.wamp_url)
        # The node's own topics (NSD control and log, the TEP broadcast sink) are not limited, but they count.
        await until(lambda: node.stats()["topics"] >= 2, "the node's own topics")
        own = node.stats()["topics"]
        assert own < cap
        for n in range(cap - own):
            await wamp.subscribe(lambda *_: None, f"t.{n}")
        assert node.stats()["topics"] == cap
        e = await refused(
            other.subscribe(lambda *_: None, "t.new"), "pubsubclub.error.too_many_topics", "max-subscribed-topics", cap
        )
        assert f"the limit is {cap}" in str(e.args[0])
        await other.subscribe(lambda *_: None, "t.0")  # held already: no new topic
        tep.send(json.dumps({"topic": "join", "payload": ["t.1", "c.new"]}))
        assert json.loads(tep.recv(timeout=TIMEOUT)) == {"topic": "@join", "payload": ["t.1"]}
        assert json.loads(tep.recv(timeout=TIMEOUT)) == {"topic": "#join", "payload": ["c.new"]}
        error = json.loads(tep.recv(timeout=TIMEOUT))
        assert error["topic"] == "#error" and "max-subscribed-topics" in error["payload"]["error"]
        nsd = NSDClient(node.nsd_port, identity="fresh")
        answer = nsd.open()
        assert answer["_class"] == "ErrorResponse" and answer["error"].startswith("TOO MANY CHANNELS"), answer
        stats = errors(node)
        assert (stats["wamp.too_many_topics"], stats["tep.too_many_topics"], stats["nsd.too_many_topics"]) == (1, 1, 1)
        await leave(wamp)
        await until(lambda: node.stats()["topics"] < cap, "room again")
        assert nsd.open() == {"_class": "SuccessResponse"}
        nsd.close()
        tep.close()
        await leave(other)
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_an_invocation_over_the_size_limit_becomes_an_error_to_the_caller(tmp_path: Path) -> None:
    """A CALL under max-message-size whose INVOCATION would be over it is not sent to the callee: the caller
    gets ERROR payload_size_exceeded, both sessions carry on."""
    limit = 2048
    node = NodeProcess("size", tmp_path, extra=("--max-message-size", str(limit))).start()
    try:
        callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)
        got: list[int] = []
        await callee.register(lambda s: got.append(len(s)) or len(s), "c")
        # [48,1,{},"c",["x..."]] is 18 bytes plus the string; the INVOCATION carries two ids of up to 16 digits.
        await refused(
            caller.call("c", "x" * (limit - 30)), "wamp.error.payload_size_exceeded", "max-message-size", limit
        )
        assert got == []
        assert await caller.call("c", "small") == 5  # same sessions, still joined
        assert errors(node)["wamp.payload_size_exceeded"] == 1
        await leave(callee, caller)
    finally:
        node.stop()


async def small_rawsocket_session(port: int, max_message: int) -> ApplicationSession:
    """An Autobahn RawSocket session that tells the router it takes messages of at most ``max_message`` bytes."""
    joined: defer.Deferred[ApplicationSession] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onJoin(self, details: Any) -> None:
            joined.callback(self)

    class Small(WampRawSocketClientProtocol):  # type: ignore[misc]
        def connectionMade(self) -> None:  # noqa: N802 - Twisted API
            self._max_message_size = max_message
            super().connectionMade()

    factory = WampRawSocketClientFactory(lambda: Session(ComponentConfig("realm1")), serializer=JsonSerializer())
    factory.protocol = Small
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5).connect(factory)
    joined.addTimeout(TIMEOUT, reactor)
    return await joined


@pytest_twisted.ensureDeferred
async def test_a_result_too_big_for_the_caller_is_an_error_not_a_dropped_session(tmp_path: Path) -> None:
    """A RESULT over what a RawSocket caller said it takes: ERROR payload_size_exceeded to the caller, whose
    session stays (it was dropped before)."""
    raw_port = free_port()
    node = NodeProcess("result", tmp_path, extra=("--rawsocket", f"tcp:{raw_port}:interface=127.0.0.1")).start()
    try:
        callee = await connect(node.wamp_url)
        await callee.register(lambda n: "y" * n, "com.example.sized")
        caller = await small_rawsocket_session(raw_port, 512)
        await refused(
            caller.call("com.example.sized", 1000), "wamp.error.payload_size_exceeded", "max-message-size", 512
        )
        assert await caller.call("com.example.sized", 10) == "y" * 10
        await leave(callee, caller)
    finally:
        node.stop()


@pytest_twisted.ensureDeferred
async def test_dealer_tables_empty_and_memory_does_not_grow_over_rounds(tmp_path: Path) -> None:
    """Sessions register 20,000 procedures (and subscribe) and leave, three times: after each round every dealer
    table is empty, and the later rounds reuse the memory of the first (RSS does not grow round over round)."""
    node = NodeProcess("memory", tmp_path, extra=("--wamp-max-registrations-per-node", "20000")).start()
    try:
        after: list[float] = []
        for round_ in range(3):
            sessions = [await connect(node.wamp_url) for _ in range(20)]
            for s, session in enumerate(sessions):
                await defer.gatherResults(
                    [
                        defer.ensureDeferred(session.register(lambda: None, f"com.r{round_}.s{s}.p{n}"))
                        for n in range(1000)
                    ]
                )
            dealer = node.stats()["wamp"]["dealer"]
            assert dealer["registrations"] == 20_000 and dealer["callees"] == 20
            await leave(*sessions)
            await until(lambda: node.stats()["wamp"]["sessions"] == 0, "every session gone")
            assert set(node.stats()["wamp"]["dealer"].values()) == {0}
            after.append(node.rss() / 2**20)
        # Freed memory is kept by Python's allocator for reuse, not always returned to the OS: what matters is that
        # the second and third rounds fit in what the first left (a few MiB of slack for the allocator and logs).
        assert after[2] <= after[0] + 8, after
    finally:
        node.stop()
