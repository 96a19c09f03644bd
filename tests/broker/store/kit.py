"""Helpers for the log store tests: small options, open/close, a full read-out."""

from __future__ import annotations

from pathlib import Path

from broker.store.log import Durability, LogOptions, LogStore, QueueKey
from tests.polling import wait_until  # noqa: F401  (re-exported for the store tests)


def small(durability: Durability = Durability.FSYNC, **kw: object) -> LogOptions:
    values = {
        "segment_size": 4096,
        "max_record_size": 2048,
        "compact_step": 7,
        "durability": durability,
    }
    values.update(kw)
    return LogOptions(**values)  # type: ignore[arg-type]


def contents(store: LogStore) -> dict[QueueKey, dict[int, bytes]]:
    """Every live record of every queue, read back from the log."""
    return {q: {r.seq: r.blob for r in store.records(q)} for q in store.queues()}


def segment_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.seg"))
