"""Appending a group of records at once (``LogStore.append_many``, ``Store.append_many``):
the same records, numbers and restarts as one by one, one writer entry per segment."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from broker.message import Message
from broker.store import MemoryStore, StoredMessage
from broker.store.durable import MAX_SKIP, DurableStore
from broker.store.log import LogStore, Meta, RecordTooLarge, StoreUsageError, records
from broker.store.log.records import NO_META
from broker.store.log.recovery import read_seed

from .kit import contents, segment_files, small

Q = ("orders", 1)
WAIT = 10.0


def _stored(seq: int, size: int = 10) -> StoredMessage:
    message = Message(message_id=f"m{seq}", target="orders", payload=b"p" * size)
    return StoredMessage(seq, message, "producer-1", put_backs=seq % 3)


def test_a_group_gets_the_numbers_metadata_and_restart_of_single_appends(
    tmp_path: Path,
) -> None:
    items = [
        (b"a", NO_META, 0),
        (b"b", Meta(delivery_count=2, put_backs=1, priority=True, deadline=5.0), 0),
        (b"c", NO_META, 7),  # numbers 4..6 skipped, as ``append(at=7)`` does
        (b"d", NO_META, 0),
    ]
    with LogStore(tmp_path) as store:
        store.append(Q, b"before")
        seqs, ticket = store.append_many(Q, items)
        assert seqs == [2, 3, 7, 8]
        assert ticket == store.append(Q, b"after").ticket - 1
        assert store.wait(ticket, WAIT)
        assert store.read(Q, 3).meta == items[1][1]
        assert store.bounds(Q).last == 9
    with LogStore(tmp_path) as store:
        assert contents(store)[Q] == {
            1: b"before",
            2: b"a",
            3: b"b",
            7: b"c",
            8: b"d",
            9: b"after",
        }
        assert store.meta(Q, 3) == items[1][1]
        assert store.append(Q, b"next").seq == 10


def test_a_group_across_segment_ends_is_read_and_recovered(tmp_path: Path) -> None:
    blobs = [bytes([i]) * (300 + i * 11) for i in range(40)]
    with LogStore(tmp_path, small()) as store:
        seqs, ticket = store.append_many(Q, [(b, NO_META, 0) for b in blobs])
        assert seqs == list(range(1, 41))
        assert store.wait(ticket, WAIT)
        assert len(segment_files(tmp_path)) > 3  # 4 KiB segments: the group was split
        assert [store.read(Q, s).blob for s in seqs] == blobs
        assert store.stats().batch_records < 40  # whole runs, not one entry per record
    with LogStore(tmp_path, small()) as store:
        assert contents(store)[Q] == dict(zip(range(1, 41), blobs, strict=True))


def test_a_bad_item_refuses_the_whole_group(tmp_path: Path) -> None:
    with LogStore(tmp_path, small()) as store:
        with pytest.raises(RecordTooLarge):
            store.append_many(Q, [(b"ok", NO_META, 0), (b"x" * 4096, NO_META, 0)])
        with pytest.raises(StoreUsageError):
            store.append_many(Q, [(b"ok", NO_META, 0), (b"y", Meta(put_backs=-1), 0)])
        with pytest.raises(StoreUsageError):
            store.append_many(("", -1), [(b"ok", NO_META, 0)])
        assert store.bounds(Q).count == 0
        assert store.append_many(Q, []) == ([], store.completed)
        assert store.append(Q, b"first").seq == 1


def test_durable_groups_keep_engine_numbers_across_a_restart(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append_many(Q, [_stored(s) for s in (5, 6, 9)])
        store.append_many(Q, [_stored(s) for s in (10, 11)])
        store.append_many(Q, [_stored(12)])
        assert log.wait(store.appended, WAIT)
        assert log.bounds(Q).last == 12  # the log's numbers are the engine's
        store.remove(Q, 6)
        assert log.wait(store.appended, WAIT)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        back = list(store.iterate(Q))
        assert [m.sequence for m in back] == [5, 9, 10, 11, 12]
        assert [m.message.message_id for m in back] == ["m5", "m9", "m10", "m11", "m12"]
        assert [m.put_backs for m in back] == [2, 0, 1, 2, 0]
        assert store.read(Q, 11).message.payload == b"p" * 10
        assert store.last_sequence(Q) == 12


def test_durable_groups_that_cannot_keep_numbers_equal_are_mapped(tmp_path: Path) -> None:
    """The log ahead of the engine (a queue made again numbers from 1), and a gap longer
    than MAX_SKIP inside a group: every message still comes back under its number."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append_many(Q, [_stored(s) for s in (1, 2, 3)])
        store.drop_queue(Q)  # the queue is removed and made again
        store.append_many(Q, [_stored(s) for s in (1, 2)])
        far = 3 + MAX_SKIP + 10
        store.append_many(Q, [_stored(3), _stored(far), _stored(far + 1)])
        assert log.wait(store.appended, WAIT)
        assert [m.sequence for m in store.iterate(Q)] == [1, 2, 3, far, far + 1]
        store.remove(Q, 2)
        assert log.wait(store.appended, WAIT)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        back = list(store.iterate(Q))
        assert [m.sequence for m in back] == [1, 3, far, far + 1]
        assert [m.message.message_id for m in back] == ["m1", "m3", f"m{far}", f"m{far + 1}"]


def test_a_group_behind_the_log_is_mapped_from_its_first_message(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append_many(Q, [_stored(s) for s in (1, 2)])
        log.append(Q, b"not a message blob", at=10)  # the log moved ahead of the engine
        store.append_many(Q, [_stored(s) for s in (3, 4, 5)])
        assert log.bounds(Q).last == 13
        assert store.read(Q, 4).message.message_id == "m4"
        store.remove(Q, 3)
        assert log.wait(store.appended, WAIT)
        assert list(log.sequences(Q)) == [1, 2, 10, 12, 13]
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert [m.sequence for m in store.iterate(Q)] == [1, 2, 4, 5]  # (10: skipped)
        store.append_many(Q, [_stored(s) for s in (6, 7)])
        assert [m.sequence for m in store.iterate(Q)] == [1, 2, 4, 5, 6, 7]


def test_the_default_appends_one_by_one() -> None:
    store = MemoryStore()
    store.append_many(Q, [_stored(s) for s in (3, 4)])
    store.append_many(Q, [])
    assert [m.sequence for m in store.iterate(Q)] == [3, 4]


def _script(seed: int) -> list[tuple[str, object]]:
    """Groups (some with numbers skipped, some with metadata, some crossing a segment's
    end) and removals that sometimes empty the queue, drawn from ``seed``."""
    rng = random.Random(seed)
    steps: list[tuple[str, object]] = []
    for _ in range(12):
        if rng.random() < 0.35:
            steps.append(("remove", rng.randint(1, 8)))
            continue
        items = []
        for _ in range(rng.randint(1, 9)):
            at = rng.choice((0, 0, 0, -1))  # -1: a few numbers ahead of the next one
            meta = NO_META
            if rng.random() < 0.3:
                meta = Meta(rng.randint(0, 4), rng.randint(0, 3), rng.random() < 0.5, 9.5)
            items.append((bytes([rng.randint(0, 255)]) * rng.randint(1, 700), meta, at))
        steps.append(("group", items))
    return steps


def _replay(store: LogStore, steps: list[tuple[str, object]], grouped: bool) -> None:
    removed = 0
    for kind, what in steps:
        if kind == "remove":
            live = [r.seq for r in store.records(Q)]
            for seq in live[: int(what)]:  # type: ignore[call-overload]
                store.remove(Q, seq)
                removed += 1
            continue
        items = []
        for blob, meta, at in what:  # type: ignore[attr-defined]
            ahead = store.bounds(Q).last + 1 + len(items)
            items.append((blob, meta, ahead + 3 if at < 0 else at))
        if grouped:
            store.append_many(Q, items)
        else:
            for blob, meta, at in items:
                store.append(Q, blob, meta, at)


def _state(store: LogStore) -> tuple[object, ...]:
    live = {r.seq: (r.blob, store.meta(Q, r.seq)) for r in store.records(Q)}
    return store.bounds(Q), live


@pytest.mark.parametrize("seed", range(6))
def test_groups_index_their_records_as_one_by_one_does(tmp_path: Path, seed: int) -> None:
    """The index slots a group's records get together (``QueueIndex.put_rows``) are the
    ones single appends give: numbers, places, metadata, bounds, before and after a
    restart, with numbers skipped inside a group and a queue emptied between groups."""
    steps = _script(seed)
    states = []
    for grouped in (False, True):
        where = tmp_path / f"grouped{grouped:d}"
        with LogStore(where, small()) as store:
            _replay(store, steps, grouped)
            before = _state(store)
            store.append(Q, b"after")
            ticket = store.append(Q, b"after 2").ticket
            assert store.wait(ticket, WAIT)
            after_appends = _state(store)
        with LogStore(where, small()) as store:
            states.append((before, after_appends, _state(store)))
    assert states[0] == states[1]
    assert states[0][0][1], "the script left nothing live: it checks nothing"


def test_a_group_writes_the_octets_encode_put_makes(tmp_path: Path) -> None:
    """A group's records, encoded in two parts each (``records.put_summed``), are on disk
    exactly the octets :func:`records.encode_put` makes for them, back to back, with
    and without metadata: an oracle outside the group's own encoder."""
    items = [
        (b"first", NO_META, 0),
        (b"x" * 300, Meta(delivery_count=3, put_backs=2, priority=True, deadline=9.5), 0),
        (b"", NO_META, 5),
    ]
    with LogStore(tmp_path) as store:
        seqs, ticket = store.append_many(Q, items)
        assert store.wait(ticket, WAIT)
    (name,) = segment_files(tmp_path)
    segment = int(name.removesuffix(".seg"))  # (a record's origin: the segment it went to)
    seed = read_seed(tmp_path)
    assert seed is not None
    key = records.encode_key(Q)
    expected = b"".join(
        records.encode_put(key, seq, segment, meta, blob, seed)
        for seq, (blob, meta, _at) in zip(seqs, items, strict=True)
    )
    data = (tmp_path / name).read_bytes()
    assert data.endswith(expected)
    assert seqs == [1, 2, 5]
