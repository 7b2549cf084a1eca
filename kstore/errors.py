"""Errors. One root, Kafka's names where they fit.

Every error carries ``retriable``: True when the same call may succeed if repeated (a conflict,
a timeout), False when repeating it cannot help (bad input, corruption, fencing).
"""

from __future__ import annotations


class KStoreError(Exception):
    """Root of every error this library raises."""

    retriable: bool = False


# --- input -------------------------------------------------------------------------------------


class InvalidTopicError(KStoreError, ValueError):
    """A topic name breaks the naming rules."""


class InvalidGroupIdError(KStoreError, ValueError):
    """A consumer group name breaks the naming rules."""


class InvalidConfigurationError(KStoreError, ValueError):
    """A config name is unknown or its value is out of range."""


class InvalidArgumentError(KStoreError, ValueError):
    """An argument of a call is outside what it allows; the message names the argument."""


class InvalidArgumentTypeError(InvalidArgumentError, TypeError):
    """An argument of a call is of the wrong type (a ``TypeError`` too, as Python's own are)."""


class InvalidPartitionsError(KStoreError, ValueError):
    """A partition count is invalid (zero, negative, or not an increase)."""


class InvalidStoreError(KStoreError, ValueError):
    """A store URL or storage option is unusable."""


class RecordTooLargeError(KStoreError, ValueError):
    """A record exceeds ``max.message.bytes`` or the producer's ``max_request_size``."""


class InvalidRecordError(KStoreError, TypeError):
    """A record (or a batch of records) does not have the expected shape or types."""


# --- lookup ------------------------------------------------------------------------------------


class UnknownTopicOrPartitionError(KStoreError):
    """The topic or partition does not exist (or was deleted)."""


class TopicAlreadyExistsError(KStoreError):
    """A topic of that name already exists."""


class OffsetOutOfRangeError(KStoreError):
    """The requested offset is outside the partition's live range."""


class StoreNotFoundError(KStoreError):
    """No store exists at the URL (and creating one was not asked for)."""


# --- format and data ---------------------------------------------------------------------------


class CorruptRecordError(KStoreError):
    """A segment's bytes do not match its checksum, or it cannot be decoded."""


class CorruptLogError(KStoreError):
    """A manifest log file or checkpoint is malformed, truncated or inconsistent."""


class MissingSegmentError(CorruptLogError):
    """A segment the manifest references is missing from storage."""


class UnsupportedFormatVersionError(KStoreError):
    """The store or log was written by a newer format version than this reader knows."""


class UnsafeStorageError(KStoreError):
    """The filesystem offers no atomic put-if-absent; writing could lose commits."""


# --- commits -----------------------------------------------------------------------------------


class CommitConflictError(KStoreError):
    """Another writer committed the same log version first; reload and retry.

    Raised out of the library only when the bounded retries are exhausted.
    """

    retriable = True


class CommitStateUnknownError(KStoreError):
    """A commit may or may not have landed and the log could not tell which.

    Never replay such a commit blindly: read the log to resolve it.
    """

    retriable = True


class StaleWriteError(KStoreError):
    """A written file is too old to be committed: vacuum may already take it for an orphan.

    Nothing was committed; write the data again under a new name and commit that.
    """

    retriable = True


class WithdrawnCommitError(KStoreError):
    """A commit landed too late to be sure its files were still there: vacuum may have taken
    them for orphans while the writer was paused inside the write (PROTOCOL.md 23.2). The
    writer withdrew what the commit added (its records are not acknowledged and no reader is
    left with a missing file); write the records again, as new ones.

    Not retriable as is: the withdrawn commit's sequence numbers stay used.
    """


class ConcurrentModificationError(KStoreError):
    """A concurrent commit removed or changed what this commit depends on (not retriable as is)."""


class StorageError(KStoreError):
    """The storage failed in a way that may be transient (network, throttling)."""

    retriable = True


class DurabilityUnknownError(StorageError):
    """A file is in place but the storage could not make it durable (an fsync failed after it
    became visible). It may be lost in a machine crash, so it must not be acknowledged as
    durable; once one fsync has failed, a later one proves nothing (the kernel may have dropped
    the pages it could not write)."""


class StorageTimeoutError(StorageError):
    """The storage did not answer a call within its deadline (the storage option
    ``timeout_ms``). Like any storage failure, a write may or may not have landed."""


# --- producers, groups -------------------------------------------------------------------------


class ProducerFencedError(KStoreError):
    """A newer instance of the same producer identity (transactional id) took over."""


class OutOfOrderSequenceError(KStoreError):
    """A producer's batch sequence does not follow the last one committed to the partition."""


class DuplicateSequenceError(KStoreError):
    """A producer batch was already committed (its sequence is at or below the last one)."""


class KafkaTimeoutError(KStoreError):
    """An operation did not finish within its configured time."""

    retriable = True


class CommitFailedError(KStoreError):
    """A consumer-group offset commit was rejected (fenced generation, or not a member)."""


class IllegalStateError(KStoreError):
    """The call is not valid in the object's current state (closed, not subscribed, ...)."""


class TopicUpgradedError(KStoreError):
    """The partition log was sealed by ``kstore topics upgrade``: the topic is in layout 3 now
    and is written through its topic log (PROTOCOL.md 8.29, 27). Re-read the topic's metadata."""


class LayoutUpgradeRequiredError(KStoreError):
    """The topic is in layout 2, which this version reads but no longer writes (PROTOCOL.md 3.4):
    ``kstore topics upgrade TOPIC`` moves it to layout 3 in place (27)."""


class TopicDeletedError(UnknownTopicOrPartitionError):
    """The log belongs to a topic incarnation that was deleted: its logs are sealed and take no
    more commits (PROTOCOL.md 17.3). Its files stay readable for ``file.delete.delay.ms``; a
    topic of the same name may have been created since."""


# --- storage that refuses writes, a missing bucket ----------------------------------------------


class StorageNotWritableError(KStoreError):
    """The storage refused a write for a reason that repeating it cannot fix: no space left
    on the device (``ENOSPC``), a disk quota (``EDQUOT``), a read-only filesystem (``EROFS``)
    or a permission (``EACCES``, ``EPERM``). Nothing was written by the call that raised it (a
    partial file is removed), so, unlike a :class:`StorageError`, its outcome is known.

    Not retriable: free space or make the storage writable, then send again. ``errno`` is the
    operating system's error number; ``path`` the store-relative path being written."""

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path


class BucketNotFoundError(StoreNotFoundError):
    """The S3 bucket of the store URL does not exist (kstore never creates buckets)."""
