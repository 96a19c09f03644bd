"""``filemq subscribe`` as a real daemon process against a real ``filemq serve`` process.

Server restart while the daemon runs, kill -9 of the daemon in the middle of a file,
SIGTERM stopping cleanly, ``--json`` event lines.  Waits read the daemon's JSON lines
(or poll files) with deadlines; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from filemq.mirror import LOCK_NAME
from tests.zerohub.support import stop_process

from .conftest import write_tree

FILEMQ = [sys.executable, "-m", "filemq"]
WAIT = 20.0
TEMP = ".filemq-part-"


def files(root: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name.startswith(TEMP):
                continue
            path = Path(dirpath) / name
            with contextlib.suppress(FileNotFoundError):
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def temps(root: Path) -> list[Path]:
    """Temp files in DEST (not the lock file of the daemon running there)."""
    if not root.exists():
        return []
    return [p for p in root.iterdir() if p.name.startswith(TEMP) and p.name != LOCK_NAME]


class Proc:
    """A filemq process: stdout read line by line (JSON events), stderr to a file."""

    def __init__(
        self, tmp_path: Path, name: str, *args: str, program: Sequence[str] = FILEMQ
    ) -> None:
        self.log = tmp_path / f"{name}.log"
        env = {
            **os.environ,
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "XDG_STATE_HOME": str(tmp_path / "state"),
        }
        with open(self.log, "ab") as err:
            self.popen = subprocess.Popen(
                [*program, *args], stdout=subprocess.PIPE, stderr=err, env=env
            )
        assert self.popen.stdout is not None
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.popen.stdout, selectors.EVENT_READ)
        self.events: list[dict[str, Any]] = []
        self._partial = b""

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_stderr(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            found = re.search(pattern, self.stderr())
            if found:
                return found
            assert self.popen.poll() is None, f"exited early:\n{self.stderr()}"
            time.sleep(0.02)
        raise AssertionError(f"{pattern!r} never logged:\n{self.stderr()}")

    def wait_event(
        self, match: Callable[[dict[str, Any]], bool], wait: float = WAIT
    ) -> dict[str, Any]:
        """The next JSON event (after those already returned) matching ``match``."""
        assert self.popen.stdout is not None
        deadline = time.monotonic() + wait
        while True:
            while self.events:
                event = self.events.pop(0)
                if match(event):
                    return event
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(timeout=left):
                raise AssertionError(f"no such event in time; log:\n{self.stderr()}")
            data = os.read(self.popen.stdout.fileno(), 65536)  # unbuffered: select stays true
            if not data:
                raise AssertionError(f"process ended; log:\n{self.stderr()}")
            self._partial += data
            *lines, self._partial = self._partial.split(b"\n")
            self.events.extend(json.loads(line) for line in lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        try:
            return self.popen.wait(10)
        finally:
            self._close()

    def _close(self) -> None:
        self._sel.close()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        if proc.popen.poll() is None:
            proc.popen.kill()
        proc.popen.wait(10)
        proc._close()


def kind(name: str, file: str = "") -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["kind"] == name and (not file or e["name"] == file)


def serve(tmp_path: Path, procs: list[Proc], src: Path, bind: str, *args: str) -> Proc:
    name = f"serve{len(procs)}"
    proc = Proc(tmp_path, name, "serve", "--bind", bind, "--publish", str(src), *args)
    procs.append(proc)
    return proc


def subscribe(tmp_path: Path, procs: list[Proc], endpoint: str, dest: Path, *args: str) -> Proc:
    proc = Proc(
        tmp_path,
        f"subscribe{len(procs)}",
        "subscribe",
        endpoint,
        str(dest),
        "--json",
        "--index",
        str(tmp_path / "mirror.idx"),
        *args,
    )
    procs.append(proc)
    return proc


def test_daemon_follows_a_server_restart(tmp_path: Path, procs: list[Proc]) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*")
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    daemon = subscribe(tmp_path, procs, endpoint, dest)
    daemon.wait_event(kind("resync-complete"))
    assert files(dest) == files(src)

    (src / "d" / "live.txt").write_bytes(b"pushed")
    event = daemon.wait_event(kind("create", "d/live.txt"))
    assert event["size"] == 6 and event["path"] == str(dest.resolve() / "d" / "live.txt")

    assert server.stop() == 0
    daemon.wait_event(kind("disconnected"))
    (src / "while-down.txt").write_bytes(b"made while the server was down")
    (src / "a.txt").unlink()
    server = serve(tmp_path, procs, src, endpoint)  # same port
    serving = server.wait_stderr(
        r"serving .* \((\d+ files in the saved index, checking them|\d+ files, \d+ hashed)"
    )
    if "checking them" in serving.group(1):
        server.wait_stderr(r"checked .* \(3 files, 1 hashed")  # its saved index was reused
    else:  # (checked before the serving line was written: a small tree; CI saw both)
        assert serving.group(1) == "3 files, 1 hashed"  # its saved index was reused
    daemon.wait_event(kind("resync-complete"))
    assert files(dest) == files(src)
    (src / "after.txt").write_bytes(b"live again")
    daemon.wait_event(kind("create", "after.txt"))
    assert files(dest) == files(src)

    assert daemon.stop(signal.SIGTERM) == 0  # clean stop on SIGTERM
    assert "stopped:" in daemon.stderr()
    assert "received after.txt" in daemon.stderr()  # change log lines
    assert (tmp_path / "mirror.idx").exists()


def test_daemon_killed_mid_file_leaves_no_partial_file(tmp_path: Path, procs: list[Proc]) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    big = os.urandom(32 << 20)
    write_tree(src, {"small.txt": b"small", "big.bin": big})
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*", "--chunk-size", "4096")
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    daemon = subscribe(tmp_path, procs, endpoint, dest, "--window", "16384")
    deadline = time.monotonic() + WAIT
    partial: list[Path] = []
    while time.monotonic() < deadline and not (dest / "big.bin").exists():
        partial = [p for p in temps(dest) if 0 < p.stat().st_size < len(big)]
        if partial:
            break
        time.sleep(0.005)
    assert partial, "the big file was never caught in transfer"
    daemon.stop(signal.SIGKILL)
    assert not (dest / "big.bin").exists()  # nothing partial under the real name
    assert temps(dest)  # the killed process left its temp file behind ...

    daemon = subscribe(tmp_path, procs, endpoint, dest)
    daemon.wait_event(kind("resync-complete"))
    assert (dest / "big.bin").read_bytes() == big
    assert files(dest) == files(src)
    assert not temps(dest)  # ... which the next start cleaned up
    assert daemon.stop() == 0


def test_heartbeats_detect_a_frozen_server(tmp_path: Path, procs: list[Proc]) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a"})
    state = tmp_path / "server-state"
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*", "--state-dir", str(state))
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    assert list((state / "server").glob("*.idx"))  # saved after the initial scan
    daemon = subscribe(tmp_path, procs, endpoint, dest, "--heartbeat", "0.1", "--timeout", "0.5")
    daemon.wait_event(kind("resync-complete"))
    stop_process(server.popen)  # alive for TCP, silent for FILEMQ
    try:
        event = daemon.wait_event(kind("disconnected"))
        assert "silent" in event["detail"] or "no answer" in event["detail"]
        (src / "b.txt").write_bytes(b"b")
    finally:
        server.popen.send_signal(signal.SIGCONT)
    daemon.wait_event(kind("resync-complete"))
    assert wait_files(dest, src)
    assert daemon.stop() == 0


def wait_files(dest: Path, src: Path) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if files(dest) == files(src):
            return True
        time.sleep(0.01)
    return False


def sync_once_process(
    tmp_path: Path, endpoint: str, dest: Path
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run(
        [*FILEMQ, "sync", endpoint, str(dest), "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def one_error_line(stderr: str) -> str:
    # a failure is one "filemq: ..." line (zerohub.cli), beside any log lines
    errors = [line for line in stderr.splitlines() if line.startswith("filemq: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def test_one_mirror_per_dest_and_kill_9_leaves_no_stale_lock(
    tmp_path: Path, procs: list[Proc]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*")
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    first = subscribe(tmp_path, procs, endpoint, dest)
    first.wait_event(kind("resync-complete"))

    second = subscribe(tmp_path, procs, endpoint, dest)
    assert second.popen.wait(WAIT) == 5  # documented: DEST locked by another process
    assert f"by process {first.popen.pid} " in one_error_line(second.stderr())
    once = sync_once_process(tmp_path, endpoint, dest)  # `sync` too, on the same DEST
    assert once.returncode == 5
    assert f"by process {first.popen.pid} " in one_error_line(once.stderr)
    assert files(dest) == files(src)  # untouched by the refused ones
    with open(dest / LOCK_NAME, "rb") as f, pytest.raises(BlockingIOError):
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by the first daemon

    first.stop(signal.SIGKILL)
    assert (dest / LOCK_NAME).read_text() == f"{first.popen.pid}\n"  # left behind ...
    third = subscribe(tmp_path, procs, endpoint, dest)
    third.wait_event(kind("resync-complete"))  # ... holding nothing: taken over
    assert (dest / LOCK_NAME).read_text() == f"{third.popen.pid}\n"
    (src / "c.txt").write_bytes(b"gamma")
    third.wait_event(kind("create", "c.txt"))
    assert files(dest) == files(src)
    assert third.stop() == 0
    assert not (dest / LOCK_NAME).exists()  # a clean stop removes it


def sha1s(root: Path) -> dict[str, str]:
    return {name: hashlib.sha1(data).hexdigest() for name, data in files(root).items()}


def test_live_daemon_repairs_local_drift_without_restart(
    tmp_path: Path, procs: list[Proc]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(
        src,
        {
            "modified.txt": b"server copy",
            "deleted.txt": b"deleted locally",
            "dir-in-the-way.txt": b"a folder took my place",
            "file-in-the-way/inner.txt": b"a file took my folder's place",
            "untouched.txt": b"same",
        },
    )
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*")
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    daemon = subscribe(tmp_path, procs, endpoint, dest, "--check-interval", "0.2")
    daemon.wait_event(kind("resync-complete"))
    assert sha1s(dest) == sha1s(src)

    (dest / "modified.txt").write_bytes(b"edited in DEST")
    (dest / "deleted.txt").unlink()
    (dest / "dir-in-the-way.txt").unlink()
    (dest / "dir-in-the-way.txt" / "empty-sub").mkdir(parents=True)
    (dest / "dir-in-the-way.txt" / "x.txt").write_bytes(b"x")
    shutil.rmtree(dest / "file-in-the-way")
    (dest / "file-in-the-way").write_bytes(b"I am a file now")
    (dest / "extra.txt").write_bytes(b"not on the server")

    repaired = {"modified.txt", "deleted.txt", "dir-in-the-way.txt", "file-in-the-way/inner.txt"}
    created: dict[str, str] = {}
    while not repaired <= created.keys():
        event = daemon.wait_event(kind("create"))
        created[event["name"]] = event["sha1"]
    assert wait_files(dest, src)  # the extra file and the in-the-way ones are gone too
    assert sha1s(dest) == sha1s(src)
    assert {name: created[name] for name in repaired} == {n: sha1s(src)[n] for n in repaired}
    assert (dest / "dir-in-the-way.txt").is_file() and (dest / "file-in-the-way").is_dir()
    assert not (dest / "extra.txt").exists()
    assert "DEST changed locally" in daemon.stderr()
    assert daemon.popen.poll() is None  # no restart: the same process did it
    assert daemon.stop() == 0


def test_drift_checks_never_take_the_mirrors_own_writes_for_drift(
    tmp_path: Path, procs: list[Proc]
) -> None:
    """Checks every 10 ms during a long transfer: only the one real local change is repaired."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"small.txt": b"small"})
    server = serve(tmp_path, procs, src, "tcp://127.0.0.1:*", "--chunk-size", "4096")
    endpoint = server.wait_stderr(r"on (tcp://\S+) \(").group(1)
    daemon = subscribe(
        tmp_path, procs, endpoint, dest, "--window", "16384", "--check-interval", "0.01"
    )
    daemon.wait_event(kind("resync-complete"))
    big = os.urandom(8 << 20)
    (tmp_path / "big.tmp").write_bytes(big)
    os.replace(tmp_path / "big.tmp", src / "big.bin")  # pushed live, 4 KiB at a time
    write_tree(src, {f"many/{i}.txt": f"file {i}".encode() for i in range(50)})
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and not (temps(dest) or (dest / "big.bin").exists()):
        time.sleep(0.005)  # (polling for the big file to be in transfer)
    (tmp_path / "local.tmp").write_bytes(b"changed in DEST during the transfer")
    os.replace(tmp_path / "local.tmp", dest / "small.txt")  # one local change, atomic
    daemon.wait_event(kind("create", "small.txt"))
    assert wait_files(dest, src)
    log = daemon.stderr()
    assert log.count("DEST changed locally") == 1, log
    assert "fetching it again" not in log and "ERROR" not in log
    assert daemon.stop() == 0
