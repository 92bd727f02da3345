"""RPC across real node processes (PSC 0.7) with Autobahn-Python callers and callees on different nodes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, RegisterOptions
from helpers.nodes import Cluster, NodeProcess
from helpers.polling import until
from helpers.wampclient import connect, leave
from twisted.internet import defer

pytestmark = pytest.mark.slow

#: A link's liveness bound: ping interval plus ping timeout (docs/protocol.md), plus a margin for a loaded machine.
PING_BOUND = 5.0 + 5.0 + 5.0


def remote_registrations(node: NodeProcess) -> int:
    """Other nodes' registrations ``node``'s dealer holds."""
    return int(node.stats()["wamp"]["dealer"]["remote_registrations"])


async def call_error(session: Any, procedure: str, *args: Any, **kwargs: Any) -> ApplicationError:
    """The ApplicationError a call ends with (fails if it returns)."""
    try:
        result = await session.call(procedure, *args, **kwargs)
    except ApplicationError as e:
        return e
    raise AssertionError(f"the call returned {result!r}")


@pytest_twisted.ensureDeferred
async def test_call_progress_error_timeout_and_cancel_across_two_nodes(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """Caller on node 1, callee on node 2: result with args/kwargs, progressive results, the callee's ERROR
    (URI, args, kwargs), the call timeout, and CANCEL with INTERRUPT to the callee; already_exists on node 1."""
    cluster = cluster_factory(2)
    await cluster.linked()
    callee = await connect(cluster[1].wamp_url)
    caller = await connect(cluster[0].wamp_url)
    interrupted: list[str] = []

    def add(a: int, b: int, scale: int = 1) -> dict[str, int]:
        return {"sum": (a + b) * scale}

    def fail() -> None:
        raise ApplicationError("com.example.error.out_of_stock", "none left", item=7)

    async def count(n: int, details: Any = None) -> int:
        for i in range(n):
            details.progress(i)
        return n

    def hang() -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred(lambda _: interrupted.append("interrupted"))
        return d

    await callee.register(add, "com.example.add")
    await callee.register(fail, "com.example.buy")
    await callee.register(count, "com.example.count", options=RegisterOptions(details_arg="details"))
    await callee.register(hang, "com.example.hang")
    await until(lambda: remote_registrations(cluster[0]) == 4, "node 1 knows node 2's procedures")

    assert await caller.call("com.example.add", 2, 3, scale=10) == {"sum": 50}
    error = await call_error(caller, "com.example.buy")
    assert error.error == "com.example.error.out_of_stock"
    assert error.args == ("none left",) and error.kwargs == {"item": 7}
    progress: list[int] = []
    assert await caller.call("com.example.count", 3, options=CallOptions(on_progress=progress.append)) == 3
    assert progress == [0, 1, 2]
    error = await call_error(caller, "com.example.hang", options=CallOptions(timeout=300))
    assert error.error == "wamp.error.timeout"
    await until(lambda: interrupted == ["interrupted"], "the timed-out callee interrupted")
    pending = caller.call("com.example.hang")
    await until(lambda: node_calls(cluster[1]) == 1, "the call reached node 2")
    pending.cancel()
    with pytest.raises(defer.CancelledError):
        await pending
    await until(lambda: interrupted == ["interrupted"] * 2, "the canceled callee interrupted")

    other = await connect(cluster[0].wamp_url)
    with pytest.raises(ApplicationError) as e:
        await other.register(lambda: 0, "com.example.add")
    assert e.value.error == "wamp.error.procedure_already_exists"
    assert "node node2" in e.value.args[0]
    await until(lambda: node_calls(cluster[0]) == 0 and node_calls(cluster[1]) == 0, "no calls left in flight")
    await leave(callee, caller, other)


def node_calls(node: NodeProcess) -> int:
    """Calls in flight in ``node``'s dealer."""
    return int(node.stats()["wamp"]["dealer"]["calls"])


@pytest_twisted.ensureDeferred
async def test_shared_roundrobin_over_callees_on_two_nodes(cluster_factory: Callable[..., Cluster]) -> None:
    """A roundrobin procedure with callees on nodes 2 and 3 and node 1 itself: callers on node 1 reach each
    in turn, and node 3's callees leaving take it out of the rotation everywhere."""
    cluster = cluster_factory(3)
    await cluster.linked()
    sessions = [await connect(cluster[i].wamp_url) for i in (0, 1, 2)]
    shared = RegisterOptions(invoke="roundrobin")
    for i, session in enumerate(sessions):
        await session.register(lambda i=i: f"node{i + 1}", "com.example.rr", options=shared)
        # One at a time, so the order of registration (the rotation) is known.
        await until(lambda i=i: remote_registrations(cluster[0]) == i, "node 1 knows the callees")
    caller = await connect(cluster[0].wamp_url)
    got = [await caller.call("com.example.rr") for _ in range(6)]
    assert sorted(got) == ["node1", "node1", "node2", "node2", "node3", "node3"]
    assert got[:3] == got[3:]
    await leave(sessions[2])
    await until(lambda: remote_registrations(cluster[0]) == 1, "node 3's callee gone from node 1")
    assert sorted([await caller.call("com.example.rr") for _ in range(4)]) == ["node1", "node1", "node2", "node2"]
    await leave(caller, sessions[0], sessions[1])


@pytest_twisted.ensureDeferred
async def test_kill_9_of_the_callee_node_mid_call_errors_the_caller(
    cluster_factory: Callable[..., Cluster],
) -> None:
    """kill -9 of the callee's node mid-call: the caller gets ERROR node_unreachable within the link's
    liveness bound, never a hang; the procedure is gone, and comes back with the node."""
    cluster = cluster_factory(2)
    await cluster.linked()
    callee = await connect(cluster[1].wamp_url)
    caller = await connect(cluster[0].wamp_url)
    invoked: list[int] = []

    def hang() -> defer.Deferred[None]:
        invoked.append(1)
        return defer.Deferred()

    await callee.register(hang, "com.example.hang")
    await until(lambda: remote_registrations(cluster[0]) == 1, "node 1 knows node 2's procedure")
    pending = defer.ensureDeferred(call_error(caller, "com.example.hang"))
    await until(lambda: invoked == [1], "the callee invoked")
    cluster[1].kill()
    killed = time.monotonic()
    error = await pending
    assert time.monotonic() - killed < PING_BOUND
    assert error.error == "pubsubclub.error.node_unreachable"
    assert (await call_error(caller, "com.example.hang")).error == "wamp.error.no_such_procedure"
    cluster[1].start()
    callee = await connect(cluster[1].wamp_url)
    await callee.register(lambda: "back", "com.example.hang")
    await until(lambda: remote_registrations(cluster[0]) == 1, "the procedure back on node 1", timeout=30)
    assert await caller.call("com.example.hang") == "back"
    await leave(caller, callee)
