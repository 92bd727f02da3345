"""Our WAMP server: the broker plus PubSubClub federation through the mixin."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.web.server import Site

from pubsubclub.mixin import PubSubClubMixin
from pubsubclub.psc import DEFAULT_LIMITS, Limits
from pubsubclub.wamp.auth import AuthPolicy
from pubsubclub.wamp.broker import WampLimits, WampRouter
from pubsubclub.wamp.transport import wamp_site


class WampServer(PubSubClubMixin):
    """A WAMP v2 broker federated with other nodes.

    The broker's sessions subscribe their own sinks on the mixin's hub (finer
    than the mixin's one-sink-per-server contract), so ``pubsubclub_dispatch``
    is never needed here.
    """

    def __init__(
        self,
        *,
        realms: tuple[str, ...] = ("realm1",),
        limits: WampLimits = WampLimits(),
        node_id: str | None = None,
        listen_role: str = "producer",
        reactor: Any = None,
        psc_limits: Limits = DEFAULT_LIMITS,
        auth: AuthPolicy | None = None,
        **federation_options: Any,
    ) -> None:
        self.pubsubclub_setup(
            node_id=node_id, listen_role=listen_role, reactor=reactor, limits=psc_limits, **federation_options
        )
        # No policy: every session is anonymous and may do everything (optional, as for the mixin).
        self.router = WampRouter(self.pubsubclub_hub, realms, limits, auth=auth)
        self._reactor = reactor

    def site(self, static_dir: str | None = None) -> Site:
        """The WAMP web site: WebSocket at ``/ws``, static files at ``/``."""
        return wamp_site(self.router, static_dir)

    def listen(self, endpoint: str, site: Site | None = None) -> defer.Deferred[IListeningPort]:
        """Serve WAMP on a Twisted endpoint string."""
        reactor = self._reactor
        if reactor is None:
            from twisted.internet import reactor
        return serverFromString(reactor, endpoint).listen(site or self.site())

    def pubsubclub_dispatch(self, topic: str, message: Any) -> None:
        """Unused: the broker's sessions are sinks of the hub themselves."""
        raise AssertionError("WampServer delivers through per-session hub sinks")
