"""``pubsubclub bench --client lean``: WAMP clients cheap enough that the rate is the nodes'.

The Autobahn-Python clients of :mod:`pubsubclub.bench.wamp` cost more CPU per
message than the nodes they measure, and the machine has two cores. These
clients speak WAMP JSON with orjson on blocking sockets, over RawSocket
(``rs://`` URLs, spec framing: a 4-octet header ``type << 24 | length``) or
WebSocket (``ws://`` URLs, ``--transport websocket``: the minimal client of
:mod:`pubsubclub.bench.leancalls`, which also speaks to the floor's relays):

* a **publisher** encodes a block of PUBLISH frames once and sends it with one
  ``sendall`` per block, its messages spread round-robin over one topic per
  subscriber, so every message has exactly one recipient (one-to-one);
* a **subscriber** subscribes to its topic and counts EVENT frames by their
  ``[36,<subscription>,`` prefix, without decoding them; publishers' end
  markers (``["end"]``) are told apart by their tail.

Flow control is end to end, as an application would do it, so neither the
link's queue cap nor the subscriber's send-buffer cap is ever hit: each
subscriber publishes its running count on :data:`ACK_TOPIC` every
``ACK_EVERY`` events, and a publisher keeps at most ``--window`` messages
(over all publishers, estimated as its own count times the number of
publishers) not yet acknowledged. The acks cross the link the other way
(B to A), about one per thousand messages.

Each client is its own process (``python -m pubsubclub.bench.lean ROLE ...``)
so several publishers and subscribers use both cores. A publisher reports its
first send time and count; a subscriber its count and its last event's time
(same host clock): the rate is all events received over the time from the
first publish to the last event. Every wait is bounded by ``--max-seconds``.

The latency run with these clients (``latency-publisher``/``latency-subscriber``)
sends ``--latency-count`` messages at ``--rate`` per second, each the Autobahn
run's message (one argument ``{"i", "t", "p"}``, :func:`latency_publish`) stamped just
before its ``sendall`` and timed just after the ``recv`` that brought it: what
is measured is the nodes and the kernel, nearly nothing of a client library
(the Autobahn clients' run measures those too). The publisher sleeps until
each message's own due time (``time.sleep``: microseconds). With
``--acknowledge`` each of its publishes asks for a PUBLISHED, which it
reads right after each send and counts (``published``).
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from pubsubclub.bench.leancalls import WebSocketSession
from pubsubclub.bench.nodes import progress, steal_seconds, stolen_since, tree_cpu_seconds
from pubsubclub.bench.pacing import paced

TOPIC = "pubsubclub.bench.lean"
ACK_TOPIC = "pubsubclub.bench.lean.ack"
END_TAIL = b',["end"]]'
#: A publisher probes each topic until every subscriber acknowledged: then every route works both ways.
PROBE_TAIL = b',["probe"]]'
ACK_EVERY = 1000
#: PUBLISH frames encoded once and sent with one sendall.
BLOCK = 200
_HEADER = struct.Struct("!I")
#: Handshake: JSON serializer (1), and we accept messages up to 2 ** (9 + 15) bytes.
_HANDSHAKE = bytes([0x7F, 0xF1, 0, 0])


def topic(index: int) -> str:
    """The topic of subscriber ``index``."""
    return f"{TOPIC}.{index}"


class _Requests:
    """What the lean roles do the same way on either wire: request ids and SUBSCRIBE."""

    _request = 0

    def send(self, payload: bytes) -> None:
        """Send one WAMP message (each wire's own)."""
        raise NotImplementedError

    def next_message(self, deadline: float) -> bytes:
        """The next WAMP message (each wire's own)."""
        raise NotImplementedError

    def request(self) -> int:
        """A new request id."""
        self._request += 1
        return self._request

    def subscribe(self, uri: str, deadline: float) -> int:
        """Subscribe to ``uri``; the subscription id."""
        request = self.request()
        self.send(orjson.dumps([32, request, {}, uri]))
        answer = orjson.loads(self.next_message(deadline))
        if answer[:2] != [33, request]:
            raise RuntimeError(f"no SUBSCRIBED: {answer!r}")
        return int(answer[2])


class RawSocketSession(_Requests):
    """A WAMP session over RawSocket (JSON) on a blocking socket: frames out, frames in."""

    def __init__(self, host: str, port: int, realm: str, deadline: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=max(deadline - time.time(), 1))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(_HANDSHAKE)
        self._buffer = bytearray()
        reply = self._read_exactly(4, deadline)
        if reply[0] != 0x7F or reply[1] & 0x0F != 1:
            raise RuntimeError(f"RawSocket handshake refused: {reply.hex()}")
        self.send(orjson.dumps([1, realm, {"roles": {"publisher": {}, "subscriber": {}}}]))
        welcome = orjson.loads(self.next_message(deadline))
        if welcome[0] != 2:
            raise RuntimeError(f"no WELCOME: {welcome!r}")

    @staticmethod
    def frame(payload: bytes) -> bytes:
        """One WAMP message as a RawSocket frame."""
        return _HEADER.pack(len(payload)) + payload

    def send(self, payload: bytes) -> None:
        """Send one WAMP message."""
        self.sock.sendall(self.frame(payload))

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        while len(self._buffer) < n:
            self._fill(deadline)
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def _fill(self, deadline: float) -> None:
        timeout = deadline - time.time()
        if timeout <= 0:
            raise TimeoutError("the bench's time bound passed")
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the node closed the connection")
        self._buffer += data

    def messages(self, deadline: float, wait: bool = True) -> list[bytes]:
        """The WAMP messages of the next read (after one ``recv``; none if ``wait`` is false and nothing came)."""
        if not wait and not select.select([self.sock], [], [], 0)[0]:
            return []
        self._fill(deadline)
        buffer, out, pos = self._buffer, [], 0
        end = len(buffer)
        while end - pos >= 4:
            (header,) = _HEADER.unpack_from(buffer, pos)
            length = header & 0xFFFFFF
            if end - pos - 4 < length:
                break
            if header >> 24 == 0:
                out.append(bytes(buffer[pos + 4 : pos + 4 + length]))
            elif header >> 24 == 1:  # PING: answer in kind
                self.sock.sendall(_HEADER.pack((2 << 24) | length) + buffer[pos + 4 : pos + 4 + length])
            pos += 4 + length
        del buffer[:pos]
        return out

    def next_message(self, deadline: float) -> bytes:
        """The next WAMP message."""
        while True:
            (header,) = _HEADER.unpack(self._read_exactly(4, deadline))
            payload = self._read_exactly(header & 0xFFFFFF, deadline)
            if header >> 24 == 0:
                return payload


class WebSocketLean(_Requests):
    """The same session over WebSocket (JSON): :class:`RawSocketSession`'s interface on
    :class:`~pubsubclub.bench.leancalls.WebSocketSession` (frames masked with a zero key)."""

    def __init__(self, url: str, realm: str, deadline: float) -> None:
        self._ws = WebSocketSession(url, realm, {"publisher": {}, "subscriber": {}}, deadline)
        self.sock = self._ws.sock
        self.frame = self._ws.frame
        #: Messages a read brought after the one :meth:`next_message` returned.
        self._pending: deque[bytes] = deque()

    def send(self, payload: bytes) -> None:
        """Send one WAMP message."""
        self._ws.send(payload)

    def messages(self, deadline: float, wait: bool = True) -> list[bytes]:
        """The WAMP messages of the next read (none if ``wait`` is false and nothing came); the session's
        deadline is the one it was opened with."""
        if self._pending:
            held = list(self._pending)
            self._pending.clear()
            return held
        return self._ws.messages(None if wait else 0)

    def next_message(self, deadline: float) -> bytes:
        """The next WAMP message (the rest of its read kept for the next call)."""
        while not self._pending:
            self._pending.extend(self._ws.messages())
        return self._pending.popleft()


def connect(url: str, realm: str, deadline: float) -> RawSocketSession | WebSocketLean:
    """A lean session to ``url``: ``ws://`` over WebSocket, ``rs://HOST:PORT`` over RawSocket."""
    if url.startswith("ws://"):
        return WebSocketLean(url, realm, deadline)
    host, port = _host_port(url)
    return RawSocketSession(host, int(port), realm, deadline)


def _ready(**fields: Any) -> None:
    sys.stdout.write(json.dumps({"ready": True, **fields}) + "\n")
    sys.stdout.flush()


def _subscriber(url: str, realm: str, index: int, publishers: int, max_seconds: float) -> dict[str, Any]:
    deadline = time.time() + max_seconds
    session = connect(url, realm, deadline)
    prefix = b"[36,%d," % session.subscribe(topic(index), deadline)
    _ready()
    received = ends = 0
    first = last = 0.0
    next_ack = ACK_EVERY
    while ends < publishers:
        batch = session.messages(deadline)
        now = time.time()
        probed = False
        for m in batch:
            if m.startswith(prefix):
                if m.endswith(END_TAIL):
                    ends += 1
                elif m.endswith(PROBE_TAIL):
                    probed = True
                else:
                    received += 1
        if received and not first:
            first = now
        last = now
        if received >= next_ack or probed:
            session.send(orjson.dumps([16, session.request(), {}, ACK_TOPIC, [index, received]]))
            next_ack = received + ACK_EVERY
    return {"received": received, "first": first, "last": last}


def _publisher(
    url: str, realm: str, publishers: int, topics: int, count: int, size: int, window: int, max_seconds: float
) -> dict[str, Any]:
    deadline = time.time() + max_seconds
    session = connect(url, realm, deadline)
    ack_prefix = b"[36,%d," % session.subscribe(ACK_TOPIC, deadline)
    body = "x" * size
    frames = [session.frame(orjson.dumps([16, n + 1, {}, topic(n % topics), [body]])) for n in range(BLOCK)]
    block = b"".join(frames)
    acked: dict[int, int] = {}

    def read_acks(wait: bool) -> None:
        for m in session.messages(deadline, wait):
            if m.startswith(ack_prefix):
                subscriber, got = orjson.loads(m)[4]
                acked[subscriber] = max(got, acked.get(subscriber, 0))

    probes = b"".join(session.frame(orjson.dumps([16, 0x10000 + t, {}, topic(t), ["probe"]])) for t in range(topics))
    while len(acked) < topics:
        if time.time() > deadline:
            raise TimeoutError(f"{len(acked)} of {topics} subscribers answered the probes")
        session.sock.sendall(probes)
        if select.select([session.sock], [], [], 0.05)[0]:
            read_acks(wait=True)
    _ready()
    if not sys.stdin.readline():  # the driver's go: every client is up
        raise RuntimeError("no go from the driver")
    start = time.time()
    sent = 0
    while sent < count:
        read_acks(wait=False)
        while (sent + BLOCK) * publishers - sum(acked.values()) > window:
            read_acks(wait=True)
        n = min(BLOCK, count - sent)
        session.sock.sendall(block if n == BLOCK else b"".join(frames[:n]))
        sent += n
    # One acknowledged end marker per topic: FIFO per origin and topic puts it after our messages.
    pending = set()
    for t in range(topics):
        request = session.request() + BLOCK
        pending.add(request)
        session.send(orjson.dumps([16, request, {"acknowledge": True}, topic(t), ["end"]]))
    while pending:
        for m in session.messages(deadline):
            if m.startswith(b"[17,"):
                pending.discard(orjson.loads(m)[1])
    return {"sent": sent, "start": start, "end": time.time()}


LATENCY_TOPIC = "pubsubclub.bench.lean.latency"


def _latency_subscriber(url: str, realm: str, max_seconds: float) -> dict[str, Any]:
    deadline = time.time() + max_seconds
    session = connect(url, realm, deadline)
    prefix = b"[36,%d," % session.subscribe(LATENCY_TOPIC, deadline)
    _ready()
    latencies: list[float] = []
    while True:
        batch = session.messages(deadline)
        now = time.time()
        for m in batch:
            if not m.startswith(prefix):
                continue
            if m.endswith(END_TAIL):
                return {"received": len(latencies), "latencies": latency_summary(latencies)}
            if m.endswith(PROBE_TAIL):
                session.send(orjson.dumps([16, session.request(), {}, ACK_TOPIC, ["ready"]]))
                continue
            latencies.append(now - orjson.loads(m)[4][0]["t"])


def latency_summary(latencies: list[float]) -> dict[str, Any]:
    """p50/p99/p99.9/max in milliseconds and the positions of the five slowest."""
    if not latencies:
        return {}
    slowest = sorted(sorted(range(len(latencies)), key=latencies.__getitem__)[-5:])
    ordered = sorted(latencies)
    n = len(ordered)
    return {
        "latency_ms": {
            "p50": ordered[n // 2] * 1000,
            "p99": ordered[min(n - 1, int(n * 0.99))] * 1000,
            "p999": ordered[min(n - 1, int(n * 0.999))] * 1000,
            "max": ordered[-1] * 1000,
        },
        "slowest_positions": slowest,
    }


def latency_publish(request: int, options: bytes, topic: bytes, number: int, stamp: float, body: bytes) -> bytes:
    """A paced PUBLISH: one argument ``{"i": number, "t": stamp, "p": body}``, the Autobahn latency run's message
    (so a node takes the same road for both clients: its plain PUBLISH when ``options`` is ``{}``)."""
    return b'[16,%d,%s,"%s",[{"i":%d,"t":%r,"p":"%s"}]]' % (request, options, topic, number, stamp, body)


def _latency_publisher(
    url: str, realm: str, count: int, size: int, rate: float, max_seconds: float, acknowledge: bool = False
) -> dict[str, Any]:
    deadline = time.time() + max_seconds
    session = connect(url, realm, deadline)
    ack_prefix = b"[36,%d," % session.subscribe(ACK_TOPIC, deadline)
    probe = session.frame(orjson.dumps([16, 0x10000, {}, LATENCY_TOPIC, ["probe"]]))
    ready = False
    while not ready:  # until the subscriber's subscription has reached this node and it answered
        if time.time() > deadline:
            raise TimeoutError("the latency subscriber never answered a probe")
        session.sock.sendall(probe)
        if select.select([session.sock], [], [], 0.05)[0]:
            ready = any(m.startswith(ack_prefix) for m in session.messages(deadline))
    body = ("x" * size).encode()
    topic_bytes = LATENCY_TOPIC.encode()
    options = b'{"acknowledge":true}' if acknowledge else b"{}"
    published = 0
    start = time.time()
    sent = 0
    for number in paced(start, count, rate, deadline):
        sent = number + 1
        message = latency_publish(sent, options, topic_bytes, number, time.time(), body)
        session.sock.sendall(session.frame(message))
        if acknowledge:  # read the PUBLISHEDs as they come (after the send: the message's time is not theirs)
            published += sum(m.startswith(b"[17,") for m in session.messages(deadline, wait=False))
    request = session.request() + count + 1
    session.send(orjson.dumps([16, request, {"acknowledge": True}, LATENCY_TOPIC, ["end"]]))
    end_answered = False
    while not end_answered:  # FIFO on the connection: every PUBLISHED of ours comes before the end marker's
        for m in session.messages(deadline):
            if m.startswith(b"[17,%d," % request):
                end_answered = True
            elif m.startswith(b"[17,"):
                published += 1
    return {"sent": sent, "start": start, "end": time.time(), "published": published}


def publisher_and_subscriber(
    sub_argv: list[str], pub_argv: list[str], timeout: float, started: Callable[[], None] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a subscriber process until its ready line, then ``started()`` and the publisher; their last JSON lines.

    The two bench runners' clients (Autobahn and lean) report the same way: the
    subscriber prints ``{"ready": true}`` once subscribed, each prints its result
    as its last line. The subscriber is killed if it outlives the run.
    """
    sub = subprocess.Popen(sub_argv, stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None
        if not sub.stdout.readline():
            raise RuntimeError(f"the subscriber ({sub_argv[2]}) did not start")
        if started is not None:
            started()
        pub = subprocess.run(pub_argv, stdout=subprocess.PIPE, text=True, timeout=timeout)
        out_sub, _ = sub.communicate(timeout=timeout)
    finally:
        if sub.poll() is None:
            sub.kill()
        sub.wait(10)
    return json.loads(pub.stdout.strip().splitlines()[-1]), json.loads(out_sub.strip().splitlines()[-1])


def lean_latency(args: argparse.Namespace, url_a: str, url_b: str, server_pids: list[int]) -> dict[str, Any]:
    """The latency run with lean clients: one publisher on A paced at ``--rate``, one subscriber on B."""
    me = [sys.executable, "-m", "pubsubclub.bench.lean"]
    bound = str(args.max_seconds + 20)
    cpu: list[float] = []
    steal: list[float | None] = []

    def started() -> None:
        progress(f"lean latency run: {args.latency_count} messages at {args.rate}/s (A -> B)")
        cpu.append(tree_cpu_seconds(server_pids))
        steal.append(steal_seconds())

    p, s = publisher_and_subscriber(
        [*me, "latency-subscriber", url_b, args.realm, bound],
        [*me, "latency-publisher", url_a, args.realm, str(args.latency_count), str(args.size),
         str(args.rate), str(args.max_seconds), str(int(getattr(args, "acknowledge", False)))],
        args.max_seconds + 30, started,
    )  # fmt: skip
    spent = tree_cpu_seconds(server_pids) - cpu[0]
    stolen = stolen_since(steal[0])
    return {
        "mode": "latency",
        "client": "lean",
        "transport": "websocket" if url_a.startswith("ws") else "rawsocket",
        "sent": p["sent"],
        "received": s["received"],
        "lost": p["sent"] - s["received"],
        "acknowledge": bool(getattr(args, "acknowledge", False)),
        "published": p["published"],
        "publish_rate": p["sent"] / max(p["end"] - p["start"], 1e-9),
        **s["latencies"],
        "server_cpu_us_per_msg": spent / max(s["received"], 1) * 1e6,
        "steal_seconds": stolen,
    }


def client_main(argv: list[str]) -> int:
    """One lean client process; prints its result as one JSON line."""
    role, url, realm = argv[0], argv[1], argv[2]
    numbers = [float(a) for a in argv[3:]]
    if role == "latency-subscriber":
        result = _latency_subscriber(url, realm, numbers[0])
    elif role == "latency-publisher":
        count, size, rate, max_seconds, acknowledge = numbers
        result = _latency_publisher(url, realm, int(count), int(size), rate, max_seconds, bool(acknowledge))
    elif role == "subscriber":
        index, publishers, max_seconds = numbers
        result = _subscriber(url, realm, int(index), int(publishers), max_seconds)
    else:
        publishers, topics, count, size, window, max_seconds = numbers
        result = _publisher(url, realm, int(publishers), int(topics), int(count), int(size), int(window), max_seconds)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def _host_port(url: str) -> list[str]:
    """``rs://HOST:PORT`` as the two client arguments."""
    return url.split("://", 1)[1].rstrip("/").rsplit(":", 1)


def lean_window(args: argparse.Namespace) -> int:
    """``--window`` or its default; SystemExit when it could stall a publisher for good."""
    # The slowest publisher can always go on when the window holds one block from each publisher
    # plus what every subscriber may have counted without acknowledging yet.
    least = args.publishers * BLOCK + (args.subscribers or 1) * ACK_EVERY
    window: int = args.window or max(20_000, 2 * least)
    if window < least:
        raise SystemExit(f"pubsubclub: error: --window must be at least {least} with these clients")
    return window


def lean_run(args: argparse.Namespace, url_a: str, url_b: str, server_pids: list[int]) -> dict[str, Any]:
    """One throughput run: the subscribers on B, the publishers on A, as fast as the servers go.

    ``server_pids``: the processes whose CPU is the servers' (with their children: a Crossbar router's workers).
    """
    publishers, subscribers = args.publishers, args.subscribers or 1
    window = lean_window(args)
    me = [sys.executable, "-m", "pubsubclub.bench.lean"]
    bound = str(args.max_seconds + 20)
    subs: list[subprocess.Popen[str]] = []
    pubs: list[subprocess.Popen[str]] = []
    try:
        for j in range(subscribers):
            subs.append(subprocess.Popen([*me, "subscriber", url_b, args.realm, str(j), str(publishers),
                                          bound], stdout=subprocess.PIPE, text=True))  # fmt: skip
        for p in subs:
            assert p.stdout is not None
            if not p.stdout.readline():
                raise RuntimeError("a lean subscriber did not start")
        for _ in range(publishers):
            numbers = [publishers, subscribers, args.count, args.size, window]
            pubs.append(subprocess.Popen([*me, "publisher", url_a, args.realm, *map(str, numbers), bound],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))  # fmt: skip
        for p in pubs:
            assert p.stdout is not None
            if not p.stdout.readline():
                raise RuntimeError("a lean publisher did not start")
        progress(f"lean throughput run: {publishers} publisher(s) on A x {args.count} messages of {args.size} B, "
                 f"{subscribers} subscriber(s) on B, one-to-one, window {window}")  # fmt: skip
        cpu_before = tree_cpu_seconds(server_pids)
        for p in pubs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.communicate(timeout=args.max_seconds + 40)[0].strip().splitlines()[-1])
                for p in [*pubs, *subs]]  # fmt: skip
        spent = tree_cpu_seconds(server_pids) - cpu_before
    finally:
        for p in [*pubs, *subs]:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    pub_out, sub_out = outs[:publishers], outs[publishers:]
    sent = sum(o["sent"] for o in pub_out)
    received = sum(o["received"] for o in sub_out)
    start = min(o["start"] for o in pub_out)
    last = max(o["last"] for o in sub_out)
    return {
        "mode": "throughput",
        "client": "lean",
        "publishers": publishers,
        "subscribers": subscribers,
        "sent": sent,
        "received": received,
        "lost": sent - received,
        "publish_rate": sent / max(max(o["end"] for o in pub_out) - start, 1e-9),
        "delivered_rate": received / max(last - start, 1e-9),
        "server_cpu_us_per_msg": spent / max(received, 1) * 1e6,
    }


if __name__ == "__main__":
    raise SystemExit(client_main(sys.argv[1:]))
