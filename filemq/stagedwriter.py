"""Writing a big file direct, each chunk hashed while it is in the cache (``--direct-io``).

``filemq.writer.ChunkWriter`` hashes on one worker and writes on another: with
``--direct-io`` the writing worker copies each chunk into a page-aligned staging
buffer (``filemq.directio``) and the hashing worker reads the same chunk again,
megabytes later, after it left the cache.  ``hashlib.sha1`` over one hot 1 MiB
buffer costs ~0.50 CPU s per GiB here, over chunks that went cold ~0.90 (docs/performance.md,
FILEMQ bulk, session 18).  ``StagedWriter`` does the copy and the hash on one
worker, back to back, and leaves the device write to another:

* the *staging* worker takes each chunk in order, copies the part of it that can be
  written direct (from an aligned file position, a multiple of ``ALIGN`` long) into
  a free page-aligned staging buffer and hashes that buffer (the bytes are in this
  core's cache: the copy just wrote them), then hashes the rest of the chunk (a
  tail) from where it arrived; with a journal it takes a copy of the hasher's state
  (the SHA-1 of everything up to this chunk's end);
* the *writing* worker writes each staged chunk in order, direct while
  ``filemq.directio`` allows (else through the page cache, the same bytes), gives
  its staging buffer back, then records the checkpoint the staging worker prepared:
  a journal never claims bytes the file lacks (kill -9 included), and its SHA-1 is
  of exactly the bytes written up to it;
* ``STAGES`` staging buffers (two: one being written, one being filled) bound the
  staging worker's lead: the device write of one chunk overlaps the copy and hash
  of the next;
* through the page cache (no ``direct``, or a file ``filemq.directio`` cannot write
  direct: an unaligned start, a file system without ``O_DIRECT``) one worker writes
  each chunk, then hashes it (the write's copy into the page cache just read it:
  ~0.65 CPU s per GiB instead of ~0.9 for the same chunk hashed cold on another
  thread), then checkpoints; the receive loop still runs beside it;
* at most ``max_pending`` bytes wait to be written (``write`` blocks beyond that);
* the first failure (a write, a checkpoint) is kept: nothing after it is written,
  and the next ``write`` or ``settle`` raises it, so the caller drops the file.  The
  hasher may then have seen chunks that were never written: it is not used again
  (a later session resumes from the journal, whose points were written);
* ``settle`` waits until everything queued is written (and so hashed); ``close``
  stops the workers after what was queued; ``discard`` drops what is queued.

Same interface as ``filemq.writer.ChunkWriter``, which the mirror keeps for files
written through the page cache (hashing and writing on two threads at once: one
worker writing then hashing saved CPU plain but none over CURVE, docs/performance.md, sha18).
"""

from __future__ import annotations

import mmap
from collections import deque
from dataclasses import dataclass
from typing import Any

from filemq.directio import ALIGN, DirectWrites
from filemq.workers import Workers
from filemq.writer import MAX_PENDING, Checkpoints, write_all

__all__ = ["STAGES", "StagedWriter"]

#: Staging buffers per file: the one being written and the one being filled.
STAGES = 2


@dataclass(slots=True)
class _Staged:
    """A chunk ready to be written: its staged part, the rest, what it brings the hash to."""

    buffer: mmap.mmap | None  # the staging buffer holding ``staged`` (given back after)
    staged: memoryview | None  # the chunk's first octets, copied and hashed there
    rest: memoryview  # the chunk's other octets (hashed where they arrived)
    length: int
    digest: Any  # the hasher's state after this chunk (a copy), with a journal


class StagedWriter:
    """Write ``fd``'s chunks direct in order, each hashed right after it was staged."""

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
        self.hasher = hasher
        #: Bytes written (and hashed) so far (the writing worker's; ``settle`` to read it).
        self.size = size
        self._journal = journal
        self._workers = Workers(max_pending, self._drop)
        self._direct = DirectWrites(fd) if direct else None
        #: Direct writes (two workers) or through the page cache (one: write, then hash).
        self._staged = self._direct is not None and self._direct.direct
        self._aligned = self._staged  # the staging worker's file position is aligned
        self._to_stage: deque[Any] = deque()
        self._to_write: deque[_Staged] = deque()
        self._free: list[mmap.mmap] = []  # staging buffers not in use
        self._made = 0  # staging buffers made so far (at most STAGES)
        self._staging_done = False  # the staging worker stopped

    def write(self, data: Any) -> None:
        """Queue ``data`` (bytes-like, not changed afterwards); raises an earlier failure."""
        workers = self._workers
        with workers.cond:
            workers.admit(len(data))
            self._to_stage.append(data)
        if self._staged:
            workers.start(("filemq-hasher", self._staging), ("filemq-writer", self._writing))
        else:
            workers.start(("filemq-writer", self._inline))

    def settle(self) -> None:
        """Wait until everything queued is written (and hashed); raise a failure."""
        self._workers.settle(lambda: self._workers.pending)

    def close(self) -> None:
        """Write what is queued, then stop the workers (a failure is kept for ``settle``)."""
        self._workers.stop()
        self._free.clear()
        if self._direct is not None:
            self._direct.close()

    def discard(self) -> None:
        """Drop what is queued and stop the workers (after the chunk each is at)."""
        with self._workers.cond:
            self._workers.cut_off()
        self.close()

    def _drop(self) -> None:
        """Nothing queued is written any more (under the lock)."""
        self._to_stage.clear()
        self._to_write.clear()

    def _done(self, length: int, digest: Any) -> bool:
        """``length`` more bytes written: count them, then checkpoint (True: go on)."""
        with self._workers.cond:
            self._workers.release(length)
            self.size += length
            size = self.size
        if self._journal is not None:
            self._journal.checkpoint(size, digest)
        return True

    # -- through the page cache: one worker writes a chunk, then hashes it ---------------

    def _inline(self) -> None:
        self._workers.serve(lambda: self._workers.take(self._to_stage), self._write_inline)

    def _write_inline(self, data: Any) -> bool:
        write_all(self.fd, data)
        self.hasher.update(data)  # (hot: the write's copy just read it)
        return self._done(len(data), self.hasher)

    # -- the staging worker: copy, hash -------------------------------------------------

    def _staging(self) -> None:
        workers = self._workers
        try:  # (an OSError: no memory for a staging buffer)
            workers.serve(lambda: workers.take(self._to_stage), self._stage)
        finally:
            with workers.cond:
                self._staging_done = True
                workers.cond.notify_all()

    def _stage(self, data: Any) -> bool:
        """Copy ``data``'s aligned part into a staging buffer and hash the chunk, then
        queue it for the writing worker (False: cut meanwhile)."""
        view = memoryview(data).cast("B")
        length = len(view)
        aligned = 0
        if self._aligned and self._direct is not None and self._direct.direct:
            aligned = length - length % ALIGN
        self._aligned = aligned == length  # (after a tail: through the page cache)
        buffer = staged = None
        if aligned:
            buffer = self._buffer(aligned)
            if buffer is None:
                return False
            staged = memoryview(buffer)[:aligned]
            staged[:] = view[:aligned]
            self.hasher.update(staged)  # (hot: the copy just wrote it)
        rest = view[aligned:]
        if rest:
            self.hasher.update(rest)
        digest = self.hasher.copy() if self._journal is not None else None
        with self._workers.cond:
            if self._workers.cut:
                return False
            self._to_write.append(_Staged(buffer, staged, rest, length, digest))
            self._workers.cond.notify_all()
        return True

    def _buffer(self, length: int) -> mmap.mmap | None:
        """A free staging buffer of ``length`` octets or more (None: cut meanwhile)."""
        workers = self._workers
        with workers.cond:
            while not self._free and self._made >= STAGES and not workers.cut:
                workers.cond.wait()
            if workers.cut:
                return None
            buffer = self._free.pop() if self._free else None
            if buffer is None:
                self._made += 1
        if buffer is None or len(buffer) < length:
            if buffer is not None:
                buffer.close()
            buffer = mmap.mmap(-1, length)  # (page-aligned; its pages touched once, reused)
        return buffer

    # -- the writing worker: write, checkpoint ------------------------------------------

    def _writing(self) -> None:
        workers = self._workers
        workers.serve(lambda: workers.take(self._to_write, lambda: self._staging_done), self._put)

    def _put(self, item: _Staged) -> bool:
        """Write one staged chunk, give its buffer back, then checkpoint."""
        try:
            self._write(item)
        finally:
            if item.staged is not None:
                item.staged.release()
        if item.buffer is not None:
            with self._workers.cond:
                self._free.append(item.buffer)
        return self._done(item.length, item.digest)

    def _write(self, item: _Staged) -> None:
        """Write one chunk at the file's position: its staged part direct while that
        works, the rest (and all after a direct write ended) through the page cache."""
        direct = self._direct
        assert direct is not None
        if item.staged is not None:
            room = item.staged
            while room and direct.direct:
                room = room[direct.write_staged(room) :]
            if room:
                write_all(self.fd, room)
        if item.rest:
            if direct.direct:
                direct.end()  # (an unaligned tail: the file position is unaligned after it)
            write_all(self.fd, item.rest)
