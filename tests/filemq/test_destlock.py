"""``DestLock``: one mirror per DEST, with real ``flock`` calls on real files.

(``flock`` locks belong to an open file description, so two ``DestLock`` objects in
one process conflict exactly as two processes do; the process-level tests, kill -9
included, are in ``test_subscribe_cli``.)
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq.client import SyncResult
from filemq.destlock import DestLock, DestLocked
from filemq.mirror import LOCK_NAME
from filemq.server import FileServer

from .conftest import read_tree, write_tree


def test_second_lock_refused_naming_the_holder(tmp_path: Path) -> None:
    with DestLock(tmp_path) as first:
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(DestLocked) as refused:
            DestLock(tmp_path).acquire()
        assert refused.value.pid == os.getpid()
        assert f"by process {os.getpid()}" in str(refused.value)
        assert first.held
    assert not (tmp_path / LOCK_NAME).exists()  # a clean release removes the file
    with DestLock(tmp_path):  # free again
        pass


def test_a_left_over_lock_file_holds_nothing(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("999999999\n")  # what a killed holder leaves
    with DestLock(tmp_path):
        assert (tmp_path / LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_lock_file_removed_while_held_is_taken_again(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    lock = DestLock(dest)
    dest.mkdir()
    lock.acquire()
    try:
        lock.check()  # still ours: nothing to do
        (dest / LOCK_NAME).unlink()  # DEST cleaned by hand
        lock.check()
        assert lock.held and (dest / LOCK_NAME).read_text() == f"{os.getpid()}\n"
        with pytest.raises(DestLocked):
            DestLock(dest).acquire()  # really held again
        (dest / LOCK_NAME).unlink()
        other = DestLock(dest)
        other.acquire()  # the path was free: another process got in first ...
        try:
            with pytest.raises(DestLocked):
                lock.check()  # ... and the first one learns it lost DEST
            assert not lock.held
        finally:
            other.release()
    finally:
        lock.release()


def test_lock_path_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("keep")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / LOCK_NAME).symlink_to(elsewhere)
    with pytest.raises(OSError):
        DestLock(dest).acquire()
    assert elsewhere.read_text() == "keep"


def test_lock_path_that_is_a_fifo_is_refused_and_left_unlocked(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    os.mkfifo(dest / LOCK_NAME)
    lock = DestLock(dest)
    with pytest.raises(OSError, match="not a regular file"):
        lock.acquire()
    assert not lock.held
    # no descriptor of it was left open holding the flock: another opener can take it
    fd = os.open(dest / LOCK_NAME, os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_lock_file_is_neither_mirrored_nor_deleted_as_extra(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    """A mirror's DEST published onward: its lock file never travels, and is never removed."""
    write_tree(tmp_path / "src", {"a": b"a"})
    origin = serve(tmp_path / "src")
    relay_dir = tmp_path / "relay"
    assert sync_once(origin.endpoint, relay_dir).files == 1
    with DestLock(relay_dir):  # a mirror running in relay_dir, published by a second server
        relay = serve(relay_dir)
        assert LOCK_NAME not in relay.indexes["/"]
        dest = tmp_path / "dest"
        (dest).mkdir()
        (dest / LOCK_NAME).write_text("1\n")  # stale lock left in the next mirror's DEST
        result = sync_once(relay.endpoint, dest)
        assert result.files == 1 and result.deleted == 0 and result.errors == 0
        assert read_tree(dest) == {"a": b"a"}
        assert (relay_dir / LOCK_NAME).exists()
