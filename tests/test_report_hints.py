"""The report's messages say what is going on and what to do (issue 21); none of these starts Spark."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from pubsubclub.cli import command as cli
from pubsubclub.reports.job import master_label, worker_python


def test_empty_folder_suggests_metrics_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --metrics folder without dumps exits 3 and says nodes write them with --metrics-dir (or --generate)."""
    (tmp_path / "m").mkdir()
    assert cli.main(["report", "--metrics", str(tmp_path / "m"), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert f"no metrics files (*.jsonl, *.parquet) under {tmp_path / 'm'}; " in err
    assert "--metrics-dir DIR" in err and "--generate N" in err


def test_progress_names_the_master_without_claiming_spark_submit() -> None:
    """Without --master and outside spark-submit the progress line says local[*], not "from spark-submit"."""
    assert master_label(None, environ={}) == "local[*]: no --master given"
    assert "spark-submit" in master_label(None, environ={"PYSPARK_GATEWAY_PORT": "40000"})
    assert master_label("local[2]", environ={"PYSPARK_GATEWAY_PORT": "40000"}) == "local[2]"

    class Session:
        class sparkContext:  # noqa: N801 (SparkSession's attribute)
            master = "local[3]"

    given: Any = Session()
    assert master_label(None, given, environ={}) == "the session given, local[3]"


def test_local_spark_workers_run_the_drivers_interpreter_unless_someone_chose() -> None:
    """Local mode: Spark's Python workers get this interpreter (not PATH's python3, maybe another minor version)."""
    assert worker_python(None, environ={}) == sys.executable
    assert worker_python("local[2]", environ={}) == sys.executable
    assert worker_python("local-cluster[2,1,1024]", environ={}) == sys.executable
    assert worker_python("local[2]", environ={"PYSPARK_PYTHON": "/opt/py/bin/python3"}) is None
    assert worker_python(None, environ={"PYSPARK_GATEWAY_PORT": "40000"}) is None
    assert worker_python("spark://10.0.0.1:7077", environ={}) is None
