"""The report on a Spark standalone master and worker (from the pyspark install, on 127.0.0.1) equals local mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.ports import free_port
from helpers.spark import TEST_JAVA_OPTIONS, TINY_DATA_CONF, assert_same_table, conf_flags
from pyspark.sql import SparkSession

from pubsubclub.reports.generate import generate
from pubsubclub.reports.job import run_report

#: Upper bound of the wait for the worker to register with the master.
REGISTER_SECONDS = 60.0


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _env() -> dict[str, str]:
    # SPARK_DAEMON_JAVA_OPTS: the master's and the worker's JVM options.
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "SPARK_DAEMON_JAVA_OPTS": TEST_JAVA_OPTIONS}  # fmt: skip


def _alive_workers(ui_port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json", timeout=2) as reply:
        return int(json.load(reply).get("aliveworkers", 0))


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one 1-core worker on loopback; the master URL. Both are stopped after."""
    port, ui, worker_ui = free_port(), free_port(), free_port()
    spark_class, env = str(_spark_class()), _env()
    logs = [open(tmp_path / name, "w") for name in ("master.log", "worker.log")]  # noqa: SIM115  (closed below)
    procs = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)],
            env=env, stdout=logs[0], stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}", "--host", "127.0.0.1",
             "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work")],
            env=env, stdout=logs[1], stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + REGISTER_SECONDS
        while True:
            try:
                if _alive_workers(ui) >= 1:
                    break
            except OSError:
                pass  # master not listening yet
            assert all(p.poll() is None for p in procs), "master or worker exited; see its log in " + str(tmp_path)
            assert time.monotonic() < deadline, f"no worker registered within {REGISTER_SECONDS} s"
            time.sleep(0.1)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


@pytest.mark.slow
def test_report_on_a_standalone_cluster_equals_local_mode(spark: SparkSession, standalone: str, tmp_path: Path) -> None:
    """``pubsubclub report --master spark://...`` writes the same tables as local mode and exits 0."""
    generate(tmp_path / "m", 3000, nodes=3, topics=5, seed=1, per_file=300)
    with (tmp_path / "m" / "node=node1" / "junk.jsonl").open("w") as f:
        f.write('not json\n{"v": 2}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "pubsubclub", "report", "--metrics", str(tmp_path / "m"),
         "--out", str(tmp_path / "cluster"), "--master", standalone,
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m", *conf_flags(TINY_DATA_CONF)],
        env=_env(), capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "records: 3,000 valid, 2 bad lines skipped" in proc.stdout
    local = run_report(tmp_path / "m", tmp_path / "local", spark=spark, progress=lambda _m: None)
    assert local.bad == {"corrupt_json": 1, "unknown_version": 1}
    for name in local.tables:
        assert_same_table(tmp_path / "cluster" / name, local.out / name)
    assert (tmp_path / "cluster" / "report.html").read_text().count(local.top_topic or "?") >= 1
