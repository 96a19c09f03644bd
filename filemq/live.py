"""A FILEMQ server that watches what it publishes: ``FileServer`` + ``Publisher``.

``LiveFileServer`` owns a :class:`~filemq.server.FileServer` and, unless
``watch=False``, a :class:`~filemq.publisher.Publisher` watching every mount.
Publisher events become server notices:

* ``FileChanged``  -> ``FileServer.notify_changed`` (the file is read again and
  pushed to every subscribed client whose path matches, within its credit);
* ``FileDeleted``  -> ``FileServer.notify_deleted``;
* ``RescanNeeded`` -> ``FileServer.rescan(mount, subtree)`` (inotify overflow, a
  directory removed with files nobody listed, a root recreated).

Order at start: the server's socket is bound first (an endpoint in use fails before
any directory is walked), its saved indexes are read (not checked yet), then the
publisher's watches are in place -- on the folders a saved index lists, without a walk of
the tree; the folders the server's check against the disk finds beyond them are watched
as it finds them -- *before* the server's initial scan, so a file changed between the
two is seen by one or the other (or both: a repeated notice is harmless, the server
only pushes a version it has not pushed).  Events arriving before the server runs are
held and replayed once it does.  Stop order is the reverse: publisher first, then the server
(which saves its indexes).

With watching on, the server is told its indexes are live
(``indexes_live=True``): a subscribing client gets the index as it is instead
of a re-stat of the whole tree.

Observers: inotify (with overflow reporting) by default; ``poll_interval``
selects watchdog's polling observer (portable, or to simulate the reference
implementation's 1 s poll); ``observer_factory`` injects any observer (tests).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import zmq
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from filemq.changes import ChangeEvent, FileChanged, FileDeleted, RescanNeeded, RescanReason
from filemq.publisher import Publisher
from filemq.server import FileServer, Mount

__all__ = ["DEFAULT_SETTLE", "LiveFileServer"]

log = logging.getLogger(__name__)

#: Seconds a file written by a writer that keeps it open must stay unchanged.
DEFAULT_SETTLE = 0.05


class LiveFileServer:
    """Serve ``mounts`` and push every change as it happens; see the module doc.

    ``server_options`` go to :class:`FileServer` (endpoint, CURVE, state_dir, ...).
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        mounts: Sequence[Mount],
        *,
        watch: bool = True,
        settle: float = DEFAULT_SETTLE,
        poll_interval: float | None = None,
        observer_factory: Callable[[], BaseObserver] | None = None,
        **server_options: Any,
    ) -> None:
        if settle < 0:
            raise ValueError("settle must be >= 0")
        self.server = FileServer(context, mounts, indexes_live=watch, **server_options)
        self.publisher: Publisher | None = None
        if watch:
            factory = observer_factory
            if factory is None and poll_interval is not None:
                interval = poll_interval
                factory = lambda: PollingObserver(timeout=interval)  # noqa: E731
            self.publisher = Publisher(
                {m.virtual: m.directory for m in self.server.mounts},
                self._on_change,
                observer_factory=factory,
                settle=settle,
            )
        self._lock = threading.Lock()
        self._held: list[ChangeEvent] | None = []  # None once the server runs
        #: Publisher events handed to the server (for logs and tests).
        self.changes = 0
        #: Watcher queue overflows (each made every mount be rescanned; for metrics).
        self.overflows = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        self.server.bind()  # an endpoint in use fails before any directory is watched
        try:
            if self.publisher is not None:
                # the folders a saved index lists are watched without a walk of the tree;
                # those made while the server was down are found by the server's check
                # against the disk, which runs after this, and watched then
                self.publisher.start(self.server.load_indexes())
                self.server.folder_watcher = self.publisher
            self.server.start()
        except BaseException:
            if self.publisher is not None:
                self.publisher.stop()
            self.server.stop()
            raise
        with self._lock:
            held, self._held = self._held or [], None
            for event in held:
                self._forward(event)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        if self.publisher is not None:
            self.publisher.stop()
        with self._lock:
            self._held = []
        self.server.stop(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def simulate_overflow(self) -> None:
        """Drill: behave as after an inotify queue overflow (every mount is rescanned)."""
        if self.publisher is None:
            raise RuntimeError("not watching")
        self.publisher.simulate_overflow()

    # -- publisher events (publisher worker thread) --------------------------------------

    def _on_change(self, event: ChangeEvent) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(event)
                return
            self._forward(event)

    def _forward(self, event: ChangeEvent) -> None:
        self.changes += 1
        try:
            if isinstance(event, FileChanged):
                self.server.notify_changed(event.mount, event.relpath)
            elif isinstance(event, FileDeleted):
                self.server.notify_deleted(event.mount, event.relpath)
            elif isinstance(event, RescanNeeded):
                if event.reason is RescanReason.OVERFLOW:
                    self.overflows += 1
                routine = event.reason in (
                    RescanReason.DIRECTORY_REMOVED,
                    RescanReason.DIRECTORY_CREATED,
                )
                log.log(
                    logging.INFO if routine else logging.WARNING,
                    "mount %s: %s; rescanning %s",
                    event.mount,
                    event.reason.value,
                    event.relpath or "everything",
                )
                self.server.rescan(event.mount, event.relpath)
        except RuntimeError:  # the server stopped meanwhile
            log.debug("change %r after stop: dropped", event)
