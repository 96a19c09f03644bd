"""The record format of the log: encode and decode, no files (sans-IO).

A record on disk::

    magic  4  b"ZHr1"
    sum    8  xxh3_64(length .. end of body, seed = the store's seed), little-endian
    length 4  octets of body
    kind   1  RecordKind
    body   length octets

The checksum covers the length, the kind and the body, so a flipped bit anywhere after the
magic is caught.  The seed is a random number drawn when the store was created (kept in
every segment header): a blob that embeds the bytes of a fake record cannot carry a valid
checksum, so a recovery scan that resynchronises after a corrupt record never takes a
forged record out of a payload.

Bodies (integers little-endian; ``key`` is ``u16 len, UTF-8 channel, u32 queue id``)::

    PUT     key, u64 seq, u32 origin, meta, blob
    REMOVE  key, u64 seq, u32 origin
    META    key, u64 seq, meta
    MARK    key, u64 next_seq
    PURGE   key, u64 below, u32 origin
    KV_PUT  u32 origin, u16 len, name, value
    KV_DEL  u32 origin, u16 len, name
    RETIRE  u32 segment

``meta`` is ``u32 delivery_count, u32 put_backs, u8 flags (bit 0: priority), f64 deadline``
(wall-clock seconds; 0 = none).  ``origin`` is the oldest segment that may hold a copy of
what a tombstone (REMOVE, PURGE, KV_DEL) hides; compaction keeps the tombstone while a
segment from ``origin`` up to the tombstone's own still exists.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import xxhash

MAGIC = b"ZHr1"
_HEAD = struct.Struct("<4sQIB")  # magic, checksum, length, kind
HEADER_SIZE = _HEAD.size  # 17
_SUMMED_FROM = 12  # the checksum covers the record from its length field on
_KEY = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64_U32 = struct.Struct("<QI")
_META = struct.Struct("<IIBd")
META_SIZE = _META.size
_PUT_TAIL = _U64_U32.size + META_SIZE  # after a PUT's key: seq, origin, meta
_MAX_CHANNEL = 0xFFFF

QueueKey = tuple[str, int]


class RecordKind(IntEnum):
    PUT = 1
    REMOVE = 2
    META = 3
    MARK = 4
    PURGE = 5
    KV_PUT = 6
    KV_DEL = 7
    RETIRE = 8


@dataclass(frozen=True, slots=True)
class Meta:
    """Small mutable per-message state, kept in memory and rewritten with META records."""

    delivery_count: int = 0
    put_backs: int = 0
    priority: bool = False
    #: wall-clock (time.time()) second at which the message expires; 0.0 = never
    deadline: float = 0.0


NO_META = Meta()
_NO_META_BYTES = _META.pack(0, 0, 0, 0.0)
_PUT_PREFIX = struct.Struct("<IB")  # length, kind: the start of what the checksum covers
_PUT_FIXED = 12 + META_SIZE  # seq, origin, meta
#: The checksum of a record's summed octets with a seed (``checksum`` without its call)
xxh3_64 = _xxh3 = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class Put:
    queue: QueueKey
    seq: int
    origin: int
    meta: Meta
    blob: bytes


@dataclass(frozen=True, slots=True)
class Remove:
    queue: QueueKey
    seq: int
    origin: int


@dataclass(frozen=True, slots=True)
class MetaUpdate:
    queue: QueueKey
    seq: int
    meta: Meta


@dataclass(frozen=True, slots=True)
class Mark:
    queue: QueueKey
    next_seq: int


@dataclass(frozen=True, slots=True)
class Purge:
    queue: QueueKey
    below: int
    origin: int


@dataclass(frozen=True, slots=True)
class KvPut:
    name: str
    value: bytes
    origin: int


@dataclass(frozen=True, slots=True)
class KvDel:
    name: str
    origin: int


@dataclass(frozen=True, slots=True)
class Retire:
    segment: int


Record = Put | Remove | MetaUpdate | Mark | Purge | KvPut | KvDel | Retire


class BadRecord(ValueError):
    """Bytes that are not a valid record (internal: recovery turns it into a log line)."""


def checksum(data: bytes | memoryview, seed: int) -> int:
    return int(xxhash.xxh3_64_intdigest(data, seed))


def frame(kind: RecordKind, body: bytes, seed: int) -> bytes:
    """A whole record: header and body."""
    summed = _U32.pack(len(body)) + bytes((kind,)) + body
    return MAGIC + _U64.pack(checksum(summed, seed)) + summed


def encode_key(queue: QueueKey) -> bytes:
    channel = queue[0].encode()
    if len(channel) > _MAX_CHANNEL:
        raise ValueError("channel name longer than 65535 octets")
    return _KEY.pack(len(channel)) + channel + _U32.pack(queue[1])


def encode_meta(meta: Meta) -> bytes:
    return _META.pack(meta.delivery_count, meta.put_backs, int(meta.priority), meta.deadline)


def encode(record: Record, seed: int) -> bytes:
    """Encode any record (the hot path, PUT, has its own: ``encode_put``)."""
    match record:
        case Put(queue, seq, origin, meta, blob):
            return encode_put(encode_key(queue), seq, origin, meta, blob, seed)
        case Remove(queue, seq, origin):
            body = encode_key(queue) + _U64_U32.pack(seq, origin)
            return frame(RecordKind.REMOVE, body, seed)
        case MetaUpdate(queue, seq, meta):
            body = encode_key(queue) + _U64.pack(seq) + encode_meta(meta)
            return frame(RecordKind.META, body, seed)
        case Mark(queue, next_seq):
            return frame(RecordKind.MARK, encode_key(queue) + _U64.pack(next_seq), seed)
        case Purge(queue, below, origin):
            body = encode_key(queue) + _U64_U32.pack(below, origin)
            return frame(RecordKind.PURGE, body, seed)
        case KvPut(name, value, origin):
            raw = name.encode()
            body = _U32.pack(origin) + _KEY.pack(len(raw)) + raw + value
            return frame(RecordKind.KV_PUT, body, seed)
        case KvDel(name, origin):
            raw = name.encode()
            return frame(RecordKind.KV_DEL, _U32.pack(origin) + _KEY.pack(len(raw)) + raw, seed)
        case Retire(segment):
            return frame(RecordKind.RETIRE, _U32.pack(segment), seed)
    raise TypeError(f"not a record: {record!r}")


def encode_put(key: bytes, seq: int, origin: int, meta: Meta, blob: bytes, seed: int) -> bytes:
    packed = _NO_META_BYTES if meta is NO_META else encode_meta(meta)
    return encode_put_packed(key, seq, origin, packed, blob, seed)


def encode_put_packed(
    key: bytes, seq: int, origin: int, packed: bytes, blob: bytes, seed: int
) -> bytes:
    """:func:`encode_put` with the meta already packed (``encode_meta``): the append hot
    path (two joins, no concatenations: each one would copy the record again)."""
    summed = b"".join(
        (_PUT_PREFIX.pack(len(blob) + len(key) + _PUT_FIXED, RecordKind.PUT), key,
         _U64_U32.pack(seq, origin), packed, blob)
    )  # fmt: skip
    return b"".join((MAGIC, _U64.pack(_xxh3(summed, seed)), summed))


#: A record's first 12 octets, magic and checksum, in one ``pack`` (``put_summed``).
MAGIC_SUM = struct.Struct("<4sQ")


def put_summed(key: bytes) -> struct.Struct:
    """For ``key``: the packer of everything a PUT's checksum covers before its blob
    (body length, kind, key, seq, origin, packed meta) in one ``pack``.  A group of
    appends (``LogStore.append_many``) encodes each record as two parts with it:
    ``summed = packer.pack(...) + blob`` and ``MAGIC_SUM.pack(MAGIC, xxh3(summed))``,
    the octets :func:`encode_put_packed` makes, with three calls instead of nine."""
    return struct.Struct(f"<IB{len(key)}sQI{META_SIZE}s")


def encode_remove(key: bytes, seq: int, origin: int, seed: int) -> bytes:
    """A REMOVE record from an encoded key (``encode_key``): the acknowledge hot path."""
    summed = b"".join((_PUT_PREFIX.pack(len(key) + 12, RecordKind.REMOVE), key,
                       _U64_U32.pack(seq, origin)))  # fmt: skip
    return b"".join((MAGIC, _U64.pack(_xxh3(summed, seed)), summed))


def encode_meta_update(key: bytes, seq: int, packed: bytes, seed: int) -> bytes:
    """A META record from an encoded key and packed meta: each delivery of a saved
    message writes one (its delivery count)."""
    summed = b"".join((_PUT_PREFIX.pack(len(key) + 8 + META_SIZE, RecordKind.META), key,
                       _U64.pack(seq), packed))  # fmt: skip
    return b"".join((MAGIC, _U64.pack(_xxh3(summed, seed)), summed))


def put_overhead(key: bytes) -> int:
    """Octets a PUT adds around its blob."""
    return HEADER_SIZE + len(key) + _U64_U32.size + META_SIZE


def check(buf: bytes | memoryview, offset: int, seed: int, max_size: int) -> tuple[int, int]:
    """Validate the record at ``offset``: its (kind, total size), or BadRecord.

    Also a record that does not fit in ``buf`` (a torn tail) is a BadRecord.
    """
    end = len(buf)
    if end - offset < HEADER_SIZE:
        raise BadRecord("truncated header")
    magic, summed, length, kind = _HEAD.unpack_from(buf, offset)
    if magic != MAGIC:
        raise BadRecord("no record magic")
    size = HEADER_SIZE + length
    if size > max_size:
        raise BadRecord(f"length {length} beyond the record limit")
    if offset + size > end:
        raise BadRecord("truncated record")
    if checksum(buf[offset + _SUMMED_FROM : offset + size], seed) != summed:
        raise BadRecord("checksum mismatch")
    try:
        RecordKind(kind)
    except ValueError:
        raise BadRecord(f"unknown record kind {kind}") from None
    return kind, size


def checked_put_blob(buf: bytes | memoryview, offset: int, seed: int, max_size: int) -> bytes:
    """The blob of the PUT record at ``offset``, with every check of :func:`check` (magic,
    length, fits in ``buf``, checksum) and its kind PUT; BadRecord otherwise.  One call
    per record a restart reads (``LogStore.read_live``): the checks inlined."""
    end = len(buf)
    if end - offset < HEADER_SIZE:
        raise BadRecord("truncated header")
    magic, summed, length, kind = _HEAD.unpack_from(buf, offset)
    if magic != MAGIC:
        raise BadRecord("no record magic")
    size = HEADER_SIZE + length
    if size > max_size:
        raise BadRecord(f"length {length} beyond the record limit")
    if offset + size > end:
        raise BadRecord("truncated record")
    if xxhash.xxh3_64_intdigest(buf[offset + _SUMMED_FROM : offset + size], seed) != summed:
        raise BadRecord("checksum mismatch")
    if kind != RecordKind.PUT:
        raise BadRecord(f"record kind {kind} where a PUT was indexed")
    at = offset + HEADER_SIZE
    (n,) = _KEY.unpack_from(buf, at)
    start = at + 6 + n + _PUT_TAIL
    if start > offset + size:
        raise BadRecord("short PUT body")
    return bytes(buf[start : offset + size])


def decode_body(kind: int, body: bytes | memoryview) -> Record:
    """Decode a checked body; BadRecord if its insides do not add up."""
    try:
        return _decode_body(RecordKind(kind), body)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise BadRecord(f"malformed {kind} body: {exc}") from None


def decode_key(body: bytes | memoryview) -> tuple[QueueKey, int]:
    (n,) = _KEY.unpack_from(body, 0)
    channel = bytes(body[2 : 2 + n]).decode()
    if len(body) < 6 + n:
        raise ValueError("short queue key")
    (queue_id,) = _U32.unpack_from(body, 2 + n)
    return (channel, queue_id), 6 + n


def decode_meta(body: bytes | memoryview, at: int) -> Meta:
    count, put_backs, flags, deadline = _META.unpack_from(body, at)
    return Meta(count, put_backs, bool(flags & 1), deadline)


def _decode_body(kind: RecordKind, body: bytes | memoryview) -> Record:
    if kind is RecordKind.RETIRE:
        if len(body) != 4:
            raise ValueError("retire body is not 4 octets")
        return Retire(_U32.unpack_from(body, 0)[0])
    if kind in (RecordKind.KV_PUT, RecordKind.KV_DEL):
        (origin,) = _U32.unpack_from(body, 0)
        (n,) = _KEY.unpack_from(body, 4)
        if len(body) < 6 + n:
            raise ValueError("short name")
        name = bytes(body[6 : 6 + n]).decode()
        if kind is RecordKind.KV_DEL:
            if len(body) != 6 + n:
                raise ValueError("trailing octets after a name")
            return KvDel(name, origin)
        return KvPut(name, bytes(body[6 + n :]), origin)
    queue, at = decode_key(body)
    if kind is RecordKind.PUT:
        seq, origin = _U64_U32.unpack_from(body, at)
        meta = decode_meta(body, at + _U64_U32.size)
        return Put(queue, seq, origin, meta, bytes(body[at + _U64_U32.size + META_SIZE :]))
    if kind is RecordKind.META:
        (seq,) = _U64.unpack_from(body, at)
        _exact(body, at + 8 + META_SIZE)
        return MetaUpdate(queue, seq, decode_meta(body, at + 8))
    if kind is RecordKind.MARK:
        _exact(body, at + 8)
        return Mark(queue, _U64.unpack_from(body, at)[0])
    seq, origin = _U64_U32.unpack_from(body, at)
    _exact(body, at + _U64_U32.size)
    return Remove(queue, seq, origin) if kind is RecordKind.REMOVE else Purge(queue, seq, origin)


def _exact(body: bytes | memoryview, size: int) -> None:
    if len(body) != size:
        raise ValueError(f"body of {len(body)} octets, expected {size}")


def blob_of_put(record: bytes | memoryview) -> bytes:
    """The blob of a whole encoded PUT record (already checked)."""
    at = HEADER_SIZE
    (n,) = _KEY.unpack_from(record, at)
    return bytes(record[at + 6 + n + _U64_U32.size + META_SIZE :])
