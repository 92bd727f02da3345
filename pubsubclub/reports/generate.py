"""Synthetic metrics dumps in the exact layout of docs/metrics.md, for benchmarks and tests.

Plain Python, no Spark; files are written by :func:`pubsubclub.core.dumpfile.write_dump`,
as a node writes them (JSON lines, Parquet through pyarrow, or both). File
``i`` is node ``i % nodes`` at interval ``i // nodes`` and is generated from
its own seeded random stream, so the output depends only on the arguments,
not on how many worker processes write it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pubsubclub.core.dumpfile import (
    DUMP_FORMATS,
    formats_of,
    hour_folders,
    merge_parquet_dumps,
    parquet_problem,
    write_dump,
)

#: Interval start of the first file: 2026-01-01T00:00:00Z.
BASE_TIME = 1_767_225_600.0
#: Seconds between two dumps of one node (the node's default ``--metrics-interval``).
INTERVAL = 10.0
#: Records in each file but the last.
RECORDS_PER_FILE = 2000
#: Below this many records one process writes everything.
PARALLEL_THRESHOLD = 100_000
#: Latency histogram bounds of the synthetic nodes, milliseconds.
BOUNDS_MS = [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]

_KIND_TABLE = ["published"] * 6 + ["delivered"] * 6 + ["forwarded"] * 3 + ["received"] * 3 + ["dropped", "gauge"]
_FRONTENDS = ["wamp"] * 6 + ["nsd", "tep"]
_DROP_REASONS = ["slow_consumer", "not_json", "link_down"]
_TOPIC_TABLE_BITS = 12


@dataclass(frozen=True)
class GenerateResult:
    """What ``generate`` wrote: records, files and the sum of ``count`` per counter kind."""

    records: int
    files: int
    seconds: float
    counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    out: str
    records: int
    nodes: int
    topics: int
    seed: int
    per_file: int
    formats: tuple[str, ...]

    @property
    def files(self) -> int:
        return -(-self.records // self.per_file)


def node_name(index: int) -> str:
    """The synthetic id of node ``index``."""
    return f"node{index + 1}"


def topic_name(index: int) -> str:
    """The synthetic name of topic ``index`` (topic 0 is the most published)."""
    return f"com.example.topic.{index}"


def _topic_table(topics: int) -> list[int]:
    """Topic indices laid out so that a uniform pick follows a 1/(k+1) (Zipf-like) law."""
    size = 1 << _TOPIC_TABLE_BITS
    weights = [1.0 / (k + 1) for k in range(topics)]
    total = sum(weights)
    table: list[int] = []
    for k, w in enumerate(weights):
        table.extend([k] * max(1, round(size * w / total)))
    return table


def _file_records(plan: _Plan, index: int, topic_table: list[int]) -> tuple[Path, str, list[dict[str, Any]]]:
    rng = random.Random(plan.seed * 1_000_003 + index)
    node_i, interval = index % plan.nodes, index // plan.nodes
    node = node_name(node_i)
    start = BASE_TIME + INTERVAL * interval
    ts = start + INTERVAL
    peers = [node_name(k) for k in range(plan.nodes) if k != node_i]
    n = min(plan.per_file, plan.records - index * plan.per_file)
    head: dict[str, Any] = {"v": 1, "node": node, "start": start, "ts": ts}
    records: list[dict[str, Any]] = []
    for other in peers:
        records.append({**head, "type": "link", "peer": f"ws://{other}:9001/psc", "peer_node": other,
                        "role": "consumer", "direction": "out", "state": "open"})  # fmt: skip
        counts = [rng.getrandbits(7) for _ in range(len(BOUNDS_MS) + 1)]
        total = sum(counts)
        records.append({**head, "type": "latency", "origin": other, "bounds_ms": BOUNDS_MS, "counts": counts,
                        "count": total, "sum_ms": round(total * 3.5, 3)})  # fmt: skip
    table_len = len(topic_table)
    while len(records) < n:
        kind = _KIND_TABLE[rng.randrange(len(_KIND_TABLE))]
        topic_i = topic_table[rng.randrange(table_len)]
        topic = topic_name(topic_i)
        if kind == "gauge":
            records.append({**head, "type": "gauge", "name": "subscribers", "topic": topic,
                            "value": float(rng.getrandbits(5))})  # fmt: skip
            continue
        count = 1 + rng.getrandbits(6)
        peer: str | None = None
        reason: str | None = None
        frontend = _FRONTENDS[rng.randrange(len(_FRONTENDS))]
        if kind in ("forwarded", "received"):
            frontend = "psc"
            peer = peers[rng.randrange(len(peers))] if peers else None
            if peer is None:
                kind = "delivered"
                frontend = "wamp"
        elif kind == "dropped":
            reason = _DROP_REASONS[rng.randrange(len(_DROP_REASONS))]
        records.append({**head, "type": "counter", "topic": topic, "frontend": frontend, "kind": kind,
                        "peer": peer, "reason": reason, "count": count,
                        "bytes": count * (40 + topic_i % 200)})  # fmt: skip
    del records[n:]
    stamp = time.gmtime(ts)
    folder = Path(plan.out, f"node={node}", time.strftime("date=%Y-%m-%d", stamp), time.strftime("hour=%H", stamp))
    return folder, f"part-{int(ts * 1000)}-0", records


def _write_files(plan: _Plan, first: int, last: int) -> Counter[str]:
    """Write files ``first`` to ``last - 1``; the sum of counts per kind."""
    topic_table = _topic_table(plan.topics)
    tally: Counter[str] = Counter()
    for index in range(first, last):
        folder, stem, records = _file_records(plan, index, topic_table)
        for r in records:
            if r["type"] == "counter":
                tally[r["kind"]] += r["count"]
        tally["records"] += len(records)
        # Renamed into place like a node's dumps; not synced: synthetic data is cheap to write again.
        write_dump(str(folder), stem, records, plan.formats, durable=False)
    return tally


def _write_chunk(args: tuple[_Plan, int, int]) -> Counter[str]:
    return _write_files(*args)


def _hour_folders(out: str, node: int) -> list[str]:
    return hour_folders(os.path.join(out, f"node={node_name(node)}"))


def _merge(folder: str) -> None:
    merge_parquet_dumps(folder, durable=False)  # synthetic data is cheap to write again


def _chunks(files: int, size: int) -> Iterator[tuple[int, int]]:
    for first in range(0, files, size):
        yield first, min(files, first + size)


def generate(
    out: str | os.PathLike[str],
    records: int,
    nodes: int = 3,
    topics: int = 100,
    seed: int = 0,
    per_file: int = RECORDS_PER_FILE,
    workers: int | None = None,
    dump_format: str = "jsonl",
) -> GenerateResult:
    """Write ``records`` synthetic records under ``out`` in the dump layout; what was written.

    Each file holds one link and one latency record per peer, then counters
    (published, delivered, forwarded, received, dropped) and subscriber
    gauges over Zipf-distributed topics. ``dump_format`` is a node's
    ``[metrics] dump-format``: ``jsonl``, ``parquet`` (needs pyarrow) or
    ``both`` (each dump in both formats: same records, two files); ``files``
    in the result counts dumps, not files. As a node with ``merge-hours`` would
    have, the Parquet dumps of each node's hours but its last are then merged
    into one file per hour (docs/metrics.md).
    """
    if records < 0 or nodes < 1 or topics < 1 or per_file < 1:
        raise ValueError("records must be >= 0 and nodes, topics, per_file >= 1")
    if dump_format not in DUMP_FORMATS:
        raise ValueError(f"format must be one of {', '.join(DUMP_FORMATS)}, not {dump_format!r}")
    formats = formats_of(dump_format)
    problem = parquet_problem() if "parquet" in formats else None
    if problem:
        raise ValueError(problem)
    began = time.monotonic()
    plan = _Plan(str(out), records, nodes, topics, seed, per_file, formats)
    Path(out).mkdir(parents=True, exist_ok=True)
    workers = workers or os.cpu_count() or 1
    tally: Counter[str] = Counter()
    if records < PARALLEL_THRESHOLD or workers == 1:
        tally = _write_files(plan, 0, plan.files)
    else:
        jobs = [(plan, a, b) for a, b in _chunks(plan.files, 20)]
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for part in pool.imap_unordered(_write_chunk, jobs):
                tally.update(part)
    if "parquet" in formats:
        # As each node would have: every hour but its last (still being written) merged into one file.
        closed = [folder for node in range(nodes) for folder in _hour_folders(plan.out, node)[:-1]]
        if len(closed) > 1 and workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                list(pool.imap_unordered(_merge, closed))
        else:
            for folder in closed:
                _merge(folder)
    written = tally.pop("records", 0)
    counts = {kind: tally.get(kind, 0) for kind in ("published", "delivered", "forwarded", "received", "dropped")}
    return GenerateResult(written, plan.files, time.monotonic() - began, counts)
