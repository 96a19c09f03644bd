"""QueueIndex: locations and metadata by sequence number, in columns."""

from __future__ import annotations

from broker.store.log.index import Location, QueueIndex
from broker.store.log.records import Meta


def _loc(i: int) -> Location:
    return Location(1, 100 + i, 50, 1)


def test_put_remove_bounds() -> None:
    index = QueueIndex()
    assert (index.first_seq, index.next_seq, len(index)) == (1, 1, 0)
    for seq in range(1, 6):
        index.put(seq, _loc(seq), Meta(delivery_count=seq))
    assert index.locate(3) == _loc(3)
    assert index.meta(4) == Meta(delivery_count=4)
    assert index.remove(1) == _loc(1)
    assert index.remove(1) is None
    assert index.remove(3) == _loc(3)
    assert index.first_seq == 2
    assert list(index.sequences()) == [2, 4, 5]
    assert list(index.sequences(3)) == [4, 5]
    for seq in (2, 4, 5):
        index.remove(seq)
    assert (index.first_seq, index.next_seq, len(index)) == (6, 6, 0)
    assert index.locate(5) is None and index.meta(5) is None


def test_copies_out_of_order_and_below_the_base() -> None:
    index = QueueIndex()
    index.put(10, _loc(10), Meta())
    index.put(4, _loc(4), Meta())  # a compaction copy replayed after a newer record
    assert list(index.sequences()) == [4, 10]
    assert index.next_seq == 11
    old = index.put(4, Location(2, 0, 60, 1), Meta(delivery_count=2))
    assert old == _loc(4)
    assert len(index) == 2
    assert index.min_origin() == 1


def test_dead_prefix_is_cut_and_memory_stays_per_slot() -> None:
    index = QueueIndex()
    n = 20_000
    for seq in range(1, n + 1):
        index.put(seq, _loc(seq), Meta())
    full = index.memory()
    assert full >= 33 * n
    for seq in range(1, n):
        index.remove(seq)
    assert list(index.sequences()) == [n]
    assert index.memory() < full // 2
    assert index.locate(n) == _loc(n)
    index.put(n + 1, _loc(n + 1), Meta())
    assert list(index.sequences()) == [n, n + 1]


def test_remove_in_the_middle_keeps_order() -> None:
    index = QueueIndex()
    for seq in range(1, 11):
        index.put(seq, _loc(seq), Meta())
    for seq in (5, 2, 9):
        index.remove(seq)
    assert list(index.sequences()) == [1, 3, 4, 6, 7, 8, 10]
    assert [s for s, _ in index.live_below(7)] == [1, 3, 4, 6]


def test_a_copy_replayed_below_the_first_live_slot_is_listed() -> None:
    """The kill -9 crash test's lost appends: recovery replays a compaction copy of an
    older record (4) after the slot before it was removed, so the first live slot had
    moved past 4 already; the copy must be listed again, not only be locatable."""
    index = QueueIndex()
    index.put(2, _loc(2), Meta())  # a copy of 2, then a newer record, then 2 removed
    index.put(9, _loc(9), Meta())
    index.remove(2)
    assert index.first_seq == 9
    index.put(4, _loc(4), Meta())  # the copy of 4, later in the log
    assert index.first_seq == 4
    assert list(index.sequences()) == [4, 9]
    assert [slot[0] for slot in index.live_slots(0, 10)] == [4, 9]
    assert index.live_below(10) == [(4, _loc(4)), (9, _loc(9))]
    assert index.min_origin() == 1
