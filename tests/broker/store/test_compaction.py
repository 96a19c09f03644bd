"""Compaction: space comes back while appends go on, and nothing comes back to life.

Segments are 4 KiB here, so a few hundred records fill dozens of them and the writer
compacts as the tests remove records.
"""

from __future__ import annotations

import threading
from pathlib import Path

from broker.store.log import LogStore, Meta, QueueBounds
from broker.store.log.compaction import SegmentTable

from .kit import contents, segment_files, small, wait_until

Q = ("orders", 1)
R = ("audit", 7)


def _blob(i: int) -> bytes:
    return b"%06d" % i * 10


def test_tombstone_rule() -> None:
    table = SegmentTable(0.5)
    for segment in (2, 5, 9):
        table.add(segment, 100)
    assert table.tombstone_needed(origin=2, own=9)
    assert table.tombstone_needed(origin=5, own=9)
    assert not table.tombstone_needed(origin=6, own=9)
    assert not table.tombstone_needed(origin=9, own=9)
    table.drop(5)
    assert not table.tombstone_needed(origin=3, own=9)


def test_victim_choice() -> None:
    table = SegmentTable(0.5)
    table.add(1, 100).live = 60
    table.add(2, 100).live = 30
    table.add(3, 100).live = 10
    table.add(4, 100).live = 0
    assert table.victim(head=4) == 2  # the oldest below the ratio, not the emptiest
    assert table.victim(head=2) == 3
    table.segments[1].damaged = True
    assert table.victim(head=4) == 1
    assert SegmentTable(0.5).victim(head=1) is None


def test_space_is_reclaimed_and_live_records_survive(tmp_path: Path) -> None:
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 601):
            store.append(Q, _blob(i))
        store.flush()
        before = len(segment_files(tmp_path))
        keep = set(range(1, 601, 10))
        for i in range(1, 601):
            if i not in keep:
                store.remove(Q, i)
        assert wait_until(lambda: store.stats().compactions >= before // 2)
        assert wait_until(lambda: len(segment_files(tmp_path)) < before // 2)
        assert contents(store)[Q] == {i: _blob(i) for i in sorted(keep)}
    with LogStore(tmp_path, options) as store:
        assert contents(store)[Q] == {i: _blob(i) for i in sorted(keep)}
        assert store.bounds(Q) == QueueBounds(1, 600, len(keep))


def test_appends_go_on_during_compaction(tmp_path: Path) -> None:
    options = small()
    expected: dict[int, bytes] = {}
    with LogStore(tmp_path, options) as store:
        for i in range(1, 301):
            store.append(Q, _blob(i))
        stop = threading.Event()

        def remove_all() -> None:
            for i in range(1, 301):
                store.remove(Q, i)
            stop.set()

        remover = threading.Thread(target=remove_all)
        remover.start()
        while not stop.is_set() or len(expected) < 300:
            appended = store.append(R, _blob(len(expected)))
            expected[appended.seq] = _blob(len(expected))
        remover.join()
        assert wait_until(lambda: store.stats().compactions > 5)
        assert contents(store) == {Q: {}, R: expected}
    with LogStore(tmp_path, options) as store:
        assert contents(store) == {Q: {}, R: expected}
        assert store.bounds(Q) == QueueBounds(301, 300, 0)


def test_sequence_numbers_outlive_the_segments_that_held_them(tmp_path: Path) -> None:
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 201):
            store.append(Q, _blob(i))
            store.remove(Q, i)
            store.append(R, _blob(i))  # R keeps segments rolling
        assert wait_until(lambda: store.stats().compactions > 10)
    with LogStore(tmp_path, options) as store:
        assert store.bounds(Q) == QueueBounds(201, 200, 0)
        assert store.append(Q, b"x").seq == 201


def test_metadata_updates_outlive_compaction(tmp_path: Path) -> None:
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 101):
            store.append(Q, _blob(i))
        store.update(Q, 50, Meta(delivery_count=4, put_backs=2, priority=True, deadline=7.5))
        for i in range(1, 401):
            store.append(R, _blob(i))
            store.remove(R, i)
        store.update(Q, 60, Meta(delivery_count=1))
        for i in range(1, 101):
            if i not in (50, 60):
                store.remove(Q, i)
        assert wait_until(lambda: len(segment_files(tmp_path)) < 8)
    with LogStore(tmp_path, options) as store:
        assert store.meta(Q, 50) == Meta(4, 2, True, 7.5)
        assert store.meta(Q, 60) == Meta(1)
        assert contents(store)[Q] == {50: _blob(50), 60: _blob(60)}


def test_deleted_definitions_stay_deleted(tmp_path: Path) -> None:
    """put v1, delete, put v2 (and a name deleted for good): compaction of the segment with
    the tombstone must neither drop v2 nor bring v1 or the deleted name back."""
    options = small()
    with LogStore(tmp_path, options) as store:
        store.put_value("queue/a", b"v1")
        store.put_value("gone", b"old")
        for i in range(1, 60):
            store.append(Q, _blob(i))  # v1 stays in the first segment, kept by this
        for i in range(1000, 1060):  # a fresh head for the tombstones
            store.append(R, _blob(i))
            store.remove(R, i)
        store.delete_value("queue/a")
        store.delete_value("gone")
        for i in range(1, 80):
            store.append(R, _blob(i))
            store.remove(R, i)
        store.put_value("queue/a", b"v2")
        for i in range(80, 300):
            store.append(R, _blob(i))
            store.remove(R, i)
        assert wait_until(lambda: store.stats().compactions > 10)
        assert store.values() == {"queue/a": b"v2"}
    with LogStore(tmp_path, options) as store:
        assert store.values() == {"queue/a": b"v2"}
        store.delete_value("queue/a")
        for i in range(300, 600):
            store.append(R, _blob(i))
            store.remove(R, i)
        assert wait_until(lambda: store.stats().compactions > 10)
    with LogStore(tmp_path, options) as store:
        assert store.values() == {}
        assert len(contents(store)[Q]) == 59


def test_purge_outlives_compaction(tmp_path: Path) -> None:
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 40):
            store.append(Q, _blob(i))
            store.append(R, _blob(i))  # R's records keep these segments alive
        store.purge(Q)
        for i in range(1, 300):
            store.append(("churn", 1), _blob(i))
            store.remove(("churn", 1), i)
        assert wait_until(lambda: store.stats().compactions > 10)
    with LogStore(tmp_path, options) as store:
        assert contents(store)[Q] == {}
        assert len(contents(store)[R]) == 39
        assert store.bounds(Q) == QueueBounds(40, 39, 0)


def test_a_removal_outlives_compaction_while_its_record_segment_stays(tmp_path: Path) -> None:
    """The tombstone's segment is compacted while the well-filled segment holding the
    removed record stays: the tombstone must be copied, or the record comes back."""
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 31):
            store.append(Q, _blob(i))
        for i in range(1, 60):  # a fresh head for the tombstone
            store.append(R, _blob(i))
            store.remove(R, i)
        store.remove(Q, 5)
        for i in range(60, 300):
            store.append(R, _blob(i))
            store.remove(R, i)
        assert wait_until(lambda: store.stats().compactions > 10)
    with LogStore(tmp_path, options) as store:
        assert sorted(contents(store)[Q]) == [i for i in range(1, 31) if i != 5]


def test_browsing_while_compaction_moves_records(tmp_path: Path) -> None:
    """Readers browse while the writer copies records and deletes segments under them:
    every read gives the record's own blob, none fails."""
    options = small()
    with LogStore(tmp_path, options) as store:
        for i in range(1, 801):
            store.append(Q, _blob(i))
        store.flush()
        done = threading.Event()
        problems: list[str] = []
        browsed = [0, 0]

        def browse(k: int) -> None:
            while not done.is_set():
                for record in store.records(Q):
                    browsed[k] += 1
                    if record.blob != _blob(record.seq):
                        problems.append(f"seq {record.seq}: {record.blob[:12]!r}")

        readers = [threading.Thread(target=browse, args=(k,)) for k in range(2)]
        for reader in readers:
            reader.start()
        try:
            for i in range(1, 801):
                if i % 7:
                    store.remove(Q, i)
            assert wait_until(lambda: store.stats().compactions > 10)
            assert wait_until(lambda: not store.stats().compacting)
        finally:
            done.set()
            for reader in readers:
                reader.join()
        assert problems == []
        assert all(browsed)
        assert sorted(contents(store)[Q]) == [i for i in range(1, 801) if i % 7 == 0]
