"""Fixtures only; what the tests share otherwise (node processes, ports, polling, clients) is in ``helpers/``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

# Asserts inside the helpers (clients, launchers) get pytest's detailed messages too.
pytest.register_assert_rewrite("helpers")

import pytest_twisted  # noqa: E402
from helpers.nodes import (  # noqa: E402
    Cluster,
    shared_log_errors,
    start_cluster,
    take_watched_logs,
    unhandled_errors,
)
from hypothesis import settings  # noqa: E402

T = TypeVar("T")

if TYPE_CHECKING:
    from concurrent.futures import Future

    from pyspark.sql import SparkSession

    from pubsubclub.testing.crossbar import CrossbarProcess

# Tests never assert on speed: Hypothesis's per-example deadline (200 ms) is such an
# assertion, and it failed property tests on a loaded machine. Examples stay bounded
# by their count and by pytest-timeout.
settings.register_profile("pubsubclub", deadline=None)
settings.load_profile("pubsubclub")


@pytest.fixture(scope="session", autouse=True)
def child_bytecode_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Child Pythons (nodes, CLI runs) keep their compiled modules in a folder of the run, not recompile each start.

    Only when the environment forbids bytecode beside the sources (``PYTHONDONTWRITEBYTECODE``):
    then every node process compiled all of ``pubsubclub`` again (about 0.25 s of CPU each).
    ``PYTHONPYCACHEPREFIX`` keeps the source trees clean (docs/architecture.md, Suite time).
    """
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        yield
        return
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.mktemp("pycache")))
        env.delenv("PYTHONDONTWRITEBYTECODE")
        yield


@pytest.fixture(autouse=True)
def no_unhandled_errors_in_node_logs() -> Iterator[None]:
    """Fail any test whose node processes logged an unhandled error (a traceback); shared nodes: during the test."""
    take_watched_logs()
    yield
    found = {str(path): lines for path in take_watched_logs() if (lines := unhandled_errors(path))}
    found.update((str(path), lines) for path, lines in shared_log_errors().items())
    if found:
        report = "\n".join(f"{path}:\n  " + "\n  ".join(lines[:5]) for path, lines in found.items())
        pytest.fail(f"node logs show unhandled errors:\n{report}", pytrace=False)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Start clusters; every node is stopped at the end of the test."""
    started: list[Cluster] = []

    def make(
        n: int = 3, listen_role: str = "producer", extra: tuple[str, ...] = (), frontends: bool = False
    ) -> Cluster:
        cluster = start_cluster(tmp_path, n, listen_role, extra, frontends)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        for node in cluster.nodes:
            node.stop()


@pytest.fixture
def node_env() -> dict[str, str]:
    """Environment for child processes."""
    return dict(os.environ)


@pytest_twisted.async_yield_fixture
async def double() -> AsyncIterator[Any]:
    """An in-process Consul double on a free port, without jitter on waits or HTTP-check stagger."""
    from pubsubclub.testing import ConsulDouble

    d = ConsulDouble(rand=lambda: 0.0)
    await d.listen()
    yield d
    await d.stop()
    d.shutdown()


def _used_later(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether a test of the run uses ``fixture`` but not the first one, and this is no pytest-xdist worker."""
    uses = [fixture in getattr(item, "fixturenames", ()) for item in request.session.items]
    return any(uses) and not uses[0] and not os.environ.get("PYTEST_XDIST_WORKER")


def _on_a_thread(name: str, start: Callable[[], T], stop: Callable[[T], object]) -> Iterator[Future[T]]:
    """``start()`` on a thread of its own, as a Future; at the end, ``stop`` of what it started (if it did)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix=name)
    started = pool.submit(start)
    try:
        yield started
    finally:
        pool.shutdown(wait=True)
        if started.exception() is None:
            stop(started.result())


def _stop_routers(routers: list[CrossbarProcess]) -> None:
    for proc in routers:
        proc.stop()


def _start_spark(warm_up: Path | None = None) -> SparkSession:
    """The tests' local[2] SparkSession; with ``warm_up``, after one report over a few generated dumps there."""
    from helpers.spark import TEST_CONF

    from pubsubclub.reports.generate import generate
    from pubsubclub.reports.job import run_report, start_spark

    session = start_spark("local[2]", TEST_CONF)
    if warm_up is not None:
        try:
            generate(warm_up / "m", 300, nodes=2, topics=3, seed=0, per_file=100, workers=1)
            run_report(warm_up / "m", warm_up / "out", spark=session, progress=lambda _m: None)
        except BaseException:
            session.stop()
            raise
    return session


@pytest.fixture(scope="session", autouse=True)
def spark_started_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Future[SparkSession] | None]:
    """When the run holds report tests: their SparkSession, started and warmed up on a thread from the first test on.

    A JVM start-up and its first report (Spark compiling itself: about 15 s on one core) then
    overlap the node tests that run before the first report test, instead of delaying it
    (docs/architecture.md, Suite time). Not when the first test uses ``spark`` (nothing to overlap),
    nor under pytest-xdist (only the worker that runs the Spark group starts a session): there
    ``spark`` starts it on first use. An error of the start fails the tests that use ``spark``, not
    the test that happens to run first.
    """
    if not _used_later(request, "spark"):
        yield None
        return
    warm_up = tmp_path_factory.mktemp("spark-warm-up")
    yield from _on_a_thread("spark-start", lambda: _start_spark(warm_up), lambda session: session.stop())


@pytest.fixture(scope="session")
def spark(spark_started_early: Future[SparkSession] | None) -> Iterator[SparkSession]:
    """One local[2] SparkSession for every report test of the run (``spark_started_early``'s if it started one)."""
    if spark_started_early is not None:
        yield spark_started_early.result()  # stopped by spark_started_early
        return
    session = _start_spark()
    yield session
    session.stop()


def _routers(tmp_path_factory: pytest.TempPathFactory) -> list[CrossbarProcess]:
    """Two Crossbar routers with the default test configuration, not started (ports are taken on the main thread)."""
    from helpers.ports import free_port

    from pubsubclub.testing.crossbar import CrossbarProcess

    return [CrossbarProcess(tmp_path_factory.mktemp(f"router{i}"), free_port(), name=f"crossbar{i}") for i in (1, 2)]


def _start_routers(routers: list[CrossbarProcess]) -> list[CrossbarProcess]:
    """Start ``routers`` side by side; on a failure, stop them all."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(proc.start) for proc in routers]:
                future.result()
    except BaseException:
        _stop_routers(routers)
        raise
    return routers


@pytest.fixture(scope="session", autouse=True)
def crossbar_started_early(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Future[list[CrossbarProcess]] | None]:
    """When a later test uses ``crossbar_routers``: the routers, started on a thread from the first test on.

    Their start-up (seconds of imports) then overlaps the tests before the first Crossbar module
    (docs/architecture.md, Suite time); the rules of ``spark_started_early`` apply.
    """
    if not _used_later(request, "crossbar_routers"):
        yield None
        return
    routers = _routers(tmp_path_factory)
    yield from _on_a_thread("crossbar-start", lambda: _start_routers(routers), _stop_routers)


@pytest.fixture(scope="session")
def crossbar_routers(
    crossbar_started_early: Future[list[CrossbarProcess]] | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[CrossbarProcess]]:
    """Two Crossbar routers (the default test configuration), shared by every module that needs one as it is.

    A Crossbar start-up is seconds of imports (two processes each): the bridge, bridge RPC, one-router,
    launcher and Nagle modules share these instead of starting their own. Each module uses its own
    topics and procedures, and its bridges and clients leave before the next module (their
    subscriptions, registrations and the bridge lock go with them). A test may restart (or kill and
    start) one: it serves again on the same port with the same configuration.
    """
    if crossbar_started_early is not None:
        yield crossbar_started_early.result()  # stopped by crossbar_started_early
        return
    started = _start_routers(_routers(tmp_path_factory))
    try:
        yield started
    finally:
        _stop_routers(started)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every test that uses ``spark`` in one xdist group: one worker, so one JVM, runs them all."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture
def logged_errors() -> Iterator[list[dict[str, Any]]]:
    """The error events logged during the test."""
    seen: list[dict[str, Any]] = []

    def observer(event: dict[str, Any]) -> None:
        if event.get("isError") or event.get("log_failure") is not None:
            seen.append(event)

    from twisted.logger import globalLogPublisher

    globalLogPublisher.addObserver(observer)
    yield seen
    globalLogPublisher.removeObserver(observer)
