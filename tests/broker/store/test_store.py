"""LogStore through its API: real files, a real writer thread, restarts."""

from __future__ import annotations

import select
import threading
import time
from pathlib import Path

import pytest

from broker.store.log import (
    Durability,
    LogOptions,
    LogStore,
    Meta,
    NoSuchRecord,
    QueueBounds,
    RecordTooLarge,
    StoreClosed,
    StoreIOError,
    StoreLocked,
    StoreUsageError,
    TooManyPending,
)
from broker.store.log import store as store_module

from .kit import contents, segment_files, small, wait_until

Q = ("orders", 1)
R = ("orders", 2)
WAIT = 10.0


def test_append_read_restart(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        first = store.append(Q, b"one")
        second = store.append(Q, b"two", Meta(1, 2, True, 123.5))
        other = store.append(R, b"r1")
        assert (first.seq, second.seq, other.seq) == (1, 2, 1)
        assert store.wait(other.ticket, WAIT)
        assert store.completed >= other.ticket
        assert store.read(Q, 2).blob == b"two"
        assert store.meta(Q, 2) == Meta(1, 2, True, 123.5)
    with LogStore(tmp_path) as store:
        assert contents(store) == {Q: {1: b"one", 2: b"two"}, R: {1: b"r1"}}
        assert store.read(Q, 2).meta == Meta(1, 2, True, 123.5)
        assert store.append(Q, b"three").seq == 3


def test_sequence_numbers_survive_acks_and_restarts(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(5):
            store.append(Q, b"m%d" % i)
        for seq in range(1, 6):
            store.remove(Q, seq)
        assert store.bounds(Q) == QueueBounds(6, 5, 0)
    with LogStore(tmp_path) as store:
        assert store.bounds(Q) == QueueBounds(6, 5, 0)
        assert store.queues() == [Q]
        assert store.append(Q, b"next").seq == 6
        assert store.bounds(("nobody", 1)) == QueueBounds(1, 0, 0)


def test_remove_unknown_is_ignored_and_read_of_removed_raises(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        store.append(Q, b"x")
        store.remove(Q, 1)
        store.remove(Q, 1)
        store.remove(Q, 99)
        store.remove(("nobody", 3), 1)
        with pytest.raises(NoSuchRecord):
            store.read(Q, 1)
        with pytest.raises(NoSuchRecord):
            store.update(Q, 1, Meta(1))
        with pytest.raises(NoSuchRecord):
            store.meta(Q, 1)


def test_metadata_updates_survive_restart(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        store.append(Q, b"x")
        store.append(Q, b"y")
        store.update(Q, 1, Meta(delivery_count=3, put_backs=1, deadline=99.0))
    with LogStore(tmp_path) as store:
        assert store.meta(Q, 1) == Meta(3, 1, False, 99.0)
        assert store.meta(Q, 2) == Meta()


def test_browse_from_a_sequence_number(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(1, 11):
            store.append(Q, b"%d" % i)
        store.remove(Q, 4)
        for i in range(11, 3001):  # more than one chunk of the listing
            store.append(R, b"%d" % i)
        assert list(store.sequences(R)) == list(range(1, 2991))
        assert [r.seq for r in store.records(Q, 3)] == [3, 5, 6, 7, 8, 9, 10]
        assert list(store.sequences(Q, 10)) == [10]
        assert list(store.sequences(Q, 11)) == []
        store.update(Q, 6, Meta(delivery_count=2, priority=True))
        assert list(store.entries(Q, 5))[:2] == [(5, Meta()), (6, Meta(2, 0, True))]
        assert [r.blob for r in store.records(Q)][:3] == [b"1", b"2", b"3"]
        # browsing is non-destructive
        assert store.bounds(Q) == QueueBounds(1, 10, 9)


def test_purge_forgets_records_keeps_numbering(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(4):
            store.append(Q, b"%d" % i)
            store.append(R, b"%d" % i)
        store.purge(Q)
        assert store.bounds(Q) == QueueBounds(5, 4, 0)
    with LogStore(tmp_path) as store:
        assert store.bounds(Q) == QueueBounds(5, 4, 0)
        assert len(contents(store)[R]) == 4
        assert store.append(Q, b"after").seq == 5


def test_definitions_put_delete_restart(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        store.put_value("channel/orders", b"{}")
        store.put_value("queue/orders/1", b'{"Status": 1}')
        store.put_value("queue/orders/1", b'{"Status": 3}')
        store.put_value("router/r", b"x")
        store.delete_value("router/r")
        store.delete_value("never/there")
    with LogStore(tmp_path) as store:
        assert store.values() == {"channel/orders": b"{}", "queue/orders/1": b'{"Status": 3}'}
        assert store.values("queue/") == {"queue/orders/1": b'{"Status": 3}'}
        assert store.value("router/r") is None


@pytest.mark.parametrize("durability", list(Durability))
def test_durability_modes_complete_tickets(tmp_path: Path, durability: Durability) -> None:
    with LogStore(tmp_path, LogOptions(durability=durability, batch_interval=0.005)) as store:
        tickets = [store.append(Q, b"x" * 100).ticket for _ in range(50)]
        assert tickets == sorted(tickets)
        assert store.wait(tickets[-1], WAIT)
        assert store.flush(WAIT)
    with LogStore(tmp_path) as store:
        assert store.bounds(Q).count == 50


def test_fileno_signals_an_event_loop(tmp_path: Path) -> None:
    done: list[int] = []
    with LogStore(tmp_path, on_complete=done.append) as store:
        ticket = store.append(Q, b"x").ticket
        readable, _, _ = select.select([store.fileno()], [], [], WAIT)
        assert readable == [store.fileno()]
        assert store.wait(ticket, WAIT)
        assert store.drain() >= ticket
        assert done and done[-1] >= ticket
        # drained: not readable until something else completes
        readable, _, _ = select.select([store.fileno()], [], [], 0)
        assert readable == []
        later = store.append(Q, b"y").ticket
        readable, _, _ = select.select([store.fileno()], [], [], WAIT)
        assert readable and store.wait(later, WAIT) and store.drain() >= later


def test_concurrent_appenders_get_gap_free_numbers(tmp_path: Path) -> None:
    seqs: list[list[int]] = [[] for _ in range(8)]

    def produce(k: int) -> None:
        for i in range(200):
            appended = store.append(Q, b"%d:%d" % (k, i))
            seqs[k].append(appended.seq)
            if i % 50 == 0:
                assert store.wait(appended.ticket, WAIT)

    with LogStore(tmp_path, small()) as store:
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        every = sorted(s for chunk in seqs for s in chunk)
        assert every == list(range(1, 1601))
        for chunk in seqs:
            assert chunk == sorted(chunk)
    with LogStore(tmp_path) as store:
        got = contents(store)[Q]
    assert sorted(got) == list(range(1, 1601))
    for k, chunk in enumerate(seqs):
        assert [got[s] for s in chunk] == [b"%d:%d" % (k, i) for i in range(200)]


def test_limits_and_misuse(tmp_path: Path) -> None:
    options = LogOptions(max_record_size=1024, segment_size=64 * 1024)
    with LogStore(tmp_path, options) as store:
        with pytest.raises(RecordTooLarge):
            store.append(Q, b"x" * 1024)
        with pytest.raises(RecordTooLarge):
            store.put_value("n", b"x" * 1024)
        with pytest.raises(StoreUsageError):
            LogOptions(segment_size=100)
        with pytest.raises(StoreLocked):
            LogStore(tmp_path)
    with pytest.raises(StoreClosed):
        store.append(Q, b"z")
    store.close()  # twice is fine


def test_pending_appends_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer stuck in write() (a slow disk): appends past max_pending are refused,
    removals and metadata updates are not; all goes on when the disk comes back."""
    real_write = store_module.os.write
    stuck = threading.Event()
    release = threading.Event()

    def write(fd: int, data: object) -> int:
        if threading.current_thread().name == "store-writer" and not release.is_set():
            stuck.set()
            release.wait(WAIT)
        return real_write(fd, data)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module.os, "write", write)
    with LogStore(tmp_path, LogOptions(max_pending=5)) as store:
        first = store.append(Q, b"0")
        assert stuck.wait(WAIT)  # the writer holds the first batch
        for i in range(1, 6):
            store.append(Q, b"%d" % i)
        with pytest.raises(TooManyPending):
            store.append(Q, b"6")
        with pytest.raises(TooManyPending):
            store.put_value("n", b"v")
        store.update(Q, 2, Meta(delivery_count=1))
        store.remove(Q, 1)
        assert store.completed < first.ticket
        release.set()
        assert wait_until(lambda: store.stats().pending == 0)  # then there is room again
        assert store.wait(store.append(Q, b"6").ticket, WAIT)
    monkeypatch.undo()
    with LogStore(tmp_path) as store:
        assert [r.blob for r in store.records(Q)] == [b"1", b"2", b"3", b"4", b"5", b"6"]
        assert store.meta(Q, 2) == Meta(delivery_count=1)


def test_records_survive_segment_rolls(tmp_path: Path) -> None:
    with LogStore(tmp_path, small()) as store:
        blobs = {i: bytes([i % 256]) * (i * 7 % 1500) for i in range(1, 200)}
        for i in range(1, 200):
            assert store.append(Q, blobs[i]).seq == i
        assert store.flush(WAIT)
        assert len(segment_files(tmp_path)) > 10
    with LogStore(tmp_path, small()) as store:
        assert contents(store)[Q] == blobs


def test_a_failing_disk_stops_writes_and_wakes_waiters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = store_module.os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread().name == "store-writer" and failing.is_set():
            raise OSError(5, "Input/output error")
        real_fsync(fd)

    real_pwritev = store_module.os.pwritev

    def pwritev(fd: int, parts: list[bytes], at: int, flags: int = 0) -> int:
        if threading.current_thread().name == "store-writer" and failing.is_set():
            raise OSError(5, "Input/output error")  # (a write made durable as it goes)
        return real_pwritev(fd, parts, at, flags)

    failing = threading.Event()
    monkeypatch.setattr(store_module.os, "fsync", fsync)
    monkeypatch.setattr(store_module.os, "fdatasync", fsync)  # (the head's syncs)
    monkeypatch.setattr(store_module.os, "pwritev", pwritev)
    store = LogStore(tmp_path)
    try:
        assert store.wait(store.append(Q, b"before").ticket, WAIT)
        failing.set()
        ticket = store.append(Q, b"lost?").ticket
        with pytest.raises(StoreIOError, match="Input/output error"):
            store.wait(ticket, WAIT)
        assert wait_until(lambda: store.completed < ticket and _refuses(store))
        with pytest.raises(StoreIOError):
            store.flush(WAIT)
    finally:
        store.close()
    monkeypatch.undo()
    with LogStore(tmp_path) as store:
        assert store.read(Q, 1).blob == b"before"


def _refuses(store: LogStore) -> bool:
    try:
        store.append(Q, b"x")
    except StoreIOError:
        return True
    return False


def test_a_directory_that_cannot_be_a_store(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreIOError, match="cannot open the store"):
        LogStore(tmp_path / "file")
    with pytest.raises(StoreIOError, match="cannot open the store"):
        LogStore(tmp_path / "file" / "below")
    unreadable = tmp_path / "store"
    with LogStore(unreadable) as store:
        store.wait(store.append(Q, b"x").ticket, WAIT)
    segment = next(unreadable.glob("*.seg"))
    segment.unlink()
    segment.mkdir()  # a folder where a segment file was: not a segment, not written to
    with LogStore(unreadable) as store:
        assert store.bounds(Q) == QueueBounds(1, 0, 0)
        assert store.wait(store.append(Q, b"y").ticket, WAIT)
    with LogStore(unreadable) as store:
        assert store.read(Q, 1).blob == b"y"


def test_bad_queue_keys_and_metadata_are_usage_errors(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for queue in [("x" * 70000, 1), ("q", 2**32), ("q", -1), ("\udc80", 1)]:
            with pytest.raises(StoreUsageError):
                store.append(queue, b"x")
        assert store.queues() == []
        store.append(Q, b"x")
        for meta in [Meta(delivery_count=2**32), Meta(put_backs=-1), Meta(deadline=float("nan"))]:
            with pytest.raises(StoreUsageError):
                store.append(Q, b"y", meta)
            with pytest.raises(StoreUsageError):
                store.update(Q, 1, meta)
        assert store.meta(Q, 1) == Meta()
        assert store.bounds(Q) == QueueBounds(1, 1, 1)


def test_the_callback_runs_before_waiters_wake(tmp_path: Path) -> None:
    seen: list[int] = []

    def slow_callback(ticket: int) -> None:
        time.sleep(0.002)  # a callback that takes its time: waiters must still see it run
        seen.append(ticket)

    with LogStore(tmp_path, on_complete=slow_callback) as store:
        for _ in range(20):
            ticket = store.append(Q, b"x").ticket
            assert store.wait(ticket, WAIT)
            assert seen and seen[-1] >= ticket
        assert seen == sorted(seen)
