"""Pattern matching over hub topics, the pattern index, and the hub's pattern sinks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pubsubclub.core.hub import Envelope, Hub
from pubsubclub.core.patterns import PREFIX, WILDCARD, Pattern, PatternIndex, pattern_problem


@pytest.mark.parametrize(
    ("match", "pattern", "topic", "expected"),
    [
        (PREFIX, "com.app.", "com.app.x", True),
        (PREFIX, "com.app.", "com.app.x.y.z", True),
        (PREFIX, "com.app", "com.apple", True),
        (PREFIX, "com.app.", "com.app", False),
        (PREFIX, "com.app.", "org.app.x", False),
        (WILDCARD, "app..temp", "app.kitchen.temp", True),
        (WILDCARD, "app..temp", "app.kitchen.humidity", False),
        (WILDCARD, "app..temp", "app.a.b.temp", False),
        (WILDCARD, "app..temp", "app.temp", False),
        (WILDCARD, "..", "a.b.c", True),
        (WILDCARD, "a.b", "a.b", True),
        (WILDCARD, ".temp", "$tep.temp", False),
        (WILDCARD, ".gap", "$cluster.gap", False),
        (WILDCARD, "app..temp", "app..temp", False),
        (WILDCARD, "$realm.b#app..temp", "$realm.b#app.x.temp", True),
        (WILDCARD, "$realm.b#.temp", "$realm.b#x.temp", True),
        (WILDCARD, "$realm.b#.temp", "$realm.c#x.temp", False),
        (WILDCARD, ".temp", "$realm.b#x.temp", False),
        (WILDCARD, "$realm.my.realm#a.", "$realm.my.realm#a.b", True),
        (WILDCARD, "$realm.my.realm#a.", "$realm.my.other#a.b", False),
        (PREFIX, "$realm.b#com.", "$realm.b#com.x", True),
        (PREFIX, "$realm.b#com.", "$realm.bb#com.x", False),
    ],
)
def test_pattern_matches_the_wamp_rule(match: str, pattern: str, topic: str, expected: bool) -> None:
    """Prefix is a string prefix; a wildcard's empty components match one component each, within one realm scope."""
    p = Pattern(match, pattern)
    assert p.matches(topic) is expected
    index: PatternIndex[str] = PatternIndex()
    index.add(p, "holder")
    assert index.match(topic) == ((p,) if expected else ())


@pytest.mark.parametrize(
    ("pattern", "head"),
    [
        (Pattern(PREFIX, "com.app"), "com.app"),
        (Pattern(WILDCARD, "com.app..x"), "com.app."),
        (Pattern(WILDCARD, ".x"), ""),
        (Pattern(WILDCARD, "$realm.b#.x"), "$realm.b#"),
        (Pattern(WILDCARD, "$realm.b#a.b"), "$realm.b#a.b"),
    ],
)
def test_head_is_the_literal_start_of_every_matching_topic(pattern: Pattern, head: str) -> None:
    """Permissions check a pattern by its literal head."""
    assert pattern.head == head


@pytest.mark.parametrize(
    ("match", "pattern", "problem"),
    [
        ("exact", "a", "must be 'prefix' or 'wildcard'"),
        (7, "a", "must be 'prefix' or 'wildcard'"),
        (PREFIX, 5, "must be a string"),
        (WILDCARD, "", "must not be empty"),
        (PREFIX, "x" * 513, "over the limit of 512"),
    ],
)
def test_pattern_problem_names_what_is_wrong(match: Any, pattern: Any, problem: str) -> None:
    """What a peer may send as a pattern: a known match, a non-empty bounded string."""
    found = pattern_problem(match, pattern, 512)
    assert found is not None and problem in found
    assert pattern_problem(PREFIX, "a.", 512) is None


def test_index_matches_many_patterns_and_forgets_removed_ones() -> None:
    """Thousands of patterns: each topic gets exactly its matches; removal prunes and invalidates the cache."""
    index: PatternIndex[int] = PatternIndex(cache_size=8)
    patterns = []
    for i in range(2000):
        patterns.append(Pattern(PREFIX, f"p{i}."))
        patterns.append(Pattern(WILDCARD, f"w{i}..x"))
    for n, p in enumerate(patterns):
        assert index.add(p, n)
    assert not index.add(patterns[0], 99)  # a second holder: not new
    assert index.match("p17.a") == (Pattern(PREFIX, "p17."),)
    assert index.match("w17.a.x") == (Pattern(WILDCARD, "w17..x"),)
    assert index.match("w17.a.y") == ()
    assert not index.discard(Pattern(WILDCARD, "w17..x"), 12345)  # not a holder
    assert index.discard(Pattern(WILDCARD, "w17..x"), patterns.index(Pattern(WILDCARD, "w17..x")))
    assert index.match("w17.a.x") == ()  # the cached answer was dropped
    for n, p in enumerate(patterns):
        index.discard(p, n)
    assert index.discard(patterns[0], 99)
    assert len(index) == 0 and index._wildcards == {} and index._prefixes == {}
    assert index.match("p17.a") == ()


def test_cache_stays_bounded() -> None:
    """The per-topic cache never holds more than its size."""
    index: PatternIndex[int] = PatternIndex(cache_size=4)
    index.add(Pattern(PREFIX, "a"), 1)
    for i in range(100):
        assert index.match(f"a{i}") == (Pattern(PREFIX, "a"),)
    assert len(index._cache) == 4


_component = st.sampled_from(["a", "b", "c", "$d"])
_topic = st.lists(_component, min_size=1, max_size=4).map(".".join)
_wild = st.lists(st.sampled_from(["a", "b", ""]), min_size=1, max_size=4).map(".".join)
_prefix = st.lists(st.sampled_from(["a", "b", "a.", "b."]), min_size=1, max_size=3).map("".join)


@given(
    st.lists(st.tuples(st.sampled_from([PREFIX, WILDCARD]), _wild, _prefix), max_size=12),
    st.lists(_topic, max_size=12),
)
def test_index_agrees_with_the_rule(specs: list[tuple[str, str, str]], topics: list[str]) -> None:
    """Whatever the patterns, the index answers exactly the patterns whose rule matches."""
    patterns = {Pattern(m, w if m == WILDCARD else p) for m, w, p in specs}
    index: PatternIndex[int] = PatternIndex()
    for p in patterns:
        index.add(p, 1)
    for topic in topics:
        assert set(index.match(topic)) == {p for p in patterns if p.matches(topic)}


class _PatternSink:
    """A hub sink holding patterns: records (topic, pattern) per delivery."""

    counts_as = "wamp"

    def __init__(self) -> None:
        self.got: list[tuple[str, Pattern | None]] = []

    def deliver(self, envelope: Envelope) -> None:
        self.got.append((envelope.topic, None))

    def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> None:
        self.got.append((envelope.topic, pattern))


class _Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Pattern]] = []

    def pattern_added(self, pattern: Pattern) -> None:
        self.calls.append(("added", pattern))

    def pattern_removed(self, pattern: Pattern) -> None:
        self.calls.append(("removed", pattern))


def test_hub_delivers_once_per_matching_subscription_and_tells_first_and_last_holder() -> None:
    """A sink subscribed exactly and by two patterns gets three deliveries; listeners hear first/last holders."""
    hub = Hub("n1")
    listener = _Listener()
    hub.add_pattern_listener(listener)
    sink, other = _PatternSink(), _PatternSink()
    prefix, wild = Pattern(PREFIX, "app."), Pattern(WILDCARD, "app..temp")
    hub.subscribe("app.k.temp", sink)
    hub.subscribe_pattern(prefix, sink)
    hub.subscribe_pattern(prefix, other)
    hub.subscribe_pattern(wild, sink)
    assert listener.calls == [("added", prefix), ("added", wild)]
    assert hub.publish(hub.envelope("app.k.temp", 1)) == 4
    assert sorted(sink.got, key=str) == sorted(
        [("app.k.temp", None), ("app.k.temp", prefix), ("app.k.temp", wild)], key=str
    )
    assert other.got == [("app.k.temp", prefix)]
    assert hub.publish(hub.envelope("app.k.temp", 2), exclude=sink) == 1  # publisher exclusion covers patterns
    hub.unsubscribe_pattern(prefix, sink)
    assert listener.calls[2:] == []
    hub.unsubscribe_all(other)
    hub.unsubscribe_all(sink)
    assert listener.calls[2:] == [("removed", prefix), ("removed", wild)]
    assert hub.patterns() == [] and hub.topics() == []
    assert hub.deliver_remote(hub.envelope("app.k.temp", 3)) == 0


def test_a_raising_pattern_sink_is_isolated() -> None:
    """A pattern sink that raises is counted; the others still get the message."""

    class Broken(_PatternSink):
        def deliver_matched(self, envelope: Envelope, pattern: Pattern) -> None:
            raise RuntimeError("boom")

    hub = Hub("n1")
    good = _PatternSink()
    hub.subscribe_pattern(Pattern(PREFIX, "a"), Broken())
    hub.subscribe_pattern(Pattern(PREFIX, "a"), good)
    assert hub.deliver_remote(hub.envelope("ab", 1)) == 1
    assert good.got == [("ab", Pattern(PREFIX, "a"))]
    assert hub.metrics.sink_errors == {"Broken": 1}


def test_a_pattern_with_an_unknown_match_cannot_be_made() -> None:
    """Pattern refuses a match it has no rule for (a local error, never a silent wildcard)."""
    with pytest.raises(ValueError, match="'prefix' or 'wildcard', not 'exact'"):
        Pattern("exact", "a")
