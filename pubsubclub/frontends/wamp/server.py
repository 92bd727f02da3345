"""Our WAMP server: the broker on a hub, served over WebSocket.

It knows nothing of the federation: the node composes it with the hub and
the federation as peers (pubsubclub/node/node.py). Users' own servers join a
cluster through :class:`pubsubclub.mixin.PubSubClubMixin` instead.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.web.server import Site

from pubsubclub.core.hub import Hub
from pubsubclub.core.loginthrottle import LoginThrottle, LoginThrottleSettings
from pubsubclub.frontends.wamp.auth import AuthPolicy
from pubsubclub.frontends.wamp.publishing import DISCLOSE_ON_REQUEST
from pubsubclub.frontends.wamp.router import WampLimits, WampRouter
from pubsubclub.frontends.wamp.transport import wamp_site


class WampServer:
    """A WAMP v2 broker whose sessions subscribe their own sinks on ``hub``."""

    def __init__(
        self,
        hub: Hub,
        *,
        realms: tuple[str, ...] = ("realm1",),
        limits: WampLimits = WampLimits(),
        auth: AuthPolicy | None = None,
        reactor: Any = None,
        await_interest: bool = False,
        max_call_seconds: float = 0.0,
        max_pending_calls: int = 1000,
        login_throttle: LoginThrottle | None = None,
        disclose_publisher: str = DISCLOSE_ON_REQUEST,
        plain_realm: str | None = None,
        disclose_caller: str = DISCLOSE_ON_REQUEST,
    ) -> None:
        self.hub = hub
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        if login_throttle is None and auth is not None:
            # A policy with credentials is never left open to unthrottled guessing.
            login_throttle = LoginThrottle(LoginThrottleSettings(), reactor.seconds)
        # No policy: every session is anonymous and may do everything.
        self.router = WampRouter(
            hub,
            realms,
            limits,
            auth=auth,
            await_interest=await_interest,
            call_later=reactor.callLater,
            max_call_seconds=max_call_seconds,
            max_pending_calls=max_pending_calls,
            login_throttle=login_throttle,
            disclose_publisher=disclose_publisher,
            plain_realm=plain_realm,
            disclose_caller=disclose_caller,
        )
        self._reactor = reactor

    def site(self, static_dir: str | None = None) -> Site:
        """The WAMP web site: WebSocket at ``/ws``, static files at ``/``."""
        return wamp_site(self.router, static_dir)

    def listen(self, endpoint: str, site: Site | None = None) -> defer.Deferred[IListeningPort]:
        """Serve WAMP on a Twisted endpoint string."""
        return serverFromString(self._reactor, endpoint).listen(site or self.site())
