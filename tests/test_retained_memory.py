"""Retained events in memory: the store's merge rule and caps, the PSC 0.8 codec, and 0.8 links between Federations.

Each Federation gets a :class:`RetainedStore` attached as the WAMP router's
would be; events are retained with :meth:`RetainedStore.retain` as a local
publish does. Time moves only when a test says so.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsubclub.core.patterns import Pattern
from pubsubclub.core.retained import RetainedEvent, RetainedStore, payload_bytes
from pubsubclub.federation import Federation, psc, psc_retain
from pubsubclub.federation.replay import ReplaySettings
from pubsubclub.testing import MemoryNetwork, RecordingSink, no_logged_errors, psc_url

REPLAY = ReplaySettings(max_bytes=1024 * 1024, window=60.0)
_ids = itertools.count(1)


def event(topic: str, payload: Any, at: float, origin: str = "a", **kw: Any) -> RetainedEvent:
    """A retained event as a publish on ``origin`` at time ``at`` makes it."""
    return RetainedEvent(
        topic, payload, kw.get("wrapped", False), kw.get("options"), at, origin, f"{origin}-{next(_ids)}",
        payload_bytes(payload),
    )  # fmt: skip


# -- the store -------------------------------------------------------------------------


def test_last_writer_wins_whatever_the_order() -> None:
    """Every arrival order of the same events leaves the same winner: the greatest (time, origin, id)."""
    events = [event("t", "a1", 5.0, "a"), event("t", "b1", 5.0, "b"), event("t", "c0", 4.0, "c")]
    winners = set()
    for order in itertools.permutations(events):
        store = RetainedStore()
        for e in order:
            store.merge(e)
        held = store.get("t")
        assert held is not None
        winners.add(held.payload)
        assert store.bytes == held.size
    assert winners == {"b1"}


def test_retain_tells_listeners_only_of_winners() -> None:
    """A local retain that loses to a newer event (a clock behind) is not sent on; a newer one is."""
    store = RetainedStore()
    told: list[str] = []
    store.add_listener(lambda e: told.append(e.payload))
    assert store.merge(event("t", "new", 10.0, "b")) is True
    assert store.retain(event("t", "old", 9.0, "a")) is None
    assert store.retain(event("t", "newer", 11.0, "a")) is None
    assert told == ["newer"] and store.get("t").payload == "newer"  # type: ignore[union-attr]


def test_topic_and_byte_caps_refuse_a_retain_and_drop_a_merge() -> None:
    """Past max_topics or max_bytes a retain says why (setting, limit) and a merge returns None; replacing fits."""
    store = RetainedStore(max_topics=2, max_bytes=100)
    assert store.retain(event("t1", "x", 1.0)) is None
    assert store.retain(event("t2", "y", 1.0)) is None
    text, setting, limit = store.retain(event("t3", "z", 2.0)) or ("", "", 0)
    assert (setting, limit) == ("wamp.max-retained-topics", 2) and "limit is 2" in text
    assert store.merge(event("t3", "z", 2.0, "b")) is None
    assert store.retain(event("t1", "replaced", 3.0)) is None  # an existing topic needs no new slot
    refused = store.retain(event("t2", "y" * 200, 3.0))
    assert refused is not None and refused[1:] == ("wamp.max-retained-bytes", 100)
    assert sorted(e.topic for e in store.events()) == ["t1", "t2"]


def test_matching_takes_prefix_and_wildcard_patterns() -> None:
    """A pattern subscription's retained events: every held topic the pattern matches, in topic order."""
    store = RetainedStore()
    for topic in ("app.b.x", "app.a.x", "app.a.y", "other.x"):
        store.merge(event(topic, topic, 1.0))
    assert [e.topic for e in store.matching(Pattern("prefix", "app."))] == ["app.a.x", "app.a.y", "app.b.x"]
    assert [e.topic for e in store.matching(Pattern("wildcard", "app..x"))] == ["app.a.x", "app.b.x"]


# -- the codec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload", ["hi", {"args": [1, b"\x00\xff"], "kwargs": {"k": "\x00text"}}, None, [b""]],
)
def test_psc501_round_trip(payload: Any) -> None:
    """PSC501 carries payload (binary values as in 0.6), wrapper flag, routing object and the stamp exactly."""
    options = {"x": [7], "d": {"publisher": 9, "publisher_authid": None, "publisher_authrole": "r"}}
    original = event("com.t", payload, 1763776800.125, "node-a", wrapped=isinstance(payload, dict), options=options)
    data = psc_retain.Retained(original).encode()
    assert data.startswith(b"[501,")
    assert psc.decode(data) == psc_retain.Retained(original)


@pytest.mark.parametrize(
    ("frame", "words", "payload_only"),
    [
        (b'[501,"t","x"]', "takes 3 parameters", False),
        (b'[501,"","x",{"o":"a","t":1,"i":"a-1"}]', "topic must not be empty", False),
        (b'[501,"t","x",[]]', "metadata must be an object", False),
        (b'[501,"t","x",{"t":1,"i":"a-1"}]', "'o' (origin)", False),
        (b'[501,"t","x",{"o":"a","t":1}]', "'i' (message id)", False),
        (b'[501,"t","x",{"o":"a","t":"1","i":"a-1"}]', "'t' (publish time)", False),
        (b'[501,"t","x",{"o":"a","t":1,"i":"a-1","w":2}]', "'w' must be 1", False),
        (b'[501,"t","x",{"o":"a","t":1,"i":"a-1","q":1}]', "unknown key 'q'", False),
        (b'[501,"t","x",{"o":"a","t":1e11,"i":"a-1"}]', "outside 0..", True),
        (b'[501,"t","\\u0000%%",{"o":"a","t":1,"i":"a-1","b":1}]', "base64", True),
        (b'[501,"t","x",{"o":"a","t":1,"i":"a-1","p":{"zz":[1]}}]', "unknown key", True),
        (b'[501,"t",' + b"[" * 200 + b"]" * 200 + b',{"o":"a","t":1,"i":"a-1"}]', "deep", True),
    ],
)
def test_bad_psc501_raises_the_one_decode_error(frame: bytes, words: str, payload_only: bool) -> None:
    """Every bad PSC501 raises PSCDecodeError naming the problem; the payload's own faults as PSCPayloadError."""
    with pytest.raises(psc.PSCDecodeError, match=re.escape(words)) as raised:
        psc.decode(frame)
    assert isinstance(raised.value, psc.PSCPayloadError) is payload_only


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from("otiwbpxq"), inner, max_size=6),
    max_leaves=12,
)


_meta_values = _json | st.text(min_size=1, max_size=6) | st.floats(0, 1e11) | st.just(1)


@settings(max_examples=30)
@given(
    st.one_of(
        st.lists(_json, max_size=4),
        st.tuples(st.text(max_size=4) | _json, _json, st.dictionaries(st.sampled_from("otiwbpq"), _meta_values)),
    )
)
def test_any_psc501_decodes_or_raises_the_one_error(params: Any) -> None:
    """Whatever follows the type 501, decoding gives a Retained or raises PSCDecodeError, nothing else."""
    try:
        data = orjson.dumps([501, *params])
    except TypeError:  # integers orjson cannot write, NaN: not bytes a peer can send
        return
    try:
        decoded = psc.decode(data)
    except psc.PSCDecodeError:
        return
    assert isinstance(decoded, psc_retain.Retained)
    assert psc.decode(decoded.encode()) == decoded


def test_psc501_topic_and_ids_are_bounded() -> None:
    """A topic over max-topic-length and an origin over 256 characters are refused."""
    limits = psc.Limits(max_topic_length=10)
    with pytest.raises(psc.PSCDecodeError, match="over the limit of 10"):
        psc.decode(orjson.dumps([501, "t" * 11, 1, {"o": "a", "t": 1, "i": "a-1"}]), limits)
    with pytest.raises(psc.PSCDecodeError, match="1 to 256 characters"):
        psc.decode(orjson.dumps([501, "t", 1, {"o": "a" * 257, "t": 1, "i": "a-1"}]))


# -- 0.8 links ----------------------------------------------------------------------------


@pytest.fixture
def net() -> Iterator[MemoryNetwork]:
    """An empty in-memory network; the test fails if anything logged an error."""
    with no_logged_errors():
        yield MemoryNetwork()


def node(net: MemoryNetwork, name: str, port: int, max_topics: int = 10_000) -> RetainedStore:
    """A 0.8 node with a retained table attached (as the WAMP front-end attaches its router's)."""
    federation = net.node(name, port, replay=REPLAY)
    store = RetainedStore(max_topics=max_topics)
    federation.retained.attach(store)
    store.federation = federation  # type: ignore[attr-defined]
    return store


def fed(store: RetainedStore) -> Federation:
    """The Federation ``store`` is attached to."""
    return store.federation  # type: ignore[attr-defined, no-any-return]


def dial(net: MemoryNetwork, frm: RetainedStore, *ports: int) -> None:
    """``frm`` dials the nodes on ``ports`` (it is their consumer)."""
    for port in ports:
        fed(frm).add_server(psc_url(port))
    net.answer()


def mesh(net: MemoryNetwork, stores: list[RetainedStore], ports: list[int]) -> None:
    """Every node dials every other."""
    for store, own in zip(stores, ports, strict=True):
        for port in ports:
            if port != own:
                fed(store).add_server(psc_url(port))
    net.answer()


def held(store: RetainedStore, topic: str) -> Any:
    """The payload of ``topic``'s retained event on ``store``, or None."""
    e = store.get(topic)
    return None if e is None else e.payload


def test_retained_reaches_a_node_without_interest_and_a_node_linked_later(net: MemoryNetwork) -> None:
    """A retain on A goes to B (no subscriber there) at once, and to C, linked later, in A's table."""
    a, b, c = node(net, "a", 9001), node(net, "b", 9002), node(net, "c", 9003)
    mesh(net, [a, b], [9001, 9002])
    assert {r["version"] for r in fed(a).links()} == {"0.8"}
    assert a.retain(event("com.t", {"v": 1}, net.reactor.seconds(), "a")) is None
    net.flush()
    assert held(b, "com.t") == {"v": 1}
    assert b.merge(event("com.other", "from-b", 1.0, "b")) is True  # a replica only B holds
    dial(net, c, 9001, 9002)
    assert held(c, "com.t") == {"v": 1} and held(c, "com.other") == "from-b"
    assert held(a, "com.other") is None  # a merged event is never forwarded again (one hop)
    net.stop()


def test_two_retainers_with_crossed_clocks_agree_on_one_winner(net: MemoryNetwork) -> None:
    """A and B retain one topic before hearing of each other: after the link both hold the later stamp."""
    a, b, c = node(net, "a", 9001), node(net, "b", 9002), node(net, "c", 9003)
    a.retain(event("com.race", "from-a", 100.0, "a"))
    b.retain(event("com.race", "from-b", 100.0, "b"))  # same time: the node id decides
    c.retain(event("com.race", "from-c", 99.0, "c"))
    mesh(net, [a, b, c], [9001, 9002, 9003])
    assert {held(s, "com.race") for s in (a, b, c)} == {"from-b"}
    net.stop()


def test_a_0_7_peer_gets_no_psc501_and_pub_sub_still_works(net: MemoryNetwork) -> None:
    """A node speaking up to 0.7 links at 0.7: no PSC501 reaches it, and its subscriber still gets live events."""
    a = node(net, "a", 9001)
    old: Federation = net.node("old", 9002, replay=REPLAY)
    old.versions = tuple(v for v in old.versions if v < psc.V0_8)
    sink = RecordingSink()
    old.hub.subscribe("com.t", sink)
    a.retain(event("com.early", "x", 1.0))
    mesh(net, [a], [9001])
    old.add_server(psc_url(9001))
    net.answer()
    assert {r["version"] for r in fed(a).links()} == {"0.7"}
    a.retain(event("com.t", "y", 2.0))
    fed(a).hub.publish(fed(a).hub.envelope("com.t", "live"))
    net.flush()
    assert [e.payload for e in sink.got] == ["live"]
    assert all(b"[501," not in payload for link in net.links for _, payload in link.server_wire.frames())
    net.stop()


def test_a_psc501_from_a_consumer_closes_the_link(net: MemoryNetwork) -> None:
    """PSC501 goes producer to consumer only: sent the other way, the link closes with 4400."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    dial(net, a, 9002)
    [link] = net.links
    link.client.sendMessage(b'[501,"t","x",{"o":"a","t":1,"i":"a-1"}]')
    net.flush()
    closed = link.server_wire.close()
    assert closed is not None and closed[0] == 4400 and "unexpected Retained" in closed[1]
    assert held(b, "t") is None
    net.stop()


def test_a_psc501_with_a_bad_payload_is_dropped_and_the_link_stays(net: MemoryNetwork) -> None:
    """A PSC501 whose carrier is not base64 is dropped alone (counted like a PSC301 over the bounds)."""
    node(net, "a", 9001)
    b = node(net, "b", 9002)
    dial(net, b, 9001)
    [link] = net.links
    link.server.sendMessage(b'[501,"t","\\u0000%%",{"o":"a","t":1,"i":"a-1","b":1}]')
    link.server.sendMessage(b'[501,"u","fine",{"o":"a","t":1,"i":"a-2"}]')
    net.flush()
    assert held(b, "t") is None and held(b, "u") == "fine"
    assert fed(b).stats["dropped_bounds"] == 1 and fed(b).open_links() == 1
    net.stop()


def test_a_peer_past_the_cap_drops_and_counts(net: MemoryNetwork) -> None:
    """A node whose table is full drops a peer's event on a new topic, counts it, and keeps the link."""
    a = node(net, "a", 9001)
    b = node(net, "b", 9002, max_topics=1)
    dial(net, b, 9001)
    a.retain(event("t1", 1, 1.0))
    a.retain(event("t2", 2, 1.0))
    net.flush()
    assert held(b, "t1") == 1 and held(b, "t2") is None
    assert fed(b).metrics.errors[("psc", "retained_cap")] == 1
    assert fed(b).open_links() == 1
    net.stop()


def test_a_large_table_is_sent_in_slices(net: MemoryNetwork) -> None:
    """A table bigger than one slice reaches a new node whole (sent over several reactor turns)."""
    a, b = node(net, "a", 9001), node(net, "b", 9002)
    for i in range(40):
        a.retain(event(f"t{i}", "x" * 20_000, 1.0))
    dial(net, b, 9001)
    for _ in range(10):
        net.advance(0.1)
    assert len(b) == 40
    net.stop()
