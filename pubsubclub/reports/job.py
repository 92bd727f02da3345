"""The report job's edge: read the dumps, run the transforms, write Parquet, ``report.html`` and a summary.

Dumps are JSON lines (parsed against the declared schema) or Parquet (read
natively with the same schema), mixed freely; a dump written in both formats
is read once, from its Parquet copy, and a damaged Parquet file is skipped
with a warning (docs/report.md, "Input").

A plain library: ``pubsubclub report`` calls it, and under ``spark-submit``
the small entry module :mod:`pubsubclub.reports.submit` does (docs/report.md).
Progress goes to stderr as ``[k/6] ...`` lines plus Spark's console progress bar.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pubsubclub.core.dumpfile import MERGED_PREFIX, covered_files
from pubsubclub.reports import page
from pubsubclub.reports import transforms as X
from pubsubclub.reports.schema import RECORD_SCHEMA

#: Suffixes of the dump files the report reads (docs/metrics.md).
JSONL, PARQUET = ".jsonl", ".parquet"
#: Every Parquet file starts and ends with these four bytes.
PARQUET_MAGIC = b"PAR1"

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
    # In local mode this is the executor's heap too: 1 GiB (Spark's default)
    # spills the compacted rows of 10 million records to disk.
    "spark.driver.memory": "3g",
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
#: Tables written at once (threads of the driver, each running its table's Spark jobs).
TABLE_WRITERS = 3


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
    #: Dump files left unread, as (path, why): damaged Parquet files.
    skipped: list[tuple[str, str]] = field(default_factory=list)


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


@dataclass(frozen=True)
class DumpFiles:
    """What to read: the JSON-lines and Parquet files, or None for "every such file under the location"."""

    jsonl: list[str] | None
    parquet: list[str] | None
    #: Files left out, as (path, why).
    skipped: list[tuple[str, str]]
    #: Files of each format found (before leaving any out).
    found: dict[str, int]


def parquet_damage(path: str | os.PathLike[str]) -> str | None:
    """Why the file at ``path`` cannot be a whole Parquet file (cut short, not Parquet), or None.

    Checks what a file cut short loses first: the trailing magic and footer
    length. A file whose bytes are damaged in the middle passes; Spark skips
    it when it fails to read it (``ignoreCorruptFiles``).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            if size < 12:
                return f"{size} bytes: too short for a Parquet file (cut short?)"
            f.seek(size - 8)
            tail = f.read(8)
    except OSError as e:
        return f"cannot read it: {e.strerror}"
    if head != PARQUET_MAGIC:
        return "does not start like a Parquet file"
    if tail[4:] != PARQUET_MAGIC:
        return "no Parquet footer at its end (cut short while being written or copied?)"
    if int.from_bytes(tail[:4], "little") > size - 12:
        return "its footer length is larger than the file (damaged)"
    return None


def _local_files(location: str) -> list[str]:
    root = Path(location.removeprefix("file://"))
    if not root.exists():
        raise InputError(f"no such folder: {location}")
    if root.is_file():
        return [str(root)]
    return [
        os.path.join(folder, name)
        for folder, _subdirs, files in os.walk(root)
        for name in files
        if name.endswith((JSONL, PARQUET)) and not name.startswith((".", "_"))
    ]


def plan_files(found: list[str], check: Callable[[str], str | None] | None = parquet_damage) -> DumpFiles:
    """Which of the ``found`` dump files to read.

    A Parquet file that ``check`` finds damaged is skipped; a JSON-lines file
    with a readable Parquet twin (the same dump, written in both formats) is
    not read, and neither is a dump whose records a readable merged Parquet
    file beside it holds (``dumpfile.covered_files``: left by a node's merge
    cut short), so each dump counts once. When nothing is left out, the lists
    are None: Spark reads every such file under the location itself.
    """
    parquet = [p for p in found if p.endswith(PARQUET)]
    jsonl = [p for p in found if p.endswith(JSONL)]
    skipped: list[tuple[str, str]] = []
    readable = []
    for path in parquet:
        why = check(path) if check else None
        if why:
            skipped.append((path, why))
        else:
            readable.append(path)
    covered = _covered([*readable, *jsonl])
    kept = [p for p in readable if p not in covered]
    twins = {p[: -len(PARQUET)] for p in readable}
    alone = [p for p in jsonl if p[: -len(JSONL)] not in twins and p not in covered]
    counts = {"jsonl": len(jsonl), "parquet": len(parquet)}
    return DumpFiles(
        None if len(alone) == len(jsonl) else alone,
        None if len(kept) == len(parquet) else kept,
        sorted(skipped),
        counts,
    )


def _covered(paths: list[str]) -> set[str]:
    """The ``paths`` whose records a merged Parquet file among ``paths``, in the same folder, holds."""
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        by_folder.setdefault(folder, []).append(name)
    return {
        f"{folder}/{name}" if folder else name
        for folder, names in by_folder.items()
        if any(n.startswith(MERGED_PREFIX) for n in names)
        for name in covered_files(names)
    }


#: Said after "no metrics files ... under DIR": where dumps come from.
NO_FILES_HINT = (
    "; --metrics takes the folder nodes write with --metrics-dir DIR (every --metrics-interval seconds),"
    " or make synthetic dumps with pubsubclub report --generate N --out DIR"
)


def master_label(master: str | None, spark: SparkSession | None = None, environ: Any = os.environ) -> str:
    """What the progress line says Spark runs on: the given session's master, --master, spark-submit's, or local[*]."""
    if spark is not None:
        return f"the session given, {spark.sparkContext.master}"
    if master is not None:
        return master
    if "PYSPARK_GATEWAY_PORT" in environ:  # under spark-submit, as start_spark decides
        return "the master spark-submit chose"
    return "local[*]: no --master given"


def worker_python(master: str | None, environ: Any = os.environ) -> str | None:
    """The interpreter Spark's Python workers must run for ``master``, where the process has to say; None: leave it.

    PySpark starts its workers with ``PYSPARK_PYTHON``, else whatever ``python3`` is on the ``PATH``,
    and they refuse to run another minor version than the driver's. In local mode (``master`` None
    outside spark-submit, or ``local...``) the workers run on this host, so this very interpreter
    (``sys.executable``, the venv the report was installed in) is the one that fits; a cluster's
    hosts, spark-submit and an explicit ``PYSPARK_PYTHON`` choose their own.
    """
    if "PYSPARK_PYTHON" in environ:
        return None
    if master is None:
        if "PYSPARK_GATEWAY_PORT" in environ:  # under spark-submit: it set up the workers' Python
            return None
        master = "local[*]"
    return sys.executable if master.startswith("local") else None


def start_spark(master: str | None, conf: dict[str, str] | None = None) -> SparkSession:
    """A SparkSession on ``master`` (None: what spark-submit set, else ``local[*]``) with ``DEFAULT_CONF``."""
    builder = SparkSession.builder
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    if master is not None:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: nobody chose a master
        builder = builder.master("local[*]")
    python = worker_python(master)
    if python is not None:
        # Read by the SparkContext as it starts (not afterwards): workers of the driver's own version.
        os.environ["PYSPARK_PYTHON"] = python
    spark = builder.getOrCreate()
    if master is not None and spark.sparkContext.master != master:
        raise RuntimeError(f"this process already runs Spark on {spark.sparkContext.master}, not {master}")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _reader(spark: SparkSession, suffix: str) -> Any:
    return spark.read.option("recursiveFileLookup", "true").option("pathGlobFilter", f"*{suffix}")


#: What :func:`read_lines` gives: one line per row.
LINES = StructType([StructField("value", StringType())])


def _empty(spark: SparkSession, schema: StructType) -> DataFrame:
    """A frame of no rows with ``schema`` (every column nullable), made in the JVM.

    ``spark.createDataFrame([], schema)`` would pass its (empty) Python rows
    through a Python worker on an executor: executors would need Python, of
    the driver's minor version (PySpark refuses another), for no data.
    """
    return spark.range(0).select(*(F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields))


def read_lines(spark: SparkSession, location: str, files: list[str] | None = None) -> DataFrame:
    """Every line of every ``*.jsonl`` file under ``location``, or of ``files`` (one ``value`` column).

    Hive folders (``node=``/``date=``/``hour=``) are walked but not turned into
    columns: records carry their node and times. ``.tmp`` files being written
    are skipped.
    """
    if files is not None:
        return spark.read.text(files) if files else _empty(spark, LINES)
    return _reader(spark, JSONL).text(location)


def read_parquet(spark: SparkSession, location: str, files: list[str] | None = None) -> DataFrame:
    """Every record of every ``*.parquet`` dump under ``location``, or of ``files``, with ``RECORD_SCHEMA``.

    The schema is given, not read from the files (no pass over footers);
    a column a file lacks is null. A file Spark cannot read is skipped
    (``ignoreCorruptFiles``) instead of failing the job.
    """
    reader = _reader(spark, PARQUET).schema(RECORD_SCHEMA).option("ignoreCorruptFiles", "true")
    if files is not None:
        return reader.parquet(*files) if files else _empty(spark, RECORD_SCHEMA)
    return reader.parquet(location)


def list_files(spark: SparkSession, location: str) -> list[str]:
    """The dump files under a location that is not local (``hdfs://``, ``s3a://``, ...), listed by Spark."""
    found: list[str] = []
    for suffix in (JSONL, PARQUET):
        try:
            found += _reader(spark, suffix).text(location).inputFiles()
        except AnalysisException as e:
            if "PATH_NOT_FOUND" in str(e) or "Path does not exist" in str(e):
                raise InputError(f"no such folder: {location}") from None
            raise
    return found


def read_records(spark: SparkSession, location: str, files: DumpFiles) -> DataFrame:
    """The classified records of every dump to read (``transforms.parse_lines`` columns), both formats in one frame.

    For ``transforms.compact`` only: latency buckets are left for it to check.
    """
    parts = []
    if files.found["jsonl"]:
        parts.append(X.parse_lines(read_lines(spark, location, files.jsonl), check_buckets=False))
    if files.found["parquet"]:
        parts.append(X.classify_records(read_parquet(spark, location, files.parquet), check_buckets=False))
    frame = parts[0]
    for part in parts[1:]:
        frame = frame.unionByName(part)
    return frame


def build_tables(records: DataFrame, top: int, minutes: DataFrame | None = None) -> dict[str, DataFrame]:
    """The report's tables from valid (possibly compacted) records, by name.

    ``minutes``: the records for the per-minute table, when ``records`` are
    compacted across minutes (``transforms.compact(..., by_minute=False)``).
    """
    totals = X.topic_totals(records)
    return {
        "topic_totals": totals,
        "node_minute": X.node_minute_series(records if minutes is None else minutes),
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
    local = _is_local(location)
    files = plan_files(_local_files(location)) if local else None
    if files is not None and not any(files.found.values()):
        raise NoRecordsError(f"no metrics files (*.jsonl, *.parquet) under {location}{NO_FILES_HINT}")
    own_session = spark is None
    progress(f"{time.monotonic() - began:6.1f}s [1/{STEPS}] starting Spark ({master_label(master, spark)})")
    session = spark or start_spark(master, conf)
    try:
        if files is None:
            files = plan_files(list_files(session, location), check=None)
            if not any(files.found.values()):
                raise NoRecordsError(f"no metrics files (*.jsonl, *.parquet) under {location}{NO_FILES_HINT}")
        for path, why in files.skipped:
            progress(f"warning: skipping damaged dump file {path}: {why}")
        return _run(session, location, files, out, since, until, top, progress, began)
    finally:
        if own_session:
            session.stop()


def _compact(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``transforms.compact`` across minutes, and the per-minute counter rows, from one pass; each kept.

    Local checkpoints: the rows stay in Spark's block store and later queries
    are planned over them alone, not over the whole plan of the pass (whose
    planning costs about a second per query). Nothing is held on the driver.
    """
    grains = X.compact_grains(parsed).localCheckpoint()
    return X.compact_latency(X.grain_overall(grains)).localCheckpoint(), X.grain_minutes(grains)


def _run(
    spark: SparkSession,
    location: str,
    files: DumpFiles,
    out: Path,
    since: float | None,
    until: float | None,
    top: int,
    progress: Callable[[str], None],
    began: float,
) -> ReportResult:
    what = ", ".join(f"{n:,} {fmt}" for fmt, n in files.found.items() if n)
    step = f"[2/{STEPS}] reading, parsing, compacting {location} ({what} files; one pass)"
    progress(f"{time.monotonic() - began:6.1f}s {step}")
    parsed = read_records(spark, location, files)
    # Computed once and kept; the tables are then planned over these small frames,
    # not over the whole plan of the pass (planning that takes about a second per query).
    compacted, minutes = _compact(X.filter_window(parsed, since, until))
    try:
        bad_rows = [r.asDict() for r in X.bad_record_counts(compacted).orderBy("reason").collect()]
        bad = {r["reason"]: r["lines"] for r in bad_rows}
        count = compacted.where(F.col("bad_reason").isNull()).agg(F.sum("lines")).first()
        valid = int(count[0] or 0) if count is not None else 0
        if valid == 0:
            what = "in the time window" if since is not None or until is not None else "in the dumps"
            skipped = ", ".join(f"{n:,} {reason}" for reason, n in bad.items()) or "none"
            raise NoRecordsError(f"no valid records {what} under {location} (bad lines: {skipped})")

        progress(f"{time.monotonic() - began:6.1f}s [3/{STEPS}] computing tables from {valid:,} records")
        # Every table but the per-minute one from the records merged across minutes: a few thousand rows.
        overall = X.valid_records(compacted)
        tables = build_tables(overall, top, minutes=minutes)
        tables["bad_records"] = X.bad_record_counts(compacted)
        progress(f"{time.monotonic() - began:6.1f}s [4/{STEPS}] writing Parquet under {out}")
        paths = {name: out / name for name in tables}
        # Each table is a few small Spark jobs whose time is mostly the driver's
        # planning and committing: several at once keep both cores busy.
        with ThreadPoolExecutor(TABLE_WRITERS, thread_name_prefix="report-table") as pool:
            written = {name: pool.submit(_write_table, name, frame, paths[name]) for name, frame in tables.items()}
            rows = {name: job.result() for name, job in written.items()}
        rows["window"] = [_page_row(r.asDict()) for r in X.observation_window(overall).collect()]
    finally:
        compacted.unpersist()

    progress(f"{time.monotonic() - began:6.1f}s [5/{STEPS}] writing {out / 'report.html'}")
    html = out / "report.html"
    data = page.PageData(location, valid, (since, until), bad_rows, rows, files.skipped)
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
        skipped=files.skipped,
    )


def _write_table(name: str, frame: DataFrame, path: Path) -> list[dict[str, Any]]:
    """Write table ``name`` as one sorted Parquet file under ``path``; its rows, for the page."""
    order = [F.col(c[1:]).desc() if c.startswith("-") else F.col(c) for c in TABLE_ORDER[name]]
    # Tables are small: one sorted partition, kept for the page.
    ordered = frame.coalesce(1).sortWithinPartitions(*order).cache()
    try:
        ordered.write.mode("overwrite").parquet(str(path))
        return [_page_row(r.asDict()) for r in ordered.collect()]
    finally:
        ordered.unpersist()


def print_summary(result: ReportResult, file: Any = None) -> None:
    """A few lines for the console: records, bad lines, top topics, where the output is."""
    out = file or sys.stdout
    bad = sum(result.bad.values())
    print(f"records: {result.records:,} valid, {bad:,} bad lines skipped", file=out)
    for reason, n in result.bad.items():
        print(f"  bad {reason}: {n:,}", file=out)
    if result.skipped:
        print(f"damaged dump files skipped: {len(result.skipped):,}", file=out)
        for path, why in result.skipped:
            print(f"  {path}: {why}", file=out)
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
