"""The worker threads of one file's writer (``filemq.writer``, ``filemq.stagedwriter``).

A writer queues a file's chunks and its workers write, hash and checkpoint them off the
receive loop.  What both writers share lives here, once: the lock and condition the
workers and the receive loop meet at, the bytes queued and their bound, the first
failure, the stop, and the loop every worker runs (take the next item under the lock,
work on it outside, stop at the first failure).  What a writer queues, and in which
order its workers hand chunks on, stays the writer's.

Rules:

* ``admit`` counts a chunk's bytes as queued (``pending``) and waits while
  ``max_pending`` bytes or more are (a disk slower than the wire holds the loop, not
  memory); ``release`` counts them off once a chunk is done with;
* the first failure (``fail``: an ``OSError``) is kept, and everything after it is cut:
  the writer's ``drop`` clears its queues (nothing queued is written any more), and the
  next ``admit`` or ``settle`` raises it, so the caller drops the file;
* ``discard`` cuts what is queued the same way, without a failure;
* ``take`` waits for the next item of a queue and gives None once the worker is to
  stop: after a cut, or with the queue empty once its producer ended (``stopping``:
  ``stop`` was called; a writer's own end for a queue fed by another worker);
* ``serve`` runs one worker: ``take`` under the lock, ``work`` outside it; ``work``
  returning False, or an ``OSError`` from it (kept: ``fail``), stops the worker;
* ``stop`` lets the workers finish what is queued and joins them.

Every method but ``start``, ``settle``, ``stop``, ``discard`` and ``serve`` is called
with ``cond`` held ("under the lock").
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Workers"]

T = TypeVar("T")


class Workers:
    """One writer's worker threads, the bytes queued for them and their first failure."""

    def __init__(self, max_pending: int, drop: Callable[[], None]) -> None:
        #: The lock and condition of the writer's state (its queues and counts included).
        self.cond = threading.Condition()
        self.max_pending = max(1, max_pending)
        #: Bytes queued and not done with yet.
        self.pending = 0
        #: The first failure (kept: ``admit`` and ``settle`` raise it).
        self.error: OSError | None = None
        #: Nothing more is written (a failure, ``discard``).
        self.cut = False
        #: ``stop`` was called: the workers end once what is queued is done.
        self.stopping = False
        self._drop = drop  # clears the writer's queues (under the lock)
        self._threads: list[threading.Thread] = []

    def check(self) -> None:
        """Raise the failure kept, if any."""
        if self.error is not None:
            raise self.error

    def admit(self, length: int) -> None:
        """Count ``length`` more bytes as queued once there is room; raise a failure."""
        self.check()
        while self.pending >= self.max_pending and self.error is None:
            self.cond.wait()
        self.check()
        self.pending += length
        self.cond.notify_all()

    def release(self, length: int) -> None:
        """A chunk of ``length`` bytes is done with (after a cut nothing is pending)."""
        if not self.cut:
            self.pending -= length
        self.cond.notify_all()

    def start(self, *workers: tuple[str, Callable[[], None]]) -> None:
        """Start the (name, function) workers, unless they are running already."""
        if self._threads:
            return
        for name, work in workers:
            thread = threading.Thread(target=work, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def settle(self, owed: Callable[[], object]) -> None:
        """Wait until ``owed()`` is false (the writer's "all done") or a failure; raise it."""
        with self.cond:
            while owed() and self.error is None:
                self.cond.wait()
            self.check()

    def stop(self) -> None:
        """Let the workers finish what is queued, then join them."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def discard(self) -> None:
        """Drop what is queued and stop the workers (after the item each is at)."""
        with self.cond:
            self.cut_off()
        self.stop()

    def cut_off(self) -> None:
        """Nothing queued is written any more."""
        self.cut = True
        self.pending = 0
        self._drop()
        self.cond.notify_all()

    def fail(self, exc: OSError) -> None:
        """Keep the first failure; nothing queued after it is written."""
        if self.error is None:
            self.error = exc
        self.cut_off()

    def take(self, queue: deque[T], ended: Callable[[], bool] | None = None) -> T | None:
        """The next item of ``queue``, or None: stop (a cut; empty once ``ended()``,
        ``stopping`` by default)."""
        done = ended if ended is not None else (lambda: self.stopping)
        while not queue and not self.cut and not done():
            self.cond.wait()
        if self.cut or not queue:
            return None
        return queue.popleft()

    def serve(self, take: Callable[[], T | None], work: Callable[[T], bool]) -> None:
        """One worker's loop: ``take`` (under the lock) until None, ``work`` on each
        item (outside it) until it returns False or fails."""
        cond = self.cond
        while True:
            with cond:
                item = take()
            if item is None:
                return
            try:
                if not work(item):
                    return
            except OSError as exc:
                with cond:
                    self.fail(exc)
                return
