"""Writing a big file's chunks around the page cache (``O_DIRECT``), for ``filemq.writer``.

A buffered write copies each chunk into page-cache pages the kernel takes from its
free memory.  On a virtual machine whose host takes freed guest memory back (virtio
free page reporting, as on the machine these benchmarks ran on), a page freed a few
seconds earlier costs a trip to the host when it is touched again: writing 1 GiB
took 0.2 s of system CPU right after a 1 GiB file was deleted and 1.0-2.2 s five
seconds later (``bench_filemq.py``'s notes in docs/performance.md, issue 15, session 18), on the
one thread that writes.  A direct write moves the bytes from our buffer to the
device without touching the page cache: 1 GiB in 0.7-0.9 s and 0.13 CPU s here.

``DirectWrites`` writes one file's chunks, in order, at the file's position:

* direct writing starts only when ``O_DIRECT`` can be set on the descriptor
  (``fcntl``) and the position is a multiple of ``ALIGN``; a file system that
  refuses it (tmpfs, some network file systems: ``EINVAL``) is written as before;
* each chunk is copied into a page-aligned staging buffer (reused: its pages are
  touched once) and the part that is a multiple of ``ALIGN`` is written direct; a
  tail that is not (a file's last chunk) is written through the page cache, and
  so is everything after it (direct writing ends there: ``O_DIRECT`` cleared);
* a direct write refused with ``EINVAL`` (an alignment the device wants bigger)
  ends direct writing too, and the same bytes are written through the page cache;
* every other failure (``ENOSPC``, ``EIO``, a size limit) is raised, as a buffered
  write's would be; a short write is finished (the rest through the page cache
  when what is left is not aligned).

The bytes written are the bytes given, in the same order, at the same offsets:
only the path to the disk differs.  Nothing here fsyncs: the data of a direct
write is on the device when it returns, the file's size and metadata follow the
file system's usual course.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from typing import Any

__all__ = ["ALIGN", "DirectWrites"]

#: Offsets, lengths and buffer addresses of direct writes are multiples of this
#: (the largest logical block size of common devices; a bigger one is an EINVAL).
ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class DirectWrites:
    """Write ``fd``'s chunks direct while the alignment allows, else through the cache."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: Writing direct now (False: through the page cache, from here to the end).
        self.direct = False
        self._stage: mmap.mmap | None = None
        if _O_DIRECT and os.lseek(fd, 0, os.SEEK_CUR) % ALIGN == 0:
            self.direct = self._set(True)

    def write(self, data: Any) -> None:
        """Write all of ``data`` at the file's position."""
        view = memoryview(data).cast("B")
        while view and self.direct:
            view = view[self._write_direct(view) :]
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        """Free the staging buffer (the descriptor is the caller's)."""
        if self._stage is not None:
            self._stage.close()
            self._stage = None

    def _write_direct(self, view: memoryview) -> int:
        """Write the aligned part of ``view`` direct: the octets written (0: direct
        writing ended here, the caller writes the rest through the page cache)."""
        length = len(view) - len(view) % ALIGN
        if length == 0:
            self._stop()
            return 0
        stage = self._staging(length)
        with memoryview(stage) as room:
            room[:length] = view[:length]
            written = self.write_staged(room[:length])
        if not self.direct:
            self.close()  # (the staging buffer is not needed any more)
        return written

    def write_staged(self, room: memoryview) -> int:
        """Write ``room`` (page-aligned, a multiple of ``ALIGN`` long: a staged part)
        direct: the octets written (0: direct writing ended here, before any of them;
        the caller writes what is left through the page cache)."""
        try:
            written = os.write(self.fd, room)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            written = 0  # (refused before anything was written)
        if written == 0 or written % ALIGN:  # (refused, or short and unaligned now)
            self._stop()
        return written

    def _staging(self, length: int) -> mmap.mmap:
        stage = self._stage
        if stage is None or len(stage) < length:
            if stage is not None:
                stage.close()
            stage = self._stage = mmap.mmap(-1, length)  # (page-aligned, zeroed once)
        return stage

    def end(self) -> None:
        """Direct writing ends here: the rest goes through the page cache."""
        self._stop()

    def _stop(self) -> None:
        self.direct = False
        self._set(False)

    def _set(self, on: bool) -> bool:
        """Set or clear ``O_DIRECT`` on the descriptor: True when it is set now."""
        try:
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            flags = flags | _O_DIRECT if on else flags & ~_O_DIRECT
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags)
        except OSError:
            return False
        return on
