"""Autobahn-Python WAMP client sessions for tests, on the running Twisted reactor."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from autobahn.twisted.wamp import ApplicationSession
from autobahn.twisted.websocket import WampWebSocketClientFactory
from autobahn.wamp import auth
from autobahn.wamp.serializer import CBORSerializer, JsonSerializer, MsgPackSerializer
from autobahn.wamp.types import ComponentConfig, PublishOptions
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.ssl import optionsForClientTLS

TIMEOUT = 15


class Recorder:
    """Collects events of one subscription; tests await counts, not time."""

    def __init__(self) -> None:
        self.events: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._waiters: list[tuple[Any, defer.Deferred[None]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.events.append((args, kwargs))
        for cond, d in list(self._waiters):
            if cond(self):
                self._waiters.remove((cond, d))
                d.callback(None)

    @property
    def args(self) -> list[Any]:
        """The first positional arg of each event."""
        return [a[0] if a else None for a, _ in self.events]

    def wait_for(self, n: int, timeout: float = TIMEOUT) -> defer.Deferred[None]:
        """Fires once at least ``n`` events arrived."""
        return self.wait_until(lambda r: len(r.events) >= n, timeout)

    def wait_until(self, cond: Any, timeout: float = TIMEOUT) -> defer.Deferred[None]:
        """Fires once ``cond(self)`` holds."""
        d: defer.Deferred[None] = defer.Deferred()
        if cond(self):
            d.callback(None)
            return d
        self._waiters.append((cond, d))
        d.addTimeout(timeout, reactor)
        return d


async def connect(
    url: str,
    realm: str = "realm1",
    serializer: str = "json",
    trust_root: Any = None,
    *,
    authid: str | None = None,
    ticket: str | None = None,
    secret: str | None = None,
) -> ApplicationSession:
    """Open a WAMP session to ``url``, joined to ``realm``; ``wss://`` is verified against ``trust_root``.

    With ``authid``, authenticate by ``ticket`` or WAMP-CRA ``secret``.
    """
    joined: defer.Deferred[ApplicationSession] = defer.Deferred()

    class Session(ApplicationSession):  # type: ignore[misc]
        def onConnect(self) -> None:
            if authid is None:
                super().onConnect()
                return
            methods = (["ticket"] if ticket is not None else []) + (["wampcra"] if secret is not None else [])
            self.join(self.config.realm, authmethods=methods, authid=authid)

        def onChallenge(self, challenge: Any) -> str:
            if challenge.method == "ticket" and ticket is not None:
                return ticket
            if challenge.method == "wampcra" and secret is not None:
                return str(auth.compute_wcs(secret, challenge.extra["challenge"]).decode())
            raise ValueError(f"unexpected challenge {challenge.method}")

        def onJoin(self, details: Any) -> None:
            self.details = details
            if not joined.called:
                joined.callback(self)

        def onLeave(self, details: Any) -> None:
            if not joined.called:
                joined.errback(ConnectionError(f"left before joining: {details.reason} {details.message}"))
            super().onLeave(details)

    ser = {"json": JsonSerializer(), "msgpack": MsgPackSerializer(), "cbor": CBORSerializer()}[serializer]
    factory = WampWebSocketClientFactory(lambda: Session(ComponentConfig(realm)), url=url, serializers=[ser])
    parts = urlsplit(url)
    endpoint: Any = TCP4ClientEndpoint(reactor, parts.hostname, parts.port, timeout=5)
    if parts.scheme == "wss":
        endpoint = wrapClientTLS(optionsForClientTLS(parts.hostname, trustRoot=trust_root), endpoint)
    await endpoint.connect(factory)
    joined.addTimeout(TIMEOUT, reactor)
    return await joined


async def subscribe(session: ApplicationSession, topic: str) -> tuple[Recorder, Any]:
    """Subscribe a new recorder to ``topic``."""
    rec = Recorder()
    sub = await session.subscribe(rec, topic)
    return rec, sub


async def publish_acked(session: ApplicationSession, topic: str, *args: Any, **kwargs: Any) -> None:
    """Publish with acknowledge=True and wait for PUBLISHED."""
    await session.publish(topic, *args, options=PublishOptions(acknowledge=True), **kwargs)


async def leave(*sessions: ApplicationSession) -> None:
    """Leave and disconnect sessions, ignoring ones already gone."""
    for s in sessions:
        if s.is_attached():
            try:
                await s.leave()
            except Exception:  # already closing: nothing to clean up
                pass
