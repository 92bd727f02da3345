"""NSD payloads are data: foreign messages wrapped, NSD fields range-checked, bad records skipped (in memory).

Each test runs an :class:`NSDService` on a real SQLite store in ``tmp_path``
and a hub, with an injected clock; other nodes are played by envelopes handed
to ``hub.deliver_remote``, exactly what the federation does with a PSC301.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.jsonbounds import JSONBounds
from pubsubclub.frontends.nsd import codec
from pubsubclub.frontends.nsd.protocol import CONTROL_TOPIC, LOG_TOPIC, NSDService, NSDSettings, render_foreign
from pubsubclub.frontends.nsd.store import NSDStore

#: The injected clock's time, near the real time (NSD range-checks stamps against it);
#: the hub stamps local publishes with the same injected clock.
NOW = float(int(time.time()))
NOW_US = int(NOW * 1_000_000)
#: The poisoned ``when`` of the issue.
POISON = 9223372036854775807


class Clock:
    """A settable wall clock."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Node:
    """One node's hub, store and NSD service; ``request`` speaks NSD lines."""

    def __init__(self, path: Path, name: str = "n1", **settings: Any) -> None:
        self.clock = Clock()
        self.hub = Hub(name, clock=self.clock)
        self.store = NSDStore(str(path / f"{name}.sqlite3"))
        self.nsd = NSDService(self.hub, self.store, self.clock, NSDSettings(**settings))
        self.nsd.start()

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        """One request line in, one response object out."""
        request = codec.decode_request(orjson.dumps(obj), self.nsd.settings.limits)
        return dict(orjson.loads(self.nsd.handle(request)))

    def open(self, identity: str) -> dict[str, Any]:
        """OpenRequest."""
        return self.request({"_class": "OpenRequest", "identity": identity})

    def publish(self, identity: str, **message: Any) -> dict[str, Any]:
        """PublishRequest with a Message of ``message``'s fields."""
        body = {"_class": "Message", "body": "hi", **message}
        return self.request({"_class": "PublishRequest", "identity": identity, "message": body})

    def get(self, identity: str, after: int = 0) -> list[dict[str, Any]]:
        """GetRequest's messages."""
        answer = self.request({"_class": "GetRequest", "identity": identity, "after": after})
        assert answer["_class"] == "MessageListResponse", answer
        return list(answer["messages"])

    def remote(self, topic: str, payload: Any, **meta: Any) -> None:
        """An envelope arriving from node ``n9`` over PSC."""
        self.hub.deliver_remote(Envelope(topic, payload, origin=meta.pop("origin", "n9"), **meta))


SUCCESS = {"_class": "SuccessResponse"}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    """A node with channel Alice open."""
    n = Node(tmp_path)
    assert n.open("Alice") == SUCCESS
    return n


def forged(when: int = POISON, sender: str = "Alice") -> dict[str, Any]:
    """A complete NSD Message, as a WAMP or TEP client can publish it."""
    return {"_class": "Message", "from": sender, "when": when, "body": "x"}


# -- foreign messages ----------------------------------------------------------------------


def test_the_issues_publish_is_wrapped_and_nsd_keeps_working(node: Node) -> None:
    """The issue's payload on a channel's topic is stored as a foreign message; the clock is untouched."""
    node.hub.publish(node.hub.envelope("Alice", forged()))
    [stored] = node.get("Alice")
    assert stored["from"] == "$foreign@n1"
    assert NOW_US <= stored["when"] < NOW_US + 10**8
    assert orjson.loads(stored["body"]) == forged() and stored["payload"] == forged()
    assert node.nsd.clock.last < NOW_US + 10**8
    assert node.publish("Alice", body="after") == SUCCESS
    assert [m["body"] for m in node.get("Alice")][-1] == "after"


@pytest.mark.parametrize(
    ("meta", "when_from"),
    [
        ({"published_at": NOW - 5.0, "message_id": "n9-b-1"}, "origin"),
        ({"published_at": 1e300, "message_id": "n9-b-2"}, "clock"),
        ({"published_at": float("inf"), "message_id": "n9-b-3"}, "clock"),
        ({"published_at": 1e308, "message_id": "n9-b-5"}, "clock"),  # x 1e6 is inf: int() would overflow
        ({"published_at": float("nan"), "message_id": "n9-b-6"}, "clock"),
        ({"published_at": -1.0, "message_id": "n9-b-4"}, "clock"),
        ({}, "clock"),
    ],
)
def test_foreign_when_is_the_origins_publish_time_only_in_range(
    node: Node, meta: dict[str, Any], when_from: str
) -> None:
    """A foreign message's ``when`` is the origin node's publish time when sane, else this node's clock."""
    node.remote("Alice", forged(sender="Bob"), **meta)
    [stored] = node.get("Alice")
    assert stored["from"] == "$foreign@n9"
    if when_from == "origin":
        assert stored["when"] == int((NOW - 5.0) * 1_000_000)
    else:
        assert NOW_US <= stored["when"] < NOW_US + 10**8


@pytest.mark.parametrize(
    ("payload", "body"),
    [("plain text", "plain text"), ({"via": "tep"}, '{"via":"tep"}'), ([1, 2], "[1,2]"), (None, "null")],
)
def test_foreign_payload_is_only_ever_the_body(node: Node, payload: Any, body: str) -> None:
    """Whatever the payload, NSD writes ``from`` and ``when``; the payload becomes ``body`` (and ``payload``)."""
    node.remote("Alice", payload, message_id="n9-b-1", published_at=NOW)
    [stored] = node.get("Alice")
    assert set(stored) >= {"_class", "from", "when", "body"}
    assert (stored["_class"], stored["from"], stored["when"]) == ("Message", "$foreign@n9", NOW_US)
    assert stored["body"] == body
    assert stored.get("payload", payload) == payload


def deep(levels: int) -> Any:
    """``levels`` nested arrays."""
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "payload",
    [{1: "integer key"}, deep(70), {"n": 2**63}, {"f": float("nan")}, "x" * 70_000],
    ids=["non-string-key", "deep", "bigint", "nan", "too-big"],
)
def test_foreign_payloads_nsd_cannot_store_are_skipped_and_counted(node: Node, payload: Any) -> None:
    """Payloads beyond the bounds, not JSON or over the NSD size limit are skipped and counted, never raised."""
    node.hub.publish(node.hub.envelope("Alice", payload))
    assert node.get("Alice") == []
    assert node.nsd.stats["rejected"] == 1
    assert node.hub.metrics.errors == {("nsd", "foreign_rejected"): 1}
    assert node.hub.stats["sink_errors"] == 0
    assert node.publish("Alice") == SUCCESS


def test_nsd_client_cannot_set_from_or_when(node: Node) -> None:
    """An NSD client's ``from`` and ``when`` are replaced by its identity and NSD's clock; extra fields stay."""
    assert node.publish("Alice", **{"from": "Bob", "when": POISON, "pic": "abc"}) == SUCCESS
    [stored] = node.get("Alice")
    assert stored["from"] == "Alice" and NOW_US <= stored["when"] < NOW_US + 10**8 and stored["pic"] == "abc"


def test_genuine_remote_message_is_recognised_by_its_id_not_its_shape(node: Node) -> None:
    """The log copy is stored as it is; its channel-topic copy (same id) is not stored again as foreign."""
    genuine = {"_class": "Message", "from": "Alice", "when": NOW_US - 7, "body": "real"}
    node.remote(LOG_TOPIC, {"channel": "Alice", "id": "n9-b-1", "message": genuine})
    node.remote("Alice", genuine, message_id="n9-b-1", published_at=NOW)
    node.remote("Alice", genuine, message_id="n9-b-2", published_at=NOW)  # same shape, not logged: foreign
    first, second = node.get("Alice")
    assert first == genuine
    assert second["from"] == "$foreign@n9" and second["payload"] == genuine


# -- records from other nodes ----------------------------------------------------------------


def message(when: int, body: str = "m") -> dict[str, Any]:
    """A well-formed stored message."""
    return {"_class": "Message", "from": "Alice", "when": when, "body": body}


@pytest.mark.parametrize(
    "record",
    [
        {"channel": "Alice", "id": "n9-b-1", "message": message(POISON)},
        {"channel": "Alice", "id": "n9-b-1", "message": message(NOW_US + 3601 * 10**6)},
        {"channel": "Alice", "id": "n9-b-1", "message": message(0)},
        {"channel": "Alice", "id": "n9-b-1", "message": {**message(NOW_US), "when": NOW_US + 0.5}},
        {"channel": "$nsd.x", "id": "n9-b-1", "message": message(NOW_US)},
        {"channel": "Alice", "id": "", "message": message(NOW_US)},
        {"channel": "Alice", "id": "n9-b-1", "message": {**message(NOW_US), "from": 7}},
        {"channel": "Alice", "id": "n9-b-1", "message": {**message(NOW_US), "_class": "Other"}},
        {"channel": "Alice", "id": "n9-b-1", "message": {**message(NOW_US), "x": orjson.loads(b"[" * 20 + b"]" * 20)}},
        {"channel": "Alice", "id": "n9-b-1"},
        ["not", "an", "object"],
    ],
)
def test_bad_log_records_are_skipped_and_counted(tmp_path: Path, record: Any) -> None:
    """A bad ``$nsd.log`` record is skipped and counted; the clock does not move; NSD keeps answering."""
    node = Node(tmp_path, limits=codec.NSDLimits(json=JSONBounds(max_depth=16)))
    assert node.open("Alice") == SUCCESS
    before = node.nsd.clock.last
    node.remote(LOG_TOPIC, record)
    assert node.get("Alice") == []
    assert node.nsd.stats["rejected"] == 1 and node.hub.metrics.errors == {("nsd", "log_rejected"): 1}
    assert node.nsd.clock.last == before
    assert node.publish("Alice") == SUCCESS and len(node.get("Alice")) == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"op": "sub", "identity": "Bob", "channel": "Alice", "active": True, "stamp": POISON},
        {"op": "sub", "identity": "Bob", "channel": "Alice", "active": True, "stamp": "soon"},
        {"op": "sub", "identity": "$x", "channel": "Alice", "active": True, "stamp": NOW_US},
        {"op": "sub", "identity": "Bob", "channel": "Alice", "active": "yes", "stamp": NOW_US},
        {"op": "channel", "channel": ""},
        {"op": "channel", "channel": ["Alice"]},
        {"op": "teleport"},
        "not an object",
    ],
)
def test_bad_control_records_are_skipped_and_counted(node: Node, payload: Any) -> None:
    """A bad ``$nsd.control`` record is skipped and counted, never raised into the link it came on."""
    before = node.nsd.clock.last
    node.remote(CONTROL_TOPIC, payload)
    assert node.nsd.stats["rejected"] == 1
    assert node.hub.stats["sink_errors"] == 0
    assert node.nsd.clock.last == before
    assert node.store.subscribed("Bob") == [] and node.store.channels() == ["Alice"]


def test_state_transfer_applies_good_records_and_skips_bad_ones(node: Node) -> None:
    """A transfer mixing good and bad records applies the good ones; each bad one is counted."""
    node.remote(
        CONTROL_TOPIC,
        {
            "op": "state",
            "to": "n1",
            "channels": ["Bob", "$evil", 42],
            "subscriptions": [["Carol", "Bob", True, NOW_US], ["Carol", "Alice", True, POISON], ["short"]],
            "messages": [
                ["Bob", NOW_US - 2, "n9-b-1", {**message(NOW_US - 2), "from": "Bob"}],
                ["Bob", POISON, "n9-b-2", {**message(POISON), "from": "Bob"}],
                ["Bob", NOW_US - 1, "n9-b-3", message(NOW_US - 5)],
                "junk",
            ],
        },
    )
    assert node.store.channels() == ["Alice", "Bob"]
    assert node.store.subscribed("Carol") == ["Bob"]
    assert [m["body"] for m in node.get("Carol")] == ["m"]
    assert node.nsd.stats["rejected"] == 7
    assert node.hub.metrics.errors == {("nsd", "transfer_rejected"): 7}
    assert node.nsd.clock.last < NOW_US + 10**8


def test_state_transfer_of_wrong_shape_is_one_rejection(node: Node) -> None:
    """A transfer whose parts are not arrays is skipped whole and counted once."""
    node.remote(CONTROL_TOPIC, {"op": "state", "to": "n1", "channels": "Bob", "messages": 5})
    assert node.nsd.stats["rejected"] == 1 and node.store.channels() == ["Alice"]


# -- the store on disk -----------------------------------------------------------------------


def poison_store(path: Path) -> None:
    """Rows an older version could write: the issue's ``when``, a stamp past it, names it never validated."""
    store = NSDStore(str(path))
    store.add_channel("Alice", NOW_US - 100)
    store.add_channel("$bad", NOW_US - 100)
    store.add_message("Alice", NOW_US - 50, "n0-b-1", orjson.dumps(message(NOW_US - 50, "kept")))
    store.add_message("Alice", POISON, "n0-b-2", orjson.dumps(message(POISON)))
    store.add_message("Alice", NOW_US - 40, "n0-b-3", b"not json")
    store.set_subscription("Alice", "Alice", True, NOW_US - 100)
    store.set_subscription("Bob", "Alice", True, POISON)
    store.close()


def test_poisoned_store_is_quarantined_at_start(tmp_path: Path) -> None:
    """Bad rows written by the old code are moved aside at start (counted); NSD then answers normally."""
    poison_store(tmp_path / "n1.sqlite3")
    node = Node(tmp_path)
    assert node.nsd.stats["repaired"] == 4
    assert node.hub.metrics.errors == {("nsd", "store_row_quarantined"): 4}
    assert sorted((table, reason) for table, reason, _ in node.store.quarantined()) == [
        ("channels", "channel must not start with '$' (reserved for the cluster)"),
        ("messages", "not a JSON object"),
        ("messages", "when out of range"),
        ("subscriptions", "stamp out of range"),
    ]
    assert node.nsd.clock.last == NOW_US - 50
    assert [m["body"] for m in node.get("Alice")] == ["kept"]
    assert node.publish("Alice", body="new") == SUCCESS
    assert [m["body"] for m in node.get("Alice")] == ["kept", "new"]
    assert node.store.stats()["quarantined"] == 4
    node.nsd.stop()
    again = Node(tmp_path)  # nothing left to repair
    assert again.nsd.stats["repaired"] == 0


def test_transfer_sender_skips_bad_rows_and_bounds_chunk_bytes(tmp_path: Path) -> None:
    """A state transfer sends only valid rows, in chunks closed at the byte budget."""
    node = Node(tmp_path, transfer_chunk_bytes=1000)
    assert node.open("Alice") == SUCCESS
    for i in range(10):
        assert node.publish("Alice", body="y" * 200 + str(i)) == SUCCESS
    with sqlite3.connect(node.store.path) as db:  # a row an old version could have written
        db.execute(
            'INSERT INTO messages (channel, "when", message_id, message, stored_at) VALUES (?, ?, ?, ?, ?)',
            ("Alice", NOW_US + 1000, "n0-b-9", orjson.dumps({**message(NOW_US + 1000), "n": 2**63}), NOW),
        )
    sent: list[Any] = []

    class Peer:
        def deliver(self, envelope: Envelope) -> None:
            sent.append(envelope.payload)

    node.hub.subscribe(CONTROL_TOPIC, Peer())
    node.hub.remote_subscribed(CONTROL_TOPIC, "n2")
    chunks = [p for p in sent if p.get("op") == "state"]
    assert [len(c["messages"]) for c in chunks] == [4, 4, 2]
    assert all(len(orjson.dumps(c["messages"])) < 2000 for c in chunks)
    assert "channels" in chunks[0] and "channels" not in chunks[1]
    assert node.nsd.stats["rejected"] == 1 and node.hub.metrics.errors == {("nsd", "stored_rejected"): 1}


def test_render_foreign_marks_the_sender_and_never_takes_fields_from_the_payload() -> None:
    """``from`` and ``when`` are NSD's own; a node name longer than a name is cut."""
    message = render_foreign(forged(), "n" * 300, 42, codec.NSDLimits())
    assert message["from"] == "$foreign@" + "n" * 128 and message["when"] == 42
    assert render_foreign("hi", None, 7, codec.NSDLimits())["from"] == "$foreign"
