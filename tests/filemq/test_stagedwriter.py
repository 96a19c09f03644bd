"""``StagedWriter`` (``filemq.stagedwriter``): each chunk hashed while it is in the cache
(direct: where it was staged, written by a second worker; through the page cache: right
after its write, on the same worker), and the rules of ``ChunkWriter``, in both modes:

* the file holds the bytes given, in order, and the SHA-1 is of exactly them: aligned
  chunks, a tail (through the page cache, and all after it), an unaligned start (a
  resume mid-block), chunk sizes that are never aligned;
* every checkpoint (size, SHA-1 so far) is taken after its bytes were written and
  names the SHA-1 of exactly the file's first ``size`` bytes;
* a write that fails half-way (a file size limit, as a full disk) surfaces, nothing
  after it is written, and no checkpoint claims a byte beyond what was written (the
  last one is the last chunk written: the partial file resumes from there).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from filemq.stagedwriter import StagedWriter

MiB = 1 << 20


class _Journal:
    """Checkpoints as ``filemq.partial.Journal`` gets them: (size, digest so far)."""

    def __init__(self) -> None:
        self.points: list[tuple[int, str]] = []

    def checkpoint(self, size: int, hasher: Any) -> None:
        self.points.append((size, hasher.hexdigest()))


def _run(
    path: Path, chunks: list[bytes], direct: bool, start: bytes = b""
) -> tuple[StagedWriter, _Journal]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    journal = _Journal()
    try:
        os.write(fd, start)
        hasher = hashlib.sha1(start)
        writer = StagedWriter(fd, hasher, size=len(start), journal=journal, direct=direct)
        try:
            for chunk in chunks:
                writer.write(chunk)
            writer.settle()
        finally:
            writer.close()
    finally:
        os.close(fd)
    return writer, journal


def _check(path: Path, writer: StagedWriter, journal: _Journal, ends: list[int]) -> None:
    data = path.read_bytes()
    assert writer.size == len(data)
    assert writer.hasher.hexdigest() == hashlib.sha1(data).hexdigest()
    assert [size for size, _ in journal.points] == ends
    for size, digest in journal.points:
        assert digest == hashlib.sha1(data[:size]).hexdigest()


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize(
    "sizes",
    [
        [MiB] * 5 + [5000],  # aligned, then a tail
        [MiB, 5000, MiB, 3 * 4096],  # a tail mid-file: the rest through the page cache
        [100_000] * 12,  # never aligned
        [4096, 1, 0, 2 * MiB, 8192],
    ],
)
def test_the_file_and_every_checkpoint_are_the_bytes_given(
    tmp_path: Path, sizes: list[int], direct: bool
) -> None:
    chunks = [os.urandom(n) for n in sizes]
    writer, journal = _run(tmp_path / "f", chunks, direct)
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    ends = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    _check(tmp_path / "f", writer, journal, ends)


@pytest.mark.parametrize("direct", [True, False])
def test_an_unaligned_start_is_written_and_hashed_exactly(tmp_path: Path, direct: bool) -> None:
    start = os.urandom(12_345)  # (a resume mid-block: the hasher holds these already)
    chunks = [os.urandom(MiB) for _ in range(3)]
    writer, journal = _run(tmp_path / "f", chunks, direct, start)
    assert (tmp_path / "f").read_bytes() == start + b"".join(chunks)
    _check(tmp_path / "f", writer, journal, [len(start) + (i + 1) * MiB for i in range(3)])


_LIMITED = """
import hashlib, json, os, sys
from filemq.stagedwriter import StagedWriter
points = []
class Journal:
    def checkpoint(self, size, hasher):
        points.append((size, hasher.hexdigest()))
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
writer = StagedWriter(fd, hashlib.sha1(), journal=Journal(), direct=sys.argv[2] == "1")
chunks = [bytes([i]) * (1 << 20) for i in range(8)]
error = ""
try:
    for chunk in chunks:
        writer.write(chunk)
    writer.settle()
except OSError as exc:
    error = type(exc).__name__ + str(exc.errno)
try:
    writer.write(b"x")
except OSError:
    stays = True
else:
    stays = False
writer.discard()
print(json.dumps({"error": error, "stays": stays, "size": writer.size, "points": points}))
"""


@pytest.mark.parametrize("direct", [True, False])
def test_a_failed_write_keeps_checkpoints_within_what_was_written(
    tmp_path: Path, direct: bool
) -> None:
    limit = 3 * MiB  # (the 4th chunk's write fails: EFBIG, as a full disk's ENOSPC)

    def limited() -> None:  # (in the child, before exec)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    path = tmp_path / "f"
    out = subprocess.run(
        [sys.executable, "-c", _LIMITED, str(path), "1" if direct else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limited,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    got = json.loads(out)
    data = path.read_bytes()
    assert got["error"].startswith("OSError") and got["stays"]
    assert data == b"".join(bytes([i]) * MiB for i in range(3))
    assert got["size"] == len(data)
    assert got["points"][-1] == [len(data), hashlib.sha1(data).hexdigest()]
    for size, digest in got["points"]:  # never a byte beyond what was written
        assert size <= len(data) and digest == hashlib.sha1(data[:size]).hexdigest()
