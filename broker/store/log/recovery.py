"""The recovery scan: replay every segment, oldest first, into a ``StoreState``.

Damaged bytes (a torn tail, a flipped bit, garbage) are skipped with one warning line
naming the segment and the offset; every record that checks out is applied.  A segment
with a bad header is still scanned with the store's seed; a segment named by a durable
RETIRE is deleted after the replay (its live records were copied before the RETIRE).

A queue's PUTs in a row are checked one by one (magic, length, kind, key, checksum) but
held as offsets and given to its index as whole columns (``_SegmentReplay``, ``_Run``);
the state is the one a replay of one record at a time leaves.
"""

from __future__ import annotations

import logging
import os
import struct
import time
from array import array
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import xxhash

from broker.store.log import records, segments
from broker.store.log.compaction import SegmentTable
from broker.store.log.index import Location, QueueIndex
from broker.store.log.records import RecordKind
from broker.store.log.state import StoreState

log = logging.getLogger("broker.store.log")

_KEY_LEN = struct.Struct("<H")
_U32 = struct.Struct("<I")
_PUT_FIXED = struct.Struct("<QIIIBd")  # seq, origin, then the meta
_SEQ_ORIGIN = struct.Struct("<QI")  # a REMOVE's body after its key
_BODY = records.HEADER_SIZE
_HEAD = struct.Struct("<4sQIB")
_SUMMED_FROM = 12
_KINDS = frozenset(int(k) for k in RecordKind)
_RUN_ROWS = 4096  # PUT rows the scan holds per queue before they go to its index
_COLUMNS_FROM = 16  # fewer rows go by put_raw (a short run between removals costs less)


@dataclass(frozen=True, slots=True)
class DamageReport:
    segment: int
    offset: int
    length: int
    reason: str


@dataclass(slots=True)
class Recovery:
    state: StoreState
    seed: int
    last_segment: int
    records: int = 0
    damage: list[DamageReport] = field(default_factory=list)
    seconds: float = 0.0


def recover(directory: Path, compact_ratio: float, max_record_size: int) -> Recovery:
    started = time.perf_counter()
    ids = segments.list_segments(directory)
    seed = _find_seed(directory, ids)
    result = Recovery(
        StoreState(SegmentTable(compact_ratio)), seed, segments.highest_id(directory)
    )
    for segment in ids:
        _replay(directory, segment, result, max_record_size)
    for segment in sorted(result.state.retired & set(ids)):
        name = segments.segment_name(segment)
        if result.state.table.segments[segment].live:
            # a copy made before the RETIRE did not survive: the original stays needed
            log.warning("segment %s: retired but still holds live records, kept", name)
            continue
        log.info("segment %s: retired by compaction, deleting", name)
        segments.delete_segment(directory, segment)
        result.state.table.drop(segment)
    result.seconds = time.perf_counter() - started
    return result


SEED_NAME = "SEED"
_SEED = struct.Struct("<8sQQ")  # magic, seed, checksum
_SEED_MAGIC = b"ZHSEED1\n"


def write_seed(directory: Path, seed: int) -> None:
    """Keep the seed in its own file too, so a segment with a bad header is still read."""
    body = _SEED_MAGIC + seed.to_bytes(8, "little")
    data = body + records.checksum(body, 0).to_bytes(8, "little")
    temporary = directory / (SEED_NAME + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(os.open(temporary, flags, 0o600), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, directory / SEED_NAME)
    segments.fsync_dir(directory)


def read_seed(directory: Path) -> int | None:
    try:
        data = (directory / SEED_NAME).read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _SEED.size:
        return None
    magic, seed, summed = _SEED.unpack(data)
    if magic != _SEED_MAGIC or records.checksum(data[:16], 0) != summed:
        return None
    return int(seed)


def _find_seed(directory: Path, ids: list[int]) -> int:
    seed = read_seed(directory)
    if seed is not None:
        return seed
    for segment in ids:
        with open(segments.open_segment(directory, segment), "rb") as f:
            header = segments.decode_header(f.read(segments.SEGMENT_HEADER_SIZE))
        if header is not None:
            return header[1]
    if ids:
        log.error("no valid seed file or segment header: the records cannot be checked")
    return int.from_bytes(os.urandom(8), "little")


def _replay(directory: Path, segment: int, result: Recovery, max_size: int) -> None:
    state = result.state
    buf = segments.read_segment(directory, segment)
    info = state.table.add(segment, len(buf))
    name = segments.segment_name(segment)
    header = segments.decode_header(buf[: segments.SEGMENT_HEADER_SIZE])
    if header != (segment, result.seed):
        info.damaged = True
        reason = "bad segment header" if header is None else f"header says {header[0]}"
        log.warning("segment %s offset 0: %s, scanning its records anyway", name, reason)
    _SegmentReplay(directory, segment, buf, result, max_size).replay()


class _Run:
    """PUTs of one queue found by the scan, not given to its index yet: their offsets
    only.  ``give`` reads their fields with one C-level pass and appends a stretch of
    consecutive numbers from the index's last slot as whole columns
    (``QueueIndex.put_columns``); any other row goes by ``put_raw``, as one at a time."""

    __slots__ = ("buf", "fields", "head", "index", "offsets", "raw", "segment", "state")

    def __init__(self, raw: bytes, index: QueueIndex, replay: _SegmentReplay) -> None:
        self.raw = raw  # the queue key as encoded in its records
        self.index = index
        self.buf = replay.buf
        self.segment = replay.segment
        self.state = replay.state
        self.offsets: list[int] = []
        #: magic, checksum, length, then the kind octet and the key as one string
        self.head = struct.Struct(f"<4sQI{1 + len(raw)}s")
        #: length, then past kind and key: seq, origin, delivery count, put-backs, flags,
        #: deadline (its size is the least a PUT with this key takes)
        self.fields = struct.Struct(f"<12xI{1 + len(raw)}xQIIIBd")

    def give(self) -> None:
        """Every held PUT to the index, their octets to the segment's live data."""
        offsets = self.offsets
        if len(offsets) < _COLUMNS_FROM:
            self._one_by_one()
            return
        rows = list(map(self.fields.unpack_from, repeat(self.buf, len(offsets)), offsets))
        lengths, seqs, origins, counts, put_backs, flags, deadlines = zip(*rows, strict=True)
        first, n = seqs[0], len(seqs)
        if not self.index.takes_columns(first) or seqs != tuple(range(first, first + n)):
            self._one_by_one()  # a gap, a copy of an older number
            return
        if max(flags) > 1:
            flags = tuple(f & 1 for f in flags)
        sizes = array("I", map(_BODY.__add__, lengths))
        segment = array("I", (self.segment,)) * n
        columns = (segment, offsets, sizes, origins, counts, put_backs, flags, deadlines)
        self.index.put_columns(first, n, columns)
        offsets.clear()
        self.state.table.segments[self.segment].live += sum(sizes)

    def _one_by_one(self) -> None:
        """The held PUTs by ``put_raw`` each (a copy's older record stops being live)."""
        table = self.state.table.segments
        unpack, buf, segment = self.fields.unpack_from, self.buf, self.segment
        put = self.index.put_raw
        live = 0
        for offset in self.offsets:
            length, seq, origin, count, put_backs, flags, deadline = unpack(buf, offset)
            size = _BODY + length
            old = put(seq, segment, offset, size, origin, count, put_backs, flags & 1, deadline)
            if old is not None and old[0] in table:
                table[old[0]].live -= old[2]
            live += size
        self.offsets.clear()
        table[segment].live += live


class _SegmentReplay:
    """The records of one segment's bytes applied to the state, in order.

    Two paths, one outcome.  The hot one takes a PUT of the queue the last PUT went to
    with one ``unpack_from`` of its header and one checksum, and keeps its offset in
    that queue's ``_Run``.  Anything else (another queue, another kind, damage) takes
    the general step, which gives a queue's run to its index before any other record
    touches that queue.  Applying a queue's runs later than the other queues' records
    changes nothing: a record touches its own queue's index only (and each segment's
    live count, summed at the end).
    """

    def __init__(
        self, directory: Path, segment: int, buf: bytes, result: Recovery, max_size: int
    ) -> None:
        self.directory = directory
        self.segment = segment
        self.name = segments.segment_name(segment)
        self.buf = buf
        self.view = memoryview(buf)
        self.result = result
        self.state = result.state
        self.info = result.state.table.segments[segment]
        self.max_size = max_size
        self.keys: dict[bytes, records.QueueKey] = {}
        self.runs: dict[records.QueueKey, _Run] = {}
        self.current: _Run | None = None  # the queue of the last PUT
        self.count = 0

    def replay(self) -> None:
        buf, view, end = self.buf, self.view, len(self.buf)
        seed, most = self.result.seed, self.max_size - _BODY
        digest = xxhash.xxh3_64_intdigest
        magic_ok, body, summed_from = records.MAGIC, _BODY, _SUMMED_FROM
        count = 0
        offset = segments.SEGMENT_HEADER_SIZE
        while offset < end:
            run = self.current
            if run is not None:
                head, kind_key = run.head.unpack_from, bytes((RecordKind.PUT,)) + run.raw
                least = run.fields.size - body  # octets of body a PUT with this key has
                last = end - run.fields.size  # the last offset such a PUT may start at
                held, hold = run.offsets, run.offsets.append
                room = _RUN_ROWS - len(held)
                for _ in range(room):
                    if offset > last:
                        break
                    magic, summed, length, kind_and_key = head(buf, offset)
                    following = offset + body + length
                    if (
                        kind_and_key != kind_key
                        or magic != magic_ok
                        or not least <= length <= most
                        or following > end
                        or digest(view[offset + summed_from : following], seed) != summed
                    ):
                        break
                    hold(offset)
                    offset = following
                else:  # the run holds its most: to the index, and on
                    count += room
                    run.give()
                    continue
                count += len(held) - (_RUN_ROWS - room)
                if offset >= end:
                    break
            offset = self.step(offset)
        for run in self.runs.values():
            run.give()
        self.result.records += count + self.count

    def step(self, offset: int) -> int:
        """The record (or damage) at ``offset`` by the general path; the next offset."""
        buf, end = self.buf, len(self.buf)
        if end - offset >= _BODY:
            magic, summed, length, kind = _HEAD.unpack_from(buf, offset)
            size = _BODY + length
            if (
                magic == records.MAGIC
                and size <= self.max_size
                and offset + size <= end
                and kind in _KINDS
                and records.checksum(self.view[offset + _SUMMED_FROM : offset + size],
                                     self.result.seed) == summed
            ):  # fmt: skip
                try:
                    if kind == RecordKind.PUT:
                        self.put(offset, size)
                    elif kind == RecordKind.REMOVE:
                        self.remove(offset, size)
                    else:
                        self.other(offset, size, kind)
                except (records.BadRecord, struct.error, UnicodeDecodeError, ValueError) as exc:
                    self.info.damaged = True
                    self.result.damage.append(DamageReport(self.segment, offset, size, str(exc)))
                    log.warning(
                        "segment %s offset %d: malformed record skipped: %s",
                        self.name,
                        offset,
                        exc,
                    )
                else:
                    self.count += 1
                return offset + size
        if buf.count(0, offset) == end - offset:
            # zeros the writer wrote ahead of its data (LogOptions.preallocate): the end
            segments.cut_zero_tail(self.directory, self.segment, offset)
            self.info.size = offset
            return end
        damage = next(segments.scan(buf, self.result.seed, self.max_size, offset))
        assert isinstance(damage, segments.Damage)
        self.info.damaged = True
        self.result.damage.append(DamageReport(self.segment, offset, damage.length, damage.reason))
        log.warning(
            "segment %s offset %d: %s, %d octets skipped",
            self.name,
            offset,
            damage.reason,
            damage.length,
        )
        return offset + damage.length

    def put(self, offset: int, size: int) -> None:
        """A checked PUT record: held in its queue's run, which becomes the current one."""
        key, at = _key(self.buf, offset + _BODY, self.keys)
        if at + _PUT_FIXED.size > offset + size:
            raise records.BadRecord("short PUT body")
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = _Run(self.buf[offset + _BODY : at], self.state.queue(key), self)
        run.offsets.append(offset)
        if len(run.offsets) >= _RUN_ROWS:
            run.give()
        self.current = run

    def remove(self, offset: int, size: int) -> None:
        """A checked REMOVE record (an acknowledge: as many as PUTs in a consumed log),
        applied without a record object."""
        key, at = _key(self.buf, offset + _BODY, self.keys)
        if at + _SEQ_ORIGIN.size != offset + size:
            raise records.BadRecord(f"REMOVE body of {size - _BODY} octets")
        seq, _ = _SEQ_ORIGIN.unpack_from(self.buf, at)
        run = self.runs.get(key)
        if run is not None:
            run.give()
        self.state.apply_remove_raw(key, seq)
        index = self.state.queue(key)
        index.next_seq = max(index.next_seq, seq + 1)

    def other(self, offset: int, size: int, kind: int) -> None:
        """A checked record other than a PUT; the queue it names has its run given first."""
        record = records.decode_body(kind, self.buf[offset + _BODY : offset + size])
        queue = getattr(record, "queue", None)
        run = None if queue is None else self.runs.get(queue)
        if run is not None:
            run.give()
        _apply_other(record, offset, size, self.segment, self.state)


def _key(buf: bytes, at: int, keys: dict[bytes, records.QueueKey]) -> tuple[records.QueueKey, int]:
    (n,) = _KEY_LEN.unpack_from(buf, at)
    raw = buf[at : at + 6 + n]
    key = keys.get(raw)
    if key is None:
        if len(raw) != 6 + n:
            raise records.BadRecord("short queue key")
        key = keys[raw] = (raw[2 : 2 + n].decode(), _U32.unpack_from(raw, 2 + n)[0])
    return key, at + 6 + n


def _apply_other(
    record: records.Record, offset: int, size: int, segment: int, state: StoreState
) -> None:
    match record:
        case records.Remove(key, seq, _):
            state.apply_remove(key, seq)
            state.queue(key).next_seq = max(state.queue(key).next_seq, seq + 1)
        case records.MetaUpdate(key, seq, meta):
            index = state.queues.get(key)
            if index is not None:
                index.set_meta(seq, meta)
        case records.Mark(key, next_seq):
            state.apply_mark(key, next_seq)
        case records.Purge(key, below, _):
            state.apply_purge(key, below)
        case records.KvPut(name, value, origin):
            state.apply_kv_put(name, value, Location(segment, offset, size, origin))
        case records.KvDel(name, origin):
            state.apply_kv_del(name, origin)
        case records.Retire(victim):
            state.retired.add(victim)
