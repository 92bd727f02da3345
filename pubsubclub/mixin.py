"""``PubSubClubMixin``: federation for any Twisted pub/sub server.

Mix it into your server class (a WAMP broker, a factory, anything that knows
its subscribers) and the server joins a PubSubClub cluster. The contract is
small; a server must:

* call :meth:`PubSubClubMixin.pubsubclub_setup` once, before anything else;
* call :meth:`~PubSubClubMixin.pubsubclub_subscribed` when a topic gets its
  first local subscriber and :meth:`~PubSubClubMixin.pubsubclub_unsubscribed`
  when it loses its last one (calling them more often is harmless);
* call :meth:`~PubSubClubMixin.pubsubclub_published_event` with the
  publish's WAMP ``args`` and ``kwargs`` after it delivered it to its own
  subscribers;
* implement :meth:`~PubSubClubMixin.pubsubclub_dispatch_event`, which
  delivers a message from another node, as ``args`` and ``kwargs``, to its
  local subscribers only.

``args`` and ``kwargs`` cross the cluster unchanged, between mixin servers,
built-in nodes and WAMP clients on either: a publish of ``("hi", url)`` with
``k=1`` arrives as ``("hi", url)`` with ``k=1`` everywhere. The hooks of
earlier versions, ``pubsubclub_published(topic, message)`` and
``pubsubclub_dispatch(topic, message)``, still work (one value per message;
several args arrive as a ``{"args": [...], "kwargs": {...}}`` dict) and warn
once with a DeprecationWarning.

Everything else - listening for links, dialling peers, the handshake, pings,
reconnects, interest bookkeeping - is the mixin's. A server that wants the
finer control of per-client sinks (as :class:`pubsubclub.frontends.wamp.server.WampServer`
does) may subscribe sinks on :attr:`pubsubclub_hub` directly instead.
"""

from __future__ import annotations

import warnings
from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import Resource
from twisted.web.server import Site

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.federation import Federation, Role


class _ServerSink:
    """The whole mixed-in server, seen by the hub as one sink."""

    def __init__(self, server: PubSubClubMixin) -> None:
        self._server = server

    def deliver(self, envelope: Envelope) -> None:
        from pubsubclub.frontends.wamp.broker import event_arguments

        args, kwargs = event_arguments(envelope)
        self._server.pubsubclub_dispatch_event(envelope.topic, list(args), dict(kwargs or {}))


class PubSubClubMixin:
    """Adds PubSubClub federation to a pub/sub server class."""

    pubsubclub_hub: Hub
    pubsubclub: Federation

    def pubsubclub_setup(
        self,
        *,
        node_id: str | None = None,
        listen_role: str | Role = Role.PRODUCER,
        reactor: Any = None,
        hub: Hub | None = None,
        **federation_options: Any,
    ) -> None:
        """Create the node's hub and federation; ``federation_options`` go to :class:`Federation`."""
        self.pubsubclub_hub = hub if hub is not None else Hub(node_id)
        self.pubsubclub = Federation(
            self.pubsubclub_hub, listen_role=Role(listen_role), reactor=reactor, **federation_options
        )
        self._pubsubclub_sink = _ServerSink(self)
        self._pubsubclub_reactor = reactor

    # -- cluster membership --------------------------------------------------

    def pubsubclub_listen(self, endpoint: str) -> defer.Deferred[IListeningPort]:
        """Accept PSC links on a Twisted endpoint string, at path ``/psc``."""
        reactor = self._pubsubclub_reactor
        if reactor is None:
            from twisted.internet import reactor
        root = Resource()
        root.putChild(b"psc", self.pubsubclub.resource())
        return serverFromString(reactor, endpoint).listen(Site(root))

    def add_server(self, url: str) -> None:
        """Link to the node at ``url`` (e.g. ``ws://10.0.0.2:9001/psc``) and keep the link up."""
        self.pubsubclub.add_server(url)

    def remove_server(self, url: str) -> defer.Deferred[None]:
        """Close the link to ``url`` and stop retrying it."""
        return self.pubsubclub.remove_server(url)

    def pubsubclub_stop(self) -> defer.Deferred[Any]:
        """Close every link with a reason; call on shutdown."""
        return self.pubsubclub.stop()

    # -- what the server calls -------------------------------------------------

    def pubsubclub_subscribed(self, topic: str) -> None:
        """The server has (at least one) local subscriber for ``topic``."""
        self.pubsubclub_hub.subscribe(topic, self._pubsubclub_sink)

    def pubsubclub_unsubscribed(self, topic: str) -> None:
        """The server has no local subscriber left for ``topic``."""
        self.pubsubclub_hub.unsubscribe(topic, self._pubsubclub_sink)

    def pubsubclub_published_event(self, topic: str, args: Any = (), kwargs: dict[str, Any] | None = None) -> None:
        """The server delivered a publish (WAMP ``args``, ``kwargs``) locally; send it to the rest of the cluster."""
        from pubsubclub.frontends.wamp.broker import wamp_envelope

        hub = self.pubsubclub_hub
        hub.publish(wamp_envelope(hub, topic, list(args), kwargs), exclude=self._pubsubclub_sink)

    def pubsubclub_published(self, topic: str, message: Any) -> None:
        """Deprecated: :meth:`pubsubclub_published_event`. ``message`` travels as the one argument."""
        _deprecated("pubsubclub_published(topic, message)", "pubsubclub_published_event(topic, args, kwargs)")
        hub = self.pubsubclub_hub
        hub.publish(hub.envelope(topic, message), exclude=self._pubsubclub_sink)

    # -- what the server provides ---------------------------------------------

    def pubsubclub_dispatch_event(self, topic: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Deliver a message from another node (WAMP ``args``, ``kwargs``) to local subscribers only.

        The default hands it to the deprecated :meth:`pubsubclub_dispatch`, as
        one value (several args as a ``{"args", "kwargs"}`` dict).
        """
        _deprecated("pubsubclub_dispatch(topic, message)", "pubsubclub_dispatch_event(topic, args, kwargs)")
        message = args[0] if len(args) == 1 and not kwargs else {"args": args, "kwargs": kwargs}
        self.pubsubclub_dispatch(topic, message)

    def pubsubclub_dispatch(self, topic: str, message: Any) -> None:
        """Deprecated: implement :meth:`pubsubclub_dispatch_event` instead."""
        raise NotImplementedError(
            "a PubSubClubMixin server must implement pubsubclub_dispatch_event(topic, args, kwargs)"
        )


_warned: set[str] = set()


def _deprecated(old: str, new: str) -> None:
    """Warn once per hook that an old hook is in use."""
    if old not in _warned:
        _warned.add(old)
        warnings.warn(f"PubSubClubMixin.{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
