"""The bridge's registration: the one front-end of ``pubsubclub bridge`` (docs/bridge.md)."""

from __future__ import annotations

from typing import Any

from pubsubclub.config import BridgeSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import Frontend
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register


def build(hub: Hub, section: Any, context: FrontendContext) -> Frontend:
    """The router bridge of ``section``, joining the realm of ``[wamp] realm``, carried onto ``cluster-realm``."""
    from pubsubclub.frontends.bridge.router import RouterBridge

    return RouterBridge(
        hub,
        context.federation,
        section,
        context.reactor,
        realm=context.sections["wamp"].realm,
        cluster_realm=section.cluster_realm,
        plain_realm=context.sections["wamp"].plain_realm,
        trust_root=context.trust_root,
    )


register(FrontendSpec(name="bridge", section=BridgeSection, build=build, mode="bridge", counters=("bridge",)))
