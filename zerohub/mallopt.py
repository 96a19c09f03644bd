"""glibc's ``mallopt`` and ``malloc_trim``, for the commands that tune their process's C heap.

One home for the calls (``filemq.heap``: thresholds for chunk buffers, and a mirror's
freed memory given back before its first ICANHAZ is sent; ``broker.heap``: one arena for
the broker's threads).  A setting is for the whole process: a command
(``filemq serve``, ``broker serve``) decides, a library leaves it to its user.  Elsewhere
than glibc (musl, macOS) nothing is set and the answer is False.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["M_ARENA_MAX", "M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD", "malloc_trim", "mallopt"]

#: The options used here (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def mallopt(option: int, value: int) -> bool:
    """Set one of glibc's malloc options; True when it was set."""
    return _call("mallopt", option, value)


def malloc_trim(pad: int = 0) -> bool:
    """Give the heap's free pages back to the system, keeping ``pad`` octets at its top
    (glibc: the top of the main heap and whole free pages inside every arena); True when
    memory was given back."""
    return _call("malloc_trim", pad)


def _call(name: str, *args: int) -> bool:
    """The C library's function ``name`` called with int arguments: its int result as a
    bool (False when the process's C library has no such function)."""
    import ctypes  # (deferred: ~1 ms, only for the commands that tune their heap)

    call = getattr(_libc(), name, None)
    if call is None:
        return False
    call.argtypes = [ctypes.c_int] * len(args)
    call.restype = ctypes.c_int
    return bool(call(*args))


@functools.cache
def _libc() -> Any:
    """The process's own symbols (its C library's), opened once, or None: each ``CDLL``
    makes a class of its own, which a process with the collector off (``filemq sync
    --once``) keeps; made again beside a mirror's big frame, ~0.6 MiB more peak RSS."""
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None
