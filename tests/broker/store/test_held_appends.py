"""``DurableStore.hold``/``release`` (the engine's batch of pushes): appends held back are
written as one group per queue, refused at once when the log would refuse them, and
every other call writes what is held first, so the log keeps the engine's order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.message import Message
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import LogOptions, LogStore, RecordTooLarge, StoreClosed, StoreUsageError

Q = ("orders", 1)
OTHER = ("orders", 2)
WAIT = 10.0


def _stored(seq: int, size: int = 10, delivered: int = 0) -> StoredMessage:
    message = Message(message_id=f"m{seq}", target="orders", payload=b"%d" % seq + b"p" * size)
    return StoredMessage(seq, message, "producer-1", delivery_count=delivered)


def _live(directory: Path) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(engine number, delivery count) of every live message, after a restart."""
    with LogStore(directory) as log:
        store = DurableStore(log)
        return {
            key: [(s.sequence, s.delivery_count) for s in store.iterate(key)]
            for key in sorted(store.queues())
        }


def test_held_appends_are_one_group_per_queue_in_order(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append(Q, _stored(1))
        before = store.appended
        store.hold()
        for seq in range(2, 12):
            store.append(Q, _stored(seq))
        assert store.appended == before  # nothing written yet
        store.release()
        assert store.appended == before + 1  # one entry, one ticket for the ten
        assert log.wait(store.appended, WAIT)
    assert _live(tmp_path) == {Q: [(n, 0) for n in range(1, 12)]}


def test_a_removal_or_update_of_a_held_message_comes_after_its_record(tmp_path: Path) -> None:
    """Held appends are written before any other call: a removal of a message still held
    must not be ignored as unknown (it would come back after a restart), an update must
    not be lost, a read must find it, another queue's append keeps the order."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.hold()
        for seq in (1, 2, 3):
            store.append(Q, _stored(seq))
        store.remove(Q, 2)
        store.append(Q, _stored(4))
        store.update(Q, _stored(4, delivered=3))
        store.append(Q, _stored(5))
        assert store.read(Q, 5).message.payload.startswith(b"5")
        store.append(Q, _stored(6))
        store.append(OTHER, _stored(1))
        store.append(Q, _stored(7))
        store.release()
        store.flush()
    assert _live(tmp_path) == {
        Q: [(1, 0), (3, 0), (4, 3), (5, 0), (6, 0), (7, 0)],
        OTHER: [(1, 0)],
    }


def test_a_held_append_the_log_would_refuse_raises_at_once(tmp_path: Path) -> None:
    with LogStore(tmp_path, LogOptions(max_record_size=1024)) as log:
        store = DurableStore(log)
        store.hold()
        store.append(Q, _stored(1))
        with pytest.raises(RecordTooLarge):
            store.append(Q, _stored(2, size=1100))
        store.append(Q, _stored(3))
        store.release()
        store.flush()
    assert _live(tmp_path) == {Q: [(1, 0), (3, 0)]}


def _refusals(refused: list[tuple[int, Exception]]) -> list[tuple[int, type[Exception]]]:
    return [(k, type(exc)) for k, exc in refused]


def _too_large_and_bad_deadline() -> list[StoredMessage]:
    run = [_stored(seq) for seq in range(1, 7)]
    run[1] = _stored(2, size=1100)
    run[3] = StoredMessage(4, run[3].message, "producer-1", deadline=float("inf"))
    return run


def _bad_ttl_and_too_large() -> list[StoredMessage]:
    run = [_stored(seq) for seq in range(1, 6)]
    run[1] = StoredMessage(2, run[1].message._replace(ttl=300), "producer-1")
    run[3] = _stored(4, size=1100)
    return run


@pytest.mark.parametrize(
    ("make_run", "refusals", "live"),
    [
        (
            _too_large_and_bad_deadline,
            [(1, RecordTooLarge), (3, StoreUsageError)],
            [(1, 0), (3, 0), (5, 0), (6, 0)],
        ),
        # a message the blob format cannot hold (a TTL above 255) is refused by the
        # encoding, before the log's check of the run: each refusal keeps its position
        # in the run, not its position among the messages that were encoded
        (_bad_ttl_and_too_large, [(1, ValueError), (3, RecordTooLarge)], [(1, 0), (3, 0), (5, 0)]),
    ],
)
def test_a_held_run_refuses_exactly_what_the_log_would_refuse(
    tmp_path: Path,
    make_run: Callable[[], list[StoredMessage]],
    refusals: list[tuple[int, type[Exception]]],
    live: list[tuple[int, int]],
) -> None:
    """``append_each`` while held checks the run with one call into the log; each record
    the log would refuse (too large, a deadline that is no wall-clock second) or the
    encoding refuses is refused at its own position, the others are written as the
    group."""
    with LogStore(tmp_path, LogOptions(max_record_size=1024)) as log:
        store = DurableStore(log)
        store.hold()
        refused = store.append_each(Q, make_run())
        store.release()
        store.flush()
    assert _refusals(refused) == refusals
    assert _live(tmp_path) == {Q: live}


def test_a_held_run_into_a_closed_log_refuses_every_record_for_its_own_reason(
    tmp_path: Path,
) -> None:
    """A log that takes no appends (closed here; failed or ``max_pending`` full alike)
    refuses each record of a run; one that is also too large keeps that reason, as one
    ``append`` at a time would say."""
    log = LogStore(tmp_path, LogOptions(max_record_size=1024))
    store = DurableStore(log)
    store.append(Q, _stored(1))
    store.flush()
    log.close()
    store.hold()
    run = [_stored(2), _stored(3, size=1100), _stored(4)]
    refused = store.append_each(Q, run)
    assert _refusals(refused) == [(0, StoreClosed), (1, RecordTooLarge), (2, StoreClosed)]
    for k, message in enumerate(run):  # the same as one by one
        with pytest.raises(type(refused[k][1])):
            store.append(Q, message)
    assert _live(tmp_path) == {Q: [(1, 0)]}
