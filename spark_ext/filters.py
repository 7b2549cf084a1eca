"""Filter pushdown for batch reads: which filters kstore takes over, and how it applies them.

Spark does not re-check a filter the source accepted, so every accepted filter is applied
exactly: topic, partition and timestampType filters decide whole read tasks (they are constant
within one), offset and timestamp filters narrow the offset range and skip segments using the
manifest, and are then applied row by row with an Arrow mask. Anything else (``Not``, ``OR``,
filters on key, value or headers, literals of unexpected types) is returned to Spark.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)

from kstore.segments import TIMESTAMP_TYPE
from kstore.settings import is_int

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_INT_COLUMNS = ("partition", "offset", "timestampType")
_COLUMNS = ("topic", *_INT_COLUMNS, "timestamp")
_COMPARISONS: dict[type[Any], str] = {
    EqualTo: "eq",
    EqualNullSafe: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
}
_STRING_OPS: dict[type[Any], str] = {
    StringStartsWith: "startswith",
    StringEndsWith: "endswith",
    StringContains: "contains",
}
NEVER = "never"  # a filter no row can pass (IS NULL on a column that is never null)


@dataclass(frozen=True)
class Condition:
    """One accepted filter, normalised: ``column op value`` (timestamps in microseconds)."""

    column: str
    op: str  # eq, gt, ge, lt, le, in, startswith, endswith, contains, never
    value: Any = None


def _micros(value: object) -> int | None:
    # Spark hands timestamp literals over as timezone-aware datetimes; a naive one would be
    # ambiguous, so it is not taken over.
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return (value - _EPOCH) // dt.timedelta(microseconds=1)
    return None


def _literal(column: str, value: object) -> Any:
    """The literal converted for ``column``, or None when it is not of the expected type."""
    if column == "topic":
        return value if isinstance(value, str) else None
    if column == "timestamp":
        return _micros(value)
    if is_int(value):
        return value
    return None


def condition_for(f: Filter) -> Condition | None:
    """The condition for a filter kstore can apply exactly, or None (Spark keeps it)."""
    attribute = getattr(f, "attribute", None)
    if not isinstance(attribute, tuple) or len(attribute) != 1 or attribute[0] not in _COLUMNS:
        return None
    column = attribute[0]
    if isinstance(f, IsNotNull):
        return Condition(column, "notnull")
    if isinstance(f, IsNull):
        return Condition(column, NEVER)  # these columns are never null
    kind = type(f)
    if kind in _COMPARISONS:
        raw = f.value  # type: ignore[attr-defined]
        if raw is None:
            # col <=> NULL on a never-null column matches nothing; col = NULL is never pushed.
            return Condition(column, NEVER) if kind is EqualNullSafe else None
        value = _literal(column, raw)
        return None if value is None else Condition(column, _COMPARISONS[kind], value)
    if kind is In:
        raw_values = f.value  # type: ignore[attr-defined]
        if not isinstance(raw_values, list | tuple):
            return None
        values = []
        for raw in raw_values:
            if raw is None:
                continue  # x IN (.., NULL) is never true because of the NULL
            value = _literal(column, raw)
            if value is None:
                return None
            values.append(value)
        return Condition(column, "in", tuple(sorted(set(values))))
    if kind in _STRING_OPS and column == "topic":
        value = f.value  # type: ignore[attr-defined]
        return Condition(column, _STRING_OPS[kind], value) if isinstance(value, str) else None
    return None


def _holds(op: str, left: Any, right: Any) -> bool:
    if op == "eq":
        return bool(left == right)
    if op == "gt":
        return bool(left > right)
    if op == "ge":
        return bool(left >= right)
    if op == "lt":
        return bool(left < right)
    if op == "le":
        return bool(left <= right)
    if op == "in":
        return left in right
    if op == "startswith":
        return bool(left.startswith(right))
    if op == "endswith":
        return bool(left.endswith(right))
    if op == "contains":
        return right in left
    return op == "notnull"  # and NEVER is False


@dataclass(frozen=True)
class Pushdown:
    """The conditions a batch read took over from Spark (picklable; shipped to executors)."""

    conditions: tuple[Condition, ...] = ()

    def on(self, column: str) -> list[Condition]:
        return [c for c in self.conditions if c.column == column]

    def accepts_constant(self, column: str, value: object) -> bool:
        """Whether a read task whose ``column`` is constantly ``value`` can yield any row."""
        return all(_holds(c.op, value, c.value) for c in self.on(column))

    def accepts_task(self, topic: str, partition: int, timestamp_type: int) -> bool:
        return (
            self.accepts_constant("topic", topic)
            and self.accepts_constant("partition", partition)
            and self.accepts_constant("timestampType", timestamp_type)
        )

    def impossible(self) -> bool:
        return any(c.op == NEVER for c in self.conditions)

    def bounds(self, column: str) -> tuple[int | None, int | None]:
        """Inclusive [low, high] that every passing ``offset``/``timestamp`` value lies in."""
        low: int | None = None
        high: int | None = None

        def raise_low(v: int) -> None:
            nonlocal low
            low = v if low is None else max(low, v)

        def cut_high(v: int) -> None:
            nonlocal high
            high = v if high is None else min(high, v)

        for c in self.on(column):
            if c.op == "eq":
                raise_low(c.value)
                cut_high(c.value)
            elif c.op == "gt":
                raise_low(c.value + 1)
            elif c.op == "ge":
                raise_low(c.value)
            elif c.op == "lt":
                cut_high(c.value - 1)
            elif c.op == "le":
                cut_high(c.value)
            elif c.op == "in":
                if c.value:
                    raise_low(min(c.value))
                    cut_high(max(c.value))
                else:
                    raise_low(1)
                    cut_high(0)  # empty IN list: nothing passes
        return low, high

    def needs_mask(self) -> bool:
        """Row-level work is needed for timestamp filters and offset IN lists; offset
        comparisons are exact once the offset range is narrowed by :meth:`bounds`."""
        return any(
            (c.column == "timestamp" and c.op != "notnull")
            or (c.column == "offset" and c.op == "in")
            for c in self.conditions
        )

    def mask(self, batch: pa.RecordBatch) -> pa.Array | None:
        """The rows of ``batch`` passing every offset and timestamp condition (None: all)."""
        result: pa.Array | None = None
        for c in self.conditions:
            if c.column not in ("offset", "timestamp") or c.op == "notnull":
                continue
            column = batch.column(c.column)
            kind = TIMESTAMP_TYPE if c.column == "timestamp" else pa.int64()
            if c.op == "in":
                part = pc.is_in(column, value_set=pa.array(list(c.value), kind))
            else:
                scalar = pa.scalar(c.value, kind)
                fn = {
                    "eq": pc.equal,
                    "gt": pc.greater,
                    "ge": pc.greater_equal,
                    "lt": pc.less,
                    "le": pc.less_equal,
                }[c.op]
                part = fn(column, scalar)
            result = part if result is None else pc.and_(result, part)
        return result


def push(filters: Sequence[Filter]) -> tuple[Pushdown, list[Filter]]:
    """Split Spark's filters into the ones kstore applies and the ones Spark must keep."""
    taken: list[Condition] = []
    kept: list[Filter] = []
    for f in filters:
        condition = condition_for(f)
        if condition is None:
            kept.append(f)
        else:
            taken.append(condition)
    return Pushdown(tuple(taken)), kept


def describe(conditions: Iterable[Condition]) -> str:
    return ", ".join(f"{c.column} {c.op} {c.value!r}" for c in conditions)
