"""The engine's ``Store`` over the durable log (``broker.store.log.LogStore``).

Blob format.  A saved message is written in this module's own compact format, not as a
TMQP frame: the log must outlive any one wire protocol (a message that came in through
STOMP has no TMQP octets, and TMQP's limits are not the store's), and the record also
keeps what no wire frame carries (the producing client's id).  Little-endian::

    version u8 (= 1) | flags u8 (1 high priority, 2 first acquirer, 4 wants ack)
    | ttl u8 | content type u16
    | message id, source, target, producer id: each u16 length + UTF-8
    | header count u16, then per header: name u16 length + UTF-8, value u32 length + UTF-8
    | payload (the rest)

Put-backs and the priority flag also go into the record's metadata (``records.Meta``),
which the log keeps in memory and can rewrite without the payload.

Sequence numbers.  The engine numbers a queue's messages itself; the log gives each
record its own gap-free number.  The adapter keeps, per queue, engine number -> log
number for the live records it wrote or recovered; recovered messages come back with
their log number as their engine number (so the engine's numbers after a restart start
above them).

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

from broker.message import Headers, Message
from broker.store.base import QueueKey, Store, StoredMessage
from broker.store.log import CorruptRecord, LogStore, Meta, NoSuchRecord
from broker.store.log.records import NO_META

log = logging.getLogger("broker.store.durable")

#: Version octet of the blob format described in the module docstring.
BLOB_VERSION = 1
_HEAD = struct.Struct("<BBBH")
_HEAD_ID = struct.Struct("<BBBHH")  # the head and the message id's length
_NO_HEADERS = b"\0\0"
#: ``Message(...)`` from every field, without the named tuple's Python-level ``__new__``
_new_message = tuple.__new__
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_HIGH, _FIRST, _WANTS_ACK = 1, 2, 4
_U16_MAX = 0xFFFF


def _text(out: list[bytes], value: str) -> None:
    raw = value.encode()
    if len(raw) > _U16_MAX:
        raise ValueError(f"text field of {len(raw)} octets exceeds {_U16_MAX}")
    out.append(_U16.pack(len(raw)))
    out.append(raw)


def encode_message(message: Message, producer_id: str = "") -> bytes:
    """A message (and its producer's id) as a blob; ValueError if a field does not fit.

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
    pack16 = _U16.pack
    head = _HEAD_ID.pack(BLOB_VERSION, flags, ttl, content_type, len(mid))
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
    """The message and producer id of a blob; CorruptRecord if it is not one.

    Runs once per message recovered: offsets walked inline, no reader object."""
    size = len(blob)
    if size < _HEAD_ID.size:
        raise CorruptRecord("message blob ends early")
    version, flags, ttl, content_type, n = _HEAD_ID.unpack_from(blob, 0)
    if version != BLOB_VERSION:
        raise CorruptRecord(f"message blob version {version} (this code reads {BLOB_VERSION})")
    unpack16 = _U16.unpack_from
    try:
        pos = _HEAD_ID.size
        texts = []
        for _ in range(3):  # message id, source, target; then the producer's id
            end = pos + n
            texts.append(blob[pos:end].decode())
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
        (texts[0], texts[1], texts[2], content_type, bool(flags & _HIGH),
         bool(flags & _FIRST), bool(flags & _WANTS_ACK), ttl, headers, blob[pos:], None),
    )  # fmt: skip
    return message, producer


def _meta(message: StoredMessage) -> Meta:
    if not (
        message.put_backs
        or message.delivery_count
        or message.deadline
        or message.message.high_priority
    ):
        return NO_META
    return Meta(
        delivery_count=message.delivery_count,
        put_backs=message.put_backs,
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
        blob = encode_message(message.message, message.producer_id)
        done = self.log.append(queue, blob, _meta(message))
        seqs = self._seqs.get(queue)
        if seqs is None:
            seqs = self._seqs[queue] = {}
        seqs[message.sequence] = done.seq
        self.appended = done.ticket

    def update(self, queue: QueueKey, message: StoredMessage) -> None:
        """Rewrite the record's metadata (not its blob); a message this store does not
        hold is ignored.  Not a write a reply waits for (``appended`` stays)."""
        seqs = self._seqs.get(queue)
        seq = None if seqs is None else seqs.get(message.sequence)
        if seq is not None:
            with contextlib.suppress(NoSuchRecord):  # (removed meanwhile)
                self.log.update(queue, seq, _meta(message))

    def remove(self, queue: QueueKey, sequence: int) -> None:
        seqs = self._seqs.get(queue)
        if seqs is None:
            return
        seq = seqs.pop(sequence, None)
        if seq is not None:
            self.log.remove(queue, seq)

    def iterate(self, queue: QueueKey) -> Iterator[StoredMessage]:
        """The queue's live messages in order (records that cannot be read are logged
        and skipped); each one read becomes known to :meth:`remove` under its number."""
        seqs = self._seqs.setdefault(queue, {})
        for seq in list(self.log.sequences(queue)):
            try:
                record = self.log.read(queue, seq)
                message, producer = decode_message(record.blob)
            except NoSuchRecord:
                continue
            except CorruptRecord as exc:
                log.warning("queue %s record %d skipped: %s", queue, seq, exc)
                continue
            seqs[seq] = seq
            meta = record.meta
            yield StoredMessage(
                seq, message, producer, meta.put_backs, meta.delivery_count, meta.deadline
            )

    def queues(self) -> list[QueueKey]:
        return [q for q in self.log.queues() if self.log.bounds(q).count]

    def drop_queue(self, queue: QueueKey) -> None:
        self._seqs.pop(queue, None)
        self.log.purge(queue)

    def put_definition(self, name: str, value: bytes) -> None:
        if self.log.value(name) != value:
            self.appended = self.log.put_value(name, value)

    def delete_definition(self, name: str) -> None:
        self.log.delete_value(name)

    def definitions(self) -> dict[str, bytes]:
        return self.log.values()

    def flush(self) -> None:
        self.log.flush()

    def close(self) -> None:
        self.log.close()
