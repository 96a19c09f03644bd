"""Whole small files put in place on a worker thread while the receive loop decodes the
next ones (``filemq.client``).

A cold mirror of many small files spends most of its time in the kernel: create the
temp file, write it, stamp it, rename it into place (``filemq.mirror``).  Those calls
release the GIL, so ``Placer`` runs them on one worker thread while the client's loop
receives, decodes and checks the next messages: the file system's work and Python's
overlap instead of taking turns.

Rules:

* jobs run one at a time, in the order submitted (a later version of a name is placed
  after the earlier one); a job's result (or the exception it raised) is kept, and
  ``settle`` hands them all back in that order once every job submitted has run;
* the caller uses the worker's objects (the ``Mirror``, its index) only between
  ``settle`` and the next ``submit``: the client settles before any other action on
  DEST (a delete, a folder, a file in chunks, a DEST check, saving the index) and
  before it waits on a socket with no message left, so nothing else ever runs beside
  a job (sending credit does, it touches no file);
* at most ``max_pending`` content bytes wait for the worker (default
  ``MAX_PENDING``, 8 MiB): ``submit`` blocks beyond that, so a disk slower than the
  wire holds the receive loop (and the credit it grants) instead of filling memory;
* a job's content stays alive until its outcome is collected (the token holds it):
  :attr:`held` counts it, and the submitter collects when it reaches ``max_pending``
  (the client does, before its next small file), so a disk as fast as the wire does not
  fill memory either; the worker keeps nothing of a run once it is done.  ``collect``
  takes the outcomes of the runs done so far (waiting for one when none is), so the
  worker keeps working meanwhile: at the bound the two go in step instead of the
  worker's queue running dry every ``max_pending`` bytes;
* ``close`` lets the jobs submitted run, then stops the worker.

The worker takes the jobs queued in runs of at most ``_RUN`` (one lock round, one
wake-up of whoever waits, per run rather than per file: measured in docs/performance.md, "FILEMQ
small files, session 13"); a run's content counts as pending until the run is done.

The worker starts with the first job (a mirror that receives no small file has none).
``Placer(thread=False)`` runs each job in ``submit`` itself (no worker, no hand-off;
outcomes still wait for ``settle``): the same rules, for a mirror whose file creation is
cheaper than a thread hand-off (``filemq sync --placer inline``, and the default on one
CPU; see docs/performance.md's tables).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["MAX_PENDING", "Placer"]

#: Content bytes submitted and not yet placed before ``submit`` waits.
MAX_PENDING = 8 << 20
#: Jobs queued before a waiting worker is woken (``settle`` wakes it for fewer): one
#: wake-up (futex calls, a GIL hand-off) per few small files, not per file.
_HANDOFF = 4
#: Jobs the worker takes from the queue at once (their outcomes come back together).
_RUN = 32

T = TypeVar("T")


class Placer(Generic[T]):
    """Run jobs on one worker thread, in order; ``settle`` collects their outcomes."""

    def __init__(self, max_pending: int = MAX_PENDING, *, thread: bool = True) -> None:
        self._max_pending = self.max_pending = max(1, max_pending)
        #: Content bytes submitted whose outcome was not collected yet (``settle``): what
        #: the placer keeps alive, queued, being placed or placed -- a job's token (the
        #: client's chunk) holds its content until then.  Read by the submitter, which
        #: settles once it reaches ``max_pending`` (``submit`` alone cannot: an outcome is
        #: handed back only by ``settle``).  Changed only by the submitting thread.
        self.held = 0
        self._inline = not thread
        self._jobs: deque[tuple[Callable[[], T], int, Any]] = deque()
        self._done: list[tuple[Any, T | Exception]] = []
        self._done_bytes = 0  # content bytes of the jobs in ``_done``
        self._pending = 0  # content bytes of the jobs not run yet
        self._running = False  # the worker is in a run of jobs
        self._idle = False  # the worker waits for jobs
        self._stopping = False
        #: The lock of ``_cond``, taken straight where no wait follows (``submit``, once
        #: per file: a ``Condition``'s own ``with`` is two Python calls more).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], T], size: int, token: Any) -> None:
        """Queue ``job`` (``size`` content bytes); ``token`` comes back with its outcome."""
        self.held += size
        if self._inline:
            self._done.append((token, _outcome(job)))
            self._done_bytes += size
            return
        with self._lock:
            while self._pending >= self._max_pending and (self._jobs or self._running):
                self._cond.wait()
            self._jobs.append((job, size, token))
            self._pending += size
            if self._idle and (len(self._jobs) >= _HANDOFF or self._pending >= self._max_pending):
                self._cond.notify_all()  # (a worker that waits sees a few at once)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="filemq-placer", daemon=True)
            self._thread.start()

    @property
    def settled(self) -> bool:
        """Every job submitted has run and its outcome was collected (``settle``)."""
        with self._cond:
            return not self._jobs and not self._running and not self._done

    def settle(self) -> list[tuple[Any, T | Exception]]:
        """Wait until every job submitted has run: (token, result or exception) each,
        in the order submitted, and forget them."""
        with self._cond:
            self._cond.notify_all()  # (the jobs the worker was not woken for yet)
            while self._jobs or self._running:
                self._cond.wait()
            done, self._done = self._done, []
            self._done_bytes = 0
        self.held = 0
        return done

    def collect(self) -> list[tuple[Any, T | Exception]]:
        """The outcomes of the jobs run so far, in the order submitted, forgotten; the
        rest go on meanwhile.  Waits for the worker's current run when nothing is done
        yet (and something was submitted).  Between ``collect`` and the next ``submit``
        the worker may still run jobs: the caller may not use its objects then."""
        with self._cond:
            if not self._done and (self._jobs or self._running):
                self._cond.notify_all()  # (the jobs the worker was not woken for yet)
                while not self._done and (self._jobs or self._running):
                    self._cond.wait()
            done, self._done = self._done, []
            self.held -= self._done_bytes
            self._done_bytes = 0
        return done

    def close(self) -> None:
        """Run what was submitted, then stop the worker (outcomes stay for ``settle``)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._cond:
            self._stopping = False

    def _work(self) -> None:
        cond = self._cond
        jobs = self._jobs
        while True:
            with cond:
                while not jobs and not self._stopping:
                    self._idle = True
                    cond.wait()
                    self._idle = False
                if not jobs:
                    return
                run = [jobs.popleft() for _ in range(min(len(jobs), _RUN))]
                self._running = True
            outcomes = [(token, _outcome(job)) for job, _size, token in run]
            with cond:
                self._running = False
                ran = sum(size for _job, size, _token in run)
                self._pending -= ran
                self._done += outcomes
                self._done_bytes += ran
                del run, outcomes  # (their content is not kept alive while this waits)
                cond.notify_all()


def _outcome(job: Callable[[], T]) -> T | Exception:
    """What ``job`` returned, or the exception it raised: handed to the caller, who
    decides (as if it ran there)."""
    try:
        return job()
    except Exception as exc:
        return exc
