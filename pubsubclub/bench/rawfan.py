"""The fan-out bench's client side: 1 publisher and N subscribers in one process on raw non-blocking sockets.

The subscribers must cost far less per delivered frame than the node spends
per delivery, or on a small host the client and not the node is the limit
(issue 22: ``--workers 2`` against ``--workers 1`` on 2 cores). Each session
is opened blocking (the WebSocket upgrade, HELLO/WELCOME, SUBSCRIBE/SUBSCRIBED,
every answer checked), then every socket goes non-blocking into one
``selectors`` (epoll) loop that does large ``recv`` calls and counts EVENT
frames with ``bytes.count`` of :data:`MARKER`, in C, without parsing a frame.

Why the count is exact: an EVENT the node sends here is the text frame
``[36,<sub id>,<pub id>,{},["xxx..."]]``; the only ``[`` in it are the first
and the one before the arguments, and the body is ``x`` repeated, so
:data:`MARKER` occurs once per EVENT and nowhere else (a WebSocket frame
header is 2 or 4 bytes ahead of it and cannot complete it: the byte after
a header is the payload's ``[``). A marker split over two ``recv`` calls is
found by counting across the seam (the last 3 bytes before, the first 3
after). The last message published carries :data:`END` in its body; each
subscriber stops reading when it saw END and must by then have counted
exactly ``count + 1`` EVENTs (a lost message, or a duplicate before END,
fails the run). The publisher is a socket in the same loop, written as it
becomes writable from one prebuilt buffer of masked frames; anything the
node sends it but a ping (an ERROR) fails the run. Pings are not answered
(the bench nodes run with the idle timeout off) and cannot contain the
marker: the node's keepalive pings are empty.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import selectors
import socket
import struct
import time
from typing import Any

from pubsubclub.bench.idle import frame

#: Starts every EVENT the node sends a subscriber, and appears nowhere else in it.
MARKER = b"[36,"
#: In the body of the last message only.
END = b"fanout-end-marker"
#: Bytes asked for per ``recv``.
RECV_SIZE = 1 << 18
#: Bytes of PUBLISH frames handed to the kernel per write (a node then works on at most ~this much per read).
PUB_CHUNK = 1 << 18


class _Session:
    """A blocking WAMP-over-WebSocket session used only to set up (then read raw)."""

    def __init__(self, port: int, hello: bytes, timeout: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
            ).encode()
        )
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"no WebSocket upgrade: {head[:80]!r}")
        self.sock.sendall(frame(hello))
        welcome = self.read_frame()
        if not welcome.startswith(b"[2,"):
            raise RuntimeError(f"no WELCOME: {welcome[:80]!r}")

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RuntimeError("the node closed a bench session during its setup")
        self.buf += data

    def read_frame(self) -> bytes:
        """The payload of the next server frame."""
        while True:
            if len(self.buf) >= 2:
                length, at = self.buf[1] & 0x7F, 2
                if length == 126 and len(self.buf) >= 4:
                    length, at = struct.unpack("!H", self.buf[2:4])[0], 4
                elif length == 127 and len(self.buf) >= 10:
                    length, at = struct.unpack("!Q", self.buf[2:10])[0], 10
                if length < 126 or at > 2:
                    if len(self.buf) >= at + length:
                        payload, self.buf = self.buf[at : at + length], self.buf[at + length :]
                        return payload
            self._more()


def subscriber(port: int, hello: bytes, topic: str, timeout: float) -> socket.socket:
    """A subscribed session's socket (SUBSCRIBED read back, nothing left unread)."""
    s = _Session(port, hello, timeout)
    s.sock.sendall(frame(json.dumps([32, 1, {}, topic]).encode()))
    answer = s.read_frame()
    if not answer.startswith(b"[33,") or s.buf:
        raise RuntimeError(f"no SUBSCRIBED: {answer[:80]!r}")
    return s.sock


def publisher(port: int, hello: bytes, timeout: float) -> socket.socket:
    """A joined session's socket to publish on."""
    return _Session(port, hello, timeout).sock


def publications(topic: str, count: int, size: int) -> bytes:
    """``count`` masked PUBLISH frames, the last with :data:`END` in its body, as one buffer."""
    body = "x" * size
    frames = [frame(json.dumps([16, n + 1, {}, topic, [body]]).encode()) for n in range(min(count - 1, 1000))]
    out = [frames[n % len(frames)] for n in range(count - 1)] if frames else []
    out.append(frame(json.dumps([16, count, {}, topic, [END.decode()]]).encode()))
    return b"".join(out)


def _only_pings(buf: bytes) -> bytes:
    """What is left of ``buf`` after its whole WebSocket pings (the node's keepalive); any other frame fails the run."""
    while len(buf) >= 2:
        if buf[0] != 0x89 or buf[1] > 125:
            raise RuntimeError(f"the node answered the publisher: {buf[:200]!r}")
        if len(buf) < 2 + buf[1]:
            break
        buf = buf[2 + buf[1] :]
    return buf


def run(subs: list[socket.socket], pub: socket.socket, data: bytes, count: int, deadline: float) -> dict[str, Any]:
    """Publish ``data`` (``count`` messages) and read until every subscriber saw END; counts and times."""
    sel = selectors.DefaultSelector()
    counts = [0] * len(subs)
    tails = [b""] * len(subs)
    ends = [b""] * len(subs)
    for i, s in enumerate(subs):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    pub.setblocking(False)
    sel.register(pub, selectors.EVENT_WRITE | selectors.EVENT_READ, -1)
    view, sent, open_subs, pub_in = memoryview(data), 0, len(subs), b""
    marker, end, keep = MARKER, END, len(END) - 1
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    while open_subs:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{open_subs} subscribers without the last message before the time bound")
        for key, mask in sel.select(1.0):
            i = key.data
            if i == -1:
                if mask & selectors.EVENT_READ:
                    pub_in = _only_pings(pub_in + pub.recv(RECV_SIZE))
                try:
                    sent += pub.send(view[sent : sent + PUB_CHUNK])
                except BlockingIOError:
                    continue
                if sent == len(data):
                    sel.modify(pub, selectors.EVENT_READ, -1)
                continue
            try:
                chunk = key.fileobj.recv(RECV_SIZE)  # type: ignore[union-attr]
            except BlockingIOError:
                continue
            if not chunk:
                raise RuntimeError(f"the node closed subscriber {i}")
            tail = tails[i]
            counts[i] += chunk.count(marker) + (tail + chunk[:3]).count(marker)
            tails[i] = (tail + chunk)[-3:]
            seam = ends[i] + chunk[:keep]
            if end in chunk or end in seam:
                sel.unregister(key.fileobj)
                open_subs -= 1
            else:
                ends[i] = (ends[i] + chunk)[-keep:]
    seconds = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    sel.close()
    wrong = {i: c for i, c in enumerate(counts) if c != count}
    if wrong:
        sample = dict(list(wrong.items())[:5])
        raise RuntimeError(f"{len(wrong)} subscribers did not get every message exactly once (index: EVENTs): {sample}")
    return {
        "deliveries": sum(counts),
        "seconds": seconds,
        "client_cpu_seconds": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
    }
