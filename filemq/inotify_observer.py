"""A watchdog inotify observer that reports kernel queue overflows as an event.

When the kernel's inotify queue overflows (``max_queued_events``, 16384 by default) it
drops events and queues one ``IN_Q_OVERFLOW``. watchdog 7.1 handles that inside
``InotifyFD.handle_event``: it logs "Inotify queue overflowed" and calls
``on_queue_overflow()`` on every watch group sharing the inotify descriptor, which rebuilds
recursive watches and discards pending move events -- but it puts nothing in the event
queue, so handlers never learn that changes were lost.

:class:`OverflowAwareInotifyObserver` is watchdog's ``InotifyObserver`` with an emitter
whose watch group, after watchdog's own recovery (so the watches are back in place),
queues a :class:`QueueOverflowEvent` for the watched root. Handlers see it like any other
event; the publisher turns it into :class:`~filemq.changes.RescanNeeded`.

Seeded start: watchdog adds a recursive watch by walking the whole tree (``os.walk``: every
file of every folder is listed, ~0.1 CPU-s for 100,000 files in 1,000 folders).  A caller
that already knows the folders (a file server with its saved index) passes them to
:meth:`OverflowAwareInotifyObserver.seed_folders` before ``schedule``: the first activation
then watches the root and those folders only, listing nothing.  A folder the seed does not
name is watched only once the caller says so (:meth:`~OverflowAwareInotifyObserver.watch_folders`,
which walks that folder: what appears below it while the walk runs is caught by the watches
already added); watchdog's own recovery after an overflow walks the tree as before.

This leans on watchdog internals (``InotifyWatchGroup``, ``InotifyEmitter._inotify``); it
was written against watchdog 7.1.0, and :func:`overflow_hook_available` says whether the
installed version has the hook.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from watchdog.events import FileSystemEvent
from watchdog.observers.api import (
    DEFAULT_OBSERVER_TIMEOUT,
    BaseObserver,
    EventQueue,
    ObservedWatch,
)
from watchdog.observers.inotify import InotifyEmitter, InotifyWatchGroup
from watchdog.observers.inotify_c import InotifyConstants, InotifyEvent, InotifyFD, WatchDescriptor

EVENT_TYPE_QUEUE_OVERFLOW = "queue_overflow"


class QueueOverflowEvent(FileSystemEvent):
    """Events under ``src_path`` (the watched root) were lost by the kernel."""

    event_type = EVENT_TYPE_QUEUE_OVERFLOW
    is_directory = True


def overflow_hook_available() -> bool:
    """True when watchdog calls ``on_queue_overflow`` on watch groups (watchdog >= 7.1)."""
    return callable(getattr(InotifyWatchGroup, "on_queue_overflow", None))


@dataclass
class _OverflowReportingWatchGroup(InotifyWatchGroup):
    overflow_listener: Callable[[], None] | None = None
    #: Absolute folders to watch at activation instead of walking the root (used once).
    seed: list[bytes] | None = None

    def _add_all_callbacks(self, path: bytes) -> None:
        seed, self.seed = self.seed, None
        if seed is None or path != self.path:
            super()._add_all_callbacks(path)
            return
        self._add_callback(path)  # (raises when the root cannot be watched)
        for folder in seed:
            self._add_callback(folder)  # (one gone since: skipped, as watchdog's walk does)

    def watch_below(self, paths: list[bytes]) -> None:
        """Watch each folder of ``paths`` and every folder below it (a walk of each)."""
        with self._lock:
            if self.is_active:
                for path in paths:
                    self._add_all_callbacks(path)

    def unwatch_below(self, paths: list[bytes]) -> None:
        """Drop the watches of each folder of ``paths`` and of the folders below it."""
        with self._lock:
            if not self.is_active:
                return
            by_path = self._active_callbacks_by_path
            prefixes = tuple(path + b"/" for path in paths)
            wds = [wd for p, wd in by_path.items() if p in paths or p.startswith(prefixes)]
            self._remove_callbacks(wds)

    def on_queue_overflow(self) -> None:
        super().on_queue_overflow()
        if self.is_active and self.overflow_listener is not None:
            self.overflow_listener()


class OverflowAwareInotifyEmitter(InotifyEmitter):
    """``InotifyEmitter`` that queues a :class:`QueueOverflowEvent` after an overflow
    (whatever ``event_filter`` says: losing events is always worth reporting)."""

    def __init__(
        self,
        event_queue: EventQueue,
        watch: ObservedWatch,
        *,
        event_filter: list[type[FileSystemEvent]] | None = None,
        seeds: dict[str, list[bytes]] | None = None,
        **kwargs: Any,
    ) -> None:
        if event_filter is not None:
            event_filter = [*event_filter, QueueOverflowEvent]
        super().__init__(event_queue, watch, event_filter=event_filter, **kwargs)
        self._seeds = seeds if seeds is not None else {}

    @property
    def group(self) -> _OverflowReportingWatchGroup | None:
        """The watches (None before the emitter started or after it stopped)."""
        with self._lock:
            group = self._inotify
        return group if isinstance(group, _OverflowReportingWatchGroup) else None

    def on_thread_start(self) -> None:
        # Same construction as InotifyEmitter.on_thread_start, with the reporting group.
        self._inotify = _OverflowReportingWatchGroup(
            self._inotify_fd,
            os.fsencode(self.watch.path),
            is_recursive=self.watch.is_recursive,
            event_mask=self.get_event_mask_from_filter(),
            follow_symlink=self.watch.follow_symlink,
            overflow_listener=self._report_overflow,
            seed=self._seeds.pop(self.watch.path, None),
        )

    def queue_events(self, timeout: float, *, full_events: bool = False) -> None:
        # As InotifyEmitter.queue_events, minus its error log when stop() wins the race
        # with this loop (routine at shutdown, not an error).
        with self._lock:
            group = self._inotify
        if group is None:
            return
        event = group.read_event()
        if event is None:
            return
        with self._lock:
            if self._inotify is not None:
                self.build_and_queue_event(event, full_events=full_events)

    def _report_overflow(self) -> None:
        self.queue_event(QueueOverflowEvent(self.watch.path))


class OverflowAwareInotifyObserver(BaseObserver):
    """watchdog's ``InotifyObserver`` (one inotify descriptor for all its watches) whose
    emitters report queue overflows as :class:`QueueOverflowEvent`."""

    def __init__(self, *, timeout: float = DEFAULT_OBSERVER_TIMEOUT) -> None:
        self._inotify_fd = InotifyFD()
        self._inotify_fd.start()
        self._seeds: dict[str, list[bytes]] = {}
        super().__init__(
            OverflowAwareInotifyEmitter,
            timeout=timeout,
            inotify_fd=self._inotify_fd,
            seeds=self._seeds,
        )

    def seed_folders(self, root: str, folders: Iterable[str]) -> None:
        """Watch ``root`` (absolute, as it will be scheduled) and ``folders`` (relative
        to it) without walking it, when it is scheduled next; see the module doc."""
        self._seeds[root] = [os.fsencode(os.path.join(root, f)) for f in folders]

    def watch_folders(self, root: str, folders: Iterable[str]) -> None:
        """Watch ``folders`` (relative to the scheduled ``root``) and everything below them."""
        for group in self._groups(root):
            group.watch_below([os.fsencode(os.path.join(root, f)) for f in folders])

    def unwatch_folders(self, root: str, folders: Iterable[str]) -> None:
        """Stop watching ``folders`` (relative to ``root``) and everything below them."""
        for group in self._groups(root):
            group.unwatch_below([os.fsencode(os.path.join(root, f)) for f in folders])

    def _groups(self, root: str) -> list[_OverflowReportingWatchGroup]:
        with self._lock:
            emitters = [e for e in self.emitters if e.watch.path == root]
        groups = [e.group for e in emitters if isinstance(e, OverflowAwareInotifyEmitter)]
        return [g for g in groups if g is not None]

    def on_thread_stop(self) -> None:
        super().on_thread_stop()
        self._inotify_fd.stop()
        if self._inotify_fd.is_alive():
            self._inotify_fd.join()

    def simulate_overflow(self) -> None:
        """Feed a synthetic ``IN_Q_OVERFLOW`` through the path the kernel's one takes.

        For tests and drills: watchdog rebuilds its watches and every emitter of this
        observer queues a :class:`QueueOverflowEvent`, exactly as after a real overflow.
        """
        event = InotifyEvent(WatchDescriptor(-1), InotifyConstants.IN_Q_OVERFLOW, 0, b"")
        self._inotify_fd.handle_event(event)
