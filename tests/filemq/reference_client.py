"""A test double of the reference C FILEMQ client (``fmq_client.c``), on the czmq wire.

It behaves as the reference client is documented to (shared notes, "The reference
FILEMQ implementation"), not as zerohub's client does:

* it ignores ``eof``: a file is opened at the first create chunk when none is open,
  every non-empty chunk is written at its offset into the open file (whatever its
  filename says), and the file is closed -- delivered -- only on a zero-length chunk;
* it writes in place and never truncates (a file is opened without ``O_TRUNC``);
* filenames must start with '/' (others are skipped: so is zerohub's resync marker),
  the subscription path is removed from the front;
* credit: 5 slices of 1,000,000 bytes at first, topped up by whole slices whenever
  what is left falls below 4 slices + 1 byte;
* it answers HUGZ with HUGZ-OK.

Everything happens in the calling thread: ``pump(until, timeout)`` handles messages
until ``until()`` is true or the deadline passes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq import fmq_msg_czmq as codec

CREDIT_SLICE = 1_000_000
CREDIT_MINIMUM = CREDIT_SLICE * 4 + 1


class ReferenceLikeClient:
    def __init__(self, ctx: zmq.Context[Any], endpoint: str, inbox: Path) -> None:
        self.inbox = inbox
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.credit = 0
        self.path = "/"
        self._fd = -1
        #: Names closed by a zero-length chunk, in order (a name once per version).
        self.delivered: list[str] = []
        self.deleted: list[str] = []
        self.skipped: list[str] = []  # filenames without a leading '/'

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.sock.close()

    def send(self, msg: codec.Message) -> None:
        self.sock.send_multipart(codec.encode(msg))

    def subscribe(self, path: str = "/", *, resync: bool = False, timeout: float = 10.0) -> None:
        """OHAI, ICANHAZ ``path`` (the reference sends no RESYNC option), then credit."""
        self.path = path
        self.send(codec.Ohai())
        self._expect(codec.OhaiOk, timeout)
        self.send(codec.Icanhaz(path, {"RESYNC": "1"} if resync else {}, {}))
        self._expect(codec.IcanhazOk, timeout)
        self._refill()

    def _expect(self, kind: type, timeout: float) -> None:
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError(f"no {kind.__name__} from the server")
        msg = codec.decode(self.sock.recv_multipart())
        assert isinstance(msg, kind), msg

    def _refill(self) -> None:
        grant = 0
        while self.credit < CREDIT_MINIMUM:
            grant += CREDIT_SLICE
            self.credit += CREDIT_SLICE
        if grant:
            self.send(codec.Nom(grant, 0))

    def pump(self, until: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.sock.poll(int(min(left, 0.1) * 1000)):
                self._handle(codec.decode(self.sock.recv_multipart()))
        return True

    def _handle(self, msg: codec.Message) -> None:
        if isinstance(msg, codec.Hugz):
            self.send(codec.HugzOk())
        elif isinstance(msg, codec.Cheezburger):
            self._patch(msg)
            self._refill()

    def _patch(self, msg: codec.Cheezburger) -> None:
        name = msg.filename
        if not name.startswith("/"):
            self.skipped.append(name)
            return
        if name.startswith(self.path):
            name = name[len(self.path) :]
        name = name.lstrip("/")
        path = self.inbox / name
        if msg.operation == codec.FILE_CREATE:
            if self._fd < 0:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            if msg.chunk:
                os.pwrite(self._fd, msg.chunk, msg.offset)
                self.credit -= len(msg.chunk)
            else:  # the end of a file, for this client (eof is never looked at)
                os.close(self._fd)
                self._fd = -1
                self.delivered.append(name)
        elif msg.operation == codec.FILE_DELETE:
            path.unlink(missing_ok=True)
            self.deleted.append(name)
