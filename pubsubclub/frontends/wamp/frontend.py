"""The WAMP front-end as the node sees it: WebSocket at ``/ws`` (+ the chat page), RawSocket; its registration."""

from __future__ import annotations

from typing import Any

from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.web.server import Site
from twisted.web.static import File

from pubsubclub.config import WampSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import HTTP_REFUSAL, FrontendBase, listen_url
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register

log = Logger()


class WampFrontend(FrontendBase):
    """WAMP v2 over WebSocket at ``/ws`` (and the chat page at ``/``)."""

    name = "wamp"

    def __init__(self, hub: Hub, section: WampSection, context: FrontendContext) -> None:
        from pubsubclub.frontends.wamp.broker import WampLimits
        from pubsubclub.frontends.wamp.server import WampServer

        super().__init__(context)
        self.section = section
        self._reactor = context.reactor
        limits = WampLimits(
            max_message_size=context.max_message_size,
            json=context.json,
            max_send_buffer=context.max_send_buffer,
            join_timeout=section.join_timeout,
            max_subscriptions_per_session=section.max_subscriptions,
            max_registrations_per_session=section.max_registrations,
            max_registrations=section.max_registrations_per_node,
            max_calls=section.max_calls_per_node,
            max_retained_topics=section.max_retained_topics,
            max_retained_bytes=section.max_retained_bytes,
            max_calls_per_link=section.max_calls_per_link,
        )
        self.server = WampServer(
            hub,
            realms=section.realms,
            plain_realm=section.plain,
            limits=limits,
            auth=context.auth,
            reactor=context.reactor,
            await_interest=section.await_interest,
            disclose_publisher=section.disclose_publisher,
            disclose_caller=section.disclose_caller,
            max_call_seconds=section.call_timeout,
            max_pending_calls=section.max_pending_calls,
            login_throttle=context.login_throttle,
        )
        self.router = self.server.router
        # REGISTERED as SUBSCRIBED: held until every linked node has it (federation/rpc.py), within the bound.
        self.router.await_timeout = section.await_interest_timeout
        self.router.dealer.await_seconds = section.await_interest_timeout if section.await_interest else 0.0
        from pubsubclub.frontends.wamp.meta import MetaLimits

        self.router.meta.limits = MetaLimits(section.meta_max_results, section.meta_timeout, section.meta_max_queries)
        if context.federation is not None:
            # RPC across the cluster: the federation routes calls to and from this dealer (federation/rpc.py).
            context.federation.rpc.attach(self.router.dealer)
            # The meta API asks other nodes over the same links; their subscriptions to meta events count.
            federation = context.federation
            self.router.meta.attach(federation.rpc, federation.forwards, federation.unasked_nodes)
            # Retained events across the cluster: every node holds a replica (federation/retained.py).
            context.federation.retained.attach(self.router.retained)

    def _site(self) -> Site:
        from pubsubclub.frontends.wamp.chatpage import STATIC_DIR, find_autobahn_js

        chat = self.section.chat_page
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
        endpoint = self.section.listen
        tls = endpoint.startswith("ssl:")
        site = self.guarded("wamp", self._site(), HTTP_REFUSAL)
        port = await serverFromString(self._reactor, endpoint).listen(site)
        self._ports.append(port)
        urls = {
            "wamp": listen_url(port, "wss" if tls else "ws", "/ws"),
            "http": listen_url(port, "https" if tls else "http", "/"),
        }
        raw = self.section.rawsocket
        if raw is not None:
            from pubsubclub.frontends.wamp.rawsocket import REFUSAL_MAX_CONNECTIONS, WampRawSocketFactory

            factory = self.guarded("rawsocket", WampRawSocketFactory(self.router), REFUSAL_MAX_CONNECTIONS)
            raw_port = await serverFromString(self._reactor, raw).listen(factory)
            self._ports.append(raw_port)
            urls["rawsocket"] = listen_url(raw_port, "rss" if raw.startswith("ssl:") else "rs", "")
        return urls

    def close(self, reason: str) -> None:
        """GOODBYE to every session."""
        self.router.shutdown(reason)

    def stats(self) -> dict[str, Any]:
        """Sessions, the dealer's and meta API's table entries (0 once sessions left), retained events, realms."""
        router = self.router
        retained = router.retained
        return {
            "sessions": len(router.sessions),
            "dealer": router.dealer.tables(),
            "meta": router.meta.stats(),
            "retained": {"topics": len(retained), "bytes": retained.bytes},
            "realms": list(router.realms),
            "plain_realm": router.plain_realm,
        }


register(
    FrontendSpec(
        name="wamp",
        section=WampSection,
        build=WampFrontend,
        endpoints=lambda section: {"wamp": section.listen, "rawsocket": section.rawsocket},
        early=True,
        counters=("wamp",),
    )
)
