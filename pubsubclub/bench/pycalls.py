"""``pubsubclub bench --scenario pycalls``: the Python calls each node runs per relayed message, counted.

A paced message (one at a time, alone in its reactor turn) costs a node far
more CPU than the same message in a burst: the breadth of Python code it
touches, woken cold, is the cost (docs/benchmarks.md). This scenario counts
that breadth instead of timing it, so its figures do not move with the
machine's load:

* nodes A and B are real ``pubsubclub node`` processes on 127.0.0.1, linked
  both ways (:func:`~pubsubclub.bench.nodes.node_pair`, with a RawSocket
  listener), each started through this module's ``node`` mode
  (``python -m pubsubclub.bench.pycalls node OUT <node flags>``): SIGUSR1
  switches on a ``sys.setprofile`` hook counting every ``call`` event of the
  node's reactor thread, SIGUSR2 switches it off and writes the counts per
  function to ``OUT``; then the node runs as ``pubsubclub node`` would;
* a lean subscriber on B and a lean publisher on A (RawSocket, or WebSocket
  with ``--transport websocket``; :mod:`pubsubclub.bench.lean` and
  :mod:`pubsubclub.bench.leancalls`, in this process) relay :data:`WARM`
  plain PUBLISH messages (no acknowledge) to warm the nodes, then, counted
  on both nodes, ``--count`` more, each awaited at the subscriber as an
  EVENT before the next is sent;
* then the same counting over an idle window as long (what a node runs
  anyway, and the counting's own switch), subtracted;
* :data:`ROUNDS` times, busy and idle alternating: a periodic timer (a link
  heartbeat, a metrics tick) that fires in one window and not in the other
  would add or take away hundreds of calls, so each node's figures come from
  its busy window and its idle window with the fewest calls.

Calls per message = (busy - idle) / ``--count``, over all code and over
pubsubclub's own modules only, for node A (WAMP PUBLISH in -> PSC frame out
on the link) and node B (PSC frame in -> WAMP EVENT out). Generated code (a
dataclass's ``__init__``) counts as its caller's module's. What still varies
from run to run is a fraction of a call per message (the timer heap's
comparisons grow with the timers pending; a timer of a few milliseconds).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pubsubclub.bench.lean import connect
from pubsubclub.bench.nodes import machine, node_pair, progress, stop, wait_for, wait_interest

TOPIC = "pubsubclub.bench.pycalls"
#: Messages relayed before counting: the nodes' first-use paths (caches, the link's first frames) are not counted.
WARM = 200
#: Busy and idle windows, alternating; each node's figures are from its busy and idle window with the fewest calls.
ROUNDS = 3
#: Functions listed per node, most called per message first (the whole paced path is about 30-40).
TOP = 40
#: How long the driver waits for a node to answer SIGUSR1 (counting on) or SIGUSR2 (counts written).
SWITCH_SECONDS = 20.0

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../pubsubclub
_OWN = "pubsubclub/"


# -- the node wrapper (``python -m pubsubclub.bench.pycalls node OUT <node flags>``) ----------


def _function(code: Any) -> str:
    """``pubsubclub/federation/transport.py:Outbox.forward``, or ``twisted/internet/base.py:...`` for others.

    Generated code (``code`` is ``(generated, caller)``, e.g. a dataclass's ``__init__``) counts where it is called
    from: ``pubsubclub/core/hub.py:<generated __init__ called by Hub.publish>``.
    """
    if isinstance(code, tuple):
        generated, caller = code
        return _function(caller).rsplit(":", 1)[0] + f":<generated {generated.co_name} called by {caller.co_qualname}>"
    path = code.co_filename
    if path.startswith(_PACKAGE + os.sep):
        where = _OWN + os.path.relpath(path, _PACKAGE)
    else:
        where = path.rsplit("site-packages" + os.sep, 1)[-1] if "site-packages" in path else path
        where = "/".join(where.split(os.sep)[-3:])
    return f"{where}:{code.co_qualname}"


def _node_main(argv: list[str]) -> int:
    """Install the counting switch on SIGUSR1/SIGUSR2, then run ``pubsubclub node`` with ``argv[1:]``."""
    from collections import defaultdict

    out, node_args = argv[0], argv[1:]
    counts: defaultdict[Any, int] = defaultdict(int)

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename == "<string>":  # generated (a dataclass's __init__): its caller's, by name
                counts[(code, frame.f_back.f_code)] += 1
            else:
                counts[code] += 1

    def on(signum: int, frame: Any) -> None:
        counts.clear()
        with open(out + ".on", "w") as f:  # the driver's cue: counting from here
            f.write("on")
        sys.setprofile(hook)

    def off(signum: int, frame: Any) -> None:
        sys.setprofile(None)
        rows: dict[str, int] = {}
        for code, n in counts.items():
            if getattr(code, "co_filename", None) == __file__:
                continue  # this switch itself
            key = _function(code)
            rows[key] = rows.get(key, 0) + n
        with open(out + ".tmp", "w") as f:
            json.dump(rows, f)
        os.replace(out + ".tmp", out)

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from pubsubclub.cli.command import main

    return main(["node", *node_args])


# -- the driver ------------------------------------------------------------------


def _window(procs: list[subprocess.Popen[str]], outs: list[str], action: Callable[[], None]) -> list[dict[str, int]]:
    """Counting on in every node, ``action()``, counting off; each node's calls per function."""
    for out in outs:
        for path in (out, out + ".on"):
            if os.path.exists(path):
                os.unlink(path)
    for proc in procs:
        proc.send_signal(signal.SIGUSR1)
    wait_for("the nodes count calls", lambda: all(os.path.exists(o + ".on") for o in outs), SWITCH_SECONDS)
    action()
    for proc in procs:
        proc.send_signal(signal.SIGUSR2)
    wait_for("the nodes wrote their counts", lambda: all(os.path.exists(o) for o in outs), SWITCH_SECONDS)
    result = []
    for out in outs:
        with open(out) as f:
            result.append(json.load(f))
    return result


def _connect(transport: str, ready: dict[str, Any], realm: str, deadline: float) -> tuple[Any, Callable[[], bytes]]:
    """A lean session on a node: its ``send(payload)`` and a ``receive()`` of the next WAMP message."""
    session = connect(ready["rawsocket"] if transport == "rawsocket" else ready["wamp"], realm, deadline)
    return session.send, lambda: session.next_message(deadline)


def _least(windows: list[dict[str, int]]) -> dict[str, int]:
    """The window with the fewest calls: the one no periodic timer (heartbeat, metrics) fired in."""
    return min(windows, key=lambda counts: sum(counts.values()))


def _figures(busy: dict[str, int], idle: dict[str, int], n: int) -> dict[str, Any]:
    """One node's calls per message, all and pubsubclub's, and its most called functions."""
    all_busy, all_idle = sum(busy.values()), sum(idle.values())
    own_busy = sum(v for k, v in busy.items() if k.startswith(_OWN))
    own_idle = sum(v for k, v in idle.items() if k.startswith(_OWN))
    per = [(round((busy[k] - idle.get(k, 0)) / n, 2), k) for k in busy]
    top = sorted((row for row in per if row[0] > 0), key=lambda row: (-row[0], row[1]))[:TOP]
    return {
        "calls_per_message": round((all_busy - all_idle) / n, 2),
        "pubsubclub_calls_per_message": round((own_busy - own_idle) / n, 2),
        "calls_busy": all_busy,
        "calls_idle": all_idle,
        "top": [[k, v] for v, k in top],
    }


def measure_pycalls(args: argparse.Namespace) -> dict[str, Any]:
    """Start the counted node pair, relay the messages, count; the figures of node A and node B."""
    n, transport = args.count, args.transport
    tmp = tempfile.mkdtemp(prefix="pubsubclub-pycalls-")
    outs = [os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")]
    me = [sys.executable, "-m", "pubsubclub.bench.pycalls", "node"]
    progress("starting two counted nodes (bench-a, bench-b) on 127.0.0.1")
    nodes = node_pair(("--rawsocket", "tcp:0:interface=127.0.0.1"), commands=([*me, outs[0]], [*me, outs[1]]))
    procs = [p for p, _ in nodes]
    try:
        (pa, ready_a), (pb, ready_b) = nodes
        progress(f"node pids: A {pa.pid}, B {pb.pid}")
        deadline = time.time() + args.max_seconds
        sub_send, sub_receive = _connect(transport, ready_b, args.realm, deadline)
        sub_send(json.dumps([32, 1, {}, TOPIC]).encode())
        answer = json.loads(sub_receive())
        if answer[:2] != [33, 1]:
            raise RuntimeError(f"no SUBSCRIBED: {answer!r}")
        event = b"[36,%d," % answer[2]
        ops_a = ready_a["ops"] if ready_a["ops"].endswith("/") else ready_a["ops"] + "/"
        wait_interest(ops_a, [TOPIC])
        pub_send, _ = _connect(transport, ready_a, args.realm, deadline)
        head, tail = b"[16,", b',{},"' + TOPIC.encode() + b'",["' + b"x" * args.size + b'"]]'
        sent = [0]

        def publish(count: int) -> None:
            for _ in range(count):
                sent[0] += 1
                pub_send(head + str(sent[0]).encode() + tail)
                while not sub_receive().startswith(event):
                    pass
                if time.time() > deadline:
                    raise TimeoutError(f"--max-seconds {args.max_seconds:g} passed after {sent[0]} messages")

        progress(f"pycalls: {WARM} messages to warm the nodes, then {n} counted, one at a time ({transport})")
        publish(WARM)
        busy: list[list[dict[str, int]]] = []  # per round, per node
        idle: list[list[dict[str, int]]] = []
        for round_ in range(ROUNDS):
            t0 = time.time()
            busy.append(_window(procs, outs, lambda: publish(n)))
            elapsed = time.time() - t0
            progress(f"pycalls: round {round_ + 1} of {ROUNDS}: {n} messages in {elapsed:.2f} s; idle as long")
            idle.append(_window(procs, outs, functools.partial(time.sleep, elapsed)))
    finally:
        stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "transport": transport,
        "messages": n,
        "size": args.size,
        "warm": WARM,
        "rounds": ROUNDS,
        "relayed": sent[0],
        "window_seconds": round(elapsed, 3),
        "node_a": _figures(_least([b[0] for b in busy]), _least([i[0] for i in idle]), n),
        "node_b": _figures(_least([b[1] for b in busy]), _least([i[1] for i in idle]), n),
    }


def run_pycalls_bench(args: argparse.Namespace) -> int:
    """Count both nodes' Python calls per paced message; print them."""
    if getattr(args, "target", None):
        raise SystemExit("pubsubclub: error: --scenario pycalls starts its own two nodes; --target is for wamp runs")
    if args.count < 1 or args.size < 0:
        raise SystemExit("pubsubclub: error: --count must be at least 1 and --size at least 0")
    if getattr(args, "workers", 1) != 1:
        raise SystemExit("pubsubclub: error: --scenario pycalls counts one process per node: no --workers")
    progress(
        f"settings: --scenario pycalls --count {args.count} --transport {args.transport} --size {args.size} "
        f"--max-seconds {args.max_seconds:g} (defaults here: 500, rawsocket, 100, 60); lean clients, one plain "
        "PUBLISH at a time, each awaited as an EVENT before the next"
    )
    figures = measure_pycalls(args)
    results = {"machine": machine(), "scenario": "pycalls", **figures}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(format_pycalls(figures))
    return 0


_NODES = (("node_a", "node A (PUBLISH in -> PSC frame out)"), ("node_b", "node B (PSC frame in -> EVENT out)"))


def format_pycalls(f: dict[str, Any]) -> str:
    """Both nodes' calls per message and their most called functions."""
    lines = [f"Python calls per paced message ({f['messages']} messages, {f['transport']} clients, minus an idle "
             f"window as long; the least of {f['rounds']} rounds):"]  # fmt: skip
    for key, what in _NODES:
        node = f[key]
        lines.append(f"  {what}: {node['calls_per_message']:.2f} in all, "
                     f"{node['pubsubclub_calls_per_message']:.2f} in pubsubclub's functions")  # fmt: skip
        lines += [f"    {per:7.2f}  {name}" for name, per in node["top"]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "node":
        raise SystemExit(_node_main(sys.argv[2:]))
    raise SystemExit("usage: python -m pubsubclub.bench.pycalls node OUT <pubsubclub node flags>")
