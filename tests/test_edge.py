"""The connection layer against a real node: ping floods, deadlines on every listener, caps, idle subscribers.

Clients are bare sockets that read only when told to (and the ``websockets``
library for a client that answers pings by itself). Loops are bounded in
count and time.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from helpers.nodes import NodeProcess
from helpers.polling import wait_until
from helpers.rawws import Wamp

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
#: The node's pending-bytes cap here (default 16 MiB).
CAP = 1 * MiB
#: What a node may grow by beyond its cap while it works.
MARGIN = 24 * MiB
#: Per-address cap given to the node.
PER_ADDRESS = 8


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with every listener, short deadlines (1 s handshake, 3 s idle, pings after 0.5 s) and a 1 MiB cap."""
    tmp = tmp_path_factory.mktemp("edge")
    n = NodeProcess(
        "edge",
        tmp,
        extra=(
            "--rawsocket", "tcp:0:interface=127.0.0.1",
            "--max-send-buffer", str(CAP),
            "--wamp-join-timeout", "0.5",
            "--edge-handshake-timeout", "1",
            "--edge-idle-timeout", "3",
            "--edge-ping-interval", "0.5",
            "--edge-max-per-address", str(PER_ADDRESS),
        ),  # fmt: skip
        frontends=True,
    ).start()
    yield n
    n.stop()


def _port(node: NodeProcess, key: str) -> int:
    return int(node.ready[key].rsplit(":", 1)[1].split("/", 1)[0])


def _closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the node sent until it closed the connection; fails if it stays open ``timeout`` s."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"still open after {timeout} s; got {got[:80]!r}") from None
    return got


def _rawsocket(node: NodeProcess, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", _port(node, "rawsocket")))
    sock.sendall(bytes([0x7F, 0xF1, 0, 0]))  # JSON, 16 MiB messages
    assert sock.recv(4)[:1] == b"\x7f"
    return sock


def _flood(send: callable, limit_bytes: int = 64 * MiB, seconds: float = 30.0) -> int:  # type: ignore[valid-type]
    """Call ``send`` until the node drops the connection (returns bytes sent), bounded in bytes and time."""
    sent, deadline = 0, time.monotonic() + seconds
    while sent < limit_bytes and time.monotonic() < deadline:
        try:
            sent += send()
        except (BrokenPipeError, ConnectionResetError):
            return sent
        except TimeoutError:
            continue
    raise AssertionError(f"not dropped after {sent} bytes")


def test_rawsocket_ping_flood_from_a_client_that_never_reads_is_dropped(node: NodeProcess) -> None:
    """RawSocket PINGs whose PONGs are never read: dropped as a slow consumer at the cap, counted; RSS bounded."""
    sock = _rawsocket(node, rcvbuf=4096)
    ping = struct.pack("!I", (1 << 24) | 65536) + b"p" * 65536
    before = node.rss()
    _flood(lambda: sock.send(ping))
    sock.close()
    assert node.rss() - before < CAP + MARGIN
    assert node.metric("pubsubclub_disconnects_total", frontend="rawsocket", reason="slow_consumer") == 1
    Wamp(node).close()  # the node still serves


def test_websocket_ping_flood_from_a_wamp_client_that_never_reads_is_dropped(node: NodeProcess) -> None:
    """WebSocket pings on a WAMP session whose pongs are never read: dropped at the cap, counted; RSS bounded."""
    client = Wamp(node, rcvbuf=4096)
    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"p" * 125))
    ping = bytes([0x89, 0x80 | 125]) + mask + payload
    batch = ping * 64
    before = node.rss()
    _flood(lambda: client.sock.send(batch))
    client.close()
    assert node.rss() - before < CAP + MARGIN
    assert node.metric("pubsubclub_disconnects_total", frontend="wamp", reason="slow_consumer") == 1
    Wamp(node).close()


HALF_SENT = {
    "wamp": b"GET /ws HTTP/1.1\r\nHost: x\r\n",
    "tep": b"GET /tep HTTP/1.1\r\nHost: x\r\n",
    "psc": b"GET /psc HTTP/1.1\r\nHost: x\r\n",
    "ops": b"GET /health HTTP/1.1\r\n",
    "nsd": b'{"_class": "OpenRequ',
    "stream": b"\x00",
    "rawsocket": b"\x7f",
}


@pytest.mark.parametrize("listener", sorted(HALF_SENT))
@pytest.mark.parametrize("sends", ["nothing", "half"])
def test_idle_and_half_sent_connections_are_closed_by_the_deadline(
    node: NodeProcess, listener: str, sends: str
) -> None:
    """A connection that sends nothing, or half a first request, is closed by the deadline; a new client joins."""
    port = {"ops": node.http_port, "psc": node.psc_port, "wamp": node.wamp_port}.get(listener) or _port(node, listener)
    sock = socket.create_connection(("127.0.0.1", port))
    if sends == "half":
        sock.sendall(HALF_SENT[listener])
    started = time.monotonic()
    _closed(sock, timeout=10)
    assert time.monotonic() - started < 5
    sock.close()
    Wamp(node).close()


@pytest.mark.parametrize("listener", ["nsd", "stream", "tep", "psc", "ops"])
def test_listeners_without_their_own_timer_count_the_guards_close(node: NodeProcess, listener: str) -> None:
    """On listeners with no handshake timer of their own, the guard's close is counted as handshake_timeout."""
    port = {"ops": node.http_port, "psc": node.psc_port}.get(listener) or _port(node, listener)
    before = node.metric("pubsubclub_disconnects_total", frontend=listener, reason="handshake_timeout")
    sock = socket.create_connection(("127.0.0.1", port))
    _closed(sock)
    sock.close()
    after = node.metric("pubsubclub_disconnects_total", frontend=listener, reason="handshake_timeout")
    assert after == before + 1


def test_nsd_line_left_half_sent_after_a_request_is_closed(node: NodeProcess) -> None:
    """After a first request, an NSD client that leaves half a line and goes silent is closed (partial input)."""
    sock = socket.create_connection(("127.0.0.1", node.nsd_port))
    sock.sendall(b'{"_class": "OpenRequest", "identity": "edge.half"}\n')
    sock.settimeout(10)
    assert b"Response" in sock.recv(65536)
    sock.sendall(b'{"_class": "PublishRequest", "message": {"body": "' + b"x" * 60_000)
    _closed(sock)
    sock.close()
    assert node.metric("pubsubclub_disconnects_total", frontend="nsd", reason="partial_input_timeout") >= 1


REFUSALS = {
    "wamp": b"HTTP/1.1 503 ",
    "rawsocket": bytes([0x7F, 0x40, 0, 0]),
    "nsd": b'{"_class":"ErrorResponse","error":"TOO MANY CONNECTIONS"}\n',
}


@pytest.mark.parametrize("listener", sorted(REFUSALS))
def test_per_address_cap_is_refused_with_the_protocols_error(node: NodeProcess, listener: str) -> None:
    """Past the per-address cap a connection gets its protocol's refusal and is closed; counted."""
    port = node.wamp_port if listener == "wamp" else _port(node, listener)
    before = node.metric("pubsubclub_refused_connections_total", listener=listener, reason="address_cap")
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(PER_ADDRESS)]
    try:
        extra = socket.create_connection(("127.0.0.1", port))
        answer = _closed(extra, timeout=5)
        extra.close()
    finally:
        for sock in held:
            sock.close()
    assert answer.startswith(REFUSALS[listener]), answer[:80]
    after = node.metric("pubsubclub_refused_connections_total", listener=listener, reason="address_cap")
    assert after == before + 1


def test_idle_subscriber_that_answers_pings_is_not_dropped(node: NodeProcess) -> None:
    """A quiet WAMP subscriber that answers pings outlives the idle deadline; one that does not is dropped."""
    from websockets.sync.client import connect

    before = node.metric("pubsubclub_disconnects_total", frontend="wamp", reason="idle_timeout")
    with connect(node.wamp_url, subprotocols=["wamp.2.json"], ping_interval=None) as ws:  # type: ignore[list-item]
        ws.send(json.dumps([1, "realm1", {"roles": {"subscriber": {}}}]))
        assert json.loads(ws.recv(timeout=10))[0] == 2
        ws.send(json.dumps([32, 1, {}, "edge.quiet"]))
        assert json.loads(ws.recv(timeout=10))[0] == 33
        deaf = Wamp(node)  # joined, then never reads or answers a ping
        wait_until(
            lambda: node.metric("pubsubclub_disconnects_total", frontend="wamp", reason="idle_timeout") > before,
            "the deaf session to be dropped as idle",
            timeout=20,
        )
        deaf.close()
        publisher = Wamp(node)
        publisher.publish("edge.quiet", "marker", acknowledge=True)
        event = json.loads(ws.recv(timeout=10))
        assert event[0] == 36 and event[4] == ["marker"]
        publisher.close()
