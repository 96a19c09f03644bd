"""The open scan's runs of PUTs (``recovery._SegmentReplay``) against a replay of one
record at a time through ``StoreState.apply_*`` (the path the writer takes).

Logs are written on disk record by record from a seeded generator: several queues
interleaved, consecutive numbers with gaps, copies of older numbers (as compaction
writes), removals, metadata, marks, purges, definitions, a malformed body under a good
checksum and flipped bytes.  Both replays must leave the same state: every index column
(dead slots too), every number's location and metadata, segment live counts, damage.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

from broker.store.log import records, segments
from broker.store.log.compaction import SegmentTable
from broker.store.log.index import Location
from broker.store.log.records import QueueKey
from broker.store.log.recovery import recover, write_seed
from broker.store.log.state import StoreState

SEED = 0x5CA9
RATIO = 0.5
MAX_SIZE = 1 << 20
QUEUES: list[QueueKey] = [("orders", 1), ("orders", 2), ("b\u00e9", 70000)]


def _put(rng: random.Random, queue: QueueKey, next_seq: dict[QueueKey, int]) -> bytes:
    """A PUT of ``queue``: mostly the next number, sometimes past a gap or a copy of an
    older one; a few with flag bits beyond priority (bit 0), as a later writer may set."""
    seq = next_seq[queue]
    if rng.random() < 0.02:
        seq += rng.randint(1, 40)  # a gap (numbers never saved)
    elif rng.random() < 0.02 and seq > 1:
        seq = rng.randint(1, seq - 1)  # a copy of an older number
    next_seq[queue] = max(next_seq[queue], seq + 1)
    blob = b"m%d-" % seq + bytes(rng.randint(0, 60))
    if rng.random() < 0.03:
        body = b"".join((records.encode_key(queue), struct.pack("<QI", seq, 1),
                         struct.pack("<IIBd", 1, 0, rng.choice([2, 3]), 0.0), blob))  # fmt: skip
        return records.frame(records.RecordKind.PUT, body, SEED)
    meta = records.Meta(rng.randint(0, 3), rng.randint(0, 2), rng.random() < 0.2,
                        rng.choice([0.0, 1.7e9]))  # fmt: skip
    return records.encode(records.Put(queue, seq, 1, meta, blob), SEED)


def _records(rng: random.Random, count: int) -> list[bytes]:
    """``count`` encoded records; mostly runs of PUTs, as a backlog leaves the log."""
    out: list[bytes] = []
    next_seq = dict.fromkeys(QUEUES, 1)
    queue = QUEUES[0]
    while len(out) < count:
        roll = rng.random()
        if roll < 0.1:
            queue = rng.choice(QUEUES)
        if roll < 0.7:
            burst = rng.randint(16, 120) if rng.random() < 0.08 else 1  # a backlog's run
            for _ in range(burst):
                out.append(_put(rng, queue, next_seq))
        elif roll < 0.85:
            seq = rng.randint(1, next_seq[queue] + 2)
            out.append(records.encode(records.Remove(queue, seq, 1), SEED))
        elif roll < 0.9:
            seq = rng.randint(1, next_seq[queue])
            out.append(records.encode(records.MetaUpdate(queue, seq, records.Meta(9)), SEED))
        elif roll < 0.92:
            next_seq[queue] += rng.randint(0, 5)
            out.append(records.encode(records.Mark(queue, next_seq[queue]), SEED))
        elif roll < 0.93:
            below = rng.randint(1, next_seq[queue])
            out.append(records.encode(records.Purge(queue, below, 1), SEED))
        elif roll < 0.96:
            name = rng.choice(["channel/a", "queue/a/1"])
            out.append(records.encode(records.KvPut(name, b"v%d" % len(out), 1), SEED))
        elif roll < 0.97:
            out.append(records.encode(records.KvDel("channel/a", 1), SEED))
        elif roll < 0.975:  # a checksum that holds over a body that does not (short key)
            out.append(records.frame(records.RecordKind.PUT, b"\x09\x00ab", SEED))
        elif roll < 0.98:  # a REMOVE one octet short, or one too long, under a good checksum
            body = records.encode_key(queue) + bytes(rng.choice([11, 13]))
            out.append(records.frame(records.RecordKind.REMOVE, body, SEED))
        else:
            out.append(rng.randbytes(rng.randint(1, 30)))  # garbage between records
    return out


def _write(directory: Path, rng: random.Random, segment_count: int, per_segment: int) -> None:
    directory.chmod(0o700)
    write_seed(directory, SEED)
    for segment in range(1, segment_count + 1):
        data = bytearray(b"".join(_records(rng, per_segment)))
        for _ in range(rng.randint(0, 2)):  # flipped bytes
            data[rng.randrange(len(data))] ^= 0x10
        if segment == segment_count:
            del data[rng.randrange(len(data)) :]  # a torn tail
        fd = segments.create_segment(directory, segment, SEED)
        try:
            os.write(fd, bytes(data))
        finally:
            os.close(fd)


def _one_at_a_time(directory: Path) -> tuple[StoreState, int, list[tuple[int, int]]]:
    """The oracle: each record found by ``segments.scan`` applied on its own."""
    state = StoreState(SegmentTable(RATIO))
    applied = 0
    damage = []
    for segment in segments.list_segments(directory):
        buf = segments.read_segment(directory, segment)
        state.table.add(segment, len(buf))
        for found in segments.scan(buf, SEED, MAX_SIZE, segments.SEGMENT_HEADER_SIZE):
            if isinstance(found, segments.Damage):
                damage.append((segment, found.offset))
                state.table.segments[segment].damaged = True
                continue
            body = buf[found.offset + records.HEADER_SIZE : found.offset + found.size]
            try:
                record = records.decode_body(found.kind, body)
            except records.BadRecord:
                damage.append((segment, found.offset))
                state.table.segments[segment].damaged = True
                continue
            applied += 1
            match record:
                case records.Put(key, seq, origin, meta, _):
                    state.apply_put(
                        key, seq, Location(segment, found.offset, found.size, origin), meta
                    )
                case records.Remove(key, seq, _):
                    state.apply_remove(key, seq)
                    state.queue(key).next_seq = max(state.queue(key).next_seq, seq + 1)
                case records.MetaUpdate(key, seq, meta):
                    if key in state.queues:
                        state.queues[key].set_meta(seq, meta)
                case records.Mark(key, next_seq):
                    state.apply_mark(key, next_seq)
                case records.Purge(key, below, _):
                    state.apply_purge(key, below)
                case records.KvPut(name, value, origin):
                    where = Location(segment, found.offset, found.size, origin)
                    state.apply_kv_put(name, value, where)
                case records.KvDel(name, origin):
                    state.apply_kv_del(name, origin)
    return state, applied, damage


def _view(state: StoreState) -> dict[str, object]:
    queues = {}
    for key, index in state.queues.items():
        columns = index.columns(0, 1 << 30)
        queues[key] = (
            len(index),
            index.first_seq,
            index.next_seq,
            None if columns is None else (columns[0], *(c.tolist() for c in columns[1:])),
            [(seq, index.locate(seq), index.meta(seq)) for seq in index.sequences()],
        )
    return {
        "queues": queues,
        "segments": {s: (i.size, i.live, i.damaged) for s, i in state.table.segments.items()},
        "kv": {name: (e.value, e.location) for name, e in state.kv.items()},
        "kv_deleted": dict(state.kv_deleted),
    }


@pytest.mark.parametrize("seed", range(4))
def test_runs_leave_the_state_a_record_at_a_time_replay_leaves(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    _write(tmp_path, rng, segment_count=3, per_segment=1000)
    expected, applied, damage = _one_at_a_time(tmp_path)
    got = recover(tmp_path, RATIO, MAX_SIZE)
    assert _view(got.state) == _view(expected)
    assert got.records == applied
    assert [(d.segment, d.offset) for d in got.damage] == damage
    assert any(len(index) > 100 for index in got.state.queues.values())  # runs were taken


def test_a_run_longer_than_its_hold_goes_to_the_index_in_parts(tmp_path: Path) -> None:
    """10,000 consecutive PUTs of one queue (more than a run holds), then the removal of
    one of them inside the last part: every slot is where one at a time puts it."""
    tmp_path.chmod(0o700)
    write_seed(tmp_path, SEED)
    q = QUEUES[0]
    items = [records.Put(q, seq, 1, records.NO_META, b"x%d" % seq) for seq in range(1, 10_001)]
    data = b"".join(records.encode(item, SEED) for item in items)
    data += records.encode(records.Remove(q, 9_999, 1), SEED)
    data += records.encode(records.Put(q, 10_001, 1, records.NO_META, b"last"), SEED)
    fd = segments.create_segment(tmp_path, 1, SEED)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    expected, applied, _ = _one_at_a_time(tmp_path)
    got = recover(tmp_path, RATIO, MAX_SIZE)
    assert _view(got.state) == _view(expected)
    assert got.records == applied == 10_002
    index = got.state.queues[q]
    assert len(index) == 10_000 and 9_999 not in list(index.sequences(9_990))
