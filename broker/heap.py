"""One C heap arena for the broker's process (glibc ``mallopt(M_ARENA_MAX, 1)``).

glibc gives every thread that allocates its own arena.  A thread's arena grows one
``mprotect`` call at a time, by what the allocation that ran out of room needs (no
``M_TOP_PAD`` there, unlike the main heap's ``brk``): the broker's serving thread,
which makes every queued payload, paid one system call per 4 KiB message held
(``strace -f``: 39,515 ``mprotect`` for 40,000 4 KiB pushes into a queue without
consumers) and its kernel work (faults taken twice, once for the protection and once
for the page).  In the main arena the heap grows with ``brk`` plus its top pad
(128 KiB): one call per ~30 such messages.  The broker's threads (the serving thread,
libzmq's I/O thread, the store's writer) then share one lock for their allocations,
which two cores hardly notice (bench/bench_broker.py; docs/performance.md, "Where a queued
4 KiB message went (session 14)").

``one_arena()`` must run before any other thread allocates (glibc fixes its arena limit
when a second thread first allocates): ``broker serve`` calls it first thing.  A
library user decides for itself; ``MALLOC_ARENA_MAX`` or ``GLIBC_TUNABLES`` in the
environment are the user's choice and left alone (False), as is any C library but
glibc (musl, macOS: False).
"""

from __future__ import annotations

import functools
import os

from zerohub.mallopt import M_ARENA_MAX, mallopt

__all__ = ["one_arena"]


@functools.cache
def one_arena() -> bool:
    """Limit this process's C heap to its main arena; True when it was set."""
    if "MALLOC_ARENA_MAX" in os.environ or "GLIBC_TUNABLES" in os.environ:
        return False
    return mallopt(M_ARENA_MAX, 1)
