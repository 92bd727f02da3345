"""The SysV front-end's registration (the class is :class:`~pubsubclub.frontends.sysv.service.SysVFrontend`).

The service module imports ``sysv_ipc``; it is imported only when ``--sysv`` is set.
"""

from __future__ import annotations

from typing import Any

from pubsubclub.config import SysVSection
from pubsubclub.core.hub import Hub
from pubsubclub.frontends.base import Frontend
from pubsubclub.frontends.registry import FrontendContext, FrontendSpec, register


def build(hub: Hub, section: Any, context: FrontendContext) -> Frontend:
    """The SysV front-end of ``section`` (its queue opens at listen)."""
    from pubsubclub.frontends.sysv.service import SysVFrontend

    return SysVFrontend(hub, section, context)


register(
    FrontendSpec(
        name="sysv",
        section=SysVSection,
        build=build,
        enabled=lambda section: section.key is not None,
        counters=("sysv",),
    )
)
