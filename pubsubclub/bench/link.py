"""``pubsubclub bench --scenario link``: the PSC link alone, node to node, no WAMP client anywhere.

What "the link alone" means here: two real nodes (the same :class:`Node` as
``pubsubclub node``, same flags, linked both ways with the default PSC
version), each run by a small agent *inside* its process
(``python -m pubsubclub.bench.link ROLE ... <node flags>``), so no
client protocol is measured at either end:

* on node A, the **injector** publishes on its hub exactly as a front-end
  does after decoding a client's message (``hub.publish(hub.envelope(topic,
  payload))``), up to :data:`CHUNK` per reactor turn, so a turn's messages
  leave in one batched PSC frame as they would under client load;
* on node B, a **counter** sink is subscribed on its hub (a local subscriber
  that costs one increment): each message went through A's forwarding (PSC
  encoding, the batch, the WebSocket frame, TCP) and B's receiving (frame,
  PSC decoding, envelope, ``hub.deliver_remote``, metrics).

Flow control: B publishes its count on :data:`ACK_TOPIC` every
:data:`ACK_EVERY` messages (over the B -> A link) and A keeps at most
``--window`` messages unacknowledged, so the link's queue cap is never hit
and the rate is what the slower side of the link sustains. Rate = messages
counted on B / (B's last message - A's first publish), same host clock. Both
agents' CPU (the whole node process: link, hub, metrics, injection, sink)
per message comes from ``/proc``. Bounded by ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from pubsubclub.bench.nodes import cpu_seconds, machine, node_pair, progress, stats, stop, wait_for, wait_interest

TOPIC = "pubsubclub.bench.link"
ACK_TOPIC = "pubsubclub.bench.link.ack"
ACK_EVERY = 1000
#: Messages injected per reactor turn at most.
CHUNK = 500


def _say(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Counter:
    """Node B's local subscriber: counts, acknowledges every ACK_EVERY, reports when all arrived."""

    def __init__(self, hub: Any, count: int) -> None:
        self.hub, self.count = hub, count
        self.received = 0
        self.first = 0.0

    def deliver(self, envelope: Any) -> bool:
        """One message from node A."""
        self.received += 1
        if self.received == 1:
            self.first = time.time()
        if self.received % ACK_EVERY == 0 or self.received == self.count:
            self.hub.publish(self.hub.envelope(ACK_TOPIC, self.received))
        if self.received == self.count:
            _say(received=self.received, first=self.first, last=time.time())
        return True


class Injector:
    """Node A's publisher on the hub, CHUNK per reactor turn within the window; the sink of B's acks."""

    def __init__(self, hub: Any, reactor: Any, count: int, size: int, window: int) -> None:
        self.hub, self.reactor = hub, reactor
        self.count, self.window = count, window
        self.payload = {"p": "x" * size}
        self.sent = self.acked = 0
        self.start = 0.0
        self.scheduled = False

    def go(self) -> None:
        """Start publishing."""
        self.start = time.time()
        self._step()

    def _step(self) -> None:
        self.scheduled = False
        hub, payload = self.hub, self.payload
        n = min(CHUNK, self.count - self.sent, self.window - (self.sent - self.acked))
        for _ in range(n):
            hub.publish(hub.envelope(TOPIC, payload))
        self.sent += n
        if self.sent == self.count:
            _say(sent=self.sent, start=self.start, end=time.time())
        elif self.sent - self.acked < self.window:
            self._later()

    def _later(self) -> None:
        if not self.scheduled:
            self.scheduled = True
            self.reactor.callLater(0, self._step)

    def deliver(self, envelope: Any) -> bool:
        """B's running count."""
        self.acked = max(self.acked, int(envelope.payload))
        if self.start and self.sent < self.count:
            self._later()
        return True


def agent_main(argv: list[str]) -> int:
    """Run a node (``argv[4:]`` are ``pubsubclub node`` flags) with the injector or the counter inside."""
    role, count, size, window = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    from pubsubclub.config import add_node_flags, node_config
    from pubsubclub.node.run import run_node

    flags = argparse.ArgumentParser(prog="pubsubclub node")
    add_node_flags(flags)
    config = node_config(flags.parse_args(argv[4:]))

    def on_ready(node: Any) -> None:
        from twisted.internet import reactor, threads

        if role == "counter":
            node.hub.subscribe(TOPIC, Counter(node.hub, count))
            return
        injector = Injector(node.hub, reactor, count, size, window)
        node.hub.subscribe(ACK_TOPIC, injector)
        # The driver's go, once both sides know each other's interest (a thread: stdin blocks).
        threads.deferToThread(sys.stdin.readline).addCallback(lambda line: injector.go() if line else None)

    return run_node(config, on_ready=on_ready)


def run_link_bench(args: argparse.Namespace) -> int:
    """Start the two agents, run the link at full speed, print the rate and CPU per message."""
    count, size = args.count, args.size
    window = args.window or 20_000
    if window < ACK_EVERY:
        raise SystemExit(f"pubsubclub: error: --window must be at least {ACK_EVERY} (B acknowledges every {ACK_EVERY})")
    progress(f"settings: --scenario link --count {count} --size {size} --window {window} --max-seconds "
             f"{args.max_seconds:g} (defaults: 50000, 100, 20000, 60)")  # fmt: skip
    me = [sys.executable, "-m", "pubsubclub.bench.link"]
    numbers = [str(count), str(size), str(window)]
    progress("starting node A (injector) and node B (counter) on 127.0.0.1")
    secret = getattr(args, "cluster_secret_file", None)
    if secret:
        progress(f"both nodes with --cluster-secret-file {secret}: proven and sealed links")
    nodes = node_pair(
        extra=("--cluster-secret-file", secret) if secret else (),
        commands=([*me, "injector", *numbers], [*me, "counter", *numbers]),
    )
    (pa, ready_a), (pb, ready_b) = nodes
    try:
        progress(f"node pids: A {pa.pid}, B {pb.pid} (for a profiler)")
        wait_interest(ready_a["ops"], [TOPIC])
        wait_for("node B knows A's interest in the acks",
                 lambda: len(stats(ready_b["ops"])["remote_interest"].get(ACK_TOPIC, ())) >= 1)  # fmt: skip
        progress(f"link run: {count} messages of {size} B injected on A's hub, counted on B's")
        cpu_before = cpu_seconds(pa.pid) + cpu_seconds(pb.pid)
        assert pa.stdin is not None and pa.stdout is not None and pb.stdout is not None
        pa.stdin.write("go\n")
        pa.stdin.flush()
        deadline = time.monotonic() + args.max_seconds
        outs = []
        for proc in (pa, pb):
            outs.append(_result_line(proc, deadline))
        spent = cpu_seconds(pa.pid) + cpu_seconds(pb.pid) - cpu_before
    finally:
        stop([pa, pb])
    injected, counted = outs
    results = {
        "machine": machine(),
        "scenario": "link",
        "size": size,
        "window": window,
        "sealed": bool(secret),
        "sent": injected["sent"],
        "received": counted["received"],
        "lost": injected["sent"] - counted["received"],
        "rate": counted["received"] / max(counted["last"] - injected["start"], 1e-9),
        "server_cpu_us_per_msg": spent / max(counted["received"], 1) * 1e6,
    }
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(
            f"link alone: {results['received']:,} of {results['sent']:,} messages A -> B at "
            f"{results['rate']:,.0f} msgs/s, lost {results['lost']}, both nodes' CPU "
            f"{results['server_cpu_us_per_msg']:.1f} us/msg"
        )
    return 0


def _result_line(proc: Any, deadline: float) -> dict[str, Any]:
    """The agent's result line, read within the time bound (a thread-free wait on its stdout)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(deadline - time.monotonic(), 0.1)):
            raise TimeoutError("the link run did not finish within --max-seconds")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"an agent exited early (status {proc.wait(10)})")
    result: dict[str, Any] = json.loads(line)
    return result


if __name__ == "__main__":
    raise SystemExit(agent_main(sys.argv[1:]))
