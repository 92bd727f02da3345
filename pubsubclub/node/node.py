"""One node, composed: the hub at the centre, the federation, discovery and every front-end around it.

:class:`Node` is the composition root. It builds the :class:`~pubsubclub.core.hub.Hub`,
the :class:`~pubsubclub.federation.Federation` from ``config.federation``,
each front-end from its own section (pubsubclub/frontends/base.py), the
operations listener (pubsubclub/node/ops.py), metrics dumps from
``config.metrics`` and Consul discovery from ``config.consul``. None of these
parts knows the others; they meet at the hub. Start order: listeners, then
peers, then discovery; stop order: discovery, listeners, clients' goodbyes,
links, stores, the last metrics dump.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import fields, replace
from typing import Any

from twisted.internet import defer, task, threads
from twisted.internet.endpoints import UNIXClientEndpoint, UNIXServerEndpoint, serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorThreads
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from pubsubclub.config import NodeConfig, binds_beyond_loopback
from pubsubclub.core.hub import Hub, random_node_id
from pubsubclub.core.jsonbounds import JSONBounds
from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.core.metrics import Metrics, MetricsDumper, PrometheusCollector
from pubsubclub.federation import Federation, FederationSettings, Role
from pubsubclub.federation.federation import endpoint_for_url
from pubsubclub.federation.hints import PeerReport
from pubsubclub.federation.psc import Limits
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.frontends import registry
from pubsubclub.frontends.base import HTTP_REFUSAL, Frontend, listen_url
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec
from pubsubclub.net.edge import Edge, EdgeLimits, EdgeSettings, handshake_done
from pubsubclub.node.collector import SurvivorFreezer
from pubsubclub.node.ops import (
    HealthResource,
    MetricsTextResource,
    StatsResource,
    WorkersMetricsResource,
    WorkersStatsResource,
    traffic,
)
from pubsubclub.node.workers import CLIENT_LISTENERS, WorkerPlace

log = Logger()

#: Longest a worker other than the primary waits for its links to the primary before it says it is ready, seconds.
WORKER_LINK_WAIT = 30.0


def edge_limits(config: NodeConfig, listener: str, place: WorkerPlace | None = None) -> EdgeLimits:
    """The connection layer's limits for ``listener`` (wamp, rawsocket, psc, nsd, tep, stream, ops, ...).

    WAMP listeners keep their own, politer join timeouts (ABORT ``wamp.error.timeout``), each
    ``[wamp] join-timeout`` for the upgrade and again for WELCOME: the guard's deadline there is
    the backstop, at least twice that. PSC links ping themselves (5 s); the ops listener's
    handshake is its first request. NSD and stream have no keepalive: idle is off by default.

    A worker (``place``) of a node with workers enforces its share of the connection caps on the
    client listeners every worker serves (the caps are the node's, docs/architecture.md, "Workers").
    """
    edge = config.edge
    max_per_address, max_connections = edge.max_per_address, edge.max_connections
    if place is not None and place.count > 1 and listener in CLIENT_LISTENERS:
        max_per_address, max_connections = place.share(max_per_address), place.share(max_connections)
    handshake = edge.handshake_timeout
    idle, ping = edge.idle_timeout, edge.ping_interval
    pending = config.node.max_send_buffer
    if listener in ("wamp", "rawsocket"):
        handshake = max(handshake, 2 * config.wamp.join_timeout)
    elif listener == "psc":
        ping = 0.0
        fed = config.federation
        pending = fed.max_link_queue + (fed.replay_buffer_bytes if fed.replay_window_seconds else 0)
    elif listener == "ops":
        ping = 0.0
    elif listener == "nsd":
        idle, ping = edge.nsd_idle_timeout, 0.0
    elif listener == "stream":
        idle, ping = edge.stream_idle_timeout, 0.0
    return EdgeLimits(
        handshake_timeout=handshake,
        idle_timeout=idle,
        ping_interval=ping,
        max_per_address=max_per_address,
        max_connections=max_connections,
        max_pending_bytes=pending,
    )


def json_bounds(config: NodeConfig) -> JSONBounds:
    """The node-wide bounds on decoded JSON."""
    return JSONBounds(max_depth=config.node.max_json_depth)


def frontend_context(config: NodeConfig, reactor: Any, **parts: Any) -> FrontendContext:
    """What the node hands every front-end besides its section; ``parts`` adds auth, edge, federation, ..."""
    sections = {f.name: getattr(config, f.name) for f in fields(config) if f.name != "warnings"}
    return FrontendContext(
        reactor=reactor,
        node_name=config.node.name or "",
        data_dir=config.node.data_dir,
        max_message_size=config.node.max_message_size,
        max_send_buffer=config.node.max_send_buffer,
        json=json_bounds(config),
        edge_limits=functools.partial(edge_limits, config),
        sections=sections,
        **parts,
    )


def federation_settings(config: NodeConfig) -> FederationSettings:
    """The federation's settings: its ``[federation]`` section plus the node-wide limits, secret and discovery."""
    section = config.federation
    return FederationSettings(
        listen_role=Role(section.listen_role),
        limits=Limits(
            max_message_size=config.node.max_message_size,
            link_headroom=section.link_headroom,
            json=json_bounds(config),
            max_patterns_per_peer=section.max_patterns_per_peer,
        ),
        advertise_url=section.advertise,
        secret=config.cluster_secret(),
        proof_timeout=section.proof_timeout,
        max_pending_proofs=section.max_pending_proofs,
        max_pending_proofs_per_source=section.max_pending_proofs_per_address,
        max_link_queue=section.max_link_queue,
        # With Consul, its health-checked list is the membership: learning from
        # peers would redial nodes Consul has dropped as unhealthy.
        learn_peers=section.learn_peers and config.consul.url is None,
        batch=section.batch,
        patterns=section.patterns,
        # A bridge's [wamp] realm is its router's, not a cluster realm: it tells only an explicit plain-realm.
        plain_realm=config.wamp.plain if config.bridge.router is None else config.wamp.plain_realm,
        replay=None
        if not section.replay_window_seconds
        else ReplaySettings(max_bytes=section.replay_buffer_bytes, window=section.replay_window_seconds),
    )


def retry_policy(config: NodeConfig) -> RetryPolicy:
    """How a node redials a peer: ``[federation] reconnect-initial`` growing up to ``reconnect-max``."""
    section = config.federation
    return RetryPolicy(initial=section.reconnect_initial, max_delay=section.reconnect_max)


def build_federation(hub: Hub, config: NodeConfig, reactor: Any, place: WorkerPlace | None = None) -> Federation:
    """The federation of ``config.federation`` (and the node-wide limits) around ``hub``.

    A worker (``place``) dials its fellow workers' URLs over their Unix sockets.
    """
    tcp = functools.partial(endpoint_for_url, trust_root=config.trust_root())
    endpoint_factory: Any = tcp
    if place is not None and place.count > 1:

        def endpoint_factory(reactor: Any, url: str) -> Any:
            path = place.socket_for_url(url)
            return tcp(reactor, url) if path is None else UNIXClientEndpoint(reactor, path, timeout=5)

    federation = Federation(
        hub,
        federation_settings(config),
        reactor=reactor,
        retry=retry_policy(config),
        endpoint_factory=endpoint_factory,
    )
    if place is not None and not place.primary:
        federation.learn_from_peers = False  # its one peer is the primary, whose peers are not its business
        federation.asks_gaps = True  # the gaps the primary sees in other nodes' streams are its clients' too
        federation.rpc.required_peer = place.node_id  # meta queries: without the primary the answer is incomplete
        federation.primary_node = place.node_id  # failed logins are shared with it (federation/logins.py)
    if place is not None and place.primary and place.count > 1:
        federation.enable_relay(f"{place.node_id}.w", {place.psc_url(i) for i in range(1, place.count)})
    return federation


def _world_readable(path: str) -> bool:
    """Whether every user of this host may read ``path`` (False when it cannot be stat'ed)."""
    try:
        return bool(os.stat(path).st_mode & 0o004)
    except OSError:
        return False


def _wildcard(port: IListeningPort) -> bool:
    """Whether ``port`` listens on every address (0.0.0.0 or ::)."""
    return getattr(port.getHost(), "host", "") in ("0.0.0.0", "::", "")


class _OpsRequest(Request):
    """An ops request: once one has arrived whole, the connection layer's handshake deadline is over."""

    def process(self) -> None:
        """Tell the guard, then serve."""
        handshake_done(self.channel.transport if self.channel is not None else None)
        super().process()


class _QuietSite(Site):
    """The ops listener's site: no access log line per probe (Consul and load balancers poll /health)."""

    noisy = False
    requestFactory = _OpsRequest  # noqa: N815 - Twisted API

    def log(self, request: Any) -> None:
        """Skip the access log."""


class Node:
    """A running ``pubsubclub node``."""

    def __init__(
        self,
        config: NodeConfig,
        reactor: Any = None,
        bridge: bool = False,
        place: WorkerPlace | None = None,
        declared: NodeConfig | None = None,
    ) -> None:
        """A node; with ``bridge``, a bridge node: its only front-end is the router of ``config.bridge``.

        ``place``: this process is one of a node's workers (pubsubclub/node/workers.py), ``config`` its
        worker's config, ``declared`` the node's as given (its listeners, for the exposure warnings).
        """
        if reactor is None:
            from twisted.internet import reactor
        self.config = config
        #: Which worker of its node this process is; None: the node is this one process.
        self.place = place
        #: The configuration as the operator gave it (a worker's ``config`` has inherited sockets instead).
        self.declared = declared or config
        self.reactor = reactor
        #: WAMP principals and roles (``--auth``); None: every client anonymous, everything allowed.
        self.auth = config.auth_policy()
        node_id = config.node.name or random_node_id()
        #: One set of counters for every part of the node, made here and handed down to the hub, the
        #: federation and (through the hub they are built on) every front-end (docs/metrics.md).
        self.metrics = Metrics(node_id)
        self.hub = Hub(
            node_id,
            metrics=self.metrics,
            max_topics=config.node.max_subscribed_topics,
            # The node announces at most this many patterns to a peer: holding more would be silent.
            max_patterns=config.federation.max_patterns_per_peer,
        )
        self.federation = build_federation(self.hub, config, reactor, place)
        #: The connection layer every listener stands on (pubsubclub/net): deadlines, caps, pending bytes.
        self.edge = Edge(
            reactor,
            self.metrics.refusal,
            self.metrics.disconnect,
            EdgeSettings(max_partial_input=config.edge.max_partial_input, log_interval=config.edge.log_interval),
        )
        #: One per node (a plain node): a source locked out after failed logins is locked out everywhere.
        self.login_throttle: LoginThrottle | None = (
            None if bridge else LoginThrottle(config.login_throttle_settings(), reactor.seconds)
        )
        if self.login_throttle is not None and place is not None and place.count > 1:
            # ... and with workers, one per node too: they share it over their links (federation/logins.py).
            self.federation.logins.enabled = True
            self.federation.logins.attach(self.login_throttle)
            # Past its free failures, a source's credentials are checked by the primary alone (one at a time).
            self.login_throttle.checks_past_free = place.primary
        context = frontend_context(
            config,
            reactor,
            auth=self.auth,
            login_throttle=self.login_throttle,
            edge=self.edge,
            trust_root=config.trust_root(),
            federation=self.federation,
        )
        context = replace(context, node_name=self.hub.node_id)
        if place is not None and place.count > 1:
            context = replace(context, edge_limits=functools.partial(edge_limits, config, place=place))
        #: The registered front-ends this node runs (``pubsubclub bridge``: the bridge's alone), by name.
        self.frontends_by_name: dict[str, Frontend] = {}
        #: Every front-end that may appear in /stats, built or not.
        mode = "bridge" if bridge else "node"
        self.frontend_specs: list[FrontendSpec] = [s for s in registry.specs() if s.mode == mode]
        for spec in self.frontend_specs:
            section = self.section_of(spec)
            if spec.single_resource and place is not None and not place.primary:
                continue  # the primary worker runs it (docs/architecture.md, "Workers")
            if spec.enabled(section):
                frontend = spec.build(self.hub, section, context)
                frontend.edge = self.edge
                self.frontends_by_name[spec.name] = frontend
        #: Every client front-end, in start order (the early ones first).
        self.frontends: list[Frontend] = [
            self.frontends_by_name[s.name]
            for s in sorted(self.frontend_specs, key=lambda s: not s.early)
            if s.name in self.frontends_by_name
        ]
        self.ports: list[IListeningPort] = []
        self.urls: dict[str, str] = {}
        #: ``starting`` -> ``ready`` -> ``stopping`` -> ``stopped``.
        self.state = "starting"
        #: What :meth:`stop` is doing now (named in the shutdown-timeout warning).
        self.stop_step = "not stopping"
        self.dumper: MetricsDumper | None = None
        if config.metrics.dir is not None:
            self.dumper = MetricsDumper(
                self.metrics,
                config.metrics.dir,
                self.subscriber_gauges,
                self.federation.links,
                dump_format=config.metrics.dump_format,
                merge_hours=config.metrics.merge_hours,
                # Merging an hour's dumps takes a moment: off the reactor thread when there are threads.
                run_merge=(
                    (lambda merge: threads.deferToThreadPool(reactor, reactor.getThreadPool(), merge))
                    if IReactorThreads.providedBy(reactor)
                    else None
                ),
            )
        self._dump_loop: task.LoopingCall | None = None
        #: Things to stop first on shutdown (discovery deregisters here).
        self.before_stop: list[Any] = []
        #: Consul discovery, when ``config.consul.url`` is set (started in :meth:`start`).
        self.discovery: Any = None
        #: The cyclic collector's freezing and timing; installed by ``run_node`` once the node is up (not here:
        #: a node built inside another program leaves that program's collector alone).
        self.collector = SurvivorFreezer(
            config.node.gc_refreeze, config.node.gc_full_threshold, thaw_growth=config.node.gc_thaw_growth
        )

    def section_of(self, spec: FrontendSpec) -> Any:
        """The config section of a registered front-end (its dataclass's defaults when the config has none)."""
        section = getattr(self.config, spec.config_key, None)
        return spec.section() if section is None else section

    def frontend(self, name: str) -> Any:
        """The running front-end registered as ``name``, or None."""
        return self.frontends_by_name.get(name)

    @property
    def wamp(self) -> Any:
        """The WAMP front-end, or None (a bridge)."""
        return self.frontend("wamp")

    @property
    def router(self) -> Any:
        """``pubsubclub bridge``: the WAMP router it joins (pubsubclub/frontends/bridge/), else None."""
        return self.frontend("bridge")

    def subscriber_gauges(self) -> dict[str, int]:
        """Local subscribers per topic (internal ``$`` topics left out)."""
        return {topic: self.hub.subscribers(topic) for topic in self.hub.topics() if not topic.startswith("$")}

    def stats(self) -> dict[str, Any]:
        """Counters and link states (``/stats``)."""
        return {
            "node": self.hub.node_id,
            "hub": dict(self.hub.stats),
            "errors": {f"{c}.{r}": n for (c, r), n in sorted(self.metrics.errors.items())},
            "sink_errors": dict(self.metrics.sink_errors),
            "topics": len(self.hub.topics()),
            "federation": dict(self.federation.stats),
            "replay": None if self.federation.outbox is None else self.federation.outbox.summary(),
            "links": self.federation.links(),
            "traffic": traffic(self.metrics),
            "servers": self.federation.servers(),
            "remote_interest": self.federation.remote_interest(),
            "remote_patterns": self.federation.remote_patterns(),
            "discovery": None if self.discovery is None else self.discovery.status(),
            **self._frontend_stats(),
            "edge": self.edge.stats(),
            "logins": None if self.login_throttle is None else self._login_stats(self.login_throttle),
            "gc": self.collector.stats(),
            **({} if self.place is None else {"worker": self._worker_stats(self.place)}),
        }

    def _login_stats(self, throttle: LoginThrottle) -> dict[str, Any]:
        """The throttle's counters; with workers, also what this process exchanged with the others."""
        logins: dict[str, Any] = dict(throttle.stats())
        if self.federation.logins.enabled:
            logins["shared"] = self.federation.logins.stats()
        return logins

    def _worker_stats(self, place: WorkerPlace) -> dict[str, Any]:
        """This worker's index, pid and its shares of the node's connection caps (client listeners)."""
        limits = edge_limits(self.config, "wamp", place)
        caps = {"max_connections": limits.max_connections, "max_per_address": limits.max_per_address}
        return {"index": place.index, "pid": os.getpid(), "edge_caps": caps}

    def _frontend_stats(self) -> dict[str, Any]:
        """Each registered front-end's stats by name (None when off); a bridge lists the node's too, all None."""
        running = self.frontends_by_name
        return {s.name: running[s.name].stats() if s.name in running else None for s in registry.specs()}

    def listeners(self) -> dict[str, str]:
        """Every configured listener endpoint by flag name: psc, http, and each running front-end's."""
        found: dict[str, str | None] = {"psc": self.config.federation.listen, "http": self.config.node.http}
        for spec in self.frontend_specs:
            if spec.name in self.frontends_by_name:
                found.update(spec.endpoints(self.section_of(spec)))
        return {key: value for key, value in found.items() if value is not None}

    def _warn_about_exposure(self) -> None:
        config = self.config
        listeners = self.listeners() if self.place is None else self.declared.listeners()
        public = [key for key, value in listeners.items() if binds_beyond_loopback(value)]
        if public and config.federation.cluster_secret_file is None:
            log.warn(
                "SECURITY WARNING: listeners {keys} accept connections beyond this host and there is no"
                " --cluster-secret-file: any host that reaches the PSC listener can join the cluster,"
                " read every message and publish into it",
                keys=", ".join(public),
            )
        open_frontends = [key for key in public if key not in ("psc", "http")]
        if open_frontends and self.auth is None:
            log.warn(
                "SECURITY WARNING: client listeners {keys} accept connections beyond this host and there is no"
                " --auth: every client is welcomed anonymously and may publish and subscribe to every topic",
                keys=", ".join(open_frontends),
            )
        if "http" in public:
            log.warn(
                "SECURITY WARNING: the operations listener {endpoint} accepts connections beyond this host:"
                " /stats shows peer addresses and which node wants which topic, /metrics every busy topic;"
                " bind it to loopback or a private network",
                endpoint=config.node.http,
            )
        secret_path = config.federation.cluster_secret_file
        if secret_path is not None and _world_readable(secret_path):
            log.warn(
                "SECURITY WARNING: the cluster secret {path} can be read by every user of this host, and with it"
                " anyone can join the cluster (chmod 600 it, owned by the user the node runs as)",
                path=secret_path,
            )
        path = config.node.auth
        if self.auth is not None and self.auth.holds_secrets and path is not None:
            try:
                mode = os.stat(path).st_mode
            except OSError:
                mode = 0
            if mode & 0o004:
                log.warn(
                    "SECURITY WARNING: {path} holds tickets or WAMP-CRA secrets and every user of this host"
                    " can read it (chmod 600 it)",
                    path=path,
                )

    async def start(self) -> dict[str, str]:
        """Listen, link to the configured peers, and return the node's URLs."""
        if self.place is None or self.place.primary:  # said once per node, not once per worker
            for warning in self.config.warnings:
                log.warn("{warning}", warning=warning)
            self._warn_about_exposure()
        early = {s.name for s in self.frontend_specs if s.early}
        for name, frontend in self.frontends_by_name.items():
            if name in early:
                await self._listen_frontend(frontend)
        await self._listen_psc()
        await self._listen_ops()
        if self.place is not None and self.place.count > 1:
            await self._listen_workers(self.place)
        for name, frontend in self.frontends_by_name.items():
            if name not in early:
                await self._listen_frontend(frontend)
        for url in self.config.federation.peers:
            self.federation.add_server(url)
        if self.dumper is not None:
            if self.dumper.problem:
                log.warn("metrics dumps in JSON lines only: {problem}", problem=self.dumper.problem)
            self._dump_loop = task.LoopingCall(self.dumper.safe_dump)
            self._dump_loop.clock = self.reactor
            self._dump_loop.start(self.config.metrics.interval, now=False)
        self.state = "ready"
        if self.config.consul.url is not None:
            self._start_discovery()
        log.info("node {name} ready: {urls}", name=self.hub.node_id, urls=self.urls)
        if self.config.federation.peers:  # "ready, K of N peers reachable", with why not (federation/hints.py)
            report = PeerReport(self.reactor, self.federation, list(self.config.federation.peers))
            self.before_stop.append(report.stop)
            report.start()
        return self.urls

    async def _listen_frontend(self, frontend: Frontend) -> None:
        self.urls.update(await frontend.listen())
        self.ports.extend(frontend.ports())

    async def _listen_psc(self) -> None:
        endpoint = self.config.federation.listen
        if endpoint is None:
            return
        root = Resource()
        root.putChild(b"psc", self.federation.resource())
        factory = self.edge.guard("psc", Site(root), edge_limits(self.config, "psc"), HTTP_REFUSAL)
        port = await serverFromString(self.reactor, endpoint).listen(factory)
        self.ports.append(port)
        self.urls["psc"] = listen_url(port, "wss" if endpoint.startswith("ssl:") else "ws", "/psc")
        federation = self.federation
        if federation.advertise_url is None:
            federation.advertise_url = self.urls["psc"]
        # Told to peers only when others can dial it: configured, or a listener
        # bound to one address (a wildcard bind's 127.0.0.1 means nothing elsewhere).
        if self.config.federation.advertise is None and _wildcard(port):
            federation.announce_url = None
        else:
            federation.announce_url = federation.advertise_url

    async def _listen_ops(self) -> None:
        endpoint = self.config.node.http
        if endpoint is None:
            return
        ops = Resource()
        ops.putChild(b"health", HealthResource(self))
        place = self.place
        if place is not None and place.count > 1:
            # The primary's /stats and /metrics are the node's: its own and its workers' (node/ops.py).
            sockets = [place.ops_socket(i) for i in range(1, place.count)]
            ops.putChild(b"stats", WorkersStatsResource(self.stats, sockets, self.reactor))
            ops.putChild(b"metrics", WorkersMetricsResource(self._prometheus_text, sockets, self.reactor))
        else:
            ops.putChild(b"stats", StatsResource(self.stats))
            ops.putChild(b"metrics", self._prometheus_resource())
        for frontend in self.frontends:
            for path, resource in frontend.operations().items():
                ops.putChild(path, resource)
        site = self.edge.guard("ops", _QuietSite(ops), edge_limits(self.config, "ops"), HTTP_REFUSAL)
        port = await serverFromString(self.reactor, endpoint).listen(site)
        self.ports.append(port)
        self.urls["health"] = listen_url(port, "http", "/health")
        self.urls["ops"] = listen_url(port, "http", "/")

    async def _listen_workers(self, place: WorkerPlace) -> None:
        """Links between the node's workers: each accepts PSC links on its Unix socket in the 0700 folder.

        The primary dials every other worker and they dial it (one link each
        way, as between nodes); every other worker also serves its /stats and
        /health on a Unix socket, which the primary's /stats adds up.
        """
        path = place.psc_socket(place.index)
        if os.path.exists(path):
            os.unlink(path)  # left by this worker's previous process
        root = Resource()
        root.putChild(b"psc", self.federation.resource())
        self.ports.append(await UNIXServerEndpoint(self.reactor, path, mode=0o600).listen(Site(root)))
        if place.primary:
            for index in range(1, place.count):
                defer.ensureDeferred(self._dial_worker(place, index))
            return
        ops = Resource()
        ops.putChild(b"health", HealthResource(self))
        ops.putChild(b"stats", StatsResource(self.stats))
        ops.putChild(b"metrics", MetricsTextResource(self._prometheus_text))
        path = place.ops_socket(place.index)
        if os.path.exists(path):
            os.unlink(path)
        self.ports.append(await UNIXServerEndpoint(self.reactor, path, mode=0o600).listen(_QuietSite(ops)))
        await self._dial_worker(place, 0)
        # Ready once linked to the primary both ways (so the node's ready line means every worker reaches the
        # cluster), or after WORKER_LINK_WAIT seconds anyway: the links keep being retried.
        deadline = self.reactor.seconds() + WORKER_LINK_WAIT
        while self.federation.open_links() < 2:
            if self.reactor.seconds() > deadline:
                log.warn("worker {index}: not linked to the primary after {s} s; ready anyway", index=place.index,
                         s=WORKER_LINK_WAIT)  # fmt: skip
                break
            await task.deferLater(self.reactor, 0.05, lambda: None)

    async def _dial_worker(self, place: WorkerPlace, index: int) -> None:
        """Link to worker ``index`` once its socket exists (workers start together; a first dial that finds
        nothing would wait out a whole retry delay), or after WORKER_LINK_WAIT seconds anyway."""
        deadline = self.reactor.seconds() + WORKER_LINK_WAIT
        while not os.path.exists(place.psc_socket(index)) and self.reactor.seconds() < deadline:
            await task.deferLater(self.reactor, 0.02, lambda: None)
        if self.state not in ("stopping", "stopped"):
            self.federation.add_server(place.psc_url(index))

    def _start_discovery(self) -> None:
        """Register in Consul and follow the service's healthy instances (after the listeners are up)."""
        from pubsubclub.discovery.consul import ConsulDiscovery

        section = self.config.consul
        assert section.url is not None
        self.discovery = ConsulDiscovery(
            self.federation,
            consul_url=section.url,
            service=section.service,
            node_id=self.hub.node_id,
            advertise_url=self.config.federation.advertise or self.urls.get("psc"),
            token=section.token,
            dc=section.dc,
            check=section.check,
            health_url=self.urls.get("health"),
            ttl=section.ttl,
            debounce=section.debounce,
            watch_wait=section.watch_wait,
            deregister_after=section.deregister_after,
            backoff=RetryPolicy(
                initial=section.retry_initial,
                factor=section.retry_factor,
                max_delay=section.retry_max,
                jitter=section.retry_jitter,
            ),
            reactor=self.reactor,
        )
        self.discovery.start()
        self.before_stop.append(self.discovery.stop)

    def _prometheus_resource(self) -> Any:
        """``GET /metrics`` in the Prometheus text format (same counters as the dumps)."""
        from prometheus_client.twisted import MetricsResource

        return MetricsResource(self._prometheus_registry())

    def _prometheus_registry(self) -> Any:
        """The registry ``/metrics`` is made from."""
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()
        registry.register(
            PrometheusCollector(
                self.metrics, self.subscriber_gauges, self.federation.links, self.config.metrics.max_topics
            )
        )
        return registry

    def _prometheus_text(self) -> bytes:
        """This process's ``/metrics`` text."""
        from prometheus_client import generate_latest

        return bytes(generate_latest(self._prometheus_registry()))

    async def stop(self) -> None:
        """Graceful shutdown: leave discovery, stop accepting, say goodbye to clients, close links."""
        if self.state in ("stopping", "stopped"):
            return
        self.state = "stopping"
        log.info("node {name} shutting down", name=self.hub.node_id)
        self.stop_step = "leaving discovery"
        for hook in self.before_stop:
            try:
                await defer.maybeDeferred(hook)
            except Exception:  # shutdown goes on; the failure is logged
                log.failure("shutdown step failed")
        self.stop_step = "closing listeners"
        await defer.gatherResults([defer.maybeDeferred(p.stopListening) for p in self.ports])
        goodbyes = [d for d in (f.close("node shutting down") for f in self.frontends) if d is not None]
        self.stop_step = "closing links"
        await self.federation.stop()
        self.stop_step = "saying goodbye to clients"
        for goodbye in goodbyes:
            await goodbye
        self.stop_step = "finishing front-ends"
        for frontend in self.frontends:
            frontend.finish()
        self.edge.stop()
        if self._dump_loop is not None and self._dump_loop.running:
            self._dump_loop.stop()
        self.stop_step = "writing the last metrics dump"
        if self.dumper is not None:
            self.dumper.safe_dump()  # the last partial interval, so totals are complete
        self.stop_step = "stopped"
        self.state = "stopped"

    def stop_within(self, seconds: float) -> defer.Deferred[None]:
        """:meth:`stop`, but give up after ``seconds`` (``shutdown-timeout``): the process then exits anyway.

        A peer or client that never completes its close must not keep a node
        from stopping; the warning names the step that was still running.
        """
        done: defer.Deferred[None] = defer.Deferred()

        def give_up() -> None:
            log.warn(
                "graceful stop unfinished after {seconds} s (step: {step}); exiting anyway",
                seconds=seconds,
                step=self.stop_step,
            )
            done.callback(None)

        timer = self.reactor.callLater(seconds, give_up)

        def finished(result: object) -> None:
            if timer.active():
                timer.cancel()
                done.callback(None)
            if isinstance(result, Failure):
                log.failure("graceful stop failed", result)

        defer.ensureDeferred(self.stop()).addBoth(finished)
        return done


def print_ready(node: Node, urls: dict[str, str]) -> None:
    """One JSON line on stdout that scripts and tests wait for."""
    sys.stdout.write(json.dumps({"event": "ready", "name": node.hub.node_id, **urls}) + "\n")
    sys.stdout.flush()
