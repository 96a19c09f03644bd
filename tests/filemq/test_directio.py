"""``filemq.directio`` and ``sync --direct-io``: the same bytes at the same offsets, written
around the page cache while the alignment allows, through it after (a file's tail, an
unaligned start), and every transfer rule as before (SHA-1 before the rename; resume
after a kill -9: ``test_resume``'s kill test runs with ``--direct-io`` too)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from filemq.directio import ALIGN, DirectWrites
from filemq.server import FileServer
from filemq.writer import ChunkWriter

from .conftest import read_tree

MiB = 1 << 20
Serve = Callable[..., FileServer]
Sync = Callable[..., Any]


def _open(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)


def _write(path: Path, chunks: list[bytes], start: int = 0) -> DirectWrites:
    fd = _open(path)
    try:
        os.lseek(fd, start, os.SEEK_SET)
        writes = DirectWrites(fd)
        for chunk in chunks:
            writes.write(chunk)
        writes.close()
        return writes
    finally:
        os.close(fd)


def test_aligned_chunks_and_a_tail_are_the_bytes_given(tmp_path: Path) -> None:
    chunks = [os.urandom(MiB), os.urandom(64 * ALIGN), os.urandom(MiB + 123)]
    writes = _write(tmp_path / "f", chunks)
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    assert not writes.direct  # (the tail ended direct writing: through the cache after it)


def test_a_tail_ends_direct_writing_for_what_follows(tmp_path: Path) -> None:
    chunks = [os.urandom(ALIGN + 7), os.urandom(MiB), os.urandom(10)]
    _write(tmp_path / "f", chunks)
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)


def test_an_unaligned_start_is_written_through_the_cache(tmp_path: Path) -> None:
    chunks = [os.urandom(MiB), os.urandom(MiB)]
    writes = _write(tmp_path / "f", chunks, start=100)
    assert not writes.direct
    assert (tmp_path / "f").read_bytes() == bytes(100) + b"".join(chunks)


def test_an_aligned_start_stays_direct_while_the_chunks_are_aligned(tmp_path: Path) -> None:
    fd = _open(tmp_path / "f")
    try:
        os.lseek(fd, 8 * ALIGN, os.SEEK_SET)
        writes = DirectWrites(fd)
        if not writes.direct:
            pytest.skip("this file system refuses O_DIRECT")
        chunk = os.urandom(2 * MiB)
        writes.write(chunk)
        writes.write(memoryview(chunk)[:ALIGN])  # (any bytes-like)
        assert writes.direct
        writes.close()
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == bytes(8 * ALIGN) + chunk + chunk[:ALIGN]


def test_chunk_writer_direct_hashes_what_it_writes(tmp_path: Path) -> None:
    chunks = [os.urandom(MiB) for _ in range(9)] + [os.urandom(5000)]
    fd = _open(tmp_path / "f")
    hasher = hashlib.sha1()
    writer = ChunkWriter(fd, hasher, direct=True)
    try:
        for chunk in chunks:
            writer.write(chunk)
        writer.settle()
        writer.close()
    finally:
        os.close(fd)
    data = b"".join(chunks)
    assert (tmp_path / "f").read_bytes() == data
    assert writer.size == len(data)
    assert hasher.hexdigest() == hashlib.sha1(data).hexdigest()


@pytest.mark.parametrize("chunk_size", [MiB, 100_000])  # (100,000: no chunk aligned)
def test_sync_direct_io_mirrors_big_files_exactly(
    tmp_path: Path, serve: Serve, sync_once: Sync, chunk_size: int
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    files = {"big.bin": os.urandom(20 * MiB + 123), "even.bin": os.urandom(16 * MiB)}
    files["small.txt"] = b"small"
    for name, data in files.items():
        (src / name).write_bytes(data)
    server = serve(src, chunk_size=chunk_size)
    dest = tmp_path / "dest"
    result = sync_once(server.endpoint, dest, direct_io=True)
    assert result.synced and result.errors == 0
    assert read_tree(dest) == files
