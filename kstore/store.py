"""The store: one root URL holding topics, consumer groups and producer identities."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kstore import __version__
from kstore import config as topic_config
from kstore.errors import (
    ConcurrentModificationError,
    CorruptLogError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidStoreError,
    KStoreError,
    LayoutUpgradeRequiredError,
    StoreNotFoundError,
    TopicAlreadyExistsError,
    TopicDeletedError,
    UnknownTopicOrPartitionError,
    UnsupportedFormatVersionError,
)
from kstore.layout import (
    STORE_MARKER,
    TOPICS,
    partition_dir,
    topic_data_dir,
    topic_log_dir,
)
from kstore.log import (
    Action,
    Log,
    LogState,
    RetryPolicy,
    check_writer_version,
    protocol_action,
)
from kstore.names import validate_topic_name
from kstore.storage import Storage, redact_url
from kstore.topic_log import (
    TOPIC_LOG_VERSION,
    TOPIC_LOG_WRITER_VERSION,
    TopicLog,
    log_index,
    shared_log_dir,
)

if TYPE_CHECKING:
    # pyarrow-heavy: imported when a partition is first opened, so that administration
    # (the CLI's topic commands) starts fast.
    from kstore.manifest import PartitionState
    from kstore.partition import Partition
    from kstore.schema import TopicSchema
    from kstore.segments import SegmentCache

STORE_FORMAT_VERSION = 1
# The minWriterVersion of a deleted incarnation's logs: no writer of any version writes there.
DELETED_WRITER_VERSION = 1_000_000
MAX_PARTITIONS = 100_000  # a limit on everything
_MAX_DELETE_ROUNDS = 10  # seal-then-delete attempts while partitions are being added


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    topic_id: str
    partitions: int
    config: dict[str, Any]  # explicitly set values only
    created_ms: int
    version: int  # topic log version this was read at
    # Typed topics: every schema the topic has had, oldest first (PROTOCOL.md 25), as stored.
    schemas: tuple[dict[str, Any], ...] = ()
    # 3: partitions share topic logs and data objects (PROTOCOL.md 26); 2: a log per partition.
    layout: int = 2

    @property
    def commit_logs(self) -> int:
        """Layout 3: how many topic logs the partitions share (partition p: log p mod this)."""
        return int(self._effective["commit.logs"])

    @property
    def effective_config(self) -> dict[str, Any]:
        return dict(self._effective)  # a copy: the cached one is this metadata's

    @functools.cached_property
    def _effective(self) -> dict[str, Any]:
        # Worked out once: it costs about 12 us, and a producer asks for the commit logs of
        # every partition of every flush.
        return topic_config.effective(self.config)

    @property
    def typed(self) -> bool:
        return bool(self.schemas)

    @property
    def schema(self) -> TopicSchema | None:
        """The current schema of a typed topic (None for a binary topic)."""
        history = self.schema_history
        return history[-1] if history else None

    @property
    def schema_history(self) -> tuple[TopicSchema, ...]:
        if not self.schemas:
            return ()
        cached: tuple[TopicSchema, ...] | None = self.__dict__.get("_history")
        if cached is None:
            from kstore.schema import SchemaError, read_history

            try:
                cached = read_history(list(self.schemas), f"topic {self.name!r}")
            except SchemaError as exc:
                raise CorruptLogError(f"metaData: {exc}") from None
            object.__setattr__(self, "_history", cached)
        return cached


@dataclass(frozen=True)
class PartitionDescription:
    partition: int
    log_start_offset: int
    log_end_offset: int
    segments: int
    size_bytes: int
    records: int
    oldest_timestamp_ms: int | None
    newest_timestamp_ms: int | None
    version: int


@dataclass(frozen=True)
class TopicDescription:
    metadata: TopicMetadata
    partitions: list[PartitionDescription] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.metadata.name

    def config_entries(self) -> list[tuple[str, Any, bool]]:
        """(name, value, is_default) for every config, as ``kafka-configs --describe`` shows."""
        explicit = self.metadata.config
        return [
            (name, explicit.get(name, spec.default), name not in explicit)
            for name, spec in sorted(topic_config.SPECS.items())
        ]


class TopicState(LogState):
    """A topic's metadata log replayed: the current incarnation, or deleted."""

    def __init__(self) -> None:
        super().__init__()
        self.metadata: dict[str, Any] | None = None
        self.deleted = False
        self.deleted_body: dict[str, Any] = {}
        # Every deleted incarnation: topic id -> its ``delete`` body (when, and how long its
        # files stay readable: PROTOCOL.md 17.3).
        self.deletions: dict[str, dict[str, Any]] = {}

    def copy(self) -> TopicState:
        clone: TopicState = super().copy()  # type: ignore[assignment]
        clone.deletions = dict(self.deletions)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "metaData":
            for key, kind in (
                ("name", str),
                ("id", str),
                ("partitions", int),
                ("config", dict),
                ("createdTime", int),
            ):
                if not isinstance(body.get(key), kind) or isinstance(body.get(key), bool):
                    raise CorruptLogError(f"metaData: field {key!r} missing or not {kind.__name__}")
            if not re.fullmatch(r"[0-9a-f]{32}", body["id"]):
                raise CorruptLogError(f"metaData: topic id {body['id']!r} is not 32 hex digits")
            if not 1 <= body["partitions"] <= MAX_PARTITIONS:
                raise CorruptLogError(
                    f"metaData: partition count {body['partitions']!r} is out of range"
                )
            if body.get("layout", 2) not in (2, 3):
                raise CorruptLogError(
                    f"metaData: layout {body.get('layout')!r} is unknown (2 and 3 are readable)"
                )
            if "schemas" in body and (
                not isinstance(body["schemas"], list)
                or not body["schemas"]
                or not all(isinstance(e, dict) for e in body["schemas"])
            ):
                raise CorruptLogError("metaData: 'schemas' must be a non-empty list of objects")
            self.metadata = body
            self.deleted = False
        elif name == "delete":
            self.deleted = True
            self.deleted_body = body
            if isinstance(body.get("id"), str):
                self.deletions[body["id"]] = body
        else:
            super().apply(name, body)

    def checkpoint_actions(self) -> list[Action]:
        actions = super().checkpoint_actions()
        # Earlier incarnations' deletions first: the metaData after them makes the topic live
        # again for every reader, old ones too.
        for body in self.deletions.values():
            if not (self.deleted and body is self.deleted_body):
                actions.append({"delete": body})
        if self.metadata is not None:
            actions.append({"metaData": self.metadata})
        if self.deleted:
            actions.append({"delete": self.deleted_body})
        return actions

    def to_metadata(self) -> TopicMetadata | None:
        if self.metadata is None or self.deleted:
            return None
        m = self.metadata
        return TopicMetadata(
            name=m["name"],
            topic_id=m["id"],
            partitions=m["partitions"],
            # Lenient: a key written by a newer kstore is kept but not interpreted.
            config=topic_config.read_config(m["config"]),
            created_ms=m["createdTime"],
            version=self.version,
            schemas=tuple(m.get("schemas", ())),
            layout=int(m.get("layout", 2)),
        )


class Store:
    """A kstore store at ``url`` (``file://``, ``s3://``, ``memory://`` or a bare path).

    ``create`` makes the store marker when none exists; with ``create=False`` a URL that holds
    no store raises :class:`StoreNotFoundError` (so a mistyped URL is never silently empty).
    """

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        create: bool = True,
        allow_unsafe_writes: bool = False,
        retry: RetryPolicy | None = None,
        segment_cache_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        self._setup(
            Storage(url, storage_options, allow_unsafe_writes=allow_unsafe_writes),
            create=create,
            retry=retry,
            segment_cache_bytes=segment_cache_bytes,
        )

    @classmethod
    def from_storage(
        cls,
        storage: Storage,
        *,
        create: bool = True,
        retry: RetryPolicy | None = None,
        segment_cache_bytes: int = 256 * 1024 * 1024,
    ) -> Store:
        """A store over an existing Storage object (a wrapped or instrumented one, say)."""
        store = cls.__new__(cls)
        store._setup(storage, create=create, retry=retry, segment_cache_bytes=segment_cache_bytes)
        return store

    def _setup(
        self, storage: Storage, *, create: bool, retry: RetryPolicy | None, segment_cache_bytes: int
    ) -> None:
        self.storage = storage
        self.retry = retry
        self._segment_cache_bytes = segment_cache_bytes
        self._segment_cache: SegmentCache | None = None
        self._lock = threading.Lock()
        self._topic_logs: dict[str, TopicState] = {}
        self._partitions: dict[tuple[str, str, int], Partition] = {}
        self._shared_logs: dict[tuple[str, str, int], TopicLog] = {}
        self.store_id = self._open_marker(create)

    @property
    def url(self) -> str:
        return self.storage.url

    @property
    def segment_cache(self) -> SegmentCache:
        """Decoded segments shared by every partition of this store object."""
        if self._segment_cache is None:
            from kstore.segments import SegmentCache

            self._segment_cache = SegmentCache(self._segment_cache_bytes)
        return self._segment_cache

    def __repr__(self) -> str:
        return f"Store({redact_url(self.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"storage": self.storage, "retry": self.retry, "cache": self._segment_cache_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        storage: Storage = state["storage"]
        self.__init__(  # type: ignore[misc]
            storage.url,
            storage.storage_options,
            create=False,
            allow_unsafe_writes=storage.allow_unsafe_writes,
            retry=state["retry"],
            segment_cache_bytes=state["cache"],
        )

    def _refuse_new_marker(self) -> None:
        """A new store is not made where one was (topics left, marker lost: a new marker would
        take over the old topics under a new store id) nor inside another local store."""
        if self.storage.list_dir(TOPICS):
            raise InvalidStoreError(
                f"{redact_url(self.url)!r} holds {TOPICS}/ but no {STORE_MARKER}: the marker of "
                "the store there was lost; restore it from a backup (or move the directory away) "
                "rather than create a new store over its topics"
            )
        if self.storage.local_root is not None:
            parent = os.path.dirname(self.storage.local_root)
            while parent and parent != os.path.dirname(parent):
                if os.path.exists(os.path.join(parent, STORE_MARKER)):
                    raise InvalidStoreError(
                        f"{redact_url(self.url)!r} is inside the store at {parent!r}: a store "
                        "cannot be created within another (its files would be the outer "
                        "store's strays); choose a path outside it"
                    )
                parent = os.path.dirname(parent)

    def _open_marker(self, create: bool) -> str:
        data = self.storage.read_if_exists(STORE_MARKER)
        if data is None:
            if not create:
                raise StoreNotFoundError(f"no kstore store at {redact_url(self.url)!r}")
            self._refuse_new_marker()
            marker = {
                "format": "kstore",
                "formatVersion": STORE_FORMAT_VERSION,
                "storeId": uuid.uuid4().hex,
                "createdTime": int(time.time() * 1000),
                "createdBy": f"kstore/{__version__}",
            }
            with contextlib.suppress(FileExistsError):  # created concurrently: read the winner's
                self.storage.put_if_absent(STORE_MARKER, json.dumps(marker).encode())
            data = self.storage.read(STORE_MARKER)
        where = f"{redact_url(self.url)}/{STORE_MARKER}"
        try:
            found: Any = json.loads(data)
        except ValueError as exc:
            raise CorruptLogError(f"{where}: not valid JSON ({exc})") from None
        version = found.get("formatVersion") if isinstance(found, dict) else None
        if not isinstance(version, int):
            raise CorruptLogError(f"{where}: not a kstore store marker")
        marker = found
        if version > STORE_FORMAT_VERSION:
            raise UnsupportedFormatVersionError(
                f"store {redact_url(self.url)!r} has format version {marker['formatVersion']}; "
                f"this kstore {__version__} supports up to {STORE_FORMAT_VERSION}: upgrade kstore"
            )
        return str(marker.get("storeId", ""))

    # -- topic logs ----------------------------------------------------------------------------

    def _topic_log(self, name: str) -> Log[TopicState]:
        return Log(
            self.storage, topic_log_dir(name), TopicState, checkpoint_interval=20, retry=self.retry
        )

    def _topic_state(self, name: str) -> TopicState:
        validate_topic_name(name)
        log = self._topic_log(name)
        with self._lock:
            cached = self._topic_logs.get(name)
        state = log.load() if cached is None else log.update(cached)
        with self._lock:
            self._topic_logs[name] = state
        return state

    def topic_state(self, name: str) -> TopicState:
        """The replayed state of the topic's metadata log, deleted incarnations included."""
        return self._topic_state(name)

    def topic(self, name: str) -> TopicMetadata:
        """The topic's current metadata; UnknownTopicOrPartitionError if it does not exist."""
        meta = self._topic_state(name).to_metadata()
        if meta is None:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} does not exist in {redact_url(self.url)!r}"
            )
        return meta

    def topic_exists(self, name: str) -> bool:
        return self._topic_state(name).to_metadata() is not None

    # -- administration ------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, Any] | None = None,
        *,
        value_schema: Any = None,
        key_schema: Any = None,
        layout: int = 3,
    ) -> TopicMetadata:
        """Create a topic. Of concurrent creators of one name exactly one succeeds; the
        others get TopicAlreadyExistsError.

        ``value_schema`` makes a typed topic (an Arrow schema, a Spark StructType or its JSON,
        or a DDL string such as ``"user STRING NOT NULL, amount DOUBLE"``): values are then
        stored as typed columns. ``key_schema`` types the key too (one primitive type, e.g.
        ``"string"`` or ``"long"``).

        ``layout``: 3, the only layout written (``commit.logs`` topic logs shared by the
        partitions, PROTOCOL.md 26); layout-2 topics are read, and upgraded in place by
        ``kstore topics upgrade``, but no longer created."""
        if layout == 2:
            raise InvalidConfigurationError(
                f"topic {name!r}: layout 2 is no longer created (this version reads layout-2 "
                "topics and upgrades them in place with `kstore topics upgrade TOPIC`); "
                "create it in layout 3"
            )
        if layout != 3:
            raise InvalidConfigurationError(f"layout must be 3, got {layout!r}")
        validate_topic_name(name)
        _check_partitions(partitions)
        explicit = topic_config.validate_config(config or {})
        now = int(time.time() * 1000)
        metadata: dict[str, Any] = {
            "name": name,
            "id": uuid.uuid4().hex,
            "partitions": partitions,
            "config": explicit,
            "createdTime": now,
            "layout": 3,
        }
        if value_schema is not None:
            from kstore.schema import new_schema_entry

            metadata["schemas"] = [new_schema_entry(value_schema, key_schema, 1, now)]
        elif key_schema is not None:
            raise InvalidConfigurationError(
                "key_schema needs a value_schema: only typed topics have typed keys"
            )

        def build(state: TopicState) -> list[Action]:
            if state.metadata is not None and not state.deleted:
                raise TopicAlreadyExistsError(f"topic {name!r} already exists")
            actions: list[Action] = [protocol_action()] if state.version < 0 else []
            needed, writer = TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION
            if state.min_reader_version < needed or state.min_writer_version < writer:
                # Readers that predate layout 3 (and typed topics) must refuse this topic, not
                # misread it; writers that predate its topic logs' version must not change it.
                actions.append(
                    protocol_action(
                        max(needed, state.min_reader_version), max(writer, state.min_writer_version)
                    )
                )
            return [*actions, {"metaData": metadata}]

        log = self._topic_log(name)
        result = log.commit(self._topic_state(name), build, operation="CREATE TOPIC")
        assert result is not None
        with self._lock:
            self._topic_logs[name] = result.state
        meta = result.state.to_metadata()
        assert meta is not None
        return meta

    def list_topics(self) -> list[str]:
        names = []
        for info in self.storage.list_dir(TOPICS):
            try:
                validate_topic_name(info.name)
            except ValueError:
                continue  # not ours (a stray file); never follow an unchecked name
            try:
                if self.topic_exists(info.name):
                    names.append(info.name)
            except KStoreError:
                names.append(info.name)  # visible, so that describe can report what is wrong
        return sorted(names)

    def _change_metadata(self, name: str, operation: str, change: Any) -> TopicMetadata:
        def build(state: TopicState) -> list[Action]:
            current = state.to_metadata()
            if current is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            return [{"metaData": change(dict(state.metadata or {}), current)}]

        result = self._topic_log(name).commit(self._topic_state(name), build, operation=operation)
        assert result is not None
        with self._lock:
            self._topic_logs[name] = result.state
        meta = result.state.to_metadata()
        assert meta is not None
        return meta

    def alter_topic_config(
        self,
        name: str,
        set: Mapping[str, Any] | None = None,
        delete: Iterable[str] = (),
    ) -> TopicMetadata:
        """Set some config values and return others to their defaults, in one commit."""
        updates = topic_config.validate_config(set or {})
        removals = list(delete)
        topic_config.validate_names(removals)

        def change(raw: dict[str, Any], current: TopicMetadata) -> dict[str, Any]:
            # Start from the config as read (unknown keys kept, unparseable values dropped) so
            # that a topic readable by this version is also alterable by it.
            merged = {k: v for k, v in current.config.items() if k not in removals}
            merged.update(updates)
            if merged.get("commit.logs") != current.config.get("commit.logs"):
                raise InvalidConfigurationError(
                    f"topic {name!r}: config 'commit.logs' is fixed when the topic is created "
                    "(changing it would move partitions between commit logs)"
                )
            topic_config.validate_config(
                {k: v for k, v in merged.items() if k in topic_config.SPECS}
            )
            return {**raw, "config": merged}

        return self._change_metadata(name, "ALTER CONFIG", change)

    def alter_topic_schema(
        self, name: str, value_schema: Any, key_schema: Any = None
    ) -> TopicMetadata:
        """Evolve a typed topic's schema (PROTOCOL.md 25): add nullable fields, widen numbers,
        relax NOT NULL. Anything else raises IncompatibleSchemaError naming the field, and
        changes nothing. Records already written are read with the new schema (fields they
        lack are null)."""
        from kstore.schema import (
            MAX_SCHEMA_VERSIONS,
            SchemaError,
            TopicSchema,
            check_evolution,
            new_schema_entry,
        )

        def change(raw: dict[str, Any], current: TopicMetadata) -> dict[str, Any]:
            history = current.schema_history
            if not history:
                raise SchemaError(
                    f"topic {name!r} is a binary (untyped) topic; a schema can only be given "
                    "when a topic is created"
                )
            latest = history[-1]
            key = key_schema if key_schema is not None else latest.key_declared
            entry = new_schema_entry(value_schema, key, latest.id + 1, int(time.time() * 1000))
            proposed = TopicSchema.from_entry(entry, "schema")
            check_evolution(latest, proposed)
            if proposed.value_declared == latest.value_declared:
                raise SchemaError(f"topic {name!r}: the schema is unchanged")
            if len(history) >= MAX_SCHEMA_VERSIONS:
                raise SchemaError(f"topic {name!r} has {len(history)} schema versions, the limit")
            return {**raw, "schemas": [*raw["schemas"], entry]}

        return self._change_metadata(name, "ALTER SCHEMA", change)

    def add_partitions(self, name: str, total: int) -> TopicMetadata:
        """Grow the topic to ``total`` partitions (Kafka allows no shrinking)."""
        _check_partitions(total)

        def change(raw: dict[str, Any], current: TopicMetadata) -> dict[str, Any]:
            if total <= current.partitions:
                raise InvalidPartitionsError(
                    f"topic {name!r} has {current.partitions} partitions; the new count {total} "
                    "must be larger"
                )
            return {**raw, "partitions": total}

        return self._change_metadata(name, "ADD PARTITIONS", change)

    def delete_topic(self, name: str) -> None:
        """Delete a topic (PROTOCOL.md 17.3): first every log of the incarnation is sealed with
        ``topicDeleted`` (a writer holding the old state is refused on its next commit with
        TopicDeletedError, so nothing is committed into it afterwards), then the ``delete``
        commit makes the topic invisible to new lookups at once (its name can be used again).
        The files stay readable for the topic's ``file.delete.delay.ms``, so a reader in the
        middle of a read finishes; :func:`kstore.retention.purge_deleted_topics` (and vacuum)
        removes them after that."""
        for _ in range(_MAX_DELETE_ROUNDS):
            meta = self.topic(name)
            # A topic log this version may not write is refused before any seal is written.
            check_writer_version(self._topic_state(name))
            deleted_ms = int(time.time() * 1000)
            self._seal_deleted(meta, deleted_ms)
            result = self._topic_log(name).commit(
                self._topic_state(name),
                _delete_build(meta, deleted_ms),
                operation="DELETE TOPIC",
            )
            if result is not None:
                break  # else partitions were added since the seals: seal them too
        else:
            raise ConcurrentModificationError(
                f"topic {name!r}: partitions kept being added while it was being deleted; "
                "its logs are sealed (writes are refused): delete it again"
            )
        with self._lock:
            self._topic_logs[name] = result.state
            for key in [k for k in self._partitions if k[0] == name]:
                del self._partitions[key]
            for shared in [k for k in self._shared_logs if k[0] == name]:
                del self._shared_logs[shared]

    def _seal_deleted(self, meta: TopicMetadata, deleted_ms: int) -> None:
        """Commit ``topicDeleted`` to every log of the incarnation: its partition logs (layout
        2) or topic logs (layout 3), raising ``minWriterVersion`` to a version no writer
        supports, so that older writers are refused too, and leaving ``minReaderVersion`` as it
        is, so that readers go on reading."""
        from kstore.manifest import PartitionState

        body = {"topic": meta.name, "id": meta.topic_id, "deletedTime": deleted_ms}
        logs: list[tuple[Log[Any], int]] = []
        if meta.layout == 3:
            for shared in self.topic_logs(meta.name, meta):
                logs.append((shared.log, TOPIC_LOG_VERSION))
        else:
            for p in range(meta.partitions):
                directory = f"{partition_dir(meta.name, meta.topic_id, p)}/_log"
                logs.append((Log(self.storage, directory, PartitionState, retry=self.retry), 1))

        def seal(log: Log[Any], first_reader: int) -> None:
            def build(state: LogState) -> list[Action] | None:
                reader = state.min_reader_version if state.version >= 0 else first_reader
                return [
                    {
                        "protocol": {
                            "minReaderVersion": reader,
                            "minWriterVersion": DELETED_WRITER_VERSION,
                        }
                    },
                    {"topicDeleted": body},
                ]

            state = log.load()
            if state.topic_deleted is not None:
                return  # sealed by an earlier, interrupted deletion
            with contextlib.suppress(TopicDeletedError):  # a concurrent deleter sealed it
                log.commit(state, build, operation="DELETE TOPIC", info={"topic": meta.name})

        if self.storage.is_remote and len(logs) > 1:
            with ThreadPoolExecutor(min(8, len(logs))) as pool:
                list(pool.map(lambda entry: seal(*entry), logs))
        else:
            for log, first_reader in logs:
                seal(log, first_reader)

    def describe_topic(self, name: str) -> TopicDescription:
        meta = self.topic(name)
        parts = []
        if meta.layout == 3:
            # One read per topic log, not one per partition.
            logs = [log.state() for log in self.topic_logs(name, meta)]
            for p in range(meta.partitions):
                state = logs[log_index(p, meta.commit_logs)].partition(p)
                parts.append(_describe_partition(p, state))
            return TopicDescription(meta, parts)
        for p in range(meta.partitions):
            parts.append(_describe_partition(p, self.partition_state(name, p, meta)))
        return TopicDescription(meta, parts)

    # -- partitions ----------------------------------------------------------------------------

    def partition_state(
        self, topic: str, partition: int, metadata: TopicMetadata | None = None
    ) -> PartitionState:
        """A partition's newest manifest state. Reads only the manifest log, without loading
        the data libraries (unless this store has already opened the partition for data)."""
        meta = metadata or self.topic(topic)
        with self._lock:
            opened = self._partitions.get((topic, meta.topic_id, partition))
        if opened is not None and (opened.topic_log is not None or meta.layout != 3):
            return opened.state()
        if meta.layout == 3:
            self.partition_directory(topic, partition, meta)  # checks the number
            return self.topic_log(topic, meta, partition).state().partition(partition)
        from kstore.manifest import PartitionState

        log = Log(
            self.storage,
            f"{self.partition_directory(topic, partition, meta)}/_log",
            PartitionState,
            retry=self.retry,
        )
        return log.load()

    def partition_directory(self, topic: str, partition: int, metadata: TopicMetadata) -> str:
        """The partition's directory; UnknownTopicOrPartitionError for a number out of range."""
        if (
            not isinstance(partition, int)
            or isinstance(partition, bool)
            or not 0 <= partition < metadata.partitions
        ):
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{metadata.partitions - 1}; "
                f"{partition!r} does not exist"
            )
        return partition_dir(topic, metadata.topic_id, partition)

    def partition(
        self, topic: str, partition: int, metadata: TopicMetadata | None = None
    ) -> Partition:
        """The partition object (shared within this Store, so its cached state is shared)."""
        meta = metadata or self.topic(topic)
        if (
            not isinstance(partition, int)
            or isinstance(partition, bool)
            or not 0 <= partition < meta.partitions
        ):
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{meta.partitions - 1}; {partition!r} does not exist"
            )
        key = (topic, meta.topic_id, partition)
        with self._lock:
            existing = self._partitions.get(key)
        if existing is not None and existing.topic_log is None and meta.layout == 3:
            # Upgraded to layout 3 since it was opened: its partition log is sealed.
            with self._lock:
                if self._partitions.get(key) is existing:
                    del self._partitions[key]
            existing = None
        if existing is not None:
            if meta.schemas and meta.schemas[-1].get("id", 0) > existing.layout.schema_id:
                self._adopt_layout(existing, meta)
            return existing
        interval = int(meta.effective_config["checkpoint.interval"])
        from kstore.partition import Partition
        from kstore.segments import layout_of

        created = Partition(
            self.storage,
            topic,
            partition,
            partition_dir(topic, meta.topic_id, partition),
            checkpoint_interval=interval,
            cache=self.segment_cache,
            retry=self.retry,
            layout=layout_of(meta),
            topic_log=self.topic_log(topic, meta, partition) if meta.layout == 3 else None,
        )
        with self._lock:
            return self._partitions.setdefault(key, created)

    def topic_log(self, topic: str, metadata: TopicMetadata, partition: int) -> TopicLog:
        """Layout 3: the topic log that ``partition`` belongs to (shared within this Store,
        so all its partitions see one state and tail it with one request per poll)."""
        if metadata.layout != 3:
            raise ValueError(f"topic {topic!r} has layout {metadata.layout}: no topic logs")
        index = log_index(partition, metadata.commit_logs)
        key = (topic, metadata.topic_id, index)
        with self._lock:
            existing = self._shared_logs.get(key)
        if existing is not None:
            return existing
        created = TopicLog(
            self.storage,
            shared_log_dir(topic_data_dir(topic, metadata.topic_id), index),
            topic=topic,
            index=index,
            checkpoint_interval=int(metadata.effective_config["checkpoint.interval"]),
            retry=self.retry,
        )
        with self._lock:
            return self._shared_logs.setdefault(key, created)

    def topic_logs(self, topic: str, metadata: TopicMetadata | None = None) -> list[TopicLog]:
        """Layout 3: every topic log of the topic, by index."""
        meta = metadata or self.topic(topic)
        return [
            self.topic_log(topic, meta, k) for k in range(min(meta.commit_logs, meta.partitions))
        ]

    def _adopt_layout(self, part: Partition, meta: TopicMetadata) -> None:
        """Move a shared partition object to a newer schema version (never back)."""
        from kstore.segments import layout_of

        layout = layout_of(meta)
        with self._lock:
            if layout.schema_id > part.layout.schema_id:
                part.layout = layout


def require_layout3(meta: TopicMetadata, writer: str) -> None:
    """Refuse ``writer`` (what would write: "compaction", "DeleteRecords", ...) on a layout-2
    topic: this version reads layout 2 but writes only layout 3 (PROTOCOL.md 3.4)."""
    if meta.layout != 3:
        raise LayoutUpgradeRequiredError(layout2_refusal(meta.name, writer))


def layout2_refusal(topic: str, writer: str) -> str:
    return (
        f"topic {topic!r} has layout 2, which this version reads but no longer writes: "
        f"{writer} refused; run `kstore topics upgrade {topic}` to move it to layout 3 in place"
    )


def _delete_build(meta: TopicMetadata, deleted_ms: int) -> Any:
    """The build of a topic's ``delete`` commit, after its logs were sealed; None (nothing
    committed) when partitions were added since, so that the caller seals them first."""
    name = meta.name

    def build(state: TopicState) -> list[Action] | None:
        current = state.to_metadata()
        if current is None or current.topic_id != meta.topic_id:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} was deleted by another client meanwhile"
            )
        if (current.partitions, current.commit_logs) != (meta.partitions, meta.commit_logs):
            return None
        body = {
            "id": meta.topic_id,
            "deletedTime": deleted_ms,
            "fileDeleteDelayMs": int(meta.effective_config["file.delete.delay.ms"]),
            "layout": meta.layout,
            "version": state.version + 1,
        }
        return [{"delete": body}]

    return build


def _check_partitions(count: object) -> None:
    if not isinstance(count, int) or isinstance(count, bool):
        raise InvalidPartitionsError(
            f"partition count must be an integer, got {type(count).__name__}"
        )
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidPartitionsError(
            f"partition count {count} is out of range [1, {MAX_PARTITIONS}]"
        )


def _describe_partition(p: int, state: PartitionState) -> PartitionDescription:
    segs = state.segments
    return PartitionDescription(
        partition=p,
        log_start_offset=state.start_offset,
        log_end_offset=state.end_offset,
        segments=len(segs),
        size_bytes=state.size_bytes,
        records=state.record_count,
        oldest_timestamp_ms=min((s.min_timestamp_ms for s in segs), default=None),
        newest_timestamp_ms=max((s.max_timestamp_ms for s in segs), default=None),
        version=state.version,
    )
