"""The declared Spark schema of metrics records, version 1 (docs/metrics.md)."""

from __future__ import annotations

from pyspark.sql import types as T

from pubsubclub.core.counters import Kind, RecordType
from pubsubclub.core.dumpfile import RECORD_COLUMNS

#: The only record schema version this report understands.
SCHEMA_VERSION = 1

#: Column that ``from_json`` fills with the raw line when the line does not parse against ``RECORD_SCHEMA``.
CORRUPT_COLUMN = "_corrupt_record"

#: Record types of schema v1 (pubsubclub/core/counters.py names them for the node too).
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

_SPARK_TYPES = {
    "long": T.LongType(),
    "double": T.DoubleType(),
    "string": T.StringType(),
    "array<double>": T.ArrayType(T.DoubleType()),
    "array<long>": T.ArrayType(T.LongType()),
}

#: One flat struct holding the fields of every record type (a field a type does not use is null);
#: the columns of ``dumpfile.RECORD_COLUMNS``, which the nodes' Parquet dumps are written with too.
RECORD_SCHEMA = T.StructType([T.StructField(name, _SPARK_TYPES[kind]) for name, kind in RECORD_COLUMNS])

#: ``RECORD_SCHEMA`` plus the corrupt-line column, the schema handed to ``from_json``.
PARSE_SCHEMA = T.StructType([*RECORD_SCHEMA.fields, T.StructField(CORRUPT_COLUMN, T.StringType())])

#: The input of the job: one line of a dump file per row (what ``spark.read.text`` gives).
LINES_SCHEMA = T.StructType([T.StructField("value", T.StringType())])
