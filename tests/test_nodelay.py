"""Every TCP connection a node or bridge holds for clients, links and its router has Nagle's algorithm off.

Checked on the node process's own sockets: the test (the node's parent) takes
a duplicate of each of the node's connected sockets with ``pidfd_getfd`` and
reads the option there, so nothing in the node is asked to report on itself.
"""

from __future__ import annotations

import ctypes
import os
import socket
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from helpers.bridgeproc import BridgeProcess
from helpers.nodes import NodeProcess, start_cluster
from helpers.polling import wait_until

from pubsubclub.testing.crossbar import CrossbarProcess

pytestmark = pytest.mark.slow

#: Linux's pidfd_getfd system call number (the same on x86-64 and arm64); Python has no wrapper.
SYS_PIDFD_GETFD = 438


@contextmanager
def pidfd(pid: int) -> Iterator[int]:
    """A pidfd of process ``pid``, closed afterwards."""
    fd = os.pidfd_open(pid)
    try:
        yield fd
    finally:
        os.close(fd)


def tcp_connections(pid: int) -> dict[tuple[int, int], bool]:
    """(local port, peer port) -> TCP_NODELAY, for every connected TCP socket of process ``pid``."""
    libc = ctypes.CDLL(None, use_errno=True)
    found: dict[tuple[int, int], bool] = {}
    with pidfd(pid) as pfd:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except FileNotFoundError:
                continue  # closed meanwhile
            dup = libc.syscall(SYS_PIDFD_GETFD, pfd, int(name), 0)
            if dup < 0:
                errno = ctypes.get_errno()
                assert errno == 9, f"pidfd_getfd failed: {os.strerror(errno)}"  # EBADF: closed meanwhile
                continue
            with closing(socket.socket(fileno=dup)) as sock:
                if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                    continue
                try:
                    peer = sock.getpeername()
                except OSError:
                    continue  # a listener
                found[(sock.getsockname()[1], peer[1])] = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    return found


def test_client_and_link_connections_have_nagle_off(tmp_path: Path) -> None:
    """WAMP (WebSocket and RawSocket), NSD, TEP, stream and both ends of PSC links: TCP_NODELAY on each."""
    cluster = start_cluster(tmp_path, 2, extra=("--rawsocket", "tcp:0:interface=127.0.0.1"), frontends=True)
    try:
        cluster.wait_linked()
        one: NodeProcess = cluster[0]
        two: NodeProcess = cluster[1]
        assert one.proc is not None
        rawsocket_port = int(one.ready["rawsocket"].rsplit(":", 1)[1])
        listeners = {
            "wamp": one.wamp_port,
            "rawsocket": rawsocket_port,
            "nsd": one.nsd_port,
            "tep": one.tep_port,
            "stream": one.stream_port,
        }
        clients = {what: socket.create_connection(("127.0.0.1", port), timeout=5) for what, port in listeners.items()}
        try:
            ours = {what: (listeners[what], c.getsockname()[1]) for what, c in clients.items()}
            pid = one.proc.pid
            wait_until(lambda: set(ours.values()) <= tcp_connections(pid).keys(), "the node accepting every client")
            # Once a socket is the node's, the reactor turn that accepted it (connectionMade
            # included) finishes before the node can answer anything else, such as this request.
            one.stats()
            conns = tcp_connections(pid)
            for what, key in ours.items():
                assert conns[key], f"{what} connection (node port {key[0]}) has Nagle's algorithm on"
            # Links: one accepted on this node's PSC port, one dialled to the other node's.
            accepted = [on for (local, _), on in conns.items() if local == one.psc_port]
            dialled = [on for (_, peer), on in conns.items() if peer == two.psc_port]
            assert accepted and dialled, f"expected both ends of the PSC links, found {conns}"
            assert all(accepted) and all(dialled), f"a PSC link has Nagle's algorithm on: {conns}"
        finally:
            for c in clients.values():
                c.close()
    finally:
        for node in cluster.nodes:
            node.stop()


def test_bridge_connection_to_its_router_has_nagle_off(tmp_path: Path, crossbar_routers: list[CrossbarProcess]) -> None:
    """``pubsubclub bridge``: its WAMP client connection to a Crossbar.io router has TCP_NODELAY."""
    router = crossbar_routers[0]
    bridge = BridgeProcess("bridge1", tmp_path, router)
    try:
        bridge.start()
        assert bridge.proc is not None
        pid = bridge.proc.pid
        bridge.wait_carries()  # joined the router (long after the connection was prepared)
        to_router = [on for (_, peer), on in tcp_connections(pid).items() if peer == router.port]
        assert to_router and all(to_router), "the bridge's connection to its router has Nagle's algorithm on"
    finally:
        bridge.stop()
