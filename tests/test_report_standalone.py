"""The report on a Spark standalone master and worker (from the pyspark install, on 127.0.0.1) equals local mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.ports import free_port
from helpers.spark import TEST_JAVA_OPTIONS, TINY_DATA_CONF, assert_same_table, conf_flags
from pyspark.sql import SparkSession

from pubsubclub.reports.generate import generate
from pubsubclub.reports.job import run_report

#: Upper bound of the wait for the master to serve.
REGISTER_SECONDS = 60.0
#: Upper bound of the report on the cluster (the worker registers meanwhile).
REPORT_SECONDS = 150.0


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


@dataclass
class Standalone:
    """A running master and worker: the master URL, the master's UI port and both processes."""

    url: str
    ui: int
    procs: list[subprocess.Popen[bytes]]
    logs: Path

    def check_alive(self) -> None:
        """Neither the master nor the worker has exited."""
        assert all(p.poll() is None for p in self.procs), "master or worker exited; see its log in " + str(self.logs)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    """A standalone master and one 1-core worker on loopback, once the master answers. Both are stopped after.

    The worker is launched once the master serves, and the test's driver starts while the worker
    starts and registers (an application waits for a worker; its executor is launched when one
    registers): the two JVM start-ups overlap (docs/architecture.md, Suite time).
    """
    port, ui, worker_ui = free_port(), free_port(), free_port()
    spark_class, env = str(_spark_class()), _env()
    logs = [open(tmp_path / name, "w") for name in ("master.log", "worker.log")]  # noqa: SIM115  (closed below)
    procs = [
        subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)],
            env=env, stdout=logs[0], stderr=subprocess.STDOUT,
        ),
    ]  # fmt: skip
    cluster = Standalone(f"spark://127.0.0.1:{port}", ui, procs, tmp_path)
    try:
        deadline = time.monotonic() + REGISTER_SECONDS
        while True:
            try:
                _alive_workers(ui)
                break  # the master serves its UI, so its RPC endpoint too (it binds that first)
            except (OSError, ValueError):
                pass  # master not listening yet, or its UI answering before it has a page (an empty body)
            cluster.check_alive()
            assert time.monotonic() < deadline, f"the master did not serve within {REGISTER_SECONDS} s"
            time.sleep(0.1)
        procs.append(
            subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", cluster.url, "--host", "127.0.0.1", "--cores",
                 "1", "--memory", "1g", "--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work")],
                env=env, stdout=logs[1], stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        yield cluster
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
def test_report_on_a_standalone_cluster_equals_local_mode(
    spark: SparkSession, standalone: Standalone, tmp_path: Path
) -> None:
    """``pubsubclub report --master spark://...`` writes the same tables as local mode and exits 0."""
    generate(tmp_path / "m", 3000, nodes=3, topics=5, seed=1, per_file=300)
    with (tmp_path / "m" / "node=node1" / "junk.jsonl").open("w") as f:
        f.write('not json\n{"v": 2}\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "pubsubclub", "report", "--metrics", str(tmp_path / "m"),
         "--out", str(tmp_path / "cluster"), "--master", standalone.url,
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.executor.memory=512m", *conf_flags(TINY_DATA_CONF)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # The same report in local mode meanwhile, on the test's session: the cluster run waits for its
    # executor to start and register, and its driver plans one small job after another.
    pool = ThreadPoolExecutor(1, thread_name_prefix="local-report")
    local_run = pool.submit(run_report, tmp_path / "m", tmp_path / "local", spark=spark, progress=lambda _m: None)
    deadline = time.monotonic() + REPORT_SECONDS
    try:
        while True:  # the report, while the master and the worker (still starting) stay up
            try:
                stdout, stderr = proc.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                standalone.check_alive()
                assert time.monotonic() < deadline, f"no report within {REPORT_SECONDS} s"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        pool.shutdown(wait=True)
    assert proc.returncode == 0, stderr[-3000:]
    standalone.check_alive()
    assert _alive_workers(standalone.ui) == 1  # the job ran on the cluster's worker
    assert "records: 3,000 valid, 2 bad lines skipped" in stdout
    local = local_run.result()
    assert local.bad == {"corrupt_json": 1, "unknown_version": 1}
    for name in local.tables:
        assert_same_table(tmp_path / "cluster" / name, local.out / name)
    assert (tmp_path / "cluster" / "report.html").read_text().count(local.top_topic or "?") >= 1
