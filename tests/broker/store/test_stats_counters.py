"""The log store's group-commit and fsync counters (``LogStore.stats``): the figures the
hub exports to Prometheus.  Exact where the writer's batching cannot change them."""

from __future__ import annotations

from pathlib import Path

from broker.store.log import Durability, LogOptions, LogStore

Q = ("orders", 1)
WAIT = 10.0


def test_batches_count_every_record_once_and_fsyncs_take_time(tmp_path: Path) -> None:
    with LogStore(tmp_path, LogOptions(durability=Durability.FSYNC)) as store:
        before = store.stats()
        assert (before.batches, before.batch_records, before.sync_seconds) == (0, 0, 0.0)
        last = None
        for i in range(50):
            last = store.append(Q, b"m%d" % i)
        assert last is not None and store.wait(last.ticket, WAIT)
        after = store.stats()
        # however the writer grouped them, 50 records went out in 1..50 batches
        assert after.batch_records == 50
        assert 1 <= after.batches <= 50
        assert after.syncs >= 1 and after.sync_seconds > 0.0
        assert after.live_records == 50


def test_os_mode_writes_batches_without_fsyncs_after_them(tmp_path: Path) -> None:
    with LogStore(tmp_path, LogOptions(durability=Durability.OS)) as store:
        done = store.append(Q, b"one")
        assert store.wait(done.ticket, WAIT)
        stats = store.stats()
        assert (stats.batch_records, stats.sync_seconds) == (1, 0.0)
