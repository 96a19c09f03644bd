"""File change events and the sans-IO tracker that decides when to emit them.

This is the core of the FILEMQ publisher (see :mod:`filemq.publisher`, which feeds it from
watchdog). It never touches threads or watchdog; it takes *hints* ("this path was written",
"this path was closed after writing", "this path went away"), a clock value, and a ``stat``
function injected by the caller, and returns :data:`ChangeEvent` values.

Events are state-based: a hint only says *when* to look at a path; what is emitted says
what the path *is* at that moment. A path that is a regular file is reported as
:class:`FileChanged` (with its :class:`FileStamp`), anything else (missing, a directory, a
symlink, a FIFO) as :class:`FileDeleted`. So watchdog's re-ordering (an unpaired move-out is
delayed 0.5 s behind later events) can never make a consumer delete a file that exists.

When to look:

* written (created, modified, attributes changed): once the path has been quiet for
  ``settle`` seconds -- no further hint and an unchanged ``(size, mtime_ns, inode)``
  between the sample taken after the last hint and the check. A changed stamp re-arms
  the wait. This covers writers that keep a file open.
* completed (close-after-write, renamed into place) and removed: at the next
  :meth:`ChangeTracker.poll`, without waiting. The latest hint for a path wins. A close
  that finds exactly the version the settle rule already published is not repeated.
* a removed directory (or one moved out of the root) whose files cannot be listed any
  more: a :class:`RescanNeeded` for that subtree. Requests are coalesced per mount: a
  pending request covers every request below it, and a request is emitted once no new one
  arrived for ``settle`` seconds, or ``rescan_hold`` seconds after the first, whichever
  comes first (an ``rm -rf`` of a thousand folders yields one event).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What identifies one version of a file cheaply: size, mtime in ns and inode."""

    size: int
    mtime_ns: int
    ino: int

    @classmethod
    def from_stat(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(frozen=True, slots=True)
class FileChanged:
    """``relpath`` (POSIX, relative to the mount's root) is a complete regular file.

    ``stamp`` is what the publisher saw when it decided (``None`` only when built by hand).
    """

    mount: str
    relpath: str
    stamp: FileStamp | None = None


@dataclass(frozen=True, slots=True)
class FileDeleted:
    """``relpath`` is no longer a regular file (deleted, moved away, replaced by a non-file)."""

    mount: str
    relpath: str


class RescanReason(StrEnum):
    OVERFLOW = "inotify queue overflowed"
    DIRECTORY_REMOVED = "directory removed or moved away"
    DIRECTORY_CREATED = "directory created"  # (an empty folder is mirrored too)
    ROOT_MISSING = "root directory missing"
    ROOT_RECREATED = "root directory recreated"
    WATCH_LOST = "watch stopped unexpectedly"


@dataclass(frozen=True, slots=True)
class RescanNeeded:
    """Events may have been lost under ``relpath`` ("" is the whole root).

    The consumer must list that subtree again (:func:`filemq.walk.scan_tree`) and diff it
    against its index (:func:`filemq.walk.reconcile`); a missing subtree means empty.
    """

    mount: str
    reason: RescanReason
    relpath: str = ""


ChangeEvent = FileChanged | FileDeleted | RescanNeeded

StatFn = Callable[[str, str], FileStamp | None]
"""``(mount, relpath) -> stamp`` if the path is a regular file inside the root, else None."""

_Key = tuple[str, str]
_SETTLED_MEMORY = 4096  # settle-published stamps remembered to skip a repeat on close


@dataclass(slots=True)
class _Settling:
    deadline: float
    stamp: FileStamp | None = None
    sampled: bool = False


@dataclass(slots=True)
class _PendingRescan:
    reason: RescanReason
    first: float
    deadline: float


class ChangeTracker:
    """Turns path hints into :data:`ChangeEvent` values; see the module docstring.

    Not thread-safe: one worker thread owns it. ``now`` values must not go backwards.
    """

    def __init__(self, stat: StatFn, *, settle: float = 0.05, rescan_hold: float = 1.0) -> None:
        if settle < 0 or rescan_hold < 0:
            raise ValueError("settle and rescan_hold must be >= 0")
        self._stat = stat
        self._settle = settle
        self._rescan_hold = rescan_hold
        # Deadlines are always last-hint + settle with non-decreasing clocks, so insertion
        # order (refreshed with move_to_end) is deadline order: the head is the earliest.
        self._settling: OrderedDict[_Key, _Settling] = OrderedDict()
        self._unsampled: set[_Key] = set()
        self._ready: dict[_Key, None] = {}
        self._rescans: dict[_Key, _PendingRescan] = {}
        # Stamps published by the settle rule, so that the close which usually follows
        # (a writer that paused with its file open) does not announce the same version again.
        self._settled: OrderedDict[_Key, FileStamp] = OrderedDict()

    @property
    def settle(self) -> float:
        return self._settle

    def pending(self) -> int:
        """How many paths and subtrees are waiting for a decision."""
        return len(self._settling) + len(self._ready) + len(self._rescans)

    # -- hints ---------------------------------------------------------------------------

    def written(self, mount: str, relpath: str, now: float) -> None:
        """Created, modified or attributes changed: publish once quiet for ``settle``."""
        key = (mount, relpath)
        self._ready.pop(key, None)
        entry = self._settling.get(key)
        if entry is None:
            self._settling[key] = _Settling(now + self._settle)
        else:
            entry.deadline = now + self._settle
            entry.sampled = False
            self._settling.move_to_end(key)
        self._unsampled.add(key)

    def completed(self, mount: str, relpath: str, now: float) -> None:
        """Closed after writing, or renamed into place: decide at the next poll."""
        self._decide_now((mount, relpath))

    def removed(self, mount: str, relpath: str, now: float) -> None:
        """Deleted or moved away: decide at the next poll (it may exist again by then)."""
        self._decide_now((mount, relpath))

    def moved(self, mount: str, src: str | None, dest: str | None, now: float) -> None:
        """A rename inside the root; ``None`` for a side outside it or ignored.

        The destination is complete unless the source was still being written, in which
        case it keeps waiting for quiet under its new name.
        """
        still_writing = False
        if src is not None:
            still_writing = (mount, src) in self._settling
            self.removed(mount, src, now)
        if dest is not None:
            if still_writing:
                self.written(mount, dest, now)
            else:
                self.completed(mount, dest, now)

    def subtree_removed(self, mount: str, relpath: str, now: float) -> None:
        """A directory went away with files we cannot list any more."""
        self.request_rescan(mount, RescanReason.DIRECTORY_REMOVED, now, relpath)

    def request_rescan(
        self,
        mount: str,
        reason: RescanReason,
        now: float,
        relpath: str = "",
        *,
        immediate: bool = False,
    ) -> None:
        """Ask for a :class:`RescanNeeded`, coalesced with pending ones of the same mount."""
        for key in _ancestors_or_self(mount, relpath):
            covering = self._rescans.get(key)
            if covering is not None:
                covering.deadline = self._rescan_deadline(covering.first, now, immediate)
                return
        first = now
        prefix = relpath + "/"
        for key in [k for k in self._rescans if k[0] == mount]:
            if relpath == "" or key[1].startswith(prefix):
                first = min(first, self._rescans.pop(key).first)
        deadline = self._rescan_deadline(first, now, immediate)
        self._rescans[(mount, relpath)] = _PendingRescan(reason, first, deadline)

    def _rescan_deadline(self, first: float, now: float, immediate: bool) -> float:
        if immediate:
            return now
        return min(first + self._rescan_hold, now + self._settle)

    def _decide_now(self, key: _Key) -> None:
        if self._settling.pop(key, None) is not None:
            self._unsampled.discard(key)
        self._ready.pop(key, None)  # re-insert: emission follows the order of the hints
        self._ready[key] = None

    # -- decisions -----------------------------------------------------------------------

    def sample(self) -> None:
        """Record the stamp of paths written since the last call (call after each batch)."""
        for key in self._unsampled:
            entry = self._settling.get(key)
            if entry is not None:
                entry.stamp = self._stat(*key)
                entry.sampled = True
        self._unsampled.clear()

    def next_deadline(self) -> float | None:
        """When :meth:`poll` next has work (``None``: nothing pending)."""
        if self._ready:
            return float("-inf")
        times: list[float] = []
        if self._settling:
            times.append(next(iter(self._settling.values())).deadline)
        if self._rescans:
            times.append(min(r.deadline for r in self._rescans.values()))
        return min(times) if times else None

    def poll(self, now: float) -> list[ChangeEvent]:
        """Everything due at ``now``, in hint order (rescans last)."""
        out: list[ChangeEvent] = []
        ready, self._ready = self._ready, {}
        for key in ready:
            current = self._stat(*key)
            already = self._settled.pop(key, None)
            if current is None or current != already:
                out.append(self._decide(key, current))
        due: list[tuple[_Key, _Settling]] = []
        while self._settling:
            key, entry = next(iter(self._settling.items()))
            if entry.deadline > now:
                break
            del self._settling[key]
            due.append((key, entry))
        for key, entry in due:
            current = self._stat(*key)
            if current is not None and (not entry.sampled or current != entry.stamp):
                entry.stamp = current  # still changing: wait for another quiet period
                entry.sampled = True
                entry.deadline = now + self._settle
                self._settling[key] = entry
                continue
            self._unsampled.discard(key)
            out.append(self._decide(key, current))
            if current is not None:
                self._remember_settled(key, current)
        if self._rescans:
            for key, rescan in list(self._rescans.items()):
                if rescan.deadline <= now:
                    del self._rescans[key]
                    out.append(RescanNeeded(key[0], rescan.reason, key[1]))
        return out

    def _remember_settled(self, key: _Key, stamp: FileStamp) -> None:
        self._settled[key] = stamp
        self._settled.move_to_end(key)
        if len(self._settled) > _SETTLED_MEMORY:
            self._settled.popitem(last=False)

    @staticmethod
    def _decide(key: _Key, stamp: FileStamp | None) -> ChangeEvent:
        if stamp is None:
            return FileDeleted(*key)
        return FileChanged(key[0], key[1], stamp)


def _ancestors_or_self(mount: str, relpath: str) -> list[_Key]:
    keys = [(mount, "")]
    if relpath:
        parts = relpath.split("/")
        keys.extend((mount, "/".join(parts[: i + 1])) for i in range(len(parts)))
    return keys
