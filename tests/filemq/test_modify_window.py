"""``--modify-window`` (rsync's: mtimes that close count as equal) and ``subscribe --dry-run``,
with real ``filemq serve`` / ``sync`` / ``subscribe`` processes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from . import test_cli
from .conftest import write_tree
from .test_cli import FILEMQ, _env, _start_server, _sync
from .test_metadata_mirror import snapshot

processes = test_cli.processes  # (the fixture: serve processes stopped after each test)

Procs = list[subprocess.Popen[str]]
T = 1_600_000_000_000_000_000
SECOND = 1_000_000_000


def _mirror(tmp_path: Path, processes: Procs) -> tuple[str, Path, Path]:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"alpha", "b.txt": b"beta"})
    for name in ("a.txt", "b.txt"):
        os.utime(src / name, ns=(T, T))
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    first = _sync(tmp_path, endpoint, str(dest), "--once")
    assert first.returncode == 0, first.stderr
    assert (dest / "a.txt").stat().st_mtime_ns == T
    return endpoint, src, dest


def test_mtimes_within_the_window_count_as_equal(tmp_path: Path, processes: Procs) -> None:
    endpoint, src, dest = _mirror(tmp_path, processes)
    os.utime(src / "a.txt", ns=(T + SECOND, T + SECOND))  # 1 s off: within a 2 s window
    os.utime(src / "b.txt", ns=(T + 5 * SECOND, T + 5 * SECOND))  # 5 s off: outside it

    plan = _sync(tmp_path, endpoint, str(dest), "--dry-run", "--modify-window", "2")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines() == ["attrs b.txt"]

    done = _sync(tmp_path, endpoint, str(dest), "--once", "--modify-window", "2")
    assert done.returncode == 0, done.stderr
    assert (dest / "a.txt").stat().st_mtime_ns == T  # left as it is
    assert (dest / "b.txt").stat().st_mtime_ns == T + 5 * SECOND  # set to the server's

    exact = _sync(tmp_path, endpoint, str(dest), "--once")  # default window 0: exact
    assert exact.returncode == 0, exact.stderr
    assert (dest / "a.txt").stat().st_mtime_ns == T + SECOND


def test_the_window_never_hides_a_content_or_mode_change(tmp_path: Path, processes: Procs) -> None:
    endpoint, src, dest = _mirror(tmp_path, processes)
    (src / "a.txt").write_bytes(b"ALPHA!")  # new content, the same mtime
    os.utime(src / "a.txt", ns=(T, T))
    (src / "b.txt").chmod(0o600)  # new mode, the same mtime
    plan = _sync(tmp_path, endpoint, str(dest), "--dry-run", "--modify-window", "3600")
    assert sorted(plan.stdout.splitlines()) == ["attrs b.txt", "update a.txt"], plan.stderr
    done = _sync(tmp_path, endpoint, str(dest), "--once", "--modify-window", "3600")
    assert done.returncode == 0, done.stderr
    assert (dest / "a.txt").read_bytes() == b"ALPHA!"
    assert (dest / "b.txt").stat().st_mode & 0o777 == 0o600


def test_a_bad_window_is_a_usage_error(tmp_path: Path) -> None:
    for value in ("-1", "soon", "nan", "inf"):
        done = _sync(tmp_path, "tcp://127.0.0.1:1", str(tmp_path / "d"), "--modify-window", value)
        assert done.returncode == 2, (value, done.stderr)
        assert done.stderr.count("\n") == 1 and "--modify-window" in done.stderr


def test_subscribe_dry_run_prints_the_first_resync_and_exits(
    tmp_path: Path, processes: Procs
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"new.txt": b"new", "changed.txt": b"v2"})
    write_tree(dest, {"changed.txt": b"v1", "extra.txt": b"extra"})
    _proc, endpoint = _start_server(tmp_path, processes, "--publish", str(src), "--no-watch")
    before = snapshot(dest)
    done = subprocess.run(
        [*FILEMQ, "subscribe", endpoint, str(dest), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        "create new.txt",
        "delete extra.txt",
        "update changed.txt",
    ]
    assert snapshot(dest) == before  # nothing written, no lock file, no index
