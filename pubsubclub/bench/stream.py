"""``pubsubclub bench --scenario stream``: durable publish and catch-up rates of the stream front-end on one node.

One node is started with ``--stream`` and a fresh data dir. A plain-socket
client publishes ``--count`` messages of ``--size`` bytes in ``Batch Count``
groups of ``--batch`` and waits for each batch's single OK, which the node
sends only after the group-commit sync (``fsync`` unless ``--relaxed``);
then a subscriber reads the whole topic from ``Earliest``. Frames are encoded
once up front, so the client's own cost is one ``sendall`` per batch: the
numbers are the node's. Bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import tempfile
import time
from typing import Any

from pubsubclub.bench.nodes import cpu_seconds, free_port, local, machine, progress, start_node, stop
from pubsubclub.frontends.stream import codec as c


class _Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self.decoder = c.ClientDecoder(max_payload_bytes=64 * 1024 * 1024)
        self.pending: list[c.ServerEvent] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def events(self, n: int, deadline: float) -> list[c.ServerEvent]:
        while len(self.pending) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.pending)} of {n} events before the time bound")
            data = self.sock.recv(4 * 1024 * 1024)
            if not data:
                raise ConnectionError("the node closed the connection")
            self.decoder.receive(data)
            self.pending.extend(self.decoder.events())
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    def count(self, n: int, deadline: float) -> int:
        """Read until ``n`` Message headers arrived; how many came.

        A lean reader: it counts ``{"Message"`` in the bytes instead of
        decoding them (the payloads are hex text, so the marker cannot occur
        inside one), so the rate is the node's, not this client's decoder's.
        """
        marker = b'{"Message"'
        got, tail = 0, b""
        while got < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{got} of {n} messages before the time bound")
            data = self.sock.recv(4 * 1024 * 1024)
            if not data:
                raise ConnectionError("the node closed the connection")
            chunk = tail + data
            got += chunk.count(marker)
            tail = chunk[-(len(marker) - 1) :]
            got -= tail.count(marker)
        return got


def run_stream_bench(args: argparse.Namespace) -> int:
    """Start a node, publish, catch up, print the rates."""
    count, size, batch = args.count, args.size, args.batch
    progress(
        f"settings: --scenario stream --count {count} --size {size} --batch {batch} --max-seconds {args.max_seconds:g}"
        f"{' --relaxed' if args.relaxed else ''} (defaults: 50000, 100, 1000, 60; fsync on)"
    )
    data_dir = tempfile.mkdtemp(prefix="pubsubclub-bench-stream-")
    port = free_port()
    node_args = ["--wamp", local(free_port()), "--psc", local(free_port()), "--stream", local(port),
                 "--data-dir", data_dir]  # fmt: skip
    if args.relaxed:
        node_args.append("--no-stream-fsync")
    progress("starting a node with --stream on 127.0.0.1, data dir " + data_dir)
    node, _ = start_node("bench-stream", node_args)
    try:
        deadline = time.monotonic() + args.max_seconds
        payload = os.urandom(size // 2).hex().encode()[:size].ljust(size, b"x")
        frame = c.encode(c.Publish("bench", payload))
        batches = count // batch
        block = c.encode(c.Batch(c.BatchType.COUNT, batch)) + frame * batch
        writer = _Client(port)
        writer.send(c.encode(c.Connect("bench-writer", "bench")))
        writer.events(1, deadline)
        progress(f"publishing {batches * batch} messages in {batches} batches, one OK per batch after the sync")
        cpu0, t0 = cpu_seconds(node.pid), time.perf_counter()
        window = 4  # batches in flight
        sent = acked = 0
        while acked < batches:
            while sent < batches and sent - acked < window:
                writer.send(block)
                sent += 1
            [status] = writer.events(1, deadline)
            assert isinstance(status, c.Status) and status.ok and status.count == batch, status
            acked += 1
        publish_seconds = time.perf_counter() - t0
        publish_cpu = cpu_seconds(node.pid) - cpu0
        total = batches * batch
        progress(f"published {total} in {publish_seconds:.2f} s; catching up from Earliest")
        reader = _Client(port)
        reader.send(c.encode(c.Connect("bench-reader", "bench")) + c.encode(c.Subscribe("bench", c.Position.EARLIEST)))
        cpu1, t1 = cpu_seconds(node.pid), time.perf_counter()
        got = reader.count(total, deadline)
        read_seconds = time.perf_counter() - t1
        read_cpu = cpu_seconds(node.pid) - cpu1
    finally:
        stop([node])
        shutil.rmtree(data_dir, ignore_errors=True)
    results: dict[str, Any] = {
        "machine": machine(),
        "scenario": "stream",
        "size": size,
        "batch": batch,
        "fsync": not args.relaxed,
        "published": total,
        "publish_rate": total / publish_seconds,
        "publish_cpu_us_per_msg": publish_cpu / total * 1e6,
        "caught_up": got,
        "catch_up_rate": got / read_seconds,
        "catch_up_cpu_us_per_msg": read_cpu / max(got, 1) * 1e6,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"stream publish, acked durable ({'fsync' if not args.relaxed else 'write only'}): "
            f"{results['publish_rate']:,.0f} msgs/s ({results['publish_cpu_us_per_msg']:.1f} us node CPU/msg); "
            f"catch-up from Earliest: {results['catch_up_rate']:,.0f} msgs/s "
            f"({results['catch_up_cpu_us_per_msg']:.1f} us node CPU/msg)"
        )
    return 0
