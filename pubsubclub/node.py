"""One node: the WAMP server, the federation listener and static discovery."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request
from twisted.web.static import File

from pubsubclub.adapters.tep import TEPOperationsResource, TEPServer
from pubsubclub.adapters.tep_codec import TEPLimits
from pubsubclub.config import NodeConfig
from pubsubclub.federation.federation import endpoint_for_url
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.jsonbounds import JSONBounds
from pubsubclub.metrics import MetricsDumper, PrometheusCollector
from pubsubclub.psc import Limits
from pubsubclub.wamp.broker import WampLimits
from pubsubclub.wamp.server import WampServer

log = Logger()

STATIC_DIR = Path(__file__).parent / "static"


def find_autobahn_js() -> Path | None:
    """The autobahn-js browser bundle for the chat page, if installed."""
    candidates = []
    if os.environ.get("PUBSUBCLUB_AUTOBAHN_JS"):
        candidates.append(Path(os.environ["PUBSUBCLUB_AUTOBAHN_JS"]))
    candidates.append(STATIC_DIR / "vendor" / "autobahn.min.js")
    repo_js = Path(__file__).resolve().parent.parent / "js" / "node_modules"
    candidates.append(repo_js / "autobahn-browser" / "autobahn.min.js")
    for path in candidates:
        if path.is_file():
            return path
    return None


class StatsResource(Resource):
    """``GET /stats``: counters and links as JSON, for operators and tests."""

    isLeaf = True

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node

    def render_GET(self, request: Request) -> bytes:
        """The node's counters and links."""
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(self._node.stats()).encode()


class HealthResource(Resource):
    """``GET /health``: 200 once every listener is up, 503 while starting or stopping.

    The body lists the node's links and their states, for Consul's HTTP
    check, load balancers and operators.
    """

    isLeaf = True

    def __init__(self, node: Node) -> None:
        super().__init__()
        self._node = node

    def render_GET(self, request: Request) -> bytes:
        """Readiness and links as JSON."""
        node = self._node
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        if node.state != "ready":
            request.setResponseCode(503)
        body = {
            "status": node.state,
            "node": node.hub.node_id,
            "links": node.federation.links(),
            "open_links": node.federation.open_links(),
            "wamp_sessions": len(node.server.router.sessions),
        }
        return json.dumps(body).encode()


def _wildcard(port: IListeningPort) -> bool:
    """Whether ``port`` listens on every address (0.0.0.0 or ::)."""
    return getattr(port.getHost(), "host", "") in ("0.0.0.0", "::", "")


def _url(port: IListeningPort, scheme: str, path: str) -> str:
    host = port.getHost()
    address = getattr(host, "host", "127.0.0.1")
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    return f"{scheme}://{address}:{host.port}{path}"  # type: ignore[attr-defined]


class Node:
    """A running ``pubsubclub node``."""

    def __init__(self, config: NodeConfig, reactor: Any = None) -> None:
        if reactor is None:
            from twisted.internet import reactor
        self.config = config
        self.reactor = reactor
        size = config.max_message_size
        #: WAMP principals and roles (``--auth``); None: every client anonymous, everything allowed.
        self.auth = config.auth_policy()
        bounds = JSONBounds(max_depth=config.max_json_depth)
        self.server = WampServer(
            realms=(config.realm,),
            limits=WampLimits(max_message_size=size, json=bounds, max_send_buffer=config.max_send_buffer),
            node_id=config.name,
            listen_role=config.listen_role,
            reactor=reactor,
            psc_limits=Limits(max_message_size=size, json=bounds),
            auth=self.auth,
            advertise_url=config.advertise,
            secret=config.cluster_secret(),
            endpoint_factory=functools.partial(endpoint_for_url, trust_root=config.trust_root()),
            max_link_queue=config.max_link_queue,
            # With Consul, its health-checked list is the membership: learning from
            # peers would redial nodes Consul has dropped as unhealthy.
            learn_peers=config.learn_peers and config.consul is None,
            replay=None
            if not config.replay_window_seconds
            else ReplaySettings(max_bytes=config.replay_buffer_bytes, window=config.replay_window_seconds),
        )
        self.hub = self.server.pubsubclub_hub
        self.federation = self.server.pubsubclub
        self.ports: list[IListeningPort] = []
        self.urls: dict[str, str] = {}
        #: ``starting`` -> ``ready`` -> ``stopping`` -> ``stopped``.
        self.state = "starting"
        self.nsd: Any = None
        #: The TEP front-end, when ``config.tep`` is set (it listens in :meth:`start`).
        self.tep: TEPServer | None = None
        if config.tep is not None:
            self.tep = TEPServer(
                self.hub,
                TEPLimits(
                    max_frame_bytes=size,
                    max_channels_per_client=config.tep_max_channels,
                    json=bounds,
                    max_send_buffer=config.max_send_buffer,
                ),
                prefix=config.tep_prefix,
                client_publish=config.tep_client_publish,
                auth=self.auth,
            )
        #: One set of counters for every part of the node, kept by the hub (docs/metrics.md).
        self.metrics = self.hub.metrics
        self.dumper: MetricsDumper | None = None
        if config.metrics_dir is not None:
            self.dumper = MetricsDumper(
                self.metrics, config.metrics_dir, self._subscriber_gauges, self.federation.links
            )
        self._dump_loop: task.LoopingCall | None = None
        #: Things to stop first on shutdown (discovery deregisters here).
        self.before_stop: list[Any] = []
        #: Consul discovery, when ``config.consul`` is set (started in :meth:`start`).
        self.discovery: Any = None

    def _subscriber_gauges(self) -> dict[str, int]:
        return {topic: self.hub.subscribers(topic) for topic in self.hub.topics() if not topic.startswith("$")}

    def stats(self) -> dict[str, Any]:
        """Counters and link states."""
        return {
            "node": self.hub.node_id,
            "hub": dict(self.hub.stats),
            "errors": {f"{c}.{r}": n for (c, r), n in sorted(self.metrics.errors.items())},
            "sink_errors": dict(self.metrics.sink_errors),
            "topics": len(self.hub.topics()),
            "federation": dict(self.federation.stats),
            "replay": None if self.federation.outbox is None else self.federation.outbox.summary(),
            "links": self.federation.links(),
            "servers": self.federation.servers(),
            "remote_interest": self.federation.remote_interest(),
            "discovery": None if self.discovery is None else self.discovery.status(),
            "nsd": None if self.nsd is None else {**self.nsd.store.stats(), **self.nsd.stats},
            "tep": None if self.tep is None else {"clients": len(self.tep.clients), **self.tep.stats},
        }

    def _wamp_site(self) -> Any:
        site = self.server.site(str(STATIC_DIR) if self.config.chat_page else None)
        root = site.resource
        # No /stats here: peer addresses and who wants which topic are for
        # operators, on the --http listener only (docs/security.md).
        if self.config.chat_page:
            bundle = find_autobahn_js()
            if bundle is not None:
                root.putChild(b"autobahn.min.js", File(str(bundle), defaultType="application/javascript"))
            else:
                log.warn("autobahn-js browser bundle not found; the chat page will not connect (run make js)")
        return site

    async def start(self) -> dict[str, str]:
        """Listen, link to the configured peers, and return the node's URLs."""
        public = self.config.public_listeners()
        if public and self.config.cluster_secret_file is None:
            log.warn(
                "SECURITY WARNING: listeners {keys} accept connections beyond this host and there is no"
                " --cluster-secret-file: any host that reaches the PSC listener can join the cluster,"
                " read every message and publish into it",
                keys=", ".join(public),
            )
        open_frontends = [key for key in public if key in ("wamp", "tep", "nsd")]
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
                endpoint=self.config.http,
            )
        if self.auth is not None and self.auth.holds_secrets and self.config.auth is not None:
            try:
                mode = os.stat(self.config.auth).st_mode
            except OSError:
                mode = 0
            if mode & 0o004:
                log.warn(
                    "SECURITY WARNING: {path} holds tickets or WAMP-CRA secrets and every user of this host"
                    " can read it (chmod 600 it)",
                    path=self.config.auth,
                )
        wamp_tls = self.config.wamp.startswith("ssl:")
        wamp_port = await self.server.listen(self.config.wamp, self._wamp_site())
        self.ports.append(wamp_port)
        self.urls["wamp"] = _url(wamp_port, "wss" if wamp_tls else "ws", "/ws")
        self.urls["http"] = _url(wamp_port, "https" if wamp_tls else "http", "/")
        if self.config.psc is not None:
            psc_port = await self.server.pubsubclub_listen(self.config.psc)
            self.ports.append(psc_port)
            self.urls["psc"] = _url(psc_port, "wss" if self.config.psc.startswith("ssl:") else "ws", "/psc")
            if self.federation.advertise_url is None:
                self.federation.advertise_url = self.urls["psc"]
            # Told to peers only when others can dial it: configured, or a listener
            # bound to one address (a wildcard bind's 127.0.0.1 means nothing elsewhere).
            if self.config.advertise is None and _wildcard(psc_port):
                self.federation.announce_url = None
            else:
                self.federation.announce_url = self.federation.advertise_url
        if self.config.http is not None:
            from twisted.internet.endpoints import serverFromString
            from twisted.web.server import Site

            ops = Resource()
            ops.putChild(b"health", HealthResource(self))
            ops.putChild(b"stats", StatsResource(self))
            ops.putChild(b"metrics", self._prometheus_resource())
            token = self.config.tep_ops_token()
            if self.tep is not None and token is not None:
                ops.putChild(b"tep", TEPOperationsResource(self.tep, token))
            elif self.tep is not None:
                log.info("TEP operator API (/tep on --http) is off: no --tep-ops-token-file")
            http_site = Site(ops)
            http_site.noisy = False
            http_port = await serverFromString(self.reactor, self.config.http).listen(http_site)
            self.ports.append(http_port)
            self.urls["health"] = _url(http_port, "http", "/health")
            self.urls["ops"] = _url(http_port, "http", "/")
        if self.config.nsd is not None:
            await self._start_nsd()
        if self.tep is not None:
            await self._start_tep(self.tep)
        for url in self.config.peer:
            self.federation.add_server(url)
        if self.dumper is not None:
            self._dump_loop = task.LoopingCall(self.dumper.safe_dump)
            self._dump_loop.clock = self.reactor
            self._dump_loop.start(self.config.metrics_interval, now=False)
        self.state = "ready"
        if self.config.consul is not None:
            self._start_discovery()
        log.info("node {name} ready: {urls}", name=self.hub.node_id, urls=self.urls)
        return self.urls

    def _start_discovery(self) -> None:
        """Register in Consul and follow the service's healthy instances (after the listeners are up)."""
        from pubsubclub.discovery.consul import ConsulDiscovery

        config = self.config
        assert config.consul is not None
        self.discovery = ConsulDiscovery(
            self.federation,
            consul_url=config.consul,
            service=config.service,
            node_id=self.hub.node_id,
            advertise_url=config.advertise or self.urls.get("psc"),
            token=config.consul_token,
            dc=config.consul_dc,
            check=config.consul_check,
            health_url=self.urls.get("health"),
            ttl=config.consul_ttl,
            debounce=config.consul_debounce,
            reactor=self.reactor,
        )
        self.discovery.start()
        self.before_stop.append(self.discovery.stop)

    def _prometheus_resource(self) -> Any:
        """``GET /metrics`` in the Prometheus text format (same counters as the dumps)."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.twisted import MetricsResource

        registry = CollectorRegistry()
        registry.register(
            PrometheusCollector(
                self.metrics, self._subscriber_gauges, self.federation.links, self.config.metrics_max_topics
            )
        )
        return MetricsResource(registry)

    async def _start_nsd(self) -> None:
        from twisted.internet.endpoints import serverFromString

        from pubsubclub.adapters.nsd import NSDFactory, NSDService, NSDSettings
        from pubsubclub.adapters.nsd_codec import NSDLimits
        from pubsubclub.adapters.nsd_store import NSDStore

        config = self.config
        os.makedirs(config.data_dir, exist_ok=True)
        store = NSDStore(os.path.join(config.data_dir, "nsd.sqlite3"))
        settings = NSDSettings(
            limits=NSDLimits(
                max_message_chars=config.nsd_max_message_chars, json=JSONBounds(max_depth=config.max_json_depth)
            ),
            prefix=config.nsd_prefix,
            retention_count=config.nsd_retention_count or None,
            retention_seconds=config.nsd_retention_seconds or None,
            auth=self.auth,
            # A transfer chunk must fit in one PSC message (one NSD message more may follow the budget).
            transfer_chunk_bytes=max(config.max_message_size // 4, 1024),
            max_clock_skew=config.nsd_max_clock_skew,
        )
        self.nsd = NSDService(self.hub, store, self.reactor.seconds, settings)
        self.nsd.start()
        port = await serverFromString(self.reactor, config.nsd).listen(NSDFactory(self.nsd))
        self.ports.append(port)
        host = port.getHost()
        self.urls["nsd"] = f"tcp://{getattr(host, 'host', '127.0.0.1')}:{host.port}"  # type: ignore[attr-defined]

    async def _start_tep(self, tep: TEPServer) -> None:
        from twisted.internet.endpoints import serverFromString
        from twisted.web.server import Site

        assert self.config.tep is not None
        root = Resource()
        # Autobahn declares IResource with zope, which mypy cannot see.
        root.putChild(b"tep", tep.resource())  # type: ignore[arg-type]
        site = Site(root)
        site.noisy = False
        port = await serverFromString(self.reactor, self.config.tep).listen(site)
        self.ports.append(port)
        self.urls["tep"] = _url(port, "ws", "/tep")

    async def stop(self) -> None:
        """Graceful shutdown: leave discovery, stop accepting, say goodbye to clients, close links."""
        if self.state in ("stopping", "stopped"):
            return
        self.state = "stopping"
        log.info("node {name} shutting down", name=self.hub.node_id)
        for hook in self.before_stop:
            try:
                await defer.maybeDeferred(hook)
            except Exception:  # shutdown goes on; the failure is logged
                log.failure("shutdown step failed")
        await defer.gatherResults([defer.maybeDeferred(p.stopListening) for p in self.ports])
        self.server.router.shutdown("node shutting down")
        # TEP clients finish their closing handshake while the links close.
        tep_closed = self.tep.stop("node shutting down") if self.tep is not None else None
        await self.federation.stop()
        if tep_closed is not None:
            await tep_closed
        if self.nsd is not None:
            self.nsd.stop()
        if self._dump_loop is not None and self._dump_loop.running:
            self._dump_loop.stop()
        if self.dumper is not None:
            self.dumper.safe_dump()  # the last partial interval, so totals are complete
        self.state = "stopped"


def print_ready(node: Node, urls: dict[str, str]) -> None:
    """One JSON line on stdout that scripts and tests wait for."""
    sys.stdout.write(json.dumps({"event": "ready", "name": node.hub.node_id, **urls}) + "\n")
    sys.stdout.flush()
