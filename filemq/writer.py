"""Writing and hashing a received file's chunks off the receive loop (``filemq.mirror``).

A file received in several chunks is written to its temp (or partial) file and
hashed (SHA-1) as it comes.  Both release the GIL, so ``ChunkWriter`` does them on
a worker thread while the client's loop receives and decodes the next chunks:
disk writes, hashing and the wire overlap.

Rules:

* chunks are written in the order given, each whole (short writes are finished),
  each at the end of the previous one; the hasher sees exactly what was written;
* a journal checkpoint (``filemq.partial``) is written by the worker *after* the
  bytes it covers, so a journal never claims bytes the file lacks (kill -9 included);
* at most ``max_pending`` bytes wait for the worker (default ``MAX_PENDING``, 8 MiB):
  ``write`` blocks beyond that, so a disk slower than the wire holds the loop (and
  with it the credit it grants) instead of filling memory;
* the first write that fails (disk full, I/O error, a file size limit) is kept:
  nothing queued after it is written, and the next ``write`` or ``settle`` raises
  it (an ``OSError``), so the caller drops the file: never taken as complete;
* ``settle`` waits until everything queued is on disk and hashed, ``close`` stops
  the worker (what was queued is written first; ``discard`` drops it instead).

One ``ChunkWriter`` serves one file: its worker starts with the first write and
ends at ``close``/``discard`` (a thread per multi-chunk file; small files, whole in
one chunk, never use one).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any, Protocol

__all__ = ["MAX_PENDING", "Checkpoints", "ChunkWriter"]

#: Bytes queued for the worker before ``write`` waits (8 chunks of 1 MiB).
MAX_PENDING = 8 << 20


class Checkpoints(Protocol):
    """A partial file's journal: records (size, SHA-1 so far) now and then."""

    def checkpoint(self, size: int, hasher: Any) -> None: ...


def write_all(fd: int, data: Any) -> None:
    """``os.write`` until all of ``data`` is written (a short write is finished)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class ChunkWriter:
    """Write chunks to ``fd`` and feed them to ``hasher`` on a worker thread, in order."""

    def __init__(
        self,
        fd: int,
        hasher: Any,
        *,
        size: int = 0,
        journal: Checkpoints | None = None,
        max_pending: int = MAX_PENDING,
    ) -> None:
        self.fd = fd
        self.hasher = hasher
        #: Bytes written and hashed so far (the worker's count; ``settle`` to read it).
        self.size = size
        self._journal = journal
        self._max_pending = max(1, max_pending)
        self._jobs: deque[Any] = deque()
        self._pending = 0
        self._error: OSError | None = None
        self._stopping = False
        self._busy = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def write(self, data: Any) -> None:
        """Queue ``data`` (bytes-like, not changed afterwards); raises an earlier failure."""
        with self._cond:
            self._raise()
            while self._pending >= self._max_pending and self._jobs and self._error is None:
                self._cond.wait()
            self._raise()
            self._jobs.append(data)
            self._pending += len(data)
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="filemq-writer", daemon=True)
            self._thread.start()

    def settle(self) -> None:
        """Wait until everything queued is written and hashed; raise a failure."""
        with self._cond:
            while (self._jobs or self._busy) and self._error is None:
                self._cond.wait()
            self._raise()

    def close(self) -> None:
        """Write what is queued, then stop the worker (a failure is kept for ``settle``)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def discard(self) -> None:
        """Drop what is queued and stop the worker (after the write in progress)."""
        with self._cond:
            self._jobs.clear()
            self._pending = 0
        self.close()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _work(self) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._jobs and not self._stopping:
                    cond.wait()
                if not self._jobs or self._error is not None:
                    self._jobs.clear()
                    self._pending = 0
                    cond.notify_all()
                    return
                data = self._jobs.popleft()
                self._busy = True
            try:
                write_all(self.fd, data)
                self.hasher.update(data)
                self.size += len(data)
                if self._journal is not None:
                    self._journal.checkpoint(self.size, self.hasher)
            except OSError as exc:
                error: OSError | None = exc
            else:
                error = None
            with cond:
                self._busy = False
                self._pending -= len(data)
                if error is not None:
                    self._error = error
                    self._jobs.clear()
                    self._pending = 0
                cond.notify_all()
