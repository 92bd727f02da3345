"""A user's own small Autobahn/Twisted WAMP server (single process, no cluster).

This stands for the server a developer already has: Autobahn's WAMP-over-
WebSocket transport with a hand-written router session that knows HELLO,
SUBSCRIBE, UNSUBSCRIBE and PUBLISH. Nothing here knows about PubSubClub;
``clustered_server.py`` federates it with the mixin.
"""

from __future__ import annotations

import itertools
from typing import Any

from autobahn.twisted.websocket import WampWebSocketServerFactory
from autobahn.wamp import message
from autobahn.wamp.role import RoleBrokerFeatures
from autobahn.wamp.serializer import JsonSerializer


class TinySession:
    """Router side of one client connection."""

    def __init__(self, server: TinyServer) -> None:
        self.server = server
        self.transport: Any = None
        self.subscriptions: dict[int, str] = {}
        # Read by Autobahn's transport when it logs.
        self._authid = None
        self._session_id = None

    def onOpen(self, transport: Any) -> None:
        self.transport = transport

    def onClose(self, wasClean: bool) -> None:
        for topic in self.subscriptions.values():
            self.server.remove_subscriber(topic, self)

    def onMessage(self, msg: Any) -> None:
        if isinstance(msg, message.Hello):
            self.transport.send(message.Welcome(next(self.server.ids), {"broker": RoleBrokerFeatures()}))
        elif isinstance(msg, message.Subscribe):
            sub_id = self.server.add_subscriber(msg.topic, self)
            self.subscriptions[sub_id] = msg.topic
            self.transport.send(message.Subscribed(msg.request, sub_id))
        elif isinstance(msg, message.Unsubscribe):
            topic = self.subscriptions.pop(msg.subscription)
            self.server.remove_subscriber(topic, self)
            self.transport.send(message.Unsubscribed(msg.request))
        elif isinstance(msg, message.Publish):
            self.server.dispatch(msg.topic, msg.args or [], msg.kwargs or {}, exclude=self)
            if msg.acknowledge:
                self.transport.send(message.Published(msg.request, next(self.server.ids)))
        elif isinstance(msg, message.Goodbye):
            self.transport.send(message.Goodbye())
            self.transport.close()

    def event(self, topic: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        sub_id = self.server.topic_ids[topic]
        self.transport.send(message.Event(sub_id, next(self.server.ids), args=args, kwargs=kwargs or None))


class TinyServer:
    """Topic -> sessions; ``dispatch`` delivers a publish to local subscribers."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.subscribers: dict[str, set[TinySession]] = {}
        self.topic_ids: dict[str, int] = {}

    def factory(self, url: str) -> WampWebSocketServerFactory:
        """The WebSocket factory serving this server's WAMP sessions."""
        return WampWebSocketServerFactory(lambda: TinySession(self), url=url, serializers=[JsonSerializer()])

    def add_subscriber(self, topic: str, session: TinySession) -> int:
        self.subscribers.setdefault(topic, set()).add(session)
        return self.topic_ids.setdefault(topic, next(self.ids))

    def remove_subscriber(self, topic: str, session: TinySession) -> None:
        sessions = self.subscribers.get(topic, set())
        sessions.discard(session)
        if not sessions:
            self.subscribers.pop(topic, None)

    def dispatch(self, topic: str, args: list[Any], kwargs: dict[str, Any], exclude: Any = None) -> None:
        for session in list(self.subscribers.get(topic, ())):
            if session is not exclude:
                session.event(topic, args, kwargs)
