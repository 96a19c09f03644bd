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

Tickets.  :attr:`DurableStore.appended` is the highest ticket of a write whose
durability a reply depends on (a message or a definition saved); the server holds its
output until :attr:`completed` reaches it (``broker.server.gate``).  Removals do not
count: forgetting an acknowledged message late costs a redelivery, never a loss.

Damage.  A record whose blob cannot be decoded (a bug, or a version this code does not
read) is logged with its queue and sequence number and skipped on recovery; the log
itself skips records whose checksum fails.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterator

from broker.message import Message
from broker.store.base import QueueKey, Store, StoredMessage
from broker.store.log import CorruptRecord, LogStore, Meta, NoSuchRecord

log = logging.getLogger("broker.store.durable")

#: Version octet of the blob format described in the module docstring.
BLOB_VERSION = 2
_HEAD = struct.Struct("<BBBH")
_SEQ = struct.Struct("<Q")
#: A queue's retained messages live in the log under its id plus this (above TMQP's ids).
RETAINED_OFFSET = 0x1_0000
#: Values this adapter keeps for itself beside the engine's definitions.
SEQUENCE_PREFIX = "sequence/"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HIGH, _FIRST, _WANTS_ACK = 1, 2, 4
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF


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


def encode_message(message: Message, producer_id: str = "", sequence: int = 0) -> bytes:
    """A message (its producer's id, its engine sequence number) as a blob; ValueError if
    a field does not fit."""
    if not 0 <= message.ttl <= 0xFF or not 0 <= message.content_type <= _U16_MAX:
        raise ValueError("ttl must be 0..255 and content type 0..65535")
    flags = (
        (_HIGH if message.high_priority else 0)
        | (_FIRST if message.first_acquirer else 0)
        | (_WANTS_ACK if message.wants_ack else 0)
    )
    if not 0 <= sequence < 2**64:
        raise ValueError("sequence must be 0..2**64-1")
    out = [_HEAD.pack(BLOB_VERSION, flags, message.ttl, message.content_type), _SEQ.pack(sequence)]
    for value in (message.message_id, message.source, message.target, producer_id):
        _text(out, value)
    headers = message.headers
    if len(headers) > _U16_MAX:
        raise ValueError(f"{len(headers)} headers exceed {_U16_MAX}")
    out.append(_U16.pack(len(headers)))
    for name, value in headers:
        _text(out, name)
        raw = value.encode()
        out.append(_U32.pack(len(raw)))
        out.append(raw)
    out.append(bytes(message.payload))
    return b"".join(out)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise CorruptRecord(f"message blob ends {end - len(self.data)} octets early")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def text(self, length: struct.Struct) -> str:
        (size,) = length.unpack(self.take(length.size))
        try:
            return self.take(size).decode()
        except UnicodeDecodeError:
            raise CorruptRecord("message blob holds text that is not UTF-8") from None


def decode_message(blob: bytes) -> tuple[Message, str]:
    """The message and producer id of a blob; CorruptRecord if it is not one."""
    message, producer, _ = decode_record(blob)
    return message, producer


def decode_record(blob: bytes) -> tuple[Message, str, int]:
    """The message, producer id and engine sequence number (0: not kept, version 1) of a
    blob; CorruptRecord if it is not one."""
    reader = _Reader(blob)
    version, flags, ttl, content_type = _HEAD.unpack(reader.take(_HEAD.size))
    if version not in (1, BLOB_VERSION):
        raise CorruptRecord(f"message blob version {version} (this code reads 1..{BLOB_VERSION})")
    sequence = _SEQ.unpack(reader.take(_SEQ.size))[0] if version >= 2 else 0
    message_id, source, target, producer = (reader.text(_U16) for _ in range(4))
    (count,) = _U16.unpack(reader.take(_U16.size))
    headers = tuple((reader.text(_U16), reader.text(_U32)) for _ in range(count))
    message = Message(
        message_id=message_id,
        source=source,
        target=target,
        content_type=content_type,
        high_priority=bool(flags & _HIGH),
        first_acquirer=bool(flags & _FIRST),
        wants_ack=bool(flags & _WANTS_ACK),
        ttl=ttl,
        headers=headers,
        payload=blob[reader.pos :],
    )
    return message, producer, sequence


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
        blob = encode_message(message.message, message.producer_id, message.sequence)
        meta = Meta(
            delivery_count=min(message.delivery_count, _U32_MAX),
            put_backs=message.put_backs,
            priority=message.message.high_priority,
        )
        done = self.log.append(queue, blob, meta)
        self._seqs.setdefault(queue, {})[message.sequence] = done.seq
        if message.sequence > self._last.get(queue, 0):
            self._last[queue] = message.sequence
        self.appended = done.ticket

    def delivered(
        self, queue: QueueKey, sequence: int, count: int, put_backs: int, priority: bool
    ) -> None:
        seq = self._seqs.get(queue, {}).get(sequence)
        if seq is None:
            return
        meta = Meta(delivery_count=min(count, _U32_MAX), put_backs=min(put_backs, _U32_MAX),
                    priority=priority)  # fmt: skip
        with contextlib.suppress(NoSuchRecord):  # removed meanwhile: nothing to note
            self.log.update(queue, seq, meta)

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
        and skipped); each one read becomes known to :meth:`remove` under its number."""
        seqs = self._seqs.setdefault(queue, {})
        for seq in list(self.log.sequences(queue)):
            try:
                record = self.log.read(queue, seq)
                message, producer, sequence = decode_record(record.blob)
            except NoSuchRecord:
                continue
            except CorruptRecord as exc:
                log.warning("queue %s record %d skipped: %s", queue, seq, exc)
                continue
            sequence = sequence or seq  # version 1: the log's number
            seqs[sequence] = seq
            if sequence > self._last.get(queue, 0):
                self._last[queue] = sequence
            meta = record.meta
            yield StoredMessage(sequence, message, producer, meta.put_backs, meta.delivery_count)

    def queues(self) -> list[QueueKey]:
        return [
            q for q in self.log.queues() if q[1] < RETAINED_OFFSET and self.log.bounds(q).count
        ]

    def drop_queue(self, queue: QueueKey) -> None:
        shadow = _retained_key(queue)
        for key in (queue, shadow):
            self._seqs.pop(key, None)
            self._last.pop(key, None)
            self.log.purge(key)
        self.log.delete_value(_sequence_name(queue))

    def put_definition(self, name: str, value: bytes) -> None:
        if self.log.value(name) != value:
            self.appended = self.log.put_value(name, value)

    def delete_definition(self, name: str) -> None:
        self.log.delete_value(name)

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
