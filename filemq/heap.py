"""Keep freed chunk buffers in the process's heap (glibc ``mallopt``), for the CLI.

Every chunk a transfer moves is a fresh buffer of ``chunk_size`` (1 MiB by default):
the server's read and its encoded frame, the client's received frame.  glibc serves
such sizes with ``mmap`` at first, and its heap gives back (``brk`` trim) anything
above 2x the biggest chunk freed: the next chunk's pages are faulted in and zeroed by
the kernel again.  Measured here (512 MiB, plain): that is 40-50% of the server's CPU
(``perf``: clear_page, page faults, unmap).

``keep_freed_memory()`` raises both limits once per process (``filemq serve`` does;
a library user decides for itself).  The client is left alone: its page faults are
~1% of its CPU (libzmq receives into buffers it reuses better), not worth the ~3 ms
``ctypes`` costs a no-change ``sync --once``.

* ``MMAP_THRESHOLD`` (8 MiB): buffers up to this size come from the heap;
* ``TRIM_THRESHOLD`` (64 MiB, the server's send queue ``SEND_QUEUE_BYTES``): at most
  this much freed memory is kept at the top of the heap for the next buffers; above
  it the heap is trimmed as before.

Elsewhere than glibc (musl, macOS) it does nothing and says so (False).
"""

from __future__ import annotations

import functools

from zerohub.mallopt import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, mallopt

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MMAP_THRESHOLD = 8 << 20
TRIM_THRESHOLD = 64 << 20


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds (above); True when they were set."""
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
