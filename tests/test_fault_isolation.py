"""Fault isolation: a raising sink or listener, or a bad message, costs that message only (in memory)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from twisted.logger import globalLogPublisher

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.metrics import PrometheusCollector
from pubsubclub.federation import Federation, psc
from pubsubclub.federation.session import LinkSession
from pubsubclub.testing import MemoryNetwork as Net
from pubsubclub.testing import RecordingSink as Sink
from pubsubclub.testing import psc_url as url


class Exploding:
    """A sink (and listener) that raises on every call, like a buggy front-end."""

    def __init__(self) -> None:
        self.calls = 0

    def deliver(self, envelope: Envelope) -> None:
        """Raise."""
        self.calls += 1
        raise RuntimeError("sink bug")

    def topic_added(self, topic: str) -> None:
        """Raise."""
        raise RuntimeError("listener bug")

    def topic_removed(self, topic: str) -> None:
        """Raise."""
        raise RuntimeError("listener bug")

    def local_published(self, envelope: Envelope) -> None:
        """Raise."""
        raise RuntimeError("listener bug")

    def remote_subscribed(self, topic: str, peer: str) -> None:
        """Raise."""
        raise RuntimeError("listener bug")


class Listener:
    """Records publishes and interest changes."""

    def __init__(self) -> None:
        self.published: list[str] = []
        self.added: list[str] = []

    def local_published(self, envelope: Envelope) -> None:
        """Record the topic."""
        self.published.append(envelope.topic)

    def topic_added(self, topic: str) -> None:
        """Record the topic."""
        self.added.append(topic)

    def topic_removed(self, topic: str) -> None:
        """Nothing to record."""


@pytest.fixture
def failures() -> Iterator[list[dict[str, Any]]]:
    """Every logged failure, for the test to check (expected ones are asserted, not hidden)."""
    seen: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_failure") is not None:
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def prometheus_text(hub: Hub) -> str:
    """The /metrics text of ``hub``'s counters."""
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(hub.metrics, dict, list))
    return generate_latest(registry).decode()


def test_raising_sink_is_logged_counted_and_skipped(failures: list[dict[str, Any]]) -> None:
    """A sink that raises does not stop delivery to the sinks after it, nor the federation; it is counted."""
    hub = Hub("n1")
    first, bad, last = Sink(), Exploding(), Sink()
    listener = Listener()
    hub.add_publish_listener(listener)
    for sink in (first, bad, last):
        hub.subscribe("t", sink)
    assert hub.publish(hub.envelope("t", "one")) == 2
    hub.deliver_remote(Envelope("t", "two", origin="n2"))
    assert [e.payload for e in first.got] == ["one", "two"]
    assert [e.payload for e in last.got] == ["one", "two"]
    assert listener.published == ["t"]
    assert bad.calls == 2
    assert hub.stats["sink_errors"] == 2 and hub.stats["delivered"] == 4
    assert hub.metrics.sink_errors == {"Exploding": 2}
    assert 'pubsubclub_sink_errors_total{sink="Exploding"} 2.0' in prometheus_text(hub)
    assert [f["log_failure"].getErrorMessage() for f in failures] == ["sink bug", "sink bug"]


def test_raising_listeners_do_not_unwind_into_the_front_end(failures: list[dict[str, Any]]) -> None:
    """Interest, publish and remote-interest listeners that raise are isolated; the others still hear."""
    hub = Hub("n1")
    bad, good = Exploding(), Listener()
    for h in (bad, good):
        hub.add_interest_listener(h)
        hub.add_publish_listener(h)
    hub.add_remote_interest_listener(bad)
    sink = Sink()
    hub.subscribe("t", sink)
    hub.publish(hub.envelope("t", 1))
    hub.remote_subscribed("t", "n2")
    hub.unsubscribe("t", sink)
    assert good.added == ["t"] and good.published == ["t"]
    assert [e.payload for e in sink.got] == [1]
    assert hub.metrics.sink_errors == {"Exploding": 4}
    assert len(failures) == 4


# -- PSC links: only the peer's protocol errors close them -------------------------------


class BuggyFederation(Federation):
    """A federation whose delivery raises for one topic, like a bug while handling a valid message."""

    def link_received_batch(self, session: LinkSession, messages: list[psc.Publish], sizes: list[int]) -> None:
        """Raise for topic ``bug``, deliver everything else (every PSC301 run of a frame of several comes here)."""
        if any(message.topic == "bug" for message in messages):
            raise RuntimeError("handler bug")
        super().link_received_batch(session, messages, sizes)

    def link_received_plain(self, session: LinkSession, topic: str, *fields: Any) -> None:
        """Raise for topic ``bug``, deliver everything else (a lone PSC301 as nodes write it comes here)."""
        if topic == "bug":
            raise RuntimeError("handler bug")
        super().link_received_plain(session, topic, *fields)


def linked_pair(net: Net, consumer: Federation | None = None) -> tuple[Federation, Federation, Any]:
    """Producer ``a`` listening on 9001, consumer ``b`` dialling it; both hubs know topic interest."""
    a = net.node("a", 9001)
    if consumer is None:
        b = net.node("b", 9002)
    else:
        b = consumer
        net.listeners[9002] = b.server_factory()
        net.nodes.append(b)
    b.add_server(url(9001))
    [link] = net.answer()
    return a, b, link


def test_link_survives_a_raising_sink(failures: list[dict[str, Any]]) -> None:
    """A local sink that raises on every remote message leaves the link up and the other sinks served."""
    net = Net()
    a, b, _ = linked_pair(net)
    bad, good = Exploding(), Sink()
    b.hub.subscribe("t", bad)
    b.hub.subscribe("t", good)
    net.flush()
    for i in range(3):
        a.hub.publish(a.hub.envelope("t", i))
    net.flush()
    assert [e.payload for e in good.got] == [0, 1, 2]
    assert a.open_links() == 1 and b.open_links() == 1
    assert b.hub.metrics.sink_errors == {"Exploding": 3}
    assert len(failures) == 3
    net.stop()


def test_link_survives_an_error_handling_a_valid_message(failures: list[dict[str, Any]]) -> None:
    """Anything but a LinkError raised while handling a message is logged and counted; the link stays."""
    net = Net()
    b = BuggyFederation(Hub("b"), reactor=net.reactor, advertise_url=url(9002))
    a, b, link = linked_pair(net, b)
    sink = Sink()
    b.hub.subscribe("bug", Sink())
    b.hub.subscribe("t", sink)
    net.flush()
    a.hub.publish(a.hub.envelope("bug", "boom"))
    a.hub.publish(a.hub.envelope("t", "after"))
    net.flush()
    assert [e.payload for e in sink.got] == ["after"]
    assert link.client_wire.close() is None and link.server_wire.close() is None
    assert b.stats["handler_errors"] == 1
    assert b.hub.metrics.errors == {("psc", "handler_error"): 1}
    assert [f["log_failure"].getErrorMessage() for f in failures] == ["handler bug"]
    net.stop()


@pytest.mark.parametrize(
    "message",
    [
        b'[301,"t",{"n":9223372036854775808}]',
        b'[301,"t",[18446744073709551616]]',
        b'[301,"t",' + b"[" * 200 + b"]" * 200 + b"]",
        b'[301,"t","x",{"o":"a","t":1.0,"extra":' + b"[" * 100 + b"]" * 100 + b"}]",
    ],
)
def test_out_of_bounds_psc301_is_dropped_and_the_link_stays(message: bytes) -> None:
    """A producer's PSC301 beyond the JSON bounds is dropped and counted; the next message arrives."""
    net = Net()
    a, b, link = linked_pair(net)
    sink = Sink()
    b.hub.subscribe("t", sink)
    net.flush()
    link.server.sendMessage(message, isBinary=False)
    a.hub.publish(a.hub.envelope("t", "good"))
    net.flush()
    assert [e.payload for e in sink.got] == ["good"]
    assert link.server_wire.close() is None and link.client_wire.close() is None
    assert b.stats["dropped_bounds"] == 1
    dropped = [(key, n) for key, (n, _) in b.hub.metrics._interval.items() if key[2] == "dropped"]
    assert dropped == [(("t", "psc", "dropped", "a", "bounds"), 1)]
    net.stop()


def test_deep_frame_closes_the_link_with_a_reason() -> None:
    """A frame nested 1,000 deep closes with 4400 and a short reason, not a RecursionError."""
    net = Net()
    a, b, link = linked_pair(net)
    link.server.sendMessage(b"[" * 1000 + b"]" * 1000, isBinary=False)
    net.flush()
    code, reason = link.client_wire.close() or (None, "")
    assert code == 4400
    assert reason == "bad PSC message: message type must be an integer, got array of 1 item(s)"
    net.stop()
