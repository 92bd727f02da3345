"""One node: the WAMP server, the federation listener and static discovery."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Request
from twisted.web.static import File

from pubsubclub.config import NodeConfig
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
        self.server = WampServer(
            realms=(config.realm,),
            limits=WampLimits(max_message_size=size),
            node_id=config.name,
            listen_role=config.listen_role,
            reactor=reactor,
            psc_limits=Limits(max_message_size=size),
            advertise_url=config.advertise,
        )
        self.hub = self.server.pubsubclub_hub
        self.federation = self.server.pubsubclub
        self.ports: list[IListeningPort] = []
        self.urls: dict[str, str] = {}

    def stats(self) -> dict[str, Any]:
        """Counters and link states."""
        return {
            "node": self.hub.node_id,
            "hub": dict(self.hub.stats),
            "topics": len(self.hub.topics()),
            "federation": dict(self.federation.stats),
            "links": self.federation.links(),
            "servers": self.federation.servers(),
            "remote_interest": self.federation.remote_interest(),
        }

    def _wamp_site(self) -> Any:
        site = self.server.site(str(STATIC_DIR) if self.config.chat_page else None)
        root = site.resource
        root.putChild(b"stats", StatsResource(self))
        if self.config.chat_page:
            bundle = find_autobahn_js()
            if bundle is not None:
                root.putChild(b"autobahn.min.js", File(str(bundle), defaultType="application/javascript"))
            else:
                log.warn("autobahn-js browser bundle not found; the chat page will not connect (run make js)")
        return site

    async def start(self) -> dict[str, str]:
        """Listen, link to the configured peers, and return the node's URLs."""
        wamp_port = await self.server.listen(self.config.wamp, self._wamp_site())
        self.ports.append(wamp_port)
        self.urls["wamp"] = _url(wamp_port, "ws", "/ws")
        self.urls["http"] = _url(wamp_port, "http", "/")
        if self.config.psc is not None:
            psc_port = await self.server.pubsubclub_listen(self.config.psc)
            self.ports.append(psc_port)
            self.urls["psc"] = _url(psc_port, "ws", "/psc")
            if self.federation.advertise_url is None:
                self.federation.advertise_url = self.urls["psc"]
        for url in self.config.peer:
            self.federation.add_server(url)
        log.info("node {name} ready: {urls}", name=self.hub.node_id, urls=self.urls)
        return self.urls

    async def stop(self) -> None:
        """Close links with a reason, then stop listening."""
        await self.federation.stop()
        await defer.gatherResults([defer.maybeDeferred(p.stopListening) for p in self.ports])


def print_ready(node: Node, urls: dict[str, str]) -> None:
    """One JSON line on stdout that scripts and tests wait for."""
    sys.stdout.write(json.dumps({"event": "ready", "name": node.hub.node_id, **urls}) + "\n")
    sys.stdout.flush()
