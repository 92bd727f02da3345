"""The NSD front-end as the node sees it: TCP, JSON lines, its SQLite store in the data dir; its registration."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.endpoints import serverFromString

from pubsubclub.config import NSDSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import FrontendBase, tcp_url
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register


class NSDFrontend(FrontendBase):
    """NSD: TCP, JSON lines, with its SQLite store in the data dir."""

    name = "nsd"

    def __init__(self, hub: Hub, section: NSDSection, context: FrontendContext) -> None:
        super().__init__(context)
        self._hub = hub
        self.section = section
        self.service: Any = None

    async def listen(self) -> dict[str, str]:
        """Open the store, join the hub, serve NSD; its URL as ``nsd``."""
        from pubsubclub.frontends.nsd.codec import NSDLimits, encode_error
        from pubsubclub.frontends.nsd.protocol import NSDFactory, NSDService, NSDSettings
        from pubsubclub.frontends.nsd.store import NSDStore

        context, section = self.context, self.section
        assert context is not None and section.listen is not None
        os.makedirs(context.data_dir, exist_ok=True)
        store = NSDStore(os.path.join(context.data_dir, "nsd.sqlite3"))
        settings = NSDSettings(
            limits=NSDLimits(max_message_chars=section.max_message_chars, json=context.json),
            prefix=section.prefix,
            retention_count=section.retention_count or None,
            retention_seconds=section.retention_seconds or None,
            auth=context.auth,
            # A transfer chunk must fit in one PSC message (one NSD message more may follow the budget).
            transfer_chunk_bytes=max(context.max_message_size // 4, 1024),
            max_clock_skew=section.max_clock_skew,
        )
        self.service = NSDService(self._hub, store, context.reactor.seconds, settings)
        self.service.start()
        factory = self.guarded("nsd", NSDFactory(self.service), encode_error("TOO MANY CONNECTIONS"))
        port = await serverFromString(context.reactor, section.listen).listen(factory)
        self._ports.append(port)
        return {"nsd": tcp_url(port)}

    def finish(self) -> None:
        """Leave the hub and close the store."""
        if self.service is not None:
            self.service.stop()

    def stats(self) -> dict[str, Any]:
        """The store's sizes and the service's counters."""
        if self.service is None:
            return {}
        return {**self.service.store.stats(), **self.service.stats}


register(
    FrontendSpec(
        name="nsd",
        section=NSDSection,
        build=NSDFrontend,
        enabled=lambda section: section.listen is not None,
        endpoints=lambda section: {"nsd": section.listen},
        counters=("nsd",),
        single_resource=True,  # its SQLite store
    )
)
