"""The network-namespace test infrastructure (tests/helpers/netns.py): reachability, silent partitions, cleanup."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from helpers.netns import Network, _namespaces, check_tools, network

#: A port nothing listens on: a reachable host answers a connect with RST (refused).
CLOSED_PORT = 9
#: Long enough for a RST to come back on a veth, short enough to keep the test quick.
CONNECT_SECONDS = 1.0

_PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[2]))
try:
    s.connect((sys.argv[1], int(sys.argv[3])))
    print("connected")
except ConnectionRefusedError:
    print("refused")
except (socket.timeout, TimeoutError):
    print("silence")
except OSError as e:
    print(e.strerror)
"""


def probe_from(net: Network, k: int, host: str) -> str:
    """Connect from inside node ``k``'s namespace: ``refused`` (reachable), ``silence`` (dropped)."""
    result = subprocess.run(
        ["ip", "netns", "exec", net.namespace(k), sys.executable, "-c", _PROBE, host, str(CONNECT_SECONDS), "9"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def probe_from_root(host: str) -> str:
    """The same probe from the test process (the root namespace)."""
    with socket.socket() as s:
        s.settimeout(CONNECT_SECONDS)
        try:
            s.connect((host, CLOSED_PORT))
        except ConnectionRefusedError:
            return "refused"
        except TimeoutError:
            return "silence"
    return "connected"


def test_tools_present_as_root() -> None:
    """ip and nft exist and we are root (else the message says to run make sysdeps as root)."""
    check_tools()


def test_nodes_reach_each_other_until_partitioned_silently_then_heal() -> None:
    """Node namespaces reach each other and the root; a partition answers nothing (no RST) and heals."""
    with network(3) as net:
        one, two, three = (net.address(k) for k in (1, 2, 3))
        assert probe_from(net, 1, two) == "refused"
        assert probe_from_root(one) == probe_from_root(two) == "refused"
        net.partition([1], [2])
        assert probe_from(net, 1, two) == "silence"
        assert probe_from(net, 2, one) == "silence"
        assert probe_from(net, 1, three) == "refused"  # only the two sides are cut
        assert probe_from_root(one) == probe_from_root(two) == "refused"  # clients still reach both
        assert net.dropped() > 0
        net.heal()
        assert probe_from(net, 1, two) == "refused"
        assert net.dropped() == 0


def test_namespaces_and_links_are_removed_even_when_the_test_fails() -> None:
    """Leaving the block by an exception removes the namespaces and the root veth."""
    with pytest.raises(RuntimeError, match="boom"), network(2) as net:
        names = [net.switch, *net.namespaces]
        assert set(names) <= set(_namespaces())
        raise RuntimeError("boom")
    assert not set(names) & set(_namespaces())
    links = subprocess.run(["ip", "-o", "link", "show", net.root_link], capture_output=True, text=True)
    assert links.returncode != 0


def test_parallel_networks_get_distinct_names_and_subnets() -> None:
    """Two networks at once (two test runs) never share a namespace, interface or subnet."""
    with network(1) as first, network(1) as second:
        assert first.subnet != second.subnet
        assert first.root_link != second.root_link
        assert not set(first.namespaces) & set(second.namespaces)
        assert probe_from(first, 1, second.address(1)) == "Network is unreachable"  # separate networks
