"""A truncated big frame over real sockets, both ways (big frames decode in place: a
length that runs past the frame's end must be a clear decode error, not a short chunk).

* to the server: a peer sends OHAI then a 1 MiB CHEEZBURGER cut by one octet (and a
  big ICANHAZ cut the same way): each gets RTFM naming the truncated field, and the
  server goes on serving a real client a big file exactly;
* to the client: a server sends a good first chunk of a big file, then the next cut by
  one octet: ``filemq sync --once`` ends with one line (exit 1, no traceback) naming the
  truncated chunk, DEST holds no file in place, and the partial file holds only the
  source's first bytes (resumable).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq import fmq_msg
from filemq.client import SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree

MiB = 1 << 20


def _cut(msg: fmq_msg.Message) -> bytes:
    (frame,) = fmq_msg.encode(msg)
    return frame[:-1]  # the last field's length now runs one octet past the frame


def _ask(sock: zmq.Socket[bytes], frame: bytes) -> fmq_msg.Message:
    sock.send(frame)
    assert sock.poll(30_000), "the server did not answer"
    return fmq_msg.decode(sock.recv_multipart())


def test_a_truncated_big_frame_gets_rtfm_and_the_server_keeps_serving(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
    zctx: zmq.Context[Any],
) -> None:
    tree = {"big.bin": os.urandom(3 * MiB + 5)}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", chunk_size=MiB)
    big_burger = fmq_msg.Cheezburger(0, 1, "/big.bin", 0, 0, {}, os.urandom(MiB))
    big_icanhaz = fmq_msg.Icanhaz("/", {}, {f"/f{i:06d}": "ab" * 20 for i in range(4000)})
    for hostile in (big_burger, big_icanhaz):
        peer = zctx.socket(zmq.DEALER)
        peer.linger = 0
        try:
            peer.connect(server.endpoint)
            assert _ask(peer, fmq_msg.encode(fmq_msg.Ohai())[0]) == fmq_msg.OhaiOk()
            cut = _cut(hostile)
            assert len(cut) >= 64 << 10  # (a big frame: the in-place decoder's)
            answer = _ask(peer, cut)
            assert isinstance(answer, fmq_msg.Rtfm)
            assert "malformed" in answer.reason and "past the end" in answer.reason
        finally:
            peer.close()
    result = sync_once(server.endpoint, tmp_path / "dest")
    assert result.synced and read_tree(tmp_path / "dest") == tree


class _CuttingServer:
    """ROUTER double: OHAI-OK, ICANHAZ-OK, a good first chunk of ``data``, then its
    second chunk cut by one octet (to every client that asks: the client retries)."""

    def __init__(self, ctx: zmq.Context[Any], data: bytes, chunk: int) -> None:
        self.router = ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.served = 0
        self._stop = threading.Event()
        headers = {"sha1": hashlib.sha1(data).hexdigest(), "size": str(len(data))}
        first = fmq_msg.Cheezburger(0, 1, "/big.bin", 0, 0, headers, data[:chunk])
        second = fmq_msg.Cheezburger(1, 1, "/big.bin", chunk, 0, {}, data[chunk : 2 * chunk])
        self._burgers = [fmq_msg.encode(first)[0], _cut(second)]
        self._thread = threading.Thread(target=self._run, name="cutting-server")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(100):
                continue
            ident, *body = self.router.recv_multipart()
            msg = fmq_msg.decode(body)
            if isinstance(msg, fmq_msg.Ohai):
                self.router.send_multipart([ident, *fmq_msg.encode(fmq_msg.OhaiOk())])
            elif isinstance(msg, fmq_msg.Icanhaz):
                self.served += 1
                self.router.send_multipart([ident, *fmq_msg.encode(fmq_msg.IcanhazOk())])
                for frame in self._burgers:
                    self.router.send_multipart([ident, frame])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.router.close()


def test_a_truncated_big_chunk_ends_the_sync_with_one_clear_line(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    data = os.urandom(4 * MiB)
    server = _CuttingServer(zctx, data, MiB)
    dest = tmp_path / "dest"
    try:
        cmd = [sys.executable, "-m", "filemq", "sync", server.endpoint, str(dest), "--once"]
        cmd += ["--retries", "1", "--timeout", "5"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "malformed" in last and "Cheezburger.chunk" in last, done.stderr
    assert server.served >= 1
    assert not (dest / "big.bin").exists()  # nothing half-written in place
    for path in dest.rglob("*") if dest.exists() else []:
        if path.is_file() and path.stat().st_size >= MiB:  # the partial file, if kept
            assert data.startswith(path.read_bytes())
