"""The stream front-end's registration (the class is :class:`~pubsubclub.frontends.stream.protocol.StreamFrontend`)."""

from __future__ import annotations

from typing import Any

from pubsubclub.config import StreamSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import Frontend
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register


def build(hub: Hub, section: Any, context: FrontendContext) -> Frontend:
    """The stream front-end of ``section`` (its log opens at listen)."""
    from pubsubclub.frontends.stream.protocol import StreamFrontend

    return StreamFrontend(hub, section, context)


register(
    FrontendSpec(
        name="stream",
        section=StreamSection,
        build=build,
        enabled=lambda section: section.listen is not None,
        endpoints=lambda section: {"stream": section.listen},
        counters=("stream",),
        single_resource=True,  # its log and committed offsets
    )
)
