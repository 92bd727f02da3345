"""The node's reactor (pubsubclub.net.reactor): plain dispatch, end-of-turn calls, and the node running on it."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from twisted.internet import task
from twisted.internet.abstract import FileDescriptor
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import globalLogPublisher

from pubsubclub.net.reactor import TurnReactor, at_turn_end, turn_end_hook


class _Reader(FileDescriptor):
    """A readable socket end that records each read and runs ``on_read`` (may return a disconnect reason)."""

    def __init__(self, reactor: Any, sock: socket.socket, seen: list[str], name: str, on_read: Any = None) -> None:
        super().__init__(reactor)
        self.sock, self.seen, self.name, self.on_read = sock, seen, name, on_read
        self.connected = 1

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> Any:  # noqa: N802 - Twisted API
        self.sock.recv(100)
        self.seen.append(self.name)
        return self.on_read() if self.on_read is not None else None

    def connectionLost(self, reason: Any) -> None:  # noqa: N802 - Twisted API
        self.seen.append(f"{self.name} lost")
        raise RuntimeError("a connectionLost that fails")


@pytest.fixture
def turn_reactor() -> Iterator[TurnReactor]:
    """A TurnReactor driven by hand (never installed)."""
    r = TurnReactor()
    yield r
    r.removeAll()
    r._poller.close()


def _ready(r: TurnReactor, seen: list[str], name: str, on_read: Any = None) -> tuple[_Reader, socket.socket]:
    """A reader registered with ``r`` whose peer already wrote one byte (so it is ready)."""
    ours, theirs = socket.socketpair()
    reader = _Reader(r, ours, seen, name, on_read)
    r.addReader(reader)
    theirs.send(b"x")
    return reader, theirs


def test_end_of_turn_calls_run_after_the_turns_events_in_order_without_timers(turn_reactor: TurnReactor) -> None:
    """Calls asked during a turn run after its events, in order, and a call may ask again in the same turn."""
    r = turn_reactor
    seen: list[str] = []

    def on_read() -> None:
        r.at_turn_end(lambda: seen.append("a") or r.at_turn_end(lambda: seen.append("c")))
        r.at_turn_end(lambda: seen.append("b"))

    _, peer1 = _ready(r, seen, "read1", on_read)
    _, peer2 = _ready(r, seen, "read2")
    r.doIteration(5.0)
    assert sorted(seen[:2]) == ["read1", "read2"]
    assert seen[2:] == ["a", "b", "c"]
    assert r.getDelayedCalls() == []  # no callLater(0) behind it
    peer1.close()
    peer2.close()


class _PollerSpy:
    """The reactor's epoll object, recording each timeout it is asked to wait."""

    def __init__(self, poller: Any) -> None:
        self.poller, self.timeouts = poller, []

    def poll(self, timeout: float, maxevents: int) -> Any:
        self.timeouts.append(timeout)
        return self.poller.poll(timeout, maxevents)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.poller, name)


def test_calls_asked_by_timers_run_before_the_reactor_blocks(turn_reactor: TurnReactor) -> None:
    """What a timer asked for runs before the poll, which then does not block (the calls may have scheduled more)."""
    r = turn_reactor
    seen: list[str] = []
    spy = _PollerSpy(r._poller)
    r._poller = spy
    r.callLater(0, lambda: r.at_turn_end(lambda: seen.append("flushed")))
    r.runUntilCurrent()
    assert seen == []
    r.doIteration(30.0)
    assert seen == ["flushed"]
    assert spy.timeouts == [0]
    r._poller = spy.poller
    r.doIteration(0.0)  # nothing asked: the timeout given is the one used
    assert spy.timeouts == [0]


def test_a_failure_escaping_dispatch_is_logged_and_the_turn_goes_on(
    turn_reactor: TurnReactor, logged_errors: list[dict[str, Any]]
) -> None:
    """A connection whose connectionLost raises is logged; the other ready connection and the turn's calls still run."""
    r = turn_reactor
    seen: list[str] = []

    def bad_read() -> Exception:
        r.at_turn_end(lambda: seen.append("end"))
        return ValueError("disconnect me")

    bad, peer1 = _ready(r, seen, "bad", bad_read)
    _, peer2 = _ready(r, seen, "good")
    r.doIteration(5.0)
    assert "bad lost" in seen and "good" in seen and seen[-1] == "end"
    assert any("a connectionLost that fails" in repr(e.get("log_failure") or e.get("failure")) for e in logged_errors)
    logged_errors.clear()
    peer1.close()
    peer2.close()


def test_a_failing_end_of_turn_call_is_logged_and_the_others_run(
    turn_reactor: TurnReactor, logged_errors: list[dict[str, Any]]
) -> None:
    """One end-of-turn call raising is logged; the calls after it still run."""
    r = turn_reactor
    seen: list[str] = []

    def boom() -> None:
        raise RuntimeError("end-of-turn boom")

    r.at_turn_end(boom)
    r.at_turn_end(lambda: seen.append("after"))
    r.doIteration(0.0)
    assert seen == ["after"]
    assert any("end-of-turn boom" in repr(e.get("log_failure")) for e in logged_errors)
    logged_errors.clear()


def test_other_reactors_get_a_call_later() -> None:
    """On a reactor without the hook (tests', a user's) the call is a callLater(0)."""
    clock = MemoryReactorClock()
    seen: list[str] = []
    at_turn_end(clock, lambda: seen.append("later"))
    assert seen == [] and len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert seen == ["later"]


def test_a_turn_reactor_runs_twisteds_loop() -> None:
    """Timers, stop and the main loop behave as on the stock epoll reactor."""
    r = TurnReactor()
    seen: list[str] = []
    task.deferLater(r, 0.01, lambda: seen.append("timer")).addCallback(lambda _: r.stop())
    r.run(installSignalHandlers=False)
    assert seen == ["timer"]


def test_a_node_process_runs_on_the_turn_reactor() -> None:
    """pubsubclub.node.run installs the turn reactor before anything imports Twisted's default."""
    code = (
        "import txaio; txaio.use_twisted(); from pubsubclub.node.run import node_reactor; "
        "print(type(node_reactor()).__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=dict(os.environ), check=True
    )
    assert out.stdout.strip() == "TurnReactor"


def test_turn_end_hook_asks_without_a_python_call_and_again_within_the_turn(turn_reactor: TurnReactor) -> None:
    """turn_end_hook on the node's reactor is its list's C append; calls asked through it (one asked while the turn
    ends, too) run at the turn's end, in order, as at_turn_end's do."""
    r = turn_reactor
    ask = turn_end_hook(r)
    assert type(ask).__name__ == "builtin_function_or_method"
    seen: list[str] = []

    def on_read() -> None:
        ask(lambda: seen.append("a") or ask(lambda: seen.append("c")))
        at_turn_end(r, lambda: seen.append("b"))

    _, peer = _ready(r, seen, "read", on_read)
    r.doIteration(5.0)
    assert seen == ["read", "a", "b", "c"] and r._turn_end == [] and r.getDelayedCalls() == []
    ask(lambda: seen.append("next turn"))
    r.doIteration(0.0)
    assert seen[-1] == "next turn"
    peer.close()


def test_turn_end_hook_on_other_reactors_is_a_call_later() -> None:
    """On a reactor without the hook turn_end_hook asks a callLater(0), as at_turn_end does."""
    clock = MemoryReactorClock()
    seen: list[str] = []
    turn_end_hook(clock)(lambda: seen.append("later"))
    assert seen == [] and len(clock.getDelayedCalls()) == 1
    clock.advance(0)
    assert seen == ["later"]


def _close(r: TurnReactor) -> None:
    """Close what a hand-made reactor holds open (its epoll and waker): nothing left for the collector to warn of."""
    r.removeAll()
    if r.waker is not None:
        r.waker.connectionLost(None)
    r._poller.close()


def test_the_main_loop_asks_twisted_for_timer_work_only_when_there_is_some() -> None:
    """Busy turns with no timer due call no runUntilCurrent; timers (new, due, chained, from a thread, cancelled in
    bulk) still run or are swept, and stop ends the loop."""
    import threading

    r = TurnReactor()
    seen: list[str] = []
    runs = turns = 0
    twisteds_run, twisteds_iteration = r.runUntilCurrent, r.doIteration

    def run() -> None:
        nonlocal runs
        runs += 1
        twisteds_run()

    def iteration(timeout: Any) -> None:
        nonlocal turns
        turns += 1
        twisteds_iteration(timeout)

    r.runUntilCurrent, r.doIteration = run, iteration  # type: ignore[method-assign]
    reads = 0

    def on_read() -> None:
        nonlocal reads
        reads += 1
        if reads < 30:
            peer.send(b"x")  # ready again: one more busy turn
        else:
            r.callLater(0, lambda: r.callLater(0.001, lambda: seen.append("chained")))
            threading.Thread(target=lambda: r.callFromThread(seen.append, "thread")).start()
            for call in [r.callLater(3600, seen.append, "never") for _ in range(60)]:
                call.cancel()
            r.callLater(0.05, r.stop)

    reader, peer = _ready(r, seen, "read", on_read)
    r.callLater(3600, seen.append, "far")  # a timer held, never due: the wait is bounded by it, nothing to run
    try:
        r.run(installSignalHandlers=False)
        assert reads == 30 and "chained" in seen and "thread" in seen and "never" not in seen and "far" not in seen
        assert turns >= 30 and runs < turns - 25, (runs, turns)
        assert len(r._pendingTimedCalls) < 60  # the cancelled ones swept (Twisted's rule: more than 50, over half)
    finally:
        peer.close()
        reader.sock.close()
        _close(r)


def test_an_error_escaping_a_turn_is_logged_as_critical_and_the_loop_goes_on(
    logged_errors: list[dict[str, Any]],
) -> None:
    """What a turn raises is logged (critical) and the next turn runs, as in Twisted's main loop."""
    r = TurnReactor()
    twisteds_iteration = r.doIteration
    failed = []

    def iteration(timeout: Any) -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError("turn boom")
        twisteds_iteration(timeout)

    r.doIteration = iteration  # type: ignore[method-assign]
    seen: list[str] = []
    r.callLater(0.01, lambda: (seen.append("timer"), r.stop()))
    try:
        r.run(installSignalHandlers=False)
    finally:
        _close(r)
    assert seen == ["timer"]
    assert any(
        "turn boom" in repr(e.get("log_failure")) and e.get("log_level").name == "critical" for e in logged_errors
    )
    logged_errors.clear()


def test_a_twisted_without_the_timer_attributes_gets_its_own_main_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """mainLoop relies on Twisted's private timer state only where it exists; else Twisted's own loop runs."""
    from twisted.internet.base import ReactorBase

    from pubsubclub.net import reactor as reactor_module

    twisteds_loop = ReactorBase.mainLoop
    loops: list[Any] = []

    def spy(self: Any) -> None:
        loops.append(self)
        twisteds_loop(self)

    monkeypatch.setattr(ReactorBase, "mainLoop", spy)
    for state, expected in ((reactor_module._TIMER_STATE, 0), (("_a_timer_attribute_twisted_renamed",), 1)):
        monkeypatch.setattr(reactor_module, "_TIMER_STATE", state)
        r = TurnReactor()
        seen: list[str] = []
        r.callLater(0.01, lambda: (seen.append("timer"), r.stop()))  # noqa: B023 - run before the next pass
        try:
            r.run(installSignalHandlers=False)
        finally:
            _close(r)
        assert seen == ["timer"] and len(loops) == expected


def test_a_failing_call_asked_during_a_turn_is_logged_and_the_others_run(
    turn_reactor: TurnReactor, logged_errors: list[dict[str, Any]]
) -> None:
    """At a turn's end (calls asked while its events were dispatched) one raising is logged; the rest still run."""
    r = turn_reactor
    seen: list[str] = []

    def boom() -> None:
        raise RuntimeError("turn-end boom")

    def on_read() -> None:
        r.at_turn_end(boom)
        r.at_turn_end(lambda: seen.append("after") or r.at_turn_end(lambda: seen.append("asked again")))

    _, peer = _ready(r, seen, "read", on_read)
    r.doIteration(5.0)
    assert seen == ["read", "after", "asked again"] and r._turn_end == []
    assert any("turn-end boom" in repr(e.get("log_failure")) for e in logged_errors)
    logged_errors.clear()
    peer.close()



class _Inner:
    """A connection's protocol: records what it reads and how it was lost; raises on b"boom"."""

    def __init__(self, trace: list[Any]) -> None:
        self.trace = trace
        self.transport: Any = None

    def makeConnection(self, transport: Any) -> None:  # noqa: N802 - Twisted API
        self.transport = transport

    def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
        self.trace.append(("read", data))
        if data == b"boom":
            raise RuntimeError("a protocol raising on its input")

    def connectionLost(self, reason: Any) -> None:  # noqa: N802 - Twisted API
        self.trace.append(("lost", reason.type.__name__))


class _Socket:
    """A connection's socket whose ``recv`` does what the test says (return bytes, or raise)."""

    def __init__(self, real: socket.socket, outcome: Any) -> None:
        self._real, self._outcome = real, outcome

    def recv(self, size: int) -> bytes:
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        return self._outcome  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _OnePoll:
    """The reactor's epoll object, answering its next poll with one event (then its real answers)."""

    def __init__(self, poller: Any, event: tuple[int, int]) -> None:
        self.poller, self.event = poller, event

    def poll(self, timeout: float, maxevents: int) -> Any:
        event, self.event = self.event, None
        return [event] if event is not None else self.poller.poll(timeout, maxevents)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.poller, name)


def _server_read(inline: bool, guarded: bool | None, outcome: Any, fileno_gone: bool = False) -> list[Any]:
    """A TCP connection on a TurnReactor (accepted behind the connection layer's guard, accepted plainly, or dialled:
    ``guarded`` True, False, None) given one epoll read event whose ``recv`` gives ``outcome``; read by doPoll itself
    (``inline``) or through Twisted's calls (a ``doRead`` of its own on the connection, which doPoll leaves to them).
    The trace of what the protocol saw, the guard's ``heard``, whether the connection is still read, what was logged,
    and its end."""
    import select

    from twisted.internet.protocol import ClientFactory, Factory

    from pubsubclub.net.edge import Edge, EdgeLimits

    r = TurnReactor()
    trace: list[Any] = []
    logged: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None:
            logged.append(type(event["log_failure"].value).__name__)

    edge = Edge(r, lambda *_: None, lambda *_: None)
    accepted: list[_Inner] = []
    factory = Factory() if guarded is not None else ClientFactory()
    factory.buildProtocol = lambda addr: accepted.append(_Inner(trace)) or accepted[-1]  # type: ignore[method-assign]
    if guarded is None:
        server = socket.create_server(("127.0.0.1", 0))
        server.settimeout(0)
        port: Any = server
        r.connectTCP("127.0.0.1", server.getsockname()[1], factory, timeout=5)
        for _ in range(100):
            r.doIteration(0.02)
            try:
                client, _ = server.accept()
                break
            except BlockingIOError:
                r.runUntilCurrent()  # the connector's first steps are timers'
        client.settimeout(5)
    else:
        listener = edge.guard("test", factory, EdgeLimits()) if guarded else factory
        port = r.listenTCP(0, listener, interface="127.0.0.1")
        client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5)
    globalLogPublisher.addObserver(observer)
    try:
        for _ in range(100):
            if accepted and accepted[0].transport is not None and "doRead" not in vars(accepted[0].transport):
                break
            r.doIteration(0.05)
        if guarded:
            (guard,) = listener.connections
            conn = guard.transport
            guard.heard = False
        else:
            conn = accepted[0].transport
        if not inline:
            conn.doRead = conn.doRead  # an instance doRead: doPoll hands the event to Twisted's _doReadOrWrite
        real = conn.socket
        conn.socket = _Socket(real, outcome)
        if fileno_gone:
            conn.fileno = lambda: -1
        r._poller = _OnePoll(r._poller, (real.fileno(), select.EPOLLIN))
        r.doIteration(0)
        r._poller = r._poller.poller
        if guarded:
            trace.append(("heard", guard.heard))
        trace.append(("still read", conn in r.getReaders()))
        trace.append(("logged", logged))
        if conn.connected:
            conn.socket = real
            conn.loseConnection()
            for _ in range(50):
                if ("lost", "ConnectionDone") in trace:
                    break
                r.doIteration(0.02)
    finally:
        globalLogPublisher.removeObserver(observer)
        edge.stop()
        client.close()
        if guarded is None:
            port.close()
        else:
            port.stopListening()
        for _ in range(5):
            r.doIteration(0)
        _close(r)
    return trace


_OUTCOMES = {
    "bytes": b"some bytes",
    "protocol-raises": b"boom",
    "end-of-input": b"",
    "would-block": BlockingIOError(errno.EWOULDBLOCK, "try again"),
    "reset": ConnectionResetError(errno.ECONNRESET, "reset"),
}


@pytest.mark.parametrize("guarded", [True, False, None], ids=["guarded", "plain", "dialled"])
@pytest.mark.parametrize("outcome", list(_OUTCOMES))
def test_a_tcp_read_made_by_the_turn_itself_does_what_twisteds_calls_do(outcome: str, guarded: bool | None) -> None:
    """doPoll's own read of a readable TCP connection (accepted, guarded or not, or dialled) has Twisted's outcomes:
    the bytes (the guard's heard set), a raise logged and the connection dropped, end of input and reset closing it
    with Twisted's reason, EWOULDBLOCK nothing."""
    trace = _server_read(True, guarded, _OUTCOMES[outcome])
    assert trace == _server_read(False, guarded, _OUTCOMES[outcome])
    assert trace[0] == ("read", _OUTCOMES[outcome]) or outcome in ("end-of-input", "would-block", "reset")


def test_a_connection_whose_descriptor_went_away_is_dropped_as_twisted_drops_it() -> None:
    """A connection whose fileno() says -1 is left to Twisted, which disconnects it (ConnectionFdescWentAway)."""
    trace = _server_read(True, True, b"unread", fileno_gone=True)
    assert trace == _server_read(False, True, b"unread", fileno_gone=True)
    assert ("lost", "ConnectionFdescWentAway") in trace


def test_a_guarded_connections_read_skips_twisteds_read_calls_and_the_guards() -> None:
    """On the node's reactor a guarded TCP connection's bytes reach its protocol with no Python call between the turn
    and the protocol (not Twisted's _doReadOrWrite, doRead, _dataReceived, nor the guard's dataReceived), heard set."""
    from twisted.internet.protocol import Factory

    from pubsubclub.net.edge import Edge, EdgeLimits

    r = TurnReactor()
    calls: list[str] = []
    seen: list[bytes] = []

    class Inner(_Inner):
        def dataReceived(self, data: bytes) -> None:  # noqa: N802 - Twisted API
            seen.append(data)

    factory = Factory()
    factory.buildProtocol = lambda addr: Inner([])  # type: ignore[method-assign]
    edge = Edge(r, lambda *_: None, lambda *_: None)
    listener = edge.guard("test", factory, EdgeLimits())
    port = r.listenTCP(0, listener, interface="127.0.0.1")
    client = socket.create_connection(("127.0.0.1", port.getHost().port), timeout=5)
    try:
        for _ in range(100):
            if listener.connections:
                break
            r.doIteration(0.05)
        (guard,) = listener.connections
        guard.heard = False
        client.sendall(b"hello")

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls.append(frame.f_code.co_name)

        for _ in range(100):
            calls.clear()
            sys.setprofile(hook)
            try:
                r.doIteration(0.05)
            finally:
                sys.setprofile(None)
            if seen:
                break
        assert seen == [b"hello"] and guard.heard
        assert calls == ["doPoll", "dataReceived"], calls
    finally:
        edge.stop()
        client.close()
        for connection in list(listener.connections):
            connection.transport.loseConnection()
        port.stopListening()
        for _ in range(5):
            r.doIteration(0)
        _close(r)


def test_the_main_loops_wait_keeps_twisteds_bounds_without_the_builtins() -> None:
    """Between busy turns the loop waits as Twisted's timeout would (a far timer: epoll's longest wait), computed
    without min() and max() calls (each a builtin call with keyword parsing, once per turn)."""
    from pubsubclub.net import reactor as reactor_module

    r = TurnReactor()
    spy = _PollerSpy(r._poller)
    r._poller = spy
    builtins_called: list[str] = []
    reads = 0

    def on_read() -> None:
        nonlocal reads
        reads += 1
        if reads < 10:
            peer.send(b"x")
        else:
            r.stop()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and frame.f_code.co_name == "mainLoop" and getattr(arg, "__name__", "") in ("min", "max"):
            builtins_called.append(arg.__name__)

    reader, peer = _ready(r, [], "read", on_read)
    far = r.callLater(10**9, lambda: None)
    sys.setprofile(hook)
    try:
        r.run(installSignalHandlers=False)
    finally:
        sys.setprofile(None)
        if far.active():
            far.cancel()
        peer.close()
        reader.sock.close()
        _close(r)
    assert reads == 10 and builtins_called == []
    # The first turn asks Twisted (a new timer); the busy turns after it bound the far timer to epoll's longest wait.
    assert spy.timeouts.count(reactor_module._LONGEST_WAIT) >= 8, spy.timeouts
