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
#: The columns ``compact`` sums (or takes the least or greatest of).
_NUMBERS = ["start", "ts", "count", "bytes", "sum_ms", "value", "lines"]


def _all_present(names: tuple[str, ...]) -> Column:
    cond = F.lit(True)
    for name in names:
        cond = cond & F.col(name).isNotNull()
    return cond


def _bad_buckets(counts: Column, count: Column, copies: Column | None = None) -> Column:
    """True when latency ``counts`` hold a null or negative bucket or do not sum to ``count``.

    With ``copies``, ``count`` is the total of that many copies of one record.

    Higher-order functions, which Spark interprets: evaluated per input row
    they cost about 3 s of CPU per million rows whatever the record type
    (docs/benchmarks.md), hence ``check_buckets=False`` and ``compact_latency``.
    """
    bucket_sum = F.aggregate(counts, F.lit(0).cast("long"), lambda acc, c: acc + F.coalesce(c, F.lit(0)))
    total = bucket_sum if copies is None else bucket_sum * copies
    return F.exists(counts, lambda c: c.isNull() | (c < 0)) | (total != count)


def _bad_reason(check_buckets: bool = True) -> Column:
    """The first rule a parsed line breaks, or null for a good record (order: ``schema.BAD_REASONS``).

    Without ``check_buckets`` a latency record's buckets are only checked for
    their number (one more than the bounds); ``compact_latency`` checks the rest.
    """
    v = F.col("v")
    kind = F.col("type")
    missing = ~_all_present(COMMON_FIELDS)
    for record_type, fields in REQUIRED_FIELDS.items():
        missing = missing | ((kind == record_type) & ~_all_present(fields))
    counter, latency = kind == "counter", kind == "latency"
    peer_needed = F.col("kind").isin("forwarded", "received") & F.col("peer").isNull()
    reason_needed = (F.col("kind") == "dropped") & F.col("reason").isNull()
    bad_latency = F.size("counts") != F.size("bounds_ms") + 1
    if check_buckets:
        bad_latency = bad_latency | _bad_buckets(F.col("counts"), F.col("count"))
    invalid = (
        (F.col("ts") < F.col("start"))
        | (counter & (~F.col("kind").isin(*COUNTER_KINDS) | (F.col("count") < 0) | (F.col("bytes") < 0)))
        | (latency & bad_latency)
    )
    return (
        F.when(v.isNotNull() & (v != SCHEMA_VERSION), "unknown_version")
        .when(F.col(CORRUPT_COLUMN).isNotNull(), "corrupt_json")
        .when(v.isNull(), "missing_fields")
        .when(kind.isNotNull() & ~kind.isin(*RECORD_TYPES), "unknown_type")
        .when(missing | (counter & (peer_needed | reason_needed)), "missing_fields")
        .when(invalid, "invalid_value")
    )


def parse_lines(lines: DataFrame, *, check_buckets: bool = True) -> DataFrame:
    """Parse raw dump lines (column ``value``) against the declared schema and classify each one.

    Returns the ``RECORD_SCHEMA`` columns plus ``bad_reason`` (null for a good
    record, else one of ``schema.BAD_REASONS``), ``line`` (the raw line, kept
    only for bad records) and ``lines`` (1: the input lines a row stands for,
    see ``compact``). Blank lines are not records and are dropped.
    ``corrupt_json`` covers a line that is not a JSON object or has a field of
    the wrong type; a record whose ``v`` is readable but not 1 is
    ``unknown_version`` whatever else it holds.

    ``check_buckets=False`` is for input that goes to ``compact``: a latency
    record's buckets are then checked there, once per distinct record instead
    of on every row, and its ``line`` is kept to name it if it is bad. Every
    other rule is applied here either way.
    """
    parsed = lines.where(F.trim("value") != "").select(
        F.col("value").alias("line"),
        F.from_json("value", PARSE_SCHEMA, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}).alias(
            "r"
        ),
    )
    return _classify(parsed.select("line", "r.*"), F.col("line"), check_buckets)


def classify_records(records: DataFrame, *, check_buckets: bool = True) -> DataFrame:
    """Classify records read from Parquet dumps (the ``RECORD_SCHEMA`` columns) as ``parse_lines`` does lines.

    Same output columns and ``check_buckets`` as ``parse_lines``; a Parquet
    record cannot be ``corrupt_json`` (a damaged file is never read:
    docs/report.md), and a bad record's ``line`` is the record written as JSON.
    """
    with_corrupt = records.select(*_RECORD_COLUMNS, F.lit(None).cast("string").alias(CORRUPT_COLUMN))
    return _classify(with_corrupt, F.to_json(F.struct(*_RECORD_COLUMNS)), check_buckets)


def _classify(flat: DataFrame, line: Column, check_buckets: bool) -> DataFrame:
    # The reason in a step of its own: ``line`` reads the column instead of a second copy of its
    # expression (half the generated code to compile).
    reasoned = flat.select("*", _bad_reason(check_buckets).alias("bad_reason"))
    keep_line = F.col("bad_reason").isNotNull()
    if not check_buckets:
        keep_line = keep_line | (F.col("type") == "latency")
    return reasoned.select(
        *_RECORD_COLUMNS,
        "bad_reason",
        F.when(keep_line, line).alias("line"),
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


def compact(parsed: DataFrame, *, by_minute: bool = True) -> DataFrame:
    """Merge rows of ``parse_lines`` output that the tables cannot tell apart, in one pass over them.

    Good records of one type, node, minute of ``ts`` and identical descriptive
    fields (topic, frontend, kind, peer, reason, origin, bucket bounds, gauge
    name, link fields) become one row: ``count``, ``bytes``, ``sum_ms`` and
    latency ``counts`` (element-wise) are summed, ``start`` is the earliest and
    ``ts`` the latest, a gauge keeps its largest ``value``. Bad lines merge per
    ``bad_reason`` and example (the line's first ``EXAMPLE_CHARS``). ``lines``
    counts the input lines of each row. Every table below gives the same result on the
    compacted frame as on the rows themselves (filter by time first); the job
    uses it to shrink millions of records to a fraction of them in one pass
    over the input. ``compact_pass`` then ``compact_latency``; input parsed
    with ``check_buckets=False`` gets its latency buckets checked here.
    Compacted rows can be compacted again; ``by_minute=False`` merges across
    minutes too (every table but ``node_minute_series`` stays the same).
    """
    return compact_latency(compact_pass(parsed, by_minute=by_minute))


def compact_pass(parsed: DataFrame, *, by_minute: bool = True) -> DataFrame:
    """The aggregation of ``compact`` over every input row; its output is only for ``compact_latency``.

    One hash aggregation with fixed-width sums and nothing per row but
    compiled expressions. Latency records are not merged here: each distinct
    latency record (its ``line`` when kept, else its ``counts``) stays one
    row with its bucket array as part of the key, so that ``compact_latency``
    can check and merge the few of them. Bucket bounds are a text column.
    """
    bad = F.col("bad_reason").isNotNull()
    latency = ~bad & (F.col("type") == "latency")
    # Bucket bounds join the key as text: cheaper to hash than an array of doubles; Spark's
    # double -> string -> double round trip is exact.
    bounds_text = F.array_join(F.col("bounds_ms").cast("array<string>"), ",")
    keys = [F.when(~bad, bounds_text if k == "bounds_ms" else F.col(k)).alias(k) for k in _COMPACT_KEYS]
    minute = F.floor(F.col("ts") / 60) if by_minute else F.lit(0).cast("long")
    keys.append(F.when(~bad, minute).alias("_minute"))
    keys.append(F.when(bad, F.substring("line", 1, EXAMPLE_CHARS)).alias("line"))
    # Identical lines are identical records (good or bad alike), so checking a
    # group checks each of its records; rows already checked have no line.
    keys.append(F.when(latency, F.col("line")).alias("_record"))
    keys.append(F.when(latency, F.col("counts")).alias("counts"))
    return parsed.groupBy("bad_reason", *keys).agg(*_sums(), F.count(F.lit(1)).alias("_copies"))


#: The fields the tables tell good records of each type apart by (``compact_grains``); gauges and links
#: count only in the observation window and the number of records, so they keep none.
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "counter": ("node", "topic", "frontend", "kind", "peer", "reason"),
    "latency": ("node", "origin", "bounds_ms"),
}
#: The key columns of ``compact_grains`` across minutes, and per minute (``node_minute_series`` needs no more).
_OVERALL_KEYS = ["bad_reason", "type", "node", "topic", "frontend", "kind", "peer", "reason", "origin", "bounds_ms"]
_OVERALL_KEYS += ["line", "_record", "counts"]
_MINUTE_KEYS = ["bad_reason", "type", "node", "kind", "_minute"]


def compact_grains(parsed: DataFrame) -> DataFrame:
    """Rows of ``parse_lines`` output merged for the tables at two grains by one aggregation.

    For ``grain_overall`` (every table but the per-minute one) and
    ``grain_minutes`` (``node_minute_series``); each input row counts in both
    (grouping sets). Across minutes, good records merge by type and the
    ``TABLE_KEYS`` of their type, every other field left null; per minute,
    good counter records merge by node, kind and minute of ``ts``. Bad lines
    merge by reason and example, and each distinct latency record stays one
    row, as in ``compact_pass``. What ``compact`` keeps per minute (every
    descriptive field) was about a tenth of the input for the synthetic
    10 M records, and that aggregation with its 21 keys most of the pass's
    cost; these two grains are a few thousand rows each (docs/benchmarks.md).
    Keep the result (a local checkpoint) before reading both halves: each half
    planned on its own re-runs the pass.
    """
    bad = F.col("bad_reason").isNotNull()
    of_type = {t: ~bad & (F.col("type") == t) for t in TABLE_KEYS}
    # Bucket bounds join the key as text: cheaper to hash than an array of doubles; Spark's
    # double -> string -> double round trip is exact.
    bounds_text = F.array_join(F.col("bounds_ms").cast("array<string>"), ",")
    keys = []
    for key in _OVERALL_KEYS[2:10]:
        types = [of_type[t] for t, fields in TABLE_KEYS.items() if key in fields]
        kept = types[0] if len(types) == 1 else types[0] | types[1]
        keys.append(F.when(kept, bounds_text if key == "bounds_ms" else F.col(key)).alias(key))
    keyed = parsed.select(
        "bad_reason",
        F.when(~bad, F.col("type")).alias("type"),
        *keys,
        F.when(bad, F.substring("line", 1, EXAMPLE_CHARS)).alias("line"),
        # Identical lines are identical records (good or bad alike), so checking a
        # group checks each of its records; rows already checked have no line.
        F.when(of_type["latency"], F.col("line")).alias("_record"),
        F.when(of_type["latency"], F.col("counts")).alias("counts"),
        F.when(of_type["counter"], F.floor(F.col("ts") / 60)).alias("_minute"),
        *_NUMBERS,
    )
    return keyed.groupingSets([_OVERALL_KEYS, _MINUTE_KEYS], *_OVERALL_KEYS, "_minute").agg(
        *_sums(), F.count(F.lit(1)).alias("_copies"), F.grouping("_minute").alias("_overall")
    )


def grain_overall(grains: DataFrame) -> DataFrame:
    """The rows of ``compact_grains`` output merged across minutes, in ``compact_pass`` columns for ``compact_latency``.

    ``compact_latency`` of them holds what ``compact(..., by_minute=False)``
    holds for the tables: every table but ``node_minute_series`` and
    ``bad_record_counts`` gives the same on both; descriptive fields outside
    ``TABLE_KEYS`` are null (``v`` is 1 for good records, as it must be).
    """
    good = F.col("bad_reason").isNull()
    fill = {
        "v": F.when(good, F.lit(SCHEMA_VERSION).cast("long")),
        "_minute": F.when(good, F.lit(0).cast("long")),
    }
    columns = [
        F.col(k) if k in _OVERALL_KEYS else fill.get(k, F.lit(None).cast("string")).alias(k)
        for k in [*_COMPACT_KEYS, "_minute", "line", "_record", "counts"]
    ]
    return grains.where(F.col("_overall") == 1).select("bad_reason", *columns, *_NUMBERS, "_copies")


def grain_minutes(grains: DataFrame) -> DataFrame:
    """Good counter records of ``compact_grains`` output merged per node, kind and minute, for ``node_minute_series``.

    ``RECORD_SCHEMA`` columns; those the merge does not keep (topic, frontend, peer, ...) are null.
    """
    counters = F.col("bad_reason").isNull() & (F.col("type") == "counter") & F.col("_minute").isNotNull()
    kept = {*_MINUTE_KEYS, *_NUMBERS}
    columns = [F.col(f.name) if f.name in kept else F.lit(None).cast(f.dataType).alias(f.name) for f in RECORD_SCHEMA]
    return grains.where((F.col("_overall") == 0) & counters).select(*columns)


def _sums() -> list[Column]:
    """How ``compact`` merges the numbers of the rows of one group (columns ``_NUMBERS``)."""
    return [
        F.min("start").alias("start"),
        F.max("ts").alias("ts"),
        F.sum("count").alias("count"),
        F.sum("bytes").alias("bytes"),
        F.sum("sum_ms").alias("sum_ms"),
        F.max("value").alias("value"),
        F.sum("lines").alias("lines"),
    ]


def compact_latency(passed: DataFrame) -> DataFrame:
    """Finish ``compact`` on ``compact_pass`` output: check the latency buckets, merge latency rows, restore columns.

    A latency row of ``compact_pass`` is ``_copies`` copies of one record (or
    of rows already checked, with equal buckets). Buckets with a null or
    negative count, or whose sum is not ``count``, make it ``invalid_value``
    with its line as the example, as ``parse_lines`` would have; the good ones
    merge per minute like every other record, buckets summed element-wise.
    Every other row passes through; the result has ``parse_lines``' columns.
    """
    is_latency = F.col("bad_reason").isNull() & (F.col("type") == "latency")
    group = [*_COMPACT_KEYS, "_minute", "line"]
    broken = _bad_buckets(F.col("counts"), F.col("count"), F.col("_copies"))
    lat = passed.where(is_latency).withColumn("_broken", broken)
    # Few rows from here on: the higher-order functions cost nothing that matters.
    each = F.transform("counts", lambda c: c * F.col("_copies")).alias("_each")
    good = (
        lat.where(~F.col("_broken"))
        .select("*", each)
        .groupBy("bad_reason", *group)
        .agg(*_sums(), F.collect_list("_each").alias("_all"))
    )
    zeros = F.array_repeat(F.lit(0).cast("long"), F.size(F.col("_all")[0]))
    summed = F.aggregate("_all", zeros, lambda acc, a: F.zip_with(acc, a, lambda x, y: x + y))
    nulls = {k: F.lit(None).cast(passed.schema[k].dataType) for k in [*_COMPACT_KEYS, "_minute"]}
    bad = lat.where(F.col("_broken")).select(
        F.lit("invalid_value").alias("bad_reason"),
        *[nulls[k].alias(k) for k in _COMPACT_KEYS],
        nulls["_minute"].alias("_minute"),
        F.substring("_record", 1, EXAMPLE_CHARS).alias("line"),
        *_NUMBERS,
        F.lit(None).cast("array<bigint>").alias("counts"),
    )
    rows = [
        passed.where(~is_latency).select("bad_reason", *group, *_NUMBERS, "counts"),
        good.select("bad_reason", *group, *_NUMBERS, summed.alias("counts")),
        bad,
    ]
    merged = rows[0].unionByName(rows[1]).unionByName(rows[2])
    bounds = F.split("bounds_ms", ",").cast("array<double>").alias("bounds_ms")
    columns = [bounds if name == "bounds_ms" else F.col(name) for name in _RECORD_COLUMNS]
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
