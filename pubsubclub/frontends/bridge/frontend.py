"""The bridge's registration: the one front-end of ``pubsubclub bridge`` (docs/bridge.md)."""

from __future__ import annotations

from typing import Any

from pubsubclub.config import BridgeSection
from pubsubclub.core.hub import Hub
from pubsubclub.federation.retry import RetryPolicy
from pubsubclub.frontends.base import Frontend
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register


def build(hub: Hub, section: Any, context: FrontendContext) -> Frontend:
    """The router bridge of ``section``, joining the realm of ``[wamp] realm``, carried onto ``cluster-realm``."""
    from pubsubclub.frontends.bridge.router import RouterBridge
    from pubsubclub.frontends.bridge.rpc import RouterRPC
    from pubsubclub.frontends.wamp.dealer import Dealer
    from pubsubclub.frontends.wamp.uris import random_wamp_id

    wamp = context.sections["wamp"]
    # Procedures cross in the bridge's cluster realm (as its events do: bridge/realm.py), not the router's.
    cluster_realm = section.cluster_realm if section.cluster_realm is not None else wamp.plain
    # The bridge's own dealer, attached to the cluster's RPC: it holds the router's procedures (one
    # callee stands for all of them) and every other node's (pubsubclub/frontends/bridge/rpc.py).
    dealer = Dealer(
        random_wamp_id,
        call_later=context.reactor.callLater,
        max_call_seconds=wamp.call_timeout,
        max_pending_calls=section.max_calls,
        max_node_calls=wamp.max_calls_per_node,
        max_registrations=wamp.max_registrations_per_node,
        max_node_registrations=wamp.max_registrations_per_node,
    )
    if context.federation is not None:
        context.federation.rpc.attach(dealer)
    # The router is redialled on the links' schedule ([federation] reconnect-initial / reconnect-max).
    links = context.sections.get("federation")
    retry = (
        RetryPolicy() if links is None else RetryPolicy(initial=links.reconnect_initial, max_delay=links.reconnect_max)
    )
    return RouterBridge(
        hub,
        context.federation,
        section,
        context.reactor,
        realm=wamp.realm,
        cluster_realm=section.cluster_realm,
        plain_realm=wamp.plain_realm,
        trust_root=context.trust_root,
        retry=retry,
        rpc=RouterRPC(dealer, cluster_realm, section.role, section.max_calls, context.reactor, hub.metrics.event),
    )


register(FrontendSpec(name="bridge", section=BridgeSection, build=build, mode="bridge", counters=("bridge",)))
