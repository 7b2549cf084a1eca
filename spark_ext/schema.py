"""The Kafka source's output schema, and Arrow batches built to match it exactly.

Spark accepts a Python data source's Arrow batches only if their schema equals the declared one
(binary not large_binary, timestamp ``us`` in ``UTC``, every field nullable, the list item
named ``element``), so every array here is built with exactly those types, never cast later.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kstore.segments import HEADERS_TYPE, TIMESTAMP_TYPE

from .options import InvalidOptionError

CREATE_TIME = 0  # Kafka's timestampType values
LOG_APPEND_TIME = 1

HEADERS_SPARK_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
# The Kafka source's columns, in its order; headers only with includeHeaders=true.
SPARK_TYPES: dict[str, DataType] = {
    "key": BinaryType(),
    "value": BinaryType(),
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestampType(),
    "timestampType": IntegerType(),
    "headers": HEADERS_SPARK_TYPE,
}
ARROW_TYPES: dict[str, pa.DataType] = {
    "key": pa.binary(),
    "value": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": TIMESTAMP_TYPE,
    "timestampType": pa.int32(),
    "headers": HEADERS_TYPE,
}
# Columns that come from the segment files; the others are constant per partition.
SEGMENT_COLUMNS = ("key", "value", "timestamp", "headers")


def kafka_columns(include_headers: bool) -> list[str]:
    names = list(SPARK_TYPES)
    return names if include_headers else names[:-1]


def spark_schema(include_headers: bool) -> StructType:
    return StructType(
        [StructField(n, SPARK_TYPES[n], True) for n in kafka_columns(include_headers)]
    )


def arrow_schema(columns: Sequence[str]) -> pa.Schema:
    return pa.schema([pa.field(n, ARROW_TYPES[n], nullable=True) for n in columns])


def output_columns(schema: StructType, include_headers: bool) -> list[str]:
    """The columns to produce for the schema Spark asks for.

    The Python data source API of PySpark 4.3 does not push required columns down, so the
    way to prune is a user-given schema holding a subset of the Kafka columns (in any order):
    columns not asked for are never decoded from the segments.
    """
    allowed = kafka_columns(include_headers)
    names: list[str] = []
    for f in schema.fields:
        if f.name not in SPARK_TYPES:
            raise InvalidOptionError(
                f"kstore schema: column {f.name!r} is not a Kafka source column; "
                f"the columns are {', '.join(allowed)}"
            )
        if f.name == "headers" and not include_headers:
            raise InvalidOptionError(
                "kstore schema: column 'headers' needs the option includeHeaders=true"
            )
        if f.dataType != SPARK_TYPES[f.name]:
            raise InvalidOptionError(
                f"kstore schema: column {f.name!r} must have type "
                f"{SPARK_TYPES[f.name].simpleString()}, got {f.dataType.simpleString()}"
            )
        if f.name in names:
            raise InvalidOptionError(f"kstore schema: column {f.name!r} appears twice")
        names.append(f.name)
    if not names:
        raise InvalidOptionError("kstore schema: names no column")
    return names


class ConstantColumns:
    """Per-partition constant columns (topic, partition, timestampType), built once at the
    largest size needed and sliced (zero-copy) for every batch."""

    def __init__(self, topic: str, partition: int, timestamp_type: int) -> None:
        self.topic = topic.encode()
        self.partition = partition
        self.timestamp_type = timestamp_type
        self._size = 0
        self._arrays: dict[str, pa.Array] = {}

    def get(self, name: str, rows: int) -> pa.Array:
        if rows > self._size:
            self._build(max(rows, 2 * self._size))
        return self._arrays[name].slice(0, rows)

    def _build(self, rows: int) -> None:
        width = len(self.topic)
        offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
        self._arrays = {
            "topic": pa.StringArray.from_buffers(
                rows, pa.py_buffer(offsets.tobytes()), pa.py_buffer(self.topic * rows)
            ),
            "partition": pa.array(np.full(rows, self.partition, np.int32)),
            "timestampType": pa.array(np.full(rows, self.timestamp_type, np.int32)),
        }
        self._size = rows


def output_batch(
    batch: pa.RecordBatch,
    columns: Sequence[str],
    schema: pa.Schema,
    constants: ConstantColumns,
) -> pa.RecordBatch:
    """One Spark batch from decoded segment rows (READ_SCHEMA columns, possibly pruned)."""
    rows = batch.num_rows
    arrays = [
        constants.get(name, rows)
        if name in ("topic", "partition", "timestampType")
        else batch.column(name)
        for name in columns
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
