"""A loop's wake-up from other threads: a pipe the loop polls as a plain descriptor.

What an inproc PAIR did for the broker's server loop (``stop()``) and the blocking client's
I/O thread (an outbox that filled, ``close()``), for fewer system calls: a poll over
ZeroMQ sockets asks each for ``ZMQ_EVENTS`` (a system call on its mailbox) in each of its
passes, and reading a PAIR until it is empty ends in a receive that raises ``zmq.Again``
(an exception built in Python); a descriptor is polled as it is, and read in one call.

``notify`` never blocks (a full pipe already wakes the loop: the octet is dropped);
``close`` by the loop's thread and ``notify`` by another may race: a lock keeps the
descriptors valid while either runs, and a notify after the close does nothing.
"""

from __future__ import annotations

import os
import threading

#: Octets read at once: far more than the notes a loop may have pending.
_READ = 4096


class Wakeup:
    """One pipe: the loop polls :meth:`fileno` and calls :meth:`take`; other threads
    call :meth:`notify` (see the module docstring)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()

    def fileno(self) -> int:
        return self._read

    def notify(self, note: bytes = b"\0") -> None:
        """Make the descriptor readable; ``note`` (one octet) is what :meth:`take` reads."""
        with self._lock:
            if self._write < 0:
                return
            try:  # noqa: SIM105 (contextlib.suppress: three Python calls per wake-up)
                os.write(self._write, note)
            except BlockingIOError:
                pass  # full: readable already

    def take(self) -> bytes:
        """The notes written since the last call (b"": none); not readable afterwards."""
        with self._lock:
            if self._read < 0:
                return b""
            try:
                return os.read(self._read, _READ)
            except BlockingIOError:
                return b""

    def close(self) -> None:
        """Close both ends (idempotent)."""
        with self._lock:
            for fd in (self._read, self._write):
                if fd >= 0:
                    os.close(fd)
            self._read = self._write = -1
