"""The engine's ``Store`` over the durable log (``broker.store.log.LogStore``).

Blob format.  A saved message is written in this module's own compact format, not as a
TMQP frame: the log must outlive any one wire protocol (a message that came in through
STOMP has no TMQP octets, and TMQP's limits are not the store's), and the record also
keeps what no wire frame carries (the producing client's id).  Little-endian::

    version u8 (= 2) | flags u8 (1 high priority, 2 first acquirer, 4 wants ack)
    | ttl u8 | content type u16 | the engine's sequence number u64 (0: none given)
    | message id, source, target, producer id: each u16 length + UTF-8
    | header count u16, then per header: name u16 length + UTF-8, value u32 length + UTF-8
    | payload (the rest)

Put-backs and the priority flag also go into the record's metadata (``records.Meta``),
which the log keeps in memory and can rewrite without the payload.

Version 1 (written before the sequence number was kept) is still read: its records come
back with their log number as their engine number.

Sequence numbers.  The engine numbers a queue's messages itself (``broker.sequence``:
clients read queues by these numbers, so they must survive restarts); the log gives each
record its own gap-free number, which differs as soon as one of the queue's messages was
not saved.  So each record keeps the engine's number (version 2), and recovered messages
come back under it.  The adapter keeps, per queue, engine number -> log number for the
live records it wrote or recovered, and the highest engine number it saw; when a queue's
last live record is removed, that number is first kept as the value
``sequence/<queue id>/<channel>`` (written before the removal, so a removal that became
durable implies it): :meth:`DurableStore.last_sequence` gives it back after a restart,
and numbering goes on above it.

Equal numbers.  So that a restart need not read every payload to learn each record's
engine number, the adapter asks the log to give each record the engine's number itself
(``LogStore.append(..., at=)``: the numbers of messages not saved are skipped).  From the
first record so written, a queue's numbers are equal; the value ``aligned/<queue
id>/<channel>`` keeps where that started (``"LO"``), and where it stopped (``"LO HI"``)
if a record ever could not get its engine's number (a queue removed and made again numbers
from 1 while the log's numbers go on), or would have to skip more than
:data:`MAX_SKIP` numbers while older records live: records from then on are mapped as
above.  Within
``LO..HI`` no map entry is kept (no memory per message), :meth:`DurableStore.index` lists
the queue from the log's index alone, and :meth:`DurableStore.read` reads one message
back (a queue that pages its payloads, ``broker.engine.queue.messages``).

Retained messages.  A consumed message a ``Retain`` queue keeps readable by sequence is
written again under the queue's id plus :data:`RETAINED_OFFSET` (a log key no TMQP queue
id reaches), then removed from the queue's live records; releasing it removes it there.

Trash.  A saved message that went to its queue's trash (``broker.engine.queue.trash``)
is written again under the queue's id plus :data:`TRASH_OFFSET`, with two more headers,
``Trash-Reason`` and ``Trash-At`` (wall-clock seconds), before its live record is
removed; resubmitting, purging or the retention policy remove it there.  A crash between
the two writes leaves both: recovery prefers the live one.

Tickets.  :attr:`DurableStore.appended` is the highest ticket of a write whose
durability a reply depends on (a message or a definition saved or deleted, a put-back
written); the server holds its output until :attr:`completed` reaches it
(``broker.server.gate``).  Message removals do not count: forgetting an acknowledged
message late costs a redelivery, never a loss -- except where a reply promises them:
:meth:`DurableStore.removals_answered` (an explicit release: its answer and the queue's
new first number must survive a crash) makes the removals so far count.

Held appends.  Between :meth:`DurableStore.hold` and :meth:`DurableStore.release` (the
engine's batch of pushes, ``Engine.receive_batch``; the server's drain of its socket,
``OutputGate.begin``/``end``: holds nest, the outermost release writes) an append is
encoded and checked at once -- what the log would refuse (a record too large,
``max_pending`` writes waiting, a failed or closed log) raises there, so the engine
refuses that one message as it would have -- and kept back; consecutive appends to one
queue then go to the log together (``LogStore.append_many``: one turn of its lock, one
writer entry, one ticket, so one durability wait for the group).  Every other call
writes what is held first, so the log sees the engine's writes in the engine's order (a
removal never precedes its record).  A held group the log fails to take after all (its
writer failed meanwhile) makes ``appended`` a ticket that never completes, as when the
writer fails under queued appends: :attr:`DurableStore.failed` says so, and the server's
gate then sends what waited with its positive acknowledges refused
(``broker.server.gate``, "A failed store").

Damage.  A record whose blob cannot be decoded (a bug, or a version this code does not
read) is logged with its queue and sequence number and skipped on recovery; the log
itself skips records whose checksum fails.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from array import array
from collections.abc import Iterator, Sequence
from itertools import compress
from operator import itemgetter

from broker.message import Headers, Message
from broker.store.base import IndexEntry, QueueKey, Store, StoredMessage
from broker.store.log import CorruptRecord, LogStore, Meta, NoSuchRecord
from broker.store.log.records import NO_META

log = logging.getLogger("broker.store.durable")

#: Version octet of the blob format described in the module docstring.
BLOB_VERSION = 2
_HEAD_ID_V1 = struct.Struct("<BBBHH")  # version 1: the head and the message id's length
_HEAD_ID = struct.Struct("<BBBHQH")  # the head, the sequence number, the id's length
#: A queue's retained messages live in the log under its id plus this (above TMQP's ids).
RETAINED_OFFSET = 0x1_0000
#: A queue's trashed messages live in the log under its id plus this.
TRASH_OFFSET = 0x2_0000
_TRASH_REASON = "Trash-Reason"
_TRASH_AT = "Trash-At"
#: Values this adapter keeps for itself beside the engine's definitions.
SEQUENCE_PREFIX = "sequence/"
ALIGNED_PREFIX = "aligned/"
#: Numbers of unsaved messages the log may skip to keep a queue's numbers equal while
#: older records live: every number between costs the log's index a slot (33 octets),
#: so a longer gap (a queue that saves only some messages) ends the equal range.
MAX_SKIP = 1024
_NO_HEADERS = b"\0\0"
#: ``Message(...)`` from every field, without the named tuple's Python-level ``__new__``
_new_message = tuple.__new__
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HIGH, _FIRST, _WANTS_ACK = 1, 2, 4
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
#: ``appended`` once held appends could not be written: a ticket no log reaches
_NEVER = 2**63


def _text(out: list[bytes], value: str) -> None:
    raw = value.encode()
    if len(raw) > _U16_MAX:
        raise ValueError(f"text field of {len(raw)} octets exceeds {_U16_MAX}")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def _sequence_name(queue: QueueKey) -> str:
    return f"{SEQUENCE_PREFIX}{queue[1]}/{queue[0]}"


def _aligned_name(queue: QueueKey) -> str:
    return f"{ALIGNED_PREFIX}{queue[1]}/{queue[0]}"


def _retained_key(queue: QueueKey) -> QueueKey:
    return (queue[0], queue[1] + RETAINED_OFFSET)


def _trash_key(queue: QueueKey) -> QueueKey:
    return (queue[0], queue[1] + TRASH_OFFSET)


#: Encoded (source, target, producer id) parts a :class:`DurableStore` keeps (emptied
#: when full): the three are the same for every message of one producer into one queue,
#: so a saved message encodes only its id, head and payload.
MAX_ORIGINS = 1024
Origins = dict[tuple[str, str, str], bytes]


def _origin(source: str, target: str, producer_id: str) -> bytes:
    """A blob's source, target and producer id (each u16 length + UTF-8)."""
    raw = (source.encode(), target.encode(), producer_id.encode())
    if max(map(len, raw)) > _U16_MAX:
        raise ValueError(f"a text field exceeds {_U16_MAX} octets")
    pack16 = _U16.pack
    return b"".join((pack16(len(raw[0])), raw[0], pack16(len(raw[1])), raw[1],
                     pack16(len(raw[2])), raw[2]))  # fmt: skip


def encode_message(
    message: Message, producer_id: str = "", sequence: int = 0, origins: Origins | None = None
) -> bytes:
    """A message (its producer's id, its engine sequence number) as a blob; ValueError if
    a field does not fit.  ``origins``: encoded source/target/producer parts to reuse
    and add to (at most :data:`MAX_ORIGINS`).

    Runs once per persistent message received: its fields taken in one unpacking (the
    order ``decode_record`` builds them in), one ``join`` of packed parts, no helper
    calls per field once its origin is known."""
    (text_id, source, target, content_type, high, first, wants_ack, ttl, headers, payload,
     _wire) = message  # fmt: skip
    flags = (_HIGH if high else 0) | (_FIRST if first else 0) | (_WANTS_ACK if wants_ack else 0)
    mid = text_id.encode()
    try:  # (the pack checks the ranges: ttl u8, content type u16, sequence u64, id u16)
        head = _HEAD_ID.pack(BLOB_VERSION, flags, ttl, content_type, sequence, len(mid))
    except struct.error:
        raise ValueError(
            "ttl must be 0..255, content type 0..65535, sequence 0..2**64-1 and the message "
            f"id at most {_U16_MAX} octets"
        ) from None
    key = (source, target, producer_id)
    origin = None if origins is None else origins.get(key)
    if origin is None:
        origin = _origin(*key)
        if origins is not None:
            if len(origins) >= MAX_ORIGINS:
                origins.clear()
            origins[key] = origin
    if not headers:
        return b"".join((head, mid, origin, _NO_HEADERS, payload))
    if len(headers) > _U16_MAX:
        raise ValueError(f"the header count exceeds {_U16_MAX}")
    out = [head, mid, origin, _U16.pack(len(headers))]
    for name, value in headers:
        _text(out, name)
        raw = value.encode()
        out.append(_U32.pack(len(raw)))
        out.append(raw)
    out.append(bytes(payload))
    return b"".join(out)


def decode_message(blob: bytes) -> tuple[Message, str]:
    """The message and producer id of a blob; CorruptRecord if it is not one."""
    message, producer, _ = decode_record(blob)
    return message, producer


def decode_record(blob: bytes) -> tuple[Message, str, int]:
    """The message, producer id and engine sequence number (0: not kept, version 1) of a
    blob; CorruptRecord if it is not one.

    Runs once per message recovered: offsets walked inline, no reader object."""
    size = len(blob)
    version = blob[0] if size else 0
    head = _HEAD_ID if version == BLOB_VERSION else _HEAD_ID_V1
    if version not in (1, BLOB_VERSION):
        raise CorruptRecord(f"message blob version {version} (this code reads 1..{BLOB_VERSION})")
    if size < head.size:
        raise CorruptRecord("message blob ends early")
    if version == BLOB_VERSION:
        version, flags, ttl, content_type, sequence, n = head.unpack_from(blob, 0)
    else:
        version, flags, ttl, content_type, n = head.unpack_from(blob, 0)
        sequence = 0
    unpack16 = _U16.unpack_from
    try:
        pos = head.size  # message id, source, target, the producer's id: unrolled
        end = pos + n
        message_id = blob[pos:end].decode()
        (n,) = unpack16(blob, end)
        pos = end + 2
        end = pos + n
        source = blob[pos:end].decode()
        (n,) = unpack16(blob, end)
        pos = end + 2
        end = pos + n
        target = blob[pos:end].decode()
        (n,) = unpack16(blob, end)
        pos = end + 2
        end = pos + n
        producer = blob[pos:end].decode()
        (count,) = unpack16(blob, end)
        pos = end + 2
        headers: Headers = ()
        if count:
            pairs = []
            unpack32 = _U32.unpack_from
            for _ in range(count):
                (n,) = unpack16(blob, pos)
                name = blob[pos + 2 : pos + 2 + n].decode()
                pos += 2 + n
                (n,) = unpack32(blob, pos)
                pairs.append((name, blob[pos + 4 : pos + 4 + n].decode()))
                pos += 4 + n
            headers = tuple(pairs)
    except struct.error:
        raise CorruptRecord("message blob ends early") from None
    except UnicodeDecodeError:
        raise CorruptRecord("message blob holds text that is not UTF-8") from None
    if pos > size:
        raise CorruptRecord(f"message blob ends {pos - size} octets early")
    message = _new_message(
        Message,
        (message_id, source, target, content_type, bool(flags & _HIGH),
         bool(flags & _FIRST), bool(flags & _WANTS_ACK), ttl, headers, blob[pos:], None),
    )  # fmt: skip
    return message, producer, sequence


def _first(pair: tuple[int, Exception]) -> int:
    return pair[0]


#: The engine number of a held append (blob, meta, engine number).
_number_of = itemgetter(2)


def _meta(message: StoredMessage) -> Meta:
    if not (
        message.put_backs
        or message.delivery_count
        or message.deadline
        or message.message.high_priority
    ):
        return NO_META
    return Meta(
        delivery_count=min(message.delivery_count, _U32_MAX),
        put_backs=min(message.put_backs, _U32_MAX),
        priority=message.message.high_priority,
        deadline=message.deadline,
    )


class DurableStore(Store):
    """Saved messages and definitions in a :class:`LogStore` (see the module docstring).

    Called from the engine's thread only.  The log is owned by the caller, who closes it
    (``close`` here closes it too, for convenience)."""

    pages = True
    keeps_messages = False  # (``append`` encodes the message at once)

    def __init__(self, log_store: LogStore) -> None:
        self.log = log_store
        #: engine number -> log number, for records outside their queue's equal range
        self._seqs: dict[QueueKey, dict[int, int]] = {}
        #: per queue [LO, HI, open]: engine number == log number for LO <= n < HI
        #: (see "Equal numbers"); [0, 0, 0]: none yet, [0, 0, -1]: none possible
        self._ranges: dict[QueueKey, list[int]] = {}
        #: highest engine sequence number seen per queue (see the module docstring)
        self._last: dict[QueueKey, int] = {}
        #: highest ticket of a write a reply depends on (see the module docstring)
        self.appended = 0
        #: highest ticket of a removal (counted only by :meth:`removals_answered`)
        self._removed = 0
        #: "Held appends": open holds (they nest), and the (blob, meta, engine number)
        #: of one queue's appends kept back
        self._holds = 0
        self._held_queue: QueueKey | None = None
        self._held: list[tuple[bytes, Meta, int]] = []
        #: encoded origins of the messages saved (see :data:`MAX_ORIGINS`)
        self._origins: Origins = {}

    @property
    def completed(self) -> int:
        return self.log.completed

    @property
    def failed(self) -> bool:
        """Has the log's writer stopped (``LogStore.failed``)?"""
        return self.log.failed is not None

    def fileno(self) -> int:
        return self.log.fileno()

    def drain(self) -> int:
        return self.log.drain()

    def hold(self) -> None:
        """Hold appends until :meth:`release` (see "Held appends"); holds nest (the
        server's drain holds around the engine's batch, which holds too)."""
        self._holds += 1

    def release(self) -> None:
        """End a :meth:`hold`; the outermost writes what was kept back, one group per
        queue, and stops holding."""
        if self._holds > 0:
            self._holds -= 1
        if not self._holds and self._held:
            self._write_held()

    @property
    def unwritten(self) -> int:
        """Appends held back, not given to the log yet: ``appended`` does not cover them
        (the gate holds replies until :meth:`release` gives them their ticket)."""
        return len(self._held)

    def append(self, queue: QueueKey, message: StoredMessage) -> None:
        sequence = message.sequence
        blob = encode_message(message.message, message.producer_id, sequence, self._origins)
        meta = _meta(message)
        if self._holds:
            self.log.check_append(queue, blob, meta)  # (raises now what the write would)
            if queue != self._held_queue:
                if self._held:
                    self._write_held()
                self._held_queue = queue
            self._held.append((blob, meta, sequence))
            return
        self._append_one(queue, blob, meta, sequence)

    def append_each(
        self, queue: QueueKey, messages: Sequence[StoredMessage]
    ) -> list[tuple[int, Exception]]:
        """:meth:`Store.append_each`; while appends are held, each message is encoded and
        checked writable (refused now as the write would refuse it) and kept back with
        the queue's other held appends, without a call of :meth:`append` per message."""
        if not self._holds:
            return super().append_each(queue, messages)
        if queue != self._held_queue:
            if self._held:
                self._write_held()
            self._held_queue = queue
        refused: list[tuple[int, Exception]] = []
        items: list[tuple[bytes, Meta, int]] = []
        add = items.append
        origins = self._origins
        for k, (sequence, message, producer_id, put_backs, delivered, deadline) in enumerate(
            messages
        ):
            try:
                blob = encode_message(message, producer_id, sequence, origins)
            except Exception as exc:
                refused.append((k, exc))
                continue
            if put_backs or delivered or deadline or message.high_priority:
                add((blob, _meta(messages[k]), sequence))
            else:  # (``_meta``'s answer without its call)
                add((blob, NO_META, sequence))
        unwritable = self.log.check_run(queue, items)  # (one call for the run)
        if not unwritable:
            self._held += items
            return refused
        skip = dict(unwritable)
        self._held += [item for j, item in enumerate(items) if j not in skip]
        # each item's position in ``messages``: the ones not refused by the encoding
        own = {k for k, _exc in refused}
        places = [k for k in range(len(messages)) if k not in own]
        refused += [(places[j], exc) for j, exc in unwritable]
        refused.sort(key=_first)
        return refused

    def _write_held(self) -> None:
        """Write the held appends of one queue as one group (``_append_group``)."""
        queue, held = self._held_queue, self._held
        self._held = []
        self._held_queue = None
        assert queue is not None
        try:
            if len(held) == 1:
                self._append_one(queue, *held[0])
            else:
                self._append_group(queue, held, checked=True)
        except Exception as exc:
            # The log checked each of them writable when it was held; only a writer
            # that failed (or a close) since then gets here.  Nothing the engine sent
            # after holding them may leave: a ticket the log never completes.
            log.error("queue %s: %d held appends not written: %r", queue, len(held), exc)
            self.appended = _NEVER

    def _append_one(self, queue: QueueKey, blob: bytes, meta: Meta, sequence: int) -> None:
        span = self._ranges.get(queue)
        if span is None or not (span[1] or span[2]):
            span = self._range(queue, start=sequence)
        if span[2] > 0 and (sequence - span[1] <= MAX_SKIP or not self.log.bounds(queue).count):
            done = self.log.append(queue, blob, meta, sequence)
            if done.seq == sequence:
                span[1] = sequence + 1
                if sequence > self._last.get(queue, 0):
                    self._last[queue] = sequence
                self.appended = done.ticket
                return
        else:
            done = None
        if span[2] > 0:  # the log was ahead, or too far behind: mapped from here on
            span[2] = 0
            self.log.put_value(_aligned_name(queue), f"{span[0]} {span[1]}".encode())
        if done is None:
            done = self.log.append(queue, blob, meta)
        seqs = self._seqs.get(queue)
        if seqs is None:
            seqs = self._seqs[queue] = {}
        seqs[sequence] = done.seq
        if sequence > self._last.get(queue, 0):
            self._last[queue] = sequence
        self.appended = done.ticket

    def append_many(self, queue: QueueKey, messages: Sequence[StoredMessage]) -> None:
        """:meth:`append` of each message (in sequence order) with one call into the log
        (``LogStore.append_many``: one turn of its lock, one entry for its writer): what
        a batch of pushes into one queue saves.  Messages whose numbers cannot all stay
        equal to the log's (see "Equal numbers") go one by one."""
        if self._held:
            self._write_held()
        origins = self._origins
        items = [
            (encode_message(m.message, m.producer_id, m.sequence, origins), _meta(m), m.sequence)
            for m in messages
        ]
        if len(items) < 2:
            for item in items:
                self._append_one(queue, *item)
            return
        self._append_group(queue, items)

    def _append_group(
        self, queue: QueueKey, items: list[tuple[bytes, Meta, int]], *, checked: bool = False
    ) -> None:
        """(blob, meta, engine number) of two or more messages, in number order, with
        one ``LogStore.append_many``, or one by one if their numbers cannot all stay
        equal to the log's.  ``checked``: held appends the log checked writable when
        they were held (``LogStore.append_many(checked=)``)."""
        first = items[0][2]
        span = self._ranges.get(queue)
        if span is None or not (span[1] or span[2]):
            span = self._range(queue, start=first)
        follows = span[1]
        fits = span[2] > 0 and (first - follows <= MAX_SKIP or not self.log.bounds(queue).count)
        numbers = list(map(_number_of, items))
        # consecutive numbers (a run's, a drain's): they fit, and the log gives them
        # unless it is ahead; else each gap is looked at
        consecutive = numbers == list(range(first, first + len(numbers)))
        if fits and not consecutive:
            follows = first
            for sequence in numbers:
                if not follows <= sequence <= follows + MAX_SKIP:
                    fits = False
                    break
                follows = sequence + 1
        if not fits:
            for item in items:
                self._append_one(queue, *item)
            return
        given, ticket = self.log.append_many(queue, items, checked=checked)
        if given == numbers:  # every number kept: the equal range grows over them all
            span[1] = numbers[-1] + 1
            if numbers[-1] > self._last.get(queue, 0):
                self._last[queue] = numbers[-1]
            self.appended = ticket
            return
        last = self._last.get(queue, 0)
        seqs = None
        for (*_, sequence), seq in zip(items, given, strict=True):
            if sequence > last:
                last = sequence
            if span[2] > 0 and seq == sequence:
                span[1] = sequence + 1
                continue
            if span[2] > 0:  # the log was ahead: mapped from here on (as ``append``)
                span[2] = 0
                self.log.put_value(_aligned_name(queue), f"{span[0]} {span[1]}".encode())
            if seqs is None:
                seqs = self._seqs.setdefault(queue, {})
            seqs[sequence] = seq
        self._last[queue] = last
        self.appended = ticket

    def _range(self, queue: QueueKey, start: int = 0) -> list[int]:
        """The queue's equal range (see "Equal numbers"), read back from the log's value
        at first use; with ``start`` (a record about to be appended with that number)
        one is begun there if the queue has none and the log is not ahead of it."""
        span = self._ranges.get(queue)
        if span is not None and (span[1] or span[2] or not start):
            return span
        raw = self.log.value(_aligned_name(queue))
        span = [0, 0, 0]
        if raw is not None:
            try:
                parts = [int(x) for x in raw.split()]
            except ValueError:
                parts = []
            if len(parts) == 1:
                span = [parts[0], max(parts[0], self.log.bounds(queue).last + 1), 1]
            elif len(parts) == 2:
                span = [parts[0], parts[1], 0]
            else:
                log.warning("queue %s: unreadable equal range %r", queue, raw)
        elif start and start > self.log.bounds(queue).last:
            self.log.put_value(_aligned_name(queue), str(start).encode())
            span = [start, start, 1]
        elif start:
            span = [0, 0, -1]  # the log is ahead: mapped (until a restart looks again)
        self._ranges[queue] = span
        return span

    def _lookup(self, queue: QueueKey, sequence: int) -> int | None:
        """The log number of the queue's record numbered ``sequence`` by the engine."""
        seqs = self._seqs.get(queue)
        if seqs:
            seq = seqs.get(sequence)
            if seq is not None:
                return seq
        span = self._ranges.get(queue) or self._range(queue)
        return sequence if span[0] <= sequence < span[1] else None

    def read(self, queue: QueueKey, sequence: int) -> StoredMessage:
        """One live message read back from the log: NoSuchRecord when the queue has none
        under that number, CorruptRecord when its record or blob cannot be read."""
        if self._held:
            self._write_held()
        seq = self._lookup(queue, sequence)
        if seq is None:
            raise NoSuchRecord(f"{queue} has no live message {sequence}")
        record = self.log.read(queue, seq)
        message, producer, _ = decode_record(record.blob)
        meta = record.meta
        return StoredMessage(
            sequence, message, producer, meta.put_backs, meta.delivery_count, meta.deadline
        )

    def read_many(
        self, queue: QueueKey, sequences: list[int]
    ) -> dict[int, StoredMessage | Exception]:
        """:meth:`read` for each of ``sequences``.  Within the queue's equal range one
        pass of the log's bulk reader (``LogStore.read_live``: large sequential reads)
        from the lowest to the highest wanted; a record damaged on disk comes back as
        its CorruptRecord, one not live as NoSuchRecord."""
        if self._held:
            self._write_held()
        if not sequences:
            return {}
        low, high = min(sequences), max(sequences)
        span = self._range(queue)
        if not (span[0] <= low and high < span[1]) or len(sequences) < 2:
            return super().read_many(queue, sequences)
        wanted = set(sequences)
        found: dict[int, StoredMessage | Exception] = {}
        for seq, record in self.log.read_live(queue, low):
            if seq > high:
                break
            if seq not in wanted:
                continue
            if isinstance(record, CorruptRecord):
                found[seq] = record
                continue
            try:
                message, producer, _ = decode_record(record.blob)
            except CorruptRecord as exc:
                found[seq] = exc
                continue
            meta = record.meta
            found[seq] = StoredMessage(
                seq, message, producer, meta.put_backs, meta.delivery_count, meta.deadline
            )
        for seq in wanted.difference(found):
            found[seq] = NoSuchRecord(f"{queue} has no live message {seq}")
        return found

    def index(self, queue: QueueKey) -> Iterator[IndexEntry]:
        """The queue's live messages in order, from the log's index alone within the
        queue's equal range (no payload read); a record outside it is read and decoded
        (a damaged one is logged and skipped, as by :meth:`iterate`)."""
        if self._held:
            self._write_held()
        span = self._range(queue)
        if not span[1]:
            for m in self.iterate(queue):
                yield IndexEntry(
                    m.sequence, m.message.high_priority, m.put_backs, m.delivery_count,
                    m.deadline, m,
                )  # fmt: skip
            return
        for chunk in self.index_chunks(queue):
            if isinstance(chunk, array):
                for seq in chunk:
                    try:
                        meta = self.log.meta(queue, seq)
                    except NoSuchRecord:
                        continue
                    yield IndexEntry(seq, False, meta.put_backs, meta.delivery_count, 0.0, None)
            else:
                yield from chunk

    def index_chunks(self, queue: QueueKey) -> Iterator[list[IndexEntry] | array]:
        """:meth:`index` a span of the log's index at a time: a span within the equal
        range whose live records are all of regular priority without deadline comes as
        an ``array`` of their numbers (no object per record); others as entries."""
        if self._held:
            self._write_held()
        span = self._range(queue)
        if not span[1]:
            yield from super().index_chunks(queue)
            return
        low, high = span[0], span[1]
        for first, segment, flags, deadline in self.log.live_columns(queue):
            end = first + len(segment)
            if (
                low <= first
                and end <= high
                and not any(compress(flags, segment))
                and not any(compress(deadline, segment))
            ):
                seqs = array("Q", compress(range(first, end), segment))
                if seqs:
                    yield seqs
                continue
            for slots in self.log.live_index(queue, first):
                chunk = []
                for seq, _segment, _offset, _size, count, put_backs, flag, dl in slots:
                    if seq >= end:
                        break
                    if low <= seq < high:
                        chunk.append(
                            tuple.__new__(IndexEntry, (seq, flag == 1, put_backs, count, dl, None))
                        )
                        continue
                    entry = self._read_entry(queue, seq)
                    if entry is not None:
                        chunk.append(entry)
                if chunk:
                    yield chunk
                if slots[-1][0] >= end - 1:
                    break

    def _read_entry(self, queue: QueueKey, seq: int) -> IndexEntry | None:
        """A record outside the equal range, decoded (None: damaged, logged)."""
        try:
            record = self.log.read(queue, seq)
            message, producer, sequence = decode_record(record.blob)
        except NoSuchRecord:
            return None
        except CorruptRecord as exc:
            log.warning("queue %s record %d skipped: %s", queue, seq, exc)
            return None
        sequence = sequence or seq
        self._seqs.setdefault(queue, {})[sequence] = seq
        if sequence > self._last.get(queue, 0):
            self._last[queue] = sequence
        meta = record.meta
        stored = StoredMessage(
            sequence, message, producer, meta.put_backs, meta.delivery_count, meta.deadline
        )
        return IndexEntry(
            sequence, message.high_priority, meta.put_backs, meta.delivery_count,
            meta.deadline, stored,
        )  # fmt: skip

    def update(self, queue: QueueKey, message: StoredMessage, *, durable: bool = False) -> None:
        """Rewrite the record's metadata (not its blob); a message this store does not
        hold is ignored.  A write replies wait for (``appended``) only when ``durable``
        (a put-back: the requeued message is seen only once its count is kept)."""
        if self._held:
            self._write_held()
        seq = self._lookup(queue, message.sequence)
        if seq is not None:
            with contextlib.suppress(NoSuchRecord):  # (removed meanwhile)
                ticket = self.log.update(queue, seq, _meta(message))
                if durable:
                    self.appended = ticket

    def retain(self, queue: QueueKey, message: StoredMessage) -> None:
        """Write the consumed message under the queue's retained key, then forget the live
        record (a crash between leaves both: recovery prefers the live one)."""
        if self._held:
            self._write_held()
        if self._lookup(queue, message.sequence) is None:
            return
        shadow = _retained_key(queue)
        blob = encode_message(message.message, message.producer_id, message.sequence)
        done = self.log.append(shadow, blob, Meta(priority=message.message.high_priority))
        self._seqs.setdefault(shadow, {})[message.sequence] = done.seq
        self.remove(queue, message.sequence)

    def retained(self, queue: QueueKey) -> Iterator[StoredMessage]:
        if self._held:
            self._write_held()
        for stored in self.iterate(_retained_key(queue)):
            if self._live(queue, stored.sequence):  # a crash between retain's two writes
                self.forget_retained(queue, stored.sequence)
                continue
            yield stored

    def forget_retained(self, queue: QueueKey, sequence: int) -> None:
        if self._held:
            self._write_held()
        shadow = _retained_key(queue)
        seq = self._seqs.get(shadow, {}).pop(sequence, None)
        if seq is not None:
            self._removed = self.log.remove(shadow, seq)

    def removals_answered(self) -> None:
        self.appended = max(self.appended, self._removed)

    def _live(self, queue: QueueKey, sequence: int) -> bool:
        seq = self._lookup(queue, sequence)
        if seq is None:
            return False
        try:
            self.log.meta(queue, seq)
        except NoSuchRecord:
            return False
        return True

    def trash(self, queue: QueueKey, message: StoredMessage, reason: str, at: float) -> None:
        """Write the message under the queue's trash key with its reason and time (the
        engine then removes the live record; a crash between leaves both)."""
        if self._held:
            self._write_held()
        shadow = _trash_key(queue)
        marks = ((_TRASH_REASON, reason), (_TRASH_AT, repr(at)))
        kept = message.message
        kept = kept.replace(headers=(*kept.headers, *marks))
        blob = encode_message(kept, message.producer_id, message.sequence)
        meta = _meta(message._replace(deadline=0.0))
        done = self.log.append(shadow, blob, meta)
        self._seqs.setdefault(shadow, {})[message.sequence] = done.seq

    def trashed(self, queue: QueueKey) -> Iterator[tuple[StoredMessage, str, float]]:
        if self._held:
            self._write_held()
        for stored in self.iterate(_trash_key(queue)):
            if self._live(queue, stored.sequence):  # a crash between trash's two writes
                self.forget_trashed(queue, stored.sequence)
                continue
            reason, at, headers = "", 0.0, []
            for name, value in stored.message.headers:
                if name == _TRASH_REASON:
                    reason = value
                elif name == _TRASH_AT:
                    with contextlib.suppress(ValueError):
                        at = float(value)
                else:
                    headers.append((name, value))
            message = stored.message.replace(headers=tuple(headers))
            yield stored._replace(message=message), reason, at

    def forget_trashed(self, queue: QueueKey, sequence: int) -> None:
        """A write replies wait for: a purge or resubmit answered must not bring the
        trashed message back after a crash."""
        if self._held:
            self._write_held()
        shadow = _trash_key(queue)
        seq = self._seqs.get(shadow, {}).pop(sequence, None)
        if seq is not None:
            self.appended = max(self.appended, self.log.remove(shadow, seq))

    def remove(self, queue: QueueKey, sequence: int) -> None:
        if self._held:
            self._write_held()
        seqs = self._seqs.get(queue)
        seq = None if not seqs else seqs.pop(sequence, None)
        if seq is not None:
            if not seqs and not self._range(queue)[1]:
                self._keep_last(queue)  # the last live one: keep its queue's number first
            self._removed = self.log.remove(queue, seq)
            return
        span = self._ranges.get(queue) or self._range(queue)
        if span[0] <= sequence < span[1]:  # (the log's own number goes on: "Equal numbers")
            self._removed = self.log.remove(queue, sequence)

    def _keep_last(self, queue: QueueKey) -> None:
        last = self._last.get(queue, 0)
        if last:
            name = _sequence_name(queue)
            value = str(last).encode()
            if self.log.value(name) != value:
                self.log.put_value(name, value)

    def last_sequence(self, queue: QueueKey) -> int:
        """The highest engine sequence number this queue has had (0: none known)."""
        if self._held:
            self._write_held()
        last = max(self._last.get(queue, 0), self._range(queue)[1] - 1)
        raw = self.log.value(_sequence_name(queue))
        if raw is not None:
            try:
                last = max(last, int(raw))
            except ValueError:
                log.warning("queue %s: unreadable kept sequence number %r", queue, raw)
        return last

    def iterate(self, queue: QueueKey) -> Iterator[StoredMessage]:
        """The queue's live messages in order (records that cannot be read are logged
        and skipped); each one read becomes known to :meth:`remove` under its number.

        A restart reads every queue through here: the log's bulk reader
        (``LogStore.read_live``: large sequential reads, every checksum verified), one
        blob decode per record, the bookkeeping in locals."""
        if self._held:
            self._write_held()
        seqs = self._seqs.setdefault(queue, {})
        last = self._last.get(queue, 0)
        low, high, _ = self._range(queue)
        try:
            for seq, record in self.log.read_live(queue):
                if isinstance(record, CorruptRecord):
                    log.warning("queue %s record %d skipped: %s", queue, seq, record)
                    continue
                try:
                    message, producer, sequence = decode_record(record.blob)
                except CorruptRecord as exc:
                    log.warning("queue %s record %d skipped: %s", queue, seq, exc)
                    continue
                sequence = sequence or seq  # version 1: the log's number
                if sequence != seq or not low <= seq < high:
                    seqs[sequence] = seq
                if sequence > last:
                    last = sequence
                meta = record.meta
                yield StoredMessage(
                    sequence, message, producer, meta.put_backs, meta.delivery_count, meta.deadline
                )
        finally:
            if last > self._last.get(queue, 0):
                self._last[queue] = last

    def queues(self) -> list[QueueKey]:
        if self._held:
            self._write_held()
        return [
            q for q in self.log.queues() if q[1] < RETAINED_OFFSET and self.log.bounds(q).count
        ]

    def drop_queue(self, queue: QueueKey) -> None:
        if self._held:
            self._write_held()
        shadow = _retained_key(queue)
        for key in (queue, shadow, _trash_key(queue)):
            self._seqs.pop(key, None)
            self._last.pop(key, None)
            self.log.purge(key)
        self.log.delete_value(_sequence_name(queue))
        self._ranges[queue] = [0, 0, -1]
        self.log.delete_value(_aligned_name(queue))

    def put_definition(self, name: str, value: bytes) -> None:
        if self._held:
            self._write_held()
        if self.log.value(name) != value:
            self.appended = self.log.put_value(name, value)

    def delete_definition(self, name: str) -> None:
        """A write replies wait for, as a put is: a removed channel or durable
        subscription answered as removed must not come back after a crash."""
        if self._held:
            self._write_held()
        self.appended = max(self.appended, self.log.delete_value(name))

    def definitions(self) -> dict[str, bytes]:
        if self._held:
            self._write_held()
        return {
            name: value
            for name, value in self.log.values().items()
            if not name.startswith((SEQUENCE_PREFIX, ALIGNED_PREFIX))
        }

    def flush(self) -> None:
        if self._held:
            self._write_held()
        self.log.flush()

    def close(self) -> None:
        if self._held:
            self._write_held()
        self.log.close()
