"""Metrics dump files: the record columns, one interval's records as JSON lines or Parquet, merged hours.

Nodes (:class:`pubsubclub.core.metrics.MetricsDumper`) and the synthetic generator
(``pubsubclub/reports/generate.py``) both write through here, so the report
reads the same files from both (docs/metrics.md). Every file is written under
a hidden temporary name in its folder, then renamed: a reader never sees half
a file. A closed hour's Parquet dumps are merged into one file whose name
says which dumps it holds (:func:`merge_parquet_dumps`, :func:`covered_files`),
so that a reader never counts a dump twice, whenever a merge is cut short.
Parquet needs pyarrow, an optional dependency (the ``parquet`` extra);
:func:`parquet_problem` says why it cannot be used, and nothing here imports
it until a Parquet file is written.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
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

#: Stem of one interval's dump: ``part-<dump time, ms>-<sequence>``.
PART_PREFIX = "part-"
#: Stem of a merged dump: ``merged-<first>-<last>``, the dump times (ms) of the first and last dump it holds.
MERGED_PREFIX = "merged-"
#: Records per row group of a merged file; a merge holds about this many records in memory at once.
MERGE_ROW_GROUP = 131_072


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
                _fsync(temporary)
            os.replace(temporary, final)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise
        written.append(final)
    return written


def dump_span(name: str) -> tuple[int, int] | None:
    """The dump times (ms) a dump file's name stands for; None for a name that is not a dump's.

    ``part-<t>-<seq>.<suffix>`` is ``(t, t)``, ``merged-<first>-<last>.parquet`` is ``(first, last)``.
    """
    stem, dot, suffix = name.rpartition(".")
    if not dot or f".{suffix}" not in SUFFIXES.values():
        return None
    for prefix in (PART_PREFIX, MERGED_PREFIX):
        if stem.startswith(prefix):
            first, _, second = stem[len(prefix) :].partition("-")
            if not (first.isdigit() and second.isdigit()):
                return None
            return (int(first), int(first)) if prefix == PART_PREFIX else (int(first), int(second))
    return None


def covered_files(names: Iterable[str]) -> set[str]:
    """The dump files among ``names`` (one folder's) whose records a merged Parquet file among them holds.

    A merged file holds every dump whose time lies in its span: the dumps it
    was made from (a ``.jsonl`` twin included) and any older merged file it
    absorbed. Such files are left behind only when a merge is cut short
    between renaming the merged file into place and deleting its inputs.
    """
    names = list(names)
    merged = [(span, n) for n in names if n.startswith(MERGED_PREFIX) and (span := dump_span(n)) is not None]
    covered = set()
    for name in names:
        span = dump_span(name)
        if span is not None and any(m != name and a <= span[0] and span[1] <= b for (a, b), m in merged):
            covered.add(name)
    return covered


def hour_folders(node_folder: str) -> list[str]:
    """A node's ``date=YYYY-MM-DD/hour=HH`` dump folders under ``node_folder``, oldest first."""
    return sorted(
        os.path.join(node_folder, date, hour)
        for date in _subfolders(node_folder, "date=")
        for hour in _subfolders(os.path.join(node_folder, date), "hour=")
    )


def _subfolders(folder: str, prefix: str) -> list[str]:
    try:
        return [e.name for e in os.scandir(folder) if e.is_dir() and e.name.startswith(prefix)]
    except FileNotFoundError:
        return []


def merge_parquet_dumps(folder: str, *, durable: bool = True) -> tuple[str, int] | None:
    """Merge the Parquet dumps in ``folder`` into one ``merged-<first>-<last>.parquet``; (its path, dumps merged).

    For a folder no dump is written to any more (a node's closed hour). None
    when there is at most one dump to merge. Crash-safe, in this order: the
    merged file is written under a hidden temporary name, synced and renamed
    into place, then its inputs are deleted. Cut short before the rename,
    nothing changed (the temporary file is deleted by the next merge); after
    it, the inputs left are covered by the merged file (:func:`covered_files`):
    the report does not read them and the next merge deletes them. A dump
    pyarrow cannot read is left where it is, unmerged.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = os.listdir(folder)
    for name in names:
        if name.startswith(f".{MERGED_PREFIX}") and name.endswith(".tmp"):
            os.unlink(os.path.join(folder, name))  # a merge cut short before its rename
    dumps = [n for n in names if n.endswith(SUFFIXES["parquet"]) and dump_span(n) is not None]
    covered = covered_files(dumps)
    for name in covered:
        os.unlink(os.path.join(folder, name))
    inputs = sorted((n for n in dumps if n not in covered), key=lambda n: dump_span(n) or (0, 0))
    if len(inputs) < 2:
        return None
    schema = arrow_schema()
    readable = []
    for name in inputs:
        try:
            pq.read_metadata(os.path.join(folder, name))
        except (OSError, ValueError):  # pyarrow's ArrowInvalid is a ValueError
            continue  # left unmerged; the report skips it if it is damaged
        readable.append(name)
    if len(readable) < 2:
        return None
    spans = [dump_span(name) or (0, 0) for name in readable]
    stem = f"{MERGED_PREFIX}{min(a for a, _ in spans)}-{max(b for _, b in spans)}"
    final = os.path.join(folder, stem + SUFFIXES["parquet"])
    temporary = os.path.join(folder, f".{stem}{SUFFIXES['parquet']}.tmp")
    try:
        with pq.ParquetWriter(temporary, schema, compression=PARQUET_COMPRESSION) as writer:
            batch: list[Any] = []
            for name in readable:
                batch.append(pq.read_table(os.path.join(folder, name)).select(schema.names).cast(schema))
                if sum(t.num_rows for t in batch) >= MERGE_ROW_GROUP:
                    writer.write_table(pa.concat_tables(batch), row_group_size=MERGE_ROW_GROUP)
                    batch = []
            if batch:
                writer.write_table(pa.concat_tables(batch), row_group_size=MERGE_ROW_GROUP)
        if durable:
            _fsync(temporary)
        os.replace(temporary, final)
        if durable:
            _fsync(folder)  # the rename itself, before the inputs go
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    for name in readable:
        os.unlink(os.path.join(folder, name))
    return final, len(readable)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
