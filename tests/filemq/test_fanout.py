"""Live fan-out against a client that stops reading: the others are not held back, and
what the server queues for the stuck one is bounded (``max_live``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq.engine import Operation, load_wire
from filemq.engine_server import Close, FileOp, Reply, ServerSession, SessionState
from filemq.server import FileServer
from filemq.subscriber import Subscriber
from tests.polling import wait_until

from .test_live import files

WAIT = 20.0
WIRE = load_wire("spec")
_STUCK = b"stuck-client"


def _stuck_client(zctx: zmq.Context[Any], endpoint: str, credit: int) -> zmq.Socket[Any]:
    """A raw DEALER that subscribes, grants ``credit`` bytes once and never reads again."""
    codec: Any = load_wire("spec").codec
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = _STUCK
    sock.connect(endpoint)
    sock.send_multipart(codec.encode(codec.Ohai()))
    assert sock.poll(int(WAIT * 1000)), "no OHAI-OK"
    sock.recv_multipart()
    sock.send_multipart(codec.encode(codec.Icanhaz("/", {"RESYNC": "1"}, {})))
    if credit:
        sock.send_multipart(codec.encode(codec.Nom(credit, 0)))
    return sock


def _stuck_queue(server: FileServer) -> Callable[[], int | None]:
    def queued() -> int | None:
        found = [s.queued for s in server.stats().subscribers if s.client == _STUCK.hex()]
        return found[0] if found else None

    return queued


def test_a_client_that_stops_reading_holds_nobody_back_and_is_bounded(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    limit = 20
    server = serve(src, max_live=limit)
    stuck = _stuck_client(zctx, server.endpoint, credit=2 * 4096)  # two files, then no more
    queued = _stuck_queue(server)
    assert wait_until(lambda: queued() == 0, WAIT)  # subscribed, nothing to send yet
    good = Subscriber(server.endpoint, dest, context=zctx, index_path=None).start()
    try:
        assert good.wait_synced(WAIT)
        peak = 0
        for i in range(3 * limit):  # live changes, each to a new name
            (src / f"f{i:03d}.bin").write_bytes(os.urandom(4096))
            server.notify_changed("/", f"f{i:03d}.bin")
            peak = max(peak, queued() or 0)
        # the others get every change while the stuck client is connected
        assert wait_until(lambda: files(dest) == files(src), WAIT)
        peak = max(peak, queued() or 0)
        # and the server never queued more than the limit for the stuck one: it was closed
        assert wait_until(lambda: queued() is None, WAIT)
        assert peak <= limit + 1, peak
        assert good.error is None and good.result.errors == 0
    finally:
        good.stop()
        stuck.close(linger=0)


def test_live_changes_under_the_limit_keep_the_session(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """A slow client (no credit for a while) is not closed while under ``max_live``, and
    changes to a name already queued cost nothing (they replace the queued one)."""
    src = tmp_path / "src"
    src.mkdir()
    server = serve(src, max_live=5)
    stuck = _stuck_client(zctx, server.endpoint, credit=0)  # never grants any
    queued = _stuck_queue(server)
    try:
        assert wait_until(lambda: queued() == 1, WAIT)  # subscribed: its resync's marker waits
        for round_ in range(10):  # the same four names, over and over
            for i in range(4):
                (src / f"f{i}.txt").write_bytes(f"{round_}-{i}".encode())
                server.notify_changed("/", f"f{i}.txt")
        assert wait_until(lambda: queued() == 1 + 4, WAIT), queued()
        assert server.client_count == 1
    finally:
        stuck.close(linger=0)


def _ready(max_live: int) -> ServerSession:
    codec: Any = WIRE.codec
    session = ServerSession(WIRE, b"c1", 0.0, max_live=max_live)
    session.receive(codec.encode(codec.Ohai()), 0.0)
    session.receive(codec.encode(codec.Icanhaz("/", {}, {})), 0.0)
    return session


def _op(name: str) -> FileOp:
    return FileOp(name, Operation.CREATE, size=1, sha1="0" * 40)


def test_engine_counts_live_changes_only_and_closes_past_the_limit() -> None:
    session = _ready(max_live=3)
    session.enqueue([_op(f"/r{i}") for i in range(10)])  # a resync's: not live changes
    assert not session.overflowed and session.queued == 10
    session.enqueue([_op(f"/l{i}") for i in range(3)], live=True)
    session.enqueue([_op("/l0")], live=True)  # the same name again: replaced, not counted
    assert not session.overflowed
    session.enqueue([_op("/l3")], live=True)
    assert session.overflowed
    actions = session.overflow()
    assert isinstance(actions[0], Reply)
    assert WIRE.codec.decode(actions[0].frames).ID == WIRE.codec.MessageId.KTHXBAI
    assert isinstance(actions[1], Close) and "not reading" in actions[1].reason
    assert session.state is SessionState.CLOSED and session.queued == 0


def test_engine_live_changes_sent_leave_the_count() -> None:
    session = _ready(max_live=1)
    session.receive(WIRE.codec.encode(WIRE.codec.Nom(100, 0)), 0.0)
    session.enqueue([_op("/a")], live=True)
    plan = session.next_chunk()
    assert plan is not None and plan.op.name == "/a"
    session.chunk_frames(plan, b"x")
    session.enqueue([_op("/b")], live=True)
    assert not session.overflowed and session.queued == 1
