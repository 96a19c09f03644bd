"""Big chunks read straight into their frame (``ServerSession.chunk_buffer`` /
``chunk_filled``) and the frames used again once libzmq has sent them
(``filemq.framepool``).

The buffer path must send exactly what ``chunk_frames`` sends (octets and session
state: sequence, credit, offset, counts), on both wires, for the first, middle and last
chunks, and fall back to it on a short read (a file that shrank: the file ends early).
The pool must never hand out a frame libzmq still holds (a peer that stops reading holds
its frames; checked with real sockets and real trackers), and two clients served from
one server at once over real sockets receive every file exactly.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncResult
from filemq.engine import Operation, load_wire
from filemq.engine_server import ChunkPlan, FileOp, ServerSession
from filemq.framepool import FramePool
from filemq.server import FileServer
from tests.polling import wait_until

from .conftest import read_tree, write_tree
from .reference_client import ReferenceLikeClient

KiB = 1 << 10


def _ready(wire: str, chunk_size: int, credit: int) -> ServerSession:
    codec = load_wire(wire).codec
    s = ServerSession(load_wire(wire), b"c1", 0.0, chunk_size=chunk_size)
    s.receive(codec.encode(codec.Ohai()), 0.0)
    s.enqueue(
        [FileOp("/dir/big.bin", Operation.CREATE, "big", 300 * KiB, 77, "ab" * 20, mode=0o640)]
    )
    s.receive(codec.encode(codec.Nom(credit, 0)), 0.0)
    return s


def _state(s: ServerSession) -> tuple[int, int, int, int, int]:
    return (s.credit, s.sent_messages, s.sent_bytes, s.sent_files, s.queued)


def _send_all(
    s: ServerSession, content: bytes, build: Callable[[ServerSession, ChunkPlan, bytes], Any]
) -> list[bytes]:
    out: list[bytes] = []
    while (plan := s.next_chunk()) is not None:
        out += [bytes(f) for f in build(s, plan, content[plan.offset : plan.offset + plan.size])]
    return out


def _by_copy(s: ServerSession, plan: ChunkPlan, data: bytes) -> Any:
    return s.chunk_frames(plan, data)


def _by_buffer(s: ServerSession, plan: ChunkPlan, data: bytes) -> Any:
    if plan.size == 0:  # (the czmq wire's closing empty chunk: nothing to read)
        return s.chunk_frames(plan, b"")
    buffer = s.chunk_buffer(plan)
    buffer.data[: len(data)] = data
    return s.chunk_filled(plan, buffer, len(data))


@pytest.mark.parametrize("wire", ["spec", "czmq"])
@pytest.mark.parametrize(
    ("credit", "short"), [(1 << 30, 300 * KiB), (250 * KiB, 300 * KiB), (1 << 30, 150 * KiB)]
)
def test_the_buffer_path_sends_what_chunk_frames_sends(wire: str, credit: int, short: int) -> None:
    """``short`` < the file's size: the source shrank after it was indexed (a short read
    ends the file early, as ``chunk_frames`` ends it)."""
    content = os.urandom(short)
    a, b = _ready(wire, 64 * KiB, credit), _ready(wire, 64 * KiB, credit)
    by_copy = _send_all(a, content, _by_copy)
    by_buffer = _send_all(b, content, _by_buffer)
    assert by_buffer == by_copy
    assert _state(b) == _state(a)
    codec: Any = load_wire(wire).codec
    decoded = [codec.decode([f]) for f in by_buffer]
    assert (
        b"".join(bytes(m.chunk) for m in decoded) == content[: sum(len(m.chunk) for m in decoded)]
    )
    assert decoded[0].headers["sha1"] == "ab" * 20 and decoded[0].headers["mode"]


def test_a_frame_from_alloc_is_written_whole() -> None:
    """A frame used again holds the last chunk's bytes: the head and the read cover it all."""
    s = _ready("spec", 64 * KiB, 1 << 30)
    s.next_chunk()
    plan = s.next_chunk()
    assert plan is not None
    dirty: list[bytearray] = []

    def alloc(n: int) -> bytearray:
        dirty.append(bytearray(b"\xee" * n))
        return dirty[-1]

    buffer = s.chunk_buffer(plan, alloc)
    buffer.data[:] = b"\x01" * plan.size
    [frame] = s.chunk_filled(plan, buffer, plan.size)
    assert frame is dirty[0]
    msg = fmq_msg.decode([bytes(frame)])
    assert isinstance(msg, fmq_msg.Cheezburger) and bytes(msg.chunk) == b"\x01" * plan.size


def test_a_plan_that_is_not_the_current_one_is_refused() -> None:
    s = _ready("spec", 64 * KiB, 1 << 30)
    plan = s.next_chunk()
    assert plan is not None
    stale = ChunkPlan(plan.op, plan.offset + 1, plan.size, plan.first, plan.eof)
    with pytest.raises(ValueError):
        s.chunk_buffer(stale)
    buffer = s.chunk_buffer(plan)
    s.chunk_filled(plan, buffer, plan.size)
    with pytest.raises(ValueError):  # (advanced: the same plan again is stale)
        s.chunk_filled(plan, s.chunk_buffer(s.next_chunk() or plan), plan.size)


# -- the pool, with real sockets and trackers -------------------------------------------


def test_a_frame_libzmq_still_holds_is_never_handed_out(zctx: zmq.Context[Any]) -> None:
    """A reader that stops reading: frames pile up in libzmq until the sender gets EAGAIN.
    Every frame handed out meanwhile is one whose send is done, and every message read
    afterwards holds what was written before its own send (never a later chunk's)."""
    pull = zctx.socket(zmq.PULL)
    push = zctx.socket(zmq.PUSH)
    pull.rcvhwm = push.sndhwm = 1
    pull.linger = push.linger = 0
    try:
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push.connect(f"tcp://127.0.0.1:{port}")
        push.send(b"hello")
        assert pull.recv() == b"hello"  # (connected: sends queue from here on)
        pool = FramePool(keep=4)
        size = 256 * KiB
        lent: list[tuple[bytearray, Any]] = []
        sent = 0
        while sent < 400:
            frame = pool.take(size)
            for held, tracker in lent:
                assert frame is not held or tracker.done, "a frame in flight was handed out"
            frame[:] = sent.to_bytes(4, "big") * (size // 4)
            if not push.poll(500, zmq.POLLOUT):  # (the pipes and kernel buffers are full)
                break
            tracker = push.send(frame, zmq.NOBLOCK, copy=False, track=True)
            pool.lent(frame, tracker)
            lent.append((frame, tracker))
            sent += 1
        assert 2 <= sent < 400  # (the reader's stop held frames in flight)
        assert not all(tracker.done for _frame, tracker in lent)
        for i in range(sent):
            assert pull.recv() == i.to_bytes(4, "big") * (size // 4)
        assert wait_until(lambda: pool.take(1) is not None and pool.in_flight == 0, timeout=30)
        reused = pool.take(size)
        assert any(reused is held for held, _tracker in lent)  # all done: handed out again
        assert len(pool.take(size + 1)) == size + 1  # (another size: a new frame)
    finally:
        push.close()
        pull.close()


class _Flag:
    def __init__(self, done: bool) -> None:
        self.done = done


def test_the_pool_keeps_at_most_keep_frames_and_a_stuck_one_blocks_no_other() -> None:
    pool = FramePool(keep=2)
    stuck = pool.take(10)
    pool.lent(stuck, _Flag(False))  # (a client that stopped reading)
    frames = [pool.take(10) for _ in range(3)]
    for f in frames:
        pool.lent(f, _Flag(True))
    got = [pool.take(10) for _ in range(3)]
    assert sum(any(g is f for f in frames) for g in got) == 2  # two kept, the third new
    assert all(g is not stuck for g in got) and pool.in_flight == 1


# -- end to end -----------------------------------------------------------------------


def test_two_clients_at_once_get_every_big_file_exactly(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
) -> None:
    tree = {f"d/big{i}.bin": os.urandom((3 << 20) + i * 4099) for i in range(3)}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", chunk_size=128 * KiB)
    results: dict[str, SyncResult] = {}

    def run(name: str) -> None:
        results[name] = sync_once(server.endpoint, tmp_path / name)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    for name in ("one", "two"):
        assert results[name].synced
        assert read_tree(tmp_path / name) == tree


def test_big_chunks_on_the_czmq_wire_reach_a_reference_like_client_byte_exact(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """The buffer path on the C reference's wire (longstr names, every data chunk eof=0,
    then the empty closing chunk): files of whole chunks, a ragged tail, one below a chunk."""
    chunk = 128 * KiB
    sizes = {"whole.bin": 4 * chunk, "ragged.bin": 3 * chunk + 7, "d/one.bin": chunk - 1}
    tree = {name: os.urandom(size) for name, size in sizes.items()}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", wire="czmq", chunk_size=chunk)
    client = ReferenceLikeClient(zctx, server.endpoint, tmp_path / "inbox")
    try:
        client.subscribe("/", resync=True)
        assert client.pump(lambda: bool(client.skipped))  # up to the resync marker
        assert sorted(client.delivered) == sorted(tree)  # each file closed once
        assert read_tree(tmp_path / "inbox") == tree
    finally:
        client.close()
