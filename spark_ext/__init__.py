"""The Spark data source ``kstore``: Kafka's source and sink options over a kstore store.

Register it once per Spark session::

    from kstore.spark_ext import register
    register(spark)

    df = (spark.read.format("kstore")
          .option("store", "s3://bucket/ks").option("subscribe", "clicks").load())
    (df.selectExpr("key", "value").write.format("kstore").mode("append")
       .option("store", "s3://bucket/ks").option("topic", "copy").save())

``.mode("append")`` is needed: PySpark refuses a Python data source's write in the default
mode (ErrorIfExists) before the source is asked; Kafka's sink takes it as an append.

It then works with ``spark.read``, ``spark.readStream``, ``df.write``, ``df.writeStream`` and
from SQL (``CREATE TEMPORARY VIEW v USING kstore OPTIONS (store '...', subscribe '...')``,
then ``SELECT`` from it or ``INSERT INTO`` it). Options and semantics: spark_ext/README.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from kstore.errors import UnknownTopicOrPartitionError

from .options import (
    InvalidOptionError,
    ReadOptions,
    given,
    normalize,
    parse_bool,
    parse_read_options,
    parse_write_options,
)
from .reader import KStoreBatchReader, KStoreFilteringBatchReader, KStoreStreamReader
from .reading import DataLossError
from .schema import BINARY_SHAPE, Shape, projection, spark_schema, topic_shape
from .writer import KStoreBatchWriter, KStoreStreamWriter, check_input_schema

FORMAT = "kstore"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
HIDE_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"

__all__ = [
    "FORMAT",
    "HIDE_TRACEBACK_CONF",
    "DataLossError",
    "InvalidOptionError",
    "KStoreDataSource",
    "KStoreDataSourceWithPushdown",
    "offsets_behind_latest",
    "register",
]


class KStoreDataSource(DataSource):
    """The ``kstore`` format. Options are validated when a reader or writer is made, on the
    driver, so a bad option fails before any task runs."""

    filter_pushdown = False

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _shape(self, options: ReadOptions | None = None) -> tuple[bool, Shape]:
        """Whether headers are read, and how keys and values look: binary, or the declared
        types of the subscribed typed topics (read from their topic logs)."""
        raw = normalize(self.options)
        include_headers = parse_bool("includeheaders", given(raw, "includeheaders"))
        flatten = parse_bool("flattenvalue", given(raw, "flattenvalue"))
        if "store" not in raw or not any(
            k in raw for k in ("subscribe", "subscribepattern", "assign")
        ):
            return include_headers, BINARY_SHAPE  # the reader reports what is missing
        from .options import parse_store, parse_subscription
        from .reading import find_topics
        from .stores import get_store

        store = options.store if options is not None else parse_store(raw)
        sub = options.subscription if options is not None else parse_subscription(raw)
        metadata = find_topics(get_store(store), sub, strict=False)
        return include_headers, topic_shape(metadata, flatten=flatten)

    def schema(self) -> StructType:
        include_headers, shape = self._shape()
        return spark_schema(include_headers, shape)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_read_options(self.options, streaming=False)
        _, shape = self._shape(options)
        columns = projection(schema, options.include_headers, shape)
        cls = KStoreFilteringBatchReader if self.filter_pushdown else KStoreBatchReader
        return cls(options, columns)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        options = parse_read_options(self.options, streaming=True)
        _, shape = self._shape(options)
        return KStoreStreamReader(options, projection(schema, options.include_headers, shape))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise InvalidOptionError(
                "kstore sink: save mode 'overwrite' is not supported; a topic is an append-only "
                "log (use mode 'append')"
            )
        options = parse_write_options(self.options, streaming=False)
        columns = check_input_schema(schema, options)
        if options.topic is not None:
            _check_topic_exists(options, schema)
        return KStoreBatchWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        # Complete output mode re-appends the whole result each trigger, as the Kafka sink does.
        options = parse_write_options(self.options, streaming=True)
        columns = check_input_schema(schema, options)
        if options.topic is not None:
            _check_topic_exists(options, schema)
        return KStoreStreamWriter(options, columns)


class KStoreDataSourceWithPushdown(KStoreDataSource):
    """The same format, taking over topic, partition, offset and timestamp filters."""

    filter_pushdown = True


def _check_topic_exists(options: Any, schema: StructType) -> None:
    """The topic exists, and the input's value fits its kind (binary, or a typed topic's
    struct), so a mismatch fails on the driver before any task runs."""
    from pyspark.sql.types import StructType as Struct

    from .stores import get_store

    try:
        meta = get_store(options.store).topic(options.topic)
    except UnknownTopicOrPartitionError as exc:
        raise UnknownTopicOrPartitionError(
            f"kstore sink: {exc}; create it first (kstore topics create)"
        ) from None
    value = next(f for f in schema.fields if f.name.lower() == "value")
    if meta.schema is not None and not isinstance(value.dataType, Struct):
        raise InvalidOptionError(
            f"kstore sink: topic {options.topic!r} is typed; 'value' must be a struct of "
            f"{meta.schema.ddl()}, got {value.dataType.simpleString()}"
        )
    if meta.schema is None and isinstance(value.dataType, Struct):
        raise InvalidOptionError(
            f"kstore sink: topic {options.topic!r} is binary; 'value' must be string or binary, "
            f"got {value.dataType.simpleString()} (serialize it, e.g. to_json(value))"
        )
    if meta.schema is not None and isinstance(value.dataType, Struct):
        fields = value.dataType.fields
        unknown = [f.name for f in fields if f.name not in meta.schema.field_names()]
        if unknown:
            raise InvalidOptionError(
                f"kstore sink: topic {options.topic!r} has no field 'value.{unknown[0]}'; its "
                f"schema is {meta.schema.ddl()}"
            )


def register(spark: Any, *, filter_pushdown: bool = False, short_errors: bool = False) -> None:
    """Register the ``kstore`` format with ``spark`` (a SparkSession); call once per session.

    ``filter_pushdown=True`` also lets batch reads take over filters on topic, partition,
    offset and timestamp (a range of offsets or a time window then reads only the segments
    that hold it), and turns on ``spark.sql.python.filterPushdown.enabled``, without which
    Spark refuses a Python source that offers pushdown. It is off by default because PySpark
    4.3 plans a Python source's read once per relation and keeps it: after a query whose
    filters were pushed down, a later query on the *same* DataFrame or view that has no
    filter to push reuses the filtered plan and silently returns the filtered rows. With
    pushdown on, load a fresh DataFrame (``spark.read...load()``) for every query.

    ``short_errors=True`` sets ``spark.sql.execution.pyspark.udf.hideTraceback.enabled``, so
    that an error of the source (a bad option, a missing topic, data loss) reaches the user
    as one line, ``<ErrorType>: <message>``, instead of a Python traceback with the message
    at its bottom. It is a session setting: it shortens the errors of every Python UDF and
    data source of the session too, hence off by default.
    """
    if short_errors:
        spark.conf.set(HIDE_TRACEBACK_CONF, "true")
    if filter_pushdown:
        spark.conf.set(PUSHDOWN_CONF, "true")
        spark.dataSource.register(KStoreDataSourceWithPushdown)
    else:
        spark.dataSource.register(KStoreDataSource)


def offsets_behind_latest(source: Mapping[str, Any]) -> dict[str, str]:
    """Kafka's source metrics ``avgOffsetsBehindLatest``, ``maxOffsetsBehindLatest`` and
    ``minOffsetsBehindLatest`` for one entry of a progress' ``sources``
    (``query.lastProgress["sources"][0]``), from its ``endOffset`` and ``latestOffset``.

    PySpark 4.3's Python stream readers cannot report custom metrics (their ``metrics`` is
    always ``{}``), so dashboards compute them from the progress with this function."""

    def offsets(name: str) -> dict[tuple[str, str], int]:
        value = source.get(name)
        if isinstance(value, str):
            value = json.loads(value)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise InvalidOptionError(
                f"offsets_behind_latest: the progress' {name!r} is not a JSON object of "
                f"offsets: {value!r}"
            )
        return {(t, p): int(o) for t, parts in value.items() for p, o in parts.items()}

    end, latest = offsets("endOffset"), offsets("latestOffset")
    behind = [max(0, latest[tp] - end.get(tp, 0)) for tp in latest]
    if not behind:
        return {}
    return {
        "avgOffsetsBehindLatest": str(float(sum(behind)) / len(behind)),
        "maxOffsetsBehindLatest": str(max(behind)),
        "minOffsetsBehindLatest": str(min(behind)),
    }
