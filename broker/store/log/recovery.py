"""The recovery scan: replay every segment, oldest first, into a ``StoreState``.

Damaged bytes (a torn tail, a flipped bit, garbage) are skipped with one warning line
naming the segment and the offset; every record that checks out is applied.  A segment
with a bad header is still scanned with the store's seed; a segment named by a durable
RETIRE is deleted after the replay (its live records were copied before the RETIRE).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from broker.store.log import records, segments
from broker.store.log.compaction import SegmentTable
from broker.store.log.index import Location
from broker.store.log.records import RecordKind
from broker.store.log.state import StoreState

log = logging.getLogger("broker.store.log")

_KEY_LEN = struct.Struct("<H")
_U32 = struct.Struct("<I")
_PUT_FIXED = struct.Struct("<QIIIBd")  # seq, origin, then the meta
_BODY = records.HEADER_SIZE
_HEAD = struct.Struct("<4sQIB")
_SUMMED_FROM = 12
_KINDS = frozenset(int(k) for k in RecordKind)


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
    keys: dict[bytes, records.QueueKey] = {}
    count = 0
    view = memoryview(buf)
    offset = segments.SEGMENT_HEADER_SIZE
    end = len(buf)
    digest = xxhash.xxh3_64_intdigest
    head = _HEAD.unpack_from
    seed = result.seed
    put = RecordKind.PUT
    key_len = _KEY_LEN.unpack_from
    put_fixed = _PUT_FIXED.unpack_from
    put_fixed_size = _PUT_FIXED.size
    queues = state.queues
    table = state.table.segments
    # the checks of records.check, inlined: this loop runs once per record on disk
    while offset < end:
        if end - offset >= _BODY:
            magic, summed, length, kind = head(buf, offset)
            size = _BODY + length
            if (
                magic == records.MAGIC
                and size <= max_size
                and offset + size <= end
                and kind in _KINDS
                and digest(view[offset + _SUMMED_FROM : offset + size], seed) == summed
            ):
                try:
                    if kind == put:
                        # _replay_put inlined: the same steps, no call
                        at = offset + _BODY
                        (n,) = key_len(buf, at)
                        key = keys.get(buf[at : at + 6 + n])
                        if key is None:
                            key, _ = _key(buf, at, keys)
                        at += 6 + n
                        if at + put_fixed_size > offset + size:
                            raise records.BadRecord("short PUT body")
                        seq, origin, dc, pb, flags, deadline = put_fixed(buf, at)
                        index = queues.get(key)
                        if index is None:
                            index = state.queue(key)
                        old = index.put_raw(
                            seq, segment, offset, size, origin, dc, pb, flags & 1, deadline
                        )
                        if old is not None and old[0] in table:
                            table[old[0]].live -= old[2]
                        info.live += size
                    else:
                        _replay_other(buf, offset, size, kind, segment, state)
                except (records.BadRecord, struct.error, UnicodeDecodeError, ValueError) as exc:
                    info.damaged = True
                    result.damage.append(DamageReport(segment, offset, size, str(exc)))
                    log.warning(
                        "segment %s offset %d: malformed record skipped: %s", name, offset, exc
                    )
                else:
                    count += 1
                offset += size
                continue
        if buf.count(0, offset) == end - offset:
            # zeros the writer wrote ahead of its data (LogOptions.preallocate): the end
            segments.cut_zero_tail(directory, segment, offset)
            info.size = offset
            break
        damage = next(segments.scan(buf, seed, max_size, offset))
        assert isinstance(damage, segments.Damage)
        info.damaged = True
        result.damage.append(DamageReport(segment, offset, damage.length, damage.reason))
        log.warning(
            "segment %s offset %d: %s, %d octets skipped",
            name,
            offset,
            damage.reason,
            damage.length,
        )
        offset += damage.length
    result.records += count


def _key(buf: bytes, at: int, keys: dict[bytes, records.QueueKey]) -> tuple[records.QueueKey, int]:
    (n,) = _KEY_LEN.unpack_from(buf, at)
    raw = buf[at : at + 6 + n]
    key = keys.get(raw)
    if key is None:
        if len(raw) != 6 + n:
            raise records.BadRecord("short queue key")
        key = keys[raw] = (raw[2 : 2 + n].decode(), _U32.unpack_from(raw, 2 + n)[0])
    return key, at + 6 + n


def _replay_other(
    buf: bytes, offset: int, size: int, kind: int, segment: int, state: StoreState
) -> None:
    record = records.decode_body(kind, buf[offset + _BODY : offset + size])
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
