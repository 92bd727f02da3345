"""A minimal WAMP relay: the floor under ``pubsubclub bench --scenario floor``.

A bench tool, on 127.0.0.1 only. It is NOT a router: no limits, no
authentication, no realms, no checks beyond what keeps it from crashing on
what the bench's Autobahn-Python clients send; never put it on a network.

It does the least work that Autobahn clients accept as a WAMP router, so a
latency run through it measures the clients, the kernel and the machine, plus
the floor of any router written in Python (one ``orjson`` decode of each
message per relay, one encode of an EVENT's arguments, one ``send`` per
socket, in the call):

* the WebSocket server handshake (``Sec-WebSocket-Accept``, subprotocol
  ``wamp.2.json``); client frames unmasked; whole, unfragmented frames only
  (Autobahn sends no others unless told to); PING answered with PONG, CLOSE
  with CLOSE (then the socket is closed);
* HELLO -> WELCOME, SUBSCRIBE -> SUBSCRIBED, GOODBYE -> GOODBYE, PUBLISH with
  ``acknowledge`` -> PUBLISHED; anything else is ignored;
* every PUBLISH goes to this relay's own subscribers of its topic (EVENT
  ``[36, subscription, publication, {}, args]``, never to the publisher
  itself) and, as received, to the other relay over one plain TCP connection
  (a 4-octet big-endian length, then the PUBLISH message), which delivers it
  to its own subscribers. Both relays forward, so the bench's probe and ready
  handshake (the subscriber's answer on B to the publisher on A) works.

Sockets are blocking, with ``TCP_NODELAY``, written in the call (no send
queue: the bench's paced run sends a few hundred kB/s at most, far under
any socket buffer); level-triggered ``select.epoll`` says which to read. No
Twisted, no asyncio.

Run as ``python -m pubsubclub.bench.relay [--peer-listen | --peer PORT]
[--max-seconds S]`` (``--name``, ``--log-level`` and ``--no-chat-page`` are
accepted, as :func:`pubsubclub.bench.nodes.start_node` passes them). It
prints one JSON line ``{"wamp": "ws://127.0.0.1:PORT", "peer": PORT}``
once it listens (and, with ``--peer``, is connected), and exits when its
stdin closes (the driver's ``stop``, or the driver gone), on SIGTERM, or
after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson

RECV_SIZE = 1 << 16
_PEER_HEADER = struct.Struct("!I")
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_WELCOME_DETAILS = {"roles": {"broker": {}}, "authid": "anonymous", "authrole": "anonymous"}
_GOODBYE = b'[6,{},"wamp.close.goodbye_and_out"]'
_loads = orjson.loads
_dumps = orjson.dumps


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One unmasked, unfragmented server frame (RFC 6455, section 5.2)."""
    n = len(payload)
    if n < 126:
        return bytes((0x80 | opcode, n)) + payload
    if n < 65536:
        return bytes((0x80 | opcode, 126)) + n.to_bytes(2, "big") + payload
    return bytes((0x80 | opcode, 127)) + n.to_bytes(8, "big") + payload


def unmask(mask: bytes, payload: bytes) -> bytes:
    """``payload`` XOR the repeated 4-octet ``mask`` (RFC 6455, section 5.3)."""
    n = len(payload)
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


def accept_key(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` value for a client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key + _WS_GUID).digest())


class Client:
    """One WAMP client connection: handshake, then whole WebSocket frames to :meth:`Relay.message`."""

    __slots__ = ("relay", "sock", "buffer", "open", "session")

    def __init__(self, relay: Relay, sock: socket.socket) -> None:
        self.relay = relay
        self.sock = sock
        self.buffer = b""
        self.open = False
        self.session = random.randint(1, 1 << 50)

    def send(self, payload: bytes) -> None:
        """One WAMP message as a text frame, written now; a client already gone is dropped by its read."""
        try:
            self.sock.sendall(ws_frame(payload))
        except OSError:
            pass

    def readable(self) -> None:
        """Read what came; handle every whole frame in it."""
        try:
            data = self.sock.recv(RECV_SIZE)
        except OSError:
            data = b""
        if not data:
            self.relay.drop(self)
            return
        if self.buffer:
            data = self.buffer + data
        if not self.open:
            head, sep, data = data.partition(b"\r\n\r\n")
            if not sep:
                self.buffer = head
                return
            self._handshake(head)
        pos, end = 0, len(data)
        while end - pos >= 2:
            n = data[pos + 1] & 0x7F
            start = pos + 2
            if n == 126:
                n = int.from_bytes(data[start : start + 2], "big")
                start += 2
            elif n == 127:
                n = int.from_bytes(data[start : start + 8], "big")
                start += 8
            masked = data[pos + 1] & 0x80
            if masked:
                start += 4
            if end - start < n:
                break
            payload = data[start : start + n]
            if masked:
                payload = unmask(data[start - 4 : start], payload)
            opcode = data[pos] & 0x0F
            pos = start + n
            if opcode == 1 or opcode == 2:
                try:
                    self.relay.message(self, payload)
                except (ValueError, TypeError, LookupError, AttributeError):
                    self.relay.drop(self)  # not the WAMP the bench's clients send
                    return
            elif opcode == 8:
                try:
                    self.sock.sendall(ws_frame(payload[:2], 8))
                except OSError:
                    pass
                self.relay.drop(self)
                return
            elif opcode == 9:
                try:
                    self.sock.sendall(ws_frame(payload, 10))
                except OSError:
                    pass
        self.buffer = data[pos:]

    def _handshake(self, head: bytes) -> None:
        key = b""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"sec-websocket-key":
                key = value.strip()
        try:
            self.sock.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: " + accept_key(key) + b"\r\nSec-WebSocket-Protocol: wamp.2.json\r\n\r\n"
            )
        except OSError:
            pass  # gone: its read drops it
        self.open = True


class Relay:
    """The listeners, the clients, the subscriptions and the peer connection of one relay process."""

    def __init__(self) -> None:
        self.epoll = select.epoll()
        self.handlers: dict[int, Callable[[], None]] = {}
        self.socks: dict[int, socket.socket] = {}
        #: topic -> its subscription id (one per topic in this relay) and its subscribers.
        self.topics: dict[str, tuple[int, list[Client]]] = {}
        self.peer: socket.socket | None = None
        self.peer_buffer = b""
        self.publication = 0
        self.running = True

    def watch(self, sock: socket.socket, handler: Callable[[], None]) -> None:
        """Call ``handler`` whenever ``sock`` is readable."""
        fd = sock.fileno()
        self.handlers[fd] = handler
        self.socks[fd] = sock
        self.epoll.register(fd, select.EPOLLIN)

    def forget(self, sock: socket.socket) -> None:
        """Stop watching ``sock`` and close it."""
        fd = sock.fileno()
        if fd in self.handlers:
            self.epoll.unregister(fd)
            del self.handlers[fd], self.socks[fd]
        sock.close()

    def accept(self, listener: socket.socket) -> socket.socket:
        """The next connection on ``listener``, Nagle off."""
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def listen_wamp(self, listener: socket.socket) -> None:
        """Accept WAMP clients on ``listener``."""

        def accepted() -> None:
            client = Client(self, self.accept(listener))
            self.watch(client.sock, client.readable)

        self.watch(listener, accepted)

    def listen_peer(self, listener: socket.socket) -> None:
        """Accept the one peer relay on ``listener``, then close it."""

        def accepted() -> None:
            self.set_peer(self.accept(listener))
            self.forget(listener)

        self.watch(listener, accepted)

    def set_peer(self, sock: socket.socket) -> None:
        """Forward publishes to, and deliver those of, the relay at the other end of ``sock``."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = sock
        self.watch(sock, self.peer_readable)

    def drop(self, client: Client) -> None:
        """A client left: its subscriptions and its socket go."""
        for _, subscribers in self.topics.values():
            if client in subscribers:
                subscribers.remove(client)
        self.forget(client.sock)

    def message(self, client: Client, payload: bytes) -> None:
        """One WAMP message from ``client``."""
        msg = _loads(payload)
        kind = msg[0]
        if kind == 16:
            self.publish(msg, payload, client)
        elif kind == 32:
            topic = msg[3]
            entry = self.topics.get(topic)
            if entry is None:
                entry = self.topics[topic] = (len(self.topics) + 1, [])
            entry[1].append(client)
            client.send(b"[33,%d,%d]" % (msg[1], entry[0]))
        elif kind == 1:
            client.send(_dumps([2, client.session, {**_WELCOME_DETAILS, "realm": msg[1]}]))
        elif kind == 6:
            client.send(_GOODBYE)

    def publish(self, msg: list[Any], payload: bytes, publisher: Client | None) -> None:
        """PUBLISH ``msg`` (``payload`` as received): to the peer if a client sent it, then to local subscribers."""
        self.publication += 1
        if publisher is not None and self.peer is not None:
            try:
                self.peer.sendall(_PEER_HEADER.pack(len(payload)) + payload)
            except OSError:
                pass  # the other relay is gone: its read drops it
        entry = self.topics.get(msg[3])
        if entry is not None and entry[1]:
            # msg[4:] is [args] or [args, kwargs]: its encoding minus the "[" is the EVENT's tail.
            frame = ws_frame(b"[36,%d,%d,{},%s" % (entry[0], self.publication, _dumps(msg[4:])[1:]))
            for subscriber in entry[1]:
                if subscriber is not publisher:
                    try:
                        subscriber.sock.sendall(frame)
                    except OSError:
                        pass  # gone: its read drops it
        if publisher is not None and msg[2].get("acknowledge"):
            publisher.send(b"[17,%d,%d]" % (msg[1], self.publication))

    def peer_readable(self) -> None:
        """The other relay's forwarded publishes, each delivered to the local subscribers."""
        assert self.peer is not None
        try:
            data = self.peer.recv(RECV_SIZE)
        except OSError:
            data = b""
        if not data:
            self.forget(self.peer)
            self.peer = None
            return
        if self.peer_buffer:
            data = self.peer_buffer + data
        pos, end = 0, len(data)
        while end - pos >= 4:
            (n,) = _PEER_HEADER.unpack_from(data, pos)
            if end - pos - 4 < n:
                break
            payload = data[pos + 4 : pos + 4 + n]
            pos += 4 + n
            try:
                self.publish(_loads(payload), payload, None)
            except (ValueError, TypeError, LookupError, AttributeError):
                pass  # not a PUBLISH: skipped
        self.peer_buffer = data[pos:]

    def run(self, deadline: float) -> None:
        """Serve until stdin closes, SIGTERM, or ``deadline`` (``time.monotonic``)."""

        def stdin_readable() -> None:
            if not os.read(0, 4096):
                self.running = False

        self.handlers[0] = stdin_readable
        self.epoll.register(0, select.EPOLLIN)
        handlers = self.handlers
        while self.running:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                break
            for fd, _ in self.epoll.poll(timeout):
                handler = handlers.get(fd)  # None: closed by an earlier event of this batch
                if handler is not None:
                    handler()

    def close(self) -> None:
        """Close every socket."""
        for sock in list(self.socks.values()):
            sock.close()
        self.epoll.close()


def listener(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def main(argv: list[str]) -> int:
    """One relay process; see the module's docstring."""
    parser = argparse.ArgumentParser(prog="python -m pubsubclub.bench.relay")
    parser.add_argument("--name", default="relay")
    parser.add_argument("--log-level", help="accepted and ignored: the relay logs nothing")
    parser.add_argument("--no-chat-page", action="store_true", help="accepted and ignored")
    parser.add_argument("--port", type=int, default=0, help="WAMP WebSocket port on 127.0.0.1 (default: any free)")
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument("--peer-listen", action="store_true", help="accept the other relay on a free port")
    peer.add_argument("--peer", type=int, metavar="PORT", help="connect to the other relay on 127.0.0.1:PORT")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="exit after this long in any case")
    args = parser.parse_args(argv)
    # SIGTERM unwinds (closing the sockets) instead of killing outright.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    deadline = time.monotonic() + args.max_seconds
    relay = Relay()
    try:
        wamp = listener(args.port)
        relay.listen_wamp(wamp)
        ready: dict[str, Any] = {"name": args.name, "wamp": f"ws://127.0.0.1:{wamp.getsockname()[1]}"}
        if args.peer_listen:
            peer_listener = listener()
            relay.listen_peer(peer_listener)
            ready["peer"] = peer_listener.getsockname()[1]
        elif args.peer is not None:
            relay.set_peer(socket.create_connection(("127.0.0.1", args.peer), timeout=10))
            assert relay.peer is not None
            relay.peer.settimeout(None)
        print(json.dumps(ready), flush=True)
        relay.run(deadline)
    finally:
        relay.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
