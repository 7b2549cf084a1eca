"""Fetched Arrow batches as ConsumerRecords: keys and values through the deserializers, the
topic's timestamp type, serialized sizes, built column by column."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from itertools import chain, repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore.records import ConsumerRecord, TopicPartition
from kstore.segments import fixed_array, numpy_values
from kstore.store import Store


def _sizes(column: pa.Array, items: list[Any]) -> Iterable[int]:
    """Serialized sizes of a binary column, -1 for nulls (Kafka's convention), from ``items``,
    the column as Python values (bytes; ``len`` over them runs in C, and costs less than an
    Arrow kernel's call on the few records a partition gets per poll). A string column's
    sizes are its UTF-8 lengths, from Arrow. Typed keys and values have no serialized form:
    -1 throughout."""
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        if column.null_count == 0:
            return list(map(len, items))
        return [-1 if item is None else len(item) for item in items]
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return repeat(-1, len(column))
    # Arrow scalars and numpy views built directly: pa.scalar (behind a Python -1) and
    # Array.to_numpy import pandas on first use, 0.3 s on a consumer's first poll.
    minus_one = fixed_array(np.array([-1], np.int64), pa.int64())[0]
    lengths = pc.fill_null(pc.binary_length(column).cast(pa.int64()), minus_one)
    return numpy_values(lengths, np.int64).tolist()  # type: ignore[no-any-return]


class RecordBuilder:
    """Builds the records of fetched batches, for topics of ``store``."""

    def __init__(
        self,
        store: Store,
        key_deserializer: Callable[[Any], Any] | None = None,
        value_deserializer: Callable[[Any], Any] | None = None,
    ) -> None:
        self._store = store
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._timestamp_types: dict[str, int] = {}

    def _timestamp_type(self, topic: str) -> int:
        kind = self._timestamp_types.get(topic)
        if kind is None:
            effective = self._store.topic(topic).effective_config
            kind = 1 if effective["message.timestamp.type"] == "LogAppendTime" else 0
            self._timestamp_types[topic] = kind
        return kind

    def to_records(
        self, batches: dict[TopicPartition, list[pa.RecordBatch]]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Arrow batches to ConsumerRecords, column by column and a topic at a time: every
        per-record step below is a C-level iteration (``map``/``zip``/``repeat``), since poll()
        builds one Python object per record and is bound by exactly that. A fetch of many
        partitions often holds a record or two per partition (a producer's flush spread over
        them): the partitions of a topic are joined into one batch and converted in one pass,
        whose fixed cost then comes once per poll, not once per partition (at 44 partitions of
        one record, a quarter of the time)."""
        # The cyclic garbage collector would run every 700 new tuples and rescan the growing
        # list of records each time, costing more than building them; these records hold
        # no reference cycles, so it is paused while they are made (and restored after).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            out: dict[TopicPartition, list[ConsumerRecord]] = {}
            by_topic: dict[str, list[TopicPartition]] = {}
            for tp in batches:
                by_topic.setdefault(tp.topic, []).append(tp)
            for topic, tps in by_topic.items():
                flat = [b for tp in tps for b in batches[tp]]
                counts = [sum(b.num_rows for b in batches[tp]) for tp in tps]
                if not flat:
                    out.update((tp, []) for tp in tps)
                    continue
                try:
                    whole = pa.concat_batches(flat) if len(flat) > 1 else flat[0]
                except (pa.ArrowInvalid, pa.ArrowTypeError):  # schemas differ: batch by batch
                    for tp in tps:
                        out[tp] = [
                            record
                            for batch in batches[tp]
                            for record in self._build(
                                topic, batch, repeat(tp.partition, batch.num_rows)
                            )
                        ]
                    continue
                partitions = chain.from_iterable(
                    repeat(tp.partition, count) for tp, count in zip(tps, counts, strict=True)
                )
                records = self._build(topic, whole, partitions)
                start = 0
                for tp, count in zip(tps, counts, strict=True):
                    out[tp] = records[start : start + count]
                    start += count
            return out
        finally:
            if paused:
                gc.enable()

    def _build(
        self, topic: str, batch: pa.RecordBatch, partitions: Iterable[int]
    ) -> list[ConsumerRecord]:
        """The records of ``batch``, of ``topic``; ``partitions`` gives each record's."""
        key_de = self._key_deserializer
        value_de = self._value_deserializer
        ts_type = self._timestamp_type(topic)
        n = batch.num_rows
        key_col, value_col, header_col = batch.column(0), batch.column(1), batch.column(3)
        keys = key_col.to_pylist()
        # Typed values come back as dicts (maps too, rather than lists of pairs).
        values = (
            value_col.to_pylist(maps_as_pydicts="strict")
            if pa.types.is_struct(value_col.type)
            else value_col.to_pylist()
        )
        # Never null (segments refuse null timestamps); read without Array.to_numpy, which
        # imports pandas on first use. timestamp[us] is int64 microseconds: viewed as they
        # are, not cast.
        stamps = (numpy_values(batch.column(2), np.int64) // 1000).tolist()
        offsets = numpy_values(batch.column(4), np.int64).tolist()
        if header_col.null_count == n:
            headers: Iterable[Any] = repeat((), n)
        else:
            headers = [
                tuple((h["key"], h["value"]) for h in hs) if hs else ()
                for hs in header_col.to_pylist()
            ]
        key_sizes = _sizes(key_col, keys)
        value_sizes = _sizes(value_col, values)
        if key_de is not None:
            keys = [key_de(k) if k is not None else None for k in keys]
        if value_de is not None:
            values = [value_de(v) if v is not None else None for v in values]
        rows = zip(
            repeat(topic),
            partitions,
            offsets,
            stamps,
            repeat(ts_type),
            keys,
            values,
            headers,
            repeat(None),
            key_sizes,
            value_sizes,
            repeat(-1),
            repeat(-1),
        )
        return list(map(tuple.__new__, repeat(ConsumerRecord), rows))
