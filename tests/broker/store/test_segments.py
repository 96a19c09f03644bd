"""Segment files: header, lock, and the scan that skips damage and finds what follows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.store.log import records, segments
from broker.store.log.errors import StoreLocked

SEED = 77


def _records(n: int) -> list[bytes]:
    return [
        records.encode(records.Put(("q", 1), i, 1, records.NO_META, b"m%03d" % i), SEED)
        for i in range(1, n + 1)
    ]


def test_header_round_trip_and_damage() -> None:
    header = segments.encode_header(12, SEED)
    assert segments.decode_header(header) == (12, SEED)
    for i in range(len(header)):
        damaged = bytearray(header)
        damaged[i] ^= 0x10
        assert segments.decode_header(bytes(damaged)) is None
    assert segments.decode_header(header[:-1]) is None


def test_create_list_delete(tmp_path: Path) -> None:
    for segment in (3, 1, 2):
        os.close(segments.create_segment(tmp_path, segment, SEED))
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "0000000009.seg.tmp").write_text("x")
    assert segments.list_segments(tmp_path) == [1, 2, 3]
    with pytest.raises(FileExistsError):
        segments.create_segment(tmp_path, 2, SEED)
    segments.delete_segment(tmp_path, 2)
    segments.delete_segment(tmp_path, 2)  # already gone: no error
    assert segments.list_segments(tmp_path) == [1, 3]


def test_directory_lock_is_exclusive(tmp_path: Path) -> None:
    fd = segments.lock_directory(tmp_path)
    try:
        with pytest.raises(StoreLocked):
            segments.lock_directory(tmp_path)
    finally:
        os.close(fd)
    os.close(segments.lock_directory(tmp_path))


def test_scan_skips_damage_and_finds_every_intact_record() -> None:
    recs = _records(5)
    damaged = bytearray(recs[2])
    damaged[-1] ^= 0xFF
    buf = b"H" * 8 + b"".join([recs[0], recs[1], bytes(damaged), recs[3], recs[4]]) + b"junk"
    found = list(segments.scan(buf, SEED, 1 << 20, 8))
    kinds = [type(f).__name__ for f in found]
    assert kinds == ["Found", "Found", "Damage", "Found", "Found", "Damage"]
    damage = found[2]
    assert isinstance(damage, segments.Damage)
    assert damage.offset == 8 + len(recs[0]) + len(recs[1])
    assert damage.length == len(recs[2])
    assert "checksum" in damage.reason
    tail = found[-1]
    assert isinstance(tail, segments.Damage) and tail.length == 4


def test_a_record_hidden_in_a_blob_is_not_taken_after_damage() -> None:
    # the adversary's payload carries a whole record; it cannot know the store's seed
    forged = records.encode(records.Remove(("q", 1), 1, 1), seed=0)
    carrier = records.encode(records.Put(("q", 1), 9, 1, records.NO_META, forged), SEED)
    damaged = bytearray(carrier)
    damaged[records.HEADER_SIZE] ^= 1  # its length field: the carrier no longer checks
    found = list(segments.scan(bytes(damaged), SEED, 1 << 20, 0))
    assert [type(f).__name__ for f in found] == ["Damage"]


def test_links_in_the_directory_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    store = tmp_path / "store"
    store.mkdir()
    (store / segments.segment_name(1)).symlink_to(outside)
    (store / segments.LOCK_NAME).symlink_to(outside)
    assert segments.list_segments(store) == []
    with pytest.raises(OSError):
        segments.open_segment(store, 1)
    with pytest.raises(OSError):
        segments.lock_directory(store)
    with pytest.raises(FileExistsError):
        segments.create_segment(store, 1, SEED)
    assert outside.read_bytes() == b"secret"
