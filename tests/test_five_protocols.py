"""Stream and SysV publishes on one node reach stream, SysV, WAMP, NSD and TEP subscribers on the other, both ways."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from helpers.nodes import Cluster, NodeProcess
from helpers.nsdclient import NSDClient
from helpers.polling import until
from helpers.streamclient import OK as STREAM_OK
from helpers.streamclient import StreamClient
from helpers.sysvclient import Client, random_key, remove_queue
from helpers.wampclient import connect, leave, subscribe
from websockets.sync.client import connect as ws_connect

from pubsubclub.frontends.stream import codec as c
from pubsubclub.frontends.sysv.codec import MESSAGE_COUNT_BASE, Signal

pytestmark = pytest.mark.slow

NSD_OK = {"_class": "SuccessResponse"}
CHANNEL = "mesh"


@pytest.mark.parametrize("direction", ["1 to 2", "2 to 1"])
@pytest_twisted.ensureDeferred
async def test_stream_and_sysv_publishes_reach_all_five_protocols_on_the_other_node(
    tmp_path: Path, direction: str
) -> None:
    """On the receiving node: a stream reader, a SysV client, a WAMP session, a TEP client and an NSD reader."""
    keys = [random_key(), random_key()]
    nodes = [
        NodeProcess(f"node{i + 1}", tmp_path, frontends=True, extra=("--sysv", hex(keys[i]))) for i in range(2)
    ]
    nodes[0].peers, nodes[1].peers = [nodes[1].psc_url], [nodes[0].psc_url]
    cluster = Cluster([n.start() for n in nodes])
    source, sink = (nodes[0], nodes[1]) if direction == "1 to 2" else (nodes[1], nodes[0])
    source_key, sink_key = (keys[0], keys[1]) if direction == "1 to 2" else (keys[1], keys[0])
    sysv_clients: list[Client] = []
    wamp = None
    try:
        await cluster.linked()
        # Subscribers on the sink node.
        reader = StreamClient(sink.stream_port)
        reader.connect()
        reader.send(c.Subscribe(CHANNEL, c.Position.LATEST))
        assert reader.one() == STREAM_OK
        sysv_sub = Client(sink_key)
        sysv_clients.append(sysv_sub)
        assert sysv_sub.ask(Signal.LOGIN, b"reader") == Signal.OPERATION_SUCCESS
        assert sysv_sub.ask(Signal.MSGREG, CHANNEL.encode()) == Signal.OPERATION_SUCCESS
        assert sysv_sub.ask(Signal.SUBSCRIBE, CHANNEL.encode()) == Signal.OPERATION_SUCCESS
        wamp = await connect(sink.wamp_url)
        rec, _ = await subscribe(wamp, CHANNEL)
        owner, nsd = NSDClient(sink.nsd_port, CHANNEL), NSDClient(sink.nsd_port, "Reader")
        assert owner.open() == NSD_OK and nsd.open() == NSD_OK and nsd.subscribe(CHANNEL) == NSD_OK
        with ws_connect(sink.tep_url, open_timeout=10) as tep:
            tep.send(json.dumps({"topic": "join", "payload": [CHANNEL]}))
            assert json.loads(tep.recv(timeout=10)) == {"topic": "@join", "payload": [CHANNEL]}
            await until(
                lambda: sink.name in source.stats()["remote_interest"].get(CHANNEL, []),
                f"{source.name} to learn {sink.name}'s interest",
            )
            # Publishers on the source node: a stream client, then a SysV client.
            writer = StreamClient(source.stream_port)
            writer.connect()
            writer.send(c.Publish(CHANNEL, b"from stream"))
            assert writer.one() == STREAM_OK
            sysv_pub = Client(source_key)
            sysv_clients.append(sysv_pub)
            assert sysv_pub.ask(Signal.LOGIN, b"writer") == Signal.OPERATION_SUCCESS
            assert sysv_pub.ask(Signal.MSGREG, CHANNEL.encode()) == Signal.OPERATION_SUCCESS
            text = f"[{CHANNEL}] [writer]: from sysv"
            assert sysv_pub.ask(Signal.MESSAGE, CHANNEL.encode(), text.encode()) == Signal.OPERATION_SUCCESS
            expected = ["from stream", text]
            # Stream reader: the bytes, numbered by the sink node's log.
            assert reader.recv(2) == [
                c.Message(CHANNEL, 0, b"from stream"),
                c.Message(CHANNEL, 1, text.encode()),
            ]
            # TEP client.
            got_tep = [json.loads(tep.recv(timeout=10)) for _ in expected]
            assert got_tep == [{"topic": CHANNEL, "payload": p} for p in expected]
        # WAMP session.
        await rec.wait_for(2)
        assert rec.args == expected
        # SysV client: deliveries with the node's message counter as type.
        await until(
            lambda: len([m for m in sysv_sub.collected() if m.type >= MESSAGE_COUNT_BASE]) == 2, "SysV deliveries"
        )
        deliveries = [m for m in sysv_sub.collected() if m.type >= MESSAGE_COUNT_BASE]
        assert [m.long_text.split(b"\0")[0].decode() for m in deliveries] == expected
        # NSD: both in the channel's history, as Message bodies.
        await until(lambda: len(nsd.get(0)) == 2, "NSD history")
        assert [m["body"] for m in nsd.get(0)] == expected
    finally:
        if wamp is not None:
            await leave(wamp)
        for client in sysv_clients:
            client.close()
        for node in nodes:
            node.stop()
        for key in keys:
            remove_queue(key)
