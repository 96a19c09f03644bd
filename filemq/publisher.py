"""Publisher: file-system activity under published directories -> a clean change stream.

No sockets here. The FILEMQ server gives a :class:`Publisher` its mounts
(``{mount name: root directory}``) and a sink, and receives :data:`ChangeEvent` values
(:mod:`filemq.changes`) as files become complete:

* :class:`FileChanged` ``(mount, relpath, stamp)`` -- ``relpath`` is a regular file now;
* :class:`FileDeleted` ``(mount, relpath)`` -- it is not any more;
* :class:`RescanNeeded` ``(mount, reason, relpath)`` -- changes under that subtree ("" is
  the whole root) may have been lost: list it again with :func:`filemq.walk.stamp_tree`
  and diff with :func:`filemq.walk.reconcile`.

Start the publisher *before* the consumer's initial scan, so nothing changes unseen in
between; the publisher itself does not announce files that exist when it starts.

When a file is complete (the settle rules live in :class:`~filemq.changes.ChangeTracker`):

* on close-after-write (inotify ``IN_CLOSE_WRITE``): at once, whatever ``settle`` is;
* renamed into place (the write-temp-then-rename pattern): at once;
* otherwise (writers that keep a file open, polling observers, files found in new
  directories): when no event arrived and ``(size, mtime_ns, inode)`` did not change for
  ``settle`` seconds (default 0.05).

A move inside a root is ``FileDeleted(old)`` then ``FileChanged(new)``; a directory moved
inside a root yields that pair for every file below it (watchdog lists them). A directory
deleted or moved out of the root yields ``FileDeleted`` for each file inotify reported and
one coalesced ``RescanNeeded(relpath=dir)``, because files moved away with their directory
cannot be listed any more.  A directory created yields ``RescanNeeded(DIRECTORY_CREATED,
relpath=dir)``: folders are mirrored too, empty ones included.  Creations in directories
made after start are seen (watchdog scans a new directory as it adds its watch).
Symlinks are never followed (a symlink is not a regular file: it reads as deleted), and a
path is only reported as a file if no component below the root is a symlink. Names
matching ``ignore`` (default: FILEMQ client temp files, :data:`filemq.walk.DEFAULT_IGNORE`)
or not valid UTF-8 are never reported.

Never missing a change: an inotify queue overflow (detected through
:mod:`filemq.inotify_observer`) yields ``RescanNeeded(reason=OVERFLOW)`` after watchdog has
rebuilt its watches. Every ``check_interval`` the worker also verifies each root: a root
removed yields ``RescanNeeded(ROOT_MISSING)``; when it is back (or was replaced by another
directory, or its watch thread died) it is watched again and ``RescanNeeded`` follows.

Threads: watchdog's observer threads only enqueue raw events (the handler does nothing
else); one worker thread owns the tracker, stats files, and calls the sink (a callable, or
anything with ``put``). ``stop()`` wakes the worker with a sentinel and joins it with a
timeout, then stops the observer. Settling files not yet decided at stop are dropped.

Limits: changes made through a hard link outside the root, or by mmap writes that no event
reports, are only seen on the next event or rescan; with a polling observer use a
``settle`` at least as long as its polling interval. inotify needs one watch per directory
(``/proc/sys/fs/inotify/max_user_watches``); directories watchdog fails to watch are
not reported.
"""

from __future__ import annotations

import logging
import os
import queue
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, cast, runtime_checkable

from watchdog.events import (
    EVENT_TYPE_ATTRIB,
    EVENT_TYPE_CLOSED,
    EVENT_TYPE_CREATED,
    EVENT_TYPE_DELETED,
    EVENT_TYPE_MODIFIED,
    EVENT_TYPE_MOVED,
    DirCreatedEvent,
    DirDeletedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver, ObservedWatch

from filemq.changes import (
    ChangeEvent,
    ChangeTracker,
    FileChanged,
    FileDeleted,
    FileStamp,
    RescanNeeded,
    RescanReason,
)
from filemq.paths import UnsafePathError, local_parts, lstat_beneath
from filemq.walk import DEFAULT_IGNORE, PathFilter

__all__ = [
    "DEFAULT_IGNORE",
    "ChangeEvent",
    "FileChanged",
    "FileDeleted",
    "FileStamp",
    "Publisher",
    "RescanNeeded",
    "RescanReason",
    "default_observer",
]

logger = logging.getLogger(__name__)

EVENT_TYPE_QUEUE_OVERFLOW = "queue_overflow"  # filemq.inotify_observer.QueueOverflowEvent
# What the publisher listens to. Narrowing the inotify mask matters: without it every read
# of a published file (by the FILEMQ server itself) would queue open/close-nowrite events.
_WANTED_EVENTS = (
    FileCreatedEvent,
    FileModifiedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirDeletedEvent,
    DirCreatedEvent,  # (a folder that may stay empty: mirrored too)
)
_BATCH = 4096  # raw events handled between two polls of the tracker
_STOP = object()


@runtime_checkable
class _Putter(Protocol):
    def put(self, item: ChangeEvent, /) -> Any: ...


Sink = Callable[[ChangeEvent], Any] | _Putter


def default_observer() -> BaseObserver:
    """inotify with overflow reporting on Linux; watchdog's best observer elsewhere."""
    if sys.platform.startswith("linux"):
        from filemq import inotify_observer

        if inotify_observer.overflow_hook_available():
            return inotify_observer.OverflowAwareInotifyObserver()
        logger.warning("this watchdog does not report inotify overflows; upgrade to >= 7.1")
    from watchdog.observers import Observer

    return Observer()


class MountState(Enum):
    WATCHING = "watching"
    LOST = "lost"  # root missing (or unwatchable): waiting for it to come back


@dataclass(slots=True)
class _Mount:
    name: str
    root: str
    watch: ObservedWatch | None = None
    identity: tuple[int, int] | None = None
    state: MountState = MountState.LOST


class _Enqueuer(FileSystemEventHandler):
    """The only code running in watchdog's threads: tag the raw event, enqueue it."""

    def __init__(self, mount: str, raw: queue.SimpleQueue[object]) -> None:
        super().__init__()
        self._mount = mount
        self._raw = raw

    def dispatch(self, event: FileSystemEvent) -> None:
        self._raw.put((self._mount, event))


def _dir_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class Publisher:
    """Watch ``mounts`` and send :data:`ChangeEvent` values to ``sink``; see the module doc.

    ``observer_factory`` builds the watchdog observer (default :func:`default_observer`;
    tests may pass ``lambda: PollingObserver(timeout=0.05)``). Roots are resolved once, at
    construction (a symlinked root is followed there, never below). ``clock`` must be
    monotonic. A sink that blocks holds the stream back; raw events queue up meanwhile.
    """

    def __init__(
        self,
        mounts: Mapping[str, str | os.PathLike[str]],
        sink: Sink,
        *,
        observer_factory: Callable[[], BaseObserver] | None = None,
        settle: float = 0.05,
        ignore: Iterable[str] = DEFAULT_IGNORE,
        check_interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        join_timeout: float = 5.0,
        log: logging.Logger | None = None,
    ) -> None:
        if not mounts:
            raise ValueError("no mounts to publish")
        if check_interval <= 0:
            raise ValueError("check_interval must be > 0")
        self._mounts = {
            name: _Mount(name, str(Path(root).resolve())) for name, root in mounts.items()
        }
        self._emit: Callable[[ChangeEvent], Any] = sink.put if isinstance(sink, _Putter) else sink
        self._observer_factory = observer_factory or default_observer
        self._filter = PathFilter(ignore)
        self._check_interval = check_interval
        self._clock = clock
        self._join_timeout = join_timeout
        self._log = log or logger
        self._raw: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._tracker = ChangeTracker(self._stat_in_root, settle=settle)
        self._observer: BaseObserver | None = None
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()  # start/stop

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def roots(self) -> dict[str, str]:
        """The resolved root directory of each mount."""
        return {name: m.root for name, m in self._mounts.items()}

    @property
    def running(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    def start(self, folders: Mapping[str, Iterable[str]] | None = None) -> None:
        """Watch every root (the watches are in place on return) and start the worker.

        ``folders``: mount name -> the folders below its root known to be there (a
        saved index): an observer that can (inotify) watches those instead of walking
        the tree; the caller then reports the folders it finds that were not in it
        (:meth:`watch_folders`).  Raises NotADirectoryError if a root is not an
        existing directory.
        """
        with self._lock:
            if self._worker is not None:
                raise RuntimeError("publisher already started")
            for m in self._mounts.values():
                if _dir_identity(m.root) is None:
                    raise NotADirectoryError(f"mount {m.name!r}: {m.root} is not a directory")
            observer = self._observer_factory()
            try:
                seed = getattr(observer, "seed_folders", None)
                for name, known in (folders or {}).items():
                    if seed is not None and name in self._mounts:
                        seed(self._mounts[name].root, known)
                for m in self._mounts.values():
                    self._schedule(observer, m)
                observer.start()
            except BaseException:
                _stop_observer(observer, self._join_timeout)
                raise
            self._observer = observer
            self._worker = threading.Thread(target=self._run, name="filemq-publisher", daemon=True)
            self._worker.start()

    def watch_folders(self, mount: str, folders: Iterable[str]) -> None:
        """Watch ``folders`` of ``mount`` (relative names) and what is below them: folders
        found on the disk that the ``folders`` given to :meth:`start` did not name (an
        observer that walked the tree at start watches them already)."""
        self._call_observer("watch_folders", mount, folders)

    def unwatch_folders(self, mount: str, folders: Iterable[str]) -> None:
        """Stop watching ``folders`` of ``mount``: gone, or no longer folders (a link)."""
        self._call_observer("unwatch_folders", mount, folders)

    def _call_observer(self, method: str, mount: str, folders: Iterable[str]) -> None:
        call = getattr(self._observer, method, None)
        root = self._mounts.get(mount)
        if call is not None and root is not None and root.state is MountState.WATCHING:
            call(root.root, list(folders))

    def stop(self) -> None:
        """Stop the worker, then the observer; idempotent."""
        with self._lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._raw.put(_STOP)
                worker.join(self._join_timeout)
                if worker.is_alive():
                    self._log.error(
                        "publisher worker did not stop within %.1f s", self._join_timeout
                    )
            observer, self._observer = self._observer, None
            if observer is not None:
                _stop_observer(observer, self._join_timeout)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def simulate_overflow(self) -> None:
        """Act as if the kernel had dropped events: every mount gets ``RescanNeeded(OVERFLOW)``.

        With :class:`~filemq.inotify_observer.OverflowAwareInotifyObserver` the synthetic
        ``IN_Q_OVERFLOW`` goes through watchdog's own recovery (watches rebuilt); with any
        other observer an overflow event is queued for each mount directly.
        """
        observer = self._observer
        if observer is None:
            raise RuntimeError("publisher is not running")
        simulate = getattr(observer, "simulate_overflow", None)
        if callable(simulate):
            simulate()
            return
        from filemq.inotify_observer import QueueOverflowEvent

        for m in self._mounts.values():
            self._raw.put((m.name, QueueOverflowEvent(m.root)))

    # -- worker --------------------------------------------------------------------------

    def _run(self) -> None:
        next_check = self._clock() + self._check_interval
        while True:
            deadline = self._tracker.next_deadline()
            wake = next_check if deadline is None else min(deadline, next_check)
            batch = self._next_batch(max(0.0, wake - self._clock()))
            stopping = False
            now = self._clock()
            for item in batch:
                if item is _STOP:
                    stopping = True
                    continue
                mount, event = cast("tuple[str, FileSystemEvent]", item)
                try:
                    self._apply(mount, event, now)
                except Exception:
                    self._log.exception("publisher: cannot handle %r", event)
            if stopping:
                return
            now = self._clock()
            if now >= next_check:
                self._check_roots(now)
                next_check = now + self._check_interval
            try:
                self._tracker.sample()
                changes = self._tracker.poll(self._clock())
            except Exception:  # a bug must not end the stream: log it, keep watching
                self._log.exception("publisher: deciding changes failed")
                continue
            for change in changes:
                self._send(change)

    def _next_batch(self, timeout: float) -> list[object]:
        try:
            batch = [self._raw.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(batch) < _BATCH:
            try:
                batch.append(self._raw.get_nowait())
            except queue.Empty:
                break
        return batch

    def _send(self, change: ChangeEvent) -> None:
        try:
            self._emit(change)
        except Exception:
            self._log.exception("publisher: sink failed on %r", change)

    def _apply(self, mount_name: str, event: FileSystemEvent, now: float) -> None:
        mount = self._mounts[mount_name]
        kind = event.event_type
        if kind == EVENT_TYPE_QUEUE_OVERFLOW:
            self._log.warning("mount %r: inotify queue overflowed, rescan needed", mount_name)
            self._tracker.request_rescan(mount_name, RescanReason.OVERFLOW, now)
            return
        src = self._relpath(mount, event.src_path)
        if event.is_directory:
            if kind == EVENT_TYPE_DELETED and src == "":
                self._root_lost(mount, now)
            elif kind == EVENT_TYPE_DELETED and src:
                self._tracker.subtree_removed(mount_name, src, now)
            elif kind == EVENT_TYPE_CREATED and src:  # the folder itself (it may stay empty)
                self._tracker.request_rescan(mount_name, RescanReason.DIRECTORY_CREATED, now, src)
            # Created/moved directories: watchdog reports the files inside them.
            return
        if kind == EVENT_TYPE_MOVED:  # either side may be outside the root or ignored
            dest = self._relpath(mount, event.dest_path) if event.dest_path else None
            self._tracker.moved(mount_name, src or None, dest or None, now)
        elif not src:
            return
        elif kind in (EVENT_TYPE_CREATED, EVENT_TYPE_MODIFIED, EVENT_TYPE_ATTRIB):
            self._tracker.written(mount_name, src, now)
        elif kind == EVENT_TYPE_CLOSED:
            self._tracker.completed(mount_name, src, now)
        elif kind == EVENT_TYPE_DELETED:
            self._tracker.removed(mount_name, src, now)

    def _relpath(self, mount: _Mount, path: bytes | str) -> str | None:
        """Relpath of an event path under the mount's root; None if outside or unpublished."""
        p = os.fsdecode(path)
        if p == mount.root:
            return ""
        prefix = mount.root if mount.root.endswith(os.sep) else mount.root + os.sep
        if not p.startswith(prefix):
            return None
        rel = p[len(prefix) :]
        if os.sep != "/":
            rel = rel.replace(os.sep, "/")
        return rel if self._filter.accepts(rel) else None

    def _stat_in_root(self, mount_name: str, relpath: str) -> FileStamp | None:
        """Stamp of a regular file reached without symlinks from the root, else None.

        (``filemq.paths.lstat_beneath``: the one symlink policy of filemq.)
        """
        mount = self._mounts[mount_name]
        try:
            st = lstat_beneath(mount.root, local_parts(relpath))
        except (OSError, UnsafePathError):
            return None
        return FileStamp.from_stat(st) if stat.S_ISREG(st.st_mode) else None

    # -- roots ---------------------------------------------------------------------------

    def _schedule(self, observer: BaseObserver, mount: _Mount) -> None:
        mount.identity = _dir_identity(mount.root)
        mount.watch = observer.schedule(
            _Enqueuer(mount.name, self._raw),
            mount.root,
            recursive=True,
            event_filter=list(_WANTED_EVENTS),
            follow_symlink=False,
        )
        mount.state = MountState.WATCHING

    def _unschedule(self, mount: _Mount) -> None:
        watch, mount.watch = mount.watch, None
        if watch is not None and self._observer is not None:
            try:
                self._observer.unschedule(watch)
            except Exception:  # already gone with its emitter
                self._log.debug("unschedule %s failed", mount.root, exc_info=True)

    def _root_lost(self, mount: _Mount, now: float) -> None:
        if mount.state is MountState.LOST:
            return
        self._log.warning("mount %r: root %s disappeared", mount.name, mount.root)
        self._unschedule(mount)
        mount.state = MountState.LOST
        mount.identity = None
        self._tracker.request_rescan(mount.name, RescanReason.ROOT_MISSING, now, immediate=True)
        self._check_mount(mount, now)  # recreated already?

    def _check_roots(self, now: float) -> None:
        for mount in self._mounts.values():
            try:
                self._check_mount(mount, now)
            except Exception:
                self._log.exception("mount %r: root check failed", mount.name)

    def _check_mount(self, mount: _Mount, now: float) -> None:
        identity = _dir_identity(mount.root)
        if mount.state is MountState.WATCHING:
            if identity is None:
                self._root_lost(mount, now)
                return
            if identity != mount.identity:
                reason = RescanReason.ROOT_RECREATED
            elif not self._emitter_alive(mount):
                reason = RescanReason.WATCH_LOST
            else:
                return
            self._log.warning("mount %r: %s, watching again", mount.name, reason.value)
            self._unschedule(mount)
        elif identity is None:
            return
        else:
            reason = RescanReason.ROOT_RECREATED
        if self._observer is None:
            return
        try:
            self._schedule(self._observer, mount)
        except OSError as exc:
            self._log.warning("mount %r: cannot watch %s yet: %s", mount.name, mount.root, exc)
            mount.state = MountState.LOST
            mount.watch = None
            return
        self._tracker.request_rescan(mount.name, reason, now, immediate=True)

    def _emitter_alive(self, mount: _Mount) -> bool:
        emitters = getattr(self._observer, "emitters", None)
        if emitters is None or mount.watch is None:
            return True
        for emitter in list(emitters):
            if emitter.watch == mount.watch:
                return bool(emitter.is_alive())
        return False


def _stop_observer(observer: BaseObserver, timeout: float) -> None:
    try:
        observer.stop()
    finally:
        if observer.is_alive():
            observer.join(timeout)
