"""A relay: a mirror that serves its DEST live, so mirrors form a tree.

``filemq subscribe UPSTREAM DEST --serve ENDPOINT`` runs a ``Subscriber`` (the
mirror of ``UPSTREAM``) and a :class:`Relay`: a ``FileServer`` publishing DEST at
``/`` with the same protocol and the same CURVE rules as ``filemq serve`` (the
relay's own server key and allow-list, ``--serve-curve-secret``/``--serve-allow``;
plain text off loopback needs ``--serve-insecure``).  One server feeds a few relays,
each relay feeds its own mirrors (or more relays): the origin's work per change no
longer grows with the number of mirrors.

What a relay publishes is what its mirror applied, nothing else:

* the server is told of each change by the mirror's events (:meth:`Relay.applied`),
  not by a watcher: a ``create`` is published once the file was verified against the
  upstream's SHA-1 and renamed into place, a ``delete`` once it is gone.  Temp and
  partial files (``filemq.mirror.TEMP_PREFIX``) are never published, so a
  half-written file never leaves the relay.  A file changed locally in DEST is not
  published: the mirror repairs it (``check_interval``) and publishes the repair;
* a file the mirror writes again as it was (same contents, mode and mtime: a repair,
  or a fetch again after a ``kill -9``) is a new inode, not a new version: the server
  publishes nothing for it (``FileEntry.same_version``), so the mirrors below do not
  copy it again;
* after every completed resync with the upstream the relay's index is checked
  against DEST once (``FileServer.rescan``: one ``lstat`` per file, hashing only
  what changed): folders, modes and mtimes the mirror applied reach its own
  mirrors there, and so does anything a lost notice would have missed;
* containment is the server's: nothing in DEST is reached through a symbolic link
  (``filemq.paths``), so a link appearing in DEST never leads a downstream mirror
  out of it, and a link is offered only when it stays inside DEST.

Restart (``kill -9`` too): the server's index of DEST persists in ``state_dir``
(checked against the disk at start, ``filemq.server``); the relay serves what DEST
holds from the moment it starts, while its mirror resyncs with the upstream, and
its own mirrors resync by their caches: only what differs travels.  An upstream
that goes away does not stop the serving: the mirror reconnects with backoff and
the relay keeps serving what it has.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import zmq

from filemq.events import EventKind, MirrorEvent
from filemq.server import FileServer, Mount

__all__ = ["RELAY_MOUNT", "Relay"]

log = logging.getLogger(__name__)

#: The virtual path a relay publishes its DEST at.
RELAY_MOUNT = "/"


class Relay:
    """Serve ``dest`` (a mirror's DEST) and republish each change the mirror applies.

    ``server_options`` go to :class:`~filemq.server.FileServer` (``endpoint``,
    ``curve_secret``, ``allow_dir``, ``insecure``, ``state_dir``, ``wire``, ...).
    Feed it the mirror's events with :meth:`applied` (from the mirror's thread).
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        dest: str | os.PathLike[str],
        *,
        deny: Sequence[str] = (),
        **server_options: Any,
    ) -> None:
        self.dest = Path(dest)
        self.server = FileServer(
            context,
            [Mount(self.dest, RELAY_MOUNT)],
            indexes_live=True,  # the mirror's events keep the index fresh
            deny=deny,
            **server_options,
        )
        #: Mirror events turned into server notices (for logs and tests).
        self.notices = 0

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def start(self) -> Self:
        """Bind (an endpoint in use fails first: ``FilemqError``), index DEST, serve."""
        self.dest.mkdir(parents=True, exist_ok=True)
        self.server.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
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

    def applied(self, event: MirrorEvent) -> None:
        """The mirror applied ``event`` to DEST: publish it (thread-safe)."""
        try:
            if event.kind is EventKind.CREATE:
                self.server.notify_changed(RELAY_MOUNT, event.name)
            elif event.kind is EventKind.DELETE:
                self.server.notify_deleted(RELAY_MOUNT, event.name)
            elif event.kind is EventKind.RESYNC_COMPLETE:
                self.server.rescan(RELAY_MOUNT)
            else:
                return
        except RuntimeError:  # the server stopped meanwhile (shutting down)
            log.debug("relay: %s after stop: dropped", event.kind)
            return
        self.notices += 1
