"""The durable log store: one shared, segmented, append-only log for every queue.

Modules, each importing only those above it: ``errors``, ``options``, ``records`` (the
format), ``segments`` (files and the scan), ``index`` (one queue in memory),
``compaction`` (segment accounting, what is still needed), ``state`` (what the store
knows), ``recovery`` (replay), ``completion`` (tickets), ``store`` (``LogStore``).
"""

from __future__ import annotations

from broker.store.log.errors import (
    CorruptRecord,
    NoSuchRecord,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreIOError,
    StoreLocked,
    StoreUsageError,
    TooManyPending,
)
from broker.store.log.options import Durability, LogOptions
from broker.store.log.records import Meta, QueueKey
from broker.store.log.store import Appended, LogStore, QueueBounds, StoredRecord, StoreStats

__all__ = [
    "Appended",
    "CorruptRecord",
    "Durability",
    "LogOptions",
    "LogStore",
    "Meta",
    "NoSuchRecord",
    "QueueBounds",
    "QueueKey",
    "RecordTooLarge",
    "StoreClosed",
    "StoreError",
    "StoreIOError",
    "StoreLocked",
    "StoreStats",
    "StoreUsageError",
    "StoredRecord",
    "TooManyPending",
]
