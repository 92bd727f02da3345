"""``pubsubclub bench --scenario calls --client lean``: a caller and a callee cheap enough to measure the servers.

Autobahn-Python spends about as much CPU per call in each client as both
nodes together (docs/benchmarks.md), and the machine has two cores. These
clients speak WAMP JSON over WebSocket, like the Autobahn ones, on blocking
sockets with orjson, one process each:

* the **callee** registers :data:`~pubsubclub.bench.calls.PROCEDURE` and
  answers each INVOCATION with a YIELD of its arguments, every answer of one
  read in one ``sendall``;
* the **caller** keeps ``window`` calls in flight (throughput) or sends them
  paced at ``rate`` per second, timing each from CALL to RESULT (latency);
  RESULTs are recognised by their ``[50,`` prefix, their request id read in
  place, without decoding the rest.

Frames a client sends are masked with a zero key: RFC 6455 requires the mask
bit on every client frame, and the key only protects intermediaries from
browser scripts; a zero key leaves the payload as it is and costs nothing.
"""

from __future__ import annotations

import base64
import os
import select
import socket
import struct
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

_CALL = 48
_RESULT = b"[50,"
_ERROR = b"[8,"
_INVOCATION = b"[68,"
_ZERO_MASK = b"\0\0\0\0"


class WebSocketSession:
    """A WAMP session (JSON) over a minimal WebSocket client on a blocking socket."""

    def __init__(self, url: str, realm: str, roles: dict[str, Any], deadline: float) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self.deadline = deadline
        self.sock = socket.create_connection((host, port), timeout=max(deadline - time.time(), 1))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
            .encode()
        )  # fmt: skip
        self._buffer = bytearray()
        while b"\r\n\r\n" not in self._buffer:
            self._fill()
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"WebSocket upgrade refused: {head[:200]!r}")
        self._buffer = bytearray(rest)
        self.send(orjson.dumps([1, realm, {"roles": roles}]))
        welcome = orjson.loads(self.next_message())
        if welcome[0] != 2:
            raise RuntimeError(f"no WELCOME: {welcome!r}")

    @staticmethod
    def frame(payload: bytes) -> bytes:
        """One text frame, masked with the zero key."""
        n = len(payload)
        if n < 126:
            return bytes((0x81, 0x80 | n)) + _ZERO_MASK + payload
        if n < 65536:
            return bytes((0x81, 0x80 | 126)) + struct.pack("!H", n) + _ZERO_MASK + payload
        return bytes((0x81, 0x80 | 127)) + struct.pack("!Q", n) + _ZERO_MASK + payload

    def send(self, payload: bytes) -> None:
        """Send one WAMP message."""
        self.sock.sendall(self.frame(payload))

    def _fill(self, timeout: float | None = None) -> bool:
        """Read what is there (waiting at most ``timeout`` s, or until the deadline); whether anything came."""
        left = self.deadline - time.time()
        if left <= 0:
            raise TimeoutError("the bench's time bound passed")
        if timeout is not None and not select.select([self.sock], [], [], min(timeout, left))[0]:
            return False
        self.sock.settimeout(left)
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data
        return True

    def messages(self, timeout: float | None = None) -> list[bytes]:
        """The complete WAMP messages after one read (none if nothing came within ``timeout``)."""
        if not self._fill(timeout):
            return []
        buffer, out, pos, end = self._buffer, [], 0, len(self._buffer)
        while end - pos >= 2:
            opcode, length, start = buffer[pos] & 0x0F, buffer[pos + 1] & 0x7F, pos + 2
            if length == 126:
                if end - pos < 4:
                    break
                length, start = struct.unpack_from("!H", buffer, pos + 2)[0], pos + 4
            elif length == 127:
                if end - pos < 10:
                    break
                length, start = struct.unpack_from("!Q", buffer, pos + 2)[0], pos + 10
            if end - start < length:
                break
            payload = bytes(buffer[start : start + length])
            if opcode == 0x1 or opcode == 0x2:
                out.append(payload)
            elif opcode == 0x9:  # PING: answer with a PONG carrying its payload
                self.sock.sendall(bytes((0x8A, 0x80 | len(payload))) + _ZERO_MASK + payload)
            elif opcode == 0x8:
                raise ConnectionError(f"the server closed the WebSocket: {payload[2:]!r}")
            pos = start + length
        del buffer[:pos]
        return out

    def next_message(self) -> bytes:
        """The next WAMP message."""
        while True:
            got = self.messages()
            if got:
                # Only used in the handshakes, where one message is awaited at a time.
                return got[0]


def _request_id(msg: bytes) -> int:
    """The request id of a RESULT or INVOCATION (the second element), read in place."""
    return int(msg[4 : msg.index(b",", 4)])


def callee(url: str, realm: str, procedure: str, max_seconds: float, ready: Any, stop: Any) -> dict[str, Any]:
    """Register ``procedure`` and echo every invocation until ``stop()`` or the time bound; the counts."""
    session = WebSocketSession(url, realm, {"callee": {}}, time.time() + max_seconds)
    session.send(orjson.dumps([64, 1, {}, procedure]))
    answer = session.next_message()
    if not answer.startswith(b"[65,"):
        raise RuntimeError(f"no REGISTERED: {answer[:200]!r}")
    ready()
    cpu, n, frame = time.process_time(), 0, session.frame
    while not stop():
        try:
            got = session.messages(0.2)
        except TimeoutError:
            break
        out = []
        for msg in got:
            if msg.startswith(_INVOCATION):
                m = orjson.loads(msg)
                out.append(frame(orjson.dumps([70, m[1], {}, m[4] if len(m) > 4 else []])))
        if out:
            n += len(out)
            session.sock.sendall(b"".join(out))
    return {"invocations": n, "cpu_seconds": time.process_time() - cpu}


def caller(
    url: str, realm: str, procedure: str, max_seconds: float, mode: str, count: int, rate: float, window: int, size: int
) -> dict[str, Any]:
    """Probe until ``procedure`` answers, then the throughput or latency run; the caller's figures."""
    deadline = time.time() + max_seconds
    session = WebSocketSession(url, realm, {"caller": {}}, deadline + 30)
    frame, tail = session.frame, b',{},"' + procedure.encode() + b'",["' + b"x" * size + b'"]]'
    probe = 0
    while True:  # the probe: the registration may take a moment to reach this node or router
        probe += 1
        session.send(b"[48," + str(probe).encode() + tail)
        msg = session.next_message()
        if msg.startswith(_RESULT):
            break
        if time.time() > deadline:
            raise TimeoutError(f"the procedure never became callable: {msg[:200]!r}")
        time.sleep(0.05)
    request = 1 << 20  # above the probes' ids
    sent = done = failures = 0
    latencies: list[float] = []
    started: dict[int, float] = {}
    perf = time.perf_counter
    start, cpu_start = time.time(), time.process_time()
    run_until = start + max_seconds
    interval = 1.0 / rate if rate > 0 else 0.0

    def calls(n: int) -> bytes:
        nonlocal request, sent
        out = []
        for _ in range(n):
            request += 1
            out.append(frame(b"[48," + str(request).encode() + tail))
            if mode != "throughput":
                started[request] = perf()
        sent += n
        return b"".join(out)

    if mode == "throughput":
        session.sock.sendall(calls(min(window, count)))
    while done < sent or (sent < count and time.time() < run_until):
        if mode != "throughput" and sent < count and time.time() < run_until:
            due = min(count, int((time.time() - start) / interval) + 1)
            if due > sent:
                session.sock.sendall(calls(due - sent))
            wait = max(0.0, start + sent * interval - time.time())
        else:
            wait = 0.2
        more = 0
        for msg in session.messages(wait):
            if msg.startswith(_RESULT):
                done += 1
                more += 1
                if started:
                    latencies.append(perf() - started.pop(_request_id(msg)))
            elif msg.startswith(_ERROR):
                done += 1
                more += 1
                failures += 1
        if mode == "throughput" and more and time.time() < run_until:
            n = min(more, count - sent)
            if n > 0:
                session.sock.sendall(calls(n))
    result: dict[str, Any] = {
        "sent": sent, "answered": done, "failures": failures, "first_failure": [], "start": start,
        "end": time.time(), "cpu_seconds": time.process_time() - cpu_start,
    }  # fmt: skip
    if latencies:
        latencies.sort()
        n = len(latencies)
        result["latency_ms"] = {
            "p50": latencies[n // 2] * 1000,
            "p99": latencies[min(n - 1, int(n * 0.99))] * 1000,
            "max": latencies[-1] * 1000,
        }
    return result
