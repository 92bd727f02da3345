"""What a front-end is to the node: the :class:`Frontend` protocol, a base class, and shared helpers.

Each front-end is one package under ``pubsubclub/frontends/`` holding its own
front-end class, built from its own config section plus a small
:class:`~pubsubclub.frontends.registry.FrontendContext` (reactor, auth policy,
login throttle, edge, JSON bounds, node name, data dir, message size). It
registers itself in :mod:`pubsubclub.frontends.registry`; the node iterates
the registry. It takes part in shutdown in two steps: :meth:`Frontend.close`
says goodbye to its clients while the links are still up,
:meth:`Frontend.finish` releases what it holds once they are down. Nothing here
knows about the federation. A new protocol is one more package with one
registration (docs/architecture.md, "Adding a front-end").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from twisted.internet import defer
from twisted.internet.interfaces import IListeningPort

from pubsubclub.net.edge import http_refusal

if TYPE_CHECKING:
    from pubsubclub.frontends.registry import FrontendContext
    from pubsubclub.net.edge import Edge


@runtime_checkable
class Frontend(Protocol):
    """What the node needs of a front-end."""

    #: Short name: the key of its URL in the node's ready line.
    name: str
    #: The node's connection layer (None: listeners unguarded).
    edge: Edge | None

    async def listen(self) -> dict[str, str]:
        """Start serving; return the URLs served, by name."""
        ...

    def ports(self) -> list[IListeningPort]:
        """The listening ports (stopped first on shutdown)."""
        ...

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Say goodbye to every client (the links are still up); a Deferred when that takes time."""
        ...

    def finish(self) -> None:
        """Release stores and timers, after the links are closed."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters and sizes for /stats."""
        ...

    def operations(self) -> dict[bytes, Any]:
        """Resources this front-end serves on the node's ops listener, by path segment (usually none)."""
        ...


class FrontendBase:
    """A front-end's common parts: its ports, the edge guard, no-op close/finish; subclasses listen and count."""

    #: Short name: the key of its URL in the node's ready line.
    name = ""
    #: The node's connection layer; set by the node before :meth:`listen` (None: listeners unguarded).
    edge: Edge | None = None

    def __init__(self, context: FrontendContext | None = None) -> None:
        self._ports: list[IListeningPort] = []
        self.context = context
        if context is not None and context.edge is not None:
            self.edge = context.edge

    def guarded(self, listener: str, factory: Any, refusal: bytes) -> Any:
        """``factory`` behind the node's connection layer as ``listener`` (unchanged when there is none)."""
        if self.edge is None or self.context is None or self.context.edge_limits is None:
            return factory
        return self.edge.guard(listener, factory, self.context.edge_limits(listener), refusal)

    async def listen(self) -> dict[str, str]:
        """Start serving; return the URLs served, by name."""
        raise NotImplementedError

    def ports(self) -> list[IListeningPort]:
        """The listening ports (stopped first on shutdown)."""
        return self._ports

    def close(self, reason: str) -> defer.Deferred[Any] | None:
        """Say goodbye to every client (the links are still up); a Deferred when that takes time."""
        return None

    def finish(self) -> None:
        """Release stores and timers, after the links are closed."""

    def stats(self) -> dict[str, Any]:
        """Counters and sizes for /stats."""
        raise NotImplementedError

    def operations(self) -> dict[bytes, Any]:
        """No resources on the ops listener."""
        return {}


def listen_url(port: IListeningPort, scheme: str, path: str) -> str:
    """The URL a listening port serves, with 127.0.0.1 for a wildcard bind."""
    host = port.getHost()
    address = getattr(host, "host", "127.0.0.1")
    if address in ("0.0.0.0", "::", ""):
        address = "127.0.0.1"
    return f"{scheme}://{address}:{host.port}{path}"  # type: ignore[attr-defined]


def tcp_url(port: IListeningPort) -> str:
    """``tcp://host:port`` of a listening TCP port."""
    host = port.getHost()
    return f"tcp://{getattr(host, 'host', '127.0.0.1')}:{host.port}"  # type: ignore[attr-defined]


#: What a refused connection on an HTTP or WebSocket listener is told (before any upgrade).
HTTP_REFUSAL = http_refusal("too many connections")
