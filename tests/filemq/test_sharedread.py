"""Small files read once for every client (``filemq.sharedread``): bounded, never stale."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq.server import FileServer
from filemq.sharedread import DEFAULT_MAX_FILE, SharedReads
from filemq.subscriber import Subscriber
from tests.polling import wait_until

from .test_live import files

WAIT = 20.0


def _version(name: str, data: bytes, mtime: int = 1, sha1: str = "a" * 40) -> Any:
    return (name, len(data), mtime, 7, sha1)


def test_kept_by_version_bounded_in_bytes_emptied_per_round() -> None:
    shared = SharedReads(max_bytes=10)
    a, b = _version("/a", b"aaaa"), _version("/b", b"bbbbbb")
    shared.put(a, b"aaaa")
    shared.put(b, b"bbbbbb")
    assert shared.get(a) == b"aaaa" and shared.get(b) == b"bbbbbb"
    assert shared.get(_version("/a", b"aaaa", mtime=2)) is None  # another version
    assert shared.get(_version("/a", b"aaaa", sha1="b" * 40)) is None  # another content
    shared.put(_version("/c", b"c"), b"c")  # 11 bytes: the least recently used goes
    assert shared.get(a) is None and len(shared) == 2
    shared.put(_version("/d", b"dd"), b"d")  # a short read is not the version
    assert shared.get(_version("/d", b"dd")) is None
    big = b"x" * (DEFAULT_MAX_FILE + 1)
    shared.put(_version("/big", big), big)
    assert shared.get(_version("/big", big)) is None
    shared.clear()  # a new round: nothing is kept
    assert shared.get(b) is None and len(shared) == 0
    assert shared.hits == 2


def test_every_mirror_gets_each_version_even_same_size_and_mtime(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """Versions that differ only in content (same size, mtime and inode): the shared copy
    of the first is never sent as the second (the SHA-1 is part of the version)."""
    src = tmp_path / "src"
    src.mkdir()
    server = serve(src)
    subs = [
        Subscriber(server.endpoint, tmp_path / f"m{i}", context=zctx, index_path=None).start()
        for i in range(4)
    ]
    try:
        assert all(sub.wait_synced(WAIT) for sub in subs)
        target = src / "f.bin"
        for round_ in range(5):
            data = os.urandom(4096)
            if target.exists():
                stamp = target.stat().st_mtime_ns
                with open(target, "r+b") as f:  # in place: same inode and size
                    f.write(data)
                os.utime(target, ns=(stamp, stamp))  # and the same mtime
            else:
                target.write_bytes(data)
            server.notify_changed("/", "f.bin")
            for i in range(4):
                assert wait_until(lambda i=i: files(tmp_path / f"m{i}") == files(src), WAIT), (
                    round_,
                    i,
                )
        assert all(sub.result.errors == 0 and sub.result.refetched == 0 for sub in subs)
    finally:
        for sub in subs:
            sub.stop()
