"""glibc's ``mallopt``, for the commands that tune their process's C heap.

One home for the call (``filemq.heap``: thresholds for chunk buffers; ``broker.heap``:
one arena for the broker's threads).  A setting is for the whole process: a command
(``filemq serve``, ``broker serve``) decides, a library leaves it to its user.  Elsewhere
than glibc (musl, macOS) nothing is set and the answer is False.
"""

from __future__ import annotations

__all__ = ["M_ARENA_MAX", "M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD", "mallopt"]

#: The options used here (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def mallopt(option: int, value: int) -> bool:
    """Set one of glibc's malloc options; True when it was set."""
    import ctypes  # (deferred: ~1 ms, only for the commands that tune their heap)

    try:
        call = ctypes.CDLL(None).mallopt  # (the process's own symbols: its C library's)
    except (OSError, AttributeError):
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_int]
    call.restype = ctypes.c_int
    return bool(call(option, value))
