"""Network namespaces for tests with real partitions (needs root; test hosts only).

:func:`network` builds, for one test, a private network:

* a *switch* namespace holding a Linux bridge,
* one namespace per node, its ``eth0`` (a veth) plugged into the bridge,
  with the address ``10.A.B.<k>/24`` for node ``k`` (1-based),
* a veth from the root namespace to the bridge with ``10.A.B.254``, so test
  clients running in the test process reach every node directly.

The ``/24`` is picked at random among the ``10.x.y.0/24`` that no route of
the root namespace overlaps, under a lock file, so parallel runs never share
one. Node processes run inside their namespace through ``ip netns exec``
(:class:`NetnsNode`), where each has its own ports and loopback.

A partition (:meth:`Network.partition`) is an nftables rule in the switch's
bridge ``forward`` hook that drops every packet between two groups of
nodes: no RST, no FIN, no ICMP, nothing reaches either side, exactly like a
broken network in between. The hosts themselves are untouched and keep
talking to the root namespace (the clients). :meth:`Network.heal` deletes
the rule.

Everything is removed when the ``with`` block ends, failed test or not;
namespaces left by a run that was killed are swept by the next run (their
names carry the creating process id).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from helpers.nodes import NodeProcess

#: Programs the namespaces need (Debian: iproute2, nftables; ``make sysdeps`` installs them).
TOOLS = ("ip", "nft")
#: Serialises the choice of subnets between concurrent test runs.
LOCK_FILE = Path("/tmp/pubsubclub-netns.lock")
#: Every namespace we create is named ``<PREFIX>-<pid>-<tag>-<role>``.
PREFIX = "pubsubclub"
#: The nftables table holding a partition (bridge family, in the switch namespace).
PARTITION_TABLE = "pubsubclub_partition"
#: Ports every node uses inside its own namespace.
WAMP_PORT, PSC_PORT, HTTP_PORT = 8080, 9001, 8181

_NAME = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]+-\w+$")


def check_tools() -> None:
    """Fail with a clear message unless we are root with ``ip`` and ``nft`` at hand."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise AssertionError(f"network-namespace tests need {', '.join(missing)}: run make sysdeps (as root)")
    if os.geteuid() != 0:
        raise AssertionError("network-namespace tests need root (ip netns, nft)")


def _run(*args: str, stdin: str | None = None) -> str:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _namespaces() -> list[str]:
    """Names of the namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete our namespaces whose creating process is gone (a run that was killed); return their names."""
    removed = []
    for name in _namespaces():
        match = _NAME.match(name)
        if match and not _pid_alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            removed.append(name)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all") or "[]")
    used = []
    for route in routes:
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst, strict=False))
    return used


def _free_subnet(rand: random.Random) -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(1000):
        candidate = ipaddress.IPv4Network(f"10.{rand.randrange(64, 250)}.{rand.randrange(0, 256)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise AssertionError("no free 10.x.y.0/24 for a test network")


class Network:
    """A bridge in its own namespace, node namespaces on it, and a veth from the root namespace."""

    def __init__(self, count: int, rand: random.Random | None = None) -> None:
        if not 1 <= count <= 200:
            raise ValueError("between 1 and 200 nodes")
        self.count = count
        self._rand = rand or random.Random()
        self.tag = f"{self._rand.getrandbits(24):06x}"
        base = f"{PREFIX}-{os.getpid()}-{self.tag}"
        self.switch = f"{base}-sw"
        self.namespaces = [f"{base}-n{k}" for k in range(1, count + 1)]
        #: The root namespace's end of its veth to the bridge (interface names are at most 15 characters).
        self.root_link = f"psc{self.tag}"
        self.subnet: ipaddress.IPv4Network | None = None
        self._created: list[str] = []
        self._partitioned = False

    # -- addresses -------------------------------------------------------------------

    def address(self, k: int) -> str:
        """The address of node ``k`` (1-based)."""
        assert self.subnet is not None
        return str(self.subnet.network_address + k)

    def namespace(self, k: int) -> str:
        """The namespace of node ``k`` (1-based)."""
        return self.namespaces[k - 1]

    # -- lifecycle -------------------------------------------------------------------

    def create(self) -> Network:
        """Build the namespaces, the bridge and the links (undone by :meth:`destroy`, even half-built)."""
        check_tools()
        LOCK_FILE.touch(exist_ok=True)
        with open(LOCK_FILE) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep_stale()
            self.subnet = _free_subnet(self._rand)
            prefix = self.subnet.prefixlen
            self._add_namespace(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            _run("ip", "link", "add", self.root_link, "type", "veth", "peer", "name", "root", "netns", self.switch)
            _run("ip", "addr", "add", f"{self.subnet.network_address + 254}/{prefix}", "dev", self.root_link)
            _run("ip", "link", "set", self.root_link, "up")
            _run("ip", "-n", self.switch, "link", "set", "root", "master", "br0", "up")
            for k, ns in enumerate(self.namespaces, start=1):
                self._add_namespace(ns)
                _run(
                    "ip", "-n", self.switch, "link", "add", f"n{k}", "type", "veth", "peer", "name", "eth0", "netns", ns
                )
                _run("ip", "-n", self.switch, "link", "set", f"n{k}", "master", "br0", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.address(k)}/{prefix}", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def _add_namespace(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)

    def destroy(self) -> None:
        """Remove every namespace (and so every veth and the bridge); processes inside must be gone."""
        errors = []
        for name in reversed(self._created):
            result = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True, timeout=30)
            if result.returncode != 0:
                errors.append(f"{name}: {result.stderr.strip()}")
        self._created.clear()
        # The root end disappears with its peer; make sure, so the subnet is free again.
        subprocess.run(["ip", "link", "del", self.root_link], capture_output=True, timeout=30)
        if errors:
            raise RuntimeError("could not remove test namespaces: " + "; ".join(errors))

    # -- faults ----------------------------------------------------------------------

    def partition(self, side_a: list[int], side_b: list[int]) -> None:
        """Silently drop every packet between the nodes of ``side_a`` and those of ``side_b``."""
        a = ", ".join(self.address(k) for k in side_a)
        b = ", ".join(self.address(k) for k in side_b)
        rules = f"""
table bridge {PARTITION_TABLE} {{
    chain forward {{
        type filter hook forward priority 0; policy accept;
        ip saddr {{ {a} }} ip daddr {{ {b} }} counter drop
        ip saddr {{ {b} }} ip daddr {{ {a} }} counter drop
    }}
}}
"""
        _run("ip", "netns", "exec", self.switch, "nft", "-f", "-", stdin=rules)
        self._partitioned = True

    def heal(self) -> None:
        """Let packets between every node through again."""
        if self._partitioned:
            _run("ip", "netns", "exec", self.switch, "nft", "delete", "table", "bridge", PARTITION_TABLE)
            self._partitioned = False

    def dropped(self) -> int:
        """Packets dropped by the partition rule so far (0 when healed)."""
        if not self._partitioned:
            return 0
        out = _run("ip", "netns", "exec", self.switch, "nft", "list", "table", "bridge", PARTITION_TABLE)
        return sum(int(n) for n in re.findall(r"packets (\d+)", out))


@contextlib.contextmanager
def network(count: int) -> Iterator[Network]:
    """A :class:`Network` of ``count`` node namespaces for the duration of the block."""
    net = Network(count)
    try:
        yield net.create()
    finally:
        net.destroy()


class NetnsNode(NodeProcess):
    """A ``pubsubclub node`` process inside node ``k``'s namespace, listening on that node's address.

    The launcher is :class:`helpers.nodes.NodeProcess`'s: only the address, the fixed ports and
    the ``ip netns exec`` wrapper differ. Partitions heal on the default reconnect schedule (1 s, capped
    backoff), the one the mission names, not the tests' short one.
    """

    reconnect_initial = None

    def __init__(self, net: Network, k: int, log_dir: Path, extra: tuple[str, ...] = ()) -> None:
        super().__init__(f"node{k}", log_dir)
        self.host = net.address(k)
        self.netns = net.namespace(k)
        self.wrapper = ("ip", "netns", "exec", self.netns)
        self.wamp_port, self.psc_port, self.http_port = WAMP_PORT, PSC_PORT, HTTP_PORT
        self.extra = ("--advertise", self.psc_url, "--no-chat-page", *extra)
