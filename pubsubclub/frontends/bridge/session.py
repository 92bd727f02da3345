"""The router end of a bridge: its hub sink and its WAMP client session, both handing everything to the bridge.

Split from :mod:`pubsubclub.frontends.bridge.router` (issue 19), which
re-exports them; the :class:`~pubsubclub.frontends.bridge.router.RouterBridge`
they serve stays there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autobahn.twisted.wamp import ApplicationSession
from autobahn.wamp.types import ComponentConfig

from pubsubclub.core.counters import Source
from pubsubclub.core.hub import Envelope
from pubsubclub.core.patterns import Pattern

if TYPE_CHECKING:
    from pubsubclub.frontends.bridge.router import RouterBridge


class _RouterSink:
    """The bridge's hub sink: what the cluster sends for the router's clients."""

    counts_as = Source.BRIDGE

    def __init__(self, bridge: RouterBridge) -> None:
        self._bridge = bridge

    def deliver(self, envelope: Envelope) -> bool:
        return self._bridge.publish_into_router(envelope)

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> bool:
        # The router matches its own subscribers: one PUBLISH serves them all.
        return self._bridge.publish_into_router(envelope)


class _BridgeSession(ApplicationSession):  # type: ignore[misc]
    """One router session of a bridge; everything it hears goes to the :class:`RouterBridge`."""

    def __init__(self, config: ComponentConfig, bridge: RouterBridge) -> None:
        super().__init__(config)
        self._bridge = bridge

    def onConnect(self) -> None:
        authid = self._bridge.authid
        methods = self._bridge.authmethods()
        if authid is None or not methods:
            self.join(self.config.realm)
        else:
            self.join(self.config.realm, authmethods=methods, authid=authid)

    def onChallenge(self, challenge: Any) -> str:
        return self._bridge.answer(challenge)

    async def onJoin(self, details: Any) -> None:
        await self._bridge.joined(self, details)

    def onLeave(self, details: Any) -> None:
        self._bridge.left(self, details)
        super().onLeave(details)

    def onDisconnect(self) -> None:
        self._bridge.left(self, None)
