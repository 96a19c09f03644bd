"""LogStore: the durable message store (one shared, segmented, append-only log).

Byte level and independent of TMQP: per queue key (channel name, queue id) a gap-free
sequence number (from 1) maps to an opaque blob plus small metadata (``records.Meta``);
beside them a small key-value area for definitions.  All queues share one log, so one
fsync makes a batch of writes to every queue durable.

Threads.  Any thread may call any method.  Write methods encode their record under the
store's lock, give it its place in the log and return a ticket at once; one writer thread
takes everything pending as a batch, writes it with one ``write`` and (``fsync`` mode) one
``fsync``, then completes the batch's tickets (``completion.py``: ``wait``, a callback,
or ``fileno``/``drain`` for an event loop).  The writer thread also compacts, a few
records per step between batches, so appends never stop.

Reads (``read``, ``sequences``, ``records``) take a record's octets from its segment
(``pread``); only the index (``index.py``, 33 octets per sequence number) and the
definitions live in memory.  A record appended but not yet written is waited for; while a
reader waits the lock is free and compaction may move the record (and delete the segment
it was in), so after each wait the reader looks the record up again.  Every wait on the
writer is bounded and re-checks: a writer that failed or whose thread ended raises
``StoreIOError`` in the waiter, never a silent hang.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import mmap
import os
import struct
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_, itemgetter
from pathlib import Path
from typing import NamedTuple

from broker.store.log import records, segments
from broker.store.log.completion import Completions
from broker.store.log.errors import (
    CorruptRecord,
    NoSuchRecord,
    RecordTooLarge,
    StoreClosed,
    StoreError,
    StoreIOError,
    StoreUsageError,
    TooManyPending,
)
from broker.store.log.index import Location, Row
from broker.store.log.options import Durability, LogOptions
from broker.store.log.records import NO_META, Meta, QueueKey
from broker.store.log.recovery import DamageReport, read_seed, recover, write_seed

log = logging.getLogger("broker.store.log")

_U32_MAX = 0xFFFF_FFFF
_CHUNK = 1024  # records listed per turn of the lock
_COLUMN_CHUNK = 65536  # index slots copied per turn of the lock (``live_columns``)
_READ_AHEAD = 1024 * 1024  # octets per pread when a whole queue is read (``read_live``)
_IDLE_WAIT = 0.5  # seconds the writer sleeps with nothing to do before looking again
_ZEROS = 1024 * 1024  # octets of zeros written per pwrite when preallocating
_PUT_FIXED = records.put_overhead(b"") - records.HEADER_SIZE  # a PUT's octets but key, blob
_NO_META_BYTES = records.encode_meta(NO_META)
#: A run of records averaging fewer octets than this is joined into one part before it
#: waits for the writer; larger records stay in their parts (no copy of their payloads).
_JOIN_BELOW = 1024
#: Parts one ``pwritev`` takes at most (the kernel's ``IOV_MAX``); a batch with more is
#: first joined into that many.
_IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
#: ``pwritev`` flag that makes a write durable before it returns (a ``write`` and an
#: ``fdatasync`` of its range in one system call; 0: not known here, fsync after).
_DSYNC = getattr(os, "RWF_DSYNC", 0)
#: What waits for the writer: (segment, the record(s), octets, ticket).
_Entry = tuple[int, "bytes | list[bytes]", int, int]


#: The blob and the meta of an item (blob, meta, at) of a group of appends.
_blob_of, _meta_of = itemgetter(0), itemgetter(1)


def _after(parts: list[bytes | memoryview], left: int) -> list[bytes | memoryview]:
    """The last ``left`` octets of ``parts`` (what a short write did not take)."""
    out: list[bytes | memoryview] = []
    for part in reversed(parts):
        if left <= 0:
            break
        out.append(part if len(part) <= left else memoryview(part)[len(part) - left :])
        left -= len(part)
    out.reverse()
    return out


class Appended(NamedTuple):
    """What ``append`` gives back: the record's sequence number and its ticket (a tuple:
    one is made per message saved)."""

    seq: int
    ticket: int


_new_appended = tuple.__new__


@dataclass(frozen=True, slots=True)
class StoredRecord:
    seq: int
    meta: Meta
    blob: bytes


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """``first`` is the oldest live sequence number (``last + 1`` when empty); ``last``
    the newest ever given (0 if none); ``count`` the live records."""

    first: int
    last: int
    count: int


@dataclass(frozen=True, slots=True)
class StoreStats:
    segments: int
    disk_bytes: int
    live_bytes: int
    live_records: int
    index_bytes: int
    pending: int
    recovered_records: int
    recovery_seconds: float
    damage: tuple[DamageReport, ...]
    #: segments compacted (and deleted) since the store opened
    compactions: int
    #: a compaction is running or a segment is due for one
    compacting: bool
    #: fsyncs of segment files since the store opened
    syncs: int
    #: write batches (group commits) and the records they took, since the store opened:
    #: records / batches is the mean group size
    batches: int = 0
    batch_records: int = 0
    #: seconds spent in the fsyncs after batches (their latency, summed)
    sync_seconds: float = 0.0


@dataclass(slots=True)
class _Compaction:
    victim: int
    view: mmap.mmap | None  # None: an empty file
    scanner: Iterator[segments.Found | segments.Damage]
    queues_seen: set[QueueKey] = field(default_factory=set)
    retire_ticket: int = 0

    def close(self) -> None:
        if self.view is not None:
            self.view.close()


def _encode_key(queue: QueueKey) -> bytes:
    try:
        return records.encode_key(queue)
    except (ValueError, struct.error, UnicodeEncodeError) as exc:
        raise StoreUsageError(f"not a queue key: {queue!r} ({exc})") from None


def _check_meta(meta: Meta) -> None:
    if not (0 <= meta.delivery_count <= _U32_MAX and 0 <= meta.put_backs <= _U32_MAX):
        raise StoreUsageError("delivery_count and put_backs are within 0 and 2**32 - 1")
    if not (math.isfinite(meta.deadline) and meta.deadline >= 0):
        raise StoreUsageError("deadline is a finite wall-clock second >= 0 (0: none)")


class LogStore:
    """A durable store in ``directory`` (created if missing, locked while open)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        options: LogOptions | None = None,
        on_complete: Callable[[int], None] | None = None,
    ) -> None:
        self.options = options or LogOptions()
        self.directory = Path(directory)
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._dir_lock = segments.lock_directory(self.directory)
        except OSError as exc:
            raise StoreIOError(f"cannot open the store in {self.directory}: {exc}") from None
        try:
            recovered = recover(
                self.directory, self.options.compact_ratio, self.options.max_record_size
            )
            if read_seed(self.directory) != recovered.seed:
                write_seed(self.directory, recovered.seed)
        except OSError as exc:
            os.close(self._dir_lock)
            raise StoreIOError(f"cannot recover the store in {self.directory}: {exc}") from None
        except BaseException:
            os.close(self._dir_lock)
            raise
        self._recovery = recovered
        self._state = recovered.state
        self._seed = recovered.seed
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the writer waits on it
        self._written_cond = threading.Condition(self._lock)  # readers wait on it
        self._written: dict[int, int] = {
            s: info.size for s, info in self._state.table.segments.items()
        }
        self._head = recovered.last_segment + 1
        self._head_size = segments.SEGMENT_HEADER_SIZE
        self._state.table.add(self._head, self._head_size)
        self._pending: list[_Entry] = []
        self._keys: dict[QueueKey, bytes] = {}  # encoded keys of the queues appended to
        self._summed: dict[QueueKey, struct.Struct] = {}  # their ``records.put_summed``
        self._ticket = 0
        self._written_ticket = 0
        self._synced_ticket = 0
        self._flush_target = 0
        self._last_sync = time.monotonic()
        self._writer_waiting = False
        self._look_for_victim = True
        self._compaction: _Compaction | None = None
        self._compactions = 0
        self._batches = 0
        self._batch_records = 0
        self._sync_seconds = 0.0
        self._syncs = 0
        self._closing = False
        self._failed: StoreIOError | None = None
        self._read_fds: dict[int, int] = {}
        self._fd = -1
        self._fd_segment = 0
        self._fd_end = 0  # octets the writer wrote to the head (its data)
        self._allocated = 0  # the head file's size (its data and the zeros ahead of it)
        self._zeros = b""
        self._preallocate = (
            self.options.preallocate if self.options.durability is not Durability.OS else 0
        )
        #: ``RWF_DSYNC`` for the writes in ``fsync`` mode (0: written, then synced)
        self._dsync = _DSYNC if self.options.durability is Durability.FSYNC else 0
        self._completions = Completions(on_complete)
        self._thread = threading.Thread(target=self._run, name="store-writer", daemon=True)
        self._thread.start()

    # -- queues ---------------------------------------------------------------------------

    def append(self, queue: QueueKey, blob: bytes, meta: Meta = NO_META, at: int = 0) -> Appended:
        """Add a record to ``queue``; its sequence number and ticket.  With ``at`` (not
        below the queue's next number) the record takes that number: the numbers between
        are skipped, never given (a caller that numbers its own records keeps them equal
        to the log's, see ``broker.store.durable``); otherwise the next one."""
        key = self._keys.get(queue)
        if key is None:
            key = self._keys[queue] = _encode_key(queue)
        if meta is NO_META:
            packed = _NO_META_BYTES
        else:
            _check_meta(meta)
            packed = records.encode_meta(meta)
        size = records.HEADER_SIZE + _PUT_FIXED + len(key) + len(blob)
        if size > self.options.max_record_size:
            raise RecordTooLarge(
                f"record of {len(blob)} octets exceeds {self.options.max_record_size}"
            )
        with self._lock:
            if self._failed is not None or self._closing or self._pending_full():
                self._check_writable(limited=True)
            index = self._state.queues.get(queue)
            if index is None:
                index = self._state.queue(queue)
            seq = index.next_seq if at < index.next_seq else at
            segment = self._head_for(size)
            offset = self._head_size
            record = records.encode_put_packed(key, seq, segment, packed, blob, self._seed)
            self._head_size = offset + size
            info = self._state.table.segments[segment]
            info.size = offset + size
            info.live += size
            self._ticket = ticket = self._ticket + 1
            self._pending.append((segment, record, size, ticket))
            if self._writer_waiting:
                self._wake.notify()
            index.put_raw(
                seq, segment, offset, size, segment, meta.delivery_count, meta.put_backs,
                int(meta.priority), meta.deadline,
            )  # fmt: skip
            return _new_appended(Appended, (seq, ticket))

    def check_append(self, queue: QueueKey, blob: bytes, meta: Meta = NO_META) -> None:
        """Raise what :meth:`append` of ``blob`` would raise now (a record too large, bad
        meta, ``max_pending`` entries waiting, a failed or closed store), write nothing:
        a caller that holds appends to write them as a group refuses each one in time."""
        if meta is not NO_META:
            _check_meta(meta)
        key = self._keys.get(queue)
        if key is None:
            key = self._keys[queue] = _encode_key(queue)
        size = records.HEADER_SIZE + _PUT_FIXED + len(key) + len(blob)
        if size > self.options.max_record_size:
            raise RecordTooLarge(
                f"record of {len(blob)} octets exceeds {self.options.max_record_size}"
            )
        if self._failed is not None or self._closing or self._pending_full():
            with self._lock:
                self._check_writable(limited=True)

    def check_run(
        self, queue: QueueKey, items: Sequence[tuple[bytes, Meta, int]]
    ) -> list[tuple[int, Exception]]:
        """:meth:`check_append` of each (blob, meta, at) of ``items`` with one call:
        (position, error) of each one that :meth:`append` would refuse now, in order.
        Whether the store takes appends at all (failed, closed, ``max_pending`` entries
        waiting) is asked once for the run: nothing is written between its records."""
        refused: list[tuple[int, Exception]] = []
        key = self._keys.get(queue)
        if key is None:
            key = self._keys[queue] = _encode_key(queue)
        limit = self.options.max_record_size - (records.HEADER_SIZE + _PUT_FIXED + len(key))
        looked: Sequence[tuple[bytes, Meta, int]] = items
        if all(map(is_, map(_meta_of, items), repeat(NO_META))) and (
            max(map(len, map(_blob_of, items)), default=0) <= limit
        ):
            looked = ()  # (every record fits, none has meta to check: no loop in Python)
        for k, (blob, meta, _at) in enumerate(looked):
            try:
                if meta is not NO_META:
                    _check_meta(meta)
                if len(blob) > limit:
                    raise RecordTooLarge(
                        f"record of {len(blob)} octets exceeds {self.options.max_record_size}"
                    )
            except StoreError as exc:
                refused.append((k, exc))
        if self._failed is not None or self._closing or self._pending_full():
            try:
                with self._lock:
                    self._check_writable(limited=True)
            except Exception as exc:  # (as ``check_append``: each record not refused yet)
                own = dict(refused)
                return [(k, own.get(k, exc)) for k in range(len(items))]
        return refused

    def append_many(
        self, queue: QueueKey, items: Sequence[tuple[bytes, Meta, int]], *, checked: bool = False
    ) -> tuple[list[int], int]:
        """:meth:`append` of each (blob, meta, at) of ``items`` in one turn of the lock:
        the records of one segment go to the writer as one entry (one ticket), so the
        group costs one wake-up and one completion.  The sequence numbers given, in
        order, and the ticket of the last entry (tickets complete in order: once it is
        complete, every record of the group is).  A usage error (key, meta, a record too
        large) is raised before anything is written; ``([], ticket so far)`` for none.
        ``checked``: the caller had each item checked by :meth:`check_run` or
        :meth:`check_append` (what they check cannot change since): not checked again.

        Runs once per drain's group of saves: per record one ``pack`` of its summed
        head, one concatenation with its blob, its checksum and its index row; the head's
        size kept in a local, each segment's size and live octets added once per segment
        of the group, the numbers given once per range of consecutive ones."""
        key = self._keys.get(queue)
        if key is None:
            key = self._keys[queue] = _encode_key(queue)
        limit = self.options.max_record_size
        base = records.HEADER_SIZE + _PUT_FIXED + len(key)
        if not checked:
            for blob, meta, _at in items:  # (refused before anything is written)
                if meta is not NO_META:
                    _check_meta(meta)
                if base + len(blob) > limit:
                    raise RecordTooLarge(f"record of {len(blob)} octets exceeds {limit}")
        seqs: list[int] = []
        summed_of = self._summed.get(queue)
        if summed_of is None:
            summed_of = self._summed[queue] = records.put_summed(key)
        pack_summed, pack_head = summed_of.pack, records.MAGIC_SUM.pack
        xxh3, magic, put = records.xxh3_64, records.MAGIC, records.RecordKind.PUT
        header = records.HEADER_SIZE
        no_meta = _NO_META_BYTES
        with self._lock:
            if not items:
                return seqs, self._ticket
            if self._failed is not None or self._closing or self._pending_full():
                self._check_writable(limited=True)
            index = self._state.queues.get(queue)
            if index is None:
                index = self._state.queue(queue)
            seed = self._seed
            segment_size = self.options.segment_size
            run: list[bytes] = []
            segment = self._head
            run_start = head_size = self._head_size  # (the run's octets: its growth since)
            # index slots of consecutive numbers, given to the index together
            rows: list[Row] = []
            add_row = rows.append
            first = next_seq = index.next_seq
            for blob, meta, at in items:
                size = base + len(blob)
                seq = next_seq if at < next_seq else at
                if seq != next_seq:  # (a number skipped: the rows so far first)
                    index.put_rows(first, rows)
                    seqs += range(first, next_seq)  # (the numbers of those rows)
                    rows = []
                    add_row = rows.append
                    first = seq
                next_seq = seq + 1
                if head_size + size > segment_size:  # the head rolls: its run goes first
                    self._end_run(segment, run, run_start, head_size)
                    self._head_size = head_size
                    segment = self._head_for(size)
                    run = []
                    run_start = head_size = self._head_size
                if meta is NO_META:
                    summed = pack_summed(size - header, put, key, seq, segment, no_meta) + blob
                    add_row((segment, head_size, size, segment, 0, 0, 0, 0.0))
                else:
                    packed = records.encode_meta(meta)
                    summed = pack_summed(size - header, put, key, seq, segment, packed) + blob
                    add_row(
                        (segment, head_size, size, segment, meta.delivery_count, meta.put_backs,
                         int(meta.priority), meta.deadline)
                    )  # fmt: skip
                run += (pack_head(magic, xxh3(summed, seed)), summed)
                head_size += size
            index.put_rows(first, rows)
            seqs += range(first, next_seq)
            self._end_run(segment, run, run_start, head_size)
            self._head_size = head_size
            return seqs, self._ticket

    def _end_run(self, segment: int, run: list[bytes], start: int, end: int) -> None:
        """The records of ``run``, placed in ``segment`` from offset ``start`` to ``end``:
        the segment's size and live octets grow over them and they go to the writer
        (:meth:`_reserve_run`); nothing for an empty run."""
        if not run:
            return
        info = self._state.table.segments[segment]
        info.size = end
        info.live += end - start
        self._reserve_run(segment, run, end - start)

    def _reserve_run(self, segment: int, run: list[bytes], size: int) -> None:
        """Queue the parts of records already given their places in ``segment`` (``size``
        octets) as one entry.  Small records are joined into one part; larger ones stay
        the parts they were made of, which the writer hands to the kernel as they are
        (``pwritev``): no copy of a payload to gather a batch."""
        self._ticket += 1
        parts: bytes | list[bytes] = run
        if size < _JOIN_BELOW * (len(run) >> 1):
            parts = b"".join(run)
        self._pending.append((segment, parts, size, self._ticket))
        if self._writer_waiting:
            self._wake.notify()

    def remove(self, queue: QueueKey, seq: int) -> int:
        """Forget a record (a tombstone); unknown sequence numbers are ignored.  A ticket."""
        with self._lock:
            if self._failed is not None or self._closing:
                self._check_writable(limited=False)
            origin = self._state.apply_remove_raw(queue, seq)
            if origin is None:
                return self._ticket
            key = self._keys.get(queue)
            if key is None:
                key = self._keys[queue] = records.encode_key(queue)  # (a key it holds)
            self._reserve(records.encode_remove(key, seq, origin, self._seed))
            self._look_for_victim = True
            return self._ticket

    def update(self, queue: QueueKey, seq: int, meta: Meta) -> int:
        """Replace a live record's metadata; NoSuchRecord if it is not live.  A ticket."""
        _check_meta(meta)
        with self._lock:
            self._check_writable(limited=False)
            index = self._state.queues.get(queue)
            if index is None or not index.set_meta(seq, meta):
                raise NoSuchRecord(f"{queue} has no live record {seq}")
            key = self._keys.get(queue)
            if key is None:
                key = self._keys[queue] = records.encode_key(queue)  # (a key it holds)
            packed = records.encode_meta(meta)
            self._reserve(records.encode_meta_update(key, seq, packed, self._seed))
            return self._ticket

    def purge(self, queue: QueueKey) -> int:
        """Forget every record of ``queue`` (its sequence numbers go on).  A ticket."""
        with self._lock:
            self._check_writable(limited=False)
            index = self._state.queues.get(queue)
            if index is None or not len(index):
                return self._ticket
            origin = index.min_origin()
            below = index.next_seq
            self._state.apply_purge(queue, below)
            self._reserve(records.encode(records.Purge(queue, below, origin), self._seed))
            self._look_for_victim = True
            return self._ticket

    def bounds(self, queue: QueueKey) -> QueueBounds:
        with self._lock:
            index = self._state.queues.get(queue)
            if index is None:
                return QueueBounds(1, 0, 0)
            return QueueBounds(index.first_seq, index.next_seq - 1, len(index))

    def queues(self) -> list[QueueKey]:
        """Every queue the store has given a sequence number to."""
        with self._lock:
            return sorted(k for k, index in self._state.queues.items() if index.next_seq > 1)

    def meta(self, queue: QueueKey, seq: int) -> Meta:
        with self._lock:
            index = self._state.queues.get(queue)
            meta = None if index is None else index.meta(seq)
            if meta is None:
                raise NoSuchRecord(f"{queue} has no live record {seq}")
            return meta

    def read(self, queue: QueueKey, seq: int) -> StoredRecord:
        """A live record (its blob read from the log); NoSuchRecord if not live."""
        with self._lock:
            while True:  # (looked up again after each wait: compaction may move it)
                index = self._state.queues.get(queue)
                location = None if index is None else index.locate(seq)
                if index is None or location is None:
                    raise NoSuchRecord(f"{queue} has no live record {seq}")
                if self._written.get(location.segment, 0) >= location.offset + location.size:
                    break
                self._wait_for_writer()
            meta = index.meta(seq)
            assert meta is not None
            data = os.pread(self._read_fd(location.segment), location.size, location.offset)
        try:
            records.check(data, 0, self._seed, self.options.max_record_size)
        except records.BadRecord as exc:
            raise CorruptRecord(
                f"segment {segments.segment_name(location.segment)} offset {location.offset}: "
                f"{exc}"
            ) from None
        return StoredRecord(seq, meta, records.blob_of_put(data))

    def read_live(
        self, queue: QueueKey, start: int = 0
    ) -> Iterator[tuple[int, StoredRecord | CorruptRecord]]:
        """Every live record of ``queue`` from ``start``, in order, as (seq, record) --
        or (seq, CorruptRecord) for one whose checksum fails now, naming its segment and
        offset: the caller logs and skips it.  What :meth:`read` does per record, for a
        whole queue (a restart): the index is walked :data:`_CHUNK` records per turn of
        the lock, and the log is read :data:`_READ_AHEAD` octets per ``pread`` (records
        of a queue lie mostly one after another), never past what the writer wrote.  A
        record not written yet is waited for, then the index is taken again from it: the
        places taken before the wait may be stale (compaction moved the records and may
        have deleted their segment; a segment's octets never change, so what was read
        before stays right)."""
        cursor = start
        seed, max_size = self._seed, self.options.max_record_size
        checked_put_blob = records.checked_put_blob
        window_segment, window_start, window = 0, 0, memoryview(b"")
        while True:
            found: list[tuple[int, StoredRecord | CorruptRecord]] = []
            with self._lock:
                index = self._state.queues.get(queue)
                if index is None:
                    return
                slots = index.live_slots(cursor, _CHUNK)
                if not slots:
                    return
                cursor = slots[-1][0] + 1
                for seq, segment, offset, size, count, put_backs, flags, deadline in slots:
                    end = offset + size
                    at = offset - window_start
                    if segment != window_segment or at < 0 or end - window_start > len(window):
                        if self._written.get(segment, 0) < end:
                            self._wait_for_writer()
                            cursor = seq  # (the index again from here: see above)
                            break
                        length = max(size, min(_READ_AHEAD, self._written[segment] - offset))
                        window = memoryview(os.pread(self._read_fd(segment), length, offset))
                        window_segment, window_start, at = segment, offset, 0
                    try:
                        blob = checked_put_blob(window, at, seed, max_size)
                    except records.BadRecord as exc:
                        name = segments.segment_name(segment)
                        damage = CorruptRecord(f"segment {name} offset {offset}: {exc}")
                        found.append((seq, damage))
                        continue
                    if count or put_backs or flags or deadline:
                        meta = Meta(count, put_backs, bool(flags), deadline)
                    else:
                        meta = NO_META
                    found.append((seq, StoredRecord(seq, meta, blob)))
            yield from found

    def live_index(
        self, queue: QueueKey, start: int = 0
    ) -> Iterator[list[tuple[int, int, int, int, int, int, int, float]]]:
        """The index of ``queue``'s live records from ``start`` on, in order, without
        reading the log: lists of (seq, segment, offset, size, delivery count, put-backs,
        priority flag, deadline), :data:`_CHUNK` per turn of the lock (a restart that
        pages payloads builds its queues from this alone)."""
        cursor = start
        while True:
            with self._lock:
                index = self._state.queues.get(queue)
                slots = [] if index is None else index.live_slots(cursor, _CHUNK)
            if not slots:
                return
            yield slots
            cursor = slots[-1][0] + 1

    def live_columns(
        self, queue: QueueKey, start: int = 0
    ) -> Iterator[tuple[int, array, array, array]]:
        """``queue``'s index from ``start`` on as column copies (``QueueIndex.columns``),
        :data:`_COLUMN_CHUNK` slots per turn of the lock."""
        cursor = start
        while True:
            with self._lock:
                index = self._state.queues.get(queue)
                found = None if index is None else index.columns(cursor, _COLUMN_CHUNK)
            if found is None:
                return
            yield found
            cursor = found[0] + len(found[1])

    def sequences(self, queue: QueueKey, start: int = 0) -> Iterator[int]:
        """Live sequence numbers of ``queue`` from ``start``, in order, taken a chunk at
        a time (records removed meanwhile may still be named: ``read`` then raises)."""
        for seq, _ in self.entries(queue, start):
            yield seq

    def entries(self, queue: QueueKey, start: int = 0) -> Iterator[tuple[int, Meta]]:
        """(sequence number, metadata) of the live records of ``queue`` from ``start``, in
        order, without reading payloads (what a restart needs to rebuild a queue: order,
        priority, TTL, delivery count); taken 1,024 at a time under the lock."""
        cursor = start
        while True:
            with self._lock:
                index = self._state.queues.get(queue)
                if index is None:
                    return
                chunk = []
                for seq in index.sequences(cursor):
                    meta = index.meta(seq)
                    assert meta is not None
                    chunk.append((seq, meta))
                    if len(chunk) == _CHUNK:
                        break
            if not chunk:
                return
            yield from chunk
            cursor = chunk[-1][0] + 1

    def records(self, queue: QueueKey, start: int = 0) -> Iterator[StoredRecord]:
        """Live records of ``queue`` from ``start`` in sequence order (a non-destructive
        browse; records removed while browsing are left out)."""
        for seq in self.sequences(queue, start):
            try:
                yield self.read(queue, seq)
            except NoSuchRecord:
                continue

    # -- definitions ------------------------------------------------------------------------

    def put_value(self, name: str, value: bytes) -> int:
        """Set a definition (channel, queue options, binding, subscription...).  A ticket."""
        raw = name.encode()
        if len(raw) > 0xFFFF:
            raise StoreUsageError("a name is at most 65535 octets")
        if records.HEADER_SIZE + 6 + len(raw) + len(value) > self.options.max_record_size:
            raise RecordTooLarge(f"value of {len(value)} octets exceeds the record limit")
        with self._lock:
            self._check_writable(limited=True)
            known = self._state.kv.get(name)
            head = self._head_for(records.HEADER_SIZE + 6 + len(raw) + len(value))
            if known is not None:
                origin = known.location.origin
            else:
                origin = min(self._state.kv_deleted.get(name, head), head)
            record = records.encode(records.KvPut(name, bytes(value), origin), self._seed)
            segment, offset = self._reserve(record)
            location = Location(segment, offset, len(record), origin)
            self._state.apply_kv_put(name, bytes(value), location)
            return self._ticket

    def delete_value(self, name: str) -> int:
        """Forget a definition (unknown names are ignored).  A ticket."""
        with self._lock:
            self._check_writable(limited=False)
            known = self._state.kv.get(name)
            if known is None:
                return self._ticket
            origin = known.location.origin
            self._state.apply_kv_del(name, origin)
            self._reserve(records.encode(records.KvDel(name, origin), self._seed))
            self._look_for_victim = True
            return self._ticket

    def value(self, name: str) -> bytes | None:
        with self._lock:
            entry = self._state.kv.get(name)
            return None if entry is None else entry.value

    def values(self, prefix: str = "") -> dict[str, bytes]:
        with self._lock:
            return {n: e.value for n, e in self._state.kv.items() if n.startswith(prefix)}

    # -- completion ------------------------------------------------------------------------

    @property
    def completed(self) -> int:
        """The highest complete ticket (every ticket up to it is complete)."""
        return self._completions.done

    @property
    def failed(self) -> StoreIOError | None:
        """The error the writer stopped with (a failed disk), None while it writes: once
        set, no ticket beyond :attr:`completed` ever completes."""
        return self._failed

    def wait(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until ``ticket`` completes; False on timeout.  StoreIOError if the
        writer failed (or its thread ended) before completing it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _IDLE_WAIT if deadline is None else min(_IDLE_WAIT, deadline - time.monotonic())
            if self._completions.wait(ticket, max(left, 0.0)):
                return True
            if self._failed is not None:
                raise self._failed
            if not self._thread.is_alive():
                if self._completions.done >= ticket:
                    return True
                with self._lock:
                    raise self._writer_stopped()
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def fileno(self) -> int:
        """Readable when tickets completed: poll it, then call ``drain``."""
        return self._completions.fileno()

    def drain(self) -> int:
        """Empty ``fileno`` and return ``completed`` (never blocks)."""
        return self._completions.drain()

    def flush(self, timeout: float | None = None) -> bool:
        """fsync everything written so far, whatever the durability mode."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            target = self._ticket
            self._flush_target = max(self._flush_target, target)
            self._wake.notify()
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._synced_ticket < target:
                left = _IDLE_WAIT if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wait_for_writer(min(left, _IDLE_WAIT))
            return True

    # -- life ------------------------------------------------------------------------------

    def close(self) -> None:
        """Write and fsync what is pending, stop the writer, release the directory."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._wake.notify()
        self._thread.join()
        with self._lock:
            if self._compaction is not None:
                self._compaction.close()
                self._compaction = None
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        self._completions.close()
        os.close(self._dir_lock)

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> StoreStats:
        with self._lock:
            table = self._state.table.segments
            return StoreStats(
                segments=len(table),
                disk_bytes=sum(i.size for i in table.values()),
                live_bytes=sum(i.live for i in table.values()),
                live_records=sum(len(q) for q in self._state.queues.values()),
                index_bytes=sum(q.memory() for q in self._state.queues.values()),
                pending=len(self._pending),
                recovered_records=self._recovery.records,
                recovery_seconds=self._recovery.seconds,
                damage=tuple(self._recovery.damage),
                compactions=self._compactions,
                compacting=self._compaction is not None
                or self._state.table.victim(self._head) is not None,
                syncs=self._syncs,
                batches=self._batches,
                batch_records=self._batch_records,
                sync_seconds=self._sync_seconds,
            )

    # -- under the lock --------------------------------------------------------------------

    def _pending_full(self) -> bool:
        return len(self._pending) >= self.options.max_pending

    def _check_writable(self, limited: bool) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closing:
            raise StoreClosed("the store is closed")
        if limited and len(self._pending) >= self.options.max_pending:
            raise TooManyPending(f"{len(self._pending)} appends are waiting for the writer")

    def _wait_for_writer(self, timeout: float = _IDLE_WAIT) -> None:
        """Wait (lock held) at most ``timeout`` for the writer to write or sync more; the
        caller re-checks what it waits for, and looks again at anything the lock guards
        (while the lock is free, compaction may move records).  A writer that failed, or
        whose thread ended, raises here: nothing it has not done will ever be done."""
        if self._failed is not None:
            raise self._failed
        if not self._thread.is_alive():
            raise self._writer_stopped()
        self._written_cond.wait(timeout)

    def _writer_stopped(self) -> StoreError:
        """The error for a waiter whose writer thread is gone (lock held): the closed
        store's, or (no error recorded: a thread that ended without a word) a failure
        of the whole store from now on, as for a failed disk."""
        if self._failed is not None:
            return self._failed
        if self._closing:
            return StoreClosed("the store is closed")
        self._failed = StoreIOError("the store writer thread stopped without an error")
        log.error("%s", self._failed)
        self._written_cond.notify_all()
        self._completions.fail(self._failed)
        return self._failed

    def _head_for(self, size: int) -> int:
        """The segment a record of ``size`` octets will go to (rolls the head if full)."""
        if self._head_size + size > self.options.segment_size:
            self._head += 1
            self._head_size = segments.SEGMENT_HEADER_SIZE
            self._state.table.add(self._head, self._head_size)
            self._look_for_victim = True
        return self._head

    def _reserve(self, record: bytes) -> tuple[int, int]:
        """Give ``record`` its place at the end of the head; (segment, offset)."""
        segment = self._head_for(len(record))
        offset = self._head_size
        self._head_size += len(record)
        self._state.table.segments[segment].size = self._head_size
        self._ticket += 1
        self._pending.append((segment, record, len(record), self._ticket))
        if self._writer_waiting:
            self._wake.notify()
        return segment, offset

    def _read_fd(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            fd = self._read_fds[segment] = segments.open_segment(self.directory, segment)
        return fd

    # -- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                batch, stop = self._next_batch()
                if batch:
                    self._write(batch)
                self._sync_if_due(batch)
                self._compact_step()
                if stop:
                    break
            self._final_sync()
        except BaseException as exc:  # a failed disk (OSError), a defect, even SystemExit
            # (which ends a thread without a word): the store fails, no waiter hangs
            error = StoreIOError(f"store writer failed: {exc!r}")
            log.error("%s", error, exc_info=not isinstance(exc, OSError))
            with self._lock:
                self._failed = error
                self._written_cond.notify_all()
            self._completions.fail(error)

    def _work_waiting(self) -> bool:
        if self._pending or self._closing or self._flush_target > self._synced_ticket:
            return True
        return self._compaction is not None or self._look_for_victim

    def _next_batch(self) -> tuple[list[_Entry], bool]:
        with self._lock:
            while not self._work_waiting():
                timeout = _IDLE_WAIT
                if self._written_ticket > self._synced_ticket and (
                    self.options.durability is Durability.BATCH
                ):
                    timeout = self._last_sync + self.options.batch_interval - time.monotonic()
                    if timeout <= 0:
                        break
                self._writer_waiting = True
                self._wake.wait(timeout)
                self._writer_waiting = False
            taken = 0
            size = 0
            for _, _, octets, _ in self._pending:
                taken += 1
                size += octets
                if size >= self.options.max_batch_bytes:
                    break
            batch = self._pending[:taken]
            del self._pending[:taken]
            stop = self._closing and not self._pending
            return batch, stop

    def _write(self, batch: list[_Entry]) -> None:
        """Write ``batch`` to the head(s): one ``pwritev`` per segment of the records'
        own parts.  In ``fsync`` mode the write is made durable in the same call
        (``RWF_DSYNC``): one system call per batch, not two, so the writer gives up the
        interpreter lock once (each time it takes it back it may wait for the serving
        thread's switch interval), and ``_sync_if_due`` finds nothing left to sync."""
        self._batches += 1
        self._batch_records += len(batch)
        dsync = self._dsync
        start = 0
        while start < len(batch):
            segment = batch[start][0]
            end = start
            parts: list[bytes | memoryview] = []
            size = 0
            while end < len(batch) and batch[end][0] == segment:
                _, record, octets, _ = batch[end]
                if type(record) is list:
                    parts += record
                else:
                    parts.append(record)  # type: ignore[arg-type]
                size += octets
                end += 1
            if segment != self._fd_segment:
                self._open_head(segment)
            if self._preallocate and self._fd_end + size > self._allocated:
                self._write_zeros_ahead(self._fd_end + size)
            if len(parts) > _IOV_MAX:
                step = -(-len(parts) // _IOV_MAX)
                parts = [b"".join(parts[k : k + step]) for k in range(0, len(parts), step)]
            began = time.monotonic() if dsync else 0.0
            durable = self._put(parts, size, dsync)
            self._fd_end += size
            synced = durable and self._synced_ticket == self._written_ticket
            with self._lock:
                self._written[segment] = self._written.get(segment, 0) + size
                self._written_ticket = batch[end - 1][3]
                if synced:  # (nothing written before it waits for a sync)
                    self._synced_ticket = self._written_ticket
                self._written_cond.notify_all()
            if durable:
                self._syncs += 1
                self._last_sync = time.monotonic()
                self._sync_seconds += self._last_sync - began
            start = end

    def _put(self, parts: list[bytes | memoryview], size: int, flags: int) -> bool:
        """``parts`` (``size`` octets) at the end of the head's data; a short write goes
        on from where it stopped.  True when ``flags`` made every call durable."""
        at = self._fd_end
        end = at + size
        while True:
            try:
                at += os.pwritev(self._fd, parts, at, flags)
            except OSError as exc:  # (a file system that does not take the flag)
                if not flags or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                self._dsync = flags = 0  # (written, then synced by ``_sync_if_due``)
                continue
            if at >= end:
                return bool(flags)
            parts = _after(parts, end - at)

    def _open_head(self, segment: int) -> None:
        if self._fd >= 0:
            self._cut_zeros()
            os.fsync(self._fd)  # a finished segment is always made durable
            self._syncs += 1
            os.close(self._fd)
            with self._lock:
                self._synced_ticket = self._written_ticket
        self._fd = segments.create_segment(self.directory, segment, self._seed)
        self._fd_segment = segment
        self._fd_end = self._allocated = segments.SEGMENT_HEADER_SIZE
        with self._lock:
            self._written[segment] = segments.SEGMENT_HEADER_SIZE

    def _write_zeros_ahead(self, needed: int) -> None:
        """Make the head file at least ``needed`` octets long, plus ``preallocate`` more
        (within the segment size), by writing zeros after its data (``pwrite``: the
        data's own position does not move)."""
        target = max(needed, min(needed + self._preallocate, self.options.segment_size))
        if len(self._zeros) < _ZEROS:
            self._zeros = bytes(_ZEROS)
        at = self._allocated
        while at < target:
            at += os.pwrite(self._fd, memoryview(self._zeros)[: min(_ZEROS, target - at)], at)
        self._allocated = at

    def _cut_zeros(self) -> None:
        """A finished (or closed) head keeps its data only."""
        if self._allocated > self._fd_end:
            os.ftruncate(self._fd, self._fd_end)
            self._allocated = self._fd_end

    def _sync_head(self) -> None:
        # data only: the blocks were written (zeros) before, so no metadata changes but
        # the size, which fdatasync includes when it changed (POSIX: what a read needs)
        os.fdatasync(self._fd)

    def _sync_if_due(self, batch: list[_Entry]) -> None:
        mode = self.options.durability
        with self._lock:
            written = self._written_ticket
            unsynced = written > self._synced_ticket
            compaction = self._compaction
            forced = self._flush_target > self._synced_ticket or (
                compaction is not None
                and compaction.retire_ticket
                and compaction.retire_ticket <= written
            )
            due = mode is Durability.FSYNC or (
                mode is Durability.BATCH
                and time.monotonic() - self._last_sync >= self.options.batch_interval
            )
        if unsynced and self._fd >= 0 and (forced or due):
            began = time.monotonic()
            self._sync_head()
            self._syncs += 1
            self._last_sync = time.monotonic()
            self._sync_seconds += self._last_sync - began
            with self._lock:
                self._synced_ticket = written
                self._written_cond.notify_all()
        if mode is Durability.FSYNC:
            self._completions.complete(self._synced_ticket)
        else:
            self._completions.complete(written)

    def _final_sync(self) -> None:
        if self._fd >= 0:
            self._cut_zeros()
            os.fsync(self._fd)
        with self._lock:
            self._synced_ticket = self._written_ticket
            self._written_cond.notify_all()
        self._completions.complete(self._synced_ticket)

    # -- compaction (writer thread) -----------------------------------------------------

    def _compact_step(self) -> None:
        with self._lock:
            compaction = self._compaction
            if compaction is None:
                if not self._look_for_victim or self._closing:
                    return
                self._look_for_victim = False
                victim = self._state.table.victim(self._head)
                if victim is None:
                    return
                if victim == self._fd_segment:  # the writer has not opened the new head yet
                    self._look_for_victim = True
                    return
                if self._written.get(victim, 0) < self._state.table.segments[victim].size:
                    self._look_for_victim = True  # its last batch is being written
                    return
            else:
                victim = compaction.victim
        if compaction is None:
            compaction = self._start_compaction(victim)
            with self._lock:
                self._compaction = compaction
        if compaction.retire_ticket:
            if self._synced_ticket >= compaction.retire_ticket:
                self._finish_compaction(compaction)
            return
        with self._lock:
            self._copy_live(compaction)

    def _start_compaction(self, victim: int) -> _Compaction:
        with open(segments.open_segment(self.directory, victim), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            view = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        log.info("compacting segment %s", segments.segment_name(victim))
        scanner = segments.scan(
            b"" if view is None else view,  # type: ignore[arg-type]
            self._seed,
            self.options.max_record_size,
            segments.SEGMENT_HEADER_SIZE,
        )
        return _Compaction(victim, view, scanner)

    def _copy_live(self, compaction: _Compaction) -> None:
        """Copy the next live records of the victim to the head (under the lock)."""
        for _ in range(self.options.compact_step):
            found = next(compaction.scanner, None)
            if found is None:
                self._end_copy(compaction)
                return
            if isinstance(found, segments.Found):
                self._copy_one(compaction, found)

    def _copy_one(self, compaction: _Compaction, found: segments.Found) -> None:
        state = self._state
        table = state.table
        victim = compaction.victim
        assert compaction.view is not None  # an empty file has no records to find
        raw = compaction.view[found.offset : found.offset + found.size]
        try:
            record = records.decode_body(found.kind, raw[records.HEADER_SIZE :])
        except records.BadRecord:
            return
        match record:
            case records.Put(key, seq, _, _, blob):
                compaction.queues_seen.add(key)
                index = state.queues.get(key)
                location = None if index is None else index.locate(seq)
                if index is None or location is None or location.segment != victim:
                    return
                if location.offset != found.offset:
                    return
                meta = index.meta(seq)
                assert meta is not None
                copy = records.encode_put(
                    records.encode_key(key), seq, location.origin, meta, blob, self._seed
                )
                segment, offset = self._reserve(copy)
                index.relocate(seq, segment, offset, len(copy))
                table.live(victim, -location.size)
                table.live(segment, len(copy))
            case records.MetaUpdate(key, seq, _):
                index = state.queues.get(key)
                location = None if index is None else index.locate(seq)
                if index is not None and location is not None and location.segment != victim:
                    meta = index.meta(seq)
                    assert meta is not None
                    update = records.MetaUpdate(key, seq, meta)
                    self._reserve(records.encode(update, self._seed))
            case records.Remove(key, _, origin) | records.Purge(key, _, origin):
                compaction.queues_seen.add(key)
                if table.tombstone_needed(origin, victim):
                    self._reserve(raw)
            case records.Mark(key, _):
                compaction.queues_seen.add(key)
            case records.KvPut(name, _, _):
                entry = state.kv.get(name)
                if entry is None or entry.location.segment != victim:
                    return
                if entry.location.offset != found.offset:
                    return
                segment, offset = self._reserve(raw)
                entry.location = Location(segment, offset, len(raw), entry.location.origin)
                table.live(victim, -len(raw))
                table.live(segment, len(raw))
            case records.KvDel(name, origin):
                if name in state.kv:
                    return
                if table.tombstone_needed(origin, victim):
                    self._reserve(raw)
                else:
                    state.kv_deleted.pop(name, None)
            case records.Retire(segment):
                if segment in table.segments:
                    self._reserve(raw)

    def _end_copy(self, compaction: _Compaction) -> None:
        for key in sorted(compaction.queues_seen):
            index = self._state.queues.get(key)
            if index is not None:
                mark = records.Mark(key, index.next_seq)
                self._reserve(records.encode(mark, self._seed))
        self._reserve(records.encode(records.Retire(compaction.victim), self._seed))
        compaction.retire_ticket = self._ticket

    def _finish_compaction(self, compaction: _Compaction) -> None:
        victim = compaction.victim
        compaction.close()
        with self._lock:
            fd = self._read_fds.pop(victim, None)
            if fd is not None:
                os.close(fd)
            self._state.table.drop(victim)
            self._written.pop(victim, None)
            self._compaction = None
            self._compactions += 1
            self._look_for_victim = True
        segments.delete_segment(self.directory, victim)
        log.info("segment %s compacted and deleted", segments.segment_name(victim))
