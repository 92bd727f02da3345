"""Pure DataFrame -> DataFrame steps of the cluster report.

Nothing here reads or writes files or touches a SparkSession's configuration;
``job.py`` is the edge. Every function takes and returns DataFrames, so each
can be tested on a few hand-made rows. The record columns are those of
``schema.RECORD_SCHEMA`` (docs/metrics.md, schema v1).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pubsubclub.reports.schema import (
    COMMON_FIELDS,
    CORRUPT_COLUMN,
    COUNTER_KINDS,
    PARSE_SCHEMA,
    RECORD_SCHEMA,
    RECORD_TYPES,
    REQUIRED_FIELDS,
    SCHEMA_VERSION,
)

#: Longest raw line kept as an example of a bad record.
EXAMPLE_CHARS = 200

#: Hub topics starting with this are reserved for the cluster (``$nsd.log``, ``$cluster.gap``, and further
#: WAMP realms as ``$realm.<realm>#<topic>``; docs/architecture.md): no front-end takes such a name from a client.
INTERNAL_TOPIC_PREFIX = "$"

#: Percentiles of the latency table, as integers so that ranks are computed exactly.
PERCENTILES = (50, 90, 99)

_RECORD_COLUMNS = [f.name for f in RECORD_SCHEMA.fields]

#: What tells two good records apart for every table: all descriptive fields (``compact``).
_COMPACT_KEYS = ["v", "type", "node", "topic", "frontend", "kind", "peer", "reason", "origin", "bounds_ms", "name"]
_COMPACT_KEYS += ["peer_node", "role", "direction", "state"]


def _all_present(names: tuple[str, ...]) -> Column:
    cond = F.lit(True)
    for name in names:
        cond = cond & F.col(name).isNotNull()
    return cond


def _bad_reason() -> Column:
    """The first rule a parsed line breaks, or null for a good record (order: ``schema.BAD_REASONS``)."""
    v = F.col("v")
    kind = F.col("type")
    missing = ~_all_present(COMMON_FIELDS)
    for record_type, fields in REQUIRED_FIELDS.items():
        missing = missing | ((kind == record_type) & ~_all_present(fields))
    counter, latency = kind == "counter", kind == "latency"
    peer_needed = F.col("kind").isin("forwarded", "received") & F.col("peer").isNull()
    reason_needed = (F.col("kind") == "dropped") & F.col("reason").isNull()
    bucket_sum = F.aggregate("counts", F.lit(0).cast("long"), lambda acc, c: acc + F.coalesce(c, F.lit(0)))
    invalid = (
        (F.col("ts") < F.col("start"))
        | (counter & (~F.col("kind").isin(*COUNTER_KINDS) | (F.col("count") < 0) | (F.col("bytes") < 0)))
        | (
            latency
            & (
                (F.size("counts") != F.size("bounds_ms") + 1)
                | F.exists("counts", lambda c: c.isNull() | (c < 0))
                | (bucket_sum != F.col("count"))
            )
        )
    )
    return (
        F.when(v.isNotNull() & (v != SCHEMA_VERSION), "unknown_version")
        .when(F.col(CORRUPT_COLUMN).isNotNull(), "corrupt_json")
        .when(v.isNull(), "missing_fields")
        .when(kind.isNotNull() & ~kind.isin(*RECORD_TYPES), "unknown_type")
        .when(missing | (counter & (peer_needed | reason_needed)), "missing_fields")
        .when(invalid, "invalid_value")
    )


def parse_lines(lines: DataFrame) -> DataFrame:
    """Parse raw dump lines (column ``value``) against the declared schema and classify each one.

    Returns the ``RECORD_SCHEMA`` columns plus ``bad_reason`` (null for a good
    record, else one of ``schema.BAD_REASONS``), ``line`` (the raw line, kept
    only for bad records) and ``lines`` (1: the input lines a row stands for,
    see ``compact``). Blank lines are not records and are dropped.
    ``corrupt_json`` covers a line that is not a JSON object or has a field of
    the wrong type; a record whose ``v`` is readable but not 1 is
    ``unknown_version`` whatever else it holds.
    """
    parsed = lines.where(F.trim("value") != "").select(
        F.col("value").alias("line"),
        F.from_json("value", PARSE_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}).alias(
            "r"
        ),
    )
    return _classify(parsed.select("line", "r.*"), F.col("line"))


def classify_records(records: DataFrame) -> DataFrame:
    """Classify records read from Parquet dumps (the ``RECORD_SCHEMA`` columns) as ``parse_lines`` does lines.

    Same output columns as ``parse_lines``; a Parquet record cannot be
    ``corrupt_json`` (a damaged file is never read: docs/report.md), and a
    bad record's ``line`` is the record written as JSON.
    """
    with_corrupt = records.select(*_RECORD_COLUMNS, F.lit(None).cast("string").alias(CORRUPT_COLUMN))
    return _classify(with_corrupt, F.to_json(F.struct(*_RECORD_COLUMNS)))


def _classify(flat: DataFrame, line: Column) -> DataFrame:
    reason = _bad_reason()
    return flat.select(
        *_RECORD_COLUMNS,
        reason.alias("bad_reason"),
        F.when(reason.isNotNull(), line).alias("line"),
        F.lit(1).cast("long").alias("lines"),
    )


def valid_records(parsed: DataFrame) -> DataFrame:
    """The good records of ``parse_lines`` (or ``compact``) output, with exactly the ``RECORD_SCHEMA`` columns."""
    return parsed.where(F.col("bad_reason").isNull()).select(*_RECORD_COLUMNS)


def bad_record_counts(parsed: DataFrame) -> DataFrame:
    """Bad lines of ``parse_lines`` (or ``compact``) output counted by reason: ``reason``, ``lines``, ``example``.

    ``example`` is the smallest bad line of that reason (cut to ``EXAMPLE_CHARS``), a
    deterministic sample to show an operator.
    """
    return (
        parsed.where(F.col("bad_reason").isNotNull())
        .groupBy(F.col("bad_reason").alias("reason"))
        .agg(F.sum("lines").alias("lines"), F.min(F.substring("line", 1, EXAMPLE_CHARS)).alias("example"))
    )


def filter_window(parsed: DataFrame, since: float | None = None, until: float | None = None) -> DataFrame:
    """Rows of ``parse_lines`` output whose dump time ``ts`` lies in ``[since, until)``, and all bad lines.

    Times are epoch seconds; None leaves a side open. Bad lines are kept
    whatever their time (most have none) so that they are always counted.
    """
    keep = F.lit(True)
    if since is not None:
        keep = keep & (F.col("ts") >= F.lit(float(since)))
    if until is not None:
        keep = keep & (F.col("ts") < F.lit(float(until)))
    return parsed.where(F.col("bad_reason").isNotNull() | keep)


def compact(parsed: DataFrame) -> DataFrame:
    """Merge rows of ``parse_lines`` output that the tables cannot tell apart, in one aggregation.

    Good records of one type, node, minute of ``ts`` and identical descriptive
    fields (topic, frontend, kind, peer, reason, origin, bucket bounds, gauge
    name, link fields) become one row: ``count``, ``bytes``, ``sum_ms`` and
    latency ``counts`` (element-wise) are summed, ``start`` is the earliest and
    ``ts`` the latest, a gauge keeps its largest ``value``. Bad lines merge per
    ``bad_reason``, keeping the smallest ``line``. ``lines`` counts the input
    lines of each row. Every table below gives the same result on the
    compacted frame as on the rows themselves (filter by time first); the job
    uses it to shrink millions of records to a few thousand rows in one pass
    over the input.
    """
    bad = F.col("bad_reason").isNotNull()
    # Bucket bounds join the key as text: cheaper to hash than an array of doubles; Spark's
    # double -> string -> double round trip is exact.
    bounds_text = F.array_join(F.col("bounds_ms").cast("array<string>"), ",")
    keys = [F.when(~bad, bounds_text if k == "bounds_ms" else F.col(k)).alias(k) for k in _COMPACT_KEYS]
    keys.append(F.when(~bad, F.floor(F.col("ts") / 60)).alias("_minute"))
    keys.append(F.when(bad, F.substring("line", 1, EXAMPLE_CHARS)).alias("line"))
    # The pass over every input row keeps only fixed-width aggregation buffers
    # (Spark then hashes instead of sorting): latency buckets are exploded and
    # summed per position; a record's other numbers are taken on its first bucket.
    once = F.col("_pos").isNull() | (F.col("_pos") == 0)
    buckets = parsed.select("*", F.posexplode_outer("counts").alias("_pos", "_n"))
    per_bucket = buckets.groupBy("bad_reason", *keys, "_pos").agg(
        F.min("start").alias("start"),
        F.max("ts").alias("ts"),
        F.sum(F.when(once, F.col("count"))).alias("count"),
        F.sum(F.when(once, F.col("bytes"))).alias("bytes"),
        F.sum("_n").alias("_n"),
        F.sum(F.when(once, F.col("sum_ms"))).alias("sum_ms"),
        F.max("value").alias("value"),
        F.sum(F.when(once, F.col("lines"))).alias("lines"),
    )
    # Then, over the few rows left, the buckets go back into arrays. (One
    # branch: a filter on _pos here would be pushed below the aggregation
    # above and scan the input twice.)
    group = ["bad_reason", *_COMPACT_KEYS, "_minute", "line"]
    merged = per_bucket.groupBy(*group).agg(
        F.min("start").alias("start"),
        F.max("ts").alias("ts"),
        F.sum("count").alias("count"),
        F.sum("bytes").alias("bytes"),
        F.sort_array(F.collect_list(F.when(F.col("_pos").isNotNull(), F.struct("_pos", "_n")))).alias("_b"),
        F.sum("sum_ms").alias("sum_ms"),
        F.max("value").alias("value"),
        F.sum("lines").alias("lines"),
    )
    counts = F.when(F.size("_b") > 0, F.transform("_b", lambda b: b["_n"])).alias("counts")
    bounds = F.split("bounds_ms", ",").cast("array<double>").alias("bounds_ms")
    replace = {"counts": counts, "bounds_ms": bounds}
    columns = [replace.get(name, F.col(name)) for name in _RECORD_COLUMNS]
    return merged.select(*columns, "bad_reason", "line", "lines")


def observation_window(records: DataFrame) -> DataFrame:
    """One row: ``first_start``, ``last_ts`` and ``seconds`` between them, over all records."""
    return records.agg(F.min("start").alias("first_start"), F.max("ts").alias("last_ts")).withColumn(
        "seconds", F.col("last_ts") - F.col("first_start")
    )


def _kind_sums(with_bytes: bool = True) -> list[Column]:
    sums: list[Column] = []
    for kind in COUNTER_KINDS:
        is_kind = F.col("kind") == kind
        sums.append(F.sum(F.when(is_kind, F.col("count")).otherwise(F.lit(0))).alias(kind))
        if with_bytes:
            sums.append(F.sum(F.when(is_kind, F.col("bytes")).otherwise(F.lit(0))).alias(f"{kind}_bytes"))
    return sums


def topic_totals(records: DataFrame) -> DataFrame:
    """Per topic: count and bytes of each counter kind, and each count per second.

    Rates divide by the cluster-wide observed seconds (earliest ``start`` to
    latest ``ts`` over all records), the same for every topic so that rates
    compare; ``observed_seconds`` is a column; rates are null when it is 0.
    Columns: ``topic``, ``<kind>``, ``<kind>_bytes`` for each kind,
    ``observed_seconds``, ``<kind>_per_s``.
    """
    sums = records.where(F.col("type") == "counter").groupBy("topic").agg(*_kind_sums())
    window = observation_window(records).select(F.col("seconds").alias("observed_seconds"))
    rates = [
        F.when(F.col("observed_seconds") > 0, F.col(kind) / F.col("observed_seconds")).alias(f"{kind}_per_s")
        for kind in COUNTER_KINDS
    ]
    return sums.crossJoin(window).select("*", *rates)


def node_minute_series(records: DataFrame) -> DataFrame:
    """Per node and UTC minute (of the dump time ``ts``): count and bytes of each counter kind.

    Columns: ``node``, ``minute`` (timestamp of the minute's start), ``<kind>``, ``<kind>_bytes``.
    """
    minute = F.timestamp_seconds(F.floor(F.col("ts") / 60) * 60).alias("minute")
    return records.where(F.col("type") == "counter").groupBy("node", minute).agg(*_kind_sums())


def _internal(topic: Column) -> Column:
    return topic.startswith(INTERNAL_TOPIC_PREFIX)


def top_topics(totals: DataFrame, n: int) -> DataFrame:
    """The ``n`` most published topics (ties by name) from ``topic_totals`` output, ranked from 1.

    Internal topics (``INTERNAL_TOPIC_PREFIX``) are left out: see ``internal_topics``.
    Columns: ``rank``, ``topic``, ``published``, ``published_bytes``, ``published_per_s``, ``delivered``.
    """
    top = totals.where(~_internal(F.col("topic"))).orderBy(F.col("published").desc(), F.col("topic")).limit(n)
    rank = F.row_number().over(Window.orderBy(F.col("published").desc(), F.col("topic")))
    return top.select(rank.alias("rank"), "topic", "published", "published_bytes", "published_per_s", "delivered")


def internal_topics(totals: DataFrame) -> DataFrame:
    """The internal topics (``INTERNAL_TOPIC_PREFIX``) of ``topic_totals`` output, which ``top_topics`` leaves out.

    Columns: ``topic``, ``published``, ``delivered``, ``forwarded``, ``received``.
    """
    return totals.where(_internal(F.col("topic"))).select("topic", "published", "delivered", "forwarded", "received")


def fanout(records: DataFrame) -> DataFrame:
    """Per topic: deliveries per publish, ``delivered`` over ``published`` across all nodes.

    Columns: ``topic``, ``published``, ``delivered``, ``fanout`` (null when nothing was published).
    """
    sums = (
        records.where((F.col("type") == "counter") & F.col("kind").isin("published", "delivered"))
        .groupBy("topic")
        .agg(
            F.sum(F.when(F.col("kind") == "published", F.col("count")).otherwise(F.lit(0))).alias("published"),
            F.sum(F.when(F.col("kind") == "delivered", F.col("count")).otherwise(F.lit(0))).alias("delivered"),
        )
    )
    return sums.withColumn("fanout", F.when(F.col("published") > 0, F.col("delivered") / F.col("published")))


def traffic_matrix(records: DataFrame) -> DataFrame:
    """Node-to-node traffic from ``forwarded`` counters: ``node``, ``peer``, ``count``, ``bytes``."""
    return (
        records.where((F.col("type") == "counter") & (F.col("kind") == "forwarded"))
        .groupBy("node", "peer")
        .agg(F.sum("count").alias("count"), F.sum("bytes").alias("bytes"))
    )


def drops_by_reason(records: DataFrame) -> DataFrame:
    """Dropped messages per ``node``, ``frontend``, ``reason``: ``count``, ``bytes``."""
    return (
        records.where((F.col("type") == "counter") & (F.col("kind") == "dropped"))
        .groupBy("node", "frontend", "reason")
        .agg(F.sum("count").alias("count"), F.sum("bytes").alias("bytes"))
    )


def latency_percentiles(records: DataFrame) -> DataFrame:
    """Cross-node latency per (``origin``, receiving ``node``) from the histogram records.

    Buckets of all records of a pair are merged by upper bound. A percentile q
    is estimated as the upper bound of the first bucket whose cumulative count
    reaches rank ceil(q * count / 100): an upper bound of the true value,
    exact to the bucket. Records with different bucket bounds still merge
    soundly (the estimate stays an upper bound). When the rank falls in the
    overflow bucket the estimate is +infinity ("above the last bound").
    Columns: ``origin``, ``node``, ``count``, ``mean_ms``, ``p50_ms``, ``p90_ms``, ``p99_ms``.
    """
    lat = records.where(F.col("type") == "latency")
    moments = lat.groupBy("origin", "node").agg(
        F.sum("count").alias("count"),
        F.when(F.sum("count") > 0, F.sum("sum_ms") / F.sum("count")).alias("mean_ms"),
    )
    upper = F.when(F.col("pos") < F.size("bounds_ms"), F.element_at("bounds_ms", F.col("pos") + 1)).otherwise(
        F.lit(float("inf"))
    )
    buckets = (
        lat.select("origin", "node", "bounds_ms", F.posexplode("counts").alias("pos", "n"))
        .groupBy("origin", "node", upper.alias("upper"))
        .agg(F.sum("n").alias("n"))
    )
    pair = Window.partitionBy("origin", "node")
    cumulative = buckets.select(
        "origin",
        "node",
        "upper",
        F.sum("n").over(pair.orderBy("upper").rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("cum"),
        F.sum("n").over(pair).alias("total"),
    )
    estimates = [
        F.min(
            F.when(
                (F.col("total") > 0) & (F.col("cum") * 100 >= F.col("total") * q), F.col("upper")
            )  # cum >= ceil(q*total/100), in integers
        ).alias(f"p{q}_ms")
        for q in PERCENTILES
    ]
    percentiles = cumulative.groupBy("origin", "node").agg(*estimates)
    return moments.join(percentiles, ["origin", "node"], "left").select(
        "origin", "node", "count", "mean_ms", *[f"p{q}_ms" for q in PERCENTILES]
    )
