"""A restart's bulk path: ``LogStore.read_live`` (large reads, every checksum verified),
``DurableStore.iterate`` over it and ``Queue.restore_all`` (one pass per queue)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import BrokerConfig, ChannelQueueOptions
from broker.message import Message
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import CorruptRecord, LogStore, Meta, records
from broker.store.log import segments as seg
from broker.store.log.records import RecordKind

from .kit import segment_files, small

Q = ("orders", 1)
WALL = 1_700_000_000.0


def _per_record(store: LogStore) -> list[tuple[int, bytes, Meta]]:
    out = []
    for seq in list(store.sequences(Q)):
        record = store.read(Q, seq)
        out.append((seq, record.blob, record.meta))
    return out


def _bulk(store: LogStore) -> list[tuple[int, bytes, Meta]]:
    out = []
    for seq, record in store.read_live(Q):
        assert not isinstance(record, CorruptRecord), record
        out.append((record.seq, record.blob, record.meta))
        assert record.seq == seq
    return out


def test_read_live_matches_read_across_segments_and_removals(tmp_path: Path) -> None:
    with LogStore(tmp_path, small()) as store:  # 4 KiB segments: dozens of them
        for i in range(300):
            meta = Meta(delivery_count=i % 3, put_backs=i % 2, priority=i % 5 == 0)
            store.append(Q, b"blob-%04d-" % i + bytes(i % 200), meta)
        for seq in range(1, 301, 7):
            store.remove(Q, seq)
        store.flush()
        assert len(segment_files(tmp_path)) > 5
        expected = _per_record(store)
        assert len(expected) == 300 - len(range(1, 301, 7))
        assert _bulk(store) == expected
    with LogStore(tmp_path, small()) as store:  # and after a restart
        assert _bulk(store) == expected
        assert [seq for seq, _ in store.read_live(Q, start=150)] == [
            seq for seq, _, _ in expected if seq >= 150
        ]


def test_read_live_records_larger_than_and_straddling_its_read_ahead(tmp_path: Path) -> None:
    with LogStore(tmp_path) as store:
        for i in range(12):  # 12 x 300 KiB: most records cross a 1 MiB read-ahead boundary
            store.append(Q, bytes([i]) * (300 * 1024 + i))
        store.append(Q, b"x" * (2 * 1024 * 1024))  # one larger than the read-ahead
        store.append(Q, b"tail")
        store.flush()
        expected = _per_record(store)
        assert _bulk(store) == expected
        assert [len(blob) for _, blob, _ in expected][-2:] == [2 * 1024 * 1024, 4]


def _locations(directory: Path) -> tuple[Path, list[seg.Found]]:
    (name,) = segment_files(directory)
    path = directory / name
    data = path.read_bytes()
    header = seg.decode_header(data[: seg.SEGMENT_HEADER_SIZE])
    assert header is not None
    found = [
        f
        for f in seg.scan(data, header[1], 1 << 20, seg.SEGMENT_HEADER_SIZE)
        if isinstance(f, seg.Found)
    ]
    return path, found


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        octet = f.read(1)
        f.seek(offset)
        f.write(bytes([octet[0] ^ 0x40]))


def test_read_live_verifies_checksums_a_record_damaged_after_the_scan(tmp_path: Path) -> None:
    """The open scan checked every record; one damaged on disk afterwards is still caught
    by the bulk read, named by segment and offset, and its neighbours come back."""
    with LogStore(tmp_path) as store:
        for i in range(1, 21):
            store.append(Q, b"message-%02d" % i)
        store.flush()
        path, found = _locations(tmp_path)
        victim = found[9]  # seq 10
        _flip(path, victim.offset + victim.size - 1)
        got = list(store.read_live(Q))
    assert [seq for seq, _ in got] == list(range(1, 21))
    bad = [(seq, r) for seq, r in got if isinstance(r, CorruptRecord)]
    assert len(bad) == 1 and bad[0][0] == 10
    assert f"segment {path.name} offset {victim.offset}" in str(bad[0][1])
    assert "checksum" in str(bad[0][1])
    good = [r.blob for _, r in got if not isinstance(r, CorruptRecord)]
    assert good == [b"message-%02d" % i for i in range(1, 21) if i != 10]


def _options(**kw: object) -> ChannelQueueOptions:
    return ChannelQueueOptions(message_delivery_handler="persistent", **kw)  # type: ignore[arg-type]


def _engine(log: LogStore) -> Engine:
    return Engine(
        store=DurableStore(log),
        handlers={"persistent": PersistentDeliveryHandler()},
        config=BrokerConfig(wall_clock=lambda: WALL),
    )


def test_a_corrupt_record_in_the_middle_is_skipped_on_restart_the_rest_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LogStore(tmp_path) as log:
        engine = _engine(log)
        engine.create_channel("orders")
        engine.create_queue("orders", 1, _options())
        store = engine.store
        for i in range(1, 31):
            m = Message(target="orders", content_type=1, message_id=f"m{i}", payload=b"p%d" % i)
            store.append(Q, StoredMessage(i, m))
    path, found = _locations(tmp_path)
    puts = [f for f in found if f.kind == RecordKind.PUT]  # the 30 messages, in order
    assert len(puts) == 30
    victim = puts[14]  # m15
    _flip(path, victim.offset + victim.size - 2)
    with caplog.at_level(logging.WARNING), LogStore(tmp_path) as log:
        engine = _engine(log)
        assert engine.recover(1.0) == 29
        queue = engine.channels["orders"].queues[1]
        ids = [m.message_id for m in queue.messages.regular]
        assert ids == [f"m{i}" for i in range(1, 31) if i != 15]
        assert [m.seq for m in queue.messages.regular] == [i for i in range(1, 31) if i != 15]
        assert queue.sequence == 30
    assert f"segment {path.name} offset {victim.offset}" in caplog.text


def test_bulk_restore_keeps_order_priority_numbers_counts_and_deadlines(
    tmp_path: Path,
) -> None:
    """Sequence numbers with gaps, high and regular priority interleaved, put-backs,
    delivery counts, deadlines out of order: all as saved, the expiry in deadline order."""
    saved = []
    with LogStore(tmp_path) as log:
        engine = _engine(log)
        engine.create_channel("orders")
        engine.create_queue("orders", 1, _options(message_timeout=60_000))
        for n, seq in enumerate((3, 5, 6, 10, 11, 40, 41, 42)):
            m = Message(
                target="orders", content_type=1, message_id=f"s{seq}", high_priority=n % 3 == 0
            )
            deadline = WALL + (50 - seq) if n % 2 else 0.0  # later messages expire sooner
            stored = StoredMessage(seq, m, "p", n % 2, n, deadline)
            engine.store.append(Q, stored)
            saved.append(stored)
    with LogStore(tmp_path) as log:
        engine = _engine(log)
        assert engine.recover(100.0) == len(saved)
        queue = engine.channels["orders"].queues[1]
        order = queue.messages
        assert [m.seq for m in order.priority] == [s.sequence for s in saved[::3]]
        assert [m.seq for m in order.regular] == [s.sequence for n, s in enumerate(saved) if n % 3]
        assert (order.n_priority, order.n_regular) == (3, 5)
        assert queue.sequence == 42 and queue.message_count == 8
        by_seq = {m.seq: m for m in (*order.priority, *order.regular)}
        for s in saved:
            m = by_seq[s.sequence]
            assert (m.put_backs, m.delivered, m.saved) == (s.put_backs, s.delivery_count, True)
            assert m.message.message_id == f"s{s.sequence}"
            want = 100.0 + (s.deadline - WALL) if s.deadline else 100.0 + 60.0
            assert m.deadline == pytest.approx(want)
        deadlines = [d for d, _ in queue.tracker.expiry]
        assert deadlines == sorted(deadlines) and len(deadlines) == 8
        assert queue.tracker.wake_at == pytest.approx(min(deadlines))


def test_checked_put_blob_catches_every_flipped_bit_and_other_kinds() -> None:
    seed = 0x1234
    data = records.encode(records.Put(Q, 5, 1, Meta(1, 2, True, 3.0), b"abc"), seed)
    assert records.checked_put_blob(b"pad" + data, 3, seed, 1 << 20) == b"abc"
    for i in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[i] ^= 1 << bit
            with pytest.raises(records.BadRecord):
                records.checked_put_blob(bytes(damaged), 0, seed, 1 << 20)
    with pytest.raises(records.BadRecord, match="truncated"):
        records.checked_put_blob(data[:-1], 0, seed, 1 << 20)
    remove = records.encode(records.Remove(Q, 5, 1), seed)
    with pytest.raises(records.BadRecord, match="kind"):
        records.checked_put_blob(remove, 0, seed, 1 << 20)
