"""A file or folder the server cannot read is an error on the server, never a delete.

The server runs as a real ``filemq serve`` process.  ``chmod 000`` only makes a file
unreadable for a process without CAP_DAC_OVERRIDE, so when the tests run as root the
server process drops to the ``nobody`` user after importing what it needs (the
interpreter may live under a folder ``nobody`` cannot enter); the published tree is
then made in a world-readable temp folder.  Run as any other user, the server simply
runs as that user.
"""

from __future__ import annotations

import hashlib  # noqa: F401  (imported before a forked child drops its privileges)
import os
import pickle
import pwd
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncClient
from filemq.events import EventKind, MirrorEvent
from filemq.index import FileIndex
from filemq.walk import reconcile, stamp_tree

from .conftest import read_tree, write_tree

# Imports done before dropping privileges, then ``filemq.cli.main``: the server modules,
# what they import lazily (hashlib, the inotify observer), and nothing else.
_BOOT = """
import os, sys
import hashlib, json, logging
import filemq.cli, filemq.live, filemq.server, filemq.publisher, filemq.state
import filemq.inotify_observer, watchdog.observers, watchdog.observers.inotify
import watchdog.observers.polling
uid = int(sys.argv[1])
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
sys.exit(filemq.cli.main(sys.argv[2:]))
"""


def _server_uid() -> int:
    """The uid the server process drops to (-1: stay as we are, we are not root)."""
    if os.geteuid() != 0:
        return -1
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:  # pragma: no cover - every Linux we run on has it
        return 65534


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the unprivileged server user can read (tmp_path's parents may not be)."""
    path = Path(tempfile.mkdtemp(prefix="filemq-unreadable-"))
    path.chmod(0o755)
    yield path
    for dirpath, dirnames, _files in os.walk(path):
        for name in dirnames:  # give back what the test took away, then remove
            os.chmod(os.path.join(dirpath, name), 0o755)
    shutil.rmtree(path)


class _Server:
    """``filemq serve`` in a real process; its stderr is read by a thread from the start."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(_server_uid()), "serve", *args],
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        self.lines: list[str] = []
        self._new: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()
        self.endpoint = self._read_endpoint()

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            self._new.put(line)
        self._new.put("")  # end of output

    def _read_endpoint(self) -> str:
        deadline = time.monotonic() + 20
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._new.get(timeout=left)
            except queue.Empty:
                break
            found = re.search(r"on (tcp://\S+) \(", line)
            if found:
                return found.group(1)
            if not line:
                break
        self.stop()
        raise AssertionError("server did not start:\n" + "".join(self.lines))

    def stop(self) -> str:
        """Stop the server (SIGTERM); everything it wrote on stderr."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return "".join(self.lines)


@pytest.fixture
def servers() -> Iterator[Callable[..., _Server]]:
    started: list[_Server] = []

    def start(*args: str) -> _Server:
        server = _Server("--bind", "tcp://127.0.0.1:*", "--no-state", *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _sync(zctx: zmq.Context[Any], endpoint: str, dest: Path) -> Any:
    client = SyncClient(
        zctx, endpoint, dest, once=True, index_path=None, connect_timeout=10, idle_timeout=10
    )
    return client.run()


def _make_unreadable(pub: Path) -> None:
    """A new version of a.txt nobody may read, and a folder nobody may list."""
    (pub / "a.txt").write_bytes(b"version two, longer than one")
    (pub / "a.txt").chmod(0o000)
    (pub / "sub").chmod(0o000)


def test_unreadable_file_and_folder_are_kept_by_resyncs(
    shared_dir: Path, tmp_path: Path, servers: Callable[..., _Server], zctx: zmq.Context[Any]
) -> None:
    pub, dest = shared_dir / "pub", tmp_path / "dest"
    tree = {"a.txt": b"version one", "b.txt": b"b", "sub/d.txt": b"d"}
    write_tree(pub, tree)
    for path in (pub, pub / "sub"):
        path.chmod(0o755)
    server = servers("--publish", str(pub), "--no-watch")
    first = _sync(zctx, server.endpoint, dest)
    assert first.synced and read_tree(dest) == tree
    _make_unreadable(pub)
    again = _sync(zctx, server.endpoint, dest)  # the server re-stats its tree per client
    assert again.synced and again.deleted == 0
    assert read_tree(dest) == tree  # the last version each mirror got is kept
    # a fresh mirror gets what can be read, and nothing in place of the rest
    fresh = _sync(zctx, server.endpoint, tmp_path / "fresh")
    assert fresh.synced and read_tree(tmp_path / "fresh") == {"b.txt": b"b"}
    log = server.stop()
    assert re.search(r"ERROR .*a\.txt", log), log
    assert re.search(r"ERROR .*sub", log), log
    # a restarted server never read those files at all: still no delete
    restarted = servers("--publish", str(pub), "--no-watch")
    third = _sync(zctx, restarted.endpoint, dest)
    assert third.synced and third.deleted == 0 and read_tree(dest) == tree


class _Events:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[MirrorEvent] = []

    def __call__(self, event: MirrorEvent) -> None:
        with self.lock:
            self.seen.append(event)

    def names(self, kind: EventKind) -> list[str]:
        with self.lock:
            return [e.name for e in self.seen if e.kind is kind]


def _wait(predicate: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_file_made_unreadable_is_not_deleted_from_live_mirrors(
    shared_dir: Path, tmp_path: Path, servers: Callable[..., _Server], zctx: zmq.Context[Any]
) -> None:
    pub, dest = shared_dir / "pub", tmp_path / "dest"
    tree = {"a.txt": b"version one", "b.txt": b"b", "sub/d.txt": b"d"}
    write_tree(pub, tree)
    for path in (pub, pub / "sub"):
        path.chmod(0o755)
    server = servers("--publish", str(pub))  # watching: chmod is an attribute change
    events = _Events()
    client = SyncClient(
        zctx, server.endpoint, dest, index_path=None, max_retries=None, on_event=events,
        heartbeat=0.5, timeout=5.0, connect_timeout=10.0,
    )  # fmt: skip
    runner = threading.Thread(target=client.run)
    runner.start()
    try:
        assert _wait(lambda: bool(events.names(EventKind.RESYNC_COMPLETE)))
        assert read_tree(dest) == tree
        _make_unreadable(pub)
        (pub / "after.txt").write_bytes(b"sentinel")  # changes are pushed in order
        assert _wait(lambda: "after.txt" in events.names(EventKind.CREATE))
    finally:
        client.stop()
        runner.join(10)
    assert events.names(EventKind.DELETE) == []
    got = read_tree(dest)
    # the new version if the server read it before the chmod, else the one it had
    assert got["a.txt"] in (b"version one", b"version two, longer than one")
    assert got["b.txt"] == b"b" and got["sub/d.txt"] == b"d"
    log = server.stop()
    assert re.search(r"ERROR .*a\.txt", log), log


def _as_server_user(fn: Callable[[], Any]) -> Any:
    """``fn()`` with the server's privileges: in a forked child when we are root."""
    uid = _server_uid()
    if uid < 0:
        return fn()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            payload = pickle.dumps(("ok", fn()))
        except BaseException as exc:
            payload = pickle.dumps(("error", repr(exc)))
        with os.fdopen(write_end, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as inp:
        payload = inp.read()
    os.waitpid(pid, 0)
    status, value = pickle.loads(payload)
    assert status == "ok", value
    return value


def test_index_holds_what_it_cannot_read_and_takes_it_back_later(shared_dir: Path) -> None:
    pub = shared_dir / "pub"
    write_tree(pub, {"a.txt": b"one", "sub/d.txt": b"d", "b.txt": b"b"})
    for path in (pub, pub / "sub"):
        path.chmod(0o755)

    def first_refresh() -> dict[str, Any]:
        index = FileIndex(pub)
        index.refresh()
        return index.entries()

    known = _as_server_user(first_refresh)
    assert sorted(known) == ["a.txt", "b.txt", "sub/d.txt"]
    (pub / "a.txt").write_bytes(b"two, a new version")
    (pub / "a.txt").chmod(0o000)
    (pub / "sub").chmod(0o000)
    (pub / "b.txt").unlink()  # really deleted: that one goes

    def refresh_as_server() -> tuple[Any, ...]:
        index = FileIndex(pub)
        for entry in known.values():
            index.record(entry)
        delta = index.refresh()
        return (
            delta.removed,
            index.unreadable(),
            index.held("a.txt"),
            index.held("sub/d.txt"),
            index.held("b.txt"),
            sorted(index.entries()),
            index.update("a.txt", rehash=True) == known["a.txt"],
        )

    removed, unreadable, held_a, held_d, held_b, names, kept = _as_server_user(refresh_as_server)
    assert removed == ("b.txt",)
    assert set(unreadable) == {"a.txt", "sub/"} and held_a and held_d and not held_b
    assert names == ["a.txt", "sub/d.txt"] and kept  # the last readable versions stay
    (pub / "a.txt").chmod(0o644)
    (pub / "sub").chmod(0o755)

    def readable_again() -> tuple[Any, ...]:
        index = FileIndex(pub)
        for entry in known.values():
            index.record(entry)
        delta = index.refresh()
        return sorted(e.name for e in delta.changed), index.unreadable()

    changed, unreadable = _as_server_user(readable_again)
    assert changed == ["a.txt"] and unreadable == {}


def test_walk_reports_an_unlistable_folder_and_reconcile_keeps_its_files(
    shared_dir: Path,
) -> None:
    pub = shared_dir / "pub"
    write_tree(pub, {"a.txt": b"a", "sub/d.txt": b"d", "sub/deeper/e.txt": b"e"})
    for path in (pub, pub / "sub", pub / "sub" / "deeper"):
        path.chmod(0o755)
    known = stamp_tree(pub)
    (pub / "sub").chmod(0o000)

    def walk() -> tuple[Any, ...]:
        unreadable: set[str] = set()
        current = stamp_tree(pub, unreadable=unreadable)
        return current, unreadable

    current, unreadable = _as_server_user(walk)
    assert sorted(current) == ["a.txt"] and unreadable == {"sub"}
    assert reconcile("/", known, current, held=unreadable) == []
    blind = reconcile("/", known, current)  # what a consumer not told about it would do
    assert sorted(e.relpath for e in blind) == ["sub/d.txt", "sub/deeper/e.txt"]
