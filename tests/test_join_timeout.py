"""Connections that never open a WAMP session are closed after ``--wamp-join-timeout``; joined ones are not.

Each stage has the clock: a TCP connection with no HTTP request, a WebSocket
upgrade with no HELLO, a RawSocket connection with no handshake, a RawSocket
handshake with no HELLO. A session that joined before the idle ones were
closed still publishes and receives afterwards.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import orjson
import pytest
import pytest_twisted
from helpers.nodes import NodeProcess, share_logs, unshare_logs
from helpers.ports import free_port
from helpers.rawsocketclient import Raw
from helpers.rawws import close_of
from helpers.wampclient import connect as wamp_connect
from helpers.wampclient import leave, publish_acked, subscribe
from twisted.internet import threads
from websockets.sync.client import connect as ws_connect

pytestmark = pytest.mark.slow

#: The join timeout the node runs with; every wait below is bounded by WAIT.
JOIN_TIMEOUT = 0.5
WAIT = 10.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with a short join timeout, serving WebSocket and RawSocket (shared: each test has its own connections)."""
    raw_port = free_port()
    started = NodeProcess(
        "joins",
        tmp_path_factory.mktemp("joins"),
        extra=("--wamp-join-timeout", str(JOIN_TIMEOUT), "--rawsocket", f"tcp:{raw_port}:interface=127.0.0.1"),
    )
    started.raw_port = raw_port  # type: ignore[attr-defined]
    share_logs([started])
    try:
        yield started.start()
    finally:
        started.stop()
        unshare_logs([started])


def closed_by_server(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (fails after WAIT)."""
    start = time.monotonic()
    sock.settimeout(WAIT)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the node kept an idle connection open for {WAIT} s") from None
    return time.monotonic() - start


def test_tcp_connection_without_a_request_is_closed(node: NodeProcess) -> None:
    """A client that connects to the WAMP port and says nothing is closed."""
    with socket.create_connection(("127.0.0.1", node.wamp_port)) as sock:
        assert closed_by_server(sock) >= JOIN_TIMEOUT * 0.9


def test_websocket_without_hello_is_aborted(node: NodeProcess) -> None:
    """A WebSocket that never sends HELLO gets ABORT wamp.error.timeout, then the close."""
    with ws_connect(node.wamp_url, subprotocols=["wamp.2.json"]) as ws:  # type: ignore[list-item]
        abort = orjson.loads(ws.recv(timeout=WAIT))
        assert abort[0] == 3 and abort[2] == "wamp.error.timeout", abort
        assert "no WELCOME within 0.5 s" in abort[1]["message"]
        close_of(ws, WAIT)


def test_rawsocket_without_handshake_or_hello_is_closed(node: NodeProcess) -> None:
    """RawSocket: no handshake -> closed; a handshake but no HELLO -> ABORT, then closed."""
    port = node.raw_port  # type: ignore[attr-defined]
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert closed_by_server(sock) >= JOIN_TIMEOUT * 0.9
    raw = Raw(port)
    raw.sock.settimeout(WAIT)
    assert raw.handshake((0xF << 4) | 1) == bytes([0x7F, (11 << 4) | 1, 0, 0])
    kind, payload = raw.next_frame()
    assert kind == 0 and orjson.loads(payload)[2] == "wamp.error.timeout"
    assert raw.closed()


@pytest_twisted.ensureDeferred
async def test_a_joined_session_outlives_the_timeout(node: NodeProcess) -> None:
    """A session that joined is not timed: after an idle connection was closed, it still works."""
    session, publisher = await wamp_connect(node.wamp_url), await wamp_connect(node.wamp_url)
    received, _ = await subscribe(session, "com.example.alive")
    idle = socket.create_connection(("127.0.0.1", node.wamp_port))
    try:
        await threads.deferToThread(closed_by_server, idle)  # longer than the join timeout has passed
    finally:
        idle.close()
    await publish_acked(publisher, "com.example.alive", "still here")
    await received.wait_for(1)
    assert received.args == ["still here"]
    await leave(session, publisher)
