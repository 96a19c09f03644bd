"""A folder's entries ``lstat``-ed by two threads (``FileIndex.refresh``).

A server starting from a valid saved index, and a mirror refreshing DEST's index, look at
every file once more: one ``lstat`` each, most of the start's time.  ``lstat`` releases
the GIL, so ``PairedStat`` has a worker thread stat the second half of a folder's entries
while the caller stats the first half: on a machine with a second CPU free the walk
waits for half the calls.

Rules:

* ``stat_all(entries)`` gives every entry's ``stat(follow_symlinks=False)`` in the
  order given (each ``os.DirEntry`` keeps its result, as when the caller stats it), or
  raises the ``OSError`` of the first half, else the exception of the second: only once
  both halves
  are done, so no entry is in use by the worker when it returns or raises;
* the entries come from a descriptor-based ``os.scandir`` (one folder, no link
  followed): the worker looks up the same names in the same folder, nothing else;
* a list shorter than ``PAIR_MIN`` is stat-ed by the caller alone (a hand-off costs
  more than it saves), and so is every list when the process may run on one CPU only;
* the worker starts with the first long list; ``close`` stops it (``contextlib.closing``);
  one caller at a time.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Sequence
from operator import methodcaller

__all__ = ["PAIR_MIN", "PairedStat"]

#: Entries below which one thread stats them all: a hand-off (two queue operations, a
#: thread wake-up) cost ~50-100 us of CPU here (load 60), 15-25 ``lstat`` calls (not tuned).
PAIR_MIN = 32

_LSTAT = methodcaller("stat", follow_symlinks=False)


class PairedStat:
    """``lstat`` of ``os.DirEntry`` lists, halves on two threads; see the module doc."""

    def __init__(self, *, paired: bool | None = None) -> None:
        if paired is None:
            paired = len(os.sched_getaffinity(0)) > 1
        self._paired = paired
        self._jobs: queue.SimpleQueue[Sequence[os.DirEntry[str]] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[list[os.stat_result] | Exception] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def stat_all(self, entries: Sequence[os.DirEntry[str]]) -> list[os.stat_result]:
        """Every entry's ``lstat``, in order; raises the first ``OSError`` (module doc)."""
        if not self._paired or len(entries) < PAIR_MIN:
            return list(map(_LSTAT, entries))
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="filemq-lstat", daemon=True)
            self._thread.start()
        half = len(entries) // 2
        self._jobs.put(entries[half:])
        try:
            first = list(map(_LSTAT, entries[:half]))
        finally:
            second = self._results.get()  # (the worker is done with its half either way)
        if isinstance(second, Exception):
            raise second
        first += second
        return first

    def close(self) -> None:
        """Stop the worker (when one was started)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _work(self) -> None:
        jobs, results = self._jobs, self._results
        while (entries := jobs.get()) is not None:
            try:
                results.put(list(map(_LSTAT, entries)))
            except Exception as exc:  # (handed to the caller, who raises it)
                results.put(exc)
