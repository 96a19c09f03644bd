"""Paging: a persistent queue holds a bounded window of its waiting messages in memory and
reads the rest back from the log when their turn comes (``engine.queue.messages``), and
the log numbers its records as the engine does, so a restart lists a queue without
reading payloads (``store.durable``: "Equal numbers")."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.message import Message
from broker.protocol import MessageType
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import LogOptions, LogStore
from broker.store.log import segments as seg
from broker.store.log.records import RecordKind

from ..engine_kit import Kit
from .kit import segment_files, small, wait_until

Q = ("orders", 1)
WINDOW = 4


def _kit(log: LogStore, window: int = WINDOW) -> Kit:
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=Limits(paged_window=window))
    return Kit(
        store=DurableStore(log),
        handlers={"persistent": PersistentDeliveryHandler()},
        config=config,
    )


def _fill(kit: Kit, count: int, high: frozenset[int] = frozenset()) -> str:
    """A producer pushes ``count`` persistent messages (payload ``p<i>``), acked."""
    producer = kit.connect("producer")
    kit.queue(producer, "orders", 1, message_delivery_handler="persistent",
              request_acknowledge=True)  # fmt: skip
    for i in range(1, count + 1):
        kit.push(producer, "orders", 1, b"p%d" % i, ack=True, high=i in high, mid=f"m{i}")
    acked = [f for f in kit.take(producer) if f.message_type == MessageType.ACK]
    assert len(acked) == count  # every push confirmed
    return producer


def _consume_all(kit: Kit) -> list[bytes]:
    """A consumer takes and acknowledges every message, one at a time."""
    consumer = kit.connect("consumer")
    kit.join(consumer, "orders")
    got: list[bytes] = []
    while True:
        frames = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
        if not frames:
            return got
        for f in frames:
            got.append(f.payload)
            kit.ack(consumer, f)


def _waiting_in_memory(kit: Kit) -> int:
    order = kit.engine.channels["orders"].queues[1].messages
    return len(order.priority) + len(order.regular)


def test_paged_queue_keeps_a_window_in_memory_and_delivers_in_order(tmp_path: Path) -> None:
    high = frozenset({3, 7, 8, 20, 29})
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        _fill(kit, 30, high)
        queue = kit.engine.channels["orders"].queues[1]
        assert queue.message_count == 30
        assert _waiting_in_memory(kit) <= 2 * WINDOW  # the rest wait in the log
        got = _consume_all(kit)
        assert queue.message_count == 0 and queue.is_empty()
        assert log.bounds(Q).count == 0  # every acknowledged message forgotten
    want = [b"p%d" % i for i in sorted(high)] + [b"p%d" % i for i in range(1, 31) if i not in high]
    assert got == want


def test_paged_messages_come_back_after_a_restart_without_their_payloads_read(
    tmp_path: Path,
) -> None:
    high = frozenset({2, 15})
    with LogStore(tmp_path) as log:
        _fill(_kit(log), 25, high)
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        assert kit.engine.recover(kit.now) == 25
        queue = kit.engine.channels["orders"].queues[1]
        assert queue.message_count == 25 and queue.sequence == 25
        assert _waiting_in_memory(kit) <= 2 * WINDOW
        got = _consume_all(kit)
        producer = kit.connect("producer")  # numbering goes on where it stopped
        kit.push(producer, "orders", 1, b"new", ack=True, mid="fresh")
        assert queue.sequence == 26, kit.take(producer)
    assert got == [b"p2", b"p15"] + [b"p%d" % i for i in range(1, 26) if i not in high]


def test_duplicates_of_paged_messages_are_still_refused_after_a_restart(
    tmp_path: Path,
) -> None:
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        producer = kit.connect("producer")
        kit.queue(producer, "orders", 1, message_delivery_handler="persistent",
                  use_message_id=True)  # fmt: skip
        for i in range(1, 21):
            kit.push(producer, "orders", 1, b"p%d" % i, mid=f"m{i}")
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        assert kit.engine.recover(kit.now) == 20
        producer = kit.connect("producer")
        kit.push(producer, "orders", 1, b"again", mid="m18")  # paged, yet remembered
        queue = kit.engine.channels["orders"].queues[1]
        assert queue.message_count == 20 and queue.duplicates == 1


def test_compaction_moves_records_under_paged_messages(tmp_path: Path) -> None:
    """Records of paged messages share small segments with another queue's, which are
    consumed: compaction copies the paged records elsewhere; each one still reads right."""
    options = small(compact_ratio=0.9)
    with LogStore(tmp_path, options) as log:
        kit = _kit(log)
        producer = kit.connect("producer")
        kit.queue(producer, "orders", 1, message_delivery_handler="persistent")
        kit.queue(producer, "other", 2, message_delivery_handler="persistent")
        for i in range(1, 81):
            kit.push(producer, "orders", 1, b"keep-%03d" % i + bytes(60))
            kit.push(producer, "other", 2, b"drop-%03d" % i + bytes(60))
        log.flush()  # (the writer makes a segment's file when it first writes to it)
        before = set(segment_files(tmp_path))
        first = min(before)
        store = kit.engine.store
        for seq in range(1, 81):  # queue 2's messages are consumed
            store.remove(("other", 2), seq)
        log.flush()
        wait_until(lambda: log.stats().compactions > 0 and first not in segment_files(tmp_path))
        got = _consume_all(kit)
    assert got == [b"keep-%03d" % i + bytes(60) for i in range(1, 81)]


def _put_offsets(directory: Path) -> tuple[Path, list[seg.Found]]:
    (name,) = segment_files(directory)
    path = directory / name
    data = path.read_bytes()
    header = seg.decode_header(data[: seg.SEGMENT_HEADER_SIZE])
    assert header is not None
    found = seg.scan(data, header[1], 1 << 20, seg.SEGMENT_HEADER_SIZE)
    return path, [f for f in found if isinstance(f, seg.Found) and f.kind == RecordKind.PUT]


def test_a_corrupt_record_under_a_paged_message_is_logged_and_the_rest_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        _fill(kit, 20)
        log.flush()
        path, puts = _put_offsets(tmp_path)
        victim = puts[14]  # message 15: paged
        with open(path, "r+b") as f:
            f.seek(victim.offset + victim.size - 2)
            octet = f.read(1)
            f.seek(victim.offset + victim.size - 2)
            f.write(bytes([octet[0] ^ 0x40]))
        queue = kit.engine.channels["orders"].queues[1]
        with caplog.at_level(logging.WARNING):
            got = _consume_all(kit)
        assert queue.message_count == 0 and queue.is_empty()
    assert got == [b"p%d" % i for i in range(1, 21) if i != 15]
    assert "paged message 15 lost" in caplog.text
    assert f"segment {path.name} offset {victim.offset}" in caplog.text


def test_clear_and_release_reach_paged_messages(tmp_path: Path) -> None:
    from broker.engine.queue import reading

    with LogStore(tmp_path) as log:
        kit = _kit(log)
        _fill(kit, 20)
        queue = kit.engine.channels["orders"].queues[1]
        browsed = reading.browse(queue, 0, 100)
        assert [seq for seq, _ in browsed] == list(range(1, 21))
        assert [m.payload for _, m in browsed] == [b"p%d" % i for i in range(1, 21)]
        assert reading.release(queue, 12, []) == 12
        assert queue.message_count == 8
        assert reading.bounds(queue).first == 13
        assert queue.clear([], priority=True, regular=True, in_flight=True) == 8
        assert queue.message_count == 0
        log.flush()
        assert log.bounds(Q).count == 0


def test_engine_numbers_are_the_logs_so_a_restart_reads_no_payload(tmp_path: Path) -> None:
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        for seq in (1, 2, 5, 6, 9):  # (3, 4, 7, 8: messages that were not saved)
            store.append(Q, StoredMessage(seq, Message(message_id=f"m{seq}", payload=b"x")))
        assert [r.seq for r in log.records(Q)] == [1, 2, 5, 6, 9]
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        entries = list(store.index(Q))
        assert [e.sequence for e in entries] == [1, 2, 5, 6, 9]
        assert all(e.stored is None for e in entries)
        assert store.read(Q, 6).message.message_id == "m6"
        store.remove(Q, 6)
        assert [m.sequence for m in store.iterate(Q)] == [1, 2, 5, 9]
        assert store.last_sequence(Q) == 9


def test_a_queue_made_again_after_its_removal_is_mapped_and_still_restarts(
    tmp_path: Path,
) -> None:
    """Dropped and made again, a queue numbers from 1 while the log's numbers go on: its
    records are mapped (and read on restart), never confused with the old ones."""
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        for seq in range(1, 6):
            store.append(Q, StoredMessage(seq, Message(message_id=f"old{seq}")))
        store.drop_queue(Q)
        for seq in range(1, 4):
            store.append(Q, StoredMessage(seq, Message(message_id=f"new{seq}")))
        assert store.read(Q, 2).message.message_id == "new2"
        store.remove(Q, 1)
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        entries = list(store.index(Q))
        assert [(e.sequence, e.stored.message.message_id) for e in entries if e.stored] == [
            (2, "new2"),
            (3, "new3"),
        ]
        assert len(entries) == 2
        store.remove(Q, 3)
        assert [m.message.message_id for m in store.iterate(Q)] == ["new2"]


@pytest.mark.parametrize("window", [1, 3])
def test_put_backs_and_redeliveries_keep_their_place_with_paging(
    tmp_path: Path, window: int
) -> None:
    """A nacked delivery put back goes behind the paged messages, flagged redelivered."""
    with LogStore(tmp_path, LogOptions()) as log:
        kit = _kit(log, window)
        _fill(kit, 8)
        consumer = kit.connect("consumer")
        kit.join(consumer, "orders")
        first = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
        assert [f.payload for f in first][:1] == [b"p1"]
        kit.disconnect(consumer)  # every delivery in flight goes back
        got = _consume_all(kit)
    assert sorted(got) == sorted(b"p%d" % i for i in range(1, 9))
    assert got[: len(first)] == [f.payload for f in first]


def test_a_long_paged_queue_restarts_in_order_chunk_after_chunk(tmp_path: Path) -> None:
    """More messages than one chunk of the log's index (1,024): chunks of regular ones
    go to the paged tail whole, a chunk with a high-priority one entry by entry."""
    high = frozenset(range(700, 3001, 700))
    with LogStore(tmp_path) as log:
        _fill(_kit(log), 3000, high)
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        assert kit.engine.recover(kit.now) == 3000
        queue = kit.engine.channels["orders"].queues[1]
        assert queue.message_count == 3000 and queue.sequence == 3000
        assert _waiting_in_memory(kit) <= 2 * WINDOW
        got = _consume_all(kit)
    assert got == [b"p%d" % i for i in sorted(high)] + [
        b"p%d" % i for i in range(1, 3001) if i not in high
    ]


def test_restart_in_small_index_spans_mixing_plain_and_priority_spans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spans of the index with only plain messages come as bare numbers, spans with a
    high-priority one as entries; together, in order, after a removal in the middle."""
    from broker.store.log import store as log_store

    monkeypatch.setattr(log_store, "_COLUMN_CHUNK", 100)
    high = frozenset({150, 620})
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        _fill(kit, 1000, high)
        for seq in range(300, 321):
            kit.engine.store.remove(Q, seq)  # (gone from the log, not from this engine)
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        assert kit.engine.recover(kit.now) == 1000 - 21
        queue = kit.engine.channels["orders"].queues[1]
        assert _waiting_in_memory(kit) <= 2 * WINDOW
        got = _consume_all(kit)
    left = [i for i in range(1, 1001) if not 300 <= i <= 320]
    assert got == [b"p150", b"p620"] + [b"p%d" % i for i in left if i not in high]
    assert queue.message_count == 0


def test_a_long_gap_while_older_records_live_ends_the_equal_range(tmp_path: Path) -> None:
    """A queue that saves only some messages (a per-message ``persistent`` flag) must not
    make the log's index hold a slot per unsaved number: past MAX_SKIP numbers skipped
    while an older record lives, records are mapped instead."""
    from broker.store.durable import MAX_SKIP

    far = 3 + MAX_SKIP * 50
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        store.append(Q, StoredMessage(1, Message(message_id="a")))
        store.append(Q, StoredMessage(3, Message(message_id="b")))  # a short gap: skipped
        store.append(Q, StoredMessage(far, Message(message_id="c")))
        assert [r.seq for r in log.records(Q)] == [1, 3, 4]
        assert log.stats().index_bytes < 33 * MAX_SKIP
        assert store.read(Q, far).message.message_id == "c"
        store.remove(Q, 1)
        assert store.last_sequence(Q) == far
    with LogStore(tmp_path) as log:
        store = DurableStore(log)
        got = [(e.sequence, e.stored is None) for e in store.index(Q)]
        assert got == [(3, True), (far, False)]  # the mapped one read back
        store.remove(Q, far)
        store.remove(Q, 3)
        assert list(store.iterate(Q)) == [] and store.last_sequence(Q) == far


def test_pulls_in_either_order_reach_into_the_paged_tail(tmp_path: Path) -> None:
    from broker.engine.options import QueueStatus
    from broker.protocol import Header, header

    with LogStore(tmp_path) as log:
        kit = _kit(log, window=2)
        producer = kit.connect("producer")
        kit.queue(producer, "ch", 1, status=QueueStatus.PULL,
                  message_delivery_handler="persistent")  # fmt: skip
        for i in range(10):
            kit.push(producer, "ch", 1, b"%d" % i, high=i == 7)
        consumer = kit.connect("consumer")
        kit.join(consumer, "ch")

        def pull(count: int, order: str) -> list[bytes]:
            headers = ((Header.COUNT, str(count)), (Header.ORDER, order))
            frames = kit.pull(consumer, "ch", 1, headers=headers)
            return [f.payload for f in frames if header(f, Header.NO_CONTENT) is None]

        assert pull(3, "LIFO") == [b"7", b"9", b"8"]
        assert pull(2, "FIFO") == [b"0", b"1"]
        assert pull(10, "LIFO") == [b"6", b"5", b"4", b"3", b"2"]
        assert kit.engine.channels["ch"].queues[1].message_count == 0
        log.flush()
        assert log.bounds(("ch", 1)).count == 0
