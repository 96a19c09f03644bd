"""FILEMQ client: mirror a server's virtual path into a local DEST directory.

``SyncClient.run()`` connects a DEALER and sends OHAI, and while the
connection is set up reads DEST's saved index (``index_path``; SHA-1 per file
version, reused across runs).  With a saved index the ICANHAZ (``RESYNC=1``,
cache = what the index says DEST holds) goes out as soon as OHAI-OK is in,
*then* DEST is re-stat'd while the server works out what to send; any file the
re-stat finds different from that cache (changed, gone, new) is asked for
again with an ICANHAZ of its own path (or, past 64 such files, one ICANHAZ of
the whole path).  Without a saved index DEST is scanned first (hashing every
file) and the ICANHAZ follows.  Credit is granted in a sliding window
(``engine_client``).  Received files are written by ``filemq.mirror``: verified
against the ``size``/``sha1`` headers, renamed into place only when complete; a
mismatch asks for the file again (up to 3 times).  So DEST never shows a
partial file and a replaced file has exactly the new size.  A whole file in one
message (a small file) is put in place on ``filemq.placer``'s thread while the next
messages are decoded (``place_inline``: on the receiving thread, at once; the default,
None, is inline when the process may run on one CPU only: a thread there costs ~25%
more user CPU per file and cannot overlap anything); the client
collects those outcomes (counts, events, a fetch again) before any other action on
DEST or its index, before a resync is reported complete and before it waits on a socket
with no message left (with more queued it receives on, and credit goes out at once: the
placer is not drained every 256 messages), so they come in the order the files arrived.
With ``direct_io`` a file of ``DIRECT_MIN`` bytes or more is written around the page
cache (``filemq.directio``).

Unsafe names (``..``, absolute, NUL, backslash, through a symlink, the temp
prefix) are logged and skipped; the session goes on and the run ends with
``errors > 0``.  Protocol errors (bad sequence or offset, too much data, ...)
drop the partial file and reconnect, at most ``max_retries`` times.  A server
that has not answered at all within ``connect_timeout`` seconds ends the run
(``SyncError``) without reconnecting: the socket retries TCP by itself.

``--once`` completion: the run ends when the server's resync-complete marker
(``filemq.engine``) arrived for every ICANHAZ sent and no file is half
received; for peers that send no marker (the reference C server),
``idle_timeout`` seconds without file traffic after every ICANHAZ-OK also count
as complete (logged as one warning; zerohub's server answers ICANHAZ once the
resync is planned, so a slow plan never looks like an idle peer).  A server that
never answers an ICANHAZ while answering heartbeats keeps such a mirror waiting.
Heartbeats are not traffic: such a server answers every HUGZ, so the idle timer
would never run out if they were.  A
server that goes silent in the middle of a file for ``idle_timeout`` seconds
(while still answering heartbeats) ends the session as a protocol error (the
partial file is dropped; reconnect, at most ``max_retries`` times).

Resume: a file of at least 8 MiB (``filemq.mirror.RESUME_MIN_SIZE``) is received
into a partial file with a journal (``filemq.partial``) that a session which ends
early keeps (and a ``kill -9`` leaves).  Every session starts by proving the
partial files in DEST and offering them to the server (``RESUME``); a first chunk
at the offset offered is taken up where the partial file ends, one at 0 replaces
it.  Offers no transfer took up are dropped, with their files, when the resync
ends.  ``SyncResult.resumed_bytes`` counts what was not fetched again.

Bandwidth cap (``bwlimit``, bytes/s): credit is granted through a token bucket
(``filemq.ratelimit``, ``filemq.engine_client``); the loop wakes up when the
bucket can grant more.  Progress (``progress``: a stream, normally stderr) is
``filemq.progress``: a bar on a terminal, log lines otherwise.

One process per DEST: ``run()`` holds ``filemq.destlock.DestLock`` (an
``flock`` on ``DEST/.filemq-part-lock``) from start to end; a second mirror
into the same DEST raises ``DestLocked`` naming the holder's pid.

Local drift (live runs, not ``--once``): every ``check_interval`` s (default
2; 0 turns it off) while nothing is being received or resynced, DEST is
re-stat'd against its index (one ``lstat`` per file; a file whose size, mtime or
inode changed is hashed again; contents are compared, a new mtime alone is
left as it is).  A file modified, deleted or added locally, a
directory where the server has a file and a file where it has a directory are
asked for again (one ICANHAZ per changed name, as at start-up) and repaired by
what the server sends, each file verified by its SHA-1 as always.  So DEST is
repaired within about ``check_interval`` s plus the transfer; for a big DEST
the interval stretches so that checking takes at most 5% of the time (10,000
files: ~20 ms a check).  A check never runs in the middle of a transfer or of a
resync, so it never races the mirror's own writes.  (Repairs need the
resync-complete marker: a server that sends none gets no checks.)

Metadata (``filemq.meta``): every ICANHAZ says ``META`` (the permission bits
the mirror applies: ``mask``, 0o777 unless ``special_bits``), the link policy
(``links``: skip, links or copy) and the mirror's patterns (``filters``), and
describes DEST's modes, mtimes, folders and links in ``ATTRS``; a server that
knows them sends folders (empty ones too), links and touches, and only what
differs.  A link the mirror does not take is one warning line naming it, never
silent.  Names the patterns exclude are never written, deleted or even put in the
cache (so no server deletes them); folders emptied by a delete stay when the
server mirrors folders (it sends their deletes itself).

``modify_window`` (seconds, rsync's ``--modify-window``): a file whose contents and
mode are the server's and whose mtime is within that many seconds of the server's
counts as unchanged (its mtime is left as it is; for file systems that keep
coarse mtimes, FAT's 2 s).  0 (default): mtimes must be equal.

``dry_run``: DEST is read, never written (no lock file, no temp files, no index
saved): each change a real run would make is one line on ``plan`` (``create``,
``update``, ``delete``, ``mkdir``, ``link``, ``attrs``), then the run ends.  File
contents still travel (a server has no listing-only mode) and are thrown away.

Safety stop: a DEST that holds files but is not a known mirror (no saved index
of it) is not cleaned of what the server lacks unless ``delete_extraneous``: the
first resync's deletes (sent before anything else) are held, and the run ends
with ``SafetyStop`` before anything is written; DEST is untouched.  Once a
resync completed, DEST is known.

``filemq sync`` keeps DEST's index outside DEST (``--index``, by
default under ``$XDG_CACHE_HOME/filemq/mirrors/``), so a no-change resync only
stats DEST instead of re-reading it.  Handshake failures seen on the socket
monitor (CURVE key not allowed, a plain client against a CURVE server) end the run
at once (``zerohub.zmqkit.HandshakeWatch``); a handshake the timer ended (a server
stopped or too slow) is no refusal: the connect timeout says "no answer".

SRSLY ends the run (``SyncRefused``); a server on this machine sends it when
DEST is inside what the subscription mirrors (``filemq.loopguard``).  Spec 35
says both "start a new connection" and "do not reconnect" on RTFM; this client
reconnects once and gives up on a second RTFM (``SyncRejected``).

Running forever (``max_retries=None``, what ``filemq subscribe`` does): a lost
connection (socket monitor: disconnected), a silent server (heartbeats: HUGZ
every ``heartbeat`` s, ``timeout`` s of silence), protocol errors and RTFM all
end the session; the client backs off (exponential from 0.1 s with jitter, at
most ``backoff_cap`` s; reset after a resync completed), reconnects with a new
socket and resyncs with the cache of what DEST holds.  Each applied change is
reported to ``on_event`` as a ``filemq.events.MirrorEvent``; the index is saved
after each completed resync, every ``save_interval`` s while it changes, and once
live changes were applied and the socket has nothing more (at most 5% of the time:
a 10,000-file index takes ~15 ms to save), so a mirror killed -9 after a change does
not fetch it again at its next start (a relay would write it again: a new inode).
Deletes from a server that sends no folders also remove the folders they leave empty
(one that mirrors folders sends their deletes itself).
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import functools
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

import zmq

from filemq.destlock import DestLock
from filemq.engine import (
    DEFAULT_CREDIT_WINDOW,
    HEADER_SHA1,
    OPTION_MIRROR_DEST,
    FilemqError,
    RemoteProtocolError,
    load_wire,
)
from filemq.engine_client import (
    ClientSession,
    ClientState,
    FileChunk,
    FileDelete,
    FileRefused,
    FileSkipped,
    MakeDir,
    MakeLink,
    PeerTimeout,
    Refused,
    Rejected,
    ResyncDone,
    ResyncPlan,
    Send,
    ServerClosed,
    Touch,
)
from filemq.filters import Filters
from filemq.heap import release_freed_memory
from filemq.index import NODE_DIR, NODE_SYMLINK, FileIndex, IndexDelta, LeftOut, SavedIndex
from filemq.loopguard import dest_option
from filemq.meta import (
    OPTION_FILTER,
    OPTION_LINKS,
    OPTION_META,
    PERMISSION_BITS,
    SPECIAL_BITS,
    LinkPolicy,
    attr_dir,
    attr_link,
    format_mode,
)
from filemq.mirror import DIRECT_MIN, TEMP_PREFIX, Mirror
from filemq.paths import UnsafePathError, all_relative_safe, relative_inside
from filemq.placer import Placer
from filemq.progress import PLAIN_EVERY, Progress
from filemq.state import load_index, path_key
from zerohub import zmqkit

if TYPE_CHECKING:  # imported when an event is emitted: start-up time of `filemq sync`
    from filemq.events import MirrorEvent

__all__ = [
    "TEMP_PREFIX",
    "SafetyStop",
    "SyncClient",
    "SyncError",
    "SyncRefused",
    "SyncRejected",
    "SyncResult",
]

log = logging.getLogger(__name__)

_EventName = Literal["create", "delete", "resync-complete", "disconnected"]
_MAX_REFETCH = 3
_ATTRS_SLICE = 4096  # ATTRS lines joined at a time (then the slices are joined)
_OHAI_WAIT_MS = 50  # after loading the saved index: wait this long for OHAI-OK at most
#: With a view of the saved index (nothing loaded yet), wait this long for OHAI-OK at most:
#: the index is loaded and DEST re-stat'd while the server works out the ICANHAZ, and
#: loaded before it only when the server is this late (then both are held at once).
_VIEW_OHAI_WAIT_MS = 3000
#: Seconds the first ICANHAZ (a big frame handed to libzmq without a copy) is given to
#: leave before the saved index is loaded beside it (it is on loopback in ~10 ms for
#: 100,000 files; past this, the load goes on and the two are held at once).
_SENT_WAIT = 5.0
#: A message smaller than this (octets, all frames) is copied into libzmq's memory when
#: sent; a bigger one (the first ICANHAZ of a big DEST: ~12 MiB for 100,000 files) is
#: handed over as it is and tracked.  A copy needs neither pyzmq's garbage-collector
#: thread (its own context and two libzmq threads, started by the first zero-copy send)
#: nor a wait for the frame to leave, so a no-change sync of a small DEST loads its
#: index and re-stats DEST while the ICANHAZ travels (10,000 files: a 1.2 MB frame).
_COPY_BELOW = 2 << 20
_MAX_CORRECTIONS = 64  # more files differ from the saved index: one ICANHAZ for all
_BACKOFF_BASE = 0.1
_CHECK_SHARE = 0.05  # local drift checks take at most this share of the time (big DEST)
#: Write errors that say DEST's file system has no room: every file after would fail too.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
_SAVE_SHARE = 0.05  # saves of the index made when quiet take at most this share of the time
_POLL_MS = 100  # longest wait for the socket before timers and capped credit are looked at
_RECV_BUDGET = 256  # messages received per wake-up before timers are looked at
_NOBLOCK = int(zmq.NOBLOCK)
_MONITOR_EVENTS = zmqkit.HANDSHAKE_EVENTS | zmq.EVENT_DISCONNECTED


class SyncError(FilemqError):
    """The sync could not complete (no server, protocol errors, CURVE refused)."""


class SyncRefused(SyncError):
    """The server answered SRSLY (access refused)."""


class SyncRejected(SyncError):
    """The server answered RTFM twice (it does not accept what we send)."""


class DestFull(SyncError):
    """DEST's file system has no room left (or the user's quota is spent)."""


class SafetyStop(SyncError):
    """A first sync would delete files in a DEST that is not a known mirror."""


class ConnectionLost(RemoteProtocolError):
    """The socket monitor saw the connection to the server drop."""


@dataclass
class SyncResult:
    """What a run did: files and bytes received, deletes, the end marker seen."""

    files: int = 0
    bytes: int = 0
    deleted: int = 0
    refused: int = 0
    errors: int = 0
    refetched: int = 0
    resumed_bytes: int = 0  # bytes not fetched again: partial files taken up
    synced: bool = False
    marker: bool = False  # completion seen from the server (not the idle fallback)
    skipped: int = 0  # links not taken (each logged once)
    planned: list[tuple[str, str]] = field(default_factory=list)  # dry run: (verb, name)


def _reserved(parts: tuple[str, ...]) -> bool:
    return parts[0].startswith(TEMP_PREFIX)


def _exclusion(dest: str | os.PathLike[str], index_path: str | os.PathLike[str] | None) -> LeftOut:
    """What DEST's index skips: temp files, and DEST's own index file if it is inside
    (a ``LeftOut``: the re-stat tests a folder's names against it at once)."""
    inner = None if index_path is None else relative_inside(dest, index_path)
    return LeftOut((TEMP_PREFIX,), frozenset([inner] if inner else ()))


def open_dealer(
    context: zmq.Context[Any],
    endpoint: str,
    *,
    linger_ms: int,
    connect_timeout: float,
    max_message: int,
    curve_secret: str | os.PathLike[str] | None = None,
    server_key: str | os.PathLike[str] | None = None,
) -> tuple[zmq.Socket[Any], zmqkit.HandshakeWatch]:
    """A DEALER connected to ``endpoint`` (CURVE when keys are given) and the watch of
    its monitor (``check_monitor``), as every FILEMQ client of this package opens it."""
    sock = context.socket(zmq.DEALER)
    monitor = None
    try:
        sock.linger = linger_ms
        # a DEALER whose connection failed its handshake has nowhere to queue: a send
        # would wait forever
        sock.sndtimeo = max(1000, int(connect_timeout * 1000))
        sock.maxmsgsize = max_message
        curve = False
        if curve_secret is not None and server_key is not None:
            zmqkit.configure_client(sock, curve_secret, server_key)
            curve = True
        # handshake failures (key not allowed, CURVE vs plain) end the run at once
        monitor = zmqkit.HandshakeWatch(sock.get_monitor_socket(_MONITOR_EVENTS), curve=curve)
        sock.connect(endpoint)
    except BaseException:
        if monitor is not None:
            monitor.close(sock)
        sock.close(linger=0)
        raise
    return sock, monitor


def close_dealer(sock: zmq.Socket[Any], monitor: zmqkit.HandshakeWatch) -> None:
    monitor.close(sock)
    sock.close()


def check_monitor(monitor: zmqkit.HandshakeWatch, endpoint: str) -> None:
    """Raise for what a DEALER's monitor reported: ``SyncRefused`` for a refused
    handshake, ``ConnectionLost`` for a dropped connection."""
    report = monitor.read()
    if report.handshake is zmqkit.Handshake.KEY_REFUSED:
        raise SyncRefused(f"handshake with {endpoint} failed: key not allowed")
    if report.handshake is zmqkit.Handshake.CURVE_REQUIRED:
        raise SyncRefused(f"the server at {endpoint} {zmqkit.CURVE_REQUIRED_HINT}")
    if report.handshake is not None:
        raise SyncRefused(
            f"handshake with {endpoint} failed: security mechanism mismatch or protocol error"
        )
    if report.disconnected:
        raise ConnectionLost(f"connection to {endpoint} lost")


def _attrs_text(index: FileIndex | SavedIndex, base: str, path: str, links: LinkPolicy) -> str:
    """The ``ATTRS`` option (``filemq.meta``) of an ICANHAZ of ``path``: what DEST holds
    besides contents.  Names are relative to ``base`` (the session's path) for the
    main ICANHAZ, absolute under ``path`` for a file asked for again.  Links are
    listed only when the mirror makes links (other links in DEST are not the
    mirror's: never described, so never deleted); an entry whose mode is not known
    yet (a version 1 index) or whose name holds a tab or line break (no server can
    have sent it) is left out.  (10,000 files: ~6 ms; the server reads them in ~10.)"""
    full = path != base
    head = base if full else ""
    lines: list[str] = []
    if isinstance(index, SavedIndex) and not full:  # (the first ICANHAZ: every file)
        lines.extend(filter(None, itertools.starmap(_file_lines, index.stamp_runs())))
    else:
        stamps = index.stamps()  # (name, mode, mtime_ns) read from the index's rows
        if full:
            stamps = (s for s in stamps if (head + s[0]).startswith(path))
        file_lines = (
            f"{head}{name}\tf\t{mode:o}\t{mtime_ns}"
            for name, mode, mtime_ns in stamps
            if mode >= 0 and "\t" not in name and "\n" not in name
        )
        # joined a slice at a time: a list of every line would cost ~100 octets a file
        while chunk := "\n".join(itertools.islice(file_lines, _ATTRS_SLICE)):
            lines.append(chunk)
    for node in index.nodes().values():
        name = head + node.name
        if (full and not name.startswith(path)) or "\t" in name or "\n" in name:
            continue
        if node.kind == NODE_DIR:
            lines.append(f"{name}\t{attr_dir(node.mode)}")
        elif node.kind == NODE_SYMLINK and links is LinkPolicy.LINKS and "\n" not in node.target:
            lines.append(f"{name}\t{attr_link(node.target)}")
    return "\n".join(lines)


def _file_lines(names: list[str], modes: Sequence[int], mtimes: Sequence[int]) -> str:
    """The ``ATTRS`` lines of a run of files (``_attrs_text``'s, names relative to the
    session's path) made at C level: a line is its name, then the text of its mode
    (one per mode in the run, made once) and its mtime.  A run with an unknown mode or
    a name holding a tab or line break is made a line at a time, leaving those out.
    (100,000 files: ~2x faster than an f-string per line.)"""
    joined = "".join(names)
    if min(modes, default=0) < 0 or "\t" in joined or "\n" in joined:
        return "\n".join(
            f"{name}\tf\t{mode:o}\t{mtime_ns}"
            for name, mode, mtime_ns in zip(names, modes, mtimes, strict=True)
            if mode >= 0 and "\t" not in name and "\n" not in name
        )
    heads = {mode: f"\tf\t{mode:o}\t" for mode in set(modes)}
    texts = zip(names, map(heads.__getitem__, modes), map(str, mtimes), strict=True)
    return "\n".join(map("".join, texts))


class _Outcome:
    DONE = "done"
    RETRY = "retry"
    FULL = "full"  # DEST's file system has no room (``_NO_ROOM``)
    REJECTED = "rejected"
    STOPPED = "stopped"


class SyncClient:
    """Mirror ``path`` on the server at ``endpoint`` into ``dest``."""

    def __init__(
        self,
        context: zmq.Context[Any],
        endpoint: str,
        dest: str | os.PathLike[str],
        *,
        path: str = "/",
        once: bool = False,
        wire: str = "spec",
        window: int = DEFAULT_CREDIT_WINDOW,
        curve_secret: str | os.PathLike[str] | None = None,
        server_key: str | os.PathLike[str] | None = None,
        index_path: str | os.PathLike[str] | None = None,
        idle_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        timeout: float = 30.0,
        heartbeat: float = 5.0,
        max_retries: int | None = 3,
        progress: TextIO | None = None,
        linger_ms: int = 200,
        on_event: Callable[[MirrorEvent], Any] | None = None,
        backoff_cap: float = 5.0,
        save_interval: float = 30.0,
        check_interval: float = 2.0,
        bwlimit: int | None = None,
        resume_min: int | None = None,
        progress_every: float = PLAIN_EVERY,
        filters: Filters | None = None,
        links: LinkPolicy = LinkPolicy.SKIP,
        special_bits: bool = False,
        dry_run: bool = False,
        plan: TextIO | None = None,
        delete_extraneous: bool = False,
        modify_window: float = 0.0,
        place_inline: bool | None = None,
        direct_io: bool = False,
    ) -> None:
        if modify_window < 0:
            raise ValueError("modify_window must be >= 0 seconds")
        if (curve_secret is None) != (server_key is None):
            raise zmqkit.SecurityError("CURVE needs both --curve-secret and --server-key")
        self.context = context
        self.endpoint = endpoint
        self.dest = Path(dest)
        self.path = path
        self.once = once
        self.wire = load_wire(wire)
        self.window = window
        self.curve_secret = curve_secret
        self.server_key = server_key
        self.index_path = index_path
        self._exclude = _exclusion(dest, index_path)  # (never mirror our own index)
        #: The mirror's patterns, link policy and permission bits kept (``filemq.meta``).
        self.filters = filters if filters else None
        self.links = links
        self.mask = PERMISSION_BITS | (SPECIAL_BITS if special_bits else 0)
        #: Change nothing: print the plan (``plan``) and stop (see the module doc).
        self.dry_run = dry_run
        self.plan = plan
        if dry_run:
            self.once = True
        #: Delete what the server lacks even in a DEST that is not a known mirror.
        self.delete_extraneous = delete_extraneous
        #: mtimes this close (ns) to the server's count as equal (rsync's --modify-window).
        self.modify_window_ns = int(modify_window * 1e9)
        self._guard = False  # the safety stop is armed (a first sync into an unknown DEST)
        self._held_deletes: list[str] = []
        self._plan_guard = False  # (dry run) a real run would stop at the safety stop
        self.idle_timeout = idle_timeout
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.heartbeat = heartbeat
        self.max_retries = max_retries
        self.linger_ms = linger_ms
        self.on_event = on_event
        self.backoff_cap = backoff_cap
        self.save_interval = save_interval
        #: Seconds between checks of DEST for local changes (live runs; 0: never).
        self.check_interval = check_interval
        #: Bandwidth cap, bytes/s (credit granted through a token bucket; None: none).
        self.bwlimit = bwlimit
        self.resume_min = resume_min
        #: Checks of DEST that found local changes (and asked the server again).
        self.repairs = 0
        self._lock = DestLock(self.dest)
        self._next_check = 0.0
        self._quiet_save = 0.0  # no save of the index when quiet before this (monotonic)
        #: Sessions started (1 + reconnects).
        self.connections = 0
        self.result = SyncResult()
        self._progress = Progress(progress, every=progress_every)
        self._stop = threading.Event()
        self._refetches: dict[str, int] = {}
        #: Big files written around the page cache (``filemq.directio``, ``DIRECT_MIN``).
        self.direct_io = direct_io
        #: Whole small files being put in place beside the receive loop (``filemq.placer``).
        if place_inline is None:  # (measured: docs/performance.md, "the placer thread decision")
            place_inline = len(os.sched_getaffinity(0)) < 2
        self._placer: Placer[tuple[bool, str]] = Placer(thread=not place_inline)
        self._sock: Any = None
        self._trackers: list[zmq.MessageTracker] | None = None  # sends to wait for, or None
        self._monitor: zmqkit.HandshakeWatch | None = None
        self._scanned = False
        self._subscribed = False
        self._answered = False  # the server sent something (in any session of this run)
        self._lost = ""
        self._full = ""  # why DEST has no room this session (its first refused file), or ""

    def stop(self) -> None:
        """Ask a running ``run()`` (in another thread, or a signal handler of the thread
        running it: see ``_pause``) to end within ~0.1 s."""
        self._stop.set()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until stopped, holding no lock ``stop()`` takes: a daemon's
        signal handler calls it in this thread, between two bytecodes, and
        ``Event.wait`` holds the Event's own lock while it begins to wait (a SIGTERM
        there made ``set()`` wait for that lock for ever: the daemon never exited)."""
        end = time.monotonic() + seconds
        while not self._stop.is_set() and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, _POLL_MS / 1000))

    def _options(self) -> dict[str, str]:
        """The ICANHAZ options of every request (``filemq.loopguard``, ``filemq.meta``)."""
        options = {OPTION_META: format_mode(self.mask)}
        if not (self.dry_run and not self.dest.is_dir()):  # (a dry run may name no DEST yet)
            options[OPTION_MIRROR_DEST] = dest_option(self.dest)
        if self.links is not LinkPolicy.SKIP:
            options[OPTION_LINKS] = self.links.value
        if self.filters is not None:
            options[OPTION_FILTER] = self.filters.to_option()
        return options

    def _takes(self, kind: str) -> bool:
        """Does the mirror manage nodes of ``kind`` (folders always; links with --links)?"""
        return kind == NODE_DIR or self.links is LinkPolicy.LINKS

    def _planned(self, verb: str, name: str) -> None:
        """Dry run: a change a real run would make."""
        self.result.planned.append((verb, name))
        if self.plan is not None:
            self.plan.write(f"{verb} {name}\n")
            self.plan.flush()

    def _changes_dest(self) -> None:
        """Something is about to be written: the safety stop fires if deletes are held."""
        if self._guard and self._held_deletes:
            held = sorted(self._held_deletes)
            raise SafetyStop(
                f"DEST {self.dest} is not a known mirror and holds {len(held)} names the server "
                f"does not have ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
                "nothing deleted or written; pass --delete-extraneous to mirror anyway "
                "(--dry-run shows the plan)"
            )

    # -- index ------------------------------------------------------------------

    def _new_index(self) -> FileIndex:
        return FileIndex(self.dest, exclude=self._exclude, filters=self.filters, tree=True)

    def _load_index(self) -> FileIndex:
        return load_index(
            self.index_path, self.dest, exclude=self._exclude, filters=self.filters, tree=True
        )

    def _save_index(self, index: FileIndex) -> None:
        if self.dry_run:
            return
        if self.index_path is None or not (index.dirty or not os.path.exists(self.index_path)):
            return
        try:
            index.save(self.index_path)
        except OSError as exc:
            log.warning("cannot save index %s: %s", self.index_path, exc)

    def _emit(self, kind: _EventName, name: str = "", **fields: Any) -> None:
        """Report a change to ``on_event`` (``kind``: a ``filemq.events.EventKind`` value)."""
        if self.on_event is None:
            return
        from filemq.events import EventKind, MirrorEvent

        path = os.path.join(os.path.abspath(self.dest), name) if name else ""
        try:
            self.on_event(MirrorEvent(EventKind(kind), time.time(), name, path, **fields))
        except Exception:  # a failing callback must not stop the mirror
            log.exception("event callback failed")

    def _backoff(self, retries: int) -> float:
        delay = min(self.backoff_cap, _BACKOFF_BASE * 2 ** max(retries - 1, 0))
        return delay * random.uniform(0.5, 1.0)

    # -- running ----------------------------------------------------------------

    def run(self) -> SyncResult:
        """Sync until done (``once``) or ``stop()``.

        Raises SyncError when it cannot, ``DestLocked`` when another process
        mirrors into DEST.
        """
        if self.dry_run:  # (no lock file either: a dry run writes nothing into DEST)
            return self._run()
        self.dest.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            return self._run()
        finally:
            self._lock.release()

    def _run(self) -> SyncResult:
        # the saved index is read by the first session, while its connection is set up
        mirror = Mirror(self.dest, self._new_index(), mask=self.mask)
        if self.direct_io:
            mirror.direct_min = DIRECT_MIN
        if self.resume_min is not None:
            mirror.resume_min = self.resume_min
        self._scanned = False
        self._answered = False
        retries = 0
        rejected = 0
        try:
            while not self._stop.is_set():
                self._subscribed = False
                self.connections += 1
                outcome = self._session(mirror)
                if outcome in (_Outcome.DONE, _Outcome.STOPPED):
                    break
                if outcome == _Outcome.FULL:
                    placed = f"{self.result.files} files placed, none in part"
                    if self.max_retries is not None:  # (a sync: ends; a daemon tries again)
                        raise DestFull(f"{self._full} ({placed}; sync again once it has room)")
                    log.error("%s (%s; trying again)", self._full, placed)
                    self._lost = self._full
                self._emit("disconnected", detail=self._lost)
                if self._subscribed:  # that connection completed a resync: count anew
                    retries = rejected = 0
                if outcome == _Outcome.REJECTED and self.max_retries is not None:
                    rejected += 1
                    if rejected > 1:
                        raise SyncRejected("server answered RTFM twice")
                else:
                    retries += 1
                    if self.max_retries is not None and retries > self.max_retries:
                        why = f": {self._lost}" if self._lost else ""  # (the last cause)
                        raise SyncError(f"giving up after {self.max_retries} reconnects{why}")
                delay = self._backoff(retries)
                log.info("reconnecting to %s in %.2f s", self.endpoint, delay)
                self._pause(delay)
        finally:
            mirror.abort()
            self._progress.done()
            if self._scanned:
                self._save_index(mirror.index)
        if self._plan_guard and any(verb == "delete" for verb, _n in self.result.planned):
            log.warning(
                "DEST %s is not a known mirror: a real sync would stop before deleting "
                "(--delete-extraneous to allow)",
                self.dest,
            )
        return self.result

    def _socket(self) -> tuple[zmq.Socket[Any], zmqkit.HandshakeWatch]:
        return open_dealer(
            self.context,
            self.endpoint,
            linger_ms=self.linger_ms,
            connect_timeout=self.connect_timeout,
            max_message=self.window + (16 << 20),
            curve_secret=self.curve_secret,
            server_key=self.server_key,
        )

    def _check_monitor(self, monitor: zmqkit.HandshakeWatch) -> None:
        check_monitor(monitor, self.endpoint)

    def _session(self, mirror: Mirror) -> str:
        now = time.monotonic()
        session = ClientSession(
            self.wire,
            self.path,
            {},
            now,
            window=self.window,
            heartbeat=self.heartbeat,
            timeout=self.timeout,
            reserved=_reserved,
            rate=self.bwlimit,
            options=self._options(),
            excluded=None if self.filters is None else self.filters.excluded_path,
        )
        session.attrs = lambda path: _attrs_text(mirror.index, session.path, path, self.links)
        sock, monitor = self._socket()
        self._sock, self._monitor = sock, monitor
        started = now
        subscribed_at: float | None = None
        next_save = now + self.save_interval
        self._lost = ""
        self._full = ""
        try:
            recv = sock.recv
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor.socket, zmq.POLLIN)
            self._perform(session, mirror, session.start(now))
            if self._offer_partials(session, mirror):  # (while OHAI travels)
                now = time.monotonic()  # (proving them took time: not the server's)
            if not self._scanned:  # scan DEST while OHAI travels
                outcome = self._scan_dest(session, mirror, sock)
                if outcome is not None:
                    return outcome
                now = time.monotonic()
                session.restart_timers(now)
            if session.state is ClientState.ACTIVE:  # ICANHAZ went out during the scan
                subscribed_at = now
            else:
                session.cache = mirror.index.digests()
            started = now
            while not self._stop.is_set():
                wakeup = session.wakeup(now)  # (capped credit to grant: inf when none)
                wait = _POLL_MS if wakeup * 1000 >= _POLL_MS else int(wakeup * 1000) + 1
                mirror.expire_folders()  # (folders walked again after each wait)
                events = dict(poller.poll(wait))
                now = time.monotonic()
                if monitor.socket in events:
                    self._check_monitor(monitor)
                if sock in events:
                    drained = False  # the socket ran out of messages (else: more wait)
                    for _ in range(_RECV_BUDGET):
                        try:  # (a message's first frame, once per file; ``_rest``: the others)
                            frame = recv(_NOBLOCK, copy=False)
                        except zmq.Again:
                            drained = True
                            break
                        frames = _rest(sock, frame) if frame.more else [frame]
                        self._answered = True
                        outcome = self._perform(session, mirror, session.receive(frames, now))
                        if outcome is None and self._full:
                            outcome = self._settle(session, mirror)  # (FULL)
                        if outcome is not None:
                            return outcome
                        if subscribed_at is None and session.state is ClientState.ACTIVE:
                            subscribed_at = now
                    if drained:  # (more waiting: received first, the placer goes on)
                        outcome = self._settle(session, mirror)  # (the files of this batch)
                        if outcome is not None:
                            return outcome
                if subscribed_at is None and now - started > self.connect_timeout:
                    if self.max_retries is not None and not self._answered:
                        # a DEALER retries TCP by itself: a new socket would not make an
                        # absent or silent server answer
                        raise SyncError(
                            f"no answer from {self.endpoint} in {self.connect_timeout:g} s "
                            "(is the server running?)"
                        )
                    raise PeerTimeout(
                        f"no answer from {self.endpoint} in {self.connect_timeout} s"
                    )
                self._perform(session, mirror, session.tick(now))
                check = self._check_due(session, now)
                save = now >= next_save or (
                    sock not in events and now >= self._quiet_save and self._quiet(session, mirror)
                )
                if (check or save) and (outcome := self._settle(session, mirror)) is not None:
                    return outcome  # (the placer is done before DEST or its index is read)
                if check:
                    self._check_dest(session, mirror)
                if save:
                    next_save = now + self.save_interval
                    self._save_index(mirror.index)
                    took = time.monotonic() - now
                    self._quiet_save = time.monotonic() + took / _SAVE_SHARE
                if self.once and session.synced:
                    self.result.synced = self.result.marker = True
                    self._perform(session, mirror, session.close())
                    return _Outcome.DONE
                if (
                    self.once
                    and subscribed_at is not None
                    and session.confirmed  # (a server answers once its resync is planned)
                    and now - session.last_traffic > self.idle_timeout
                ):
                    if session.in_file:
                        raise PeerTimeout(
                            f"no data from {self.endpoint} for {self.idle_timeout} s "
                            "in the middle of a file"
                        )
                    log.warning(
                        "no resync-complete marker from the server: done after %.1f s "
                        "without file traffic",
                        self.idle_timeout,
                    )
                    self.result.synced = True
                    self._perform(session, mirror, session.close())
                    return _Outcome.DONE
            self._perform(session, mirror, session.close())
            return _Outcome.STOPPED
        except RemoteProtocolError as exc:
            if isinstance(exc, PeerTimeout | ConnectionLost):
                log.warning("%s; reconnecting", exc)
            else:
                log.error("protocol error from %s: %s; reconnecting", self.endpoint, exc)
            self._lost = str(exc)
            return _Outcome.RETRY  # (the partial file is left by the abort below)
        finally:
            self._settle_quietly(mirror)  # (the files of a batch an error cut short)
            self._placer.close()
            mirror.abort()
            mirror.release_folders()
            close_dealer(sock, monitor)

    def _offer_partials(self, session: ClientSession, mirror: Mirror) -> bool:
        """Prove the partial files an interrupted transfer left; offer them (RESUME).
        True when there were some (proving read them whole: timers restarted).  A dry
        run neither proves (that drops or truncates) nor offers them: DEST stays as is."""
        if self.dry_run:
            return False
        points = mirror.resume_points()
        if not points:
            return False
        session.offer_resume({p.name: (p.offset, p.sha1) for p in points})
        session.restart_timers(time.monotonic())
        return True

    def _scan_dest(
        self, session: ClientSession, mirror: Mirror, sock: zmq.Socket[Any]
    ) -> str | None:
        """Read DEST's saved index and re-stat DEST (first session), overlapping the server.

        With a saved index, ICANHAZ goes out with its cache as soon as OHAI-OK
        is here, so the server works out the resync while DEST is re-stat'd
        (for 10,000 files each side takes ~20 ms); whatever the re-stat finds
        different from that cache is then asked for again (``_correct``).
        That ICANHAZ (cache and ATTRS) is made from a ``SavedIndex`` view of the
        file and the index is loaded after it has gone: the frame and the loaded
        index are never held at once.  Returns an outcome when the first answer
        ends the session.
        """
        saved = None if self.index_path is None else SavedIndex.read(self.index_path, self.dest)
        index = self._load_index() if saved is None else None  # (another version: loaded)
        try:
            outcome, told = self._tell_saved(
                session, mirror, sock, index if saved is None else saved
            )
        finally:
            if saved is not None:
                saved.close()
        refused = False  # the cache told came from a file the loader then refused
        if index is None:
            index = self._load_index()
            refused, told = told and not index.loaded, told and index.loaded
        mirror.index = index
        sent = index.digests() if told else None  # (what the ICANHAZ said: the same rows)
        delta = index.refresh()
        self._scanned = True  # (not before: a session that fails first re-reads and re-stats)
        unknown = not index.loaded and (len(index) > 0 or bool(index.nodes()))
        if unknown and not self.delete_extraneous:
            if self.dry_run:
                self._plan_guard = True
            else:
                self._guard = True  # cleared by the first resync that completes
        self._next_check = time.monotonic() + self.check_interval
        if sent is not None and outcome is None:
            self._correct(session, mirror, sent, delta)
        elif refused and outcome is None:
            log.info("saved index refused after its cache was sent: resyncing all")
            self._perform(session, mirror, session.refetch("", index.digests()))
        return outcome

    def _quiet(self, session: ClientSession, mirror: Mirror) -> bool:
        """Live changes applied, nothing received this turn: the index is worth saving
        now (a ``kill -9`` later would otherwise fetch them again at the next start)."""
        return self._subscribed and session.synced and mirror.index.dirty

    def _tell_saved(
        self,
        session: ClientSession,
        mirror: Mirror,
        sock: zmq.Socket[Any],
        saved: SavedIndex | FileIndex | None,
    ) -> tuple[str | None, bool]:
        """Answer OHAI-OK with an ICANHAZ whose cache and ATTRS come from ``saved`` (when
        it has files and OHAI-OK comes in time): (the outcome, whether it went out)."""
        if not self.dry_run:
            mirror.clean_temp()
        wait = _OHAI_WAIT_MS
        if isinstance(saved, SavedIndex):  # (never past the time a silent server is given)
            wait = min(_VIEW_OHAI_WAIT_MS, int(self.connect_timeout * 1000))
        if saved is None or not len(saved) or not sock.poll(wait):
            return None, False
        session.cache = saved.digests()
        attrs = session.attrs
        session.attrs = lambda path: _attrs_text(saved, session.path, path, self.links)
        frames = sock.recv_multipart()
        self._answered = True
        self._trackers = []
        try:
            outcome = self._perform(session, mirror, session.receive(frames, time.monotonic()))
        finally:
            session.attrs, session.cache = attrs, {}
            trackers, self._trackers = self._trackers, None
        for tracker in trackers:  # (the frame leaves before the index is loaded: not both)
            with contextlib.suppress(zmq.NotDone):
                tracker.wait(_SENT_WAIT)
        return outcome, session.state is ClientState.ACTIVE

    def _check_due(self, session: ClientSession, now: float) -> bool:
        return (
            not self.once
            and self.check_interval > 0
            and now >= self._next_check
            and session.synced  # nothing in transfer, no resync under way
        )

    def _check_dest(self, session: ClientSession, mirror: Mirror) -> None:
        """Re-stat DEST against its index; ask the server again for what changed locally."""
        started = time.monotonic()
        try:
            self._lock.check()  # (DEST removed whole: the lock file went with it)
            self.dest.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.error("cannot check DEST %s: %s", self.dest, exc)
            self._next_check = started + self.check_interval
            return
        before = mirror.index.digests()
        delta = mirror.index.refresh()
        took = time.monotonic() - started
        self._next_check = started + max(self.check_interval, took / _CHECK_SHARE)
        if not (delta.changed or delta.removed or delta.nodes or delta.removed_nodes):
            return
        mirror.forget_folders()
        changed = [e.name for e in delta.changed if before.get(e.name) != e.sha1]
        changed += [n.name for n in delta.nodes if self._takes(n.kind)]
        gone = [*delta.removed, *delta.removed_nodes]
        if not (changed or gone):
            return  # new mtimes or modes only: the contents are the server's
        log.warning(
            "DEST changed locally (%d new or changed, %d gone: %s): fetching again",
            len(changed),
            len(gone),
            ", ".join(sorted([*changed, *gone])[:5]),
        )
        self.repairs += 1
        self._correct(session, mirror, before, delta)

    def _correct(
        self, session: ClientSession, mirror: Mirror, sent: Mapping[str, str], delta: IndexDelta
    ) -> None:
        """ICANHAZ went out with the saved index: ask again for what DEST holds differently.

        Every file the re-stat found changed is asked for again, its content the same
        or not: the ATTRS of that ICANHAZ told the saved mode and mtime, so a file only
        ``chmod``-ed or ``touch``-ed in DEST would otherwise keep them (the server said
        it was up to date).  (A file whose inode alone changed is asked for too: the
        server then finds nothing to send.)"""
        names = [e.name for e in delta.changed]
        names += [name for name in delta.removed if name in sent]
        names += [n.name for n in delta.nodes if self._takes(n.kind)]  # folders, links
        names += [name for name in delta.removed_nodes if name not in delta.removed]
        if not names:
            return
        local = mirror.index.digests()
        room = min(255, self.wire.max_name_octets) - len(session.path.encode())
        if (
            len(names) > _MAX_CORRECTIONS
            or not all_relative_safe(names)
            or any(len(name.encode()) > room for name in names)
        ):
            log.info("DEST differs from its saved index in %d files: resyncing all", len(names))
            self._perform(session, mirror, session.refetch("", local))
            return
        log.debug("DEST differs from its saved index in %d files: asking again", len(names))
        ordered = sorted(local)
        asked: list[str] = []
        for name in sorted(names):
            if asked and name.startswith(asked[-1]):
                continue  # an ICANHAZ path is a prefix: the one before covers this name
            asked.append(name)
            # the cache of one ICANHAZ covers every local name under its path (a prefix)
            first = bisect.bisect_left(ordered, name)
            last = first
            while last < len(ordered) and ordered[last].startswith(name):
                last += 1
            covered = {n: local[n] for n in ordered[first:last]}
            self._perform(session, mirror, session.refetch(name, covered))

    def _settle(
        self, session: ClientSession, mirror: Mirror, *, partly: bool = False
    ) -> str | None:
        """Wait for the small files being placed (``filemq.placer``) and finish each as
        ``_chunk`` would have: count it, or fetch it again.  Before anything else uses
        DEST or its index (see ``_perform``) and before a wait on a drained socket.

        ``partly``: only those placed so far (``Placer.collect``: the placer's content
        bound), the rest go on being placed; a file that did not verify waits for the
        rest first (asking again reads the index)."""
        placer = self._placer
        done = placer.collect() if partly else placer.settle()
        outcome = None
        for chunk, result in done:  # (a list: what is added below is iterated too)
            if type(chunk) is MakeDir:
                if isinstance(result, OSError | UnsafePathError):
                    log.error("cannot apply %s: %s", chunk.name, result)
                    self.result.errors += 1
                elif isinstance(result, Exception):
                    raise result
                continue
            if partly and not (isinstance(result, tuple) and result[0]):
                done += placer.settle()  # (nothing runs beside what follows)
                partly = False
            if isinstance(result, tuple):  # a small file placed (or that did not verify)
                self._progress.data(len(chunk.data))
                outcome = self._finished(session, mirror, chunk, *result) or outcome
                continue
            if isinstance(result, _TargetRefused):
                self._refused(chunk.name, result.cause)
                continue
            if isinstance(result, OSError | UnsafePathError):
                self._not_placed(chunk.name, result)
                continue
            raise result
        return _Outcome.FULL if self._full else outcome

    def _refused(self, name: str, exc: OSError | UnsafePathError) -> None:
        """``name``'s place in DEST is not safe (or cannot be made): skipped, an error."""
        if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
            self._not_placed(name, exc, "create")  # (no temp file made)
            return
        log.error("refused %s: %s (skipped)", name, exc)
        self.result.refused += 1
        self.result.errors += 1

    def _not_placed(self, name: str, exc: OSError | UnsafePathError, doing: str = "place") -> None:
        """``name`` could not be written into DEST: an error, logged; when DEST has no room
        (``_NO_ROOM``) the session ends after this batch, with one line for them all."""
        self.result.errors += 1
        if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
            self._full = self._full or f"DEST {self.dest} is full: cannot {doing} {name}: {exc}"
            return
        log.error("cannot %s %s: %s (skipped)", doing, name, exc)

    def _settle_quietly(self, mirror: Mirror) -> None:
        """The session ends on an error: wait for the files being placed and count them
        (one that did not verify is fetched by the next session's resync)."""
        for chunk, result in self._placer.settle():
            if isinstance(chunk, MakeDir):
                if isinstance(result, Exception):
                    log.error("cannot apply %s: %s", chunk.name, result)
                    self.result.errors += 1
            elif isinstance(result, _TargetRefused):
                self._refused(chunk.name, result.cause)
            elif isinstance(result, tuple) and result[0]:
                self._progress.data(len(chunk.data))
                self.result.files += 1
                self.result.bytes += len(chunk.data)
            elif isinstance(result, OSError | UnsafePathError):
                self._not_placed(chunk.name, result)
            elif isinstance(result, Exception):
                log.error("cannot place %s: %s (skipped)", chunk.name, result)
                self.result.errors += 1

    def _perform(
        self, session: ClientSession, mirror: Mirror, actions: Iterable[Any]
    ) -> str | None:
        placer = self._placer
        for action in actions:
            outcome = None
            kind = type(action)  # (the two per-file kinds by identity: no isinstance calls)
            # a whole file in one message (the placer puts it in place): inline, per file
            if kind is FileChunk and action.first and action.eof and not action.offset:
                if placer.held >= placer.max_pending:  # (placed files keep their content)
                    outcome = self._settle(session, mirror, partly=True)
                if outcome is not None:
                    return outcome
                self._chunk(session, mirror, action)
                continue
            if kind is not Send and kind is not MakeDir and not placer.settled:
                # (nothing else beside the placer: a Send touches no file, credit goes
                # out at once; a folder is made by the placer, in order)
                outcome = self._settle(session, mirror)
            if outcome is not None:
                return outcome
            if isinstance(action, FileChunk):
                self._chunk(session, mirror, action)
            elif isinstance(action, Send):
                try:
                    if sum(map(len, action.frames)) < _COPY_BELOW:
                        self._sock.send_multipart(action.frames)
                    else:  # (past pyzmq's copy_threshold: not copied into libzmq's memory)
                        # what making it freed goes back first: over CURVE libzmq copies
                        # it twice more beside it (filemq.heap.release_freed_memory)
                        release_freed_memory()
                        tracker = self._sock.send_multipart(
                            action.frames, copy=False, track=self._trackers is not None
                        )
                        if self._trackers is not None:
                            self._trackers.append(tracker)
                except zmq.Again:  # no connection to queue on (a failed handshake drops it)
                    if self._monitor is not None:
                        self._check_monitor(self._monitor)
                    raise PeerTimeout(f"cannot send to {self.endpoint}") from None
                session.sent(time.monotonic())
            elif isinstance(action, FileDelete):
                self._delete(mirror, action)
            elif isinstance(action, MakeDir | MakeLink | Touch):
                self._entry(session, mirror, action)
            elif isinstance(action, FileSkipped):
                log.debug("%s: excluded by the mirror's patterns", action.name)
            elif isinstance(action, FileRefused):
                mirror.abort()  # (a file refused at its last chunk: its temp file goes)
                log.error("refused file name %r: %s (skipped)", action.name, action.reason)
                self.result.refused += 1
                self.result.errors += 1
            elif isinstance(action, ResyncPlan):
                self._progress.plan(action.files, action.bytes)
            elif isinstance(action, ResyncDone):
                self._progress.pause()  # (closes the bar before the line below)
                self._changes_dest()
                self._guard = False  # DEST is a known mirror from now on
                log.info("resync of %s complete", action.path)
                if action.path == session.path and not self.dry_run:  # unused offers: void
                    session.forget_offers()
                    for name in mirror.partials.discard_unused():
                        log.info(
                            "%s: partial file dropped (the server sent no such version)", name
                        )
                self._subscribed = True
                self._save_index(mirror.index)
                self._emit("resync-complete", detail=action.path)
            elif isinstance(action, Refused):
                raise SyncRefused(f"server refused: {action.reason}")
            elif isinstance(action, Rejected):
                log.error("server answered RTFM: %s", action.reason)
                self._lost = f"server answered RTFM: {action.reason}"
                return _Outcome.REJECTED
            elif isinstance(action, ServerClosed):
                log.warning("server closed the session")
                self._lost = "server closed the session"
                return _Outcome.RETRY
        return None

    def _delete(self, mirror: Mirror, action: FileDelete) -> None:
        if self.dry_run:
            if mirror.index.lookup(action.name) is not None:
                self._planned("delete", action.name)
            return
        if self._guard and mirror.index.lookup(action.name) is not None:
            self._held_deletes.append(action.name)
            return
        try:
            if mirror.delete(action.parts, prune=not action.kinded):
                self.result.deleted += 1
                log.info("deleted %s", action.name)
                self._emit("delete", action.name)
        except (OSError, UnsafePathError) as exc:
            log.error("cannot delete %s: %s", action.name, exc)
            self.result.errors += 1

    def _entry(
        self, session: ClientSession, mirror: Mirror, action: MakeDir | MakeLink | Touch
    ) -> None:
        """A folder, a link, or new mode/mtime of a file DEST has."""
        meta = action.meta
        if isinstance(action, MakeLink) and (meta.skip or self.links is not LinkPolicy.LINKS):
            why = meta.skip or (
                f"-> {meta.target}; --links makes it a link"
                + ("" if self.links is LinkPolicy.COPY else ", --copy-links copies its file")
            )
            log.warning("skipping symbolic link %s: %s", action.name, why)
            self.result.skipped += 1
            return
        if (
            isinstance(action, Touch)
            and self.modify_window_ns
            and mirror.same_within(
                action.parts, meta, action.sha1, action.size, self.modify_window_ns
            )
        ):
            return  # mode equal, mtime within --modify-window: nothing to change
        if self.dry_run:
            self._plan_entry(mirror, action)
            return
        self._changes_dest()
        if isinstance(action, MakeDir):  # (in order with the files placed beside: ``_settle``)
            self._placer.submit(functools.partial(_make_dir, mirror, action), 0, action)
            return
        try:
            if isinstance(action, MakeLink):
                mirror.make_link(action.parts, meta.target)
                log.info("link %s -> %s", action.name, meta.target)
            elif not mirror.touch(action.parts, meta, action.sha1, action.size):
                log.info("%s: not the version the server has; fetching it again", action.name)
                local = {e.name: e.sha1 for e in mirror.index if e.name.startswith(action.name)}
                self._perform(session, mirror, session.refetch(action.name, local))
        except (OSError, UnsafePathError) as exc:
            log.error("cannot apply %s: %s", action.name, exc)
            self.result.errors += 1

    def _plan_entry(self, mirror: Mirror, action: MakeDir | MakeLink | Touch) -> None:
        if isinstance(action, MakeDir):
            self._planned(
                "mkdir" if mirror.index.node(action.name) is None else "attrs", action.name
            )
        elif isinstance(action, MakeLink):
            self._planned("link", f"{action.name} -> {action.meta.target}")
        else:
            self._planned("attrs", action.name)

    def _chunk(self, session: ClientSession, mirror: Mirror, chunk: FileChunk) -> None:
        if self.dry_run:
            if chunk.first:
                exists = mirror.index.lookup(chunk.name) is not None
                self._planned("update" if exists else "create", chunk.name)
            return
        if chunk.first:
            if self._guard:  # (``_changes_dest`` inline: once per file)
                self._changes_dest()
            if chunk.eof and not chunk.offset:  # the whole file in one message (small files)
                mirror.abort()  # (no file in chunks goes on beside the placer)
                # its place is checked by the placer too: after the folders queued before it
                place = functools.partial(_place_whole, mirror, chunk)
                self._placer.submit(place, len(chunk.data), chunk)  # (see ``_settle``)
                return
            try:
                target = mirror.target(chunk.parts)
                if chunk.offset:  # the server resumed where our partial file ends
                    why = mirror.resume(chunk.parts, target, chunk.offset, chunk.headers)
                    if why:
                        log.warning("%s: cannot resume (%s); fetching it again", chunk.name, why)
                        self.result.refetched += 1
                        self._perform(session, mirror, session.refetch(chunk.name, {}))
                        return
                    log.info("%s: resumed at byte %d", chunk.name, chunk.offset)
                    self.result.resumed_bytes += chunk.offset
                elif not chunk.eof:
                    mirror.begin(chunk.parts, target, chunk.headers)
            except (OSError, UnsafePathError) as exc:
                self._refused(chunk.name, exc)
                return
        elif not mirror.busy:
            return  # this file was refused at its first chunk
        try:
            mirror.write(chunk.data)
            if chunk.eof:
                mirror.flush()  # (pipelined: the writes of this file are done, or failed)
        except OSError as exc:
            mirror.abort()
            self._not_placed(chunk.name, exc, "write")
            return
        self._progress.data(len(chunk.data))
        if not chunk.eof:
            return
        try:
            ok, reason = mirror.finish(chunk.headers, chunk.meta)
        except (OSError, UnsafePathError) as exc:
            self._not_placed(chunk.name, exc)
            return
        self._finished(session, mirror, chunk, ok, reason)

    def _finished(
        self, session: ClientSession, mirror: Mirror, chunk: FileChunk, ok: bool, reason: str
    ) -> str | None:
        """The last chunk of a file was handled: count it, or fetch it again."""
        if ok:
            size = chunk.offset + len(chunk.data)
            self.result.files += 1
            self.result.bytes += size
            self._progress.file(chunk.name, size, live=self._subscribed)
            if self._refetches:
                self._refetches.pop(chunk.name, None)
            if self.on_event is not None:
                sha1 = chunk.headers.get(HEADER_SHA1, "")
                self._emit("create", chunk.name, size=size, sha1=sha1)
            return None
        tries = self._refetches.get(chunk.name, 0) + 1
        self._refetches[chunk.name] = tries
        if tries > _MAX_REFETCH:
            log.error("%s: %s; giving up after %d tries", chunk.name, reason, _MAX_REFETCH)
            self.result.errors += 1
            return None
        log.warning("%s: %s; fetching it again", chunk.name, reason)
        self.result.refetched += 1
        local = {e.name: e.sha1 for e in mirror.index if e.name.startswith(chunk.name)}
        return self._perform(session, mirror, session.refetch(chunk.name, local))


class _TargetRefused(FilemqError):
    """A whole small file's place in DEST was refused (``_place_whole``, on the placer):
    handed back as its outcome, it is counted as a refused name, not a failed write."""

    def __init__(self, cause: OSError | UnsafePathError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _place_whole(mirror: Mirror, chunk: FileChunk) -> tuple[bool, str]:
    """A placer job: check where a whole small file goes, then put it there
    (``Mirror.place``).  Checked here, not when it arrived: a folder the server sent
    just before it (a ``MakeDir``, also a placer job) is made by then."""
    try:
        target = mirror.target(chunk.parts)
    except (OSError, UnsafePathError) as exc:
        raise _TargetRefused(exc) from exc
    return mirror.place(chunk.parts, target, chunk.data, chunk.headers, chunk.meta)


def _make_dir(mirror: Mirror, action: MakeDir) -> tuple[bool, str]:
    """A folder made as a placer job (``filemq.placer``: in order with the small files)."""
    mirror.make_dir(action.parts, action.meta.mode)
    return True, ""


def _rest(sock: zmq.Socket[Any], frame: Any) -> list[Any]:
    """The frames of a message of several whose first, ``frame``, was received (the
    receive loop takes a one-frame message itself), as ``recv_multipart(NOBLOCK,
    copy=False)`` gives them, without its ``RCVMORE`` option read per frame (each frame
    says whether more follow).  (``copy=False``: a chunk is decoded in place,
    ``fmq_msg``'s frame_view.)"""
    frames = [frame]
    while frame.more:  # (the rest of a message is there once its first frame is)
        frame = sock.recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


def default_index_path(dest: str | os.PathLike[str]) -> Path:
    """Where ``filemq sync`` keeps DEST's index between runs (outside DEST)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = path_key(os.fsencode(os.path.realpath(dest)))
    return base / "filemq" / "mirrors" / f"{key}.idx"
