"""RPC through ``pubsubclub bridge``: a real Crossbar.io router, a bridge and a node, Autobahn-Python clients.

The router, the bridge and the node are shared by the module (Crossbar takes
seconds to start); each test uses its own procedures and ends with its
sessions gone, so the next one starts from no registrations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from autobahn.wamp.types import CallOptions, CallResult, RegisterOptions
from helpers.bridgeproc import BridgeProcess
from helpers.nodes import Cluster, NodeProcess, start_all
from helpers.polling import until
from helpers.wampclient import connect, leave
from twisted.internet import defer

from pubsubclub.testing.crossbar import CrossbarProcess

pytestmark = pytest.mark.slow


class Setup:
    """One Crossbar router, its bridge, and one node linked with the bridge."""

    def __init__(self, router: CrossbarProcess, bridge: BridgeProcess, node: NodeProcess) -> None:
        self.router = router
        self.bridge = bridge
        self.node = node

    def rpc(self) -> dict[str, Any]:
        """The bridge's ``/stats`` -> ``bridge.rpc``."""
        return dict(self.bridge.bridge_stats()["rpc"])

    def remote_registrations(self) -> int:
        """Other nodes' registrations the node's dealer holds (the bridge's mirrors)."""
        return int(self.node.stats()["wamp"]["dealer"]["remote_registrations"])

    async def router_client(self) -> Any:
        """An Autobahn session on the router (the ``app`` role)."""
        return await connect(self.router.url, authid="client-1", ticket="ticket-of-client-1")

    async def mirrored(self, *uris: str) -> None:
        """Until the bridge mirrors exactly ``uris`` (exact match) into the cluster and the node holds them."""
        want = sorted(["exact", u] for u in uris)
        await until(
            lambda: self.rpc()["mirrored"] == want and self.remote_registrations() == len(uris),
            f"bridge mirrors exactly {uris}",
        )

    async def forwarding(self, *uris: str) -> None:
        """Until the bridge holds exactly ``uris`` (exact match) as forwarding registrations on the router."""
        want = sorted(["exact", u] for u in uris)
        await until(lambda: self.rpc()["forwarding"] == want, f"bridge forwards exactly {uris}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, crossbar_routers: list[CrossbarProcess]) -> Iterator[Setup]:
    """Crossbar (the run's shared router) + bridge + node for the module."""
    tmp = tmp_path_factory.mktemp("bridge-rpc")
    router = crossbar_routers[0]
    started: list[NodeProcess] = []
    try:
        node = NodeProcess("node1", tmp)
        bridge = BridgeProcess("bridge1", tmp, router, "bridge-1")
        node.peers = [bridge.psc_url]
        bridge.peers = [node.psc_url]
        started += [node, bridge]
        start_all(started)  # start-ups overlap
        Cluster([node, bridge]).wait_linked()
        yield Setup(router, bridge, node)
    finally:
        for member in started:
            member.stop()


async def call_error(session: Any, procedure: str, *args: Any, **kwargs: Any) -> ApplicationError:
    """The ApplicationError a call ends with (fails if it returns)."""
    try:
        result = await session.call(procedure, *args, **kwargs)
    except ApplicationError as e:
        return e
    raise AssertionError(f"the call returned {result!r}")


async def callees(session: Any, procedure: str) -> list[int]:
    """The router's callees of ``procedure`` (its registration meta API)."""
    reg_id = await session.call("wamp.registration.lookup", procedure)
    assert reg_id is not None, f"{procedure} is not registered on the router"
    return sorted(await session.call("wamp.registration.list_callees", reg_id))


@pytest_twisted.ensureDeferred
async def test_router_callee_from_node_and_node_callee_from_router_without_loops(setup: Setup) -> None:
    """A Crossbar callee answers a node caller and a node callee a Crossbar caller; one registration each side."""
    on_router = await setup.router_client()
    on_node = await connect(setup.node.wamp_url)
    try:

        def add(a: int, b: int, scale: int = 1) -> dict[str, int]:
            return {"sum": (a + b) * scale}

        def pair(x: Any) -> CallResult:
            return CallResult(x, [x], tag="node")

        await on_router.register(add, "rpcb.router.add")
        await on_node.register(pair, "rpcb.node.pair")
        await setup.mirrored("rpcb.router.add")
        await setup.forwarding("rpcb.node.pair")

        assert await on_node.call("rpcb.router.add", 2, 3, scale=2) == {"sum": 10}
        got = await on_router.call("rpcb.node.pair", {"k": 1})
        assert isinstance(got, CallResult)
        assert (list(got.results), got.kwresults) == ([{"k": 1}, [{"k": 1}]], {"tag": "node"})

        # No loop, exact counts: the router's procedure has its client as only callee (the bridge never
        # registers it back), the node's has the bridge; the cluster holds one mirror, the router one forward.
        bridge_session = setup.bridge.bridge_stats()["session"]
        assert await callees(on_router, "rpcb.router.add") == [on_router._session_id]
        assert await callees(on_router, "rpcb.node.pair") == [bridge_session]
        assert setup.rpc()["mirrored"] == [["exact", "rpcb.router.add"]]
        assert setup.rpc()["forwarding"] == [["exact", "rpcb.node.pair"]]
        # The bridge's own registrations (the lock, the forward) are never offered to the cluster.
        assert setup.remote_registrations() == 1
    finally:
        await leave(on_router, on_node)
    await setup.mirrored()
    await setup.forwarding()


@pytest_twisted.ensureDeferred
async def test_errors_pass_and_a_vanished_procedure_is_a_clean_error(setup: Setup) -> None:
    """Callee ERRORs (URI, args, kwargs) pass both ways; a Crossbar callee that leaves takes its procedure along."""
    on_router = await setup.router_client()
    on_node = await connect(setup.node.wamp_url)
    try:

        def router_fails(n: int) -> None:
            raise ApplicationError("com.example.error.router", "router says no", n, item=7)

        def node_fails(n: int) -> None:
            raise ApplicationError("com.example.error.node", "node says no", n, item=8)

        await on_router.register(router_fails, "rpcb.router.fails")
        await on_node.register(node_fails, "rpcb.node.fails")
        await setup.mirrored("rpcb.router.fails")
        await setup.forwarding("rpcb.node.fails")

        e = await call_error(on_node, "rpcb.router.fails", 1)
        assert (e.error, list(e.args), e.kwargs) == ("com.example.error.router", ["router says no", 1], {"item": 7})
        e = await call_error(on_router, "rpcb.node.fails", 2)
        assert (e.error, list(e.args), e.kwargs) == ("com.example.error.node", ["node says no", 2], {"item": 8})

        # The router's callee leaves: its procedure leaves the cluster, a call gets a clean error.
        await leave(on_router)
        await setup.mirrored()
        e = await call_error(on_node, "rpcb.router.fails", 3)
        assert e.error == "wamp.error.no_such_procedure"
        assert setup.remote_registrations() == 0
    finally:
        await leave(on_router, on_node)
    await setup.forwarding()


@pytest_twisted.ensureDeferred
async def test_progress_patterns_and_cancel_cross_the_bridge(setup: Setup) -> None:
    """Progressive results both ways, prefix registrations both ways with details.procedure, CANCEL -> INTERRUPT."""
    on_router = await setup.router_client()
    on_node = await connect(setup.node.wamp_url)
    interrupted: list[str] = []
    try:

        def count(n: int, details: Any = None) -> int:
            for i in range(n):
                details.progress(i, side="router")
            return n

        async def node_count(n: int, details: Any = None) -> int:
            for i in range(n):
                details.progress(i, side="node")
            return n

        def prefixed(details: Any = None) -> str:
            return str(details.procedure)

        def never(details: Any = None) -> defer.Deferred[None]:
            return defer.Deferred(lambda _: interrupted.append("router"))

        await on_router.register(count, "rpcb.router.count", options=RegisterOptions(details_arg="details"))
        await on_router.register(prefixed, "rpcb.pfx.", options=RegisterOptions(match="prefix", details_arg="details"))
        await on_router.register(never, "rpcb.router.never", options=RegisterOptions(details_arg="details"))
        await on_node.register(node_count, "rpcb.node.count", options=RegisterOptions(details_arg="details"))
        await on_node.register(prefixed, "rpcb.npfx.", options=RegisterOptions(match="prefix", details_arg="details"))
        await until(lambda: len(setup.rpc()["mirrored"]) == 3, "three router procedures mirrored")
        assert ["prefix", "rpcb.pfx."] in setup.rpc()["mirrored"]
        await until(
            lambda: setup.rpc()["forwarding"] == [["exact", "rpcb.node.count"], ["prefix", "rpcb.npfx."]],
            "the node's exact and prefix procedures forwarded",
        )

        seen: list[Any] = []
        total = await on_node.call(
            "rpcb.router.count", 3, options=CallOptions(on_progress=lambda i, side: seen.append((i, side)))
        )
        assert (total, seen) == (3, [(0, "router"), (1, "router"), (2, "router")])
        seen.clear()
        total = await on_router.call(
            "rpcb.node.count", 2, options=CallOptions(on_progress=lambda i, side: seen.append((i, side)))
        )
        assert (total, seen) == (2, [(0, "node"), (1, "node")])

        assert await on_node.call("rpcb.pfx.a.b") == "rpcb.pfx.a.b"
        assert await on_router.call("rpcb.npfx.c.d") == "rpcb.npfx.c.d"

        pending = on_node.call("rpcb.router.never")
        await until(lambda: setup.rpc()["calls_into_router"] == 1, "the call reached the router")
        pending.cancel()
        e: Any = None
        try:
            await pending
        except Exception as caught:
            e = caught
        assert e is not None
        await until(lambda: interrupted == ["router"], "the Crossbar callee interrupted")
        await until(lambda: setup.rpc()["calls_into_router"] == 0, "no call left in flight through the bridge")
    finally:
        await leave(on_router, on_node)
    await setup.mirrored()
    await setup.forwarding()


@pytest_twisted.ensureDeferred
async def test_shared_procedure_on_router_and_node_never_loops(setup: Setup) -> None:
    """A roundrobin procedure with a callee on the router and one on the node: every call from either side is
    answered once by one of them, both get calls, and none goes round the bridge in a loop."""
    on_router = await setup.router_client()
    on_node = await connect(setup.node.wamp_url)
    try:
        served: list[str] = []

        def on(side: str) -> Any:
            def serve() -> str:
                served.append(side)
                return side

            return serve

        shared = RegisterOptions(invoke="roundrobin")
        await on_router.register(on("router"), "rpcb.shared", options=shared)
        await on_node.register(on("node"), "rpcb.shared", options=shared)
        await setup.mirrored("rpcb.shared")
        await setup.forwarding("rpcb.shared")
        answers = [await on_router.call("rpcb.shared") for _ in range(6)]
        answers += [await on_node.call("rpcb.shared") for _ in range(6)]
        assert sorted(answers) == sorted(served) and len(served) == 12
        assert set(served) == {"router", "node"}
        assert setup.rpc()["calls_from_router"] == 0 and setup.rpc()["calls_into_router"] == 0
    finally:
        await leave(on_router, on_node)
    await setup.mirrored()
    await setup.forwarding()
