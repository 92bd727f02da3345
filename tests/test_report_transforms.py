"""Each report transform on a few hand-made rows, compared exactly."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import orjson
from helpers.spark import assert_frame
from pyspark.sql import DataFrame, SparkSession

from pubsubclub.reports import transforms as X
from pubsubclub.reports.schema import LINES_SCHEMA, RECORD_SCHEMA

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, a minute boundary
INF = math.inf
COLUMNS = [f.name for f in RECORD_SCHEMA.fields]


def rec(type_: str, node: str = "a", start: float = T0, ts: float = T0 + 10, **fields: Any) -> dict[str, Any]:
    """One schema-v1 record as a dict."""
    return {"v": 1, "type": type_, "node": node, "start": start, "ts": ts, **fields}


def counter(node: str, topic: str, kind: str, count: int, nbytes: int, **fields: Any) -> dict[str, Any]:
    """A counter record; frontend wamp unless given."""
    fields.setdefault("frontend", "psc" if kind in ("forwarded", "received") else "wamp")
    return rec("counter", node, topic=topic, kind=kind, count=count, bytes=nbytes, **fields)


def latency(node: str, origin: str, bounds: list[float], counts: list[int], sum_ms: float, **kw: Any) -> dict[str, Any]:
    """A latency record."""
    return rec("latency", node, origin=origin, bounds_ms=bounds, counts=counts, count=sum(counts), sum_ms=sum_ms, **kw)


def records(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """A records frame with the declared schema."""
    return spark.createDataFrame([tuple(r.get(c) for c in COLUMNS) for r in rows], RECORD_SCHEMA)


def lines(spark: SparkSession, texts: list[str]) -> DataFrame:
    """A frame of raw dump lines."""
    return spark.createDataFrame([(t,) for t in texts], LINES_SCHEMA)


def dumps(record: dict[str, Any]) -> str:
    """A record as one JSON line."""
    return orjson.dumps(record).decode()


GOOD = [
    dumps(counter("a", "t1", "published", 3, 30)),
    dumps(latency("b", "a", [1.0, 5.0], [1, 2, 0], 7.5)),
    dumps(rec("gauge", name="subscribers", topic="t1", value=4.0)),
    dumps(rec("link", peer="ws://b/psc", peer_node="b", role="consumer", direction="out", state="open")),
]
BAD = {
    '{"v": 1, "type": "counter", "node": "a", "start": 1.0, "ts": 2.0, "topic": "t': "corrupt_json",  # truncated
    "not json at all": "corrupt_json",
    "[1, 2]": "corrupt_json",
    dumps(counter("a", "t1", "published", 3, 30) | {"count": "three"}): "corrupt_json",
    dumps(counter("a", "t1", "published", 3, 30) | {"v": 2}): "unknown_version",
    dumps(counter("a", "t1", "published", 3, 30) | {"v": 2, "count": "x"}): "unknown_version",
    dumps(counter("a", "t1", "published", 3, 30) | {"v": None}): "missing_fields",
    dumps(counter("a", "t1", "published", 3, 30) | {"node": None}): "missing_fields",
    dumps(rec("histogram")): "unknown_type",
    dumps(counter("a", "t1", "forwarded", 3, 30)): "missing_fields",  # no peer
    dumps(counter("a", "t1", "dropped", 3, 30)): "missing_fields",  # no reason
    dumps(counter("a", "t1", "published", -1, 30)): "invalid_value",
    dumps(counter("a", "t1", "teleported", 1, 30)): "invalid_value",
    dumps(rec("gauge", start=T0 + 20, name="subscribers", topic="t1", value=1.0)): "invalid_value",  # ts < start
    dumps(latency("b", "a", [1.0, 5.0], [1, 2], 1.0)): "invalid_value",  # one count too few
    dumps(latency("b", "a", [1.0], [1, 2], 1.0) | {"count": 4}): "invalid_value",  # count != sum(counts)
}


def test_parse_lines_classifies_every_line(spark: SparkSession) -> None:
    """Good lines get no reason; each bad line gets the first rule it breaks; blank lines vanish."""
    parsed = X.parse_lines(lines(spark, [*GOOD, *BAD, "", "   "]))
    got = {(r["line"] if r["bad_reason"] else r["type"], r["bad_reason"]) for r in parsed.collect()}
    want = {(t, None) for t in ("counter", "latency", "gauge", "link")} | set(BAD.items())
    assert got == want
    assert parsed.count() == len(GOOD) + len(BAD)


def test_valid_records_keep_the_declared_columns_and_values(spark: SparkSession) -> None:
    """Good records come out with exactly the schema's columns, parsed values intact."""
    valid = X.valid_records(X.parse_lines(lines(spark, [*GOOD, *BAD])))
    assert valid.schema == RECORD_SCHEMA
    assert_frame(
        valid.where("type = 'latency'").select("node", "origin", "bounds_ms", "counts", "count", "sum_ms"),
        ["node", "origin", "bounds_ms", "counts", "count", "sum_ms"],
        [("b", "a", [1.0, 5.0], [1, 2, 0], 3, 7.5)],
    )


def test_bad_record_counts_by_reason(spark: SparkSession) -> None:
    """Bad lines are counted per reason with the smallest line as the example."""
    bad = X.bad_record_counts(X.parse_lines(lines(spark, [*GOOD, *BAD, "junk", "junk"])))
    by_reason: dict[str, list[str]] = {}
    for line, reason in [*BAD.items(), ("junk", "corrupt_json"), ("junk", "corrupt_json")]:
        by_reason.setdefault(reason, []).append(line)
    want = [(reason, len(ls), min(ls)[: X.EXAMPLE_CHARS]) for reason, ls in by_reason.items()]
    assert_frame(bad, ["reason", "lines", "example"], want)


def test_bucket_checks_left_to_compact_give_the_same_verdicts(spark: SparkSession) -> None:
    """Lines parsed with ``check_buckets=False`` then compacted: same bad counts, examples and latency rows."""
    twice = dumps(latency("b", "a", [1.0], [1, 2], 1.0) | {"count": 4})  # a second copy of a bad line of BAD
    texts = [*GOOD, *BAD, twice, GOOD[1], dumps(latency("b", "a", [1.0, 5.0], [0, -1, 2], 1.0))]
    texts.append(dumps(rec("latency", "b", origin="a", bounds_ms=[1.0, 5.0], counts=[2, None, 0], count=2, sum_ms=1.0)))
    checked = X.parse_lines(lines(spark, texts))
    deferred = X.compact(X.parse_lines(lines(spark, texts), check_buckets=False))
    expected = X.bad_record_counts(checked)
    assert_frame(X.bad_record_counts(deferred), expected.columns, [tuple(r) for r in expected.collect()])
    assert dict(X.bad_record_counts(deferred).select("reason", "lines").collect())["invalid_value"] == 8
    assert_frame(
        X.valid_records(deferred).where("type = 'latency'").select("counts", "count"),
        ["counts", "count"],
        [([2, 4, 0], 6)],  # the good latency line twice, merged
    )
    wrong_sum = latency("b", "a", [1.0], [1, 2], 1.0) | {"count": 5}
    frame = records(spark, [wrong_sum, latency("b", "a", [1.0], [1, 1], 1.0)])
    classified = X.compact(X.classify_records(frame, check_buckets=False))
    assert [(r["reason"], r["lines"]) for r in X.bad_record_counts(classified).collect()] == [("invalid_value", 1)]
    assert X.valid_records(classified).select("counts").collect()[0][0] == [1, 1]


def test_filter_window_is_half_open_and_keeps_bad_lines(spark: SparkSession) -> None:
    """``since <= ts < until`` selects records; bad lines stay to be counted."""
    texts = [dumps(counter("a", f"t{k}", "published", 1, 1, start=T0, ts=T0 + 10 * k)) for k in range(1, 5)]
    parsed = X.parse_lines(lines(spark, [*texts, "junk"]))
    kept = X.filter_window(parsed, since=T0 + 20, until=T0 + 40)
    assert_frame(
        kept.select("topic", "bad_reason"),
        ["topic", "bad_reason"],
        [("t2", None), ("t3", None), (None, "corrupt_json")],
    )
    assert X.filter_window(parsed).count() == 5


def test_topic_totals_and_rates(spark: SparkSession) -> None:
    """Counts and bytes per kind are summed per topic; rates divide by the cluster's observed seconds."""
    frame = records(
        spark,
        [
            counter("a", "t1", "published", 10, 100, start=T0, ts=T0 + 10),
            counter("b", "t1", "published", 5, 50, start=T0 + 10, ts=T0 + 20),
            counter("a", "t1", "delivered", 7, 70),
            counter("a", "t1", "forwarded", 4, 40, peer="b"),
            counter("b", "t1", "received", 4, 40, peer="a"),
            counter("b", "t1", "dropped", 1, 9, reason="slow_consumer"),
            counter("a", "t2", "delivered", 2, 20),
            rec("gauge", "c", start=T0, ts=T0 + 40, name="subscribers", topic="t3", value=1.0),
        ],
    )
    cols = ["topic"]
    for kind in ("published", "delivered", "forwarded", "received", "dropped"):
        cols += [kind, f"{kind}_bytes"]
    cols += ["observed_seconds"] + [
        f"{k}_per_s" for k in ("published", "delivered", "forwarded", "received", "dropped")
    ]
    assert_frame(
        X.topic_totals(frame),
        cols,
        [
            ("t1", 15, 150, 7, 70, 4, 40, 4, 40, 1, 9, 40.0, 15 / 40, 7 / 40, 4 / 40, 4 / 40, 1 / 40),
            ("t2", 0, 0, 2, 20, 0, 0, 0, 0, 0, 0, 40.0, 0.0, 2 / 40, 0.0, 0.0, 0.0),
        ],
    )


def test_topic_totals_rate_is_null_without_observed_time(spark: SparkSession) -> None:
    """A zero-length observation gives null rates, not a division error."""
    frame = records(spark, [counter("a", "t1", "published", 3, 3, start=T0, ts=T0)])
    assert X.topic_totals(frame).select("published_per_s").collect()[0][0] is None


def test_node_minute_series(spark: SparkSession) -> None:
    """Counters are summed per node and UTC minute of the dump time."""
    frame = records(
        spark,
        [
            counter("a", "t1", "published", 1, 10, start=T0, ts=T0 + 10),
            counter("a", "t2", "published", 2, 20, start=T0 + 50, ts=T0 + 59.5),
            counter("a", "t1", "delivered", 3, 30, start=T0 + 55, ts=T0 + 60),
            counter("b", "t1", "forwarded", 4, 40, peer="a", start=T0, ts=T0 + 10),
            rec("gauge", "b", name="subscribers", topic="t1", value=3.0),
        ],
    )
    m0, m1 = datetime.fromtimestamp(T0), datetime.fromtimestamp(T0 + 60)
    assert_frame(
        X.node_minute_series(frame),
        ["node", "minute"]
        + [c for k in ("published", "delivered", "forwarded", "received", "dropped") for c in (k, f"{k}_bytes")],
        [
            ("a", m0, 3, 30, 0, 0, 0, 0, 0, 0, 0, 0),
            ("a", m1, 0, 0, 3, 30, 0, 0, 0, 0, 0, 0),
            ("b", m0, 0, 0, 0, 0, 4, 40, 0, 0, 0, 0),
        ],
    )


def test_top_topics_ranks_by_published_then_name(spark: SparkSession) -> None:
    """The n most published topics, ties broken by name, ranked from 1."""
    frame = records(
        spark,
        [
            counter("a", "zeta", "published", 5, 50),
            counter("a", "alpha", "published", 5, 40),
            counter("a", "mid", "published", 9, 90),
            counter("a", "mid", "delivered", 18, 180),
            counter("a", "low", "published", 1, 10),
        ],
    )
    assert_frame(
        X.top_topics(X.topic_totals(frame), 3),
        ["rank", "topic", "published", "published_bytes", "published_per_s", "delivered"],
        [(1, "mid", 9, 90, 0.9, 18), (2, "alpha", 5, 40, 0.5, 0), (3, "zeta", 5, 50, 0.5, 0)],
    )


def test_internal_topics_are_not_top_topics(spark: SparkSession) -> None:
    """Topics starting with ``$`` never rank among the top topics, however busy; internal_topics lists them."""
    frame = records(
        spark,
        [
            counter("a", "$nsd.log", "published", 900, 9000),
            counter("a", "$realm.other#chat", "published", 800, 8000),
            counter("a", "$cluster.gap", "received", 2, 20, peer="b"),
            counter("a", "mid", "published", 9, 90),
            counter("a", "low", "published", 1, 10),
        ],
    )
    totals = X.topic_totals(frame)
    assert_frame(
        X.top_topics(totals, 3).select("rank", "topic", "published"),
        ["rank", "topic", "published"],
        [(1, "mid", 9), (2, "low", 1)],
    )
    assert_frame(
        X.internal_topics(totals),
        ["topic", "published", "delivered", "forwarded", "received"],
        [("$nsd.log", 900, 0, 0, 0), ("$realm.other#chat", 800, 0, 0, 0), ("$cluster.gap", 0, 0, 0, 2)],
    )


def test_fanout_is_deliveries_per_publish_across_nodes(spark: SparkSession) -> None:
    """Delivered over published, summed over all nodes; null for a topic nobody published."""
    frame = records(
        spark,
        [
            counter("a", "t1", "published", 4, 40),
            counter("a", "t1", "delivered", 4, 40),
            counter("b", "t1", "delivered", 6, 60),
            counter("b", "t2", "delivered", 1, 10),
            counter("b", "t3", "published", 2, 20),
            counter("a", "t1", "forwarded", 4, 40, peer="b"),
        ],
    )
    assert_frame(
        X.fanout(frame),
        ["topic", "published", "delivered", "fanout"],
        [("t1", 4, 10, 2.5), ("t2", 0, 1, None), ("t3", 2, 0, 0.0)],
    )


def test_traffic_matrix_from_forwarded(spark: SparkSession) -> None:
    """Forwarded counters summed per (node, peer); received counters do not count twice."""
    frame = records(
        spark,
        [
            counter("a", "t1", "forwarded", 4, 40, peer="b"),
            counter("a", "t2", "forwarded", 1, 10, peer="b"),
            counter("a", "t1", "forwarded", 2, 20, peer="c"),
            counter("b", "t1", "forwarded", 3, 30, peer="a"),
            counter("b", "t1", "received", 5, 50, peer="a"),
        ],
    )
    assert_frame(
        X.traffic_matrix(frame),
        ["node", "peer", "count", "bytes"],
        [("a", "b", 5, 50), ("a", "c", 2, 20), ("b", "a", 3, 30)],
    )


def test_drops_by_reason(spark: SparkSession) -> None:
    """Dropped counters summed per node, front-end and reason."""
    frame = records(
        spark,
        [
            counter("a", "t1", "dropped", 1, 10, reason="slow_consumer"),
            counter("a", "t2", "dropped", 2, 20, reason="slow_consumer"),
            counter("a", "t1", "dropped", 3, 30, reason="not_json", frontend="psc"),
            counter("b", "t1", "dropped", 4, 40, reason="slow_consumer", frontend="tep"),
            counter("b", "t1", "published", 9, 90),
        ],
    )
    assert_frame(
        X.drops_by_reason(frame),
        ["node", "frontend", "reason", "count", "bytes"],
        [("a", "wamp", "slow_consumer", 3, 30), ("a", "psc", "not_json", 3, 30), ("b", "tep", "slow_consumer", 4, 40)],
    )


def test_latency_percentiles_from_buckets(spark: SparkSession) -> None:
    """Bucket counts merge per pair; p is the upper bound where the cumulative count reaches ceil(p% * n)."""
    bounds = [1.0, 2.0, 5.0, 10.0]
    frame = records(
        spark,
        [
            # a -> b: 100 messages: 50 <= 1 ms, 40 <= 2 ms, 9 <= 5 ms, 1 above 10 ms, split over two records
            latency("b", "a", bounds, [30, 20, 5, 0, 0], 60.0),
            latency("b", "a", bounds, [20, 20, 4, 0, 1], 90.0, ts=T0 + 20),
            # b -> a: 10 messages; 9 <= 1 ms: p90 rank 9 -> 1 ms, p99 rank 10 -> 5 ms
            latency("a", "b", bounds, [9, 0, 1, 0, 0], 12.0),
            # c -> a: one record with other bounds; its bucket <= 3 ms
            latency("a", "c", [3.0], [1, 0], 2.0),
            counter("a", "t1", "published", 1, 1),
        ],
    )
    assert_frame(
        X.latency_percentiles(frame),
        ["origin", "node", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms"],
        [
            ("a", "b", 100, 1.5, 1.0, 2.0, 5.0),
            ("b", "a", 10, 1.2, 1.0, 1.0, 5.0),
            ("c", "a", 1, 2.0, 3.0, 3.0, 3.0),
        ],
    )


def test_latency_percentile_in_overflow_bucket_is_infinite(spark: SparkSession) -> None:
    """A rank past the last bound estimates +infinity; a pair with no messages has null percentiles."""
    frame = records(spark, [latency("b", "a", [1.0], [1, 3], 40.0), latency("c", "a", [1.0], [0, 0], 0.0)])
    assert_frame(
        X.latency_percentiles(frame),
        ["origin", "node", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms"],
        [("a", "b", 4, 10.0, INF, INF, INF), ("a", "c", 0, None, None, None, None)],
    )


def test_observation_window(spark: SparkSession) -> None:
    """Earliest start to latest dump time over every record type."""
    frame = records(
        spark,
        [
            counter("a", "t1", "published", 1, 1, start=T0 + 5, ts=T0 + 15),
            rec("link", start=T0, ts=T0 + 30, peer="p", role="consumer", direction="out", state="open"),
        ],
    )
    assert_frame(X.observation_window(frame), ["first_start", "last_ts", "seconds"], [(T0, T0 + 30, 30.0)])


#: The tables computed from records merged across minutes.
OVERALL_TABLES = [
    X.topic_totals,
    X.fanout,
    X.traffic_matrix,
    X.drops_by_reason,
    X.latency_percentiles,
    X.observation_window,
]


def _assert_same_tables(tables: list[Any], raw: DataFrame, small: DataFrame) -> None:
    """Each of ``tables`` gives the same rows on ``small`` as on ``raw``."""
    for table in tables:
        expected = table(raw)
        assert_frame(table(small), expected.columns, [tuple(r) for r in expected.collect()])


def test_compact_changes_no_table(spark: SparkSession) -> None:
    """Every table is the same on compacted rows as on the parsed lines, and lines are all accounted for."""
    texts = [
        dumps(counter(n, t, k, c, c * 10, peer=p, reason=r, start=T0 + s, ts=T0 + s + 10))
        for n, t, k, c, p, r, s in [
            ("a", "t1", "published", 3, None, None, 0),
            ("a", "t1", "published", 4, None, None, 10),  # same minute as the one above: merged
            ("a", "t1", "published", 5, None, None, 60),  # next minute
            ("a", "t1", "forwarded", 2, "b", None, 0),
            ("a", "t1", "forwarded", 1, "c", None, 10),
            ("b", "t1", "delivered", 6, None, None, 0),
            ("b", "t2", "dropped", 1, None, "slow_consumer", 20),
            ("b", "t2", "dropped", 2, None, "not_json", 20),
        ]
    ]
    texts += [
        dumps(latency("b", "a", [1.0, 2.0], [1, 1, 0], 2.0)),
        dumps(latency("b", "a", [1.0, 2.0], [0, 3, 1], 9.0, start=T0 + 10, ts=T0 + 20)),
        dumps(latency("b", "a", [5.0], [2, 0], 3.0)),
        dumps(rec("gauge", "a", name="subscribers", topic="t1", value=2.0)),
        dumps(rec("gauge", "a", start=T0 + 10, ts=T0 + 20, name="subscribers", topic="t1", value=5.0)),
        "junk",
        "junk",
        dumps(rec("counter") | {"v": 3}),
    ]
    parsed = X.parse_lines(lines(spark, texts))
    # Materialised once, as the job does (its plan has three branches; each table would re-run them).
    compacted = X.compact(parsed).localCheckpoint()
    assert compacted.columns == parsed.columns
    assert compacted.count() < parsed.count()
    assert compacted.agg({"lines": "sum"}).collect()[0][0] == len(texts)
    raw, small = X.valid_records(parsed), X.valid_records(compacted)
    _assert_same_tables([X.node_minute_series, *OVERALL_TABLES], raw, small)
    expected_bad = X.bad_record_counts(parsed)
    assert_frame(X.bad_record_counts(compacted), expected_bad.columns, [tuple(r) for r in expected_bad.collect()])
    assert_frame(
        small.where("type = 'latency' and bounds_ms[0] = 1.0").select("counts", "count", "sum_ms", "start", "ts"),
        ["counts", "count", "sum_ms", "start", "ts"],
        [([1, 4, 1], 6, 11.0, T0, T0 + 20)],
    )
    # Compacted again across minutes (what the job's tables but the per-minute one read): the same tables.
    overall = X.valid_records(X.compact(compacted.where("bad_reason is null"), by_minute=False))
    assert overall.count() < small.count()
    for table in (X.topic_totals, X.fanout, X.traffic_matrix, X.drops_by_reason, X.latency_percentiles):
        expected = table(raw)
        assert_frame(table(overall), expected.columns, [tuple(r) for r in expected.collect()])
    assert_frame(X.observation_window(overall), ["first_start", "last_ts", "seconds"], [(T0, T0 + 70, 70.0)])


def test_compact_grains_give_the_tables_of_the_raw_lines(spark: SparkSession) -> None:
    """The job's one-pass grains: every table, the bad-line counts and the record count as from the lines themselves."""
    texts = [*GOOD, *BAD, GOOD[1], GOOD[0], "junk"]
    texts += [
        dumps(counter(n, t, k, c, c * 10, peer=p, reason=r, frontend=f, start=T0 + s, ts=T0 + s + 10))
        for n, t, k, c, p, r, f, s in [
            ("a", "t1", "published", 4, None, None, "wamp", 10),  # same minute as GOOD[0]
            ("a", "t1", "published", 5, None, None, "nsd", 60),  # next minute, other front-end
            ("a", "$nsd.log", "published", 2, None, None, "nsd", 70),
            ("a", "t2", "forwarded", 2, "b", None, "psc", 0),
            ("a", "t2", "forwarded", 1, "c", None, "psc", 130),
            ("b", "t2", "delivered", 6, None, None, "tep", 0),
            ("b", "t2", "dropped", 1, None, "slow_consumer", "wamp", 20),
            ("b", "t2", "dropped", 2, None, "not_json", "wamp", 200),
        ]
    ]
    texts += [
        dumps(latency("b", "a", [1.0, 5.0], [0, 3, 1], 9.0, start=T0 + 60, ts=T0 + 70)),  # next minute: merged
        dumps(latency("b", "c", [5.0], [2, 0], 3.0)),
        dumps(latency("b", "a", [1.0, 5.0], [0, -1, 2], 1.0)),  # negative bucket: bad only after the pass
        dumps(rec("gauge", "b", start=T0 + 100, ts=T0 + 400, name="subscribers", topic="t2", value=5.0)),
    ]
    checked = X.parse_lines(lines(spark, texts))
    grains = X.compact_grains(X.parse_lines(lines(spark, texts), check_buckets=False)).localCheckpoint()
    overall = X.compact_latency(X.grain_overall(grains)).localCheckpoint()
    raw, small, minutes = X.valid_records(checked), X.valid_records(overall), X.grain_minutes(grains)
    assert small.columns == minutes.columns == raw.columns
    assert small.count() < raw.count()
    _assert_same_tables(OVERALL_TABLES, raw, small)
    expected = X.node_minute_series(raw)
    assert expected.count() == 5
    assert_frame(X.node_minute_series(minutes), expected.columns, [tuple(r) for r in expected.collect()])
    expected = X.bad_record_counts(checked)
    assert_frame(X.bad_record_counts(overall), expected.columns, [tuple(r) for r in expected.collect()])
    assert overall.where("bad_reason is null").agg({"lines": "sum"}).collect()[0][0] == raw.count()
    assert overall.agg({"lines": "sum"}).collect()[0][0] == len(texts)
