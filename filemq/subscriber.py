"""Live mirror as a Python API: ``Subscriber`` keeps DEST an exact copy of a server path.

``Subscriber`` is the engine of ``filemq subscribe``: a ``SyncClient`` that never
gives up (reconnects with exponential backoff and jitter, resyncs through its
cache after every reconnect, applies deletes) and reports each applied change
as a :class:`~filemq.events.MirrorEvent`, to a callback and/or an iterator::

    from filemq.subscriber import Subscriber

    with Subscriber("tcp://127.0.0.1:5670", "mirror") as sub:   # runs in a thread
        for event in sub.events():                              # until stop()
            if event.kind == "create":
                print("new version of", event.name, event.size, event.sha1)

or ``Subscriber(..., on_event=callback).run()`` in the calling thread until
``stop()`` is called from elsewhere (a signal handler, another thread).

DEST's index is kept in ``index_path`` (default: the same file ``filemq sync``
uses, ``filemq.client.default_index_path``; ``None`` for none), so a restart
only stats DEST.  Leftover temp files of an earlier run that was killed are
removed at start; a file is only ever renamed into place complete and verified.

One process per DEST: ``run()`` raises ``filemq.destlock.DestLocked`` (naming
the holder's pid) when another process mirrors into DEST.  Local changes to
DEST (a file modified, deleted or added, a directory where a file belongs or
the reverse) are repaired while running: DEST is re-checked every
``check_interval`` s (a client option, default 2; see ``filemq.client``).

``events()`` registers a queue at the call: call it before ``start()`` to see
every event.  Its iterator ends when the subscriber stops.  A callback runs in
the subscriber's thread and must be quick (it holds the mirror back).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import zmq

from filemq.client import SyncClient, SyncResult, default_index_path
from filemq.events import EventKind, MirrorEvent

__all__ = ["EventKind", "MirrorEvent", "Subscriber"]

log = logging.getLogger(__name__)

_DEFAULT = object()
_END = object()


class Subscriber:
    """Mirror ``path`` of the FILEMQ server at ``endpoint`` into ``dest``, forever.

    ``context``: the ZeroMQ context to use (a private one is made and terminated
    when omitted).  ``client_options`` go to :class:`~filemq.client.SyncClient`
    (``curve_secret``, ``server_key``, ``wire``, ``window``, ...).
    """

    def __init__(
        self,
        endpoint: str,
        dest: str | os.PathLike[str],
        *,
        path: str = "/",
        context: zmq.Context[Any] | None = None,
        on_event: Callable[[MirrorEvent], Any] | None = None,
        index_path: Any = _DEFAULT,
        heartbeat: float = 1.0,
        timeout: float = 5.0,
        connect_timeout: float = 5.0,
        backoff_cap: float = 5.0,
        **client_options: Any,
    ) -> None:
        self.dest = Path(dest)
        self._own_context = context is None
        self.context: zmq.Context[Any] = zmq.Context() if context is None else context
        self._callback = on_event
        self._queues: list[queue.SimpleQueue[object]] = []
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        if index_path is _DEFAULT:
            index_path = default_index_path(dest)
        self.client = SyncClient(
            self.context,
            endpoint,
            dest,
            path=path,
            once=False,
            index_path=index_path,
            heartbeat=heartbeat,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=None,
            backoff_cap=backoff_cap,
            on_event=self._on_event,
            **client_options,
        )

    # -- events ------------------------------------------------------------------------

    def _on_event(self, event: MirrorEvent) -> None:
        if event.kind is EventKind.RESYNC_COMPLETE:
            self._synced.set()
        elif event.kind is EventKind.DISCONNECTED:
            self._synced.clear()
        if self._callback is not None:
            self._callback(event)
        with self._lock:
            for q in self._queues:
                q.put(event)

    def events(self, timeout: float | None = None) -> Iterator[MirrorEvent]:
        """Events applied from now on; ends when the subscriber stops.

        With ``timeout``, also ends after that many seconds without an event.
        """
        q: queue.SimpleQueue[object] = queue.SimpleQueue()
        with self._lock:
            self._queues.append(q)

        def iterate() -> Iterator[MirrorEvent]:
            try:
                while True:
                    try:
                        item = q.get(timeout=timeout)
                    except queue.Empty:
                        return
                    if item is _END:
                        return
                    assert isinstance(item, MirrorEvent)
                    yield item
            finally:
                with self._lock:
                    if q in self._queues:
                        self._queues.remove(q)

        return iterate()

    @property
    def synced(self) -> bool:
        """DEST matched the server at the last resync and the connection is up."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Block until a resync completed (True) or ``timeout`` passed (False)."""
        return self._synced.wait(timeout)

    # -- running -----------------------------------------------------------------------

    def run(self) -> SyncResult:
        """Mirror in this thread until :meth:`stop`; raises ``SyncRefused`` on SRSLY/auth."""
        try:
            return self.client.run()
        finally:
            self._synced.clear()
            with self._lock:
                for q in self._queues:
                    q.put(_END)
            if self._own_context:
                self.context.term()

    def start(self) -> Self:
        """Run in a background thread (errors end up in ``self.error``)."""
        if self._thread is not None:
            raise RuntimeError("subscriber already started")
        self._thread = threading.Thread(target=self._run_thread, name="filemq-subscriber")
        self._thread.start()
        return self

    def _run_thread(self) -> None:
        try:
            self.run()
        except BaseException as exc:
            self.error = exc
            log.error("subscriber to %s stopped: %s", self.client.endpoint, exc)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the mirror to stop (within ~0.1 s) and join its thread if it has one."""
        self.client.stop()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.error("subscriber thread did not stop within %.1f s", timeout)

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
    def result(self) -> SyncResult:
        """Counters so far: files, bytes, deleted, errors, ..."""
        return self.client.result
