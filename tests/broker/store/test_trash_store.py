"""The durable store's trash (``DurableStore.trash``): kept across a reopen with reason
and time, forgotten on request, and a crash between the trash write and the live
record's removal leaves the message live (never in both places, never in neither)."""

from __future__ import annotations

from pathlib import Path

from broker.message import Message
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import LogStore

KEY = ("jobs", 1)


def stored(seq: int, headers: tuple[tuple[str, str], ...] = ()) -> StoredMessage:
    message = Message(f"m{seq}", "p", "jobs", 1, headers=headers, payload=b"x%d" % seq)
    return StoredMessage(seq, message, "producer", put_backs=2, delivery_count=3)


def test_trashed_messages_come_back_with_reason_time_and_headers(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        for seq in (1, 2, 3):
            store.append(KEY, stored(seq, (("h", "v"),)))
            store.trash(KEY, stored(seq, (("h", "v"),)), "expired", 1000.0 + seq)
            store.remove(KEY, seq)
        store.forget_trashed(KEY, 2)
        store.flush()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert list(store.iterate(KEY)) == []
        back = list(store.trashed(KEY))
        assert [(s.sequence, reason, at) for s, reason, at in back] == [
            (1, "expired", 1001.0),
            (3, "expired", 1003.0),
        ]
        first = back[0][0]
        assert first.message.headers == (("h", "v"),)  # the trash's own marks stripped
        assert bytes(first.message.payload) == b"x1" and first.producer_id == "producer"
        assert store.queues() == []  # the trash is no live queue
        store.drop_queue(KEY)
        assert list(store.trashed(KEY)) == []


def test_a_crash_between_the_trash_write_and_the_removal_keeps_it_live(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append(KEY, stored(1))
        store.trash(KEY, stored(1), "none", 1.0)  # then "killed": no removal
        store.flush()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert [s.sequence for s in store.iterate(KEY)] == [1]
        assert list(store.trashed(KEY)) == []  # the live one wins; the copy is forgotten
        store.flush()
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        assert [s.sequence for s in store.iterate(KEY)] == [1]
        assert list(store.trashed(KEY)) == []
