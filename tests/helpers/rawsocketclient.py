"""A WAMP RawSocket client on a plain socket, written from the spec (handshake octets, length-prefixed frames)."""

from __future__ import annotations

import socket
import struct
import time


def read_exactly(sock: socket.socket, n: int, timeout: float | None = None) -> bytes:
    """``n`` octets from ``sock``, however the node splits them; fails if the node closes first (or ``timeout``)."""
    if timeout is not None:
        sock.settimeout(timeout)
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "the node closed the connection"
        out += chunk
    return out


class Raw:
    """A RawSocket client on a plain socket."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)

    def handshake(self, octet2: int, reserved: bytes = b"\x00\x00", magic: int = 0x7F) -> bytes:
        """Send the 4 octets; the server's 4 octets (b"" if it closed without an answer)."""
        self.sock.sendall(bytes([magic, octet2]) + reserved)
        return self.read(4)

    def read(self, n: int) -> bytes:
        data = b""
        deadline = time.monotonic() + 5
        while len(data) < n and time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(n - len(data))
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
        return data

    def frame(self, kind: int, payload: bytes) -> None:
        self.sock.sendall(struct.pack("!I", (kind << 24) | len(payload)) + payload)

    def next_frame(self) -> tuple[int, bytes]:
        header = self.read(4)
        assert len(header) == 4, "connection closed"
        (word,) = struct.unpack("!I", header)
        return word >> 24, self.read(word & 0xFFFFFF)

    def closed(self) -> bool:
        """True once the server closed the connection (reads drain what is left)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if not self.sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
            except TimeoutError:
                return False
        return False
