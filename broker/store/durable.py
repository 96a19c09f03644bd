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
message late costs a redelivery, never a loss.

Damage.  A record whose blob cannot be decoded (a bug, or a version this code does not
read) is logged with its queue and sequence number and skipped on recovery; the log
itself skips records whose checksum fails.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterator
from dataclasses import replace

from broker.message import Headers, Message
from broker.store.base import QueueKey, Store, StoredMessage
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
_NO_HEADERS = b"\0\0"
#: ``Message(...)`` from every field, without the named tuple's Python-level ``__new__``
_new_message = tuple.__new__
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HIGH, _FIRST, _WANTS_ACK = 1, 2, 4
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
_U64_LIMIT = 2**64


def _text(out: list[bytes], value: str) -> None:
    raw = value.encode()
    if len(raw) > _U16_MAX:
        raise ValueError(f"text field of {len(raw)} octets exceeds {_U16_MAX}")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def _sequence_name(queue: QueueKey) -> str:
    return f"{SEQUENCE_PREFIX}{queue[1]}/{queue[0]}"


def _retained_key(queue: QueueKey) -> QueueKey:
    return (queue[0], queue[1] + RETAINED_OFFSET)


def _trash_key(queue: QueueKey) -> QueueKey:
    return (queue[0], queue[1] + TRASH_OFFSET)


def encode_message(message: Message, producer_id: str = "", sequence: int = 0) -> bytes:
    """A message (its producer's id, its engine sequence number) as a blob; ValueError if
    a field does not fit.

    Runs once per persistent message received: one ``join`` of packed parts, no helper
    calls per field."""
    ttl, content_type = message.ttl, message.content_type
    if not 0 <= ttl <= 0xFF or not 0 <= content_type <= _U16_MAX:
        raise ValueError("ttl must be 0..255 and content type 0..65535")
    flags = (
        (_HIGH if message.high_priority else 0)
        | (_FIRST if message.first_acquirer else 0)
        | (_WANTS_ACK if message.wants_ack else 0)
    )
    mid = message.message_id.encode()
    source = message.source.encode()
    target = message.target.encode()
    producer = producer_id.encode()
    headers = message.headers
    if max(len(mid), len(source), len(target), len(producer), len(headers)) > _U16_MAX:
        raise ValueError(f"a text field or the header count exceeds {_U16_MAX}")
    if not 0 <= sequence < _U64_LIMIT:
        raise ValueError("sequence must be 0..2**64-1")
    pack16 = _U16.pack
    head = _HEAD_ID.pack(BLOB_VERSION, flags, ttl, content_type, sequence, len(mid))
    if not headers:
        return b"".join(
            (head, mid, pack16(len(source)), source, pack16(len(target)), target,
             pack16(len(producer)), producer, _NO_HEADERS, message.payload)
        )  # fmt: skip
    out = [head, mid, pack16(len(source)), source, pack16(len(target)), target]
    out += (pack16(len(producer)), producer, pack16(len(headers)))
    for name, value in headers:
        _text(out, name)
        raw = value.encode()
        out.append(_U32.pack(len(raw)))
        out.append(raw)
    out.append(bytes(message.payload))
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

    def __init__(self, log_store: LogStore) -> None:
        self.log = log_store
        self._seqs: dict[QueueKey, dict[int, int]] = {}
        #: highest engine sequence number seen per queue (see the module docstring)
        self._last: dict[QueueKey, int] = {}
        #: highest ticket of a write a reply depends on (see the module docstring)
        self.appended = 0

    @property
    def completed(self) -> int:
        return self.log.completed

    def fileno(self) -> int:
        return self.log.fileno()

    def drain(self) -> int:
        return self.log.drain()

    def append(self, queue: QueueKey, message: StoredMessage) -> None:
        sequence = message.sequence
        blob = encode_message(message.message, message.producer_id, sequence)
        done = self.log.append(queue, blob, _meta(message))
        seqs = self._seqs.get(queue)
        if seqs is None:
            seqs = self._seqs[queue] = {}
        seqs[sequence] = done.seq
        if sequence > self._last.get(queue, 0):
            self._last[queue] = sequence
        self.appended = done.ticket

    def update(self, queue: QueueKey, message: StoredMessage, *, durable: bool = False) -> None:
        """Rewrite the record's metadata (not its blob); a message this store does not
        hold is ignored.  A write replies wait for (``appended``) only when ``durable``
        (a put-back: the requeued message is seen only once its count is kept)."""
        seqs = self._seqs.get(queue)
        seq = None if seqs is None else seqs.get(message.sequence)
        if seq is not None:
            with contextlib.suppress(NoSuchRecord):  # (removed meanwhile)
                ticket = self.log.update(queue, seq, _meta(message))
                if durable:
                    self.appended = ticket

    def retain(self, queue: QueueKey, message: StoredMessage) -> None:
        """Write the consumed message under the queue's retained key, then forget the live
        record (a crash between leaves both: recovery prefers the live one)."""
        if message.sequence not in self._seqs.get(queue, {}):
            return
        shadow = _retained_key(queue)
        blob = encode_message(message.message, message.producer_id, message.sequence)
        done = self.log.append(shadow, blob, Meta(priority=message.message.high_priority))
        self._seqs.setdefault(shadow, {})[message.sequence] = done.seq
        self.remove(queue, message.sequence)

    def retained(self, queue: QueueKey) -> Iterator[StoredMessage]:
        live = self._seqs.get(queue, {})
        for stored in self.iterate(_retained_key(queue)):
            if stored.sequence in live:  # a crash between retain's two writes
                self.forget_retained(queue, stored.sequence)
                continue
            yield stored

    def forget_retained(self, queue: QueueKey, sequence: int) -> None:
        shadow = _retained_key(queue)
        seq = self._seqs.get(shadow, {}).pop(sequence, None)
        if seq is not None:
            self.log.remove(shadow, seq)

    def trash(self, queue: QueueKey, message: StoredMessage, reason: str, at: float) -> None:
        """Write the message under the queue's trash key with its reason and time (the
        engine then removes the live record; a crash between leaves both)."""
        shadow = _trash_key(queue)
        marks = ((_TRASH_REASON, reason), (_TRASH_AT, repr(at)))
        kept = message.message
        kept = kept.replace(headers=(*kept.headers, *marks))
        blob = encode_message(kept, message.producer_id, message.sequence)
        meta = _meta(replace(message, deadline=0.0))
        done = self.log.append(shadow, blob, meta)
        self._seqs.setdefault(shadow, {})[message.sequence] = done.seq

    def trashed(self, queue: QueueKey) -> Iterator[tuple[StoredMessage, str, float]]:
        live = self._seqs.get(queue, {})
        for stored in self.iterate(_trash_key(queue)):
            if stored.sequence in live:  # a crash between trash's two writes
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
            yield replace(stored, message=message), reason, at

    def forget_trashed(self, queue: QueueKey, sequence: int) -> None:
        shadow = _trash_key(queue)
        seq = self._seqs.get(shadow, {}).pop(sequence, None)
        if seq is not None:
            self.log.remove(shadow, seq)

    def remove(self, queue: QueueKey, sequence: int) -> None:
        seqs = self._seqs.get(queue)
        if seqs is None:
            return
        seq = seqs.pop(sequence, None)
        if seq is not None:
            if not seqs:  # the last live one: keep its queue's number first
                self._keep_last(queue)
            self.log.remove(queue, seq)

    def _keep_last(self, queue: QueueKey) -> None:
        last = self._last.get(queue, 0)
        if last:
            name = _sequence_name(queue)
            value = str(last).encode()
            if self.log.value(name) != value:
                self.log.put_value(name, value)

    def last_sequence(self, queue: QueueKey) -> int:
        """The highest engine sequence number this queue has had (0: none known)."""
        last = self._last.get(queue, 0)
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
        seqs = self._seqs.setdefault(queue, {})
        last = self._last.get(queue, 0)
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
        return [
            q for q in self.log.queues() if q[1] < RETAINED_OFFSET and self.log.bounds(q).count
        ]

    def drop_queue(self, queue: QueueKey) -> None:
        shadow = _retained_key(queue)
        for key in (queue, shadow, _trash_key(queue)):
            self._seqs.pop(key, None)
            self._last.pop(key, None)
            self.log.purge(key)
        self.log.delete_value(_sequence_name(queue))

    def put_definition(self, name: str, value: bytes) -> None:
        if self.log.value(name) != value:
            self.appended = self.log.put_value(name, value)

    def delete_definition(self, name: str) -> None:
        """A write replies wait for, as a put is: a removed channel or durable
        subscription answered as removed must not come back after a crash."""
        self.appended = max(self.appended, self.log.delete_value(name))

    def definitions(self) -> dict[str, bytes]:
        return {
            name: value
            for name, value in self.log.values().items()
            if not name.startswith(SEQUENCE_PREFIX)
        }

    def flush(self) -> None:
        self.log.flush()

    def close(self) -> None:
        self.log.close()
