"""Helpers for raw WebSocket peers written with the independent ``websockets`` library."""

from __future__ import annotations

import json
import time
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.sync.server import ServerConnection

from helpers.nodes import NodeProcess

#: Upper bound for one wait on a raw connection.
RECV_SECONDS = 5.0


def recv_json(ws: ClientConnection | ServerConnection, timeout: float = RECV_SECONDS, what: str = "message") -> Any:
    """The next text message from the peer, decoded; ``what`` names it when none comes within ``timeout``."""
    try:
        data = ws.recv(timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"no {what} from the node within {timeout} s") from None
    assert isinstance(data, str), f"the node sent a binary frame: {data!r:.80}"
    return json.loads(data)


def close_of(ws: ClientConnection, timeout: float = RECV_SECONDS) -> tuple[int | None, str | None]:
    """Read until the node closes; its close (code, reason), or (None, None) if it sent no close frame."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"the node did not close within {timeout} s")
        try:
            ws.recv(timeout=remaining)
        except TimeoutError:
            continue
        except ConnectionClosed as e:
            return (None, None) if e.rcvd is None else (e.rcvd.code, e.rcvd.reason)


class SocketWebSocket:
    """A bare WebSocket client on a plain socket, written from RFC 6455: it reads only when told to.

    The ``websockets`` client reads in a background thread, so it can never
    play a client that stops reading; this one can. ``rcvbuf`` shrinks the
    socket's receive buffer so the node's writes back up sooner.
    """

    def __init__(self, port: int, path: str, protocol: str | None = None, rcvbuf: int | None = None) -> None:
        import base64
        import os
        import socket

        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(RECV_SECONDS)
        self.sock.connect(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if protocol is not None:
            lines.append(f"Sec-WebSocket-Protocol: {protocol}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self._buffer = b""
        while b"\r\n\r\n" not in self._buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise AssertionError("the node closed during the WebSocket handshake")
            self._buffer += chunk
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head

    def send_text(self, text: str | bytes) -> None:
        """Send one masked text frame."""
        import os
        import struct

        data = text.encode() if isinstance(text, str) else text
        mask = os.urandom(4)
        n = len(data)
        if n < 126:
            header = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(header + mask + masked)

    def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("the node closed the connection")
            self._buffer += chunk
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def recv_text(self) -> str:
        """The next data frame's text (control frames are skipped)."""
        import struct

        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            payload = self._read(n)
            if first & 0x0F in (1, 2):
                return payload.decode()
            if first & 0x0F == 8:
                raise ConnectionResetError(f"the node closed: {payload[:2]!r} {payload[2:]!r}")

    def closed_by_peer(self, timeout: float = RECV_SECONDS) -> bool:
        """Drain everything the node sent; True once it has closed (or reset) the TCP connection."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(1 << 20):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


class Wamp(SocketWebSocket):
    """A WAMP v2 JSON session on a bare socket."""

    def __init__(self, node: NodeProcess, rcvbuf: int | None = None) -> None:
        super().__init__(node.wamp_port, "/ws", "wamp.2.json", rcvbuf)
        self.request = 0
        self.send_text(json.dumps([1, "realm1", {"roles": {"subscriber": {}, "publisher": {}}}]))
        assert json.loads(self.recv_text())[0] == 2  # WELCOME

    def subscribe(self, topic: str) -> None:
        """SUBSCRIBE and wait for SUBSCRIBED."""
        self.request += 1
        self.send_text(json.dumps([32, self.request, {}, topic]))
        assert json.loads(self.recv_text())[0] == 33

    def publish(self, topic: str, *args: object, acknowledge: bool = False) -> None:
        """PUBLISH (and wait for PUBLISHED when acknowledged)."""
        self.request += 1
        options = {"acknowledge": True} if acknowledge else {}
        self.send_text(json.dumps([16, self.request, options, topic, list(args)]))
        if acknowledge:
            assert json.loads(self.recv_text())[0] == 17

    def next_event(self) -> list[object]:
        """The args of the next EVENT."""
        while True:
            msg = json.loads(self.recv_text())
            if msg[0] == 36:
                return list(msg[4])
