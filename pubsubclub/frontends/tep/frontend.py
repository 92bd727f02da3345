"""The TEP front-end as the node sees it: WebSocket at ``/tep``, its operator API on the ops listener."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.web.resource import Resource
from twisted.web.server import Site

from pubsubclub.config import TEPSection, read_cluster_secret
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import HTTP_REFUSAL, FrontendBase, listen_url
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register

log = Logger()


class TEPFrontend(FrontendBase):
    """TEP: topic/payload JSON over WebSocket at ``/tep``; its operator API is served by the node's ops listener."""

    name = "tep"

    def __init__(self, hub: Hub, section: TEPSection, context: FrontendContext) -> None:
        from pubsubclub.frontends.tep.codec import TEPLimits
        from pubsubclub.frontends.tep.protocol import TEPServer

        super().__init__(context)
        self.section = section
        self._reactor = context.reactor
        self._login_throttle = context.login_throttle
        self.server = TEPServer(
            hub,
            TEPLimits(
                max_frame_bytes=context.max_message_size,
                max_channels_per_client=section.max_channels,
                json=context.json,
                max_send_buffer=context.max_send_buffer,
            ),
            prefix=section.prefix,
            client_publish=section.client_publish,
            auth=context.auth,
        )

    async def listen(self) -> dict[str, str]:
        """Serve TEP; its URL as ``tep``."""
        endpoint = self.section.listen
        assert endpoint is not None
        root = Resource()
        # Autobahn declares IResource with zope, which mypy cannot see.
        root.putChild(b"tep", self.server.resource())  # type: ignore[arg-type]
        site = Site(root)
        site.noisy = False
        port = await serverFromString(self._reactor, endpoint).listen(self.guarded("tep", site, HTTP_REFUSAL))
        self._ports.append(port)
        return {"tep": listen_url(port, "ws", "/tep")}

    def operations(self) -> dict[bytes, Any]:
        """``/tep`` for the ops listener, when a token file is configured (else the API is off)."""
        from pubsubclub.frontends.tep.protocol import TEPOperationsResource

        path = self.section.ops_token_file
        if path is None:
            log.info("TEP operator API (/tep on --http) is off: no --tep-ops-token-file")
            return {}
        token = read_cluster_secret(path, key="tep-ops-token-file")
        return {b"tep": TEPOperationsResource(self.server, token, self._login_throttle)}

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Close every TEP client with ``reason``; fires when they have all gone."""
        # TEP clients finish their closing handshake while the links close.
        return self.server.stop(reason)

    def stats(self) -> dict[str, Any]:
        """Clients and the server's counters."""
        return {"clients": len(self.server.clients), **self.server.stats}


register(
    FrontendSpec(
        name="tep",
        section=TEPSection,
        build=TEPFrontend,
        enabled=lambda section: section.listen is not None,
        endpoints=lambda section: {"tep": section.listen},
        counters=("tep",),
    )
)
