"""PSC on the wire: a raw peer built on the independent ``websockets`` library against real nodes.

The raw peer uses ``websockets``' sync API (its own background threads), so it
works while the test blocks; the WAMP side is Autobahn-Python on the Twisted
reactor (pytest-twisted). Every wait is bounded: ``recv`` takes a timeout and
node-side conditions are polled over ``/stats`` with ``wait_until``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from helpers import rawws
from helpers.nodes import NodeProcess
from helpers.polling import WAIT_SECONDS, until, wait_until
from helpers.rawws import RECV_SECONDS, close_of
from helpers.wampclient import connect as wamp_connect
from helpers.wampclient import leave, publish_acked, subscribe
from websockets.frames import Frame, Opcode
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import ServerConnection, serve

pytestmark = pytest.mark.slow

#: Bound for a single frame to arrive from a node.
#: --max-message-size of the shared node.
MAX_MESSAGE = 65536
#: The spec's ping period is 5 s; allow one period plus slack.
PING_SECONDS = 8.0


# -- helpers ------------------------------------------------------------------


def recv_json(ws: ClientConnection | ServerConnection, timeout: float = RECV_SECONDS) -> Any:
    """The next text message from the node, decoded."""
    return rawws.recv_json(ws, timeout, "PSC message")


def send_json(ws: ClientConnection | ServerConnection, message: Any) -> None:
    """Send one PSC message as a text frame."""
    ws.send(json.dumps(message))


def dial(node: NodeProcess) -> ClientConnection:
    """A raw WebSocket connection to the node's PSC listener."""
    return connect(
        node.psc_url, subprotocols=["pubsubclub"], open_timeout=5, close_timeout=2, compression=None, legacy=True
    )


def consumer_link(node: NodeProcess, *versions: list[int]) -> ClientConnection:
    """A raw consumer link with the handshake done."""
    ws = dial(node)
    send_json(ws, [101, *versions])
    assert recv_json(ws)[0] == 102
    return ws


def peer_name(ws: ClientConnection) -> str:
    """How the node names our link in /stats (we send no node-id header): Autobahn's peer string."""
    host, port = ws.local_address[:2]
    return f"tcp4:{host}:{port}"


def interest(node: NodeProcess, topic: str) -> list[str]:
    """Which links asked ``node`` for ``topic``."""
    return list(node.stats()["remote_interest"].get(topic, []))


def link_rows(node: NodeProcess, peer: str) -> list[dict[str, Any]]:
    """The node's /stats rows for links to ``peer``."""
    return [row for row in node.stats()["links"] if row["peer"] == peer or row["peer_node"] == peer]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node listening as producer (the default), shared by the tests that dial it."""
    proc = NodeProcess("wire1", tmp_path_factory.mktemp("wire"), extra=("--max-message-size", str(MAX_MESSAGE)))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Start dedicated nodes; each is stopped at the end of the test."""
    started: list[NodeProcess] = []

    def make(name: str, listen_role: str = "producer", peers: tuple[str, ...] = ()) -> NodeProcess:
        proc = NodeProcess(name, tmp_path, listen_role)
        proc.peers = list(peers)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.stop()


class _RecordingConnection(ServerConnection):
    """A server connection that notes WebSocket pings from the node."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pinged = threading.Event()

    def process_event(self, event: Any) -> None:
        if isinstance(event, Frame) and event.opcode is Opcode.PING:
            self.pinged.set()
        super().process_event(event)


class RawPSCServer:
    """A PSC listener made with ``websockets.sync.server``; the test drives each link it accepts."""

    NODE_ID = "rawpeer"

    def __init__(self) -> None:
        self._accepted: queue.Queue[_RecordingConnection] = queue.Queue()
        self._server = serve(
            self._handler,
            "127.0.0.1",
            0,
            subprotocols=["pubsubclub"],
            compression=None,
            ping_interval=None,
            process_response=self._add_node_header,
            create_connection=_RecordingConnection,
        )
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """The URL a node dials."""
        return f"ws://127.0.0.1:{self.port}/psc"

    def _add_node_header(self, connection: ServerConnection, request: Any, response: Any) -> None:
        response.headers["x-pubsubclub-node"] = self.NODE_ID

    def _handler(self, ws: _RecordingConnection) -> None:
        self._accepted.put(ws)
        ws.wait_closed()  # the test reads and writes; returning would close the link

    def accept(self, timeout: float = WAIT_SECONDS) -> _RecordingConnection:
        """The next link a node opened to us."""
        try:
            return self._accepted.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no node dialled {self.url} within {timeout} s") from None

    def close(self) -> None:
        """Stop listening."""
        self._server.shutdown()
        self._thread.join(WAIT_SECONDS)


@pytest.fixture
def raw_server() -> Iterator[RawPSCServer]:
    """A raw PSC server for a node to dial."""
    server = RawPSCServer()
    yield server
    server.close()


# -- the node listens as producer; the raw peer is the consumer ---------------


@pytest_twisted.ensureDeferred
async def test_v01_consumer_gets_exactly_what_it_subscribed(node: NodeProcess) -> None:
    """A v0.1 consumer gets 3-item PSC301s for its topics only, until it unsubscribes."""
    t1, t2, other = "v01.t1", "v01.t2", "v01.unsubscribed"
    with dial(node) as ws:
        send_json(ws, [101, [0, 1]])
        assert recv_json(ws) == [102, [0, 1]]
        send_json(ws, [201, t1, t2])
        me = peer_name(ws)
        await until(lambda: me in interest(node, t1) and me in interest(node, t2), "PSC201 to reach the node")
        assert link_rows(node, me)[0]["version"] == "0.1"

        pub = await wamp_connect(node.wamp_url)
        await publish_acked(pub, t1, {"a": 1})
        assert recv_json(ws) == [301, t1, {"a": 1}]

        await publish_acked(pub, other, {"a": 2})
        await publish_acked(pub, t2, "marker")
        assert recv_json(ws) == [301, t2, "marker"], "a topic we never subscribed arrived"

        send_json(ws, [202, t1])
        await until(lambda: me not in interest(node, t1), "PSC202 to reach the node")
        await publish_acked(pub, t1, "after unsubscribe")
        await publish_acked(pub, t2, "marker 2")
        assert recv_json(ws) == [301, t2, "marker 2"], "t1 still arrives after PSC202"
        await leave(pub)


@pytest_twisted.ensureDeferred
async def test_v02_consumer_gets_metadata(node: NodeProcess) -> None:
    """Offering 0.1 and 0.2 selects 0.2, whose PSC301 carries origin, time and message id."""
    topic = "v02.topic"
    with dial(node) as ws:
        send_json(ws, [101, [0, 1], [0, 2]])
        assert recv_json(ws) == [102, [0, 2]]
        send_json(ws, [201, topic])
        me = peer_name(ws)
        await until(lambda: me in interest(node, topic), "PSC201 to reach the node")

        pub = await wamp_connect(node.wamp_url)
        before = time.time()
        await publish_acked(pub, topic, {"a": 1})
        await publish_acked(pub, topic, 1, 2, k=3)
        first, second = recv_json(ws), recv_json(ws)
        await leave(pub)

    assert len(first) == 4, first
    assert first[:3] == [301, topic, {"a": 1}]
    meta = first[3]
    assert meta["o"] == node.name
    assert type(meta["t"]) in (int, float) and before - 60 < meta["t"] < time.time() + 60, meta
    assert isinstance(meta["i"], str) and meta["i"], meta
    assert "w" not in meta, "a single positional arg is sent as itself, not wrapped"
    # args + kwargs travel as a wrapper flagged with "w": 1.
    assert second[:3] == [301, topic, {"args": [1, 2], "kwargs": {"k": 3}}]
    assert second[3]["w"] == 1 and second[3]["o"] == node.name
    assert second[3]["i"] != meta["i"]


@pytest_twisted.ensureDeferred
async def test_v05_consumer_gets_what_its_patterns_match(node: NodeProcess) -> None:
    """A 0.5 consumer's patterns (in PSC103, then PSC203) select its PSC301s; a bad pattern closes with 4400."""
    with dial(node) as ws:
        send_json(ws, [101, [0, 1], [0, 2], [0, 3], [0, 4], [0, 5]])
        assert recv_json(ws) == [102, [0, 5]]
        send_json(ws, [103, None, 0, [], [["wildcard", "w05..temp"]]])
        position = recv_json(ws)
        assert position[0] == 104 and position[2:] == [0, 0]
        me = peer_name(ws)
        await until(lambda: link_rows(node, me)[0]["patterns"] == 1, "PSC103 patterns to reach the node")

        pub = await wamp_connect(node.wamp_url)
        await publish_acked(pub, "w05.k.humidity", "unwanted")
        await publish_acked(pub, "w05.k.temp", "wanted")
        first = recv_json(ws)
        assert first[:3] == [301, "w05.k.temp", "wanted"] and first[3]["s"] == 1, first

        send_json(ws, [203, "prefix", "p05."])
        await until(lambda: link_rows(node, me)[0]["patterns"] == 2, "PSC203 to reach the node")
        await publish_acked(pub, "p0", "unwanted")
        await publish_acked(pub, "p05.x", "prefixed")
        second = recv_json(ws)
        assert second[:3] == [301, "p05.x", "prefixed"] and second[3]["s"] == 2, second
        await leave(pub)

        send_json(ws, [203, "regex", "p.*"])
        code, reason = close_of(ws)
    assert code == 4400
    assert reason == "bad PSC message: PSC203: pattern match must be 'prefix' or 'wildcard', got 'regex'"


def test_no_common_version_closes_with_4406(node: NodeProcess) -> None:
    """A consumer offering only unknown versions is closed with 4406 "no common version"."""
    with dial(node) as ws:
        send_json(ws, [101, [9, 9]])
        code, reason = close_of(ws)
    assert code == 4406, (code, reason)
    assert "no common version" in (reason or ""), reason


# -- junk from a peer ---------------------------------------------------------


JUNK = {
    "not-json": (True, "this is not JSON", "not JSON"),
    "unknown-type": (True, "[999]", "unknown message type 999"),
    "short-psc301": (True, "[301]", "PSC301 takes 2 parameters"),
    "binary-frame": (True, b"\x00\x01[201]", "binary frames"),
    "psc201-before-handshake": (False, '[201,"x"]', "unexpected Subscribe"),
}


@pytest.mark.parametrize("case", list(JUNK))
@pytest_twisted.ensureDeferred
async def test_junk_closes_only_that_link(node: NodeProcess, case: str) -> None:
    """Junk on one PSC link closes it with 4400 and a reason; other links and WAMP clients carry on."""
    handshake, junk, problem = JUNK[case]
    topic = f"junk.{case.replace('-', '_')}"
    sub = await wamp_connect(node.wamp_url)
    pub = await wamp_connect(node.wamp_url)
    local, _ = await subscribe(sub, topic)
    with consumer_link(node, [0, 1]) as good:
        send_json(good, [201, topic])
        good_name = peer_name(good)
        await until(lambda: good_name in interest(node, topic), "the good link's PSC201")

        with consumer_link(node, [0, 1]) if handshake else dial(node) as bad:
            bad_name = peer_name(bad)
            bad.send(junk)
            code, reason = close_of(bad)
        assert code == 4400, (code, reason)
        assert problem in (reason or ""), reason
        await until(lambda: not link_rows(node, bad_name), "the bad link to leave /stats")

        await publish_acked(pub, topic, "still working")
        assert recv_json(good) == [301, topic, "still working"]
        await local.wait_for(1)
        assert local.args == ["still working"]
        assert [row["state"] for row in link_rows(node, good_name)] == ["open"]
    await leave(sub, pub)


def test_oversize_frame_closes_with_1009(node: NodeProcess) -> None:
    """A message over the link frame limit (--max-message-size + --link-headroom) is refused with close code 1009."""
    with consumer_link(node, [0, 1]) as ws:
        me = peer_name(ws)
        ws.send(json.dumps([201, "x" * (MAX_MESSAGE + 64 * 1024)]))
        code, reason = close_of(ws)
    assert code == 1009, (code, reason)
    wait_until(lambda: not link_rows(node, me), "the refused link to leave /stats")


# -- the raw peer is the producer ---------------------------------------------


@pytest_twisted.ensureDeferred
async def test_dialling_node_is_a_consumer(raw_server: RawPSCServer, spawn: Callable[..., NodeProcess]) -> None:
    """A node dialling a producer offers 0.1 to 0.8, sends its interest, delivers PSC301 and pings."""
    dialer = spawn("dialer", peers=(raw_server.url,))
    link = raw_server.accept()
    assert recv_json(link) == [101, [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [0, 8]]

    # Subscribed before the handshake completes: sent in the initial bulk PSC201.
    sub = await wamp_connect(dialer.wamp_url)
    early, _ = await subscribe(sub, "prod.early")
    send_json(link, [102, [0, 1]])
    assert recv_json(link) == [201, "prod.early"]
    await until(lambda: [r["state"] for r in link_rows(dialer, RawPSCServer.NODE_ID)] == ["open"], "link open")
    assert link_rows(dialer, RawPSCServer.NODE_ID)[0]["version"] == "0.1"

    rec, subscription = await subscribe(sub, "prod.x")
    assert recv_json(link) == [201, "prod.x"]
    send_json(link, [301, "prod.x", {"hello": 1}])
    await rec.wait_for(1)
    assert rec.events == [(({"hello": 1},), {})]
    assert early.events == []

    await subscription.unsubscribe()
    assert recv_json(link) == [202, "prod.x"]
    await leave(sub)

    # The spec: the dialling side pings every five seconds.
    assert link.pinged.wait(PING_SECONDS), f"no WebSocket ping from the dialling node within {PING_SECONDS} s"


@pytest_twisted.ensureDeferred
async def test_consumers_listen_mode_node_speaks_first(spawn: Callable[..., NodeProcess]) -> None:
    """With --listen-role consumer, the node sends PSC101 to a producer that dials it, unprompted."""
    listener = spawn("listener", listen_role="consumer")
    sub = await wamp_connect(listener.wamp_url)
    rec, _ = await subscribe(sub, "cl.topic")
    with dial(listener) as ws:
        assert recv_json(ws) == [101, [0, 1], [0, 2], [0, 3], [0, 4], [0, 5], [0, 6], [0, 7], [0, 8]]
        send_json(ws, [102, [0, 2]])
        assert recv_json(ws) == [201, "cl.topic"]
        send_json(ws, [301, "cl.topic", {"hello": 2}, {"o": "rawpeer", "t": time.time(), "i": "rawpeer-1"}])
        await rec.wait_for(1)
        assert rec.args == [{"hello": 2}]
        me = peer_name(ws)
        rows = [(r["role"], r["direction"], r["version"]) for r in link_rows(listener, me)]
        assert rows == [("consumer", "in", "0.2")]
    await leave(sub)
