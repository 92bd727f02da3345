"""Stream messages across the cluster and across protocols (docs/protocol-mapping.md, the stream rows)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import pytest_twisted
from helpers.nodes import Cluster
from helpers.nsdclient import NSDClient
from helpers.polling import until
from helpers.streamclient import OK, StreamClient
from helpers.wampclient import connect, leave, publish_acked, subscribe
from websockets.sync.client import connect as ws_connect

from pubsubclub.frontends.stream import codec as c

pytestmark = pytest.mark.slow

SUCCESS = {"_class": "SuccessResponse"}


def interest(cluster: Cluster, at: int, topic: str, node: str) -> Callable[[], bool]:
    """Whether node ``at`` knows that ``node`` wants ``topic``."""
    return lambda: node in cluster[at].stats()["remote_interest"].get(topic, [])


@pytest_twisted.ensureDeferred
async def test_stream_publish_reaches_every_protocol_on_another_node(cluster_factory: Callable[..., Cluster]) -> None:
    """A stream Publish on node 1: stream, WAMP, TEP and NSD subscribers on node 2 get it, mapped as documented."""
    cluster = cluster_factory(2, frontends=True)
    await cluster.linked()
    stream_sub = StreamClient(cluster[1].stream_port)
    stream_sub.connect()
    stream_sub.send(c.Subscribe("room", c.Position.LATEST))
    assert stream_sub.one() == OK
    wamp = await connect(cluster[1].wamp_url)
    rec, _ = await subscribe(wamp, "room")
    owner, nsd = NSDClient(cluster[1].nsd_port, "room"), NSDClient(cluster[1].nsd_port, "Reader")
    assert owner.open() == SUCCESS and nsd.open() == SUCCESS
    assert nsd.subscribe("room") == SUCCESS
    with ws_connect(cluster[1].tep_url, open_timeout=10) as tep:
        tep.send(json.dumps({"topic": "join", "payload": ["room"]}))
        assert json.loads(tep.recv(timeout=10)) == {"topic": "@join", "payload": ["room"]}
        await until(interest(cluster, 0, "room", "node2"), "node1 to learn node2's interest in room")
        writer = StreamClient(cluster[0].stream_port)
        writer.connect()
        writer.send(c.Publish("room", "héllo".encode()), c.Publish("room", b"\xff\x00binary"))
        assert writer.recv(2) == [OK, OK]
        # Stream on node 2: the same bytes, sequences of node 2's log.
        assert stream_sub.recv(2) == [c.Message("room", 0, "héllo".encode()), c.Message("room", 1, b"\xff\x00binary")]
        # WAMP: UTF-8 text as a string; other bytes in WAMP's binary form, which Autobahn decodes to bytes.
        await rec.wait_for(2)
        assert rec.args == ["héllo", b"\xff\x00binary"]
        # TEP: the cluster payload (text as is; binary as the NUL + base64 string).
        first, second = json.loads(tep.recv(timeout=10)), json.loads(tep.recv(timeout=10))
        assert first == {"topic": "room", "payload": "héllo"}
        assert second["topic"] == "room" and second["payload"].startswith("\u0000")
    # NSD: a Message whose body is the cluster payload (the text), from the origin node.
    await until(lambda: len(nsd.get(0)) == 2, "NSD history on node 2 to hold both")
    text, _binary = nsd.get(0)
    assert (text["_class"], text["body"]) == ("Message", "héllo")
    await leave(wamp)


@pytest_twisted.ensureDeferred
async def test_other_protocols_reach_stream_subscribers_on_another_node(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """WAMP and TEP publishes on node 2 are appended to node 1's log and reach its stream subscriber as bytes.

    WAMP binary payloads stay on their node (they are not JSON; docs/protocol-mapping.md): a local one
    reaches the stream subscriber as the same bytes.
    """
    cluster = cluster_factory(2, frontends=True)
    await cluster.linked()
    reader = StreamClient(cluster[0].stream_port)
    reader.connect()
    reader.send(c.Subscribe("feed", c.Position.LATEST))
    assert reader.one() == OK
    await until(interest(cluster, 1, "feed", "node1"), "node2 to learn node1's interest in feed")
    wamp = await connect(cluster[1].wamp_url)
    await publish_acked(wamp, "feed", "text")
    await publish_acked(wamp, "feed", {"n": 1})
    with ws_connect(cluster[1].tep_url, open_timeout=10) as tep:
        tep.send(json.dumps({"topic": "feed", "payload": [1, 2]}))
        got = reader.recv(3)
    local = await connect(cluster[0].wamp_url)
    await publish_acked(local, "feed", b"\x01\x02")
    got += reader.recv(1)
    assert got == [
        c.Message("feed", 0, b"text"),
        c.Message("feed", 1, b'{"n":1}'),
        c.Message("feed", 2, b"[1,2]"),
        c.Message("feed", 3, b"\x01\x02"),
    ]
    # The node keeps the topic in its log: a late reader from Earliest gets the same sequences.
    late = StreamClient(cluster[0].stream_port)
    late.connect()
    late.send(c.Subscribe("feed", c.Position.EARLIEST))
    assert late.recv(5)[1:] == got
    await leave(wamp, local)
