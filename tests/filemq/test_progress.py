"""Progress of a mirror: a bar on a terminal (a real pty), log lines otherwise, JSON untouched."""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq.client import SyncResult
from filemq.progress import describe
from filemq.server import FileServer

from .conftest import read_tree, write_tree

Serve = Callable[..., FileServer]
Sync = Callable[..., SyncResult]
MiB = 1 << 20
TREE = {"one.bin": os.urandom(3 * MiB), "two.bin": os.urandom(3 * MiB), "small": b"s"}


def test_describe_with_and_without_a_plan() -> None:
    assert describe(3, 10, 460 * MiB, 1024 * MiB, 2.0) == (
        "3/10 files, 460.0/1024.0 MiB (44%), 230.0 MiB/s, ETA 2 s"
    )
    assert describe(1, 2, 10 * MiB, 100 * MiB, 10.0).endswith("1.0 MiB/s, ETA 1:30")
    assert describe(1, 2, 1 * MiB, 10_000 * MiB, 10.0).endswith("0.1 MiB/s, ETA 27:46:30")
    assert describe(2, 2, 100, 100, 1.0).endswith("MiB/s")  # done: no ETA
    assert describe(5, 0, 3 * MiB, 0, 1.5) == "5 files, 3.0 MiB, 2.0 MiB/s"


def test_lines_when_not_a_terminal(
    tmp_path: Path, serve: Serve, sync_once: Sync, caplog: pytest.LogCaptureFixture
) -> None:
    write_tree(tmp_path / "src", TREE)
    server = serve(tmp_path / "src", chunk_size=64 << 10)
    not_a_tty = io.StringIO()
    with caplog.at_level(logging.INFO, logger="filemq.progress"):
        result = sync_once(
            server.endpoint,
            tmp_path / "dest",
            progress=not_a_tty,
            progress_every=0.1,
            # a bucket of 0.5 s (2 MiB) at once, the other 4 MiB in ~1 s: several lines
            # (8 MiB/s left ~0.25 s after its 4 MiB burst: one line when the wire was quick)
            bwlimit=4 * MiB,
        )
    assert result.files == 3 and read_tree(tmp_path / "dest") == TREE
    lines = [r.getMessage() for r in caplog.records if r.name == "filemq.progress"]
    assert len(lines) >= 2, lines
    pattern = r"progress: \d/3 files, [\d.]+/6\.0 MiB \(\d+%\), [\d.]+ MiB/s, ETA \d+ s"
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert not_a_tty.getvalue() == ""  # nothing drawn on the stream itself


def _pty_run(args: list[str], env: dict[str, str], timeout: float = 60.0) -> tuple[str, str, int]:
    """Run ``args`` with stderr on a pseudo-terminal (80x24), stdout on a pipe."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    assert proc.stdout is not None
    err = b""
    out = b""
    deadline = time.monotonic() + timeout
    streams = [master, proc.stdout.fileno()]
    while streams and time.monotonic() < deadline:
        ready, _, _ = select.select(streams, [], [], 0.5)
        for fd in ready:
            try:
                block = os.read(fd, 65536)
            except OSError:  # (EIO: the pty's other side closed)
                block = b""
            if not block:
                streams.remove(fd)
            elif fd == master:
                err += block
            else:
                out += block
    os.close(master)
    proc.stdout.close()
    code = proc.wait(timeout=10)
    return out.decode(), err.decode(errors="replace"), code


def test_bar_on_a_terminal(tmp_path: Path, serve: Serve) -> None:
    write_tree(tmp_path / "src", TREE)
    server = serve(tmp_path / "src", chunk_size=64 << 10)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("COLUMNS", None)
    args = [sys.executable, "-m", "filemq", "sync", server.endpoint, str(tmp_path / "dest")]
    out, err, code = _pty_run([*args, "--once", "--bwlimit", "4M"], env)
    assert code == 0, err
    assert out == ""
    assert read_tree(tmp_path / "dest") == TREE
    frames = [f for f in re.split(r"[\r\n]+", err) if f.strip()]
    assert any(re.search(r"[0-2]/3 files:\s+\d+%\|.*\| [\d.]+[kM]/6\.29M \[", f) for f in frames)
    assert any(re.search(r"<\d\d:\d\d, [\d.]+[kM]B/s\]", f) for f in frames), frames  # ETA
    assert re.search(r"3/3 files: 100%\|[^|]+\| 6\.29M/6\.29M", err), err
    assert not re.search(r"B/s\]INFO", err)  # no log line drawn over the bar


def test_subscribe_json_stays_json_with_a_bar_on_stderr(tmp_path: Path, serve: Serve) -> None:
    write_tree(tmp_path / "src", TREE)
    server = serve(tmp_path / "src", chunk_size=64 << 10)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    dest = tmp_path / "dest"
    script = (
        "import signal, sys, threading\n"
        "from filemq.cli import main\n"
        "timer = threading.Timer(20, lambda: signal.raise_signal(signal.SIGTERM))\n"
        "timer.daemon = True\n"
        "timer.start()\n"
        "sys.argv[0] = 'filemq'\n"
        "sys.exit(main())\n"
    )
    # stopped by its own timer; or sooner: the watcher below sends SIGTERM on resync-complete
    watcher = (
        "import json, os, signal, subprocess, sys\n"
        "p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, text=True)\n"
        "for line in p.stdout:\n"
        "    print(line, end='', flush=True)\n"
        "    if json.loads(line)['kind'] == 'resync-complete':\n"
        "        p.send_signal(signal.SIGTERM)\n"
        "sys.exit(p.wait())\n"
    )
    args = [sys.executable, "-c", watcher, sys.executable, "-c", script]
    out, err, code = _pty_run(
        [*args, "subscribe", server.endpoint, str(dest), "--json", "--bwlimit", "8M"], env
    )
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["kind"] for e in events] == ["create", "create", "create", "resync-complete"]
    assert "3/3 files: 100%" in err
