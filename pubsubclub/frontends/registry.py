"""The front-end registry: each front-end package registers one :class:`FrontendSpec`; the node iterates them.

A spec names the front-end (its key in ``/stats`` and the ready line), its
config section (a dataclass of :func:`pubsubclub.config.setting` fields), when
it is on (``enabled(section)``), and how to build it
(``build(hub, section, context) -> Frontend``). The node hands every builder
the same :class:`FrontendContext`: the node-wide things a front-end may need,
never the whole configuration. docs/architecture.md, "Adding a front-end".

The built-in front-ends register from ``pubsubclub/frontends/<package>/frontend.py``;
:func:`specs` imports every such module it finds, so a new package needs no
edit anywhere else.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pubsubclub.core.hub import Hub
    from pubsubclub.core.jsonbounds import JSONBounds
    from pubsubclub.core.loginthrottle import LoginThrottle
    from pubsubclub.frontends.base import Frontend
    from pubsubclub.frontends.wamp.auth import AuthPolicy
    from pubsubclub.net.edge import Edge, EdgeLimits


@dataclass(frozen=True)
class FrontendContext:
    """What every front-end may use of the node besides its own section."""

    #: The reactor (timers, listening, threads).
    reactor: Any
    #: The node's id (the hub's).
    node_name: str
    #: Folder for the node's stores (``data-dir``).
    data_dir: str
    #: Largest message a client may send and a link may carry (``max-message-size``).
    max_message_size: int
    #: A client with more unread is dropped as a slow consumer (``max-send-buffer``).
    max_send_buffer: int
    #: The node-wide bounds on decoded JSON (``max-json-depth``).
    json: JSONBounds
    #: WAMP principals and roles (``--auth``), also applied by the other front-ends; None: everyone anonymous.
    auth: AuthPolicy | None = None
    #: The node's failed-login throttle (one per node), or None.
    login_throttle: LoginThrottle | None = None
    #: The connection layer every listener stands on (None: listeners unguarded, as in unit tests).
    edge: Edge | None = None
    #: The connection layer's limits for a listener name (``wamp``, ``nsd``, ...).
    edge_limits: Callable[[str], EdgeLimits] | None = None
    #: The CAs peers and routers are verified against (None: the platform's).
    trust_root: Any = None
    #: The federation, for a front-end that is itself a cluster member's local side (the bridge).
    federation: Any = None
    #: Every config section by name, for a front-end that shares a setting of another (the bridge: ``[wamp] realm``).
    sections: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FrontendSpec:
    """One front-end as the node knows it."""

    #: Its key in ``/stats`` (None there when it is off).
    name: str
    #: Its config section's dataclass; the node passes the loaded section (or this class's defaults).
    section: type
    #: ``(hub, section, context) -> Frontend``.
    build: Callable[[Hub, Any, FrontendContext], Frontend]
    #: Whether the section turns it on (a plain node skips it otherwise).
    enabled: Callable[[Any], bool] = lambda section: True
    #: The section's name on :class:`~pubsubclub.config.NodeConfig` and in TOML; default: ``name``.
    section_name: str | None = None
    #: Its listeners' endpoints by flag name (``wamp``, ``rawsocket``, ...), for the node's exposure warnings.
    endpoints: Callable[[Any], Mapping[str, str | None]] = lambda section: {}
    #: Which node runs it: ``node`` (``pubsubclub node``) or ``bridge`` (``pubsubclub bridge``).
    mode: str = "node"
    #: Start before the federation and ops listeners (the WAMP listener: a port clash is named first).
    early: bool = False
    #: The counter vocabularies it reports under (core/counters.py component names), for docs and checks.
    counters: tuple[str, ...] = ()
    #: It owns one resource (a store, a log, a kernel queue): with ``--workers``, only the primary worker runs it.
    single_resource: bool = False

    @property
    def config_key(self) -> str:
        """The section's attribute on the node configuration."""
        return self.section_name or self.name


_SPECS: dict[str, FrontendSpec] = {}
_loaded = False


def register(spec: FrontendSpec) -> FrontendSpec:
    """Add ``spec`` (a second registration under the same name replaces the first)."""
    _SPECS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Forget the front-end ``name`` (tests registering a toy one clean up with this)."""
    _SPECS.pop(name, None)


def load_builtin() -> None:
    """Import ``frontend`` of every package under :mod:`pubsubclub.frontends` (each registers itself)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import pubsubclub.frontends as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.ispkg:
            try:
                importlib.import_module(f"{package.__name__}.{info.name}.frontend")
            except ModuleNotFoundError as e:
                if e.name != f"{package.__name__}.{info.name}.frontend":
                    raise


#: Built-in front-ends in the order /stats has always listed them (others follow in registration order).
_ORDER = ("wamp", "nsd", "tep", "stream", "sysv", "bridge")


def specs() -> list[FrontendSpec]:
    """Every registered front-end: the built-in ones first, in their usual order."""
    load_builtin()
    rank = {name: i for i, name in enumerate(_ORDER)}
    return sorted(_SPECS.values(), key=lambda s: rank.get(s.name, len(rank)))
