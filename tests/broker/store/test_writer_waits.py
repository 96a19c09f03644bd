"""Waits on the writer thread: a reader that waits for a record to be written looks the
record up again after each wait (compaction may have moved it and deleted the segment it
was in meanwhile), and a writer that stopped makes every wait raise, never hang.

The interleavings are driven with hooks, no sleeps: the writer is held before its first
write (a gate on ``LogStore._write``), and the reader's first wait on ``_written_cond``
is stretched, its lock free, until the test has let compaction finish."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.store.log import LogStore, StoreIOError
from broker.store.log.store import _Entry

from .kit import segment_files, small, wait_until

A, B = ("keep", 1), ("drop", 2)
WAIT = 10.0  # every wait of these tests is bounded by it


class _Gate:
    """Holds the writer before it writes anything until :meth:`open`."""

    def __init__(self, log: LogStore) -> None:
        self._open = threading.Event()
        write = log._write

        def held(batch: list[_Entry]) -> None:
            self._open.wait(WAIT)
            write(batch)

        log._write = held  # type: ignore[method-assign]

    def open(self) -> None:
        self._open.set()


class _StretchedWait:
    """Stands in for ``log._written_cond``: once armed, the first wait frees the lock,
    says so (``waiting``) and returns only after :meth:`resume` (a condition's wait may
    return at any time: the caller must re-check what it waits for)."""

    def __init__(self, log: LogStore) -> None:
        self._cond = log._written_cond
        self._lock = log._lock
        self.armed = False
        self.waiting = threading.Event()
        self._resume = threading.Event()
        log._written_cond = self  # type: ignore[assignment]

    def wait(self, timeout: float | None = None) -> bool:
        if not self.armed:
            return self._cond.wait(timeout)
        self.armed = False
        self._lock.release()
        try:
            self.waiting.set()
            self._resume.wait(WAIT)
        finally:
            self._lock.acquire()
        return True

    def notify_all(self) -> None:
        self._cond.notify_all()

    def resume(self) -> None:
        self._resume.set()


def _record_in_a_segment_compaction_will_delete(log: LogStore) -> tuple[int, bytes]:
    """Queue A's one record, then queue B's records fill segment 1 and roll the head, then
    B's are removed: segment 1 falls under ``compact_ratio`` (nothing written yet)."""
    blob = b"keep-me" * 5
    seq, _ = log.append(A, blob)
    while log.stats().segments < 2:
        log.append(B, bytes(900))
    for s in range(1, log.bounds(B).last + 1):
        log.remove(B, s)
    return seq, blob


def _run(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def body() -> None:
        try:
            out.append(target())
        except Exception as exc:  # (the test asserts on it)
            out.append(exc)

    thread = threading.Thread(target=body, name="reader", daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("how", ["read_live", "read"])
def test_a_reader_waiting_for_a_record_finds_it_after_compaction_moved_it(
    tmp_path: Path, how: str
) -> None:
    """Session 18's hang (``test_compaction_moves_records_under_paged_messages`` at load
    15-20): a page-in took a record's place from the index, waited for the writer, and
    meanwhile compaction copied the record elsewhere and deleted its segment; the reader
    waited for the deleted segment to be written, forever."""
    with LogStore(tmp_path, small(compact_ratio=0.9)) as log:
        gate = _Gate(log)
        stretched = _StretchedWait(log)
        seq, blob = _record_in_a_segment_compaction_will_delete(log)
        stretched.armed = True
        if how == "read_live":
            reader, out = _run(lambda: [(s, r.blob) for s, r in log.read_live(A)])
        else:
            reader, out = _run(lambda: [(seq, log.read(A, seq).blob)])
        assert stretched.waiting.wait(WAIT)  # the reader waits for the writer
        gate.open()
        assert wait_until(
            lambda: log.stats().compactions > 0 and "00000001.seg" not in segment_files(tmp_path)
        ), (log.stats(), segment_files(tmp_path))
        stretched.resume()
        reader.join(WAIT)
        assert not reader.is_alive(), "the reader still waits for a deleted segment"
        assert out == [[(seq, blob)]]


def test_waits_on_a_writer_thread_that_stopped_raise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer thread that ended without a word (no error recorded): a read of a record
    it never wrote, ``flush`` and ``wait`` raise StoreIOError instead of waiting forever;
    the store then refuses appends."""
    monkeypatch.setattr(LogStore, "_run", lambda self: None)
    with LogStore(tmp_path, small()) as log:
        log._thread.join(WAIT)
        seq, ticket = log.append(A, b"never written")
        reader, out = _run(lambda: log.read(A, seq))
        reader.join(WAIT)
        assert not reader.is_alive() and isinstance(out[0], StoreIOError), out
        with pytest.raises(StoreIOError, match="writer"):
            list(log.read_live(A))
        with pytest.raises(StoreIOError, match="writer"):
            log.flush()
        with pytest.raises(StoreIOError, match="writer"):
            log.wait(ticket)
        with pytest.raises(StoreIOError, match="writer"):
            log.append(A, b"more")


def test_a_writer_stopped_by_a_base_exception_fails_the_store(tmp_path: Path) -> None:
    """``SystemExit`` from the completion callback ends the writer thread (Python's thread
    hook says nothing of it): it used to leave every waiter waiting; now the store fails
    loudly as for a failed disk."""
    stop = threading.Event()

    def on_complete(ticket: int) -> None:
        if stop.is_set():
            raise SystemExit("callback ended the thread")

    with LogStore(tmp_path, small(), on_complete=on_complete) as log:
        assert log.wait(log.append(A, b"first").ticket, WAIT)
        stop.set()
        _, ticket = log.append(A, b"second")
        waiter, out = _run(lambda: log.wait(ticket))
        waiter.join(WAIT)
        assert not waiter.is_alive(), "wait() hangs on a dead writer"
        assert isinstance(out[0], StoreIOError) and "SystemExit" in str(out[0]), out
        assert log.failed is out[0]
