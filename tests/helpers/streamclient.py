"""A stream-protocol client on a plain socket, using the codec's client side; every wait is bounded."""

from __future__ import annotations

import socket
import time

from pubsubclub.frontends.stream import codec as c

#: Upper bound for one wait on a stream connection.
RECV_SECONDS = 10.0


class StreamClient:
    """One connection to a node's stream listener."""

    def __init__(self, port: int, host: str = "127.0.0.1", rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, port))
        self.decoder = c.ClientDecoder()
        self.pending: list[c.ServerEvent] = []

    def send(self, *events: c.ClientRequest) -> None:
        """Send requests (encoded with the codec)."""
        self.sock.sendall(b"".join(c.encode(e) for e in events))

    def raw(self, data: bytes) -> None:
        """Send raw bytes."""
        self.sock.sendall(data)

    def recv(self, n: int = 1, timeout: float = RECV_SECONDS) -> list[c.ServerEvent]:
        """The next ``n`` events from the node."""
        deadline = time.monotonic() + timeout
        while len(self.pending) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"only {len(self.pending)} of {n} stream events within {timeout} s")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                raise AssertionError(f"connection closed after {len(self.pending)} of {n} events")
            self.decoder.receive(data)
            self.pending.extend(self.decoder.events())
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def one(self) -> c.ServerEvent:
        """The next event."""
        return self.recv(1)[0]

    def closed(self, timeout: float = RECV_SECONDS) -> list[c.ServerEvent]:
        """Read until the node closes; what came before the close."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError("the node did not close the connection")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                out, self.pending = self.pending, []
                return out
            self.decoder.receive(data)
            self.pending.extend(self.decoder.events())

    def connect(self, name: str = "test", group: str = "g") -> None:
        """Connect and expect OK."""
        self.send(c.Connect(name, group))
        assert self.one() == OK

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()


OK = c.Status(True)


def error(code: c.ErrorCode) -> object:
    """Matches an ERROR status with ``code`` (any message)."""

    class _Error:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, c.Status) and not other.ok and other.code == int(code)

        def __repr__(self) -> str:
            return f"<ERROR {int(code)}>"

    return _Error()
