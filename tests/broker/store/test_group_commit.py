"""Issue 10's group commit and ``batch`` durability, counted exactly.

Group commit: appends made while one fsync runs share the next one -- the writer's first
durable call is held (an injected ``fdatasync``, or ``pwritev`` with ``RWF_DSYNC`` where the
writer makes its write durable in the same call, that waits for the test), eight threads append
meanwhile, and once it is let go every one of their appends completes with exactly one
more fsync.  (``test_stats_counters.py`` allows anything from 1 to 50 batches: it could
not catch a writer that syncs each record.)

``batch``: a ticket completes once written, before any fsync (with an interval no test
reaches), and with a short interval an fsync follows by itself, with nothing appended
after.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from broker.store.log import Durability, LogOptions, LogStore
from broker.store.log import store as store_module
from tests.polling import WAIT, wait_until

Q = ("orders", 1)
THREADS = 8
EACH = 10


def test_appends_made_while_one_fsync_runs_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_sync = store_module.os.fdatasync
    real_pwritev = store_module.os.pwritev
    entered = threading.Event()
    go = threading.Event()
    calls: list[int] = []

    def durable(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the first batch's durable call waits for the test
            entered.set()
            go.wait(WAIT)

    def sync(fd: int) -> None:
        durable(fd)
        real_sync(fd)

    def pwritev(fd: int, parts: list[bytes], at: int, flags: int = 0) -> int:
        if flags:  # (RWF_DSYNC: written and synced in one call)
            durable(fd)
        return real_pwritev(fd, parts, at, flags)

    monkeypatch.setattr(store_module.os, "fdatasync", sync)
    monkeypatch.setattr(store_module.os, "pwritev", pwritev)
    with LogStore(tmp_path, LogOptions(durability=Durability.FSYNC)) as store:
        first = store.append(Q, b"first").ticket
        assert entered.wait(WAIT), "the writer never synced"
        tickets: list[list[int]] = [[] for _ in range(THREADS)]

        def append(k: int) -> None:
            for i in range(EACH):
                tickets[k].append(store.append(Q, b"t%d-%d" % (k, i)).ticket)

        threads = [threading.Thread(target=append, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert store.completed < first  # fsync mode: nothing completes before its sync
        go.set()
        last = max(max(ts) for ts in tickets)
        assert store.wait(last, WAIT)
        stats = store.stats()
        assert (stats.batches, stats.batch_records, stats.syncs) == (2, 1 + THREADS * EACH, 2)
        assert len(calls) == 2
    with LogStore(tmp_path) as store:
        assert store.bounds(Q).count == 1 + THREADS * EACH


def test_batch_mode_completes_on_write_and_syncs_by_its_interval(tmp_path: Path) -> None:
    never = LogOptions(durability=Durability.BATCH, batch_interval=3000.0)
    with LogStore(tmp_path / "never", never) as store:
        done = store.append(Q, b"x").ticket
        assert store.wait(done, WAIT)
        assert store.stats().syncs == 0  # completed once written: no fsync waited for
    soon = LogOptions(durability=Durability.BATCH, batch_interval=0.05)
    with LogStore(tmp_path / "soon", soon) as store:
        done = store.append(Q, b"x").ticket
        assert store.wait(done, WAIT)
        # nothing else is appended: the interval alone brings the fsync
        assert wait_until(lambda: store.stats().syncs >= 1), "batch mode never synced"
