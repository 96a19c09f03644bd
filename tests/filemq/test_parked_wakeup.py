"""A client parked on its full pipe (``filemq.server``): the serving loop polls the
ROUTER for POLLOUT while one is parked, so it sends again as soon as the pipe drains
instead of after a 10 ms wait; with ROUTER_MANDATORY libzmq reports POLLOUT when *any*
peer's pipe has room, so a second, idle client must not make the loop spin.

Adversaries: a client that grants credit and never reads (parked for good) beside an
idle subscriber whose pipe is empty (POLLOUT true all along), and a client that reads
slowly (parked and unparked again and again) whose mirror must still end exact.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq import fmq_msg
from filemq.server import FileServer
from tests.polling import wait_until

from .conftest import read_tree, write_tree

WAIT = 20.0
#: The loop's turns per second while a client is parked and nothing else happens: by
#: design at most one POLLOUT wake-up and one 10 ms wait in turn (~200/s, fewer on a
#: loaded machine); a loop spinning on the idle client's room turns thousands of times.
MAX_TURNS_PER_S = 1000


def _dealer(
    zctx: zmq.Context[Any], endpoint: str, rcvhwm: int = 1000, ident: bytes = b""
) -> zmq.Socket[Any]:
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvhwm = rcvhwm
    if ident:
        sock.routing_id = ident
    sock.connect(endpoint)
    sock.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
    assert sock.poll(int(WAIT * 1000)), "no OHAI-OK"
    assert isinstance(fmq_msg.decode(sock.recv_multipart()), fmq_msg.OhaiOk)
    return sock


def _subscribe(sock: zmq.Socket[Any], credit: int) -> None:
    sock.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})))
    sock.send_multipart(fmq_msg.encode(fmq_msg.Nom(credit, 0)))


def test_a_parked_client_beside_an_idle_one_does_not_make_the_loop_spin(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    src = tmp_path / "src"
    # 48 MiB: more than the stuck client's pipe (64 messages of 256 KiB) and the
    # loopback's socket buffers hold, so it stays parked while nobody reads
    write_tree(src, {f"f{i:03d}": os.urandom(256 << 10) for i in range(192)})
    server = serve(src)
    idle = _dealer(zctx, server.endpoint)  # connected, nothing asked: its pipe has room
    stuck = _dealer(zctx, server.endpoint, rcvhwm=1, ident=b"stuck")

    def stuck_sent() -> tuple[int, int]:  # (bytes built for it, files still queued)
        found = [s for s in server.stats().subscribers if s.client == b"stuck".hex()]
        return (found[0].sent_bytes, found[0].queued) if found else (-1, -1)

    try:
        _subscribe(stuck, 1 << 40)  # and never read again: its pipe fills, it is parked
        assert wait_until(lambda: bool(server._stalled), WAIT)
        before = stuck_sent()
        turns, start = server.loop_turns, time.monotonic()
        assert not wait_until(lambda: server.client_count != 2, 1.0)  # (a second's window)
        rate = (server.loop_turns - turns) / (time.monotonic() - start)
        assert rate < MAX_TURNS_PER_S, f"{rate:.0f} loop turns per second: spinning"
        sent, queued = stuck_sent()
        assert sent == before[0] and queued > 0  # parked all along: nothing more built
    finally:
        idle.close()
        stuck.close()


def test_a_slow_reader_parked_again_and_again_ends_with_every_file(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    tree = {f"d{i % 7}/f{i:04d}": os.urandom(1000 + i) for i in range(600)}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src")
    sock = _dealer(zctx, server.endpoint, rcvhwm=2)  # (its pipe is full at every turn)
    got: dict[str, bytes] = {}
    try:
        _subscribe(sock, 1 << 40)
        deadline = time.monotonic() + WAIT
        while len(got) < len(tree) and time.monotonic() < deadline:
            if not sock.poll(100):
                continue
            msg = fmq_msg.decode(sock.recv_multipart())
            if isinstance(msg, fmq_msg.Cheezburger) and msg.chunk:
                got[msg.filename.lstrip("/")] = bytes(msg.chunk)
    finally:
        sock.close()
    assert got == read_tree(tmp_path / "src")
