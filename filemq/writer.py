"""Writing and hashing a received file's chunks off the receive loop (``filemq.mirror``).

A file received in several chunks is written to its temp (or partial) file and
hashed (SHA-1) as it comes.  Both release the GIL, so ``ChunkWriter`` does each on a
worker thread of its own while the client's loop receives and decodes the next
chunks: disk writes, hashing and the wire overlap (one thread doing both spent the
sum of the two per chunk, ~2 CPU s per GiB here: the transfer's slowest stage).

Rules:

* chunks are written in the order given, each whole (short writes are finished),
  each at the end of the previous one; the hasher sees exactly what was written, in
  the same order;
* a journal checkpoint (``filemq.partial``) is written by the hashing worker after it
  hashed a chunk *and* the writing worker wrote it, so a journal never claims bytes
  the file lacks (kill -9 included);
* at most ``max_pending`` bytes wait for the workers (default ``MAX_PENDING``, 8 MiB;
  a chunk counts until both are done with it): ``write`` blocks beyond that, so a
  disk slower than the wire holds the loop (and with it the credit it grants)
  instead of filling memory;
* the first write that fails (disk full, I/O error, a file size limit) is kept:
  nothing queued after it is written, and the next ``write`` or ``settle`` raises
  it (an ``OSError``), so the caller drops the file: never taken as complete;
* with ``direct`` the writing worker writes around the page cache
  (``filemq.directio``): the same bytes at the same offsets;
* ``settle`` waits until everything queued is on disk and hashed, ``close`` stops
  the workers (what was queued is written first; ``discard`` drops it instead).

One ``ChunkWriter`` serves one file: its workers start with the first write and
end at ``close``/``discard`` (two threads per multi-chunk file; small files, whole
in one chunk, never use one).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Protocol

from filemq.directio import DirectWrites
from filemq.workers import Workers

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
    """Write chunks to ``fd`` and feed them to ``hasher``, each on a worker thread of
    its own, in order."""

    def __init__(
        self,
        fd: int,
        hasher: Any,
        *,
        size: int = 0,
        journal: Checkpoints | None = None,
        max_pending: int = MAX_PENDING,
        direct: bool = False,
    ) -> None:
        self.fd = fd
        self._direct = direct  # written around the page cache (``filemq.directio``)
        self.hasher = hasher
        #: Bytes written and hashed so far (the workers' count; ``settle`` to read it).
        self.size = size
        self._journal = journal
        self._workers = Workers(max_pending, self._drop)
        self._to_write: deque[Any] = deque()
        self._to_hash: deque[Any] = deque()
        self._unfinished: deque[int] = deque()  # sizes of chunks a worker still owes
        self._written = 0  # chunks written (from the first), then hashed, by the workers
        self._hashed = 0
        self._finished = 0  # chunks both workers are done with
        self._hashed_bytes = size  # the hashing worker's own count (its checkpoints)
        self._taken = 0  # chunks the hashing worker took
        self._busy = False  # the writing worker is in a write

    def write(self, data: Any) -> None:
        """Queue ``data`` (bytes-like, not changed afterwards); raises an earlier failure."""
        with self._workers.cond:
            self._workers.admit(len(data))
            self._to_write.append(data)
            self._to_hash.append(data)
            self._unfinished.append(len(data))
        self._workers.start(("filemq-writer", self._writing), ("filemq-hasher", self._hashing))

    def settle(self) -> None:
        """Wait until everything queued is written and hashed; raise a failure."""
        self._workers.settle(lambda: self._unfinished)

    def close(self) -> None:
        """Write what is queued, then stop the workers (a failure is kept for ``settle``)."""
        self._workers.stop()

    def discard(self) -> None:
        """Drop what is queued and stop the workers (after the chunk each is at)."""
        self._workers.discard()

    def _drop(self) -> None:
        """Nothing queued is written any more; what was written is still hashed (and
        checkpointed: a partial file resumes from its last written byte) (under the lock)."""
        self._to_write.clear()
        self._unfinished.clear()

    def _next_write(self) -> Any:
        """The next chunk to write, or None: stop (under the lock)."""
        data = self._workers.take(self._to_write)
        if data is not None:
            self._busy = True
        return data

    def _next_hash(self) -> Any:
        """The next chunk to hash, or None: stop (under the lock).  After a cut, only
        chunks that were written (or are being written) are hashed."""
        workers = self._workers
        while True:
            if workers.cut:
                if self._taken < self._written and self._to_hash:
                    break
                if not self._busy:
                    return None
            elif self._to_hash:
                break
            elif workers.stopping:
                return None
            workers.cond.wait()
        self._taken += 1
        return self._to_hash.popleft()

    def _finish(self) -> None:
        """Chunks both workers are done with leave the count (under the lock)."""
        while self._finished < min(self._written, self._hashed) and self._unfinished:
            length = self._unfinished.popleft()
            self._finished += 1
            self._workers.release(length)
            self.size += length
        self._workers.cond.notify_all()

    def _writing(self) -> None:
        direct = DirectWrites(self.fd) if self._direct else None
        try:
            self._workers.serve(self._next_write, lambda data: self._write(data, direct))
        finally:
            if direct is not None:
                direct.close()

    def _write(self, data: Any, direct: DirectWrites | None) -> bool:
        """Write one chunk (False: it failed, and the failure is kept)."""
        try:
            if direct is None:
                write_all(self.fd, data)
            else:
                direct.write(data)
        except OSError as exc:
            with self._workers.cond:
                self._busy = False  # (with the failure: the hasher stops at what was written)
                self._workers.fail(exc)
            return False
        with self._workers.cond:
            self._busy = False
            self._written += 1
            self._finish()
        return True

    def _hashing(self) -> None:
        self._workers.serve(self._next_hash, self._hash)

    def _hash(self, data: Any) -> bool:
        """Hash one chunk, then checkpoint once its bytes are written (False: stop)."""
        self.hasher.update(data)
        self._hashed_bytes += len(data)
        cond = self._workers.cond
        with cond:
            self._hashed += 1
            self._finish()
            if self._journal is None:
                return True
            # a checkpoint only once the bytes it covers are written
            while self._written < self._hashed and (self._busy or not self._workers.cut):
                cond.wait()
            if self._written < self._hashed:  # (cut before its bytes were written)
                return False
        self._journal.checkpoint(self._hashed_bytes, self.hasher)
        return True
