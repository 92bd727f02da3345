"""The hub: local sinks per topic, interest changes, local vs remote publishes."""

from __future__ import annotations

from typing import Any

import pytest

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.testing import RecordingSink


class Listener:
    """Records interest changes and local publishes, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def topic_added(self, topic: str) -> None:
        self.calls.append(("added", topic))

    def topic_removed(self, topic: str) -> None:
        self.calls.append(("removed", topic))

    def local_published(self, envelope: Envelope) -> None:
        self.calls.append(("published", envelope.topic))


def make() -> tuple[Hub, Listener]:
    """A hub with a recording listener."""
    hub = Hub("n1")
    listener = Listener()
    hub.add_interest_listener(listener)
    hub.add_publish_listener(listener)
    return hub, listener


def test_only_first_and_last_subscriber_change_interest() -> None:
    """topic_added fires for the first sink only, topic_removed for the last one only."""
    hub, listener = make()
    a, b = RecordingSink(), RecordingSink()
    hub.subscribe("t", a)
    hub.subscribe("t", b)
    hub.subscribe("t", a)  # idempotent
    hub.unsubscribe("t", a)
    hub.unsubscribe("t", a)  # idempotent
    assert listener.calls == [("added", "t")]
    hub.unsubscribe("t", b)
    assert listener.calls == [("added", "t"), ("removed", "t")]
    assert hub.topics() == []


def test_local_publish_delivers_then_tells_listeners_and_honours_exclude() -> None:
    """A local publish reaches every sink but the excluded one, then the publish listeners."""
    hub, listener = make()
    a, b = RecordingSink(), RecordingSink()
    hub.subscribe("t", a)
    hub.subscribe("t", b)
    env = hub.envelope("t", {"x": 1})
    assert hub.publish(env, exclude=a) == 1
    assert a.got == [] and b.got == [env]
    assert listener.calls[-1] == ("published", "t")
    assert (
        env.origin == "n1"
        and env.message_id.startswith("n1-")
        and env.message_id.endswith("-1")
        and env.published_at is not None
    )


def test_remote_delivery_is_local_only() -> None:
    """A message from another node is delivered locally and never handed to publish listeners."""
    hub, listener = make()
    a = RecordingSink()
    hub.subscribe("t", a)
    env = Envelope("t", 5, origin="n2")
    assert hub.deliver_remote(env) == 1
    assert a.got == [env]
    assert ("published", "t") not in listener.calls


def test_unsubscribe_all_removes_a_gone_client_everywhere() -> None:
    """unsubscribe_all drops a sink from every topic and reports topics that became empty."""
    hub, listener = make()
    a, b = RecordingSink(), RecordingSink()
    hub.subscribe("t1", a)
    hub.subscribe("t2", a)
    hub.subscribe("t2", b)
    hub.unsubscribe_all(a)
    assert ("removed", "t1") in listener.calls and ("removed", "t2") not in listener.calls
    assert hub.topics() == ["t2"] and hub.subscribers("t2") == 1


def test_sink_unsubscribing_during_delivery_is_safe() -> None:
    """A sink may unsubscribe itself while a message is being delivered."""
    hub, _ = make()

    class Leaver(RecordingSink):
        def deliver(self, envelope: Envelope) -> None:
            super().deliver(envelope)
            hub.unsubscribe("t", self)

    leaver, stayer = Leaver(), RecordingSink()
    hub.subscribe("t", leaver)
    hub.subscribe("t", stayer)
    assert hub.publish(hub.envelope("t", 1)) == 2
    assert hub.publish(hub.envelope("t", 2)) == 1
    assert [e.payload for e in stayer.got] == [1, 2]


def test_deliveries_are_counted_once_per_message_and_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three WAMP-like sinks and one that did not send: one count call, n=2 delivered, n*size bytes."""
    from pubsubclub.core.hub import Hub

    class Sent:
        counts_as = "wamp"

        def __init__(self, sent: bool) -> None:
            self.sent = sent

        def deliver(self, envelope: Envelope) -> bool:
            return self.sent

    hub = Hub("n1")
    for sink in (Sent(True), Sent(True), Sent(False)):
        hub.subscribe("t", sink)
    calls = []
    original = hub.metrics.count
    monkeypatch.setattr(hub.metrics, "count", lambda *a, **k: (calls.append(a), original(*a, **k)))
    hub.publish(hub.envelope("t", "abc"))
    assert calls == [("t", "wamp", "delivered", 2, 2 * len(b'"abc"'))]


def test_a_remote_batch_is_delivered_in_order_and_counted_as_one_by_one() -> None:
    """deliver_remote_batch hands each envelope to its sinks in order and leaves the counters deliver_remote would."""

    class Wamp(RecordingSink):
        counts_as = "wamp"

    def run(batched: bool) -> tuple[Hub, list[Any]]:
        hub = Hub("n1")
        sinks = [Wamp(), Wamp(), RecordingSink()]
        for topic, sink in (("t", sinks[0]), ("t", sinks[1]), ("t", sinks[2]), ("u", sinks[0])):
            hub.subscribe(topic, sink)
        envelopes = [Envelope(topic, i, "n2", size=10 + i) for i, topic in enumerate("tutvt")]
        if batched:
            assert hub.deliver_remote_batch(iter(envelopes)) == 3 + 1 + 3 + 3
        else:
            assert sum(hub.deliver_remote(e) for e in envelopes) == 3 + 1 + 3 + 3
        return hub, [[(e.topic, e.payload) for e in s.got] for s in sinks]

    (one, got_one), (batch, got_batch) = run(False), run(True)
    on_t = [("t", 0), ("t", 2), ("t", 4)]
    assert got_batch == got_one == [[("t", 0), ("u", 1), ("t", 2), ("t", 4)], on_t, on_t]
    assert batch.stats == one.stats and batch.stats["received"] == 5 and batch.stats["delivered"] == 10
    assert sorted(batch.metrics.totals()) == sorted(one.metrics.totals()) == [
        (("t", "wamp", "delivered", None, None), 6, 2 * (10 + 12 + 14)),
        (("u", "wamp", "delivered", None, None), 1, 11),
    ]


def test_a_publish_reaches_pattern_holders_and_is_counted_whatever_the_exact_sinks() -> None:
    """Local delivery is looked up only when the topic has a sink or a pattern is held; counts stay exact."""
    from pubsubclub.core.patterns import Pattern

    hub, listener = make()
    holder, exact = RecordingSink(), RecordingSink()
    prefix = Pattern("prefix", "app.")
    assert hub.publish(hub.envelope("app.x", 0)) == 0
    hub.subscribe_pattern(prefix, holder)
    assert hub.publish(hub.envelope("app.x", 1)) == 1
    hub.subscribe("app.y", exact)
    assert hub.publish(hub.envelope("app.y", 2)) == 2
    hub.unsubscribe_pattern(prefix, holder)
    assert hub.publish(hub.envelope("app.x", 3)) == 0
    assert hub.publish(hub.envelope("app.y", 4)) == 1
    hub.unsubscribe("app.y", exact)
    assert hub.publish(hub.envelope("app.y", 5)) == 0
    assert [e.payload for e in holder.got] == [1, 2]
    assert [e.payload for e in exact.got] == [2, 4]
    assert [call for call in listener.calls if call[0] == "published"] == [
        ("published", t) for t in ("app.x", "app.x", "app.y", "app.x", "app.y", "app.y")
    ]
    assert hub.stats["published"] == 6 and hub.stats["delivered"] == 4
