"""Keep freed chunk buffers in the process's heap (glibc ``mallopt``), for the CLI.

Every chunk a transfer moves is a fresh buffer of ``chunk_size`` (1 MiB by default):
the server's read and its encoded frame, the client's received frame.  glibc serves
such sizes with ``mmap`` at first, and its heap gives back (``brk`` trim) anything
above 2x the biggest chunk freed: the next chunk's pages are faulted in and zeroed by
the kernel again.  Measured here (512 MiB, plain): that is 40-50% of the server's CPU
(``perf``: clear_page, page faults, unmap).

``keep_freed_memory()`` raises both limits once per process: ``filemq serve`` and
``filemq sync`` call it (a library user decides for itself).

* ``MMAP_THRESHOLD`` (8 MiB): buffers up to this size come from the heap (``filemq
  sync`` passes ``MIRROR_MMAP_THRESHOLD``, below);
* ``TRIM_THRESHOLD`` (64 MiB, the server's send queue ``SEND_QUEUE_BYTES``): at most
  this much freed memory is kept at the top of the heap for the next buffers; above
  it the heap is trimmed as before.

The mirror (issue 15, session 18): libzmq's I/O thread receives each chunk into a
buffer of its own arena and the mirror's threads free it; with glibc's default trim
threshold (128 KiB once the mmap threshold is fixed) that arena was trimmed and its
pages faulted in again by the next receives: 9,800-92,000 page faults per GiB
(plain and CURVE, depending on the run), 8,800-10,500 with the heap kept (Python's
own start-up).  On a virtual
machine whose host takes freed memory back, a fresh page is a trip to the host.

``MIRROR_MMAP_THRESHOLD`` (4 MiB, ``filemq sync``): a block from 4 MiB gets its own
mapping, so a mirror's peak RSS stays low (100,000 files: 78 -> 55 MiB): glibc's
adaptive threshold would rise to 32 MiB once a big block is freed (the saved index
read at start) and the ICANHAZ frame (~12 MiB, one growing buffer) would then grow
in the heap, every move leaving the old block behind, touched; a mapped block grows
with ``mremap``, not copied.  The 1 MiB chunk messages stay below it.

``release_freed_memory()`` (issue 15, session 18, rss18): the cost of a heap kept at
the top is paid by whatever peaks next.  Making a 100,000-file mirror's first ICANHAZ
frees ~4.5 MiB of heap blocks below the mmap threshold, which the 64 MiB trim threshold
keeps resident (the CURVE peak with both thresholds set is 4.5 MiB above the one with
either alone; which blocks they are was not traced one by one); over CURVE
libzmq then copies the ~11 MiB frame twice beside it (a plaintext and the box, 3x the
frame at once: ``bench/bench_curve_send_rss.py``).  ``filemq sync`` gives that memory
back just before the frame is sent (``malloc_trim``): peak RSS over CURVE 60.9-61.1 ->
56.2-56.3 MiB; plain's peak (38.6-38.8, later: the index load and DEST re-stat) is not
moved.  In a process that did not call ``keep_freed_memory`` (a library user) it does
nothing: glibc trims by itself there.

Elsewhere than glibc (musl, macOS) it does nothing and says so (False).
"""

from __future__ import annotations

import functools

from zerohub.mallopt import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, malloc_trim, mallopt

__all__ = [
    "MIRROR_MMAP_THRESHOLD",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "keep_freed_memory",
    "release_freed_memory",
]

MMAP_THRESHOLD = 8 << 20
MIRROR_MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 64 << 20


@functools.cache
def keep_freed_memory(mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Set glibc's thresholds (above); True when they were set."""
    return mallopt(M_MMAP_THRESHOLD, mmap_threshold) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def release_freed_memory() -> bool:
    """Give the freed memory the heap keeps back to the system (``malloc_trim``), when
    this process keeps it (``keep_freed_memory`` was called); True when some went back."""
    if not keep_freed_memory.cache_info().currsize:
        return False  # (the thresholds are glibc's own: it trims by itself)
    return malloc_trim(0)
