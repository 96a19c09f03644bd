"""``ChunkWriter`` writes and hashes on two workers (``filemq.writer``).

* a hasher that is slow does not hold the writes (they overlap): the file grows while
  the hasher waits, and the digest is still of exactly what was written;
* a write that fails while the hasher lags behind: every chunk written before the
  failure is still hashed and checkpointed (the partial file resumes from its last
  written byte, not from where the hasher happened to be), and no checkpoint ever
  claims a byte that was not written.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from filemq.writer import ChunkWriter
from tests.polling import wait_until

KiB = 1 << 10


class _HeldHasher:
    """SHA-1 that waits for ``go`` before hashing anything (a hashing worker held back)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.sha1 = hashlib.sha1()

    def update(self, data: Any) -> None:
        assert self.go.wait(60), "never released"
        self.sha1.update(data)

    def hexdigest(self) -> str:
        return self.sha1.hexdigest()

    def copy(self) -> Any:
        return self.sha1.copy()


class _Journal:
    """Checkpoints as ``filemq.partial.Journal`` gets them: (size, digest so far)."""

    def __init__(self) -> None:
        self.points: list[tuple[int, str]] = []

    def checkpoint(self, size: int, hasher: Any) -> None:
        self.points.append((size, hasher.hexdigest()))


def test_a_held_hasher_does_not_hold_the_writes(tmp_path: Path) -> None:
    chunks = [os.urandom(100 * KiB) for _ in range(5)]
    hasher = _HeldHasher()
    path = tmp_path / "f"
    with open(path, "wb") as f:
        writer = ChunkWriter(f.fileno(), hasher, max_pending=1 << 20)
        try:
            for chunk in chunks:
                writer.write(chunk)
            assert wait_until(lambda: path.stat().st_size == 500 * KiB, timeout=30)
            assert writer.size == 0  # (written, not hashed: not counted yet)
            hasher.go.set()
            writer.settle()
        finally:
            hasher.go.set()
            writer.close()
    whole = b"".join(chunks)
    assert path.read_bytes() == whole and writer.size == len(whole)
    assert hasher.hexdigest() == hashlib.sha1(whole).hexdigest()


def test_a_failed_write_still_checkpoints_every_byte_written_before_it() -> None:
    chunks = [os.urandom(100 * KiB) for _ in range(5)]
    read_end, write_end = os.pipe()
    got = bytearray()

    def disk() -> None:  # takes two chunks, then refuses (EPIPE), as a full disk would
        while len(got) < 200 * KiB:
            got.extend(os.read(read_end, 200 * KiB - len(got)))
        os.close(read_end)

    reader = threading.Thread(target=disk)
    reader.start()
    hasher, journal = _HeldHasher(), _Journal()
    writer = ChunkWriter(write_end, hasher, journal=journal, max_pending=1 << 20)
    try:
        for chunk in chunks:
            writer.write(chunk)
        with pytest.raises(OSError):
            writer.settle()  # (the third write failed; the hasher has hashed nothing yet)
        reader.join(30)
        hasher.go.set()
        writer.discard()  # (what the mirror does with a failed file)
    finally:
        hasher.go.set()
        writer.discard()
        reader.join(30)
        os.close(write_end)
    assert bytes(got) == chunks[0] + chunks[1]
    assert journal.points[-1] == (200 * KiB, hashlib.sha1(bytes(got)).hexdigest())
    for size, digest in journal.points:  # never a byte beyond what was written
        assert size <= len(got) and digest == hashlib.sha1(bytes(got[:size])).hexdigest()
