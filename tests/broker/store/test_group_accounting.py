"""A group of appends (``LogStore.append_many``) keeps the same books as single appends:
each segment's size and live octets (what compaction chooses its victims by, what a
restart recomputes from the files), and ``check_run`` refuses exactly the items a single
``append`` would refuse, by position, whether or not any item needs looking at."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from broker.store.log import (
    LogStore,
    Meta,
    RecordTooLarge,
    StoreClosed,
    StoreUsageError,
)
from broker.store.log.records import NO_META

from .kit import contents, segment_files, small

Q = ("orders", 7)
WAIT = 30.0
Item = tuple[bytes, Meta, int]


def _items(seed: int) -> list[Item]:
    """Records of 1 to 1,900 octets (a 4 KiB segment takes 2 to hundreds), some with
    metadata, one number skipped: a group that crosses many segment ends."""
    rng = random.Random(seed)
    items: list[Item] = []
    for k in range(120):
        blob = bytes([k % 251]) * rng.choice((1, 40, 300, 1000, 1900))
        meta = NO_META if k % 5 else Meta(delivery_count=k, put_backs=1, priority=k % 2 == 0)
        items.append((blob, meta, 200 if k == 60 else 0))
    return items


def _books(store: LogStore) -> tuple[int, int, int, int]:
    s = store.stats()
    return s.segments, s.disk_bytes, s.live_bytes, s.live_records


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_group_keeps_the_books_of_single_appends(tmp_path: Path, seed: int) -> None:
    items = _items(seed)
    singles, grouped = tmp_path / "singles", tmp_path / "grouped"
    with LogStore(singles, small()) as one:
        one.append(Q, b"before")
        given = [one.append(Q, blob, meta, at).seq for blob, meta, at in items]
        assert one.flush(WAIT)
        books = _books(one)
        one.remove(Q, given[3])
        assert one.flush(WAIT)
        single_removal = _books(one)
    with LogStore(grouped, small()) as many:
        many.append(Q, b"before")
        seqs, ticket = many.append_many(Q, items)
        assert many.wait(ticket, WAIT)
        assert seqs == given
        assert _books(many) == books
        # ... and a removal afterwards takes off what the group put on
        many.remove(Q, seqs[3])
        assert many.flush(WAIT)
        after_removal = _books(many)
        assert after_removal == single_removal
        assert after_removal[2] < books[2]
    assert len(segment_files(grouped)) == len(segment_files(singles)) > 20
    for name in segment_files(grouped):  # the same octets in the same places
        assert (grouped / name).stat().st_size == (singles / name).stat().st_size
    with LogStore(grouped, small()) as again:  # a restart counts from the files
        assert _books(again)[2:] == after_removal[2:]  # (a restart opens a new head)
        expected = {1: b"before"} | {s: item[0] for s, item in zip(seqs, items, strict=True)}
        del expected[seqs[3]]
        assert contents(again)[Q] == expected


def test_check_run_refuses_by_position_what_append_refuses(tmp_path: Path) -> None:
    with LogStore(tmp_path, small()) as store:
        fine: list[Item] = [(b"a" * 1000, NO_META, 0), (b"b", NO_META, 0)]
        assert store.check_run(Q, fine) == []
        assert store.check_run(Q, []) == []
        assert store.check_run(Q, [(b"c", Meta(put_backs=2), 0)]) == []
        mixed: list[Item] = [
            (b"ok", NO_META, 0),
            (b"x" * 4096, NO_META, 0),  # too large
            (b"ok", Meta(delivery_count=1), 0),
            (b"y", Meta(put_backs=-1), 0),  # bad meta
            (b"x" * 2048, NO_META, 0),  # too large (with its header)
        ]
        refused = store.check_run(Q, mixed)
        assert [k for k, _exc in refused] == [1, 3, 4]
        assert [type(exc) for _k, exc in refused] == [
            RecordTooLarge,
            StoreUsageError,
            RecordTooLarge,
        ]
        for k, (blob, meta, at) in enumerate(mixed):  # the same as one ``append`` each
            if k in (1, 3, 4):
                with pytest.raises(StoreUsageError):
                    store.append(Q, blob, meta, at)
            else:
                store.append(Q, blob, meta, at)
    closed = store.check_run(Q, fine + mixed)
    assert [k for k, _exc in closed] == list(range(7))
    assert isinstance(closed[0][1], StoreClosed)
    assert isinstance(closed[3][1], RecordTooLarge)  # (its own reason first)
