"""Resuming big files: partial files proven before they are kept, and real interruptions.

Unit part: ``PartialStore`` on real files (a partial left by a real ``Mirror``), every
way a partial file or its journal can be wrong.  End to end: a ``filemq sync`` process
killed with -9 in the middle of a file, the server's file changed meanwhile (in the
open, and behind the server's back), a write that fails ("disk full": a file size
limit), the server restarted under a running mirror.  Re-sent bytes are counted by the
server (``FileServer.sent_bytes``) and bounded by what the protocol allows: the credit
in flight plus one checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncClient, SyncResult
from filemq.engine import FilemqError
from filemq.index import FileIndex
from filemq.mirror import PARTIAL_PREFIX, Mirror
from filemq.partial import CHECKPOINT_BYTES, MAX_PARTIALS, PartialStore, ResumePoint
from filemq.server import FileServer, Mount
from filemq.writer import MAX_PENDING

from .conftest import read_tree

Serve = Callable[..., FileServer]
Sync = Callable[..., SyncResult]
MiB = 1 << 20
WAIT = 30.0


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def version(data: bytes) -> dict[str, str]:
    return {"sha1": sha1(data), "size": str(len(data)), "mtime_ns": "1000"}


def interrupted(dest: Path, name: str, content: bytes, upto: int, piece: int = 1 << 16) -> str:
    """What a transfer of ``content`` stopped after ``upto`` bytes leaves in ``dest``
    (written by a real Mirror); the partial file's name."""
    dest.mkdir(parents=True, exist_ok=True)
    mirror = Mirror(dest, FileIndex(dest), resume_min=1)
    parts = tuple(name.split("/"))
    mirror.begin(parts, str(dest / name), version(content))
    for at in range(0, upto, piece):
        mirror.write(content[at : min(at + piece, upto)])
    mirror.abort()
    return mirror.partials.data_name(name)


def store(dest: Path) -> PartialStore:
    return PartialStore(dest, PARTIAL_PREFIX)


def partials(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.iterdir() if p.name.startswith(PARTIAL_PREFIX))


@pytest.fixture(scope="module")
def content() -> bytes:
    return os.urandom(5 * MiB + 12345)


# -- proving partial files ------------------------------------------------------------------


def test_partial_file_is_proven_up_to_its_last_checkpoint(tmp_path: Path, content: bytes) -> None:
    data = interrupted(tmp_path, "sub/big.bin", content, 3 * MiB + 70_000)
    assert partials(tmp_path) == [data, data + ".journal"]
    points = store(tmp_path).scan()
    assert points == [ResumePoint("sub/big.bin", 3 * MiB, sha1(content))]
    assert (tmp_path / data).read_bytes() == content[: 3 * MiB]  # unproven tail cut


@pytest.mark.parametrize(
    ("where", "proven"),
    [(100, 0), (CHECKPOINT_BYTES + 5, CHECKPOINT_BYTES), (3 * MiB - 1, 2 * MiB)],
)
def test_tampered_partial_file_keeps_only_what_still_matches(
    tmp_path: Path, content: bytes, where: int, proven: int
) -> None:
    data = interrupted(tmp_path, "big.bin", content, 3 * MiB + 70_000)
    with open(tmp_path / data, "r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0xFF]))
    points = store(tmp_path).scan()
    if proven:
        assert points == [ResumePoint("big.bin", proven, sha1(content))]
        assert (tmp_path / data).read_bytes() == content[:proven]
    else:
        assert points == [] and partials(tmp_path) == []  # nothing proven: both gone


def test_truncated_partial_file_resumes_from_an_earlier_checkpoint(
    tmp_path: Path, content: bytes
) -> None:
    data = interrupted(tmp_path, "big.bin", content, 4 * MiB)
    os.truncate(tmp_path / data, 2 * MiB + 10)
    s = store(tmp_path)
    assert s.scan() == [ResumePoint("big.bin", 2 * MiB, sha1(content))]
    # the journal was cut after the proven checkpoint: new checkpoints append cleanly
    assert (tmp_path / (data + ".journal")).read_text().count("\n") == 3


@pytest.mark.parametrize(
    "journal",
    [
        b"",
        os.urandom(300),
        b"filemq-partial 2 " + b"a" * 40 + b" 10 0 big.bin\n1 " + b"a" * 40 + b"\n",
        b"filemq-partial 1 " + b"a" * 40 + b" 10 0 ../big.bin\n",
        b"filemq-partial 1 " + b"a" * 40 + b" 10 0 other.bin\n",  # not the name of its key
        b"filemq-partial 1 nothex 10 0 big.bin\n",
    ],
    ids=["empty", "random", "version-2", "dotdot", "other-name", "bad-sha1"],
)
def test_garbage_journal_drops_the_partial_file(
    tmp_path: Path, content: bytes, journal: bytes
) -> None:
    data = interrupted(tmp_path, "big.bin", content, 3 * MiB)
    (tmp_path / (data + ".journal")).write_bytes(journal)
    assert store(tmp_path).scan() == []
    assert partials(tmp_path) == []


def test_torn_last_checkpoint_line_is_ignored(tmp_path: Path, content: bytes) -> None:
    data = interrupted(tmp_path, "big.bin", content, 3 * MiB)
    with open(tmp_path / (data + ".journal"), "ab") as f:
        f.write(b"4194304 " + sha1(content[: 4 * MiB]).encode()[:17])  # killed mid-line
    assert store(tmp_path).scan() == [ResumePoint("big.bin", 3 * MiB, sha1(content))]


def test_orphans_go(tmp_path: Path, content: bytes) -> None:
    one = interrupted(tmp_path, "one", content, 2 * MiB)
    two = interrupted(tmp_path, "two", content, 2 * MiB)
    (tmp_path / (one + ".journal")).unlink()  # data without journal
    (tmp_path / two).unlink()  # journal without data
    assert store(tmp_path).scan() == []
    assert partials(tmp_path) == []


def test_planted_link_or_fifo_is_never_followed_nor_waited_on(
    tmp_path: Path, content: bytes
) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.write_bytes(content[: 2 * MiB])
    data = interrupted(dest, "big.bin", content, 2 * MiB)
    (dest / data).unlink()
    (dest / data).symlink_to(outside)  # a link where the partial file was
    fifo = interrupted(dest, "other", content, 2 * MiB)
    (dest / fifo).unlink()
    os.mkfifo(dest / fifo)
    journal = interrupted(dest, "third", content, 2 * MiB) + ".journal"
    (outside.parent / "journal").write_bytes((dest / journal).read_bytes())
    (dest / journal).unlink()
    (dest / journal).symlink_to(outside.parent / "journal")  # a link for a journal
    assert store(dest).scan() == []
    assert partials(dest) == [] and outside.read_bytes() == content[: 2 * MiB]
    assert (outside.parent / "journal").read_bytes().startswith(b"filemq-partial 1 ")


def test_at_most_max_partials_are_kept(tmp_path: Path, content: bytes) -> None:
    for i in range(MAX_PARTIALS + 2):
        interrupted(tmp_path, f"f{i}", content, 2 * MiB)
    assert len(store(tmp_path).scan()) == MAX_PARTIALS
    assert len(partials(tmp_path)) == 2 * MAX_PARTIALS


def test_a_new_partial_file_makes_room_within_the_limit(tmp_path: Path, content: bytes) -> None:
    for i in range(MAX_PARTIALS):
        interrupted(tmp_path, f"f{i}", content, 2 * MiB)
    mirror = Mirror(tmp_path, FileIndex(tmp_path), resume_min=1)
    assert len(mirror.resume_points()) == MAX_PARTIALS
    mirror.begin(("new",), str(tmp_path / "new"), version(content))
    mirror.write(content[:MiB])
    mirror.abort()
    assert len(partials(tmp_path)) == 2 * MAX_PARTIALS  # the oldest made room
    assert len(mirror.resume_points()) == MAX_PARTIALS


def test_resumed_partial_completes_and_another_version_is_refused(
    tmp_path: Path, content: bytes
) -> None:
    interrupted(tmp_path, "big.bin", content, 3 * MiB)
    mirror = Mirror(tmp_path, FileIndex(tmp_path), resume_min=1)
    [point] = mirror.resume_points()
    other = version(b"another version")
    assert mirror.resume(("big.bin",), str(tmp_path / "big.bin"), point.offset, other)
    assert partials(tmp_path) == []  # not that version: dropped
    interrupted(tmp_path, "big.bin", content, 3 * MiB)
    [point] = mirror.resume_points()
    assert (
        mirror.resume(("big.bin",), str(tmp_path / "big.bin"), point.offset, version(content))
        == ""
    )
    mirror.write(content[point.offset :])
    assert mirror.finish(version(content)) == (True, "")
    assert read_tree(tmp_path) == {"big.bin": content}  # no journal left either


def test_a_partial_file_that_fails_the_final_sha1_goes(tmp_path: Path, content: bytes) -> None:
    interrupted(tmp_path, "big.bin", content, 3 * MiB)
    mirror = Mirror(tmp_path, FileIndex(tmp_path), resume_min=1)
    [point] = mirror.resume_points()
    assert (
        mirror.resume(("big.bin",), str(tmp_path / "big.bin"), point.offset, version(content))
        == ""
    )
    mirror.write(b"\0" * (len(content) - point.offset))  # the server's file changed meanwhile
    ok, reason = mirror.finish(version(content))
    assert not ok and "SHA-1" in reason
    assert read_tree(tmp_path) == {}  # no Frankenstein file, no partial file


# -- end to end -------------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


def _sync_process(
    tmp_path: Path, endpoint: str, dest: Path, *extra: str, **popen: Any
) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "sync.log", "ab")  # noqa: SIM115 (closed with the process below)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "filemq", "sync", endpoint, str(dest), "--once", *extra],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=_env(tmp_path),
            **popen,
        )
    finally:
        log.close()


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@pytest.fixture
def big(tmp_path: Path) -> bytes:
    data = os.urandom(32 * MiB)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "big.bin").write_bytes(data)
    (tmp_path / "src" / "small.txt").write_bytes(b"small")
    return data


def _kill_at(proc: subprocess.Popen[bytes], partial: Path, at: int) -> int:
    """kill -9 ``proc`` once ``partial`` holds ``at`` bytes; what it held then."""
    _wait_for(lambda: _size(partial) >= at or proc.poll() is not None, "the partial file")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the sync ended before the kill"
    return _size(partial)


@pytest.mark.parametrize("direct_io", [False, True])  # (True: written around the page cache)
def test_kill_9_mid_file_resumes_from_the_bytes_received(
    tmp_path: Path, serve: Serve, sync_once: Sync, big: bytes, direct_io: bool
) -> None:
    server = serve(tmp_path / "src", chunk_size=64 << 10)
    dest = tmp_path / "dest"
    store_name = store(dest).data_name("big.bin")
    # capped so that the kill surely lands in the middle: 32 MiB at 8 MiB/s takes ~4 s
    direct = ["--direct-io"] if direct_io else []
    first = _sync_process(tmp_path, server.endpoint, dest, "--bwlimit", "8M", *direct)
    held = _kill_at(first, dest / store_name, len(big) // 2)
    assert not (dest / "big.bin").exists()
    index = tmp_path / "cache" / "index"
    result = sync_once(server.endpoint, dest, index_path=index, direct_io=direct_io)
    assert result.synced and result.errors == 0
    assert read_tree(dest) == {"big.bin": big, "small.txt": b"small"}  # no partial left
    assert CHECKPOINT_BYTES <= result.resumed_bytes <= held
    server.stop()
    resent = server.sent_bytes - len(big) - len(b"small")
    window = 4 * MiB  # the capped client's credit window (8 MiB/s x 0.5 s)
    assert 0 <= resent <= window + CHECKPOINT_BYTES + (64 << 10)


def test_server_file_changed_after_the_kill_is_fetched_from_zero(
    tmp_path: Path, serve: Serve, sync_once: Sync, big: bytes
) -> None:
    dest = tmp_path / "dest"
    interrupted(dest, "big.bin", big, 20 * MiB)
    changed = os.urandom(len(big))
    (tmp_path / "src" / "big.bin").write_bytes(changed)
    server = serve(tmp_path / "src")
    result = sync_once(server.endpoint, dest)
    assert result.synced and result.errors == 0 and result.resumed_bytes == 0
    assert read_tree(dest) == {"big.bin": changed, "small.txt": b"small"}
    server.stop()
    assert server.sent_bytes == len(big) + len(b"small")  # all of it, once


def test_a_change_behind_the_servers_back_never_makes_a_frankenstein_file(
    tmp_path: Path, serve: Serve, sync_once: Sync, big: bytes
) -> None:
    """The server's index still says the old version (same size, mtime and inode): it
    resumes, the whole-file SHA-1 fails, the partial file goes; DEST never shows a mix."""
    dest = tmp_path / "dest"
    interrupted(dest, "big.bin", big, 20 * MiB)
    source = tmp_path / "src" / "big.bin"
    server = serve(tmp_path / "src", indexes_live=True)  # (trusts an index nobody updates)
    st = source.stat()
    with open(source, "r+b") as f:  # rewritten in place, tail only, mtime put back
        f.seek(24 * MiB)
        f.write(os.urandom(MiB))
    os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = sync_once(server.endpoint, dest)
    assert result.resumed_bytes == 20 * MiB and result.refetched >= 1
    tree = read_tree(dest)
    assert "big.bin" not in tree or tree["big.bin"] == source.read_bytes()
    assert not partials(dest)
    if "big.bin" not in tree:
        assert result.errors >= 1  # the server kept naming a version it no longer has


@pytest.mark.parametrize("direct_io", [False, True])  # (True: written around the page cache)
def test_write_failure_keeps_the_partial_file_and_the_next_run_resumes(
    tmp_path: Path, serve: Serve, sync_once: Sync, big: bytes, direct_io: bool
) -> None:
    """A file size limit makes the write fail at 12 MiB, as a full disk would."""
    server = serve(tmp_path / "src", chunk_size=256 << 10)
    dest = tmp_path / "dest"
    limit = 12 * MiB

    def limited() -> None:  # (in the child, before exec)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    direct = ["--direct-io"] if direct_io else []
    proc = _sync_process(tmp_path, server.endpoint, dest, *direct, preexec_fn=limited)
    assert proc.wait(timeout=WAIT) == 1
    log = (tmp_path / "sync.log").read_text()
    assert "cannot write big.bin" in log, log
    assert not (dest / "big.bin").exists()
    [point] = store(dest).scan()
    assert 11 * MiB <= point.offset <= limit
    result = sync_once(server.endpoint, dest, direct_io=direct_io)
    assert result.synced and result.errors == 0 and result.resumed_bytes == point.offset
    assert read_tree(dest) == {"big.bin": big, "small.txt": b"small"}


@pytest.fixture
def run_in_thread() -> Iterator[Callable[[SyncClient], threading.Thread]]:
    clients: list[tuple[SyncClient, threading.Thread]] = []

    def start(client: SyncClient) -> threading.Thread:
        thread = threading.Thread(target=client.run, name="resume-test-client")
        thread.start()
        clients.append((client, thread))
        return thread

    yield start
    for client, thread in clients:
        client.stop()
        thread.join(10)


def test_server_restart_mid_file_resumes_in_the_same_run(
    tmp_path: Path, zctx: zmq.Context[Any], big: bytes, run_in_thread: Any
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    first = FileServer(zctx, [Mount(src, "/")], endpoint="tcp://127.0.0.1:*", chunk_size=64 << 10)
    first.start()
    endpoint = first.endpoint
    client = SyncClient(
        zctx, endpoint, dest, bwlimit=8 * MiB, timeout=2.0, heartbeat=0.2, max_retries=None
    )
    events: list[str] = []
    client.on_event = lambda e: events.append(str(e.kind))
    run_in_thread(client)
    partial = dest / store(dest).data_name("big.bin")
    try:
        _wait_for(lambda: _size(partial) >= len(big) // 2, "half the file")
    finally:
        first.stop()
    second = FileServer(zctx, [Mount(src, "/")], endpoint=endpoint, chunk_size=64 << 10)

    def restarted() -> bool:  # (libzmq frees the port a moment after the first stopped)
        try:
            second.start()
        except FilemqError:
            return False
        return True

    _wait_for(restarted, "the port to be free again")
    try:
        _wait_for(lambda: (dest / "big.bin").exists(), "the file")
        assert (dest / "big.bin").read_bytes() == big
        assert client.result.resumed_bytes >= len(big) // 2 - 4 * MiB
    finally:
        client.stop()
        second.stop()
    assert "disconnected" in events
    assert second.sent_bytes <= len(big) - client.result.resumed_bytes + len(b"small")


@pytest.mark.slow
def test_one_gib_killed_at_half_resends_under_five_percent(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    """Issue 13's measure: a 1 GiB file, ``filemq sync`` killed -9 at ~50%, then resumed;
    bytes sent twice < 5% of the file (the credit window in flight, 16 MiB, and one
    checkpoint: ~1.3%).  Uncapped, default chunk and window."""
    size = 1 << 30
    src = tmp_path / "src"
    src.mkdir()
    digest = hashlib.sha1()
    with open(src / "big.bin", "wb") as f:
        for _ in range(size // (64 * MiB)):
            block = os.urandom(64 * MiB)
            digest.update(block)
            f.write(block)
    server = serve(src)
    dest = tmp_path / "dest"
    first = _sync_process(tmp_path, server.endpoint, dest)
    held = _kill_at(first, dest / store(dest).data_name("big.bin"), size // 2)
    assert held < size
    result = sync_once(server.endpoint, dest, connect_timeout=30, idle_timeout=30)
    assert result.synced and result.errors == 0
    # the kill came when the partial file held half; its last checkpoint covers what was
    # hashed, which trails what was written by at most the writer's queue (the SHA-1 has
    # a thread of its own: filemq.writer) and one checkpoint
    assert result.resumed_bytes >= size // 2 - CHECKPOINT_BYTES - MAX_PENDING
    check = hashlib.sha1()
    with open(dest / "big.bin", "rb") as f:
        while block := f.read(64 * MiB):
            check.update(block)
    assert check.hexdigest() == digest.hexdigest()
    assert partials(dest) == []
    server.stop()
    resent = server.sent_bytes - size
    assert 0 <= resent < size * 0.05
