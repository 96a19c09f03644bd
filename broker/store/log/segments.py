"""Segment files: names, headers, creation, the directory lock, and the record scan.

A store directory holds ``LOCK`` (an flock held while a store has it open) and segment
files ``NNNNNNNNNN.seg`` (ids grow by one, are never reused).  A segment starts with a
header (magic, its id, the store's checksum seed, a checksum of those) followed by
records (``records.py``).  Only the newest segment (the head) is appended to; a store
always starts a fresh head when it opens, so bytes of a torn tail are never written after.

``scan`` walks the records of a segment's bytes.  A record that fails its checks is
skipped: the scan reports the offset and the reason and looks for the next record magic
from the following octet on, so every intact record after a damaged one is still found.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from broker.store.log import records
from broker.store.log.errors import StoreLocked

SEGMENT_MAGIC = b"ZHLOGv1\n"
_HEADER = struct.Struct("<8sIQQ")  # magic, segment id, seed, checksum of the three
SEGMENT_HEADER_SIZE = _HEADER.size
_NAME = re.compile(r"^(\d{10})\.seg$")
LOCK_NAME = "LOCK"


def segment_name(segment: int) -> str:
    return f"{segment:010d}.seg"


def encode_header(segment: int, seed: int) -> bytes:
    body = struct.pack("<8sIQ", SEGMENT_MAGIC, segment, seed)
    return body + struct.pack("<Q", records.checksum(body, 0))


def decode_header(data: bytes) -> tuple[int, int] | None:
    """(segment id, seed) of a valid header, or None."""
    if len(data) < SEGMENT_HEADER_SIZE:
        return None
    magic, segment, seed, summed = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC or records.checksum(data[:20], 0) != summed:
        return None
    return segment, seed


def list_segments(directory: Path) -> list[int]:
    """Ids of the segment files in ``directory``, oldest first."""
    found = []
    for entry in os.scandir(directory):
        match = _NAME.match(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            found.append(int(match.group(1)))
    return sorted(found)


def highest_id(directory: Path) -> int:
    """The highest id any entry is named with (files or not): new segments go above it."""
    ids = [int(m.group(1)) for e in os.scandir(directory) if (m := _NAME.match(e.name))]
    return max(ids, default=0)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_segment(directory: Path, segment: int, seed: int) -> int:
    """Create and fsync a new segment (and its directory entry); its fd, positioned after
    the header for sequential ``write`` (not O_APPEND: the store writes zeros ahead of
    its data with ``pwrite``, see ``LogOptions.preallocate``)."""
    path = directory / segment_name(segment)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, encode_header(segment, seed))
        os.fsync(fd)
        fsync_dir(directory)
    except BaseException:
        os.close(fd)
        raise
    return fd


def cut_zero_tail(directory: Path, segment: int, size: int) -> None:
    """Truncate a segment to ``size`` octets (the zeros written ahead of its data)."""
    fd = os.open(directory / segment_name(segment), os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def delete_segment(directory: Path, segment: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory / segment_name(segment))
    fsync_dir(directory)


def open_segment(directory: Path, segment: int) -> int:
    """A read-only fd of a segment file (never through a symbolic link)."""
    path = directory / segment_name(segment)
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def read_segment(directory: Path, segment: int) -> bytes:
    with open(open_segment(directory, segment), "rb") as f:
        return f.read()


def lock_directory(directory: Path) -> int:
    """Take the directory's flock; StoreLocked if another process holds it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(directory / LOCK_NAME, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(f"{directory} is in use by another store") from None
    return fd


@dataclass(frozen=True, slots=True)
class Damage:
    """Octets of a segment that held no valid record."""

    offset: int
    length: int
    reason: str


class Found(NamedTuple):
    """A valid record: where it starts, its kind, its whole size (a tuple: the scan makes
    one per record, recovery makes millions)."""

    offset: int
    kind: int
    size: int


def scan(buf: bytes, seed: int, max_size: int, start: int) -> Iterator[Found | Damage]:
    """Records of a segment's bytes from ``start``, with Damage for every skipped span."""
    offset = start
    end = len(buf)
    while offset < end:
        try:
            kind, size = records.check(buf, offset, seed, max_size)
        except records.BadRecord as exc:
            following = _next_valid(buf, offset + 1, seed, max_size)
            yield Damage(offset, following - offset, str(exc))
            offset = following
            continue
        yield Found(offset, kind, size)
        offset += size


def _next_valid(buf: bytes, offset: int, seed: int, max_size: int) -> int:
    """Offset of the next record that checks out (or the end of ``buf``)."""
    while True:
        offset = buf.find(records.MAGIC, offset)
        if offset < 0:
            return len(buf)
        try:
            records.check(buf, offset, seed, max_size)
        except records.BadRecord:
            offset += 1
            continue
        return offset
