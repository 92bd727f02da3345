"""Node metrics: counters, intervals, dump files, Prometheus text."""

from __future__ import annotations

import json
from pathlib import Path

from pubsubclub.core.hub import Envelope
from pubsubclub.core.metrics import LATENCY_BOUNDS_MS, Metrics, MetricsDumper, PrometheusCollector, payload_size


def test_counters_accumulate_per_key_and_reset_per_interval() -> None:
    """Counts add up per (topic, frontend, kind, peer, reason); an interval hands them over and starts empty."""
    m = Metrics("n1")
    m.count("t", "wamp", "published", nbytes=10)
    m.count("t", "wamp", "published", nbytes=5)
    m.count("t", "psc", "forwarded", nbytes=7, peer="n2")
    m.count("t", "wamp", "dropped", reason="slow_consumer")
    _, counters, _ = m.take_interval(100.0)
    assert counters == {
        ("t", "wamp", "published", None, None): [2, 15],
        ("t", "psc", "forwarded", "n2", None): [1, 7],
        ("t", "wamp", "dropped", None, "slow_consumer"): [1, 0],
    }
    _, again, _ = m.take_interval(110.0)
    assert again == {}
    m.count("t", "wamp", "published", nbytes=1)
    totals = {key: (n, b) for key, n, b in m.totals()}
    assert totals[("t", "wamp", "published", None, None)] == (3, 16)


def test_latency_histogram_buckets() -> None:
    """Latencies land in the bucket whose upper bound they do not exceed; the last bucket takes the rest."""
    m = Metrics("n1")
    m.latency("n2", 0.0001)  # 0.1 ms
    m.latency("n2", 0.003)  # 3 ms
    m.latency("n2", 60.0)  # off the scale
    _, _, latency = m.take_interval(1.0)
    hist = latency["n2"]
    assert hist.count == 3 and len(hist.counts) == len(LATENCY_BOUNDS_MS) + 1
    assert hist.counts[0] == 1 and hist.counts[LATENCY_BOUNDS_MS.index(5)] == 1 and hist.counts[-1] == 1


def test_latencies_of_a_batch_equal_one_latency_each() -> None:
    """latencies(origin, [..]) leaves the same histogram as latency() called once per value."""
    seconds = [0.0001, 0.003, 60.0, -0.5, 0.00025]
    one, batch = Metrics("n1"), Metrics("n1")
    for s in seconds:
        one.latency("n2", s)
    batch.latencies("n2", seconds[:2])
    batch.latencies("n2", seconds[2:])
    [(_, a)] = one.take_interval(1.0)[2].items()
    [(_, b)] = batch.take_interval(1.0)[2].items()
    assert (a.counts, a.count, a.sum_ms) == (b.counts, b.count, b.sum_ms) and a.count == len(seconds)


def test_dump_writes_partitioned_schema_v1_file_atomically(tmp_path: Path) -> None:
    """A dump is one .jsonl file under node=/date=/hour= with schema-v1 records, and no temporary file is left."""
    m = Metrics("n1")
    m.count("t", "wamp", "published", nbytes=3)
    m.latency("n2", 0.002)
    dumper = MetricsDumper(m, str(tmp_path), lambda: {"t": 2}, lambda: [], clock=lambda: 1_763_776_800.5)
    path = dumper.dump()
    assert path is not None
    rel = Path(path).relative_to(tmp_path)
    assert rel.parts[:3] == ("node=n1", "date=2025-11-22", "hour=02")
    assert rel.name.startswith("part-1763776800500-") and rel.name.endswith(".jsonl")
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert {r["type"] for r in rows} == {"counter", "latency", "gauge"}
    assert all(r["v"] == 1 and r["node"] == "n1" and r["ts"] == 1_763_776_800.5 for r in rows)
    [counter] = [r for r in rows if r["type"] == "counter"]
    assert (counter["topic"], counter["kind"], counter["count"], counter["bytes"]) == ("t", "published", 1, 3)
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [rel.name]
    assert dumper.dump() is None  # nothing new, no file


def test_prometheus_text_has_the_same_counters() -> None:
    """The Prometheus collector reports the cumulative counts, gauges and the latency histogram."""
    from prometheus_client import CollectorRegistry, generate_latest

    m = Metrics("n1")
    m.count("t", "wamp", "published", nbytes=4)
    m.take_interval(1.0)
    m.count("t", "wamp", "published", nbytes=4)
    m.latency("n2", 0.001)
    registry = CollectorRegistry()
    links = [{"peer": "ws://x/psc", "role": "consumer", "direction": "out", "state": "open"}]
    registry.register(PrometheusCollector(m, lambda: {"t": 1}, lambda: links))
    text = generate_latest(registry).decode()
    assert 'pubsubclub_messages_total{frontend="wamp",kind="published",peer="",reason="",topic="t"} 2.0' in text
    assert 'pubsubclub_bytes_total{frontend="wamp",kind="published",peer="",reason="",topic="t"} 8.0' in text
    assert 'pubsubclub_subscribers{topic="t"} 1.0' in text
    assert 'pubsubclub_link_open{direction="out",peer="ws://x/psc",role="consumer"} 1.0' in text
    assert 'pubsubclub_cross_node_latency_seconds_count{origin="n2"} 1.0' in text


def test_payload_size_is_computed_once() -> None:
    """The JSON size of a payload is cached on the envelope."""
    env = Envelope("t", {"a": 1})
    assert payload_size(env) == len(b'{"a":1}')
    env.wire["size"] = 99
    assert payload_size(env) == 99


def test_scrape_names_only_the_busiest_topics_and_sums_the_rest() -> None:
    """With a cap of 3, the 3 busiest topics keep their series, the rest sum under __other__, totals unchanged."""
    from prometheus_client import CollectorRegistry, generate_latest

    m = Metrics("n1")
    for i in range(50):
        m.count(f"t{i:02d}", "wamp", "published", n=i + 1, nbytes=10 * (i + 1))
    gauges = {f"t{i:02d}": 1 for i in range(50)}
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(m, lambda: gauges, lambda: [], max_topics=3))
    text = generate_latest(registry).decode()
    series = [line for line in text.splitlines() if line.startswith("pubsubclub_messages_total{")]
    topics = sorted(line.split('topic="')[1].split('"')[0] for line in series)
    assert topics == ["__other__", "t47", "t48", "t49"]
    other = next(line for line in series if 'topic="__other__"' in line)
    assert float(other.rsplit(" ", 1)[1]) == sum(range(1, 48))
    subscribers = [line for line in text.splitlines() if line.startswith("pubsubclub_subscribers{")]
    assert len(subscribers) == 4 and 'pubsubclub_subscribers{topic="__other__"} 47.0' in subscribers


def test_scrape_under_the_cap_is_unchanged() -> None:
    """Below the cap every topic keeps its own series and no __other__ appears."""
    m = Metrics("n1")
    m.count("a", "wamp", "published")
    m.count("b", "tep", "published", n=2)
    assert sorted((k[0], n) for k, n, _ in m.capped_totals(2)) == [("a", 1), ("b", 2)]


def test_new_topics_past_the_key_cap_are_summed_not_tracked() -> None:
    """An interval holds at most max_keys keys; the totals are folded back under it, counts preserved."""
    m = Metrics("n1", max_keys=100)
    for i in range(1000):
        m.count(f"new.{i}", "wamp", "published", nbytes=1)
    _, interval, _ = m.take_interval(1.0)
    assert len(interval) <= 101
    assert sum(n for n, _ in interval.values()) == 1000
    for round_ in range(5):
        for i in range(90):
            m.count(f"r{round_}.{i}", "wamp", "published", n=2 if i < 10 else 1)
        m.take_interval(2.0 + round_)
    totals = list(m.totals())
    assert len(totals) <= 100
    assert sum(n for _, n, _ in totals) == 1000 + 5 * 100


def test_stats_views_and_the_scrape_read_the_same_counters() -> None:
    """Hub, federation, TEP, NSD and replay counters live only in Metrics: /stats views and /metrics agree."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pubsubclub.core.counters import COMPONENTS, FederationEvent, HubEvent, NSDEvent, ReplayEvent, TEPEvent
    from pubsubclub.core.hub import Hub
    from pubsubclub.federation import Federation

    hub = Hub("n1")
    federation = Federation(hub, reactor=None)
    hub.metrics.event(FederationEvent.AUTH_REFUSED, 3)
    hub.metrics.event(HubEvent.SINK_ERRORS)
    hub.metrics.event(TEPEvent.BAD_FRAMES, 2)
    hub.metrics.event(NSDEvent.REQUESTS, 5)
    hub.metrics.event(ReplayEvent.DUPLICATES, 7)
    assert federation.stats["auth_refused"] == 3 and hub.stats["sink_errors"] == 1
    assert set(federation.stats) == {e.value for e in FederationEvent}
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(hub.metrics, dict, list))
    text = generate_latest(registry).decode()
    for component in COMPONENTS:
        for name, n in hub.metrics.view(component).items():
            if n:
                assert f'pubsubclub_events_total{{component="{component}",event="{name}"}} {float(n)}' in text


def test_counts_held_back_by_a_component_are_seen_by_every_read() -> None:
    """A settler's held-back counts reach /stats views, totals, the interval handed over and Prometheus."""
    from prometheus_client import CollectorRegistry, generate_latest

    from pubsubclub.core.counters import HubEvent

    m = Metrics("n1")
    held = [0]

    def settle() -> None:
        if held[0]:
            m.event(HubEvent.PUBLISHED, held[0])
            m.count("t", "psc", "forwarded", held[0], 10 * held[0], peer="n2")
            held[0] = 0

    m.add_settler(settle)
    held[0] = 3
    assert m.view("hub")["published"] == 3
    held[0] = 2
    assert {key: (n, b) for key, n, b in m.totals()}[("t", "psc", "forwarded", "n2", None)] == (5, 50)
    held[0] = 4
    _, counters, _ = m.take_interval(1.0)
    assert counters[("t", "psc", "forwarded", "n2", None)] == [9, 90]
    held[0] = 1
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(m, lambda: {}, lambda: []))
    text = generate_latest(registry).decode()
    assert 'pubsubclub_events_total{component="hub",event="published"} 10.0' in text
    assert 'pubsubclub_messages_total{frontend="psc",kind="forwarded",peer="n2",reason="",topic="t"} 10.0' in text
