"""The federation ids this broker accepted from link peers, kept in a file.

Without it a restart forgets them, and a peer that sends a message again after the
restart (its confirm was lost with the connection) has it delivered twice.  The file
(``federation-seen`` under ``--data``) holds one id a line, oldest first; an id is
appended once the local broker took the message, and made durable (flush + fsync) before
the peer is confirmed: a confirmed id is always in the file.  On start the newest
``window`` ids are read back.  A last line without its newline (kill -9 mid-write) is
ignored: its message was not confirmed and the peer sends it again.  A crash between
the local push and this write does not deliver the resend twice either: the engine wrote
the id in the same step as the message (``broker.engine.federated``) and answers the
resend as done; this file spares that round trip and covers a broker without ``--data``
only until it stops.
When the file holds more than twice the window it is rewritten with the newest window
(a temporary file renamed over it).
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import BinaryIO

#: The file under ``--data`` that keeps the seen window across restarts.
SEEN_FILE = "federation-seen"


class SeenJournal:
    """Append-only file of accepted federation ids (see the module docstring)."""

    def __init__(self, path: Path, window: int) -> None:
        self.path = path
        self.window = window
        self._lines = 0
        self._dirty = False
        self._file: BinaryIO | None = None

    def load(self) -> list[str]:
        """The newest ``window`` ids in the file, oldest first; opens it for appending."""
        newest: deque[str] = deque(maxlen=self.window)
        count = 0
        try:
            with self.path.open("rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        complete, _, torn = data.rpartition(b"\n")
        for line in complete.split(b"\n") if complete else ():
            if line:
                newest.append(line.decode("utf-8", "replace"))
                count += 1
        if torn:  # a write cut short: not confirmed, drop it
            self._rewrite(list(newest))
            count = len(newest)
        self._lines = count
        self._file = self.path.open("ab")
        return list(newest)

    def add(self, fed_id: str) -> None:
        """Append ``fed_id`` (durable at the next :meth:`sync`)."""
        assert self._file is not None, "load() first"
        self._file.write(fed_id.encode() + b"\n")
        self._lines += 1
        self._dirty = True

    @property
    def due_for_rewrite(self) -> bool:
        """The file outgrew twice the window (:meth:`sync` rewrites it given the ids)."""
        return self._lines > 2 * self.window

    def sync(self, newest: list[str] | None = None) -> None:
        """Make what was added durable; rewrite the file when it outgrew the window
        (``newest``: the ids to keep, from the caller's window)."""
        if not self._dirty or self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._dirty = False
        if newest is not None and self._lines > 2 * self.window:
            self._file.close()
            self._rewrite(newest[-self.window :])
            self._lines = min(len(newest), self.window)
            self._file = self.path.open("ab")

    def _rewrite(self, ids: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("wb") as f:
            f.write(b"".join(i.encode() + b"\n" for i in ids))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def close(self) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None
