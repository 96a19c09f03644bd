"""A DEST whose file system fills while the mirror writes, through real processes.

DEST sits on a small tmpfs (a real file system that runs out of room: ENOSPC), the
files come from a real server over loopback, small ones put in place by the placer
thread (``filemq.placer``) and a big one in chunks.  ``filemq sync`` ends at once with
one line naming the cause (exit 1), every file in DEST is whole and nothing partial is
left; once there is room the next sync makes DEST exact.  ``filemq subscribe`` (a
daemon) says it once per attempt, keeps trying, and is exact once there is room.

Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from filemq.mirror import LOCK_NAME, TEMP_PREFIX
from filemq.server import FileServer
from tests.polling import wait_until
from zerohub.cli import ExitCode

from . import test_subscribe_cli
from .conftest import write_tree
from .test_subscribe_cli import WAIT, Proc, files

procs = test_subscribe_cli.procs  # the fixture: every process started is killed at the end

ROOM = 1 << 20  # the tmpfs: room for about a third of what the server publishes
SMALL = {f"d{i % 4}/f{i}.bin": os.urandom(10 << 10) for i in range(200)}  # 2 MiB
BIG = {"zz/big.bin": os.urandom(3 << 20)}  # in chunks (the default chunk is 1 MiB); sent last


@contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """``where`` (made here) a tmpfs of ``size`` (mount's ``size=``) until the end; the
    test skips, saying why, where it cannot be mounted."""
    where.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs of ``ROOM`` bytes; ``_grow(...)`` gives it more room."""
    with small_tmpfs(tmp_path / "disk", str(ROOM)) as where:
        yield where


def sync_into_full_dest(tmp_path: Path, sync: list[str], dest: Path) -> str:
    """Run ``filemq sync`` (its arguments: ``sync``) into ``dest``, whose disk fills: it
    exits 1 with one line saying DEST is full; that line."""
    full = Proc(tmp_path, "full", *sync)
    try:
        assert full.popen.wait(WAIT * 3) == ExitCode.FAILURE
        lines = full.stderr().strip().splitlines()
    finally:
        full.stop()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"filemq: DEST {dest} is full: cannot "), lines
    return lines[0]


def sync_exits_0(tmp_path: Path, sync: list[str]) -> None:
    """Run ``filemq sync`` (its arguments: ``sync``) again: it exits 0."""
    again = Proc(tmp_path, "again", *sync)
    try:
        assert again.popen.wait(WAIT * 3) == 0, again.stderr()
    finally:
        again.stop()


def _grow(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)


def _whole(dest: Path, src: Path) -> dict[str, bytes]:
    """What DEST holds (temp files aside): whole files of the source only."""
    held = files(dest)
    want = files(src)
    assert {name: want.get(name) for name in held} == held  # each one whole, as published
    return held


def _temp_files(dest: Path) -> list[str]:
    return [p.name for p in dest.rglob(TEMP_PREFIX + "*") if p.name != LOCK_NAME]


@pytest.mark.parametrize(
    ("tree", "options"),
    [({**SMALL, **BIG}, []), ({**SMALL, **BIG}, ["--placer", "inline"]), (BIG, [])],
    ids=["placer-thread-fills-it", "placed-inline-fills-it", "a-file-in-chunks-fills-it"],
)
def test_sync_into_a_disk_that_fills_ends_with_one_line_and_the_next_sync_is_exact(
    tmp_path: Path,
    small_disk: Path,
    serve: Callable[..., FileServer],
    tree: dict[str, bytes],
    options: list[str],
) -> None:
    src = tmp_path / "src"
    write_tree(src, tree)
    server = serve(src)
    dest = small_disk / "dest"
    sync = ["sync", server.endpoint, str(dest), "--once", "--index", str(tmp_path / "d.idx")]
    sync += options
    line = sync_into_full_dest(tmp_path, sync, dest)
    assert "No space left on device" in line and "none in part" in line
    held = _whole(dest, src)
    assert _temp_files(dest) == []
    assert len(held) < len(tree)
    assert held or tree is BIG  # (the small files: some placed before the disk filled)

    _grow(small_disk)
    sync_exits_0(tmp_path, sync)
    assert files(dest) == files(src)


def test_a_mirror_daemon_whose_disk_fills_keeps_trying_and_is_exact_once_it_has_room(
    tmp_path: Path, small_disk: Path, serve: Callable[..., FileServer], procs: list[Proc]
) -> None:
    src = tmp_path / "src"
    write_tree(src, SMALL)
    server = serve(src)
    dest = small_disk / "dest"
    mirror = Proc(
        tmp_path, "daemon", "subscribe", server.endpoint, str(dest), "--max-backoff", "0.5",
        "--index", str(tmp_path / "d.idx"),
    )  # fmt: skip
    procs.append(mirror)
    mirror.wait_stderr(f"ERROR filemq.client: DEST {dest} is full: cannot ")
    assert "(skipped)" not in mirror.stderr()  # one line per attempt, not one per file
    assert _whole(dest, src)  # (it may be trying again: a temp file may be there now)
    assert mirror.popen.poll() is None
    _grow(small_disk)
    assert wait_until(lambda: files(dest) == files(src), WAIT), len(files(dest))
    assert wait_until(lambda: _temp_files(dest) == [], WAIT)
    assert mirror.stop() == 0
