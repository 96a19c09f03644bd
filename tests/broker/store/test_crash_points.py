"""Compaction crash-safe at every point: the files as a kill -9 would leave them, after
every write of the writer and around every segment deletion, all recover to the same
contents.

The store is driven to a known content first (appends, removals, definitions, all
complete); from then on only compaction writes, so every moment's files must recover to
exactly that content.  The moments are taken by wrapping the writer's ``os.write`` and
the segment deletion (a copy of the directory's files each time: what the kernel holds,
which is what a killed process leaves).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.store.log import LogStore
from broker.store.log import store as store_module

from .kit import contents, small, wait_until

Q = ("orders", 1)
R = ("audit", 2)


def _snapshotter(directory: Path, into: Path) -> Callable[[], None]:
    count = 0

    def snapshot() -> None:
        nonlocal count
        count += 1
        target = into / f"{count:05d}"
        target.mkdir()
        for entry in directory.iterdir():
            if entry.name != "LOCK":
                shutil.copy2(entry, target / entry.name)

    return snapshot


def test_every_moment_of_compaction_recovers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "store"
    moments = tmp_path / "moments"
    moments.mkdir()
    options = small(compact_ratio=0.6)
    snapshot = _snapshotter(directory, moments)
    taking = threading.Event()
    real_write = os.write
    real_delete = store_module.segments.delete_segment

    def write(fd: int, data: Any) -> int:
        written = real_write(fd, data)
        if taking.is_set() and threading.current_thread().name == "store-writer":
            snapshot()
        return written

    def delete_segment(where: Path, segment: int) -> None:
        if taking.is_set():
            snapshot()
        real_delete(where, segment)
        if taking.is_set():
            snapshot()

    # compact_ratio 0.01: no compaction while the content is made
    with LogStore(directory, small(compact_ratio=0.01)) as store:
        store.put_value("queue/orders/1", b"v1")
        store.put_value("gone", b"x")
        for i in range(1, 121):
            store.append(Q, b"q%04d" % i * 8)
            store.append(R, b"r%04d" % i * 8)
        store.delete_value("gone")
        store.put_value("queue/orders/1", b"v2")
        store.update(Q, 32, store_module.Meta(delivery_count=5))
        for i in range(1, 121):
            if i % 4:
                store.remove(Q, i)
            if i % 9:
                store.remove(R, i)
        expected = contents(store)
        assert store.stats().compactions == 0
    # reopened with compaction on: from now on only compaction writes
    monkeypatch.setattr(store_module.os, "write", write)
    monkeypatch.setattr(store_module.segments, "delete_segment", delete_segment)
    taking.set()
    with LogStore(directory, options) as store:
        assert wait_until(lambda: store.stats().compactions >= 5)
        assert wait_until(lambda: not store.stats().compacting)
        taking.clear()
    monkeypatch.undo()
    taken = sorted(moments.iterdir())
    assert len(taken) > 10, "compaction wrote too little to test"
    for moment in taken:
        with LogStore(moment, options) as recovered:
            assert contents(recovered) == expected, moment.name
            assert recovered.values() == {"queue/orders/1": b"v2"}, moment.name
            assert recovered.meta(Q, 32).delivery_count == 5
        shutil.rmtree(moment)
