"""Durability modes and the documented default limits of the log store."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from broker.store.log.errors import StoreUsageError

KIB = 1024
MIB = 1024 * KIB


class Durability(StrEnum):
    """When an append counts as complete (its ticket is reported done).

    - ``FSYNC``: after the batch holding it was written and fsync'ed (survives power loss).
    - ``BATCH``: after it was written to the kernel; the writer fsyncs every
      ``batch_interval`` seconds, so a power loss can take the last interval, a killed
      process loses nothing.
    - ``OS``: after it was written to the kernel; the store never fsyncs on its own (only
      when a segment is finished and on close).
    """

    FSYNC = "fsync"
    BATCH = "batch"
    OS = "os"


@dataclass(frozen=True, slots=True)
class LogOptions:
    """Limits of one store; every value has a documented default."""

    durability: Durability = Durability.FSYNC
    #: a segment file is finished once it holds this many octets (a record never spans two)
    segment_size: int = 64 * MIB
    #: largest record (header + queue key + metadata + blob); the broker's frame limit is 16 MiB
    max_record_size: int = 16 * MIB + 4 * KIB
    #: ``batch`` mode: seconds between fsyncs
    batch_interval: float = 0.010
    #: appends accepted but not yet written; past it ``append`` raises TooManyPending
    max_pending: int = 100_000
    #: octets of encoded records the writer takes per write()+fsync at most
    max_batch_bytes: int = 8 * MIB
    #: a finished segment whose live octets fall below this share of its size is compacted
    compact_ratio: float = 0.5
    #: records copied per compaction step (between two write batches, so appends go on)
    compact_step: int = 1_000
    #: ``fsync``/``batch`` modes: octets of zeros the writer keeps written ahead of the
    #: head segment's data, so that its syncs are ``fdatasync`` of blocks already on disk
    #: (no file-size change, so no file-system journal commit per batch); a segment is
    #: cut back to its data when finished, and recovery cuts a zero tail.  0: off; at
    #: most the segment's size.  Off by default: measured, no steady throughput gain
    #: (docs/broker.md, "Zeros ahead of the head"; ``bench/bench_store.py --zeros-ahead``).  The
    #: kill -9 losses once seen with it on were an index defect (test_recovery_order.py).
    preallocate: int = 0

    def __post_init__(self) -> None:
        if not 4 * KIB <= self.segment_size < 4 * 1024 * MIB:
            raise StoreUsageError("segment_size must be within 4 KiB and 4 GiB")
        if not 1 * KIB <= self.max_record_size <= self.segment_size - 64:
            raise StoreUsageError("max_record_size must be within 1 KiB and segment_size - 64")
        if not 0 < self.batch_interval < 3600:  # (NaN fails this too)
            raise StoreUsageError("batch_interval must be within 0 and 3600 seconds")
        if self.max_pending < 1 or self.max_batch_bytes < 1 or self.compact_step < 1:
            raise StoreUsageError("max_pending, max_batch_bytes and compact_step must be >= 1")
        if self.preallocate < 0:
            raise StoreUsageError("preallocate must be >= 0 (it is capped at segment_size)")
        if not 0.0 < self.compact_ratio < 1.0:
            raise StoreUsageError("compact_ratio must be within 0 and 1")
