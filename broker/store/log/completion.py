"""Completion of appends: tickets, waiting, and a file descriptor for event loops.

Every write call of the store returns a ticket: an integer that grows by one per call.
Tickets complete in order, so one number says it all: ``done`` is the highest ticket
complete.  Three ways to learn of it:

- ``wait(ticket, timeout)``: blocks a thread (producers on threads, tests);
- a callback given to the store, called on the writer thread with the new ``done``
  before waiters and the descriptor learn of it (it must be quick and must not call the
  store's write methods or ``close``);
- ``fileno()`` for a single-threaded event loop (the ZeroMQ server): register it with a
  ``zmq.Poller`` (POLLIN); when it is readable call ``drain()``, which empties the
  descriptor and returns ``done``; then release every reply held for a ticket up to it.
  The loop never blocks on the store: ``append`` returns at once with a ticket.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable


class Completions:
    def __init__(self, callback: Callable[[int], None] | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._done = 0
        self._failed: BaseException | None = None
        self._callback = callback
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._signalled = False

    @property
    def done(self) -> int:
        return self._done

    @property
    def failed(self) -> BaseException | None:
        return self._failed

    def fileno(self) -> int:
        return self._read_fd

    def complete(self, ticket: int) -> None:
        """Everything up to ``ticket`` is complete (called by the writer thread only).

        The callback runs first, then waiters wake and the descriptor is signalled: who
        learns of a completion by ``wait`` or ``fileno`` finds the callback already run.
        """
        if ticket <= self._done:
            return
        if self._callback is not None:
            self._callback(ticket)
        with self._cond:
            self._done = ticket
            self._cond.notify_all()
            signal = not self._signalled
            self._signalled = True
        if signal:
            with contextlib.suppress(BlockingIOError):
                os.write(self._write_fd, b"\x01")

    def fail(self, error: BaseException) -> None:
        """The writer stopped: waiters wake up and see the error."""
        with self._cond:
            self._failed = error
            self._cond.notify_all()
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write_fd, b"\x01")

    def drain(self) -> int:
        """Empty the descriptor; the highest complete ticket.

        The descriptor is read empty first, then the flag cleared under the lock: a
        completion racing the read either finds the flag still set (and its ticket is
        in the ``done`` returned here) or finds it cleared and signals anew.  Clearing
        it first could let the read swallow a new signal and leave the flag set with
        the descriptor empty: silent for every later completion."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass
        with self._cond:
            self._signalled = False
            return self._done

    def wait(self, ticket: int, timeout: float | None = None) -> bool:
        """Block until ``ticket`` is complete (True), the timeout passes or the writer
        failed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._done < ticket and self._failed is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return self._done >= ticket

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
