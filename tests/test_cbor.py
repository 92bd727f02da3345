"""WAMP CBOR (``wamp.2.cbor``, RawSocket serializer 3) on real nodes (issue 20, point 3).

Autobahn-Python clients over WebSocket and RawSocket: a CBOR publisher's
bytes reach JSON subscribers (as ``"\\0"`` + base64 on their wire, which
Autobahn turns back into bytes) and MessagePack subscribers (as bytes), on
the publisher's node and across the link; and the other way round. A raw
RawSocket client shows CBOR is held to the same bounds as JSON and
MessagePack: too deep, tags (value sharing, string references, bignums,
dates) and ``undefined`` are answered with ABORT naming the problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cbor2
import msgpack
import pytest
import pytest_twisted
from autobahn.twisted.rawsocket import WampRawSocketClientFactory
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.serializer import CBORSerializer, JsonSerializer, MsgPackSerializer
from autobahn.wamp.types import ComponentConfig
from helpers.nodes import Cluster, NodeProcess, share_logs, start_all, unshare_logs
from helpers.polling import until
from helpers.ports import free_port
from helpers.rawsocketclient import Raw
from helpers.wampclient import TIMEOUT, Recorder, connect, leave, publish_acked
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint

pytestmark = pytest.mark.slow

#: Bytes no text encoding survives, and the usual JSON values. (Not a NUL-led string: WAMP JSON reads
#: any such string as base64 bytes, so no router can hand one to a JSON client unchanged.)
PAYLOAD: list[Any] = [b"\x00\xff\x80binary", "text", {"k": [1, 2.5, None, True]}, -(2**63)]
KWARGS = {"blob": b"\x01\x02", "n": 2**63 - 1}


def rawsocket_node(name: str, tmp_path: Path) -> NodeProcess:
    """A node that also serves RawSocket (its port chosen here)."""
    node = NodeProcess(name, tmp_path, extra=("--rawsocket", f"tcp:{free_port()}:interface=127.0.0.1"))
    return node


def raw_port(node: NodeProcess) -> int:
    """The node's RawSocket port, from its ready line."""
    return int(node.ready["rawsocket"].rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two linked nodes, each with WebSocket and RawSocket listeners (shared: each test has its own topic)."""
    tmp_path = tmp_path_factory.mktemp("cbor")
    nodes = [rawsocket_node(f"node{i}", tmp_path) for i in (1, 2)]
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


@pytest.fixture(scope="module")
def bounds_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node with RawSocket for the raw bound checks (shared: each check has its own connection)."""
    node = rawsocket_node("bounds", tmp_path_factory.mktemp("bounds"))
    share_logs([node])
    try:
        yield node.start()
    finally:
        node.stop()
        unshare_logs([node])


async def rs_connect(port: int, serializer: str) -> ApplicationSession:
    """An Autobahn-Python session over RawSocket with ``serializer``."""
    joined: defer.Deferred[ApplicationSession] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onJoin(self, details: Any) -> None:
            joined.callback(self)

    ser = {"json": JsonSerializer(), "msgpack": MsgPackSerializer(), "cbor": CBORSerializer()}[serializer]
    factory = WampRawSocketClientFactory(lambda: Session(ComponentConfig("realm1")), serializer=ser)
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5).connect(factory)
    joined.addTimeout(TIMEOUT, reactor)
    return await joined


async def subscribers(pair: Cluster, topic: str) -> tuple[list[ApplicationSession], list[Recorder]]:
    """On each node: JSON, MessagePack and CBOR over WebSocket, and CBOR over RawSocket, all on ``topic``."""
    sessions: list[ApplicationSession] = []
    for node in pair.nodes:
        for serializer in ("json", "msgpack", "cbor"):
            sessions.append(await connect(node.wamp_url, serializer=serializer))
        sessions.append(await rs_connect(raw_port(node), "cbor"))
    recorders = []
    for session in sessions:
        rec = Recorder()
        await session.subscribe(rec, topic)
        recorders.append(rec)
    await until(lambda: "node2" in pair[0].stats()["remote_interest"].get(topic, []), f"interest in {topic}")
    return sessions, recorders


@pytest.mark.parametrize("transport", ["websocket", "rawsocket"])
@pytest_twisted.ensureDeferred
async def test_a_cbor_publishers_bytes_reach_every_serializer_on_both_nodes(pair: Cluster, transport: str) -> None:
    """A CBOR publisher on node 1 (WebSocket or RawSocket): every serializer's subscribers on both nodes get it."""
    topic = f"cbor.out.{transport}"
    sessions, recs = await subscribers(pair, topic)
    if transport == "websocket":
        publisher = await connect(pair[0].wamp_url, serializer="cbor")
    else:
        publisher = await rs_connect(raw_port(pair[0]), "cbor")
    await publish_acked(publisher, topic, *PAYLOAD, **KWARGS)
    for rec in recs:
        await rec.wait_for(1)
    for rec in recs:
        assert rec.events == [(tuple(PAYLOAD), KWARGS)]
    await leave(publisher, *sessions)


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
@pytest_twisted.ensureDeferred
async def test_json_and_msgpack_publishers_reach_cbor_subscribers_on_both_nodes(pair: Cluster, serializer: str) -> None:
    """A JSON or MessagePack publisher on node 2 reaches CBOR subscribers (WebSocket, RawSocket) of both nodes."""
    topic = f"cbor.in.{serializer}"
    sessions, recs = await subscribers(pair, topic)
    publisher = await connect(pair[1].wamp_url, serializer=serializer)
    await publish_acked(publisher, topic, *PAYLOAD, **KWARGS)
    for rec in recs:
        await rec.wait_for(1)
        assert rec.events == [(tuple(PAYLOAD), KWARGS)]
    await leave(publisher, *sessions)


# -- the bounds, with a raw RawSocket client ------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("publish", "problem"),
    [
        (cbor2.dumps([16, 2, {}, "t", [_nested(63)]]), "nesting depth (64) exceeded"),
        (b"\x85\x10\x02\xa0\x61t\x81" + b"\x81" * 100_000 + b"\x00", "nesting depth (64) exceeded"),
        (cbor2.dumps([16, 2, {}, "t", [[b"x" * 1000] * 4]], value_sharing=True), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", ["a long string"] * 4], string_referencing=True), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [2**64]]), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [cbor2.CBORTag(1, 0)]]), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [cbor2.CBORTag(4242, 0)]]), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [cbor2.CBORTag(64, "not bytes")]]), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [cbor2.CBORTag(65, b"\x00\x01")]]), "CBOR tags are not accepted"),
        (cbor2.dumps([16, 2, {}, "t", [cbor2.undefined]]), "UndefinedType is not JSON"),
        (cbor2.dumps([16, 2, {}, "t", [float("nan")]]), "non-finite number (nan) is not JSON"),
        (b"\x85\x10\x02\xa0\x61t\x81\x5b" + (2**62).to_bytes(8, "big") + b"ab", "premature end of stream"),
    ],
)
def test_cbor_beyond_the_bounds_is_aborted(bounds_node: NodeProcess, publish: bytes, problem: str) -> None:
    """Too deep, any tag, undefined, NaN, a length past the end: ABORT protocol_violation naming it, then closed."""
    raw = Raw(raw_port(bounds_node))
    assert raw.handshake((0xF << 4) | 3) == bytes([0x7F, (11 << 4) | 3, 0, 0])
    raw.frame(0, cbor2.dumps([1, "realm1", {"roles": {"publisher": {}}}]))
    kind, welcome = raw.next_frame()
    assert kind == 0 and cbor2.loads(welcome)[0] == 2
    raw.frame(0, publish)
    kind, answer = raw.next_frame()
    abort = cbor2.loads(answer)
    assert abort[0] == 3 and abort[2] == "wamp.error.protocol_violation", abort
    assert problem in abort[1]["message"], abort
    assert raw.closed()


@pytest_twisted.ensureDeferred
async def test_a_uint8_typed_array_is_bytes(pair: Cluster) -> None:
    """Tag 64 (RFC 8746 uint8 typed array, as Autobahn|JS's CBOR writes a Uint8Array) is taken as its bytes."""
    topic = "cbor.typed"
    sessions, recs = await subscribers(pair, topic)
    raw = Raw(raw_port(pair[0]))
    assert raw.handshake((0xF << 4) | 3) == bytes([0x7F, (11 << 4) | 3, 0, 0])
    raw.frame(0, cbor2.dumps([1, "realm1", {"roles": {"publisher": {}}}]))
    assert cbor2.loads(raw.next_frame()[1])[0] == 2
    raw.frame(0, cbor2.dumps([16, 7, {"acknowledge": True}, topic, [{"data": cbor2.CBORTag(64, b"\x00\xfe")}]]))
    assert cbor2.loads(raw.next_frame()[1])[:2] == [17, 7]  # PUBLISHED
    for rec in recs:
        await rec.wait_for(1)
        assert rec.args == [{"data": b"\x00\xfe"}]
    await leave(*sessions)


def test_the_same_depth_is_the_limit_in_json_msgpack_and_cbor() -> None:
    """63 nested lists in a PUBLISH's args pass and 64 are refused alike, by all three bounded serializers."""
    import copy

    from pubsubclub.core.jsonbounds import DEFAULT_BOUNDS
    from pubsubclub.frontends.wamp.codec import decode
    from pubsubclub.frontends.wamp.transport import bounded_serializers

    encoders = {"json": json.dumps, "msgpack": msgpack.packb, "cbor": cbor2.dumps}
    for serializer in bounded_serializers(DEFAULT_BOUNDS):
        encode = encoders[serializer.SERIALIZER_ID]
        binary = serializer.SERIALIZER_ID != "json"
        data = encode([16, 1, {}, "a.b", [_nested(62)]])
        assert decode(copy.copy(serializer), data if binary else data.encode(), binary)
        too_deep = encode([16, 1, {}, "a.b", [_nested(63)]])
        with pytest.raises(Exception, match="(nested deeper than|nesting depth) "):
            decode(copy.copy(serializer), too_deep if binary else too_deep.encode(), binary)
