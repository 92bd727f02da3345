"""TEP against real node processes: the spec's exchanges, cross-node and cross-protocol, bad input.

TEP clients are the independent ``websockets`` library's sync client (its own
threads), WAMP clients are Autobahn-Python on the Twisted reactor. Every wait
is bounded: ``recv`` takes a timeout, node-side conditions are polled over
``/stats`` with ``wait_until``.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from helpers.nodes import OPS_TOKEN, Cluster, NodeProcess, start_cluster
from helpers.polling import until, wait_until
from helpers.ports import free_port
from helpers.rawws import close_of
from helpers.tepclient import join, recv, send, tep
from helpers.wampclient import connect as wamp_connect
from helpers.wampclient import leave, publish_acked, subscribe

pytestmark = pytest.mark.slow

#: Bound for one frame to arrive from a node.
#: --max-message-size of the nodes, which is also their TEP frame limit.
MAX_MESSAGE = 65536
BROADCAST_TOPIC = "$tep.broadcast"


# -- helpers ---------------------------------------------------------------------------


def ops_post(node: NodeProcess, path: str, body: Any, token: str | None = OPS_TOKEN) -> tuple[int, Any]:
    """POST JSON to the node's operations listener (with the operator token); status and decoded body."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{node.http_port}{path}", data=json.dumps(body).encode(), method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def interest(node: NodeProcess, topic: str) -> list[str]:
    """Which peer nodes asked ``node`` for ``topic``."""
    return list(node.stats()["remote_interest"].get(topic, []))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three linked nodes with TEP on, shared by the tests of this module (each uses its own channels)."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("tep"), 3, extra=("--max-message-size", str(MAX_MESSAGE)), frontends=True
    )
    try:
        cluster.wait_linked()
        yield cluster
    finally:
        for node in cluster.nodes:
            node.stop()


# -- the spec's examples ---------------------------------------------------------------


def test_spec_join_example(cluster: Cluster) -> None:
    """join of 'channel1' and 'channel2.subtopic' is answered '@join' with both (dotted names are channels)."""
    ws = tep(cluster[0])
    send(ws, "join", ["channel1", "channel2.subtopic"])
    assert recv(ws) == {"topic": "@join", "payload": ["channel1", "channel2.subtopic"]}
    send(ws, "leave", ["channel1", "channel2.subtopic"])
    assert recv(ws) == {"topic": "@leave", "payload": ["channel1", "channel2.subtopic"]}
    ws.close()


def test_spec_uml_sample(cluster: Cluster) -> None:
    """The UML sample: mixed join replies, three events, mixed leave replies, then a custom message."""
    node = cluster[0]
    ws = tep(node)
    other = tep(node)
    join(other, "custom")
    send(ws, "join", ["chan1", "#join"])
    assert recv(ws) == {"topic": "@join", "payload": ["chan1"]}
    assert recv(ws) == {"topic": "#join", "payload": ["#join"]}
    for i in (1, 2, 3):
        status, body = ops_post(node, "/tep/emit", {"channel": "chan1", "payload": f"Event {i}: SomeThing"})
        assert (status, body) == (200, {"delivered_locally": 1})
    for i in (1, 2, 3):
        assert recv(ws) == {"topic": "chan1", "payload": f"Event {i}: SomeThing"}
    send(ws, "leave", ["chan1", "chan2"])
    assert recv(ws) == {"topic": "@leave", "payload": ["chan1"]}
    assert recv(ws) == {"topic": "#leave", "payload": ["chan2"]}
    send(ws, "custom", "Something")
    assert recv(other) == {"topic": "custom", "payload": "Something"}
    # No answer to a publish: the next frame ws gets is the reply to its next request.
    send(ws, "join", [])
    assert recv(ws) == {"topic": "@join", "payload": []}
    ws.close()
    other.close()


def test_rejected_names_and_per_client_limit(cluster: Cluster) -> None:
    """System, reserved, invalid names and channels past the per-client limit (100) are rejected on '#join'."""
    ws = tep(cluster[1])
    bad = ["join", "leave", "@join", "#join", "@leave", "#leave", "$tep.broadcast", "", "a b", "tab\t", "x" * 300]
    send(ws, "join", ["ok.1", *bad])
    assert recv(ws) == {"topic": "@join", "payload": ["ok.1"]}
    assert recv(ws) == {"topic": "#join", "payload": bad}
    send(ws, "join", [f"many.{i}" for i in range(100)])
    assert recv(ws) == {"topic": "@join", "payload": [f"many.{i}" for i in range(99)]}
    assert recv(ws) == {"topic": "#join", "payload": ["many.99"]}
    send(ws, "join", ["ok.1"])  # already joined: accepted again
    assert recv(ws) == {"topic": "@join", "payload": ["ok.1"]}
    ws.close()


# -- cross-node, cross-protocol -----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_wamp_publish_on_node1_reaches_tep_on_node2(cluster: Cluster) -> None:
    """A WAMP publish on node 1 reaches a TEP client on node 2: one arg as the payload, else the wrapper."""
    topic = "tep.cross.wamp_to_tep"
    ws = tep(cluster[1])
    join(ws, topic)
    await until(lambda: interest(cluster[0], topic) == ["node2"], "node1 to learn node2's interest")
    pub = await wamp_connect(cluster[0].wamp_url)
    await publish_acked(pub, topic, {"n": 1})
    await publish_acked(pub, topic, 1, 2, k="v")
    assert recv(ws) == {"topic": topic, "payload": {"n": 1}}
    assert recv(ws) == {"topic": topic, "payload": {"args": [1, 2], "kwargs": {"k": "v"}}}
    await leave(pub)
    ws.close()


@pytest_twisted.ensureDeferred
async def test_tep_publish_on_node2_reaches_wamp_on_node3_and_tep_on_node1(cluster: Cluster) -> None:
    """A TEP client publish on node 2 reaches a WAMP subscriber on node 3 and a TEP client on node 1, not itself."""
    topic = "tep.cross.tep_to_wamp"
    sub = await wamp_connect(cluster[2].wamp_url)
    rec, _ = await subscribe(sub, topic)
    listener = tep(cluster[0])
    join(listener, topic)
    publisher = tep(cluster[1])
    join(publisher, topic)
    await until(lambda: interest(cluster[1], topic) == ["node1", "node3"], "node2 to learn the interest")
    send(publisher, topic, {"hello": [1, "two"]})
    send(publisher, topic, "second")
    await rec.wait_for(2)
    assert rec.events == [(({"hello": [1, "two"]},), {}), (("second",), {})]
    assert recv(listener) == {"topic": topic, "payload": {"hello": [1, "two"]}}
    assert recv(listener) == {"topic": topic, "payload": "second"}
    send(publisher, "join", [])
    assert recv(publisher) == {"topic": "@join", "payload": []}  # its own messages never came back
    await leave(sub)
    listener.close()
    publisher.close()


def test_broadcast_reaches_every_tep_client_on_all_nodes(cluster: Cluster) -> None:
    """A broadcast through node 2's server API reaches every TEP client on all three nodes, without a topic."""
    clients = [tep(node) for node in cluster.nodes for _ in range(2)]
    # A node asks for broadcasts while it has TEP clients.
    for node in cluster.nodes:
        others = sorted(n.name for n in cluster.nodes if n is not node)
        wait_until(lambda node=node, others=others: interest(node, BROADCAST_TOPIC) == others, "broadcast interest")
    join(clients[0], "tep.bcast.some")  # joined or not, every client gets broadcasts
    status, body = ops_post(cluster[1], "/tep/broadcast", {"payload": {"foo": "bar"}})
    assert status == 200 and body["delivered_locally"] == 1  # node 2's broadcast sink
    for ws in clients:
        assert recv(ws) == {"payload": {"foo": "bar"}}
        ws.close()


def test_operations_api_refuses_bad_requests(cluster: Cluster) -> None:
    """The operations API answers 400 for a bad body or channel and 413 for an oversize body."""
    node = cluster[2]
    assert ops_post(node, "/tep/broadcast", {"nopayload": 1})[0] == 400
    status, body = ops_post(node, "/tep/emit", {"channel": "@join", "payload": 1})
    assert status == 400 and "system name" in body["error"]
    assert ops_post(node, "/tep/emit", {"payload": 1})[0] == 400
    assert ops_post(node, "/tep/broadcast", {"payload": "x" * MAX_MESSAGE})[0] == 413


def test_operations_api_needs_the_token(cluster: Cluster, tmp_path: Path) -> None:
    """Without the bearer token, or with another, /tep answers 401 and nothing is delivered; without a token file,
    the API is not served at all."""
    node = cluster[0]
    ws = tep(node)
    join(ws, "tep.ops.token")
    for token in (None, "wrong token", OPS_TOKEN + "x", ""):
        status, body = ops_post(node, "/tep/emit", {"channel": "tep.ops.token", "payload": "forged"}, token=token)
        assert status == 401 and "Bearer" in body["error"], token
    assert ops_post(node, "/tep/emit", {"channel": "tep.ops.token", "payload": "marker"})[0] == 200
    assert recv(ws) == {"topic": "tep.ops.token", "payload": "marker"}  # and nothing forged before it
    ws.close()
    bare = NodeProcess("no-ops-token", tmp_path, extra=("--tep", f"tcp:{free_port()}:interface=127.0.0.1")).start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{bare.http_port}/tep/broadcast", data=b'{"payload": 1}', method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=5)
        assert e.value.code == 404
        assert "TEP operator API (/tep on --http) is off" in bare.log_path.read_text()
    finally:
        bare.stop()


def test_client_publishing_can_be_forbidden(tmp_path: Path) -> None:
    """With --no-tep-client-publish a publish gets '#error' and reaches no one; a stopping node closes with 1000."""
    node = NodeProcess("nopub", tmp_path, extra=("--no-tep-client-publish",), frontends=True).start()
    try:
        listener = tep(node)
        join(listener, "locked")
        ws = tep(node)
        ws.send('{"topic": "locked", "payload": 1}')
        assert recv(ws) == {
            "topic": "#error",
            "payload": {
                "error": "client publishing is disabled on this node",
                "frame": '{"topic": "locked", "payload": 1}',
            },
        }
        assert ops_post(node, "/tep/emit", {"channel": "locked", "payload": "server"})[0] == 200
        assert recv(listener) == {"topic": "locked", "payload": "server"}  # the client publish never came
        ws.close()
        assert node.stop() == 0
        assert close_of(listener) == (1000, "node shutting down")
    finally:
        node.stop()


# -- bad input ------------------------------------------------------------------------------


def _half_frame_then_disconnect(node: NodeProcess) -> None:
    """Upgrade a raw socket, send half a text frame, and hang up."""
    with socket.create_connection(("127.0.0.1", node.tep_port), timeout=5) as s:
        s.sendall(
            b"GET /tep HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = s.recv(4096)
            assert chunk, "the node closed during the handshake"
            response += chunk
        assert response.startswith(b"HTTP/1.1 101")
        # A masked text frame announcing 20 bytes, of which 3 are sent.
        s.sendall(b'\x81\x94\x00\x00\x00\x00{"t')


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object, not array"),
        ('"join"', "must be a JSON object, not string"),
        ('{"topic": "@join", "payload": []}', "unknown system command '@join'"),
        ('{"topic": "$tep.broadcast", "payload": 1}', "unknown system command"),
        ('{"payload": 1}', "missing field 'topic'"),
        ('{"topic": "join"}', "missing field 'payload'"),
        ('{"topic": "join", "payload": "chan"}', "must be an array of channel names, not string"),
        ('{"topic": "join", "payload": [1]}', "item 0 must be a string, not number"),
        ('{"topic": 5, "payload": 1}', "field 'topic' must be a string, not number"),
        ('{"topic": "a", "payload": 1, "extra": true}', "unknown field(s) 'extra'"),
        (b"\x00\x01binary", "binary frames are not supported"),
        ("oversize", 1009),
        ("invalid utf-8", 1007),
        ("half a frame", None),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_input_gets_error_or_clean_close(cluster: Cluster, frame: str | bytes, expected: Any) -> None:
    """Bad input gets '#error' naming the problem (the connection stays usable) or a clean close; others go on."""
    node = cluster[2]
    topic = "tep.bad.still"
    sub = await wamp_connect(node.wamp_url)
    rec, _ = await subscribe(sub, topic)
    observer = tep(node)
    join(observer, topic)
    if frame == "half a frame":
        _half_frame_then_disconnect(node)
    else:
        ws = tep(node)
        if frame == "oversize":
            ws.send(json.dumps({"topic": "x", "payload": "x" * MAX_MESSAGE}))
        elif frame == "invalid utf-8":
            ws.send(b'{"topic": "x", "payload": "\xff"}', text=True)
        else:
            ws.send(frame)
        if isinstance(expected, int):
            code, _reason = close_of(ws)
            assert code == expected
        else:
            error = recv(ws)
            assert error["topic"] == "#error"
            assert expected in error["payload"]["error"]
            assert error["payload"]["frame"] == (None if isinstance(frame, bytes) else frame)
            join(ws, "tep.bad.after")  # the same connection still works
            ws.close()
    # Another TEP client and a WAMP client on the node are unaffected.
    publisher = tep(node)
    send(publisher, topic, {"still": "ok"})
    assert recv(observer) == {"topic": topic, "payload": {"still": "ok"}}
    await rec.wait_for(1)
    assert rec.args == [{"still": "ok"}]
    publisher.close()
    observer.close()
    await leave(sub)
