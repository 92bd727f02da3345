"""The client front-ends of a node, as peers around its hub.

Each front-end is built from its own config section (``config.wamp``,
``config.nsd``, ``config.tep``) plus the node-wide limits, listens on its
endpoint, and takes part in shutdown in two steps: :meth:`Frontend.close`
says goodbye to its clients while the links are still up, :meth:`Frontend.finish`
releases what it holds once they are down. :class:`pubsubclub.node.node.Node`
composes them; nothing here knows about the federation. A new protocol is
one more class with this shape (docs/architecture.md, "Adding a front-end").
"""

from __future__ import annotations

import os
from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Site
from twisted.web.static import File

from pubsubclub.config import NodeConfig
from pubsubclub.core.hub import Hub
from pubsubclub.core.jsonbounds import JSONBounds
from pubsubclub.core.loginthrottle import LoginThrottle
from pubsubclub.frontends.wamp.auth import AuthPolicy
from pubsubclub.net.edge import Edge, EdgeLimits, http_refusal

log = Logger()


class Frontend:
    """What the node needs of a front-end; subclasses implement :meth:`listen` and :meth:`stats`."""

    #: Short name: the key of its URL in the node's ready line and in /stats.
    name = ""
    #: The node's connection layer; set by the node before :meth:`listen` (None: listeners unguarded).
    edge: Edge | None = None

    def __init__(self) -> None:
        self._ports: list[IListeningPort] = []

    def guarded(self, config: NodeConfig, listener: str, factory: Any, refusal: bytes) -> Any:
        """``factory`` behind the node's connection layer as ``listener`` (unchanged when there is none)."""
        if self.edge is None:
            return factory
        return self.edge.guard(listener, factory, edge_limits(config, listener), refusal)

    async def listen(self) -> dict[str, str]:
        """Start serving; return the URLs served, by name."""
        raise NotImplementedError

    def ports(self) -> list[IListeningPort]:
        """The listening ports (stopped first on shutdown)."""
        return self._ports

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Say goodbye to every client (the links are still up); a Deferred when that takes time."""
        return None

    def finish(self) -> None:
        """Release stores and timers, after the links are closed."""

    def stats(self) -> dict[str, Any]:
        """Counters and sizes for /stats."""
        raise NotImplementedError


def listen_url(port: IListeningPort, scheme: str, path: str) -> str:
    """The URL a listening port serves, with 127.0.0.1 for a wildcard bind."""
    host = port.getHost()
    address = getattr(host, "host", "127.0.0.1")
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    return f"{scheme}://{address}:{host.port}{path}"  # type: ignore[attr-defined]


#: What a refused connection on an HTTP or WebSocket listener is told (before any upgrade).
HTTP_REFUSAL = http_refusal("too many connections")


def edge_limits(config: NodeConfig, listener: str) -> EdgeLimits:
    """The connection layer's limits for ``listener`` (wamp, rawsocket, psc, nsd, tep, stream, ops).

    WAMP listeners keep their own, politer join timeouts (ABORT ``wamp.error.timeout``), each
    ``[wamp] join-timeout`` for the upgrade and again for WELCOME: the guard's deadline there is
    the backstop, at least twice that. PSC links ping themselves (5 s); the ops listener's
    handshake is its first request. NSD and stream have no keepalive: idle is off by default.
    """
    edge = config.edge
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
        max_per_address=edge.max_per_address,
        max_connections=edge.max_connections,
        max_pending_bytes=pending,
    )


def json_bounds(config: NodeConfig) -> JSONBounds:
    """The node-wide bounds on decoded JSON."""
    return JSONBounds(max_depth=config.node.max_json_depth)


class WampFrontend(Frontend):
    """WAMP v2 over WebSocket at ``/ws`` (and the chat page at ``/``)."""

    name = "wamp"

    def __init__(
        self,
        hub: Hub,
        config: NodeConfig,
        auth: AuthPolicy | None,
        reactor: Any,
        login_throttle: LoginThrottle | None = None,
    ) -> None:
        from pubsubclub.frontends.wamp.broker import WampLimits
        from pubsubclub.frontends.wamp.server import WampServer

        self._config = config
        self._reactor = reactor
        limits = WampLimits(
            max_message_size=config.node.max_message_size,
            json=json_bounds(config),
            max_send_buffer=config.node.max_send_buffer,
            join_timeout=config.wamp.join_timeout,
            max_subscriptions_per_session=config.wamp.max_subscriptions,
            max_registrations_per_session=config.wamp.max_registrations,
            max_registrations=config.wamp.max_registrations_per_node,
            max_calls=config.wamp.max_calls_per_node,
        )
        self.server = WampServer(
            hub,
            realms=(config.wamp.realm,),
            limits=limits,
            auth=auth,
            reactor=reactor,
            await_interest=config.wamp.await_interest,
            disclose_publisher=config.wamp.disclose_publisher,
            max_call_seconds=config.wamp.call_timeout,
            max_pending_calls=config.wamp.max_pending_calls,
            login_throttle=login_throttle,
        )
        self.router = self.server.router
        super().__init__()

    def _site(self) -> Site:
        from pubsubclub.frontends.wamp.chatpage import STATIC_DIR, find_autobahn_js

        chat = self._config.wamp.chat_page
        site = self.server.site(str(STATIC_DIR) if chat else None)
        if chat:
            bundle = find_autobahn_js()
            if bundle is not None:
                site.resource.putChild(b"autobahn.min.js", File(str(bundle), defaultType="application/javascript"))
            else:
                log.warn("autobahn-js browser bundle not found; the chat page will not connect (run make js)")
        # No /stats here: peer addresses and who wants which topic are for
        # operators, on the --http listener only (docs/security.md).
        return site

    async def listen(self) -> dict[str, str]:
        """Serve WAMP (and the chat page); its URLs as ``wamp`` and ``http``."""
        endpoint = self._config.wamp.listen
        tls = endpoint.startswith("ssl:")
        site = self.guarded(self._config, "wamp", self._site(), HTTP_REFUSAL)
        port = await serverFromString(self._reactor, endpoint).listen(site)
        self._ports.append(port)
        urls = {
            "wamp": listen_url(port, "wss" if tls else "ws", "/ws"),
            "http": listen_url(port, "https" if tls else "http", "/"),
        }
        raw = self._config.wamp.rawsocket
        if raw is not None:
            from pubsubclub.frontends.wamp.rawsocket import REFUSAL_MAX_CONNECTIONS, WampRawSocketFactory

            factory = WampRawSocketFactory(self.router)
            factory = self.guarded(self._config, "rawsocket", factory, REFUSAL_MAX_CONNECTIONS)
            raw_port = await serverFromString(self._reactor, raw).listen(factory)
            self._ports.append(raw_port)
            urls["rawsocket"] = listen_url(raw_port, "rss" if raw.startswith("ssl:") else "rs", "")
        return urls

    def close(self, reason: str) -> None:
        """GOODBYE to every session."""
        self.router.shutdown(reason)

    def stats(self) -> dict[str, Any]:
        """Open sessions, and the entries in the RPC dealer's tables (all 0 once the sessions have left)."""
        return {"sessions": len(self.router.sessions), "dealer": self.router.dealer.tables()}


class NSDFrontend(Frontend):
    """NSD: TCP, JSON lines, with its SQLite store in the data dir."""

    name = "nsd"

    def __init__(self, hub: Hub, config: NodeConfig, auth: AuthPolicy | None, reactor: Any) -> None:
        self._hub = hub
        self._config = config
        self._auth = auth
        self._reactor = reactor
        self.service: Any = None
        super().__init__()

    async def listen(self) -> dict[str, str]:
        """Open the store, join the hub, serve NSD; its URL as ``nsd``."""
        from pubsubclub.frontends.nsd.codec import NSDLimits
        from pubsubclub.frontends.nsd.protocol import NSDFactory, NSDService, NSDSettings
        from pubsubclub.frontends.nsd.store import NSDStore

        config, section = self._config, self._config.nsd
        assert section.listen is not None
        os.makedirs(config.node.data_dir, exist_ok=True)
        store = NSDStore(os.path.join(config.node.data_dir, "nsd.sqlite3"))
        settings = NSDSettings(
            limits=NSDLimits(max_message_chars=section.max_message_chars, json=json_bounds(config)),
            prefix=section.prefix,
            retention_count=section.retention_count or None,
            retention_seconds=section.retention_seconds or None,
            auth=self._auth,
            # A transfer chunk must fit in one PSC message (one NSD message more may follow the budget).
            transfer_chunk_bytes=max(config.node.max_message_size // 4, 1024),
            max_clock_skew=section.max_clock_skew,
        )
        self.service = NSDService(self._hub, store, self._reactor.seconds, settings)
        self.service.start()
        from pubsubclub.frontends.nsd.codec import encode_error

        factory = self.guarded(config, "nsd", NSDFactory(self.service), encode_error("TOO MANY CONNECTIONS"))
        port = await serverFromString(self._reactor, section.listen).listen(factory)
        self._ports.append(port)
        host = port.getHost()
        return {"nsd": f"tcp://{getattr(host, 'host', '127.0.0.1')}:{host.port}"}  # type: ignore[attr-defined]

    def finish(self) -> None:
        """Leave the hub and close the store."""
        if self.service is not None:
            self.service.stop()

    def stats(self) -> dict[str, Any]:
        """The store's sizes and the service's counters."""
        if self.service is None:
            return {}
        return {**self.service.store.stats(), **self.service.stats}


class TEPFrontend(Frontend):
    """TEP: topic/payload JSON over WebSocket at ``/tep``; its operator API is served by the node's ops listener."""

    name = "tep"

    def __init__(
        self,
        hub: Hub,
        config: NodeConfig,
        auth: AuthPolicy | None,
        reactor: Any,
        login_throttle: LoginThrottle | None = None,
    ) -> None:
        from pubsubclub.frontends.tep.codec import TEPLimits
        from pubsubclub.frontends.tep.protocol import TEPServer

        self._config = config
        self._reactor = reactor
        self._login_throttle = login_throttle
        section = config.tep
        self.server = TEPServer(
            hub,
            TEPLimits(
                max_frame_bytes=config.node.max_message_size,
                max_channels_per_client=section.max_channels,
                json=json_bounds(config),
                max_send_buffer=config.node.max_send_buffer,
            ),
            prefix=section.prefix,
            client_publish=section.client_publish,
            auth=auth,
        )
        super().__init__()

    async def listen(self) -> dict[str, str]:
        """Serve TEP; its URL as ``tep``."""
        endpoint = self._config.tep.listen
        assert endpoint is not None
        root = Resource()
        # Autobahn declares IResource with zope, which mypy cannot see.
        root.putChild(b"tep", self.server.resource())  # type: ignore[arg-type]
        site = Site(root)
        site.noisy = False
        port = await serverFromString(self._reactor, endpoint).listen(
            self.guarded(self._config, "tep", site, HTTP_REFUSAL)
        )
        self._ports.append(port)
        return {"tep": listen_url(port, "ws", "/tep")}

    def operations(self) -> Resource | None:
        """``/tep`` for the ops listener, when a token file is configured (else the API is off)."""
        from pubsubclub.frontends.tep.protocol import TEPOperationsResource

        token = self._config.tep_ops_token()
        if token is None:
            log.info("TEP operator API (/tep on --http) is off: no --tep-ops-token-file")
            return None
        return TEPOperationsResource(self.server, token, self._login_throttle)

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Close every TEP client with ``reason``; fires when they have all gone."""
        # TEP clients finish their closing handshake while the links close.
        return self.server.stop(reason)

    def stats(self) -> dict[str, Any]:
        """Clients and the server's counters."""
        return {"clients": len(self.server.clients), **self.server.stats}
