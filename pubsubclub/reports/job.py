"""The report job's edge: read the dumps, run the transforms, write Parquet, ``report.html`` and a summary.

A plain library: ``pubsubclub report`` calls it, and under ``spark-submit``
the small entry module :mod:`pubsubclub.reports.submit` does (docs/report.md).
Progress goes to stderr as ``[k/6] ...`` lines plus Spark's console progress bar.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pubsubclub.reports import page
from pubsubclub.reports import transforms as X

#: Settings the job starts Spark with; ``conf`` given to ``run_report`` wins.
DEFAULT_CONF = {
    "spark.app.name": "pubsubclub-report",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    # The validation CASE is referenced by every compaction key; Catalyst's
    # constraint propagation then grows without bound (OutOfMemoryError while
    # planning). The job gains nothing from inferred constraints.
    "spark.sql.constraintPropagation.enabled": "false",
}

#: Sort order of each written table ("-" first: descending), so that Parquet files and the page read the same.
TABLE_ORDER: dict[str, list[str]] = {
    "topic_totals": ["-published", "topic"],
    "node_minute": ["node", "minute"],
    "top_topics": ["rank"],
    "internal_topics": ["-published", "topic"],
    "fanout": ["topic"],
    "traffic_matrix": ["node", "peer"],
    "drops": ["node", "frontend", "reason"],
    "latency": ["origin", "node"],
    "bad_records": ["reason"],
}

STEPS = 6


class InputError(Exception):
    """The metrics location does not exist."""


class NoRecordsError(Exception):
    """No dump files, or no valid record in them (or in the time window)."""


@dataclass(frozen=True)
class ReportResult:
    """What one report run produced."""

    out: Path
    records: int
    bad: dict[str, int]
    tables: dict[str, Path]
    html: Path
    top_topic: str | None
    observed_seconds: float | None
    seconds: float
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)


def as_utc(value: Any) -> Any:
    """A timestamp collected from Spark as an aware UTC datetime; any other value as it is.

    PySpark turns a timestamp column into a naive datetime in the driver's
    local time zone (not ``spark.sql.session.timeZone``), so the page, which
    labels times UTC, would be off by the local offset.
    """
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone(UTC)  # a naive datetime is taken as local time, fold included
    return value


def _page_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: as_utc(v) for k, v in row.items()}


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _is_local(location: str) -> bool:
    return "://" not in location or location.startswith("file://")


def _count_dump_files(location: str) -> int:
    root = Path(location.removeprefix("file://"))
    if not root.exists():
        raise InputError(f"no such folder: {location}")
    if root.is_file():
        return 1
    return sum(1 for _dir, _subdirs, files in os.walk(root) for name in files if name.endswith(".jsonl"))


def start_spark(master: str | None, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on ``master`` (None: what spark-submit set, else ``local[*]``) with ``DEFAULT_CONF``."""
    builder = SparkSession.builder
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: nobody chose a master
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    if master is not None and spark.sparkContext.master != master:
        raise RuntimeError(f"this process already runs Spark on {spark.sparkContext.master}, not {master}")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_lines(spark: SparkSession, location: str) -> DataFrame:
    """Every line of every ``*.jsonl`` file under ``location`` (one ``value`` column).

    Hive folders (``node=``/``date=``/``hour=``) are walked but not turned into
    columns: records carry their node and times. ``.tmp`` files being written
    are skipped.
    """
    return spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", "*.jsonl").text(location)


def build_tables(records: DataFrame, top: int) -> dict[str, DataFrame]:
    """The report's tables from valid (possibly compacted) records, by name."""
    totals = X.topic_totals(records)
    return {
        "topic_totals": totals,
        "node_minute": X.node_minute_series(records),
        "top_topics": X.top_topics(totals, top),
        "internal_topics": X.internal_topics(totals),
        "fanout": X.fanout(records),
        "traffic_matrix": X.traffic_matrix(records),
        "drops": X.drops_by_reason(records),
        "latency": X.latency_percentiles(records),
    }


def run_report(
    metrics_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    master: str | None = "local[2]",
    since: float | None = None,
    until: float | None = None,
    *,
    top: int = 10,
    conf: dict[str, str] | None = None,
    spark: SparkSession | None = None,
    progress: Callable[[str], None] = _stderr,
) -> ReportResult:
    """Build the report of the dumps under ``metrics_dir`` into ``out_dir``.

    Uses ``spark`` if given (and leaves it running), else starts a session on
    ``master`` and stops it at the end. Raises ``InputError`` when a local
    ``metrics_dir`` does not exist and ``NoRecordsError`` when it holds no
    dump file or no valid record in ``[since, until)``.
    """
    began = time.monotonic()
    location, out = os.fspath(metrics_dir), Path(out_dir)
    if _is_local(location) and _count_dump_files(location) == 0:
        raise NoRecordsError(f"no metrics files (*.jsonl) under {location}")
    own_session = spark is None
    progress(f"{time.monotonic() - began:6.1f}s [1/{STEPS}] starting Spark ({master or 'from spark-submit'})")
    session = spark or start_spark(master, conf)
    try:
        return _run(session, location, out, since, until, top, progress, began)
    finally:
        if own_session:
            session.stop()


def _run(
    spark: SparkSession,
    location: str,
    out: Path,
    since: float | None,
    until: float | None,
    top: int,
    progress: Callable[[str], None],
    began: float,
) -> ReportResult:
    progress(f"{time.monotonic() - began:6.1f}s [2/{STEPS}] reading, parsing, compacting {location} (one pass)")
    parsed = X.parse_lines(read_lines(spark, location))
    compacted = X.compact(X.filter_window(parsed, since, until)).cache()
    try:
        bad_rows = [r.asDict() for r in X.bad_record_counts(compacted).orderBy("reason").collect()]
        bad = {r["reason"]: r["lines"] for r in bad_rows}
        records = X.valid_records(compacted)
        count = compacted.where(F.col("bad_reason").isNull()).agg(F.sum("lines")).first()
        valid = int(count[0] or 0) if count is not None else 0
        if valid == 0:
            what = "in the time window" if since is not None or until is not None else "in the dumps"
            skipped = ", ".join(f"{n:,} {reason}" for reason, n in bad.items()) or "none"
            raise NoRecordsError(f"no valid records {what} under {location} (bad lines: {skipped})")

        progress(f"{time.monotonic() - began:6.1f}s [3/{STEPS}] computing tables from {valid:,} records")
        tables = build_tables(records, top)
        tables["bad_records"] = X.bad_record_counts(compacted)
        progress(f"{time.monotonic() - began:6.1f}s [4/{STEPS}] writing Parquet under {out}")
        paths: dict[str, Path] = {}
        rows: dict[str, list[dict[str, Any]]] = {}
        for name, frame in tables.items():
            path = out / name
            order = [F.col(c[1:]).desc() if c.startswith("-") else F.col(c) for c in TABLE_ORDER[name]]
            # Tables are small: one sorted partition, kept for the page.
            ordered = frame.coalesce(1).sortWithinPartitions(*order).cache()
            ordered.write.mode("overwrite").parquet(str(path))
            paths[name] = path
            rows[name] = [_page_row(r.asDict()) for r in ordered.collect()]
            ordered.unpersist()
        rows["window"] = [_page_row(r.asDict()) for r in X.observation_window(records).collect()]
    finally:
        compacted.unpersist()

    progress(f"{time.monotonic() - began:6.1f}s [5/{STEPS}] writing {out / 'report.html'}")
    html = out / "report.html"
    data = page.PageData(location, valid, (since, until), bad_rows, rows)
    html.write_text(page.render(data), encoding="utf-8")
    progress(f"{time.monotonic() - began:6.1f}s [6/{STEPS}] done in {time.monotonic() - began:.1f} s")
    top_rows = rows["top_topics"]
    return ReportResult(
        out=out,
        records=valid,
        bad=bad,
        tables=paths,
        html=html,
        top_topic=top_rows[0]["topic"] if top_rows else None,
        observed_seconds=rows["window"][0]["seconds"],
        seconds=time.monotonic() - began,
        rows=rows,
    )


def print_summary(result: ReportResult, file: Any = None) -> None:
    """A few lines for the console: records, bad lines, top topics, where the output is."""
    out = file or sys.stdout
    bad = sum(result.bad.values())
    print(f"records: {result.records:,} valid, {bad:,} bad lines skipped", file=out)
    for reason, n in result.bad.items():
        print(f"  bad {reason}: {n:,}", file=out)
    if result.observed_seconds is not None:
        print(f"observed: {result.observed_seconds:,.0f} s", file=out)
    print(f"top topic: {result.top_topic or '-'}", file=out)
    for r in result.rows.get("top_topics", [])[:5]:
        print(f"  {r['rank']:>2}. {r['topic']}  {r['published']:,} published, {r['delivered']:,} delivered", file=out)
    drops = sum(r["count"] for r in result.rows.get("drops", []))
    forwarded = sum(r["count"] for r in result.rows.get("traffic_matrix", []))
    print(f"forwarded between nodes: {forwarded:,}; dropped: {drops:,}", file=out)
    print(f"tables: {result.out}/<table>/ (Parquet); page: {result.html}", file=out)
    print(f"took {result.seconds:.1f} s", file=out)
