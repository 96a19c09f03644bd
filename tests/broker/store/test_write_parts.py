"""The writer hands records to the kernel in their own parts (``pwritev``), made durable
in the same call in ``fsync`` mode (``RWF_DSYNC``): what a restart reads back, a short
write, more parts than one call takes, a kernel without the flag, and no completion
before the write is durable."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.store.log import Durability, LogOptions, LogStore
from broker.store.log import store as store_module
from broker.store.log.records import NO_META

from .kit import contents

Q = ("orders", 1)
WAIT = 10.0
_REAL_PWRITEV = os.pwritev


def _blob(k: int, size: int) -> bytes:
    return (f"{k:08d}".encode() * (size // 8 + 1))[:size]


def _writer() -> bool:
    return threading.current_thread().name == "store-writer"


def test_large_and_small_records_come_back_after_a_restart(tmp_path: Path) -> None:
    """4 KiB records (written from their parts), 100 B ones (joined first), single
    appends between groups, and one group of more parts than one ``pwritev`` takes."""
    expected: dict[int, bytes] = {}
    with LogStore(tmp_path) as store:
        k = 0
        for size, count in ((4096, 64), (100, 64), (4096, 1), (2048, 700), (100, 1)):
            items = [(_blob(k + j, size), NO_META, 0) for j in range(count)]
            seqs, _ = store.append_many(Q, items)
            expected.update(zip(seqs, (blob for blob, _, _ in items), strict=True))
            k += count
            single = store.append(Q, _blob(k, 300))
            expected[single.seq] = _blob(k, 300)
            k += 1
        assert store.wait(single.ticket, WAIT)
    with LogStore(tmp_path) as store:
        assert contents(store) == {Q: expected}
        assert store.stats().damage == ()


@pytest.fixture
def short_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The writer's ``pwritev`` takes at most 1,000 octets per call (what a signal or a
    nearly full disk can make it do); the octets each call took."""
    taken: list[int] = []

    def pwritev(fd: int, parts: list[Any], at: int, flags: int = 0) -> int:
        data = b"".join(bytes(p) for p in parts)[:1000]
        n = _REAL_PWRITEV(fd, [data], at, flags)
        taken.append(n)
        return n

    monkeypatch.setattr(store_module.os, "pwritev", pwritev)
    yield taken


def test_a_short_write_goes_on_where_it_stopped(tmp_path: Path, short_writes: list[int]) -> None:
    items = [(_blob(k, 4096), NO_META, 0) for k in range(10)]
    with LogStore(tmp_path) as store:
        seqs, ticket = store.append_many(Q, items)
        assert store.wait(ticket, WAIT)
    assert len(short_writes) > 40  # (the 41 KiB went 1,000 octets at a time)
    with LogStore(tmp_path) as store:
        assert contents(store) == {Q: {s: b for s, (b, _, _) in zip(seqs, items, strict=True)}}
        assert store.stats().damage == ()


class _Blocked:
    """A system call of the writer held until the test lets it go."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def hold(self) -> None:
        if _writer():
            self.entered.set()
            assert self.go.wait(WAIT)


def test_without_the_flag_completion_waits_for_the_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel or file system that refuses ``RWF_DSYNC``: the writer writes, then
    syncs, and completes nothing before the sync returned."""
    refused: list[int] = []
    sync = _Blocked()
    real_fdatasync = os.fdatasync

    def pwritev(fd: int, parts: list[Any], at: int, flags: int = 0) -> int:
        if flags:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "not supported")
        return _REAL_PWRITEV(fd, parts, at, flags)

    def fdatasync(fd: int) -> None:
        sync.hold()
        real_fdatasync(fd)

    monkeypatch.setattr(store_module.os, "pwritev", pwritev)
    monkeypatch.setattr(store_module.os, "fdatasync", fdatasync)
    with LogStore(tmp_path) as store:
        ticket = store.append(Q, _blob(1, 4096)).ticket
        assert sync.entered.wait(WAIT)
        assert store.completed < ticket  # (the sync is held: nothing may complete)
        sync.go.set()
        assert store.wait(ticket, WAIT)
        later = store.append_many(Q, [(_blob(2, 4096), NO_META, 0)])[1]
        assert store.wait(later, WAIT)
    assert refused  # (the flag was asked once, then no more)
    assert len(refused) == 1
    with LogStore(tmp_path) as store:
        assert contents(store) == {Q: {1: _blob(1, 4096), 2: _blob(2, 4096)}}


def test_completion_waits_for_the_durable_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In ``fsync`` mode a ticket completes only once the call that made it durable
    returned."""
    write = _Blocked()

    def pwritev(fd: int, parts: list[Any], at: int, flags: int = 0) -> int:
        write.hold()
        return _REAL_PWRITEV(fd, parts, at, flags)

    monkeypatch.setattr(store_module.os, "pwritev", pwritev)
    with LogStore(tmp_path, LogOptions(durability=Durability.FSYNC)) as store:
        ticket = store.append_many(Q, [(_blob(k, 4096), NO_META, 0) for k in range(8)])[1]
        assert write.entered.wait(WAIT)
        assert store.completed < ticket
        write.go.set()
        assert store.wait(ticket, WAIT)
        assert store.stats().syncs >= 1  # (the durable write counts as the batch's sync)
