"""FILEMQ -> broker: file events pushed to a zerohub broker queue.

``filemq serve --events-broker ENDPOINT`` pushes one message per file change the server
publishes; ``filemq subscribe --events-broker ENDPOINT`` one per change it applied to
DEST.  Each is pushed (acknowledged by the broker) into ``--events-channel
CHANNEL[/QUEUE]`` (default ``filemq.events/0``; the queue is made if missing).  The
payload is one JSON object:

=========== ================================================================
``event``   ``created``, ``updated``, ``deleted`` (server) or ``applied``
            (subscriber)
``path``    server: the virtual path (``/docs/a.txt``); subscriber: the name
            relative to DEST
``size``    octets (0 for a deletion)
``sha1``    lowercase hex SHA-1 of the content ('' for a deletion)
``mtime``   modification time, UNIX seconds (null for a deletion; subscriber:
            when the change was applied)
``change``  (``applied`` only) ``create`` or ``delete``
``local``   (``applied`` only) the local file
``origin``  who saw it: ``filemq serve ENDPOINT`` or ``filemq subscribe DEST``
``id``      unique per event (origin's random prefix and a counter): a
            consumer can drop a second copy (a push resent after a reconnect)
``time``    when the event was made (UNIX seconds)
=========== ================================================================

A file the server finds when it starts (or that was already in its saved index) is not
an event; a change found while it was down is (``created``/``updated``/``deleted``
against the saved index).

This package does not import the broker: the connection comes from
:func:`zerohub.file_events.connector` (the composition layer), given to
:class:`BrokerEvents`.

File serving never waits for the broker: events wait in a bounded buffer
(:data:`DEFAULT_BUFFER` events) while the broker is slow or down, and are pushed in order
once it is back (at-least-once: an event whose acknowledge was lost is pushed again).
An event offered while the buffer is full is dropped and counted (``dropped``; the
server logs the count when it stops).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from filemq.events import MirrorEvent

if TYPE_CHECKING:  # (``filemq serve`` may drop privileges before a late import)
    from concurrent.futures import Future

log = logging.getLogger(__name__)

#: Events held while the broker is slow or down; beyond it new events are dropped.
DEFAULT_BUFFER = 10_000
#: The channel and queue events go to when ``--events-channel`` is not given.
DEFAULT_CHANNEL = "filemq.events/0"
#: Pushes in flight (sent, not yet acknowledged by the broker).
WINDOW = 64
#: Seconds the first connect (and each push) may take; reconnect backoff bounds.
CONNECT_TIMEOUT = 5.0
BACKOFF = (0.1, 5.0)


class Pusher(Protocol):
    """A connection to the broker (``zerohub.file_events`` makes one from a broker client):
    ``push_async`` gives the future of the broker's acknowledge."""

    def push_async(
        self, channel: str, queue_id: int, payload: bytes, *, timeout: float | None = None
    ) -> Future[Any]: ...

    def close(self, timeout: float = 5.0) -> None: ...


#: Makes a connected :class:`Pusher` (raises when the broker cannot be reached).
Connector = Callable[[], Pusher]


class EventsConfigError(ValueError):
    """A bad ``--events-*`` option."""


@dataclass(frozen=True, slots=True)
class EventTarget:
    """Where events go (``--events-broker`` and ``--events-channel``)."""

    endpoint: str
    channel: str = "filemq.events"
    queue_id: int = 0
    server_key: str | None = None
    curve_secret: str | None = None
    buffer: int = DEFAULT_BUFFER

    @classmethod
    def parse(
        cls,
        endpoint: str,
        channel: str | None = None,
        *,
        server_key: str | None = None,
        curve_secret: str | None = None,
        buffer: int = DEFAULT_BUFFER,
    ) -> EventTarget:
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise EventsConfigError(f"--events-broker wants tcp://HOST:PORT, got {endpoint!r}")
        name, _, queue = (channel or DEFAULT_CHANNEL).partition("/")
        try:
            queue_id = int(queue or "0")
        except ValueError:
            raise EventsConfigError(f"--events-channel CHANNEL[/QUEUE], got {channel!r}") from None
        if not name or not 0 <= queue_id <= 65535 or any(ord(c) < 32 for c in name):
            raise EventsConfigError(f"--events-channel CHANNEL[/QUEUE], got {channel!r}")
        if buffer < 1:
            raise EventsConfigError("--events-buffer must be at least 1")
        if (server_key is None) != (curve_secret is None):
            raise EventsConfigError("--events-server-key and --events-secret go together")
        return cls(endpoint, name, queue_id, server_key, curve_secret, buffer)


class BrokerEvents:
    """The publisher: ``offer()`` never blocks; a thread pushes to the broker."""

    def __init__(self, target: EventTarget, origin: str, connector: Connector) -> None:
        self.target = target
        self.origin = origin
        self._connector = connector
        #: Whatever the connections need released after ``stop()`` (the CLI keeps its
        #: ZeroMQ context here).
        self.context: Any = None
        self._prefix = os.urandom(4).hex()
        self._ids = itertools.count(1)
        self._buffer: deque[bytes] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._known: set[str] = set()  # virtual paths of the files the server has
        self.published = 0
        self.dropped = 0
        self.connected = False

    # -- what the file server and the subscriber call ------------------------------------

    def offer(self, event: dict[str, Any]) -> bool:
        """Queue one event (JSON object); False when the buffer is full (dropped)."""
        event.setdefault("origin", self.origin)
        event["id"] = f"{self._prefix}-{next(self._ids)}"
        event.setdefault("time", time.time())
        body = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()
        with self._cv:
            if len(self._buffer) >= self.target.buffer:
                self.dropped += 1
                return False
            self._buffer.append(body)
            self._cv.notify()
        return True

    def seed(self, paths: Iterable[str]) -> None:
        """The files the server has when it starts (their later changes are updates)."""
        self._known.update(paths)

    def file_changed(self, path: str, size: int, sha1: str, mtime_ns: int) -> None:
        kind = "updated" if path in self._known else "created"
        self._known.add(path)
        self.offer({"event": kind, "path": path, "size": size, "sha1": sha1,
                    "mtime": mtime_ns / 1e9})  # fmt: skip

    def file_deleted(self, path: str) -> None:
        if path not in self._known:
            return  # a folder or a name that was never a file here
        self._known.discard(path)
        self.offer({"event": "deleted", "path": path, "size": 0, "sha1": "", "mtime": None})

    def applied(self, event: MirrorEvent) -> None:
        """A subscriber's change applied to DEST (create/delete; others ignored)."""
        if str(event.kind) not in ("create", "delete"):
            return
        self.offer({"event": "applied", "change": str(event.kind), "path": event.name,
                    "local": event.path, "size": event.size, "sha1": event.sha1,
                    "mtime": event.time})  # fmt: skip

    def stats(self) -> dict[str, int]:
        with self._cv:
            buffered = len(self._buffer)
        return {"published": self.published, "dropped": self.dropped, "buffered": buffered,
                "connected": int(self.connected)}  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> BrokerEvents:
        self._thread = threading.Thread(target=self._main, name="filemq-events", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the pushing thread ------------------------------------------------------------

    def _main(self) -> None:
        delay = BACKOFF[0]
        while not self._stopped():
            client = self._connect()
            if client is None:
                with self._cv:
                    self._cv.wait(delay)
                delay = min(delay * 2, BACKOFF[1])
                continue
            delay = BACKOFF[0]
            self.connected = True
            try:
                self._pump(client)
            finally:
                self.connected = False
                client.close(timeout=1.0)

    def _stopped(self) -> bool:
        with self._cv:
            return self._stopping

    def _connect(self) -> Pusher | None:
        try:
            return self._connector()
        except Exception as exc:  # the broker is down, refuses us, ...: again later
            log.debug("events broker %s: %s", self.target.endpoint, exc)
            return None

    def _pump(self, client: Pusher) -> None:
        """Push in order with a window; on a failure, what was not acknowledged goes back
        to the front of the buffer (in order) and the connection is made anew."""
        t = self.target
        inflight: deque[tuple[bytes, Future[Any]]] = deque()
        while True:
            with self._cv:
                while not self._buffer and not inflight and not self._stopping:
                    self._cv.wait(0.5)
                if self._stopping and not inflight:
                    return
                while self._buffer and len(inflight) < WINDOW:
                    body = self._buffer.popleft()
                    future = client.push_async(t.channel, t.queue_id, body,
                                               timeout=CONNECT_TIMEOUT)  # fmt: skip
                    inflight.append((body, future))
            body, future = inflight[0]
            try:
                future.result(CONNECT_TIMEOUT + 1.0)
            except Exception as exc:  # refused, timed out, connection gone: again later
                log.warning("events broker %s: push failed: %s", t.endpoint, exc)
                for _body, f in inflight:
                    f.cancel()
                with self._cv:
                    self._buffer.extendleft(reversed([b for b, _f in inflight]))
                return
            inflight.popleft()
            self.published += 1
