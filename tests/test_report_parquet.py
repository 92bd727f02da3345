"""Parquet metrics dumps: written by real nodes, read by the report like JSON lines, damaged files skipped."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import pytest_twisted
from helpers.nodes import Cluster, NodeProcess
from helpers.polling import until
from helpers.spark import assert_same_table, reports_together
from helpers.wampclient import connect, leave, publish_acked, subscribe
from pyspark.sql import SparkSession

from pubsubclub.cli.command import parser
from pubsubclub.config import ConfigError, node_config
from pubsubclub.core.dumpfile import RECORD_COLUMNS, merge_parquet_dumps, write_dump
from pubsubclub.core.metrics import Metrics, MetricsDumper
from pubsubclub.reports.generate import generate
from pubsubclub.reports.job import ReportResult, parquet_damage, plan_files, read_lines, read_parquet, run_report
from pubsubclub.reports.schema import RECORD_SCHEMA


def _quiet(_message: str) -> None:
    """Progress sink of the runs whose progress is not checked."""


def _copy_format(source: Path, target: Path, suffix: str) -> int:
    """Copy the dump files of one format under ``source`` to the same places under ``target``; how many."""
    copied = 0
    for path in source.rglob(f"*{suffix}"):
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        copied += 1
    return copied


def _assert_same_tables(expected: ReportResult, got: ReportResult) -> None:
    """Every table the two reports wrote holds the same rows."""
    assert expected.tables.keys() == got.tables.keys()
    for name in expected.tables:
        assert_same_table(got.tables[name], expected.tables[name])


def test_dump_format_is_one_setting(tmp_path: Path) -> None:
    """``[metrics] dump-format`` comes from TOML or the flag; any other value names the key."""
    path = tmp_path / "node.toml"
    path.write_text('[metrics]\ndump-format = "parquet"\n')
    assert node_config(parser().parse_args(["node", "--config", str(path)])).metrics.dump_format == "parquet"
    assert node_config(parser().parse_args(["node", "--metrics-dump-format", "both"])).metrics.dump_format == "both"
    path.write_text('[metrics]\ndump-format = "csv"\n')
    with pytest.raises(ConfigError) as e:
        node_config(parser().parse_args(["node", "--config", str(path)]))
    assert e.value.key == "metrics-dump-format"


def test_dumper_writes_the_same_records_in_both_formats(tmp_path: Path) -> None:
    """One interval dumped as ``both``: a JSON-lines and a Parquet file with one stem and equal records."""
    metrics = Metrics("n1")
    metrics.count("t", "wamp", "published", 3, 30)
    metrics.count("t", "psc", "forwarded", 3, 30, peer="n2")
    metrics.latency("n2", 0.004)
    links = [{"peer": "ws://n2/psc", "peer_node": "n2", "role": "consumer", "direction": "out", "state": "open"}]
    dumper = MetricsDumper(metrics, str(tmp_path), lambda: {"t": 2}, lambda: links, dump_format="both")
    assert dumper.formats == ("jsonl", "parquet") and dumper.problem is None
    last = dumper.dump()
    assert last is not None and last.endswith(".parquet") and dumper.files_written == 2
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert [p.suffix for p in files] == [".jsonl", ".parquet"] and files[0].stem == files[1].stem
    from_json = [json.loads(line) for line in files[0].read_text().splitlines()]
    table = pq.read_table(files[1])
    assert table.schema.names == [name for name, _ in RECORD_COLUMNS]
    from_parquet = [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]
    assert from_parquet == [{k: v for k, v in row.items() if v is not None} for row in from_json]
    assert {r["type"] for r in from_parquet} == {"counter", "latency", "gauge", "link"}


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    """A record Parquet cannot hold fails the write and leaves neither the file nor its temporary."""
    bad = [{"v": 1, "type": "counter", "node": "n", "start": 0.0, "ts": 1.0, "count": "many"}]
    with pytest.raises((TypeError, ValueError)):
        write_dump(str(tmp_path), "part-1-1", bad, ("parquet",))
    assert list(tmp_path.iterdir()) == []


def test_plan_reads_each_dump_once_and_skips_damaged_parquet() -> None:
    """A dump in both formats is read from Parquet; a damaged Parquet file is skipped and its JSON twin read."""
    found = ["d/a.jsonl", "d/a.parquet", "d/b.jsonl", "d/c.parquet", "d/e.jsonl", "d/e.parquet"]
    plan = plan_files(found, check=lambda p: "cut short" if p == "d/e.parquet" else None)
    assert plan.jsonl == ["d/b.jsonl", "d/e.jsonl"]
    assert plan.parquet == ["d/a.parquet", "d/c.parquet"]
    assert plan.skipped == [("d/e.parquet", "cut short")]
    assert plan.found == {"jsonl": 3, "parquet": 3}
    simple = plan_files(["d/a.jsonl", "d/b.parquet"], check=lambda _p: None)
    assert (simple.jsonl, simple.parquet, simple.skipped) == (None, None, [])  # Spark lists the folder itself


def test_parquet_damage_names_what_is_wrong(tmp_path: Path) -> None:
    """Cut short, empty or not Parquet at all: each gets a reason; a whole file gets None."""
    generate(tmp_path / "m", 500, nodes=1, per_file=500, dump_format="parquet")
    whole = next((tmp_path / "m").rglob("*.parquet"))
    assert parquet_damage(whole) is None
    data = whole.read_bytes()
    cases = {"cut.parquet": data[: len(data) // 2], "empty.parquet": b"", "text.parquet": b'{"v": 1}\n' * 4}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    assert "footer" in (parquet_damage(tmp_path / "cut.parquet") or "")
    assert "too short" in (parquet_damage(tmp_path / "empty.parquet") or "")
    assert "does not start like" in (parquet_damage(tmp_path / "text.parquet") or "")


def test_damaged_parquet_files_are_skipped_with_a_warning(spark: SparkSession, tmp_path: Path) -> None:
    """Cut-short and internally damaged Parquet files are left out, named, and the rest is reported."""
    made = generate(tmp_path / "m", 3000, nodes=3, topics=5, seed=2, per_file=500, dump_format="parquet")
    folder = next((tmp_path / "m").rglob("*.parquet")).parent
    whole = next(folder.glob("*.parquet")).read_bytes()
    (folder / "part-1767300000000-9.parquet").write_bytes(whole[: len(whole) - 100])  # cut short: no footer
    # Magic bytes and a plausible footer length at both ends, junk inside: only Spark can tell.
    junk = b"PAR1" + bytes(range(200)) + (100).to_bytes(4, "little") + b"PAR1"
    (folder / "part-1767300010000-9.parquet").write_bytes(junk)
    messages: list[str] = []
    result = run_report(tmp_path / "m", tmp_path / "out", spark=spark, progress=messages.append)
    assert result.records == made.records and result.bad == {}
    assert [Path(p).name for p, _why in result.skipped] == ["part-1767300000000-9.parquet"]
    assert any(m.startswith("warning: skipping damaged dump file") and "cut short" in m for m in messages)
    assert 'id="skipped-files"' in result.html.read_text()
    sums = spark.read.parquet(str(result.tables["topic_totals"])).groupBy().sum(*made.counts).collect()[0]
    assert list(sums) == list(made.counts.values())


def test_generated_dumps_in_both_formats_count_once(spark: SparkSession, tmp_path: Path) -> None:
    """Generated dumps written as ``both`` report the generator's totals once, as the JSON lines alone do."""
    made = generate(tmp_path / "both", 2000, nodes=2, topics=4, seed=5, per_file=250, dump_format="both")
    assert _copy_format(tmp_path / "both", tmp_path / "jsonl", ".jsonl") == made.files
    both, jsonl = reports_together(spark, (tmp_path / "both", tmp_path / "out-both"),
                                   (tmp_path / "jsonl", tmp_path / "out-jsonl"))  # fmt: skip
    assert both.records == jsonl.records == made.records
    _assert_same_tables(jsonl, both)


def test_a_format_with_nothing_to_read_starts_no_python_worker(spark: SparkSession, tmp_path: Path) -> None:
    """No file of a format to read (a ``both`` dump's JSON lines): an empty frame from the JVM, no Python worker."""
    context = spark.sparkContext
    was = context.pythonExec
    context.pythonExec = str(tmp_path / "no-python")  # any Python worker started now fails
    try:
        lines, records = read_lines(spark, str(tmp_path), []), read_parquet(spark, str(tmp_path), [])
        assert (lines.count(), records.count()) == (0, 0)
    finally:
        context.pythonExec = was
    assert lines.columns == ["value"] and records.schema == RECORD_SCHEMA


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_real_nodes_parquet_dumps_report_the_same_numbers_as_their_json_dumps(
    cluster_factory: Callable[..., Cluster], tmp_path: Path, spark: SparkSession
) -> None:
    """3 nodes dump each interval as JSON lines and Parquet; reports over each format alone are equal and exact."""
    metrics = tmp_path / "metrics"
    extra = ("--metrics-dir", str(metrics), "--metrics-interval", "0.3", "--metrics-dump-format", "both")
    cluster = cluster_factory(3, extra=extra)
    await cluster.linked()
    sessions = [await connect(node.wamp_url) for node in cluster.nodes]
    recorders = [(await subscribe(s, "busy"))[0] for s in sessions]
    for node in cluster.nodes:
        await until(lambda n=node: len(n.stats()["remote_interest"].get("busy", [])) == 2, "full interest")
    for s in sessions:
        for i in range(20):
            await publish_acked(s, "busy", i)
    for rec in recorders:
        await rec.wait_for(40)  # exclude_me: the other two nodes' messages
    await leave(*sessions)
    for node in cluster.nodes:
        assert node.stop() == 0
    jsonl_files = _copy_format(metrics, tmp_path / "jsonl", ".jsonl")
    assert _copy_format(metrics, tmp_path / "parquet", ".parquet") == jsonl_files > 0
    from_json, from_parquet = reports_together(spark, (tmp_path / "jsonl", tmp_path / "out-jsonl"),
                                               (tmp_path / "parquet", tmp_path / "out-parquet"))  # fmt: skip
    assert from_parquet.records == from_json.records > 0 and from_parquet.bad == from_json.bad == {}
    _assert_same_tables(from_json, from_parquet)
    totals = {r["topic"]: r for r in pq.read_table(from_parquet.tables["topic_totals"]).to_pylist()}
    assert (totals["busy"]["published"], totals["busy"]["delivered"], totals["busy"]["forwarded"]) == (60, 120, 120)


@pytest_twisted.ensureDeferred
async def test_a_node_without_pyarrow_dumps_json_lines_and_says_why(tmp_path: Path) -> None:
    """``dump-format = parquet`` on a node that cannot import pyarrow: JSON lines, and a warning naming pyarrow."""
    hidden = tmp_path / "no-pyarrow" / "pyarrow"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("pyarrow hidden by the test")\n')
    metrics = tmp_path / "metrics"
    node = NodeProcess("solo", tmp_path)
    node.extra = ("--metrics-dir", str(metrics), "--metrics-interval", "0.2", "--metrics-dump-format", "parquet")
    node.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hidden.parent), *sys.path])}
    node.start()
    try:
        session = await connect(node.wamp_url)
        for i in range(3):
            await publish_acked(session, "t", i)
        await leave(session)
    finally:
        assert node.stop() == 0  # the last interval is dumped on shutdown
    assert not list(metrics.rglob("*.parquet"))
    rows = [json.loads(line) for path in metrics.rglob("*.jsonl") for line in path.read_text().splitlines()]
    assert sum(r["count"] for r in rows if r["type"] == "counter" and r["kind"] == "published") == 3
    log = node.log_path.read_text()
    assert "metrics dumps in JSON lines only: Parquet dumps need pyarrow" in log
    assert "pyarrow hidden by the test" in log and "pip install 'pubsubclub[parquet]'" in log


def _records(path: Path) -> list[dict[str, object]]:
    """Every record of the Parquet dump files under ``path``, nulls left out, sorted."""
    rows = [
        {k: v for k, v in r.items() if v is not None}
        for p in path.rglob("*.parquet")
        for r in pq.read_table(p).to_pylist()
    ]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))


def test_a_closed_hours_dumps_merge_into_one_file_that_counts_once_whenever_cut_short(tmp_path: Path) -> None:
    """Merged: one file named by the dumps it holds; inputs left by a merge cut short are not read, then deleted."""
    hour = tmp_path / "node=n1" / "date=2026-01-01" / "hour=00"
    rows = [{"v": 1, "type": "counter", "node": "n1", "start": float(t), "ts": float(t + 10), "topic": "t",
             "frontend": "wamp", "kind": "published", "count": t, "bytes": t} for t in (1, 2, 3)]  # fmt: skip
    for t, row in zip((1000, 2000, 3000), rows, strict=True):
        write_dump(str(hour), f"part-{t}-{t:06d}", [row], ("jsonl", "parquet"))
    before = _records(hour)
    saved = {p.name: p.read_bytes() for p in hour.glob("*.parquet")}
    (hour / ".merged-1-2.parquet.tmp").write_bytes(b"a merge killed before its rename")
    assert merge_parquet_dumps(str(hour)) == (str(hour / "merged-1000-3000.parquet"), 3)
    names = sorted(p.name for p in hour.iterdir())
    assert names == ["merged-1000-3000.parquet", "part-1000-001000.jsonl", "part-2000-002000.jsonl",
                     "part-3000-003000.jsonl"]  # fmt: skip
    assert _records(hour) == before
    # Killed between the rename and the deletes: the parts are back beside the merged file.
    for name, data in saved.items():
        (hour / name).write_bytes(data)
    plan = plan_files([str(p) for p in hour.iterdir()], check=parquet_damage)
    assert plan.parquet == [str(hour / "merged-1000-3000.parquet")] and plan.jsonl == []
    # A later dump in the same folder is merged with the merged file; leftovers go.
    write_dump(str(hour), "part-4000-004000", [rows[0]], ("parquet",))
    assert merge_parquet_dumps(str(hour)) == (str(hour / "merged-1000-4000.parquet"), 2)
    assert sorted(p.name for p in hour.glob("*.parquet")) == ["merged-1000-4000.parquet"]
    assert len(_records(hour)) == 4
    assert merge_parquet_dumps(str(hour)) is None  # nothing left to merge


def test_the_dumper_merges_each_closed_hour_at_its_first_dump_after_it(tmp_path: Path) -> None:
    """Dumps across an hour boundary: the first dump of the new hour merges the old hour; the current one stays."""
    now = [1_767_227_940.0]  # 2026-01-01 00:39:00Z
    metrics = Metrics("n1")
    dumper = MetricsDumper(metrics, str(tmp_path), dict, list, clock=lambda: now[0], dump_format="parquet")
    for step in range(5):  # 00:39:00 ... 01:19:00, every 10 minutes
        metrics.count("t", "wamp", "published", step + 1, 10)
        dumper.dump()
        now[0] += 600
    folders = {p.parent.name: [] for p in tmp_path.rglob("*.parquet")}
    for p in tmp_path.rglob("*.parquet"):
        folders[p.parent.name].append(p.name)
    assert sorted(folders["hour=00"]) == ["merged-1767227940000-1767229140000.parquet"]
    assert len(folders["hour=01"]) == 2 and all(n.startswith("part-") for n in folders["hour=01"])
    assert [dumps for _path, dumps in dumper.merged] == [3]
    published = [r["count"] for r in _records(tmp_path) if r.get("kind") == "published"]
    assert sorted(published) == [1, 2, 3, 4, 5]


@pytest_twisted.ensureDeferred
async def test_a_real_node_merges_a_closed_hour_at_start_and_the_report_counts_every_dump_once(
    tmp_path: Path, spark: SparkSession
) -> None:
    """A node's dumps from an earlier hour are merged when it starts again; the report counts both runs exactly."""
    metrics = tmp_path / "metrics"
    extra = ("--metrics-dir", str(metrics), "--metrics-interval", "0.2", "--metrics-dump-format", "parquet")
    for run, (published, old) in enumerate([(6, None), (4, metrics / "node=solo" / "date=2026-01-01" / "hour=00")]):
        node = NodeProcess("solo", tmp_path)
        node.extra = extra
        if old is not None:  # the first run's dumps, as if written an hour ago or more
            (current,) = list((metrics / "node=solo").glob("date=*/hour=*"))
            old.parent.mkdir(parents=True)
            current.rename(old)
            assert len(list(old.glob("part-*.parquet"))) > 1
        node.start()
        try:
            session = await connect(node.wamp_url)
            for half in range(2):  # two intervals' dumps at least
                dumped = len(list(metrics.rglob("part-*.parquet")))
                for i in range(published // 2):
                    await publish_acked(session, "t", i)
                if half == 0:
                    await until(lambda d=dumped: len(list(metrics.rglob("part-*.parquet"))) > d, "a dump")
            await leave(session)
            if old is not None:
                await until(lambda n=node: "merged" in n.log_path.read_text(), f"run {run}: the merge logged")
        finally:
            assert node.stop() == 0
    assert [p.name.startswith("merged-") for p in old.iterdir()] == [True]
    report = run_report(metrics, tmp_path / "out", spark=spark, progress=_quiet)
    totals = {r["topic"]: r for r in pq.read_table(report.tables["topic_totals"]).to_pylist()}
    assert totals["t"]["published"] == 10 and report.bad == {}
