"""``pubsubclub bench --scenario calls``: cross-node RPC with Autobahn-Python clients.

Two nodes A and B are started (linked both ways); an Autobahn-Python callee
on B registers :data:`PROCEDURE` (it returns its argument) and an
Autobahn-Python caller on A calls it, JSON over WebSocket, each client in its
own process. Once a probe call has come back (the registration has crossed
the link), two runs:

* throughput: ``--count`` calls with ``--window`` of them in flight at any
  time (a new one leaves as each result arrives), bounded by
  ``--max-seconds``; calls/s = results / time from the first call to the last
  result;
* latency: ``--latency-count`` calls paced at ``--rate`` per second, each
  timed from CALL sent to RESULT received (round trip, the caller's clock).

The nodes' CPU per call is their user + system CPU (from ``/proc``, the
whole process tree) over the throughput run divided by the results. The same
runs go against two Crossbar routers joined by rlinks in ``make bench-peers``
(:mod:`pubsubclub.bench.peers`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from pubsubclub.bench.nodes import machine, node_pair, progress, stop, tree_cpu_seconds
from pubsubclub.bench.pacing import install_precise_reactor, until_due

PROCEDURE = "pubsubclub.bench.echo"
#: The caller retries its probe call this often until the callee's registration reached its node or router.
PROBE_INTERVAL = 0.05
#: Calls in flight in the throughput run unless ``--window`` says otherwise.
DEFAULT_WINDOW = 100


# -- the client processes (run with ``python -m pubsubclub.bench.calls``) -------------


def _lean_main(argv: list[str]) -> int:
    """``lean-callee URL REALM MAX_SECONDS`` or ``lean-caller URL REALM MAX_SECONDS MODE COUNT RATE WINDOW SIZE``."""
    import select

    from pubsubclub.bench import leancalls

    role, url, realm, max_seconds = argv[0], argv[1], argv[2], float(argv[3])
    if role == "lean-callee":

        def ready() -> None:
            sys.stdout.write(json.dumps({"ready": True}) + "\n")
            sys.stdout.flush()

        def stopped() -> bool:  # the driver closed our stdin
            return bool(select.select([sys.stdin], [], [], 0)[0]) and not sys.stdin.readline()

        result = leancalls.callee(url, realm, PROCEDURE, max_seconds, ready, stopped)
    else:
        mode, count, rate, window, size = argv[4], int(argv[5]), float(argv[6]), int(argv[7]), int(argv[8])
        result = leancalls.caller(url, realm, PROCEDURE, max_seconds, mode, count, rate, window, size)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


def _client_main(argv: list[str]) -> int:
    if argv[0].startswith("lean-"):
        return _lean_main(argv)
    import txaio

    txaio.use_twisted()
    install_precise_reactor()  # see pubsubclub.bench.pacing
    from twisted.internet import defer, task

    from pubsubclub.bench.wamp import defer_run

    role, url, realm, max_seconds = argv[0], argv[1], argv[2], float(argv[3])
    argv = argv[4:]
    result: dict[str, Any] = {}

    async def run(reactor: Any) -> None:
        from urllib.parse import urlsplit

        from autobahn.twisted.wamp import ApplicationSession
        from autobahn.twisted.websocket import WampWebSocketClientFactory
        from autobahn.wamp.exception import ApplicationError
        from autobahn.wamp.serializer import JsonSerializer
        from autobahn.wamp.types import ComponentConfig
        from twisted.internet.endpoints import TCP4ClientEndpoint

        from pubsubclub.net.nodelay import set_no_delay

        joined: defer.Deferred[Any] = defer.Deferred()

        class Session(ApplicationSession):  # type: ignore[misc]
            def onJoin(self, details: Any) -> None:
                joined.callback(self)

        factory = WampWebSocketClientFactory(
            lambda: Session(ComponentConfig(realm)), url=url, serializers=[JsonSerializer()]
        )
        parts = urlsplit(url)
        proto: Any = await TCP4ClientEndpoint(reactor, parts.hostname or "127.0.0.1", parts.port or 80).connect(factory)
        set_no_delay(proto.transport)  # as in pubsubclub.bench.wamp: a paced call must not wait for an ACK
        session = await joined.addTimeout(10, reactor)
        deadline = time.time() + max_seconds

        if role == "callee":
            state = {"n": 0}

            def echo(value: Any) -> Any:
                state["n"] += 1
                return value

            await session.register(echo, PROCEDURE)
            sys.stdout.write(json.dumps({"ready": True}) + "\n")
            sys.stdout.flush()
            cpu = time.process_time()
            # Until the driver closes our stdin (or the time bound): the caller's runs happen meanwhile.
            stdin_closed: defer.Deferred[None] = defer.Deferred()
            reactor.callInThread(lambda: (sys.stdin.read(), reactor.callFromThread(stdin_closed.callback, None)))
            try:
                await stdin_closed.addTimeout(max_seconds, reactor)
            except defer.TimeoutError:
                result["timed_out"] = True
            result.update(invocations=state["n"], cpu_seconds=time.process_time() - cpu)
        else:
            mode, count, rate, window = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
            body = "x" * int(argv[4])
            while True:  # the probe: the registration may take a moment to reach this node or router
                try:
                    await session.call(PROCEDURE, "probe")
                    break
                except ApplicationError as e:
                    if time.time() > deadline:
                        raise TimeoutError(f"the procedure never became callable: {e.error}") from None
                    await task.deferLater(reactor, PROBE_INTERVAL, lambda: None)
            start = time.time()
            cpu_start = time.process_time()
            sent = done = 0
            latencies: list[float] = []
            finished: defer.Deferred[None] = defer.Deferred()
            failures: list[str] = []

            stopped = [False]  # no more calls will be sent (all sent, or the time bound passed)

            def answered(_: Any) -> None:
                nonlocal done
                done += 1
                if (done == count or (stopped[0] and done == sent)) and not finished.called:
                    finished.callback(None)

            def failed(f: Any) -> None:
                failures.append(str(f.value))
                answered(None)

            if mode == "throughput":
                # The time bound ends the run early, not in error: calls/s is then what was answered by then.
                run_until = time.time() + max_seconds

                def next_call(_: Any = None) -> None:
                    nonlocal sent
                    if sent < count and time.time() < run_until:
                        sent += 1
                        d = session.call(PROCEDURE, body)
                        d.addCallbacks(answered, failed)
                        d.addBoth(next_call)
                    elif not stopped[0]:
                        stopped[0] = True
                        if done == sent and not finished.called:
                            finished.callback(None)

                for _ in range(min(window, count)):
                    next_call()
            else:
                interval = 1.0 / rate
                perf = time.perf_counter

                def timed(t0: float) -> Any:
                    def got(_: Any) -> None:
                        latencies.append(perf() - t0)
                        answered(None)

                    return got

                run_until = time.time() + max_seconds
                while sent < count and time.time() < run_until:
                    due = min(count, int((time.time() - start) / interval) + 1)
                    while sent < due:
                        sent += 1
                        session.call(PROCEDURE, body).addCallbacks(timed(perf()), failed)
                    await task.deferLater(reactor, until_due(start, sent, interval, time.time()), lambda: None)
                stopped[0] = True
                if done == sent and not finished.called:
                    finished.callback(None)
            try:
                # The run's time bound, then 30 s for the calls still in flight when sending stopped.
                await finished.addTimeout(max(run_until - time.time(), 0) + 30, reactor)
            except defer.TimeoutError:
                result["timed_out"] = True
            end = time.time()
            result.update(sent=sent, answered=done, failures=len(failures), first_failure=failures[:1], start=start,
                          end=end, cpu_seconds=time.process_time() - cpu_start)  # fmt: skip
            if latencies:
                latencies.sort()
                n = len(latencies)
                result["latency_ms"] = {
                    "p50": latencies[n // 2] * 1000,
                    "p99": latencies[min(n - 1, int(n * 0.99))] * 1000,
                    "max": latencies[-1] * 1000,
                }
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
        session.leave()

    task.react(lambda r: defer_run(run, r))
    return 0


# -- the driver ------------------------------------------------------------------


def _prefix(args: argparse.Namespace) -> str:
    """The client processes' role prefix: ``lean-`` for ``--client lean``."""
    return "lean-" if getattr(args, "client", "autobahn") == "lean" else ""


def _caller(url: str, args: argparse.Namespace, mode: str, count: int) -> dict[str, Any]:
    """One caller process's run; its result line."""
    cmd = [sys.executable, "-m", "pubsubclub.bench.calls", _prefix(args) + "caller", url, args.realm,
           str(args.max_seconds), mode, str(count), str(args.rate), str(args.window or DEFAULT_WINDOW),
           str(args.size)]  # fmt: skip
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=2 * args.max_seconds + 60, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    if result["failures"] or result.get("timed_out"):
        raise RuntimeError(f"{mode} run: {result['failures']} calls failed ({result['first_failure']}), "
                           f"{result['answered']} of {result['sent']} answered")  # fmt: skip
    return result


def measure_calls(args: argparse.Namespace, caller_url: str, callee_url: str, pids: list[int]) -> dict[str, Any]:
    """Callee on ``callee_url``, caller on ``caller_url``: the throughput and latency runs' figures.

    ``pids`` are the server processes (with their children) whose CPU is the servers' cost.
    """
    me = [sys.executable, "-m", "pubsubclub.bench.calls"]
    # The callee lives through both runs: its time bound covers them.
    callee = subprocess.Popen([*me, _prefix(args) + "callee", callee_url, args.realm, str(5 * args.max_seconds + 200)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert callee.stdout is not None and callee.stdin is not None
        if not callee.stdout.readline():
            raise RuntimeError("the callee did not register")
        progress(f"calls: throughput run, {args.count} calls with {args.window or DEFAULT_WINDOW} in flight")
        cpu_before = tree_cpu_seconds(pids)
        throughput = _caller(caller_url, args, "throughput", args.count)
        server_cpu = tree_cpu_seconds(pids) - cpu_before
        calls_per_s = throughput["answered"] / max(throughput["end"] - throughput["start"], 1e-9)
        progress(f"calls: {calls_per_s:.0f} calls/s; latency run, {args.latency_count} calls at {args.rate}/s")
        latency = _caller(caller_url, args, "latency", args.latency_count)
        out, _ = callee.communicate(timeout=30)  # closes its stdin: the callee ends
    finally:
        if callee.poll() is None:
            callee.kill()
            callee.wait(10)
    callee_result = json.loads(out.strip().splitlines()[-1])
    answered = max(throughput["answered"], 1)
    return {
        "calls": throughput["answered"],
        "calls_per_s": calls_per_s,
        "server_cpu_us_per_call": server_cpu / answered * 1e6,
        "caller_cpu_us_per_call": throughput["cpu_seconds"] / answered * 1e6,
        "callee_cpu_us_per_call": callee_result["cpu_seconds"] / max(callee_result["invocations"], 1) * 1e6,
        "latency_calls": latency["answered"],
        "p50_ms": latency["latency_ms"]["p50"],
        "p99_ms": latency["latency_ms"]["p99"],
        "max_ms": latency["latency_ms"]["max"],
    }


def run_calls_bench(args: argparse.Namespace) -> int:
    """Two nodes, callee on B, caller on A; print calls/s, p50/p99 and the nodes' CPU per call."""
    window = args.window or DEFAULT_WINDOW
    if getattr(args, "target", None):
        raise SystemExit("pubsubclub: error: --scenario calls starts its own two nodes; --target is for the wamp runs")
    if window < 1 or args.count < 1 or args.latency_count < 1 or args.rate < 1:
        raise SystemExit("pubsubclub: error: --window, --count, --latency-count and --rate must be at least 1")
    progress(
        f"settings: --scenario calls --count {args.count} --window {window} --latency-count {args.latency_count} "
        f"--rate {args.rate} --size {args.size} --max-seconds {args.max_seconds:g} (defaults: 50000, "
        f"{DEFAULT_WINDOW}, 5000, 1000, 100, 60); Autobahn-Python caller on A and callee on B, JSON over WebSocket"
    )
    progress("starting two nodes (bench-a, bench-b) on 127.0.0.1")
    (pa, ready_a), (pb, ready_b) = node_pair()
    try:
        progress(f"node pids: A {pa.pid}, B {pb.pid} (for a profiler)")
        figures = measure_calls(args, ready_a["wamp"], ready_b["wamp"], [pa.pid, pb.pid])
    finally:
        stop([pa, pb])
    results = {"machine": machine(), "scenario": "calls", "size": args.size, "window": window, **figures}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(format_calls(figures, args.rate))
    return 0


def format_calls(f: dict[str, Any], rate: float) -> str:
    """One line of a calls run's figures."""
    return (
        f"cross-node calls: {f['calls']} at {f['calls_per_s']:,.0f} calls/s, nodes' CPU "
        f"{f['server_cpu_us_per_call']:.1f} us/call (caller {f['caller_cpu_us_per_call']:.1f}, callee "
        f"{f['callee_cpu_us_per_call']:.1f} us/call); at {rate:g} calls/s: p50 {f['p50_ms']:.2f} ms, "
        f"p99 {f['p99_ms']:.2f} ms, max {f['max_ms']:.2f} ms"
    )


if __name__ == "__main__":
    raise SystemExit(_client_main(sys.argv[1:]))
