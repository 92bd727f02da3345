"""PubSubClubMixin hooks on an in-memory hub: the new args/kwargs hooks, and the deprecated one-value hooks."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from twisted.internet.testing import MemoryReactorClock

from pubsubclub import mixin
from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.frontends.wamp.broker import event_arguments, wamp_envelope
from pubsubclub.mixin import PubSubClubMixin

URL = "https://example.com/x"


class Recorder:
    """A hub sink standing for the rest of the node (other clients, the federation's view)."""

    def __init__(self) -> None:
        self.got: list[Envelope] = []

    def deliver(self, envelope: Envelope) -> None:
        self.got.append(envelope)


class NewServer(PubSubClubMixin):
    """A server with the current hooks."""

    def __init__(self, hub: Hub) -> None:
        self.pubsubclub_setup(hub=hub, reactor=MemoryReactorClock())
        self.dispatched: list[tuple[str, list[Any], dict[str, Any]]] = []

    def pubsubclub_dispatch_event(self, topic: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.dispatched.append((topic, args, kwargs))


class OldServer(PubSubClubMixin):
    """A server written against the earlier hooks (one value per message)."""

    def __init__(self, hub: Hub) -> None:
        self.pubsubclub_setup(hub=hub, reactor=MemoryReactorClock())
        self.dispatched: list[tuple[str, Any]] = []

    def pubsubclub_dispatch(self, topic: str, message: Any) -> None:
        self.dispatched.append((topic, message))


def test_args_and_kwargs_cross_the_new_hooks_unchanged() -> None:
    """("hi", url) with k=1 leaves a server as ("hi", url) with k=1 and comes in the same way."""
    hub = Hub("n1")
    server, other = NewServer(hub), Recorder()
    hub.subscribe("com.example.t", other)
    server.pubsubclub_subscribed("com.example.t")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        server.pubsubclub_published_event("com.example.t", ["hi", URL], {"k": 1})
        assert [event_arguments(e) for e in other.got] == [(["hi", URL], {"k": 1})]
        assert server.dispatched == []  # never back to the publisher
        hub.deliver_remote(wamp_envelope(hub, "com.example.t", ["hi", URL], {"k": 1}))
        hub.deliver_remote(wamp_envelope(hub, "com.example.t", [{"one": "dict"}], None))
    assert server.dispatched == [("com.example.t", ["hi", URL], {"k": 1}), ("com.example.t", [{"one": "dict"}], {})]


def test_the_deprecated_hooks_still_work_and_warn() -> None:
    """pubsubclub_published / pubsubclub_dispatch: one value per message, several args as a dict; a warning."""
    mixin._warned.clear()  # warned once per process: start from scratch
    hub = Hub("n1")
    server, other = OldServer(hub), Recorder()
    hub.subscribe("com.example.t", other)
    server.pubsubclub_subscribed("com.example.t")
    with pytest.warns(DeprecationWarning, match="pubsubclub_published_event"):
        server.pubsubclub_published("com.example.t", {"v": 1})
    assert [event_arguments(e) for e in other.got] == [([{"v": 1}], None)]
    with pytest.warns(DeprecationWarning, match="pubsubclub_dispatch_event"):
        hub.deliver_remote(wamp_envelope(hub, "com.example.t", ["hi", URL], {"k": 1}))
    hub.deliver_remote(wamp_envelope(hub, "com.example.t", ["alone"], None))
    assert server.dispatched == [
        ("com.example.t", {"args": ["hi", URL], "kwargs": {"k": 1}}),
        ("com.example.t", "alone"),
    ]
