"""The one error hierarchy of the log store.

``StoreError`` is the root.  Local misuse (a record too large, an unknown sequence number,
a closed store, too many appends pending) raises a ``StoreUsageError``; a failure of the
disk underneath (a write or fsync that failed) raises ``StoreIOError`` and leaves the store
closed for appends, because the kernel may have dropped dirty pages it could not write.
Corrupt bytes found on disk are never raised: recovery skips them with a log line.
"""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error the log store raises."""


class StoreUsageError(StoreError):
    """The caller asked for something the store does not allow."""


class RecordTooLarge(StoreUsageError):
    """A record (blob plus its header) is larger than ``max_record_size``."""


class TooManyPending(StoreUsageError):
    """``max_pending`` appends are waiting for the writer; retry after completions."""


class NoSuchRecord(StoreUsageError, KeyError):
    """The queue holds no live record with that sequence number."""


class StoreClosed(StoreUsageError):
    """The store was closed (or failed) and takes no more writes."""


class StoreIOError(StoreError):
    """The disk failed a write or an fsync: the store stops taking writes."""


class CorruptRecord(StoreError):
    """A record read back from its segment no longer matches its checksum."""


class StoreLocked(StoreError):
    """Another process has the store's directory open."""
