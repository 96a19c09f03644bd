"""Damaged segments: a flipped byte, a torn tail at every offset, garbage, a bad header.

Every intact record survives, the damaged one is skipped with a log line naming the
segment and the offset, and the store opens and keeps working.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from broker.message import Message
from broker.store import StoredMessage
from broker.store.durable import DurableStore
from broker.store.log import Durability, LogOptions, LogStore, QueueBounds
from broker.store.log import segments as seg
from broker.store.log.records import RecordKind

from .kit import contents, segment_files, small, wait_until

Q = ("orders", 1)
N = 20


def _blob(i: int) -> bytes:
    return b"message-%03d-" % i + bytes(range(i, i + 60))


def _fill(directory: Path) -> tuple[Path, list[seg.Found]]:
    """One segment holding N PUTs; the segment and where its records are."""
    with LogStore(directory) as store:
        for i in range(1, N + 1):
            store.append(Q, _blob(i))
        store.put_value("channel/orders", b"{}")
    (name,) = segment_files(directory)
    path = directory / name
    found = [
        f
        for f in seg.scan(path.read_bytes(), _seed(directory), 1 << 20, seg.SEGMENT_HEADER_SIZE)
        if isinstance(f, seg.Found)
    ]
    assert len(found) == N + 1
    return path, found


def _seed(directory: Path) -> int:
    header = seg.decode_header((directory / segment_files(directory)[0]).read_bytes()[:28])
    assert header is not None
    return header[1]


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("where", ["magic", "checksum", "length", "kind", "body", "last octet"])
def test_a_flipped_byte_loses_that_record_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    path, found = _fill(tmp_path)
    victim = found[6]  # seq 7
    at = (
        victim.offset
        + {
            "magic": 1,
            "checksum": 6,
            "length": 13,
            "kind": 16,
            "body": 40,
            "last octet": victim.size - 1,
        }[where]
    )
    original = path.read_bytes()[at]
    _patch(path, at, bytes([original ^ 0x5A]))
    with caplog.at_level(logging.WARNING, logger="broker.store.log"), LogStore(tmp_path) as store:
        got = contents(store)[Q]
        assert got == {i: _blob(i) for i in range(1, N + 1) if i != 7}
        assert store.values() == {"channel/orders": b"{}"}
        assert store.bounds(Q) == QueueBounds(1, N, N - 1)
        damage = store.stats().damage
        assert [(d.segment, d.offset) for d in damage] == [(1, victim.offset)]
        assert store.append(Q, b"after").seq == N + 1
    assert f"segment {path.name} offset {victim.offset}:" in caplog.text


def test_torn_tail_at_every_offset_of_the_last_record(tmp_path: Path) -> None:
    source = tmp_path / "source"
    path, found = _fill(source)
    last = found[-2]  # the last PUT; the definition after it is cut too
    end = found[-1].offset + found[-1].size
    expected_full = {i: _blob(i) for i in range(1, N + 1)}
    for cut in range(last.offset, end):
        trial = tmp_path / f"cut{cut}"
        shutil.copytree(source, trial)
        os.truncate(trial / path.name, cut)
        with LogStore(trial, LogOptions(durability=Durability.OS)) as store:
            got = contents(store).get(Q, {})
            expected = dict(expected_full)
            if cut < last.offset + last.size:
                del expected[N]
            assert got == expected, f"cut at {cut}"
            assert store.values() == {}
            damage = store.stats().damage
            assert len(damage) == (0 if cut in (last.offset, found[-1].offset) else 1)
            # the store keeps working after the tear
            ticket = store.append(Q, b"new").ticket
            assert store.wait(ticket, 10)
        shutil.rmtree(trial)


def test_garbage_appended_to_a_segment(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, found = _fill(tmp_path)
    end = found[-1].offset + found[-1].size
    junk = b"ZHr1" + os.urandom(3000) + b"ZHr1ZHr1" + b"\x00" * 100
    with open(path, "ab") as f:
        f.write(junk)
    with caplog.at_level(logging.WARNING, logger="broker.store.log"), LogStore(tmp_path) as store:
        assert contents(store)[Q] == {i: _blob(i) for i in range(1, N + 1)}
        damage = store.stats().damage
        assert damage[0].offset == end
        assert sum(d.length for d in damage) == len(junk)
    assert f"segment {path.name} offset {end}:" in caplog.text


def test_a_bad_segment_header_loses_nothing(tmp_path: Path) -> None:
    path, _ = _fill(tmp_path)
    _patch(path, 0, b"XXXXXXXX")
    with LogStore(tmp_path) as store:
        assert contents(store)[Q] == {i: _blob(i) for i in range(1, N + 1)}
        assert store.stats().damage == ()


def test_zeroed_block_in_the_middle_of_many_segments(tmp_path: Path) -> None:
    """A lost disk block (4 KiB of zeros) in one segment: the other segments are whole."""
    options = small(segment_size=16384)
    with LogStore(tmp_path, options) as store:
        for i in range(1, 401):
            store.append(Q, _blob(i % 100))
    names = segment_files(tmp_path)
    assert len(names) >= 3
    middle = tmp_path / names[1]
    _patch(middle, 4096, b"\x00" * 4096)
    with LogStore(tmp_path, options) as store:
        got = contents(store)[Q]
        lost = set(range(1, 401)) - set(got)
        assert 0 < len(lost) < 60
        assert all(got[i] == _blob(i % 100) for i in got)
        # lost records are a contiguous run inside that block
        assert max(lost) - min(lost) + 1 == len(lost)


def test_a_damaged_segment_is_compacted_away(tmp_path: Path) -> None:
    options = small(segment_size=16384)
    with LogStore(tmp_path, options) as store:
        for i in range(1, 301):
            store.append(Q, _blob(i % 100))
    first = tmp_path / segment_files(tmp_path)[0]
    _patch(first, 200, b"\xff")
    with LogStore(tmp_path, options) as store:
        survivors = contents(store)[Q]
        assert len(survivors) == 299
        assert wait_until(lambda: not first.exists())
        store.flush()
    with LogStore(tmp_path, options) as store:
        assert store.stats().damage == ()
        assert contents(store)[Q] == survivors


@pytest.mark.parametrize("length", [0, 10, seg.SEGMENT_HEADER_SIZE])
def test_a_segment_cut_inside_its_header(tmp_path: Path, length: int) -> None:
    """A crash while a new segment was being created leaves it empty or cut short."""
    _fill(tmp_path)
    stub = tmp_path / seg.segment_name(2)
    stub.write_bytes(seg.encode_header(2, _seed(tmp_path))[:length])
    with LogStore(tmp_path) as store:
        assert contents(store)[Q] == {i: _blob(i) for i in range(1, N + 1)}
        # it is compacted away (nothing to copy) and the store goes on
        assert wait_until(lambda: not stub.exists())
        assert store.wait(store.append(Q, b"more").ticket, 10)
    with LogStore(tmp_path) as store:
        assert store.bounds(Q).count == N + 1


def _run_message(seq: int) -> StoredMessage:
    return StoredMessage(seq, Message(message_id=f"r{seq}", target="orders", payload=_blob(seq)))


def test_a_run_cut_by_a_kill_mid_write_keeps_every_acknowledged_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of pushes is written as one group (``DurableStore.append_each`` while held:
    one write of all its records).  A kill during that write leaves a prefix of it on
    disk, cut anywhere: every record acknowledged before it (made durable) comes back,
    every record of the run wholly on disk too, a torn one is skipped with a log line
    naming the segment and the offset, and the store keeps working."""
    source = tmp_path / "source"
    acked, run = range(1, 4), range(4, 12)
    with LogStore(source) as log:
        store = DurableStore(log)
        for seq in acked:
            store.append(Q, _run_message(seq))
        store.flush()  # (acknowledged: durable)
        store.hold()
        assert store.append_each(Q, [_run_message(seq) for seq in run]) == []
        ticket = store.appended
        store.release()
        assert store.appended == ticket + 1  # the run: one entry of the log, one write
        store.flush()
    (name,) = segment_files(source)
    data = (source / name).read_bytes()
    puts = [
        f
        for f in seg.scan(data, _seed(source), 1 << 20, seg.SEGMENT_HEADER_SIZE)
        if isinstance(f, seg.Found) and f.kind == RecordKind.PUT
    ]
    records = puts[len(acked) :]  # (the queue's numbering values are records too)
    assert len(records) == len(run)
    last = records[-1]
    # the run's last record torn: at every octet of its header, every fifth after it
    end = last.offset + last.size
    cuts = {*range(last.offset, last.offset + 32), *range(last.offset, end, 5), end - 1}
    for r in records[:-1]:  # a kill anywhere else in the run's write
        cuts |= {r.offset, r.offset + 1, r.offset + r.size // 2, r.offset + r.size - 1}
    for cut in sorted(cuts):
        trial = tmp_path / f"cut{cut}"
        shutil.copytree(source, trial)
        os.truncate(trial / name, cut)
        whole = [seq for seq, r in zip(run, records, strict=True) if r.offset + r.size <= cut]
        torn = [r.offset for r in records if r.offset < cut < r.offset + r.size]
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING, logger="broker.store.log"),
            LogStore(trial, LogOptions(durability=Durability.OS)) as log,
        ):
            store = DurableStore(log)
            got = [(m.sequence, m.message.payload) for m in store.iterate(Q)]
            assert got == [(seq, _blob(seq)) for seq in (*acked, *whole)], f"cut at {cut}"
            assert [d.offset for d in log.stats().damage] == torn, f"cut at {cut}"
            store.append(Q, _run_message(100))  # it keeps working after the tear
            store.flush()
        for start in torn:
            assert f"segment {name} offset {start}:" in caplog.text, f"cut at {cut}"
        shutil.rmtree(trial)
