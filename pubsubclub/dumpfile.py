"""Metrics dump files: the record columns, and one interval's records written as JSON lines or Parquet.

Nodes (:class:`pubsubclub.metrics.MetricsDumper`) and the synthetic generator
(``pubsubclub/reports/generate.py``) both write through here, so the report
reads the same files from both (docs/metrics.md). Every file is written under
a hidden temporary name in its folder, then renamed: a reader never sees half
a file. Parquet needs pyarrow, an optional dependency (the ``parquet`` extra);
:func:`parquet_problem` says why it cannot be used, and nothing here imports
it until a Parquet file is written.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import orjson

#: Values of ``[metrics] dump-format``.
DUMP_FORMATS = ("jsonl", "parquet", "both")
#: File suffix of each format; one dump written in both formats has one stem and two suffixes.
SUFFIXES = {"jsonl": ".jsonl", "parquet": ".parquet"}
#: Parquet compression of dump files (Spark's default codec: fast to read back).
PARQUET_COMPRESSION = "snappy"

#: Every column of a schema-v1 record, in order, with its type; the report's Spark schema
#: (``reports/schema.py``) and the Parquet schema are both built from this one list.
RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("v", "long"),
    ("type", "string"),
    ("node", "string"),
    ("start", "double"),
    ("ts", "double"),
    # counter
    ("topic", "string"),
    ("frontend", "string"),
    ("kind", "string"),
    ("peer", "string"),  # also link
    ("reason", "string"),
    ("count", "long"),  # also latency
    ("bytes", "long"),
    # latency
    ("origin", "string"),
    ("bounds_ms", "array<double>"),
    ("counts", "array<long>"),
    ("sum_ms", "double"),
    # gauge
    ("name", "string"),
    ("value", "double"),
    # link
    ("peer_node", "string"),
    ("role", "string"),
    ("direction", "string"),
    ("state", "string"),
)

PARQUET_EXTRA = "pip install 'pubsubclub[parquet]'"


def formats_of(setting: str) -> tuple[str, ...]:
    """The file formats a ``dump-format`` value writes: ``both`` is JSON lines and Parquet."""
    return ("jsonl", "parquet") if setting == "both" else (setting,)


def parquet_problem() -> str | None:
    """Why Parquet dumps cannot be written in this Python (pyarrow missing or broken), or None."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        return f"Parquet dumps need pyarrow, which cannot be imported here ({e}); {PARQUET_EXTRA}"
    return None


@functools.cache
def arrow_schema() -> Any:
    """The Parquet (Arrow) schema of a dump file, from ``RECORD_COLUMNS``; imports pyarrow."""
    import pyarrow as pa

    types = {
        "long": pa.int64(),
        "double": pa.float64(),
        "string": pa.string(),
        "array<double>": pa.list_(pa.float64()),
        "array<long>": pa.list_(pa.int64()),
    }
    return pa.schema([pa.field(name, types[kind]) for name, kind in RECORD_COLUMNS])


def jsonl_bytes(rows: Sequence[dict[str, Any]]) -> bytes:
    """``rows`` as JSON lines, one record per line."""
    dumps = orjson.dumps
    return b"".join(dumps(row) + b"\n" for row in rows)


def _write_jsonl(path: str, rows: Sequence[dict[str, Any]]) -> None:
    with open(path, "wb") as f:
        f.write(jsonl_bytes(rows))


def _write_parquet(path: str, rows: Sequence[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    # Column by column: a record lacks the fields other types use (null in the file).
    table = pa.Table.from_pydict({name: [row.get(name) for row in rows] for name in schema.names}, schema=schema)
    pq.write_table(table, path, compression=PARQUET_COMPRESSION)


_WRITERS: dict[str, Callable[[str, Sequence[dict[str, Any]]], None]] = {
    "jsonl": _write_jsonl,
    "parquet": _write_parquet,
}


def write_dump(
    folder: str, stem: str, rows: Sequence[dict[str, Any]], formats: Sequence[str], *, durable: bool = True
) -> list[str]:
    """Write ``rows`` as ``folder/stem.<suffix>`` in each of ``formats``; the paths written.

    Each file is written to ``folder/.stem.<suffix>.tmp`` (hidden: readers skip
    it), synced to disk when ``durable``, then renamed into place, so a reader
    sees the whole file or nothing. A failed write leaves no temporary file.
    """
    os.makedirs(folder, exist_ok=True)
    written = []
    for fmt in formats:
        name = stem + SUFFIXES[fmt]
        final = os.path.join(folder, name)
        temporary = os.path.join(folder, f".{name}.tmp")
        try:
            _WRITERS[fmt](temporary, rows)
            if durable:
                fd = os.open(temporary, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(temporary, final)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        written.append(final)
    return written
