"""The pipelined transfer: chunks written and hashed off the receive loop
(``filemq.writer``), and what a hostile client can make the server hold.

Adversaries: a client that grants huge credit and stops reading (the server's memory
for it is bounded by its pipe's high-water mark, not by the credit); a disk that
refuses a write in the middle of a pipelined file (the error surfaces, nothing
queued after it is written, the file is never taken as complete: the end-to-end
"disk full" run is ``test_resume``'s file-size-limit test); a disk slower than the
wire (the writer's queue is bounded: the receive loop waits).
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg, fmq_msg_czmq
from filemq.client import SyncClient, SyncError, SyncResult
from filemq.server import SEND_QUEUE_BYTES, FileServer
from filemq.stagedwriter import StagedWriter
from filemq.writer import ChunkWriter
from tests.polling import wait_until

from .conftest import read_tree, write_tree
from .procs import read_endpoint
from .test_resume import _sync_process, store

Serve = Callable[..., FileServer]
Sync = Callable[..., SyncResult]
MiB = 1 << 20


# -- the server: a client that grants huge credit and never reads ------------------------


def test_huge_credit_and_no_reading_holds_bounded_server_memory(
    tmp_path: Path, serve: Serve, sync_once: Sync, zctx: zmq.Context[Any]
) -> None:
    src = tmp_path / "src"
    size = 48 * MiB  # more than a pipe of 1000 (libzmq's default) 64 KiB chunks holds
    write_tree(src, {"big.bin": os.urandom(size)})
    server = serve(src, chunk_size=64 << 10)
    hostile = zctx.socket(zmq.DEALER)
    hostile.linger = 0
    hostile.rcvhwm = 1
    hostile.rcvbuf = 64 << 10
    hostile.connect(server.endpoint)
    try:
        hostile.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
        assert hostile.poll(10_000)
        assert isinstance(fmq_msg.decode(hostile.recv_multipart()), fmq_msg.OhaiOk)
        hostile.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})))
        hostile.send_multipart(fmq_msg.encode(fmq_msg.Nom(1 << 62, 0)))  # then reads nothing

        def sent() -> int:
            return sum(s.sent_bytes for s in server.stats().subscribers)

        # the server parks it once its pipe is full (or, unbounded, sends it everything)
        assert wait_until(lambda: bool(server._stalled) or sent() >= size, timeout=30)
        # pipe (the bound) + the kernel's socket buffers on both sides (a few MiB)
        assert sent() <= SEND_QUEUE_BYTES + 16 * MiB < size
        # and the others are served meanwhile
        write_tree(tmp_path / "other", {})
        result = sync_once(server.endpoint, tmp_path / "good", connect_timeout=30.0)
        assert result.synced and read_tree(tmp_path / "good") == read_tree(src)
    finally:
        hostile.close()


# -- the writer ------------------------------------------------------------------------

#: The mirror's writer (``StagedWriter``, through the page cache) and the two-thread one.
WRITERS = [StagedWriter, ChunkWriter]


@pytest.mark.parametrize("make", WRITERS)
def test_chunks_are_written_and_hashed_in_order(tmp_path: Path, make: Any) -> None:
    chunks = [os.urandom(n) for n in (1, 70_000, 1 << 20, 3, 0, 500_000)]
    with open(tmp_path / "f", "wb") as f:
        writer = make(f.fileno(), hashlib.sha1(), max_pending=100_000)
        for chunk in chunks:
            writer.write(chunk)
        writer.settle()
        writer.close()
    whole = b"".join(chunks)
    assert (tmp_path / "f").read_bytes() == whole
    assert writer.hasher.hexdigest() == hashlib.sha1(whole).hexdigest()
    assert writer.size == len(whole)


@pytest.mark.parametrize("make", WRITERS)
def test_a_failed_write_surfaces_and_nothing_after_it_is_written(
    tmp_path: Path, make: Any
) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails (EPIPE): a disk that refuses
    writer = make(write_end, hashlib.sha1(), direct=False)
    try:
        writer.write(b"a" * 1000)
        with pytest.raises(OSError):
            writer.settle()
        with pytest.raises(OSError):  # and stays failed
            writer.write(b"b")
        assert writer.size == 0  # nothing counted as written
    finally:
        writer.discard()
        os.close(write_end)


@pytest.mark.parametrize("make", WRITERS)
def test_a_slow_disk_holds_the_receiver_not_memory(tmp_path: Path, make: Any) -> None:
    read_end, write_end = os.pipe()  # a "disk" that takes nothing until read
    writer = make(write_end, hashlib.sha1(), max_pending=1 * MiB, direct=False)
    chunks = [os.urandom(600 << 10) for _ in range(3)]
    returned: list[int] = []

    def receive() -> None:
        for i, chunk in enumerate(chunks):
            writer.write(chunk)
            returned.append(i)

    thread = threading.Thread(target=receive)
    thread.start()
    try:
        assert wait_until(lambda: len(returned) == 2)
        thread.join(0.3)  # the third must wait: 1.2 MiB queued, over the bound
        assert returned == [0, 1] and thread.is_alive()
        got = bytearray()
        while len(got) < 3 * (600 << 10):
            got += os.read(read_end, 1 << 20)
        thread.join(10)
        writer.settle()
        assert bytes(got) == b"".join(chunks) and returned == [0, 1, 2]
    finally:
        writer.close()
        thread.join(10)
        os.close(read_end)
        os.close(write_end)


def test_disk_full_during_pipelined_writes_is_one_clear_error_and_no_file(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    """A file too small to be resumable, whose write fails half-way (a file size limit,
    as a full disk): the run ends with an error naming it, DEST holds neither the file
    nor a temp file, and the next run (no limit) completes it."""
    content = os.urandom(6 * MiB)
    write_tree(tmp_path / "src", {"f.bin": content, "small.txt": b"small"})
    server = serve(tmp_path / "src", chunk_size=256 << 10)
    dest = tmp_path / "dest"
    limit = 2 * MiB

    def limited() -> None:  # (in the child, before exec)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _sync_process(tmp_path, server.endpoint, dest, preexec_fn=limited)
    assert proc.wait(timeout=60) == 1
    log = (tmp_path / "sync.log").read_text()
    assert "cannot write f.bin" in log and "Traceback" not in log, log
    assert sorted(p.name for p in dest.iterdir() if not p.name.endswith("lock")) in (
        [],
        ["small.txt"],
    )
    result = sync_once(server.endpoint, dest)
    assert result.synced and result.errors == 0
    assert read_tree(dest) == {"f.bin": content, "small.txt": b"small"}


# -- zero-copy chunks: a big CHEEZBURGER is decoded in place ---------------------------


def _cheezburger(chunk: bytes, name: str = "dir/big.bin") -> bytes:
    msg = fmq_msg.Cheezburger(7, 1, name, 1 << 20, 0, {"sha1": "ab" * 20}, chunk)
    (frame,) = fmq_msg.encode(msg)
    return frame


@pytest.mark.parametrize("codec", ["fmq_msg", "fmq_msg_czmq"])
def test_a_big_chunk_is_a_view_of_the_received_frame_not_a_copy(codec: str) -> None:
    module: Any = fmq_msg if codec == "fmq_msg" else fmq_msg_czmq
    chunk = os.urandom(256 << 10)
    (encoded,) = module.encode(module.Cheezburger(7, 1, "dir/big.bin", 99, 0, {"k": "v"}, chunk))
    frame = bytearray(encoded)  # what a zero-copy receive hands over: not bytes
    msg = module.decode([frame])
    assert isinstance(msg, module.Cheezburger)
    assert (msg.filename, msg.offset, msg.headers, bytes(msg.chunk)) == (
        "dir/big.bin",
        99,
        {"k": "v"},
        chunk,
    )
    frame[-1] ^= 0xFF  # the chunk shares the frame's memory: no copy was made
    assert msg.chunk[-1] == chunk[-1] ^ 0xFF
    # a zmq.Frame (what recv_multipart(copy=False) gives) decodes the same way
    assert bytes(module.decode([zmq.Frame(encoded)]).chunk) == chunk


def test_small_frames_and_other_messages_decode_to_bytes() -> None:
    small = fmq_msg.decode([bytearray(_cheezburger(b"x" * 100))])
    assert type(small.chunk) is bytes and small.chunk == b"x" * 100
    big_other = fmq_msg.Icanhaz("/" + "p" * 200, {"k" * 200: "v" * 70_000}, {})
    (frame,) = fmq_msg.encode(big_other)
    assert fmq_msg.decode([bytearray(frame)]) == big_other


def test_a_malformed_big_frame_in_place_is_a_decode_error() -> None:
    frame = bytearray(_cheezburger(os.urandom(100 << 10)))
    for broken in (frame[:-1], frame + b"\0", frame[:20] + frame[24:]):
        with pytest.raises(fmq_msg.DecodeError):
            fmq_msg.decode([broken])
    bad_name = bytearray(_cheezburger(os.urandom(100 << 10), name="ab"))
    bad_name[13:15] = b"\xff\xfe"  # the filename (1-octet length at 12) is not UTF-8
    with pytest.raises(fmq_msg.DecodeError):
        fmq_msg.decode([bad_name])


def test_server_killed_mid_file_puts_nothing_half_written_in_place(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    """The zero-copy path end to end (256 KiB chunks: views on both sides, writes on the
    writer thread): a server killed -9 in the middle of a file leaves no DEST file, and
    the partial file it leaves holds only bytes of the source, from its start."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    data = os.urandom(32 * MiB)
    write_tree(src, {"big.bin": data})
    cmd = [sys.executable, "-m", "filemq", "-q", "serve", "--bind", "tcp://127.0.0.1:*"]
    cmd += ["--publish", str(src), "--no-state", "--no-watch", "--chunk-size", str(256 << 10)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    client: SyncClient | None = None
    thread: threading.Thread | None = None
    try:
        assert server.stderr is not None
        endpoint = read_endpoint(server.stderr)
        assert endpoint, "filemq serve did not start"
        # capped so that the kill lands in the middle: 32 MiB at 8 MiB/s takes ~4 s
        client = SyncClient(
            zctx,
            endpoint,
            dest,
            once=True,
            bwlimit=8 * MiB,
            timeout=1.0,  # (the dead server is noticed within a second)
            heartbeat=0.2,
            connect_timeout=10.0,
            max_retries=0,  # (then the run ends: no reconnect to wait for)
        )
        failures: list[Exception] = []

        def run(client: SyncClient = client) -> None:
            try:
                client.run()
            except SyncError as exc:  # (what the run ends with: the server is gone)
                failures.append(exc)

        thread = threading.Thread(target=run, name="killed-server-client")
        thread.start()
        partial = dest / store(dest).data_name("big.bin")

        def held() -> int:
            try:
                return partial.stat().st_size
            except FileNotFoundError:
                return 0

        assert wait_until(lambda: held() >= 8 * MiB or not thread.is_alive(), timeout=60)
        assert thread.is_alive(), "the client ended before the server was killed"
        server.send_signal(signal.SIGKILL)
        server.wait()
        thread.join(60)
        assert not thread.is_alive(), "the client did not give up on the dead server"
        assert failures and not client.result.synced
        assert not (dest / "big.bin").exists()  # nothing half-written put in place
        kept = partial.read_bytes() if partial.exists() else b""
        assert data.startswith(kept)  # a partial file holds the source's first bytes only
    finally:
        if client is not None:
            client.stop()
        if thread is not None:
            thread.join(30)
        if server.poll() is None:
            server.kill()
            server.wait()
        if server.stderr is not None:
            server.stderr.close()


# -- small files in bursts: either side killed -9 in the middle ---------------------------


def _small_tree(count: int) -> dict[str, bytes]:
    """``count`` files of 10 KiB in 10 folders (each message of a burst is a whole file)."""
    return {f"d{i % 10}/f{i:04d}.bin": os.urandom(10 << 10) for i in range(count)}


def _serve_process(src: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "filemq", "-q", "serve", "--bind", "tcp://127.0.0.1:*"]
    cmd += ["--publish", str(src), "--no-state", "--no-watch"]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    endpoint = read_endpoint(server.stderr)
    if not endpoint:
        server.kill()
        server.wait()
        server.stderr.close()
        pytest.fail("filemq serve did not start")
    return server, endpoint


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _placed(dest: Path) -> dict[str, bytes]:
    """The files DEST shows under their own names (temp files of the mirror left out;
    read once the mirror stopped)."""
    return {name: data for name, data in read_tree(dest).items() if ".filemq-part-" not in name}


def _count_placed(dest: Path) -> int:
    """How many files DEST shows under their own names now (read while the mirror runs)."""
    return sum(
        not name.startswith(".filemq-part-")
        for _dir, _subs, names in os.walk(dest)
        for name in names
    )


def test_server_killed_mid_burst_of_small_files_puts_nothing_partial_in_place(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    """Small files go out many per round trip (a pump's messages sent back to back): a
    server killed -9 in the middle of such a burst leaves DEST holding only whole files,
    each the source's bytes, and the next sync (a new server) makes DEST exact."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = _small_tree(400)  # 4 MiB
    write_tree(src, tree)
    server, endpoint = _serve_process(src)
    thread: threading.Thread | None = None
    client: SyncClient | None = None
    try:
        client = SyncClient(
            zctx,
            endpoint,
            dest,
            once=True,
            bwlimit=1 * MiB,  # (~4 s in all: the kill lands in the middle of the files)
            timeout=1.0,
            heartbeat=0.2,
            max_retries=0,
        )
        failures: list[Exception] = []

        def run(client: SyncClient = client) -> None:
            try:
                client.run()
            except SyncError as exc:
                failures.append(exc)

        thread = threading.Thread(target=run, name="burst-killed-server-client")
        thread.start()
        assert wait_until(lambda: _count_placed(dest) >= 50 or not thread.is_alive(), timeout=60)
        assert thread.is_alive(), "the client ended before the server was killed"
        server.send_signal(signal.SIGKILL)
        server.wait()
        thread.join(60)
        assert not thread.is_alive(), "the client did not give up on the dead server"
        assert failures and not client.result.synced
        placed = _placed(dest)
        assert 50 <= len(placed) < len(tree)  # killed in the middle of the files
        assert all(tree[name] == data for name, data in placed.items())  # each one whole
    finally:
        if client is not None:
            client.stop()
        if thread is not None:
            thread.join(30)
        _stop(server)
    server, endpoint = _serve_process(src)
    try:
        again = SyncClient(zctx, endpoint, dest, once=True, max_retries=0)
        assert again.run().synced
    finally:
        _stop(server)
    assert read_tree(dest) == tree  # complete, and no temp file left anywhere


def test_client_killed_mid_burst_of_small_files_resumes_exact(tmp_path: Path) -> None:
    """A ``filemq sync`` killed -9 in the middle of a burst of small files: what it put
    in DEST is whole, and the next run leaves DEST exact (its temp files gone)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = _small_tree(400)
    write_tree(src, tree)
    server, endpoint = _serve_process(src)
    try:
        sync = _sync_process(tmp_path, endpoint, dest, "--bwlimit", str(1 * MiB), "--no-index")
        try:
            assert wait_until(lambda: _count_placed(dest) >= 50 or sync.poll() is not None, 60)
            assert sync.poll() is None, "the mirror ended before it was killed"
        finally:
            _stop(sync)  # (SIGKILL)
        placed = _placed(dest)
        assert 50 <= len(placed) < len(tree)
        assert all(tree[name] == data for name, data in placed.items())
        again = _sync_process(tmp_path, endpoint, dest, "--no-index")
        try:
            assert again.wait(120) == 0
        finally:
            _stop(again)
    finally:
        _stop(server)
    assert read_tree(dest) == tree
