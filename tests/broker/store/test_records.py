"""Record format: hand-built bytes, round trips, and every flipped bit caught."""

from __future__ import annotations

import struct

import pytest
import xxhash

from broker.store.log import records
from broker.store.log.records import Meta, RecordKind

SEED = 0x1234_5678_9ABC_DEF0


def test_put_matches_bytes_built_by_hand() -> None:
    body = (
        struct.pack("<H", 6)
        + b"orders"
        + struct.pack("<I", 7)  # queue id
        + struct.pack("<Q", 42)  # seq
        + struct.pack("<I", 3)  # origin segment
        + struct.pack("<IIBd", 2, 1, 1, 1700000000.5)  # meta
        + b"payload"
    )
    summed = struct.pack("<I", len(body)) + bytes([1]) + body
    expected = b"ZHr1" + struct.pack("<Q", xxhash.xxh3_64_intdigest(summed, SEED)) + summed
    record = records.Put(("orders", 7), 42, 3, Meta(2, 1, True, 1700000000.5), b"payload")
    assert records.encode(record, SEED) == expected
    assert records.check(expected, 0, SEED, 1 << 20) == (RecordKind.PUT, len(expected))
    assert records.blob_of_put(expected) == b"payload"


@pytest.mark.parametrize(
    "record",
    [
        records.Put(("ch", 1), 1, 1, records.NO_META, b""),
        records.Put(("caf\u00e9", 2**32 - 1), 2**63, 9, Meta(5, 6, False, 0.25), b"\x00" * 99),
        records.Remove(("ch", 1), 17, 2),
        records.MetaUpdate(("ch", 1), 17, Meta(3, 0, True, 12.0)),
        records.Mark(("ch", 1), 100),
        records.Purge(("ch", 3), 55, 4),
        records.KvPut("queue/ch/1", b'{"Status": "Push"}', 6),
        records.KvPut("", b"", 1),
        records.KvDel("queue/ch/1", 6),
        records.Retire(12),
    ],
)
def test_round_trip(record: records.Record) -> None:
    data = records.encode(record, SEED)
    kind, size = records.check(data, 0, SEED, 1 << 20)
    assert size == len(data)
    assert records.decode_body(kind, data[records.HEADER_SIZE :]) == record


def test_every_flipped_bit_is_caught() -> None:
    data = records.encode(records.Put(("q", 1), 5, 1, Meta(1, 2, True, 3.0), b"abc"), SEED)
    for i in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[i] ^= 1 << bit
            with pytest.raises(records.BadRecord):
                records.check(bytes(damaged), 0, SEED, 1 << 20)


def test_another_seed_does_not_validate() -> None:
    data = records.encode(records.Remove(("q", 1), 5, 1), SEED)
    with pytest.raises(records.BadRecord, match="checksum"):
        records.check(data, 0, SEED + 1, 1 << 20)


def test_truncated_and_oversized_records_are_bad() -> None:
    data = records.encode(records.KvPut("n", b"v" * 100, 1), SEED)
    for cut in range(len(data)):
        with pytest.raises(records.BadRecord):
            records.check(data[:cut], 0, SEED, 1 << 20)
    with pytest.raises(records.BadRecord, match="limit"):
        records.check(data, 0, SEED, 64)


def test_malformed_body_with_a_valid_checksum_is_bad() -> None:
    # a MARK whose body is too short: the checksum is right, the insides are not
    body = records.encode_key(("q", 1)) + b"\x01\x02"
    data = records.frame(RecordKind.MARK, body, SEED)
    kind, _ = records.check(data, 0, SEED, 1 << 20)
    with pytest.raises(records.BadRecord):
        records.decode_body(kind, data[records.HEADER_SIZE :])
    # an unknown kind with a valid checksum
    forged = records.frame(RecordKind.MARK, body, SEED)
    summed = forged[12:16] + bytes([99]) + forged[17:]
    forged = b"ZHr1" + struct.pack("<Q", xxhash.xxh3_64_intdigest(summed, SEED)) + summed
    with pytest.raises(records.BadRecord, match="unknown record kind"):
        records.check(forged, 0, SEED, 1 << 20)


@pytest.mark.parametrize("meta", [records.NO_META, Meta(2, 1, True, 1700000000.5)])
def test_hot_path_encoders_write_what_decode_reads(meta: Meta) -> None:
    """The append/acknowledge/delivery encoders (an encoded key, packed meta) give the
    records the general decoder reads back field for field."""
    key = records.encode_key(("orders", 7))
    packed = records.encode_meta(meta)
    cases = [
        (records.encode_put_packed(key, 42, 3, packed, b"payload", SEED),
         records.Put(("orders", 7), 42, 3, meta, b"payload")),
        (records.encode_remove(key, 42, 3, SEED), records.Remove(("orders", 7), 42, 3)),
        (records.encode_meta_update(key, 42, packed, SEED),
         records.MetaUpdate(("orders", 7), 42, meta)),
    ]  # fmt: skip
    for data, record in cases:
        kind, size = records.check(data, 0, SEED, 1 << 20)
        assert size == len(data)
        assert records.decode_body(kind, data[records.HEADER_SIZE :]) == record
        if not isinstance(record, records.Put):
            assert data == records.frame(RecordKind(kind), data[records.HEADER_SIZE :], SEED)
