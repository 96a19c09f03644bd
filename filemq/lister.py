"""What a FILEMQ server publishes, without copying it: ``list_files`` (``filemq ls``).

A listing is an ICANHAZ of the path with ``RESYNC=1`` and ``LIST=1`` (and an
empty cache); the server answers with one STAT operation per file (name,
``sha1``/``size``/``mtime_ns`` headers and the ``mode`` one, ``filemq.meta``; no
content) and the resync-complete marker (``filemq.engine``).  It lists files
only (no folders, no links) and what the server publishes: the server's own
patterns apply (what they leave out is not published), a lister sends none.
The lister grants one byte of credit and never more: STAT costs none, and a
server that does not know ``LIST`` (it would send files) gets to send at most
that one byte before the lister stops with ``SyncError``.  A listing is not a
subscription: the session ends with KTHXBAI.

Errors are the client's (``filemq.client``): ``SyncRefused`` (SRSLY, a failed
CURVE handshake), ``SyncRejected`` (RTFM), ``SyncError`` (no answer within
``timeout`` seconds, a protocol error, a server without ``LIST``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from filemq.client import (
    SyncError,
    SyncRefused,
    SyncRejected,
    check_monitor,
    close_dealer,
    open_dealer,
)
from filemq.engine import HEADER_MTIME, HEADER_SHA1, HEADER_SIZE, RemoteProtocolError, load_wire
from filemq.engine_client import (
    ClientSession,
    FileListed,
    FileRefused,
    Refused,
    Rejected,
    ResyncDone,
    Send,
    ServerClosed,
)
from filemq.meta import HEADER_MODE, MetaError, parse_mode

__all__ = ["ListedFile", "list_files"]

log = logging.getLogger(__name__)

_POLL_MS = 100
_MAX_MESSAGE = 1 << 20  # a STAT is a name and a few headers; content is never granted


@dataclass(frozen=True, slots=True)
class ListedFile:
    """One file the server publishes: its virtual path, size, mtime and SHA-1."""

    path: str  # virtual path, '/'-prefixed
    size: int
    mtime_ns: int
    sha1: str
    headers: dict[str, str] = field(default_factory=dict)  # any others the server sent
    mode: int = -1  # permission bits as the server has them (-1: it sent none, or garbage)

    @classmethod
    def from_stat(cls, base: str, entry: FileListed) -> ListedFile:
        headers = dict(entry.headers)
        size = headers.pop(HEADER_SIZE, "")
        mtime = headers.pop(HEADER_MTIME, "")
        mode = -1
        if HEADER_MODE in headers:
            with contextlib.suppress(MetaError):
                mode = parse_mode(headers[HEADER_MODE])
            del headers[HEADER_MODE]
        return cls(
            base + entry.name,
            int(size) if size.isdigit() else -1,
            int(mtime) if mtime.isdigit() else 0,
            headers.pop(HEADER_SHA1, ""),
            headers,
            mode,
        )


def list_files(
    context: zmq.Context[Any],
    endpoint: str,
    path: str = "/",
    *,
    wire: str = "spec",
    curve_secret: str | os.PathLike[str] | None = None,
    server_key: str | os.PathLike[str] | None = None,
    timeout: float = 10.0,
    linger_ms: int = 200,
) -> list[ListedFile]:
    """Every file the server at ``endpoint`` publishes under virtual ``path``, by path."""
    now = time.monotonic()
    session = ClientSession(
        load_wire(wire), path, {}, now, window=1, timeout=timeout, heartbeat=timeout, listing=True
    )
    sock, monitor = open_dealer(
        context,
        endpoint,
        linger_ms=linger_ms,
        connect_timeout=timeout,
        max_message=_MAX_MESSAGE,
        curve_secret=curve_secret,
        server_key=server_key,
    )
    found: list[ListedFile] = []
    base = session.path
    deadline = now + timeout  # for the whole listing to begin: the server answered
    try:
        _send(sock, session.start(now))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor.socket, zmq.POLLIN)
        answered = False
        while True:
            events = dict(poller.poll(_POLL_MS))
            now = time.monotonic()
            if monitor.socket in events:
                check_monitor(monitor, endpoint)
            if sock in events:
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    answered = True
                    if _handle(sock, session.receive(frames, now), base, found):
                        _send(sock, session.close())
                        return sorted(found, key=lambda f: f.path)
            if not answered and now > deadline:
                raise SyncError(
                    f"no answer from {endpoint} in {timeout:g} s (is the server running?)"
                )
            if answered and now - session.last_traffic > timeout:  # HUGZ-OK only
                raise SyncError(
                    f"no listing from {endpoint} in {timeout:g} s (does it support LIST?)"
                )
            _send(sock, session.tick(now))
    except RemoteProtocolError as exc:
        raise SyncError(f"listing {path} on {endpoint}: {exc}") from None
    finally:
        close_dealer(sock, monitor)


def _send(sock: zmq.Socket[Any], actions: list[Any]) -> None:
    for action in actions:
        if isinstance(action, Send):
            try:
                sock.send_multipart(action.frames)
            except zmq.Again:
                raise RemoteProtocolError("cannot send to the server") from None


def _handle(sock: zmq.Socket[Any], actions: list[Any], base: str, found: list[ListedFile]) -> bool:
    """Apply one message's actions; True when the listing is complete."""
    done = False
    for action in actions:
        if isinstance(action, FileListed):
            found.append(ListedFile.from_stat(base, action))
        elif isinstance(action, FileRefused):
            log.warning("server listed a name that is not a plain relative name: %r", action.name)
        elif isinstance(action, ResyncDone):
            done = True
        elif isinstance(action, Refused):
            raise SyncRefused(f"server refused: {action.reason}")
        elif isinstance(action, Rejected):
            raise SyncRejected(f"server answered RTFM: {action.reason}")
        elif isinstance(action, ServerClosed):
            raise SyncError("server closed the session")
        elif isinstance(action, Send):
            _send(sock, [action])
    return done
