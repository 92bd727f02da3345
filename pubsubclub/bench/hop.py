"""``pubsubclub bench --scenario hop``: the host's own one-hop latency, no pub/sub at all.

A bench message crosses three loopback hops (publisher to A, A to B, B to
subscriber), each a send that wakes a sleeping process. This scenario times
one such hop with nothing else in it: a sender process sends
``--latency-count`` 20-byte messages paced at ``--rate`` per second over
loopback TCP (Nagle off), each stamped just before its ``sendall``; this
process receives them and times each just after the ``recv`` that brought
it. What is left is the kernel's and the hypervisor's: waking a process
that sleeps in ``recv``, and any stall of the host in between. Its p99 tells
how quiet the machine was in those seconds (``--scenario tail`` runs it
before each pair, docs/benchmarks.md).

The figures have the other latency runs' names (``latency_ms``, ``lost``,
``slowest_positions``, ``steal_seconds``). The run is bounded by
``--max-seconds`` plus :data:`CONNECT_SECONDS` for each of connecting and
ending.
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
from typing import Any

from pubsubclub.bench.lean import latency_summary
from pubsubclub.bench.nodes import machine, progress, steal_seconds, steal_text, stolen_since
from pubsubclub.bench.pacing import paced

#: One message: its number, its send time and padding to 20 bytes (about a WAMP frame's header and a little).
MESSAGE = struct.Struct("!Id8x")
#: Seconds the sender has to connect, and the receiver to be connected to.
CONNECT_SECONDS = 10.0


def _sender_main(argv: list[str]) -> int:
    """``python -m pubsubclub.bench.hop PORT COUNT RATE MAX_SECONDS``: send the paced messages, print how many."""
    port, count, rate, max_seconds = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    deadline = time.time() + max_seconds
    sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_SECONDS)
    sock.settimeout(None)  # blocking: with a timeout CPython polls before every send, a system call in the hop
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sent = 0
    for number in paced(time.time(), count, rate, deadline):
        sock.sendall(MESSAGE.pack(number, time.time()))
        sent = number + 1
    sock.close()
    sys.stdout.write(json.dumps({"sent": sent}) + "\n")
    return 0


def take_stamps(buffer: bytes) -> tuple[list[float], bytes]:
    """The send times of the whole messages at the start of ``buffer``, and the bytes of an unfinished one."""
    whole = len(buffer) - len(buffer) % MESSAGE.size
    return [sent_at for _, sent_at in MESSAGE.iter_unpack(buffer[:whole])], buffer[whole:]


def receive(listener: socket.socket, count: int, deadline: float) -> list[float]:
    """Accept the sender on ``listener`` and time its messages until ``count`` came, it closed or ``deadline``.

    SystemExit when no sender connects within :data:`CONNECT_SECONDS` (or by ``deadline``).
    """
    listener.settimeout(max(0.0, min(CONNECT_SECONDS, deadline - time.time())))
    try:
        conn, _ = listener.accept()
    except TimeoutError:
        raise SystemExit("pubsubclub: error: bench --scenario hop: the sender did not connect") from None
    latencies: list[float] = []
    rest = b""
    with conn:
        while len(latencies) < count:
            left = deadline - time.time()
            if left <= 0 or not select.select([conn], [], [], left)[0]:
                break
            chunk = conn.recv(65536)
            now = time.time()
            if not chunk:
                break
            stamps, rest = take_stamps(rest + chunk)
            latencies += [now - sent_at for sent_at in stamps]
    return latencies


def hop_run(count: int, rate: float, max_seconds: float) -> dict[str, Any]:
    """One run: the sender as a child process, this process receiving; the figures (a sender that fails: SystemExit)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        argv = [sys.executable, "-m", "pubsubclub.bench.hop", str(port), str(count), str(rate), f"{max_seconds:g}"]
        sender = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        progress(f"hop sender pid {sender.pid}")
        failed = "pubsubclub: error: bench --scenario hop: the sender exited with status {}"
        try:
            stolen_before = steal_seconds()
            latencies = receive(listener, count, time.time() + max_seconds + CONNECT_SECONDS)
            stolen = stolen_since(stolen_before)
            out, _ = sender.communicate(timeout=CONNECT_SECONDS)
        except SystemExit:
            if sender.poll() is not None and sender.returncode != 0:
                raise SystemExit(failed.format(sender.returncode)) from None
            raise
        finally:
            if sender.poll() is None:
                sender.kill()
            sender.wait(10)
    if sender.returncode != 0:
        raise SystemExit(failed.format(sender.returncode))
    sent = json.loads(out.strip().splitlines()[-1])["sent"]
    return {
        "mode": "latency",
        "client": "hop",
        "sent": sent,
        "received": len(latencies),
        "lost": sent - len(latencies),
        **latency_summary(latencies),
        "server_cpu_us_per_msg": None,
        "steal_seconds": stolen,
    }


def run_hop_bench(args: argparse.Namespace) -> int:
    """Run the one-hop probe, print its figures."""
    if args.target or args.client != "autobahn":
        raise SystemExit("pubsubclub: error: --scenario hop starts its own two processes (no --target or --client)")
    if args.rate < 1 or args.latency_count < 1 or not args.max_seconds > 0:
        raise SystemExit("pubsubclub: error: --rate and --latency-count must be at least 1, --max-seconds above 0")
    progress(
        f"settings: --scenario hop --rate {args.rate} --latency-count {args.latency_count} --max-seconds"
        f" {args.max_seconds:g} (defaults: 1000, 5000, 60); one loopback TCP hop, {MESSAGE.size}-byte messages"
    )
    latency = hop_run(args.latency_count, args.rate, args.max_seconds)
    results = {"machine": machine(), "scenario": "hop", "rate": args.rate, "latency": latency}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        lm = latency.get("latency_ms") or {}
        shown = ", ".join(f"{k} {lm[k]:.3f}" for k in ("p50", "p99", "p999", "max") if k in lm)
        print(
            f"one hop at {args.rate}/s: {shown or 'no message'} ms; sent {latency['sent']}, lost {latency['lost']}"
            + steal_text(latency)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(_sender_main(sys.argv[1:]))
