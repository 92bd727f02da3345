"""The node-local Dealer with Autobahn-Python clients on a real node: Basic Profile exchanges and every error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions
from helpers.nodes import NodeProcess, share_logs, unshare_logs
from helpers.wampclient import connect, leave
from twisted.internet import defer, reactor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node (shared: each test's sessions leave, taking their registrations with them)."""
    started = NodeProcess("rpc", tmp_path_factory.mktemp("dealer"))
    share_logs([started])
    try:
        yield started.start()
    finally:
        started.stop()
        unshare_logs([started])


async def call_error(session: Any, procedure: str, *args: Any, **kwargs: Any) -> ApplicationError:
    """The ApplicationError a call ends with (fails if it returns)."""
    try:
        result = await session.call(procedure, *args, **kwargs)
    except ApplicationError as e:
        return e
    raise AssertionError(f"the call returned {result!r}")


@pytest_twisted.ensureDeferred
async def test_register_call_result_with_args_and_kwargs(node: NodeProcess) -> None:
    """A callee's procedure answers a caller in another session; args and kwargs cross both ways."""
    callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)

    def add(a: int, b: int, scale: int = 1) -> dict[str, int]:
        return {"sum": (a + b) * scale}

    await callee.register(add, "com.example.add")
    assert await caller.call("com.example.add", 2, 3, scale=10) == {"sum": 50}
    await leave(callee, caller)


@pytest_twisted.ensureDeferred
async def test_duplicate_register_and_unknown_procedure(node: NodeProcess) -> None:
    """A second REGISTER gets procedure_already_exists; a CALL of nothing, and after UNREGISTER, no_such_procedure."""
    first, second, caller = await connect(node.wamp_url), await connect(node.wamp_url), await connect(node.wamp_url)
    registration = await first.register(lambda: "one", "com.example.only")
    with pytest.raises(ApplicationError) as e:
        await second.register(lambda: "two", "com.example.only")
    assert e.value.error == "wamp.error.procedure_already_exists"
    assert (await call_error(caller, "com.example.nobody")).error == "wamp.error.no_such_procedure"
    assert await caller.call("com.example.only") == "one"
    await registration.unregister()
    assert (await call_error(caller, "com.example.only")).error == "wamp.error.no_such_procedure"
    await second.register(lambda: "two", "com.example.only")  # free again
    assert await caller.call("com.example.only") == "two"
    await leave(first, second, caller)


@pytest_twisted.ensureDeferred
async def test_callee_error_reaches_the_caller_with_its_uri(node: NodeProcess) -> None:
    """A callee raising ApplicationError: the caller gets that URI and its args."""
    callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)

    def fail() -> None:
        raise ApplicationError("com.example.error.out_of_stock", "none left", item=7)

    await callee.register(fail, "com.example.buy")
    error = await call_error(caller, "com.example.buy")
    assert error.error == "com.example.error.out_of_stock"
    assert error.args == ("none left",) and error.kwargs == {"item": 7}
    await leave(callee, caller)


@pytest_twisted.ensureDeferred
async def test_callee_leaving_mid_call_ends_the_call_with_an_error(node: NodeProcess) -> None:
    """The callee goes away while a call waits for it: the caller gets wamp.error.canceled, not a hang."""
    callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)
    started: defer.Deferred[None] = defer.Deferred()

    def slow() -> defer.Deferred[str]:
        started.callback(None)
        return defer.Deferred()  # never answers

    await callee.register(slow, "com.example.slow")
    pending = defer.ensureDeferred(call_error(caller, "com.example.slow"))
    await started
    callee.disconnect()
    error = await pending.addTimeout(10, reactor)
    assert error.error == "wamp.error.canceled"
    await leave(caller)


@pytest_twisted.ensureDeferred
async def test_call_timeout_and_a_caller_leaving(node: NodeProcess) -> None:
    """CALL timeout (ms): ERROR wamp.error.timeout; a caller that leaves mid-call costs the callee nothing."""
    callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)
    answers: list[defer.Deferred[str]] = []
    invoked: list[defer.Deferred[None]] = [defer.Deferred(), defer.Deferred()]

    def held() -> defer.Deferred[str]:
        answers.append(defer.Deferred())
        invoked[len(answers) - 1].callback(None)
        return answers[-1]

    await callee.register(held, "com.example.held")
    await callee.register(lambda: "pong", "com.example.ping")
    error = await call_error(caller, "com.example.held", options=CallOptions(timeout=200))
    assert error.error == "wamp.error.timeout"
    answers[0].callback("too late")  # the late YIELD is dropped by the dealer
    leaving = await connect(node.wamp_url)
    leaving.call("com.example.held").addErrback(lambda _: None)
    await invoked[1].addTimeout(10, reactor)
    leaving.disconnect()
    answers[1].callback("nobody to tell")
    assert await caller.call("com.example.ping") == "pong"  # the callee and the dealer carry on
    await leave(callee, caller)


@pytest_twisted.ensureDeferred
async def test_calls_in_flight_are_bounded_per_caller(tmp_path: Path) -> None:
    """A callee that never answers cannot make the node hold calls without bound: one more gets ERROR at once."""
    bounded = NodeProcess("rpc", tmp_path, extra=("--wamp-max-pending-calls", "2")).start()
    try:
        callee, caller, other = [await connect(bounded.wamp_url) for _ in range(3)]
        held: list[defer.Deferred[str]] = []
        invoked: list[defer.Deferred[None]] = [defer.Deferred() for _ in range(4)]

        def hold() -> defer.Deferred[str]:
            held.append(defer.Deferred())
            invoked[len(held) - 1].callback(None)
            return held[-1]

        await callee.register(hold, "com.example.hold")
        first, second = caller.call("com.example.hold"), caller.call("com.example.hold")
        await defer.gatherResults([invoked[0], invoked[1]]).addTimeout(10, reactor)
        error = await defer.ensureDeferred(call_error(caller, "com.example.hold")).addTimeout(10, reactor)
        assert error.error == "pubsubclub.error.too_many_calls"
        assert "the limit is 2" in str(error.args[0])
        # The bound is per caller: another session still gets through, and an answer frees a place.
        third = other.call("com.example.hold")
        await invoked[2].addTimeout(10, reactor)
        held[0].callback("one")
        assert await first == "one"
        held[2].callback("three")
        assert await third == "three"
        fourth = caller.call("com.example.hold")
        await invoked[3].addTimeout(10, reactor)
        held[1].callback("two")
        held[3].callback("four")
        assert (await second, await fourth) == ("two", "four")
        await leave(callee, caller, other)
    finally:
        bounded.stop()


@pytest_twisted.ensureDeferred
async def test_a_caller_cancelling_its_call_keeps_its_session_and_interrupts_the_callee(node: NodeProcess) -> None:
    """Autobahn's Deferred.cancel() sends CANCEL: the callee's work is interrupted, both sessions carry on."""
    callee, caller = await connect(node.wamp_url), await connect(node.wamp_url)
    invoked: defer.Deferred[None] = defer.Deferred()
    interrupted: defer.Deferred[None] = defer.Deferred()

    def held() -> defer.Deferred[str]:
        invoked.callback(None)
        return defer.Deferred(lambda _: interrupted.callback(None))

    await callee.register(held, "com.example.held")
    await callee.register(lambda: "pong", "com.example.ping")
    pending = caller.call("com.example.held")
    pending.addErrback(lambda f: f.trap(defer.CancelledError))
    await invoked.addTimeout(10, reactor)
    pending.cancel()
    await interrupted.addTimeout(10, reactor)
    assert await caller.call("com.example.ping") == "pong"
    await leave(callee, caller)
