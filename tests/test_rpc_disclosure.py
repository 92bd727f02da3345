"""Caller disclosure across two real nodes (issue 20, point 1), with Autobahn-Python sessions.

Node 1 runs the default ``[wamp] disclose-caller = on-request``, node 2
``always``. Autobahn-Python has no ``disclose_me`` call option nor a
``disclose_caller`` register option, so the test's sessions add them to the
raw CALL and REGISTER they send (the node reads the options, as any router).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp import message
from autobahn.wamp.types import RegisterOptions
from helpers.nodes import Cluster, NodeProcess, start_all
from helpers.polling import until
from helpers.wampclient import connect, leave

pytestmark = pytest.mark.slow

POLICY = """\
anonymous = "guest"
[roles.guest]
subscribe = [""]
publish = [""]
[roles.writer]
subscribe = [""]
publish = [""]
[[principals]]
authid = "alice"
role = "writer"
ticket = "alice-ticket"
"""


class _DisclosingCall(message.Call):  # type: ignore[misc]
    """A CALL with ``disclose_me: true``."""

    __slots__ = ()

    def marshal(self) -> list[Any]:
        raw: list[Any] = super().marshal()
        raw[2]["disclose_me"] = True
        return raw


class _SpoofingCall(message.Call):  # type: ignore[misc]
    """A CALL whose options name another caller (Autobahn's router-to-router fields): never believed."""

    __slots__ = ()

    def marshal(self) -> list[Any]:
        raw: list[Any] = super().marshal()
        raw[2].update(caller=1, caller_authid="root", caller_authrole="admin")
        return raw


class _DisclosingRegister(message.Register):  # type: ignore[misc]
    """A REGISTER with ``disclose_caller: true``."""

    __slots__ = ()

    def marshal(self) -> list[Any]:
        raw: list[Any] = super().marshal()
        raw[2]["disclose_caller"] = True
        return raw


def _with_option(session: ApplicationSession, kind: type, marked: type, start: Any) -> Any:
    """Run ``start()`` (which sends one ``kind`` message) with that message sent as ``marked``."""
    transport = session._transport
    send = transport.send

    def marking(msg: Any) -> None:
        if type(msg) is kind:
            msg.__class__ = marked
        send(msg)

    transport.send = marking
    try:
        return start()
    finally:
        transport.send = send


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Node 1 (disclose-caller on-request) and node 2 (always), both with an --auth policy."""
    tmp = tmp_path_factory.mktemp("disclosure")
    policy = tmp / "auth.toml"
    policy.write_text(POLICY)
    nodes = [
        NodeProcess("node1", tmp, extra=("--auth", str(policy))),
        NodeProcess("node2", tmp, extra=("--auth", str(policy), "--wamp-disclose-caller", "always")),
    ]
    nodes[0].peers, nodes[1].peers = [nodes[1].psc_url], [nodes[0].psc_url]
    start_all(nodes)  # start-ups overlap
    cluster = Cluster(nodes)
    try:
        cluster.wait_linked()
        yield cluster
    finally:
        for n in nodes:
            n.stop()


def whoami(details: Any = None) -> list[Any]:
    """A procedure answering who called it, as its INVOCATION said."""
    return [details.caller, details.caller_authid, details.caller_authrole]


def remote_registrations(node: NodeProcess) -> int:
    """Other nodes' registrations ``node``'s dealer holds."""
    return int(node.stats()["wamp"]["dealer"]["remote_registrations"])


@pytest_twisted.ensureDeferred
async def test_disclose_me_disclose_caller_and_always_across_nodes(pair: Cluster) -> None:
    """disclose_me and disclose_caller name the caller to a callee on the other node; ``always`` names every caller;
    otherwise nobody is named; WELCOME announces caller_identification."""
    alice1 = await connect(pair[0].wamp_url, authid="alice", ticket="alice-ticket")
    alice2 = await connect(pair[1].wamp_url, authid="alice", ticket="alice-ticket")
    callee1 = await connect(pair[0].wamp_url)
    callee2 = await connect(pair[1].wamp_url)
    try:
        assert alice1._router_roles["dealer"].caller_identification is True
        opts = RegisterOptions(details_arg="details")
        await callee2.register(whoami, "disc.plain", options=opts)
        await _with_option(
            callee2, message.Register, _DisclosingRegister, lambda: callee2.register(whoami, "disc.asks", options=opts)
        )
        await callee1.register(whoami, "disc.on1", options=opts)
        await until(lambda: remote_registrations(pair[0]) == 2, "node 1 knows node 2's procedures")
        await until(lambda: remote_registrations(pair[1]) == 1, "node 2 knows node 1's procedure")
        one = [alice1._session_id, "alice", "writer"]
        two = [alice2._session_id, "alice", "writer"]
        nobody = [None, None, None]

        assert await alice1.call("disc.plain") == nobody
        assert await _with_option(alice1, message.Call, _DisclosingCall, lambda: alice1.call("disc.plain")) == one
        assert await alice1.call("disc.asks") == one
        # Node 2 discloses every caller, to a callee on node 1 too.
        assert await alice2.call("disc.on1") == two
        # On one node as across nodes.
        assert await _with_option(alice2, message.Call, _DisclosingCall, lambda: alice2.call("disc.plain")) == two
        # A caller cannot name someone else: its own caller* options are ignored.
        assert await _with_option(alice1, message.Call, _SpoofingCall, lambda: alice1.call("disc.plain")) == nobody
        assert await _with_option(alice1, message.Call, _SpoofingCall, lambda: alice1.call("disc.asks")) == one
    finally:
        await leave(alice1, alice2, callee1, callee2)
