"""Fifty real ``filemq subscribe`` daemons on one real ``filemq serve``: all stay exact
mirrors, and one stalled (SIGSTOPped) daemon does not hold the others back."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.filemq.procs import read_endpoint
from tests.filemq.test_subscribe_cli import files
from tests.zerohub.support import stop_process

DAEMONS = 50
DEADLINE = 90.0


def _tree(root: Path) -> dict[str, str]:
    """The files under ``root`` (temp files left out), by SHA-1.  A daemon may delete or
    replace a file while this walks (``files`` skips one gone between its listing and its
    read: an rglob-then-read here raced a delete)."""
    return {name: hashlib.sha1(data).hexdigest() for name, data in files(root).items()}


def _wait(pred, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)  # polling the file system for the outcome, not synchronising
    return bool(pred())


@pytest.mark.slow  # 51 processes: ~24 s of CPU, 68 s at load 11-15 (the default suite's costliest)
def test_fifty_daemons_and_a_stalled_one(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "docs").mkdir(parents=True)
    for i in range(5):
        (src / "docs" / f"start{i}.txt").write_bytes(b"s" * (1000 * i))
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "filemq",
            "serve",
            "--publish",
            str(src),
            "--bind",
            "tcp://127.0.0.1:*",
            "--no-state",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        assert server.stdout is not None
        endpoint = read_endpoint(server.stdout)
        assert endpoint, "server did not report its endpoint"
        dests = [tmp_path / f"m{i:02d}" for i in range(DAEMONS)]
        for dest in dests:
            daemons.append(
                subprocess.Popen(
                    [sys.executable, "-m", "filemq", "-q", "subscribe", endpoint, str(dest)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=env,
                )
            )
        want = _tree(src)
        assert _wait(lambda: all(_tree(d) == want for d in dests), DEADLINE)

        stalled = daemons[0]
        stop_process(stalled)
        (src / "docs" / "start1.txt").write_bytes(b"changed")
        (src / "docs" / "start2.txt").unlink()
        for i in range(10):
            (src / "new" / f"n{i}").parent.mkdir(exist_ok=True)
            (src / "new" / f"n{i}").write_bytes(os.urandom(64 * 1024))
        want = _tree(src)
        others = dests[1:]
        assert _wait(lambda: all(_tree(d) == want for d in others), DEADLINE)
        assert _tree(dests[0]) != want  # it really was stalled
        stalled.send_signal(signal.SIGCONT)
        assert _wait(lambda: _tree(dests[0]) == want, DEADLINE)
    finally:
        for proc in daemons:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        codes = [proc.wait(timeout=30) for proc in daemons]
        server.terminate()
        server.wait(timeout=30)
        if server.stdout is not None:
            server.stdout.close()
    assert codes == [0] * DAEMONS
