"""The declared Spark schema of metrics records, version 1 (docs/metrics.md)."""

from __future__ import annotations

from pyspark.sql import types as T

from pubsubclub.counters import Kind, RecordType

#: The only record schema version this report understands.
SCHEMA_VERSION = 1

#: Column that ``from_json`` fills with the raw line when the line does not parse against ``RECORD_SCHEMA``.
CORRUPT_COLUMN = "_corrupt_record"

#: Record types of schema v1 (pubsubclub/counters.py names them for the node too).
RECORD_TYPES = tuple(t.value for t in RecordType)

#: Counter kinds of schema v1.
COUNTER_KINDS = tuple(k.value for k in Kind)

#: Bad-record reasons, in the order they are checked.
BAD_REASONS = ("unknown_version", "corrupt_json", "unknown_type", "missing_fields", "invalid_value")

#: Fields every record must carry.
COMMON_FIELDS = ("v", "type", "node", "start", "ts")

#: Fields each record type must carry (non-null), besides ``COMMON_FIELDS``.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "counter": ("topic", "frontend", "kind", "count", "bytes"),
    "latency": ("origin", "bounds_ms", "counts", "count", "sum_ms"),
    "gauge": ("name", "topic", "value"),
    "link": ("peer", "role", "direction", "state"),
}

_S = T.StringType()
_L = T.LongType()
_D = T.DoubleType()

#: One flat struct holding the fields of every record type (a field a type does not use is null).
RECORD_SCHEMA = T.StructType(
    [
        T.StructField("v", _L),
        T.StructField("type", _S),
        T.StructField("node", _S),
        T.StructField("start", _D),
        T.StructField("ts", _D),
        # counter
        T.StructField("topic", _S),
        T.StructField("frontend", _S),
        T.StructField("kind", _S),
        T.StructField("peer", _S),  # also link
        T.StructField("reason", _S),
        T.StructField("count", _L),  # also latency
        T.StructField("bytes", _L),
        # latency
        T.StructField("origin", _S),
        T.StructField("bounds_ms", T.ArrayType(_D)),
        T.StructField("counts", T.ArrayType(_L)),
        T.StructField("sum_ms", _D),
        # gauge
        T.StructField("name", _S),
        T.StructField("value", _D),
        # link
        T.StructField("peer_node", _S),
        T.StructField("role", _S),
        T.StructField("direction", _S),
        T.StructField("state", _S),
    ]
)

#: ``RECORD_SCHEMA`` plus the corrupt-line column, the schema handed to ``from_json``.
PARSE_SCHEMA = T.StructType([*RECORD_SCHEMA.fields, T.StructField(CORRUPT_COLUMN, _S)])

#: The input of the job: one line of a dump file per row (what ``spark.read.text`` gives).
LINES_SCHEMA = T.StructType([T.StructField("value", _S)])
