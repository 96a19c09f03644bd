"""Frames of big file chunks, used again once libzmq has sent them (``filemq.server``).

A big chunk is read straight into its CHEEZBURGER frame (``ServerSession.chunk_buffer``)
and sent zero-copy: libzmq holds the frame until its bytes are in the kernel.  A new
``bytearray`` per chunk is zeroed by Python before the file's bytes overwrite it (a 1 MiB
memset per chunk: as much CPU as the copy the head encoder removed).  The pool hands
out a frame whose last send is done (``zmq.MessageTracker``) instead.

Rules:

* a frame is handed out again only after the tracker of its last send says done
  (libzmq released it); a frame never sent (a client parked or dropped, a short read)
  is never reused: it is not in the pool;
* frames are matched by exact length (the middle chunks of a file all have the same
  head, so the same length); its content is whatever the last chunk left: the caller
  overwrites all of it;
* the pool keeps at most ``keep`` finished frames (``DEFAULT_KEEP``: 8 frames, 8 MiB
  with the default 1 MiB chunk); frames in flight are libzmq's (bounded by each
  client's pipe, ``filemq.server``), the pool only remembers them.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

__all__ = ["DEFAULT_KEEP", "FramePool", "Tracker"]

#: Finished frames kept for the next chunks (memory: this many chunk-size frames).
DEFAULT_KEEP = 8
#: Lent frames looked at per ``take`` (a bound on the work of one call).
_SCAN = 16


class Tracker(Protocol):
    """What ``zmq.MessageTracker`` offers: has libzmq released the message?"""

    @property
    def done(self) -> bool: ...


class FramePool:
    """Frames handed out by ``take``, remembered with ``lent`` until their send is done."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        self.keep = keep
        self._lent: deque[tuple[bytearray, Tracker]] = deque()
        self._free: list[bytearray] = []

    def take(self, size: int) -> bytearray:
        """A frame of ``size`` octets, content unspecified (the caller fills all of it)."""
        self._collect()
        free = self._free
        for i in range(len(free) - 1, -1, -1):
            if len(free[i]) == size:
                return free.pop(i)
        return bytearray(size)

    def lent(self, frame: bytearray, tracker: Tracker) -> None:
        """``frame`` was handed to libzmq; ``tracker`` says when it is done with it."""
        self._lent.append((frame, tracker))

    @property
    def in_flight(self) -> int:
        """Frames lent and not (yet) seen done."""
        return len(self._lent)

    def _collect(self) -> None:
        """Move frames whose sends are done to the free list: the oldest ``_SCAN`` lent
        looked at, one still in flight goes to the back (a client that stops reading
        holds its own frames, not everybody's)."""
        lent, free = self._lent, self._free
        for _ in range(min(len(lent), _SCAN)):
            frame, tracker = lent[0]
            if not tracker.done:
                lent.rotate(-1)
                continue
            lent.popleft()
            if len(free) >= self.keep:  # keep the newest: a new file's sizes replace old ones
                free.pop(0)
            free.append(frame)
