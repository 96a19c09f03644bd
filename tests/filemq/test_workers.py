"""``filemq.workers.Workers``: the skeleton both file writers run their workers on
(``ChunkWriter``, ``StagedWriter``; their own tests run it on real files and threads).
Here the rules by themselves, on the test's thread: the first failure is kept and cuts
what is queued; a worker's loop stops at a failure, at False, at a cut or at the end."""

from __future__ import annotations

import errno
from collections import deque

import pytest

from filemq.workers import Workers


def _workers(queue: deque[int], dropped: list[bool], max_pending: int = 10) -> Workers:
    def drop() -> None:
        queue.clear()
        dropped.append(True)

    return Workers(max_pending, drop)


def test_the_first_failure_is_kept_cuts_what_is_queued_and_is_raised_after() -> None:
    queue: deque[int] = deque([1, 2, 3])
    dropped: list[bool] = []
    workers = _workers(queue, dropped)
    with workers.cond:
        workers.admit(6)
        first = OSError(errno.ENOSPC, "full")
        workers.fail(first)
        workers.fail(OSError(errno.EIO, "later"))  # (not kept: the first one is)
        assert workers.error is first and workers.cut
        assert workers.pending == 0 and not queue and dropped == [True, True]
        with pytest.raises(OSError) as raised:
            workers.admit(1)
        assert raised.value is first
        assert workers.pending == 0  # (a refused chunk is not counted)
        workers.release(5)  # (a chunk finished after the cut: nothing is pending)
        assert workers.pending == 0
    with pytest.raises(OSError) as settled:
        workers.settle(lambda: True)
    assert settled.value is first


def test_a_worker_takes_in_order_until_its_queue_is_empty_and_stopping() -> None:
    queue: deque[int] = deque([1, 2, 3])
    workers = _workers(queue, [])
    done: list[int] = []
    workers.stopping = True  # (stop() was called: what is queued is still done)

    def work(item: int) -> bool:
        done.append(item)
        return True

    workers.serve(lambda: workers.take(queue), work)
    assert done == [1, 2, 3] and workers.error is None


def test_a_worker_stops_at_false_and_at_a_failure_which_is_kept() -> None:
    queue: deque[int] = deque([1, 2, 3])
    workers = _workers(queue, [])
    workers.serve(lambda: workers.take(queue, lambda: True), lambda item: item < 2)
    assert list(queue) == [3] and not workers.cut  # (False: this worker stops, only)

    def failing(item: int) -> bool:
        raise OSError(errno.EFBIG, "too big")

    queue.extend([4, 5])
    workers.serve(lambda: workers.take(queue, lambda: True), failing)
    assert workers.error is not None and workers.error.errno == errno.EFBIG
    assert workers.cut and not queue  # (what was queued after it: dropped)


def test_after_a_cut_take_gives_nothing_though_items_are_queued() -> None:
    queue: deque[int] = deque([1])
    other: deque[int] = deque([7])  # (a queue the cut does not clear)
    workers = _workers(queue, [])
    with workers.cond:
        workers.cut_off()
        assert workers.take(other) is None and list(other) == [7]
        assert workers.error is None
