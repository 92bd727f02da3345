"""The report job end to end on hand-written and generated dumps: tables, page, bad input, exit codes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.spark import (
    INTERPRETED_CONF,
    T0,
    TEST_JAVA_OPTIONS,
    TINY_DATA_CONF,
    assert_frame,
    assert_same_table,
    conf_flags,
    counter,
    write_dump,
)
from pyspark.sql import SparkSession

from pubsubclub.cli import command as cli
from pubsubclub.reports.command import java_problem
from pubsubclub.reports.generate import generate
from pubsubclub.reports.job import NoRecordsError, ReportResult, run_report

REPO = Path(__file__).resolve().parent.parent
BOUNDS = [1.0, 5.0]


@pytest.fixture(scope="module")
def cluster_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three nodes' dumps with known traffic, plus a truncated file, junk, an unknown version and a .tmp file.

    Node a publishes t.hot 100 + 50 (second minute) and t.cold 10; it forwards the first 100 to b and c.
    b and c each receive 100 and deliver them (b to two clients); a delivers t.hot 100 locally.
    Written once for the module: the tests only read it.
    """
    root = tmp_path_factory.mktemp("cluster-dumps") / "metrics"
    write_dump(root, "a", T0 + 10, [
        counter("a", "t.hot", "published", 100, 1000),
        counter("a", "t.cold", "published", 10, 50),
        counter("a", "t.hot", "delivered", 100, 1000),
        counter("a", "t.hot", "forwarded", 100, 1000, peer="b"),
        counter("a", "t.hot", "forwarded", 100, 1000, peer="c"),
        {"v": 1, "type": "link", "node": "a", "start": T0, "ts": T0 + 10, "peer": "ws://b/psc", "peer_node": "b",
         "role": "producer", "direction": "in", "state": "open"},
    ])  # fmt: skip
    write_dump(root, "a", T0 + 70, [counter("a", "t.hot", "published", 50, 500, ts=T0 + 70)])
    write_dump(root, "b", T0 + 10, [
        counter("b", "t.hot", "received", 100, 1000, peer="a"),
        counter("b", "t.hot", "delivered", 200, 2000),
        counter("b", "t.hot", "dropped", 3, 30, reason="slow_consumer"),
        {"v": 1, "type": "latency", "node": "b", "start": T0, "ts": T0 + 10, "origin": "a", "bounds_ms": BOUNDS,
         "counts": [90, 10, 0], "count": 100, "sum_ms": 80.0},
        "this is not json",
        counter("b", "t.hot", "published", 999, 999) | {"v": 2},
        {"v": 1, "type": "gauge", "node": "b", "start": T0, "ts": T0 + 10, "name": "subscribers", "topic": "t.hot",
         "value": 2.0},
    ])  # fmt: skip
    write_dump(root, "c", T0 + 10, [
        counter("c", "t.hot", "received", 100, 1000, peer="a"),
        counter("c", "t.hot", "delivered", 100, 1000),
        {"v": 1, "type": "latency", "node": "c", "start": T0, "ts": T0 + 10, "origin": "a", "bounds_ms": BOUNDS,
         "counts": [50, 49, 1], "count": 100, "sum_ms": 200.0},
    ])  # fmt: skip
    # a dump cut short: its last line ends mid-JSON
    write_dump(root, "c", T0 + 20, [counter("c", "t.cold", "delivered", 1, 5, ts=T0 + 20)], seq=1,
               tail='{"v": 1, "type": "counter", "node": "c", "start": 1767225610.0, "ts": 17672')  # fmt: skip
    # a dump being written: never read
    (root / "node=c" / "date=2026-01-01" / "hour=00" / "part-1767225630000-0.jsonl.tmp").write_text("junk\n")
    return root


@pytest.fixture(scope="module")
def cluster_report(spark: SparkSession, cluster_dumps: Path, tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    """The report over ``cluster_dumps`` with no window, built once for the tests that only read it."""
    return run_report(cluster_dumps, tmp_path_factory.mktemp("cluster-report") / "out", spark=spark,
                      progress=lambda _m: None)  # fmt: skip


#: Upper bound of the spark-submit run (its own JVM, started in the background by ``spark_submitted``).
SUBMIT_SECONDS = 180


@pytest.fixture(scope="module", autouse=True)
def spark_submitted(
    cluster_dumps: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``spark-submit`` of the job over ``cluster_dumps``, started with the module's first test and left running.

    Its JVM start-up and cold run (20-25 s) then overlap the module's other tests, which use the
    shared session (docs/architecture.md, Suite time); ``test_spark_submit_runs_the_same_job``
    waits for it. Output goes to files (a pipe nobody reads could fill and stall it); the whole
    process group is killed at the end if it still runs.
    """
    folder = tmp_path_factory.mktemp("spark-submit")
    package = folder / "pubsubclub.zip"
    with zipfile.ZipFile(package, "w") as zf:
        for path in (REPO / "pubsubclub").rglob("*.py"):
            zf.write(path, path.relative_to(REPO).as_posix())
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1"}  # fmt: skip
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        proc = subprocess.Popen(
            # The driver JVM's options go to spark-submit itself: the job's own --conf flags reach a running JVM.
            [str(submit), "--master", "local[1]", "--driver-java-options", TEST_JAVA_OPTIONS, "--py-files",
             str(package), str(REPO / "pubsubclub/reports/submit.py"), "--metrics", str(cluster_dumps),
             "--out", str(folder / "submitted"), "--conf", "spark.ui.enabled=false",
             *conf_flags({**TINY_DATA_CONF, **INTERPRETED_CONF})],
            cwd=folder, env=env, stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc, folder
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def table(spark: SparkSession, result: ReportResult, name: str) -> Any:
    """The Parquet table ``name`` that the report wrote."""
    assert (result.out / name).is_dir()
    return spark.read.parquet(str(result.out / name))


def test_report_tables_hold_the_exact_traffic(spark: SparkSession, cluster_report: ReportResult) -> None:
    """Published, delivered, forwarded, received and dropped counts in Parquet equal the dumps' traffic."""
    result = cluster_report
    assert result.records == 16
    assert result.bad == {"corrupt_json": 2, "unknown_version": 1}
    assert result.top_topic == "t.hot"
    assert result.observed_seconds == 70.0
    totals = table(spark, result, "topic_totals").select(
        "topic", "published", "delivered", "forwarded", "received", "dropped", "published_bytes", "published_per_s"
    )
    assert_frame(
        totals,
        totals.columns,
        [("t.hot", 150, 400, 200, 200, 3, 1500, 150 / 70), ("t.cold", 10, 1, 0, 0, 0, 50, 10 / 70)],
    )
    assert_frame(
        table(spark, result, "fanout"),
        ["topic", "published", "delivered", "fanout"],
        [("t.hot", 150, 400, 400 / 150), ("t.cold", 10, 1, 0.1)],
    )
    assert_frame(
        table(spark, result, "traffic_matrix"),
        ["node", "peer", "count", "bytes"],
        [("a", "b", 100, 1000), ("a", "c", 100, 1000)],
    )
    assert_frame(
        table(spark, result, "drops"),
        ["node", "frontend", "reason", "count", "bytes"],
        [("b", "wamp", "slow_consumer", 3, 30)],
    )
    assert_frame(
        table(spark, result, "latency"),
        ["origin", "node", "count", "mean_ms", "p50_ms", "p90_ms", "p99_ms"],
        [("a", "b", 100, 0.8, 1.0, 1.0, 5.0), ("a", "c", 100, 2.0, 1.0, 5.0, 5.0)],
    )
    top = table(spark, result, "top_topics").select("rank", "topic", "published")
    assert [tuple(r) for r in top.collect()] == [(1, "t.hot", 150), (2, "t.cold", 10)]
    series = table(spark, result, "node_minute").select("node", "published", "delivered")
    assert_frame(
        series, ["node", "published", "delivered"], [("a", 110, 100), ("a", 50, 0), ("b", 0, 200), ("c", 0, 101)]
    )
    bad = table(spark, result, "bad_records").select("reason", "lines")
    assert_frame(bad, ["reason", "lines"], [("corrupt_json", 2), ("unknown_version", 1)])


def test_report_html_is_self_contained_and_names_the_top_topic(cluster_report: ReportResult) -> None:
    """report.html embeds its charts, links nothing outside, names the top topic and the bad lines."""
    page = cluster_report.html.read_text()
    assert re.search(r'Top topic: <strong id="top-topic">t\.hot</strong>', page)
    assert page.count("data:image/png;base64,") == 4
    assert not re.search(r"(src|href)=[\"'](?!data:)", page)
    assert "//" not in re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)  # no URL of any scheme
    assert "unknown_version" in page and "corrupt_json" in page


def test_report_keeps_only_the_time_window(spark: SparkSession, cluster_dumps: Path, tmp_path: Path) -> None:
    """``since`` and ``until`` keep records dumped in [since, until); bad lines are still counted."""
    result = run_report(
        cluster_dumps, tmp_path / "out", since=T0 + 60, until=T0 + 71, spark=spark, progress=lambda _m: None
    )
    assert result.records == 1
    assert result.bad == {"corrupt_json": 2, "unknown_version": 1}
    assert [tuple(r) for r in table(spark, result, "topic_totals").select("topic", "published").collect()] == [
        ("t.hot", 50)
    ]


def test_only_bad_lines_is_no_records(spark: SparkSession, tmp_path: Path) -> None:
    """Dumps without one valid record raise NoRecordsError naming what was skipped."""
    write_dump(tmp_path / "m", "a", T0, ["junk", '{"v": 9, "type": "counter"}'])
    with pytest.raises(NoRecordsError, match="no valid records.*1 corrupt_json, 1 unknown_version"):
        run_report(tmp_path / "m", tmp_path / "out", spark=spark, progress=lambda _m: None)


def test_empty_folder_exits_3_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder without dump files gives exit code 3 and says so, without starting Spark."""
    (tmp_path / "m" / "node=a").mkdir(parents=True)
    code = cli.main(["report", "--metrics", str(tmp_path / "m"), "--out", str(tmp_path / "out")])
    assert code == 3
    assert "no metrics files (*.jsonl, *.parquet) under" in capsys.readouterr().err


def test_missing_folder_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --metrics folder that does not exist is exit code 2."""
    assert cli.main(["report", "--metrics", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_without_the_report_extra_the_command_says_what_to_install(
    cluster_dumps: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """When pyspark or matplotlib cannot be imported, exit 2 with one line naming the [report] extra."""
    for module in ("pyspark", "matplotlib"):
        with monkeypatch.context() as m:
            m.setitem(sys.modules, module, None)  # a None entry makes ``import module`` fail
            code = cli.main(["report", "--metrics", str(cluster_dumps), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code == 2
        assert err.splitlines() == [
            f"pubsubclub report: error: the report needs {module}: pip install 'pubsubclub[report]'"
        ]
    assert not (tmp_path / "out").exists()


def test_without_java_the_command_names_the_package(cluster_dumps: Path, tmp_path: Path) -> None:
    """No java on PATH and no JAVA_HOME: exit 2 with one line naming Java 17 and its Debian package, Spark unstarted."""
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = str(empty_bin)
    proc = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "report", "--metrics", str(cluster_dumps), "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "pubsubclub report: error: the report needs Java 17 to run Spark, but there is no java on PATH and "
        "JAVA_HOME is not set (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
    ]
    assert not (tmp_path / "out").exists()


def test_java_is_looked_up_where_spark_looks(tmp_path: Path) -> None:
    """JAVA_HOME/bin/java when JAVA_HOME is set (even if PATH has a java), else java on PATH."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    nothing = str(tmp_path / "nothing")
    assert java_problem({"PATH": nothing}) == "there is no java on PATH and JAVA_HOME is not set"
    assert java_problem({"PATH": str(home / "bin")}) is None
    assert java_problem({"PATH": nothing, "JAVA_HOME": str(home)}) is None
    broken = str(tmp_path / "old-jdk")
    assert java_problem({"PATH": str(home / "bin"), "JAVA_HOME": broken}) == f"JAVA_HOME={broken} holds no bin/java"


def test_generated_dumps_follow_the_layout_and_add_up(spark: SparkSession, tmp_path: Path) -> None:
    """The generator writes N valid records in the dump layout; the report's totals equal its tally."""
    made = generate(tmp_path / "m", 5000, nodes=3, topics=7, seed=4, per_file=400)
    assert (made.records, made.files) == (5000, 13)
    files = sorted(p.relative_to(tmp_path / "m").as_posix() for p in (tmp_path / "m").rglob("*") if p.is_file())
    assert len(files) == 13
    assert all(re.fullmatch(r"node=node[123]/date=2026-01-01/hour=00/part-\d{13}-0\.jsonl", f) for f in files)
    result = run_report(tmp_path / "m", tmp_path / "out", spark=spark, progress=lambda _m: None)
    assert (result.records, result.bad) == (5000, {})
    sums = table(spark, result, "topic_totals").groupBy().sum(*made.counts).collect()[0]
    assert list(sums) == list(made.counts.values())


def test_generate_is_deterministic(tmp_path: Path) -> None:
    """The same arguments give the same bytes, whatever the number of worker processes."""
    generate(tmp_path / "one", 3000, seed=9, per_file=250, workers=1)
    generate(tmp_path / "two", 3000, seed=9, per_file=250, workers=2)
    one = {p.relative_to(tmp_path / "one"): p.read_bytes() for p in (tmp_path / "one").rglob("*.jsonl")}
    two = {p.relative_to(tmp_path / "two"): p.read_bytes() for p in (tmp_path / "two").rglob("*.jsonl")}
    assert one == two and len(one) == 12


def test_cli_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``pubsubclub report --generate N`` writes N records and says where."""
    assert cli.main(["report", "--generate", "100", "--out", str(tmp_path / "m"), "--nodes", "2"]) == 0
    assert "wrote 100 records in 1 files (jsonl)" in capsys.readouterr().out
    assert sum(len(p.read_bytes().splitlines()) for p in (tmp_path / "m").rglob("*.jsonl")) == 100


def test_spark_submit_runs_the_same_job(
    spark_submitted: tuple[subprocess.Popen[bytes], Path], cluster_report: ReportResult
) -> None:
    """``spark-submit --py-files pubsubclub.zip .../submit.py`` writes the same tables as the library call."""
    proc, folder = spark_submitted
    try:
        returncode = proc.wait(SUBMIT_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"spark-submit did not finish within {SUBMIT_SECONDS} s") from None
    stdout, stderr = (folder / "stdout").read_text(), (folder / "stderr").read_text()
    assert returncode == 0, stderr[-3000:]
    assert "top topic: t.hot" in stdout
    assert "[2/6] reading" in stdout  # spark-submit merges the driver's stderr into its stdout
    for name in cluster_report.tables:
        assert_same_table(folder / "submitted" / name, cluster_report.out / name)
