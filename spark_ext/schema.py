"""The Kafka source's output schema, and Arrow batches built to match it exactly.

Spark accepts a Python data source's Arrow batches only if their schema equals the declared one
(binary not large_binary, timestamp ``us`` in ``UTC``, every field nullable, the list item
named ``element``), so every array here is built with exactly those types, never cast later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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

from kstore.schema import project
from kstore.segments import HEADERS_TYPE, TIMESTAMP_TYPE
from kstore.store import TopicMetadata

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


@dataclass(frozen=True)
class Shape:
    """How a read presents keys and values: binary, as Kafka's source does, or a typed topic's
    declared types (``value`` a struct; with ``flatten`` its fields are top-level columns)."""

    key: pa.DataType = pa.binary()  # noqa: RUF009 - immutable Arrow types
    value: pa.DataType = pa.binary()  # noqa: RUF009
    key_declared: str | None = None
    value_declared: Any = None  # Spark JSON of the value struct (typed topics)
    flatten: bool = False

    @property
    def typed(self) -> bool:
        return self.value_declared is not None

    def value_fields(self) -> list[str]:
        return [f.name for f in self.value] if self.typed else []

    def spark_type(self, name: str) -> DataType:
        """The Spark type of a Kafka column or (typed topics) of a value field."""
        if name == "key" and self.key_declared is not None:
            return _spark_type(self.key_declared)
        if name == "value" and self.typed:
            return _spark_type(_all_nullable(self.value_declared))
        if name in SPARK_TYPES:
            return SPARK_TYPES[name]
        for f in self.value_declared["fields"]:
            if f["name"] == name:
                return _spark_type(_all_nullable(f["type"]))
        raise KeyError(name)

    def arrow_type(self, name: str) -> pa.DataType:
        if name == "key":
            return self.key
        if name == "value":
            return self.value
        if name in ARROW_TYPES:
            return ARROW_TYPES[name]
        return self.value.field(name).type


BINARY_SHAPE = Shape()


def _all_nullable(declared: Any) -> Any:
    """Spark's Python data sources return every field nullable (NOT NULL is checked by kstore
    when records are written)."""
    if isinstance(declared, dict):
        out = {k: _all_nullable(v) for k, v in declared.items()}
        for flag in ("nullable", "containsNull", "valueContainsNull"):
            if flag in out:
                out[flag] = True
        return out
    if isinstance(declared, list):
        return [_all_nullable(v) for v in declared]
    return declared


def _spark_type(declared: Any) -> DataType:
    wrapper = {"type": "struct", "fields": [{"name": "x", "type": declared, "nullable": True}]}
    return StructType.fromJson(wrapper).fields[0].dataType


def topic_shape(metadata: Mapping[str, TopicMetadata], *, flatten: bool) -> Shape:
    """The one shape of the topics a read subscribes to: all binary, or all typed with the
    same current schema (a query has one output schema)."""
    typed = {name: m for name, m in metadata.items() if m.typed}
    if not typed:
        if flatten:
            raise InvalidOptionError(
                "kstore source: flattenValue=true needs a typed topic (created with a value "
                f"schema); {', '.join(sorted(metadata)) or 'no topic'} "
                f"{'is' if len(metadata) == 1 else 'are'} binary"
            )
        return BINARY_SHAPE
    if len(typed) != len(metadata):
        binary = sorted(set(metadata) - set(typed))
        raise InvalidOptionError(
            f"kstore source: topics {sorted(typed)} are typed but {binary} are binary; a query "
            "reads one kind (read them separately and convert)"
        )
    schemas = {name: m.schema for name, m in typed.items()}
    first_name, first = next(iter(sorted(schemas.items())))
    assert first is not None
    for name, other in schemas.items():
        assert other is not None
        if other.value_declared != first.value_declared or other.key_declared != first.key_declared:
            raise InvalidOptionError(
                f"kstore source: topics {first_name!r} and {name!r} have different schemas "
                f"({first.ddl()} / {other.ddl()}); a query reads one schema"
            )
    shape = Shape(
        key=first.key_type,
        value=first.value,
        key_declared=first.key_declared,
        value_declared=first.value_declared,
        flatten=flatten,
    )
    if flatten:
        taken = set(SPARK_TYPES) - {"value"}
        clash = [n for n in shape.value_fields() if n.lower() in taken]
        if clash:
            raise InvalidOptionError(
                f"kstore source: flattenValue=true: value field {clash[0]!r} has the name of a "
                "Kafka column; read the value as a struct (flattenValue=false) instead"
            )
    return shape


def output_names(include_headers: bool, shape: Shape) -> list[str]:
    names = kafka_columns(include_headers)
    if shape.flatten:
        i = names.index("value")
        names[i : i + 1] = shape.value_fields()
    return names


def spark_schema(include_headers: bool, shape: Shape = BINARY_SHAPE) -> StructType:
    return StructType(
        [StructField(n, shape.spark_type(n), True) for n in output_names(include_headers, shape)]
    )


def arrow_schema(columns: Sequence[str], shape: Shape = BINARY_SHAPE) -> pa.Schema:
    return pa.schema([pa.field(n, shape.arrow_type(n), nullable=True) for n in columns])


@dataclass(frozen=True)
class Projection:
    """The columns a read produces, in order, and for typed topics the value fields it needs
    (a struct pruned to the fields asked for, or the flattened fields)."""

    columns: tuple[str, ...]
    shape: Shape = BINARY_SHAPE
    value_type: pa.DataType | None = None  # the (pruned) value struct, typed reads only

    @property
    def segment_columns(self) -> list[str]:
        """The segment columns to decode, in file order (value when any field is asked for)."""
        wanted = set(self.columns)
        if self.shape.flatten and wanted & set(self.shape.value_fields()):
            wanted.add("value")
        return [c for c in SEGMENT_COLUMNS if c in wanted]

    def arrow_schema(self) -> pa.Schema:
        fields = []
        for name in self.columns:
            typ = self.value_type if name == "value" and self.value_type is not None else None
            fields.append(pa.field(name, typ or self.shape.arrow_type(name), nullable=True))
        return pa.schema(fields)


def projection(
    schema: StructType, include_headers: bool, shape: Shape = BINARY_SHAPE
) -> Projection:
    """The columns to produce for the schema Spark asks for.

    The Python data source API of PySpark 4.3 does not push required columns down, so the
    way to prune is a user-given schema holding a subset of the columns (in any order):
    columns not asked for are never decoded from the segments, and for a typed topic a
    ``value`` struct (or flattened fields) with a subset of the declared fields carries only
    those fields to Spark.
    """
    allowed = output_names(include_headers, shape)
    names: list[str] = []
    value_type: pa.DataType | None = None
    for f in schema.fields:
        if f.name not in allowed:
            if f.name == "headers" and not include_headers:
                raise InvalidOptionError(
                    "kstore schema: column 'headers' needs the option includeHeaders=true"
                )
            raise InvalidOptionError(
                f"kstore schema: column {f.name!r} is not a Kafka source column; "
                f"the columns are {', '.join(allowed)}"
            )
        if f.name in names:
            raise InvalidOptionError(f"kstore schema: column {f.name!r} appears twice")
        if f.name == "value" and shape.typed:
            value_type = _pruned_value(f.dataType, shape)
        elif _comparable(f.dataType) != _comparable(shape.spark_type(f.name)):
            raise InvalidOptionError(
                f"kstore schema: column {f.name!r} must have type "
                f"{shape.spark_type(f.name).simpleString()}, got {f.dataType.simpleString()}"
            )
        names.append(f.name)
    if not names:
        raise InvalidOptionError("kstore schema: names no column")
    return Projection(tuple(names), shape, value_type)


def _comparable(t: DataType) -> Any:
    return _all_nullable(t.jsonValue())


def _pruned_value(given: DataType, shape: Shape) -> pa.DataType:
    declared = {f["name"]: f for f in shape.value_declared["fields"]}
    if not isinstance(given, StructType):
        raise InvalidOptionError(
            f"kstore schema: column 'value' of a typed topic is a struct "
            f"({shape.spark_type('value').simpleString()}), got {given.simpleString()}"
        )
    fields = []
    for f in given.fields:
        if f.name not in declared:
            raise InvalidOptionError(
                f"kstore schema: 'value' has no field {f.name!r}; the fields are "
                f"{', '.join(declared)}"
            )
        want = _all_nullable(declared[f.name]["type"])
        if _comparable(f.dataType) != _comparable(_spark_type(want)):
            raise InvalidOptionError(
                f"kstore schema: field 'value.{f.name}' must have type "
                f"{_spark_type(want).simpleString()}, got {f.dataType.simpleString()}"
            )
        fields.append(shape.value.field(f.name))
    if not fields:
        raise InvalidOptionError("kstore schema: 'value' names no field")
    return pa.struct(fields)


def output_columns(
    schema: StructType, include_headers: bool, shape: Shape = BINARY_SHAPE
) -> list[str]:
    return list(projection(schema, include_headers, shape).columns)


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
    projection: Projection,
    schema: pa.Schema,
    constants: ConstantColumns,
) -> pa.RecordBatch:
    """One Spark batch from decoded segment rows (segment columns, possibly pruned)."""
    rows = batch.num_rows
    shape = projection.shape
    value: Any = None
    if shape.typed and "value" in batch.schema.names:
        value = batch.column("value")
        if value.type != shape.value:
            # Decoded under a newer schema version than the query planned with.
            value = project(value, shape.value)
    arrays = []
    for name in projection.columns:
        if name in ("topic", "partition", "timestampType"):
            arrays.append(constants.get(name, rows))
        elif name == "value" and projection.value_type is not None:
            arrays.append(_prune(value, projection.value_type))
        elif shape.flatten and name not in SPARK_TYPES:
            arrays.append(pc.struct_field(value, [shape.value.get_field_index(name)]))
        else:
            arrays.append(batch.column(name))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _prune(value: pa.StructArray, to: pa.StructType) -> pa.Array:
    if value.type == to:
        return value
    children = [value.field(value.type.get_field_index(f.name)) for f in to]
    mask = pc.is_null(value) if value.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(to), mask=mask)
