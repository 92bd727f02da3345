"""WAMP over RawSocket (--rawsocket): Autobahn clients with rs:// and a raw client written from the spec."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.rawsocket import WampRawSocketClientFactory
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.serializer import JsonSerializer, MsgPackSerializer
from autobahn.wamp.types import ComponentConfig
from helpers.nodes import NodeProcess, share_logs, unshare_logs
from helpers.ports import free_port
from helpers.rawsocketclient import Raw
from helpers.wampclient import TIMEOUT, leave, publish_acked, subscribe
from helpers.wampclient import connect as ws_connect
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node serving WAMP over WebSocket and over RawSocket (shared: each test has its own connections)."""
    raw_port = free_port()
    extra = ("--rawsocket", f"tcp:{raw_port}:interface=127.0.0.1")
    started = NodeProcess("raw", tmp_path_factory.mktemp("rawsocket"), extra=extra)
    started.raw_port = raw_port  # type: ignore[attr-defined]
    share_logs([started])
    try:
        started.start()
        assert started.ready["rawsocket"] == f"rs://127.0.0.1:{raw_port}"
        yield started
    finally:
        started.stop()
        unshare_logs([started])


async def rs_connect(port: int, serializer: str) -> ApplicationSession:
    """An Autobahn-Python session over RawSocket."""
    joined: defer.Deferred[ApplicationSession] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onJoin(self, details: Any) -> None:
            joined.callback(self)

    ser = {"json": JsonSerializer(), "msgpack": MsgPackSerializer()}[serializer]
    factory = WampRawSocketClientFactory(lambda: Session(ComponentConfig("realm1")), serializer=ser)
    await TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=5).connect(factory)
    joined.addTimeout(TIMEOUT, reactor)
    return await joined


@pytest.mark.parametrize("serializer", ["json", "msgpack"])
@pytest_twisted.ensureDeferred
async def test_autobahn_rawsocket_clients_meet_websocket_clients(node: NodeProcess, serializer: str) -> None:
    """An rs:// publisher reaches a WebSocket subscriber and the other way round, args and kwargs intact."""
    raw = await rs_connect(node.raw_port, serializer)  # type: ignore[attr-defined]
    web = await ws_connect(node.wamp_url)
    web_rec, _ = await subscribe(web, "com.example.raw")
    raw_rec, _ = await subscribe(raw, "com.example.web")
    await publish_acked(raw, "com.example.raw", "from rs", n=1)
    await publish_acked(web, "com.example.web", {"from": "ws"})
    await web_rec.wait_for(1)
    await raw_rec.wait_for(1)
    assert web_rec.events == [(("from rs",), {"n": 1})]
    assert raw_rec.args == [{"from": "ws"}]
    await leave(raw, web)


# -- a raw client from the spec --------------------------------------------------------------


def test_handshake_negotiates_serializer_and_length(node: NodeProcess) -> None:
    """JSON (1), MessagePack (2) and CBOR (3) are answered with the server's LENGTH (1 MiB -> 11) and the serializer."""
    for serializer in (1, 2, 3):
        raw = Raw(node.raw_port)  # type: ignore[attr-defined]
        assert raw.handshake((0xF << 4) | serializer) == bytes([0x7F, (11 << 4) | serializer, 0, 0])


@pytest.mark.parametrize(
    ("octet2", "reserved", "answer"),
    [
        ((0xF << 4) | 4, b"\x00\x00", bytes([0x7F, 1 << 4, 0, 0])),  # 4 (FlatBuffers): not offered
        ((0xF << 4) | 0, b"\x00\x00", bytes([0x7F, 1 << 4, 0, 0])),  # 0 is illegal
        ((0xF << 4) | 1, b"\x01\x00", bytes([0x7F, 3 << 4, 0, 0])),  # reserved bits
    ],
)
def test_handshake_errors_are_answered_then_closed(
    node: NodeProcess, octet2: int, reserved: bytes, answer: bytes
) -> None:
    """An unsupported serializer gets error 1, reserved bits error 3; then the server closes."""
    raw = Raw(node.raw_port)  # type: ignore[attr-defined]
    assert raw.handshake(octet2, reserved) == answer
    assert raw.closed()


def test_not_rawsocket_is_dropped_without_an_answer(node: NodeProcess) -> None:
    """A first octet other than 0x7F (here an HTTP request) is not RawSocket: closed with no reply."""
    raw = Raw(node.raw_port)  # type: ignore[attr-defined]
    assert raw.handshake(ord("E"), b"T ", magic=ord("G")) == b""


def test_ping_pong_hello_welcome_and_bad_frames(node: NodeProcess) -> None:
    """PING gets a PONG with its payload; HELLO gets WELCOME; junk gets ABORT; an oversize frame closes."""
    raw = Raw(node.raw_port)  # type: ignore[attr-defined]
    assert raw.handshake((0xF << 4) | 1)[0] == 0x7F
    raw.frame(1, b"are you there")
    assert raw.next_frame() == (2, b"are you there")
    raw.frame(0, json.dumps([1, "realm1", {"roles": {"subscriber": {}}}]).encode())
    kind, payload = raw.next_frame()
    assert kind == 0 and json.loads(payload)[0] == 2  # WELCOME
    raw.frame(0, b"not json at all")
    kind, payload = raw.next_frame()
    assert kind == 0 and json.loads(payload)[0] == 3  # ABORT
    other = Raw(node.raw_port)  # type: ignore[attr-defined]
    assert other.handshake((0xF << 4) | 1)[0] == 0x7F
    other.sock.sendall(struct.pack("!I", 2**20 + 1))  # longer than the server's 1 MiB
    assert other.closed()
    third = Raw(node.raw_port)  # type: ignore[attr-defined]
    assert third.handshake((0xF << 4) | 1)[0] == 0x7F
    third.frame(7, b"")  # unknown frame type
    assert third.closed()
