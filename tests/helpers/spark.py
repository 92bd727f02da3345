"""The report tests' Spark settings, an exact frame comparison and dump writers (the session: conftest's ``spark``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from pyspark.sql import DataFrame, SparkSession

from pubsubclub.reports.job import DEFAULT_CONF, ReportResult

#: 2026-01-01T00:00:00Z, the generator's first interval start and a minute boundary.
T0 = 1_767_225_600.0

#: JVM options of every Spark JVM the tests start. The tests' data is tiny, so a JVM's time
#: goes to compiling Spark itself: the client JIT alone (C1, no C2) and the serial collector
#: halved a cold report run (57 s -> 27 s on the shared 2-core VM; docs/architecture.md, Testing).
#: Spark's own jars are not verified again as each of its thousands of classes loads (the
#: bytecode verifier; JDK classes are never verified): about 1 s less per JVM start-up.
#: The run's one shared session compiles most of Spark with C1 alone, past the 48 MB code cache
#: C1 gets by default (a whole run filled it: "CodeCache is full. Compiler has been disabled");
#: 240 MB is what the JVM reserves with both compilers.
TEST_JAVA_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC -XX:+UnlockDiagnosticVMOptions"
    " -XX:-BytecodeVerificationRemote"
)

#: Settings for tiny data: few shuffle partitions and no adaptive re-planning of each stage.
TINY_DATA_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JAVA_OPTIONS,
}

#: Expressions interpreted, not compiled: on tiny data a query's time is Janino compiling the
#: generated Java of every stage and expression, which the few rows never repay (Spark's own
#: test setting; docs/architecture.md, Suite time). The session and spark-submit run with it; the
#: standalone cluster keeps Spark's compiled path, and its test compares the two.
INTERPRETED_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}

#: Settings of the test session: two cores, tiny-data settings, interpreted, no UI or progress bar.
TEST_CONF = {
    **DEFAULT_CONF,
    **TINY_DATA_CONF,
    **INTERPRETED_CONF,
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def reports_together(spark: SparkSession, *runs: tuple[Path, Path]) -> list[ReportResult]:
    """``run_report(metrics, out)`` for each ``(metrics, out)`` on the shared session, all at once, in order.

    A report's time is mostly the driver planning and committing small jobs, one after another:
    two reports on two threads keep both cores busy (a pair of 2,000-record reports: 9.8-11.9 s
    one after the other, 7.6-8.1 s together; docs/architecture.md, Suite time).
    """
    from concurrent.futures import ThreadPoolExecutor

    from pubsubclub.reports.job import run_report

    with ThreadPoolExecutor(len(runs), thread_name_prefix="report") as pool:
        jobs = [pool.submit(run_report, metrics, out, spark=spark, progress=lambda _m: None) for metrics, out in runs]
        return [job.result() for job in jobs]


def conf_flags(conf: dict[str, str]) -> list[str]:
    """``conf`` as ``--conf key=value`` flags (of spark-submit and ``pubsubclub report``)."""
    return [flag for key, value in conf.items() for flag in ("--conf", f"{key}={value}")]


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def assert_frame(frame: DataFrame, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """``frame`` has exactly these columns, in order, and exactly these rows, in any order."""
    assert frame.columns == list(columns)
    got = Counter(tuple(_hashable(v) for v in row) for row in frame.collect())
    want = Counter(tuple(_hashable(v) for v in row) for row in rows)
    assert got == want, f"missing {want - got}, unexpected {got - want}"


def assert_same_table(got: Path, expected: Path) -> None:
    """The Parquet table (folder) ``got`` has the columns of ``expected``, in order, and its rows, in any order.

    Both are read with pyarrow, not Spark: the same values from the same files, without two Spark
    jobs per table (about 0.2 s each on the shared session; docs/architecture.md, Suite time).
    """
    import pyarrow.parquet as pq

    want, have = pq.read_table(expected), pq.read_table(got)
    assert have.column_names == want.column_names, (have.column_names, want.column_names)
    rows = {
        side: Counter(tuple(_hashable(v) for v in row.values()) for row in table.to_pylist())
        for side, table in (("got", have), ("want", want))
    }
    assert rows["got"] == rows["want"], f"missing {rows['want'] - rows['got']}, unexpected {rows['got'] - rows['want']}"


def counter(
    node: str, topic: str, kind: str, count: int, nbytes: int, ts: float = T0 + 10, **kw: Any
) -> dict[str, Any]:
    """A counter record of one 10 s interval."""
    frontend = "psc" if kind in ("forwarded", "received") else "wamp"
    return {"v": 1, "type": "counter", "node": node, "start": ts - 10, "ts": ts, "topic": topic,
            "frontend": frontend, "kind": kind, "peer": None, "reason": None, "count": count,
            "bytes": nbytes} | kw  # fmt: skip


def write_dump(root: Path, node: str, ts: float, records: list[Any], seq: int = 0, tail: str = "") -> Path:
    """One dump file in the documented layout; ``records`` may hold raw lines (str); ``tail`` is appended as is."""
    folder = root / f"node={node}" / "date=2026-01-01" / "hour=00"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"part-{int(ts * 1000)}-{seq}.jsonl"
    text = "".join((r if isinstance(r, str) else orjson.dumps(r).decode()) + "\n" for r in records)
    path.write_text(text + tail)
    return path
