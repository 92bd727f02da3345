"""A node's workers: which process serves what, the listening sockets they share, and each one's config.

With ``--workers N`` (N > 1) the ``pubsubclub node`` process is a supervisor
(pubsubclub/node/supervisor.py) that binds every TCP listener itself and
starts N worker processes, each a :class:`~pubsubclub.node.node.Node` told
its place by :data:`WORKER_ENV`. Worker 0 is the *primary*: it holds the PSC
listener and the peer links, discovery, the operations listener and the
front-ends that own one resource (NSD, stream, SysV). Every worker serves the
client listeners (WAMP WebSocket, WAMP RawSocket, TEP): each gets its own
socket bound to the same port with ``SO_REUSEPORT``, so the kernel spreads
new connections over them (docs/architecture.md, "Workers").

Workers 1..N-1 reach the primary over PSC links on Unix sockets in a private
(0700) folder, one link each way, as nodes ``<node>.w<i>``; the primary
relays between them and the cluster (federation/relay.py).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, replace
from typing import Any

from twisted.internet.endpoints import _parseServer  # type: ignore[attr-defined]

from pubsubclub.config import NodeConfig

#: The environment variable that makes a ``pubsubclub node`` process a worker (set by the supervisor only).
WORKER_ENV = "PUBSUBCLUB_WORKER"

#: Listeners every worker serves (one port, a socket per worker); the others are the primary's alone.
CLIENT_LISTENERS = ("wamp", "rawsocket", "tep")

#: Host name of the URLs the primary dials its workers by (never resolved: they map to Unix sockets).
WORKER_HOST_SUFFIX = ".workers.invalid"


@dataclass(frozen=True)
class WorkerPlace:
    """What the supervisor tells one worker: its index, the count, the node id, the private folder, its sockets."""

    index: int
    count: int
    node_id: str
    folder: str
    #: Listener flag names of the inherited listening sockets, in the order of their descriptors (from 3).
    fds: tuple[str, ...]

    @property
    def primary(self) -> bool:
        """Worker 0 holds the PSC listener, the links to other nodes and the single-resource front-ends."""
        return self.index == 0

    def encode(self) -> str:
        """The :data:`WORKER_ENV` value."""
        return json.dumps(
            {"index": self.index, "count": self.count, "node": self.node_id, "folder": self.folder, "fds": self.fds}
        )

    @classmethod
    def decode(cls, text: str) -> WorkerPlace:
        """A place from its :data:`WORKER_ENV` value."""
        data = json.loads(text)
        return cls(int(data["index"]), int(data["count"]), str(data["node"]), str(data["folder"]), tuple(data["fds"]))

    @classmethod
    def from_environment(cls) -> WorkerPlace | None:
        """This process's place, or None when it is not a worker."""
        text = os.environ.get(WORKER_ENV)
        return None if not text else cls.decode(text)

    def worker_id(self, index: int) -> str:
        """Node id of worker ``index`` on its links to the primary (the primary's is the node's)."""
        return self.node_id if index == 0 else f"{self.node_id}.w{index}"

    def psc_socket(self, index: int) -> str:
        """The Unix socket worker ``index`` accepts PSC links on."""
        return os.path.join(self.folder, f"psc-{index}.sock")

    def ops_socket(self, index: int) -> str:
        """The Unix socket of worker ``index``'s operations resources (/stats, /health) for the primary."""
        return os.path.join(self.folder, f"ops-{index}.sock")

    def psc_url(self, index: int) -> str:
        """The ws:// URL worker ``index`` is dialled by (mapped to :meth:`psc_socket` by :meth:`socket_for_url`)."""
        return f"ws://w{index}{WORKER_HOST_SUFFIX}:{index + 1}/psc"

    def share(self, cap: int) -> int:
        """This worker's part of a node-wide connection cap (0, off, stays off).

        The N parts add up to ``cap`` exactly (the first ``cap % N`` workers
        take one more), so the node never holds more than ``cap``; the kernel
        spreads connections by a hash, so one worker may be full (and refuse)
        while the node is still under its cap. :func:`bind_listeners` refuses
        a cap below N (a worker's part would be 0, which means off).
        """
        if cap == 0:
            return 0
        base, extra = divmod(cap, self.count)
        return base + (1 if self.index < extra else 0)

    def socket_for_url(self, url: str) -> str | None:
        """The Unix socket behind a worker URL, None for any other URL."""
        for index in range(self.count):
            if url == self.psc_url(index):
                return self.psc_socket(index)
        return None


def worker_config(config: NodeConfig, place: WorkerPlace) -> NodeConfig:
    """``config`` as worker ``place`` runs it: inherited sockets, and the primary's parts on the primary only."""
    fds = place.fds

    def adopted(key: str, endpoint: str | None) -> str | None:
        if endpoint is None or key not in fds:
            return endpoint
        # Twisted's systemd: endpoint adopts an inherited socket by its name (LISTEN_FDNAMES, supervisor.py).
        return f"systemd:domain={_domain(endpoint)}:name={key}"

    wamp = replace(
        config.wamp,
        listen=adopted("wamp", config.wamp.listen) or config.wamp.listen,
        rawsocket=adopted("rawsocket", config.wamp.rawsocket),
    )
    tep = replace(config.tep, listen=adopted("tep", config.tep.listen))
    node = replace(config.node, name=place.worker_id(place.index), http=adopted("http", config.node.http))
    if place.primary:
        federation = replace(config.federation, listen=adopted("psc", config.federation.listen))
        return replace(
            config,
            node=node,
            wamp=wamp,
            tep=tep,
            federation=federation,
            nsd=replace(config.nsd, listen=adopted("nsd", config.nsd.listen)),
            stream=replace(config.stream, listen=adopted("stream", config.stream.listen)),
        )
    # The others: client listeners only (the node skips single-resource front-ends, FrontendSpec); the primary
    # is their one peer (they learn and advertise nothing).
    federation = replace(config.federation, listen=None, peers=(), advertise=None, learn_peers=False)
    return replace(
        config,
        node=replace(node, http=None),
        wamp=wamp,
        tep=tep,
        federation=federation,
        consul=replace(config.consul, url=None),
    )


def _domain(endpoint: str) -> str:
    """``INET6`` when a TCP endpoint binds an IPv6 interface, else ``INET``."""
    _kind, _args, kwargs = _parse_tcp(endpoint)
    return "INET6" if ":" in str(kwargs.get("interface", "")) else "INET"


def _parse_tcp(endpoint: str) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    kind, args, kwargs = _parseServer(endpoint, None)
    return str(kind).lower(), tuple(args), dict(kwargs)


class ListenerProblem(Exception):
    """A listener the supervisor cannot bind or share (the message names the flag)."""


def bind_listeners(config: NodeConfig, count: int) -> dict[str, list[socket.socket]]:
    """Bind every TCP listener of ``config``: ``count`` sockets for each client listener, one for the others.

    Client listeners' sockets share their port with ``SO_REUSEPORT`` (the
    first binds, port 0 picks one, the rest bind the same). Raises
    :class:`ListenerProblem` for a client listener that is not plain TCP (TLS
    is terminated in front of a node with workers) or a port in use.
    """
    if count > 1 and not hasattr(socket, "SO_REUSEPORT"):
        raise ListenerProblem("--workers above 1 needs SO_REUSEPORT, which this platform lacks")
    if count > 1:
        for flag, cap in (
            ("--edge-max-connections", config.edge.max_connections),
            ("--edge-max-per-address", config.edge.max_per_address),
        ):
            if 0 < cap < count:
                raise ListenerProblem(
                    f"{flag} {cap} is below --workers {count}: the node's cap is split between its workers"
                    " and each needs at least 1 (raise the cap, or 0 for none)"
                )
    bound: dict[str, list[socket.socket]] = {}
    try:
        for key, endpoint in config.listeners().items():
            kind, args, kwargs = _parse_tcp(endpoint)
            if kind != "tcp":
                if key in CLIENT_LISTENERS:
                    raise ListenerProblem(
                        f"--{key} {endpoint}: with --workers above 1 client listeners must be tcp: endpoints"
                        " (terminate TLS in front of the node)"
                    )
                continue  # the primary binds it itself (e.g. an ssl: PSC listener)
            port = int(args[0] if args else kwargs.get("port", 0))
            interface = str(kwargs.get("interface", ""))
            backlog = int(kwargs.get("backlog", 50))
            family = socket.AF_INET6 if ":" in interface else socket.AF_INET
            sockets = bound[key] = []
            for _ in range(count if key in CLIENT_LISTENERS else 1):
                sock = socket.socket(family, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if key in CLIENT_LISTENERS:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                try:
                    sock.bind((interface, port))
                except OSError as e:
                    raise ListenerProblem(
                        f"--{key} {endpoint}: cannot listen on {interface or '*'}:{port}: {e.strerror}"
                        f"; pick another port with --{key}"
                    ) from None
                port = sock.getsockname()[1]
                sock.listen(backlog)
                sock.setblocking(False)
    except BaseException:
        for sockets in bound.values():
            for sock in sockets:
                sock.close()
        raise
    return bound
