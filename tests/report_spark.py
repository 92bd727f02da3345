"""The report tests' one local Spark session and an exact frame comparison (a pytest plugin).

PYTEST_DONT_REWRITE: imported by the test modules before pytest registers it as a plugin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from pubsubclub.reports.job import DEFAULT_CONF, start_spark

#: Settings of the test session: two cores, few shuffle partitions, no UI or progress bar.
TEST_CONF = {
    **DEFAULT_CONF,
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local[2] SparkSession for every report test of the run."""
    session = start_spark("local[2]", TEST_CONF)
    yield session
    session.stop()


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
