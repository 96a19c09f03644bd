"""A burst of whole small files (each one message) placed in runs by the mirror's
placer thread (``filemq.placer``), with real ``filemq`` processes on both sides.

Adversaries: the mirror killed -9 in the middle of the burst (DEST holds only whole
files of the source under their final names; the next sync completes it, no temp file
left), and the server killed -9 and started again on the same port in the middle of
the burst (the running daemon resyncs and ends exact).  The rate limit (``--bwlimit``)
stretches the burst over seconds so the kill lands inside it; waits poll DEST or read
the daemon's JSON lines against deadlines sized for a loaded machine.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from .conftest import write_tree
from .test_subscribe_cli import Proc, files, kind, procs, serve, subscribe, temps

__all__ = ["procs"]  # (the fixture, shared with test_subscribe_cli)

#: 600 files of 8 KiB in 12 folders: ~4.8 MB, several seconds at the rates below.
TREE = {f"d{i % 12:02d}/f{i:04d}.dat": os.urandom(8 << 10) for i in range(600)}
#: Generous: a loaded machine (load 50 on 2 cores) is slow, never wrong.
DEADLINE = 120.0


def _placed(dest: Path, at_least: int) -> dict[str, bytes]:
    """Poll until DEST holds ``at_least`` files under their final names (a deadline)."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        held = files(dest) if dest.exists() else {}
        if len(held) >= at_least:
            return held
        time.sleep(0.01)
    raise AssertionError(f"fewer than {at_least} files placed in {DEADLINE} s")


def _only_whole_files(dest: Path) -> dict[str, bytes]:
    """What DEST holds under final names: each one whole, as published."""
    held = files(dest)
    assert {name: TREE.get(name) for name in held} == held
    return held


def _serving(tmp_path: Path, procs: list[Proc], *options: str) -> tuple[Path, Path, Proc, str]:
    """SRC holding ``TREE`` served by a ``filemq serve`` process: (SRC, DEST, it, endpoint)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, TREE)
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*", *options)
    return src, dest, server, server.wait_stderr(r"on (tcp://\S+) \(").group(1)


@pytest.mark.timeout(2 * DEADLINE + 60)
def test_a_mirror_killed_mid_burst_holds_only_whole_files_and_the_next_sync_completes(
    tmp_path: Path, procs: list[Proc]
) -> None:
    _src, dest, _server, endpoint = _serving(tmp_path, procs)
    index = str(tmp_path / "mirror.idx")
    mirror = subscribe(tmp_path, procs, endpoint, dest, "--bwlimit", "1M")
    _placed(dest, 60)
    assert mirror.stop(signal.SIGKILL) == -signal.SIGKILL  # in the middle of the burst
    held = _only_whole_files(dest)
    assert 60 <= len(held) < len(TREE)  # (the kill landed inside the burst)

    again = Proc(tmp_path, "again", "sync", endpoint, str(dest), "--once", "--index", index)
    procs.append(again)
    assert again.popen.wait(DEADLINE) == 0, again.stderr()
    assert files(dest) == TREE
    assert temps(dest) == []  # the killed mirror's temp files are gone


@pytest.mark.timeout(2 * DEADLINE + 60)
def test_a_server_killed_and_restarted_mid_burst_the_daemon_ends_exact(
    tmp_path: Path, procs: list[Proc]
) -> None:
    src, dest, server, endpoint = _serving(tmp_path, procs, "--bwlimit", "1M")
    daemon = subscribe(tmp_path, procs, endpoint, dest)
    _placed(dest, 60)
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL  # in the middle of the burst
    assert len(_only_whole_files(dest)) < len(TREE)  # (the kill landed inside the burst)

    serve(tmp_path, procs, src, endpoint)  # the same port, no rate limit
    daemon.wait_event(kind("resync-complete"), DEADLINE)
    assert files(dest) == TREE, daemon.stderr()
    assert daemon.popen.poll() is None
    assert temps(dest) == []
    assert daemon.stop(signal.SIGTERM) == 0
