"""FILEMQ server: a ROUTER socket publishing local directories at virtual paths.

``FileServer`` owns one background thread that polls the ROUTER and an inproc
control PAIR.  Per client it keeps a ``ServerSession`` (the sans-IO engine in
``engine_server``); this module only moves frames, reads file chunks and keeps
one ``FileIndex`` per mount (SHA-1 computed once per file version and shared by
every client).

The loop: handle control commands, drain the ROUTER, then *pump*: round-robin
over the clients with credit and queued work, one chunk per client per round,
at most ``_PUMP_BUDGET`` messages before polling again.  Sends are
non-blocking with ``ROUTER_MANDATORY``: a client whose pipe is full is parked
with its pending frames and retried later, so a slow client never blocks the
others; a client that vanished is forgotten.  A client's pipe holds at most
``SEND_QUEUE_BYTES`` (16 MiB) of chunks, but never fewer than 64 messages nor more
than 1000 (its high-water mark, in messages of ``chunk_size``: 64 MiB with the
default 1 MiB chunk): a client granting huge credit and reading nothing costs the
server that much, whatever it granted.  File content is read from disk
per chunk (``os.pread`` on an fd opened for the current file), never buffered
whole; the folders are walked (``filemq.paths``, no link followed) once per round of
sending and their descriptors kept for that round (at most ``_MAX_FOLDERS``).

Live changes: ``notify_changed(mount, name)``, ``notify_deleted(mount, name)``
and ``rescan(mount, subtree)`` are thread-safe; they post to the loop over the
control PAIR, the loop updates the index and queues a create/delete for every
client whose subscription matches -- only when the file's version really
changed (a repeated notice costs one stat and hash, no traffic).  Live changes
queued for one client are bounded (``max_live``, default 10,000 names not sent yet,
``engine_server.DEFAULT_MAX_LIVE``): a client that stops reading (no credit) while
changes keep coming is told KTHXBAI and forgotten instead of holding memory without
end; it reconnects and resyncs by its cache, so nothing is lost, and the others'
changes never wait for it (the pump skips a client without credit or with a full pipe).  The file
watcher (``filemq.live``) plugs in here; with ``indexes_live=True`` the server
trusts it to keep the indexes fresh and does not re-stat a mount when a client
connects or subscribes.

Persistence: with ``state_dir`` each mount's index is loaded at start
(``filemq.state``), refreshed against the disk (a file is hashed again only
when its ``(size, mtime_ns, inode)`` changed) and saved atomically after the
initial scan, every ``save_interval`` seconds while it has changes, and at stop.
With ``indexes_live`` a loaded index is refreshed by the loop itself, as its
first work, before it reads any client message or change notice (``start()``
returns ~0.5 s sooner for 100,000 files; ``verified`` is set after it).
When the state folder is inside a published directory it is not published.

A mirror writing inside what it mirrors is refused (``filemq.loopguard``).

Bandwidth cap (``bwlimit``, bytes/s): one token bucket (``filemq.ratelimit``) for
all clients together; the pump sends a chunk only while the bucket holds tokens and
spends its size, the loop waits for the next token otherwise.  Listings, deletes and
markers carry no content and cost nothing.

Metadata (``filemq.meta``, ``filemq.offer``): every file goes with its permission
bits; a client that asks (option ``META``) also gets folders (empty ones too),
symbolic links by its link policy, and ``touch`` operations when only a mode or an
mtime changed; its ``ATTRS`` say what it holds, so a no-change resync sends nothing.
``links=False`` (``serve --no-links``) offers no link at all.  ``filters``
(``serve --exclude/--include/--exclude-from``, ``filemq.filters``) leave names out
of every mount; a client's own patterns (option ``FILTER``) leave names out of what
it gets.  A name left out by either is never sent as a delete either: a mirror's
copy of an excluded name stays (as rsync's excludes protect the receiver's files
unless ``--delete-excluded``).  Deletes of a resync go deepest first.

Containment: every file the server opens, stats, lists or hashes is reached
through ``filemq.paths`` (no symbolic link below a mount's directory is ever
followed), whatever named it: a client's exact-path ICANHAZ, a watcher's
notice, a rescan request or a saved index.

Unreadable is not deleted: a file that exists but cannot be read (permission
denied, I/O error) when it is indexed or opened for sending is logged as an
error, kept in the index at its last readable version (``FileIndex.held``),
and nothing is sent for it -- never a delete; mirrors keep their copy.  A
folder that cannot be listed holds everything below it the same way.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import zmq

from filemq import loopguard, uptodate
from filemq.engine import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_ENDPOINT,
    OPTION_MIRROR_DEST,
    FilemqError,
    Operation,
    load_wire,
)
from filemq.engine_server import (
    DEFAULT_MAX_LIVE,
    ChunkPlan,
    Close,
    FileOp,
    Reply,
    ServerSession,
    SessionState,
    Subscribe,
    plan_headers,
    resume_from,
    resume_points,
)
from filemq.filters import Filters
from filemq.framepool import FramePool
from filemq.index import NODE_DIR, FileEntry, FileIndex, IndexDelta, Node
from filemq.meta import Kind, LinkPolicy, attr_file, attr_kind, local_mode
from filemq.offer import LinkOffer, delete_op, file_op, node_offer, node_unchanged, unchanged
from filemq.paths import (
    absent,
    local_parts,
    open_dir_beneath,
    open_in,
    relative_inside,
    virtual_path,
)
from filemq.ratelimit import TokenBucket, burst_for
from filemq.sharedread import DEFAULT_MAX_FILE, SharedReads, Version
from filemq.state import load_index, server_index_path, server_state_dir
from filemq.walk import DEFAULT_IGNORE, PathFilter
from zerohub import zmqkit

__all__ = ["DEFAULT_ENDPOINT", "FileServer", "Mount", "ServerStats", "SubscriberStats"]

log = logging.getLogger(__name__)

_PUMP_BUDGET = 64  # messages sent per pump before the loop polls again
#: Content bytes queued in the ROUTER for one client before it is parked (its pipe's
#: high-water mark is this over the chunk size, ``_MIN_SEND_HWM``..``_MAX_SEND_HWM``):
#: a client that grants huge credit and stops reading holds no more of our memory.
SEND_QUEUE_BYTES = 16 << 20
_MIN_SEND_HWM = 64  # (small files: 16 held back the pipelining of 10 KiB files)
_MAX_SEND_HWM = 1000  # (libzmq's default: small chunks keep it)
_DRAIN_BUDGET = 256  # messages received per poll
#: Longest wait (ms) of a loop that has a client parked on its full pipe: the router is
#: polled for POLLOUT then (``FileServer._out_wanted``); this bounds the wait when that
#: is off for one round (the room POLLOUT saw was another client's).
_STALL_WAIT_MS = 10
_IN_OUT = zmq.POLLIN | zmq.POLLOUT
_MAX_MESSAGE = 128 << 20  # ICANHAZ with a 100k-entry cache fits
_PREWARM_EVERY = 0.5  # seconds between index refreshes triggered by OHAI
_NOBLOCK = int(zmq.NOBLOCK)
#: Frames this long or longer (file chunks) are sent zero-copy (``_try_send``).
ZERO_COPY_MIN = 64 << 10
_MORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
# O_NONBLOCK: a file swapped for a FIFO after it was indexed must not block the loop
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
#: Folder descriptors kept within one round of sending (``_folder``); beyond: the oldest closed.
_MAX_FOLDERS = 128
_ids = itertools.count()
_IGNORE = PathFilter(DEFAULT_IGNORE)


# Every pattern of DEFAULT_IGNORE holds ".f": an ASCII name without it matches none
# (the check below is ~5x cheaper than the regex, on every name of every refresh)
_IGNORE_MARK = ".f"
assert all(_IGNORE_MARK in pattern for pattern in DEFAULT_IGNORE)


def _excluded(name: str) -> bool:
    """Names never published: client temp files (as the watcher ignores them)."""
    if _IGNORE_MARK not in name and name.isascii():
        return False
    return not _IGNORE.accepts_name(name.rpartition("/")[2])


def _exclusion(directory: Path, state_dir: str | os.PathLike[str] | None) -> Callable[[str], bool]:
    """What a mount never publishes: temp files, and the server's state if it is inside."""
    inner = None if state_dir is None else relative_inside(directory, server_state_dir(state_dir))
    if not inner:  # elsewhere, or the published directory itself: nothing to hide by name
        return _excluded
    log.info("%s: the server's state in %s is not published", directory, inner)
    below = inner + "/"
    return lambda name: name == inner or name.startswith(below) or _excluded(name)


class FileEventSink(Protocol):
    """Told of the file changes the server publishes (``filemq.broker_events``)."""

    def seed(self, paths: Iterable[str]) -> None: ...

    def file_changed(self, path: str, size: int, sha1: str, mtime_ns: int) -> None: ...

    def file_deleted(self, path: str) -> None: ...


class FolderWatcher(Protocol):
    """What watches a mount's folders (``filemq.live``: the publisher)."""

    def watch_folders(self, mount: str, folders: Iterable[str]) -> None: ...

    def unwatch_folders(self, mount: str, folders: Iterable[str]) -> None: ...


def _folders(index: FileIndex) -> list[str]:
    """The folders ``index`` lists (relative names)."""
    return [name for name, node in index.nodes().items() if node.kind == NODE_DIR]


def _tops(folders: set[str]) -> list[str]:
    """The ``folders`` not below another one of them, sorted."""
    return sorted(
        f
        for f in folders
        if not any(
            p in folders for p in itertools.accumulate(f.split("/")[:-1], lambda a, b: f"{a}/{b}")
        )
    )


@dataclass(frozen=True)
class Mount:
    """A local directory published at a virtual path."""

    directory: Path
    virtual: str  # normalised, '/' or '/docs' (no trailing '/')

    @property
    def prefix(self) -> str:
        return "/" if self.virtual == "/" else self.virtual + "/"

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """``DIR`` or ``DIR:/virtual/path``."""
        directory, sep, virtual = spec.rpartition(":")
        if not sep or not virtual.startswith("/"):
            directory, virtual = spec, "/"
        return cls(Path(directory), virtual_path(virtual))


#: Copies of the session table tried before a snapshot gives up (the loop changes it).
_SNAPSHOT_TRIES = 5


@dataclass(frozen=True, slots=True)
class SubscriberStats:
    """One client of :meth:`FileServer.stats`: what it asked for and how far behind it is."""

    client: str  # the ROUTER identity, hex
    paths: tuple[str, ...]  # virtual paths subscribed to
    queued: int  # files (and markers) queued for it, not sent yet: its lag
    sent_files: int
    sent_bytes: int
    connected_at: float  # monotonic seconds


@dataclass(frozen=True, slots=True)
class ServerStats:
    """What :meth:`FileServer.stats` returns (totals include clients gone)."""

    clients: int
    sent_files: int
    sent_bytes: int
    resyncs: int
    rescans: int
    index_files: dict[str, int]  # mount (virtual path) -> entries in its index
    subscribers: tuple[SubscriberStats, ...]


class FileServer:
    """Serve ``mounts`` over FILEMQ; ``start()``/``stop()`` or use as a context manager."""

    def __init__(
        self,
        context: zmq.Context[Any],
        mounts: Sequence[Mount],
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        wire: str = "spec",
        curve_secret: str | os.PathLike[str] | None = None,
        allow_dir: str | os.PathLike[str] | None = None,
        insecure: bool = False,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        client_ttl: float = 30.0,
        deny: Sequence[str] = (),
        max_clients: int = 10_000,
        rescan_interval: float = 0.0,
        linger_ms: int = 200,
        state_dir: str | os.PathLike[str] | None = None,
        save_interval: float = 30.0,
        indexes_live: bool = False,
        bwlimit: int | None = None,
        filters: Filters | None = None,
        links: bool = True,
        events: FileEventSink | None = None,
        max_live: int = DEFAULT_MAX_LIVE,
    ) -> None:
        if not mounts:
            raise ValueError("publish at least one directory")
        if (curve_secret is None) != (allow_dir is None):
            raise zmqkit.SecurityError("CURVE needs both a server secret and an allow-list")
        self.context = context
        self.mounts = sorted(mounts, key=lambda m: len(m.virtual))  # most specific last
        #: (prefix, mount), the most specific first (``_locate``: once per file sent).
        self._prefixes = [(mount.prefix, mount) for mount in reversed(self.mounts)]
        self.wire = load_wire(wire)
        self.chunk_size = chunk_size
        self.client_ttl = client_ttl
        self.deny = tuple(virtual_path(d) for d in deny)
        self.max_clients = max_clients
        #: Live changes queued for one client before it is closed (``engine_server``).
        self.max_live = max_live
        self.rescan_interval = rescan_interval
        self._bind = endpoint
        self._curve_secret = curve_secret
        self._allow_dir = allow_dir
        self._insecure = insecure
        self._linger = linger_ms
        self._exclude = {m.virtual: _exclusion(m.directory, state_dir) for m in self.mounts}
        #: What every mount leaves out (``serve --exclude``...), and whether links are offered.
        self.filters = filters if filters else None
        self.links = links
        #: Told of every file change published (``filemq.broker_events``), or None.
        self.events = events
        self.indexes = {
            m.virtual: FileIndex(
                m.directory, exclude=self._exclude[m.virtual], filters=self.filters, tree=True
            )
            for m in self.mounts
        }
        # mount -> relative name of a file -> links copied to clients as that file
        self._copied: dict[str, dict[str, set[str]]] = {m.virtual: {} for m in self.mounts}
        self.index_files = (
            {}
            if state_dir is None
            else {m.virtual: server_index_path(state_dir, m.directory, m.virtual) for m in mounts}
        )
        self.save_interval = save_interval
        #: A watcher keeps the indexes fresh: no re-stat of a mount per connecting client.
        self.indexes_live = indexes_live
        #: Set once every index has been checked against the disk since ``start()``
        #: (with ``indexes_live`` and a saved index, by the loop, before any answer).
        self.verified = threading.Event()
        self._unverified: list[Mount] = []
        self._loaded = False  # the saved indexes were read (load_indexes)
        #: Told of folders a loaded index did not list / listed but gone (a live watcher).
        self.folder_watcher: FolderWatcher | None = None
        #: Rescans done (requested, periodic or after a watcher's overflow).
        self.rescans = 0
        #: Waits of the serving loop for its sockets so far (each turn polls once): a
        #: client parked on its full pipe must not make it spin (``_out_wanted``).
        self.loop_turns = 0
        #: File content bytes sent to clients gone (all of them once stopped).
        self.sent_bytes = 0
        #: Whole files sent to clients gone (all of them once stopped).
        self.sent_files = 0
        #: Subscriptions answered (ICANHAZ: each is a resync of the client's path).
        self.resyncs = 0
        #: Of those, resyncs whose cache and attributes said exactly what the server has,
        #: answered without a plan (``filemq.uptodate``).
        self.resyncs_up_to_date = 0
        #: Bandwidth cap for all clients together (bytes/s; ``filemq.ratelimit``).
        self._bucket = (
            None if bwlimit is None else TokenBucket(bwlimit, burst_for(bwlimit), time.monotonic())
        )
        self._refreshed = {m.virtual: float("-inf") for m in self.mounts}  # last full refresh
        self._sessions: dict[bytes, ServerSession] = {}
        self._stalled: dict[bytes, deque[list[bytes]]] = {}
        self._unparked = False  # the last pump sent some of what parked clients held
        self._out_useless = False  # a POLLOUT wake-up let nothing parked go (``_out_wanted``)
        self._files: dict[bytes, tuple[str, int]] = {}  # client -> (name, fd) being sent
        self._shared = SharedReads()  # small files read once per round of sending
        self._frames = FramePool()  # big chunks' frames, used again once sent
        self._sharing = False  # this round has several clients to send to (``_pump``)
        #: Folders walked this round of sending (``_open_source``): (mount dir, parts) -> fd.
        self._folders: dict[tuple[Path, tuple[str, ...]], int] = {}
        self._ctl_lock = threading.Lock()
        self._ctl: zmq.Socket[Any] | None = None
        self._router: zmq.Socket[Any] | None = None
        self._loop_ctl: zmq.Socket[Any] | None = None
        self._thread: threading.Thread | None = None
        self._auth: Any = None
        self.endpoint = ""

    # -- lifecycle ------------------------------------------------------------

    def bind(self) -> str:
        """Bind the ROUTER (idempotent); the bound endpoint.

        ``start()`` binds first, before the published trees are scanned or hashed, so
        that an endpoint in use fails at once (``FilemqError``) and writes no index.
        """
        if self._router is not None:
            return self.endpoint
        zmqkit.check_bind(
            self._bind, curve=self._curve_secret is not None, insecure=self._insecure
        )
        router = self.context.socket(zmq.ROUTER)
        try:
            router.linger = self._linger
            router.router_mandatory = 1
            router.sndhwm = min(
                _MAX_SEND_HWM, max(_MIN_SEND_HWM, SEND_QUEUE_BYTES // self.chunk_size)
            )
            router.maxmsgsize = _MAX_MESSAGE
            if self._curve_secret is not None and self._allow_dir is not None:
                self._auth = zmqkit.start_authenticator(self.context, self._allow_dir)
                zmqkit.configure_server(router, self._curve_secret)
            router.bind(self._bind)
        except BaseException as exc:
            router.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            if isinstance(exc, zmq.ZMQError):
                why = zmq.strerror(exc.errno or 0)
                raise FilemqError(f"cannot serve on {self._bind}: {why}") from None
            raise
        self._router = router
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        return self.endpoint

    def load_indexes(self) -> dict[str, list[str]]:
        """Read the saved indexes (once; ``start`` does it when nobody did): mount ->
        the folders a loaded index lists, for a watcher to watch without a walk.

        Nothing is checked against the disk here: with ``indexes_live`` the loop does
        that first (and tells ``folder_watcher`` of folders the saved index missed).
        """
        if not self._loaded:
            for mount in self.mounts:
                if not mount.directory.is_dir():
                    raise FileNotFoundError(f"{mount.directory}: not a directory")
            self._loaded = True
            for mount in self.mounts:
                self.indexes[mount.virtual] = load_index(
                    self.index_files.get(mount.virtual),
                    mount.directory,
                    exclude=self._exclude[mount.virtual],
                    filters=self.filters,
                    tree=True,
                )
        return {
            virtual: _folders(index) for virtual, index in self.indexes.items() if index.loaded
        }

    def start(self) -> FileServer:
        self.bind()
        try:
            self.load_indexes()
            for mount in self.mounts:
                index = self.indexes[mount.virtual]
                if index.loaded and self.indexes_live:
                    self._unverified.append(mount)  # the loop re-stats it before any answer
                    continue
                self._refresh_mount(mount)
                self._log_mount(mount)
            if not self._unverified:
                self.verified.set()
            if self.events is not None:  # what is there now (or was, when saved) is known
                self.events.seed(
                    m.prefix + name
                    for m in self.mounts
                    for name in self.indexes[m.virtual].names()
                )
            self._save_indexes()
        except BaseException:
            self._unbind()
            raise
        address = f"inproc://filemq-server-{os.getpid()}-{next(_ids)}"
        self._loop_ctl = self.context.socket(zmq.PAIR)
        self._loop_ctl.linger = 0
        self._loop_ctl.bind(address)
        self._ctl = self.context.socket(zmq.PAIR)
        self._ctl.linger = 0
        self._ctl.connect(address)
        self._thread = threading.Thread(target=self._run, name="filemq-server", daemon=True)
        self._thread.start()
        return self

    def _log_mount(self, mount: Mount) -> None:
        index = self.indexes[mount.virtual]
        log.info(
            "mount %s: %d files, %d hashed (%d bytes)",
            mount.virtual,
            len(index),
            index.hashed_files,
            index.hashed_bytes,
        )

    def _verify(self) -> None:
        """The loop's first work: re-stat the mounts whose saved index was loaded.

        ``start()`` returns without it when the indexes are live (the watcher runs
        before ``start``, so a change from then on is caught either way): the index
        saved at the last stop is checked against the disk here, before the loop
        reads a client's message or a change notice, so a change made while the
        server was down is found before any answer.
        """
        started = time.monotonic()
        for mount in self._unverified:
            index = self.indexes[mount.virtual]
            before = set(_folders(index))
            delta = self._refresh_mount(mount)
            self._publish(mount, delta)
            if self.folder_watcher is not None:
                for again in self._watch_new_folders(mount, before):
                    self._publish(mount, again)
            self._log_mount(mount)
            changes = len(delta.changed) + len(delta.removed)
            changes += len(delta.nodes) + len(delta.removed_nodes)
            log.info(
                "mount %s: saved index checked against the disk in %.3f s (%d changes)",
                mount.virtual,
                time.monotonic() - started,
                changes,
            )
        self._unverified.clear()
        self._save_indexes()
        self.verified.set()

    def _watch_new_folders(self, mount: Mount, before: set[str]) -> Iterator[IndexDelta]:
        """Tell the watcher of the folders the saved index did not list (made while the
        server was down) and of those gone; read each new one again once watched (a file
        made in it between the check and its watch would be missed otherwise)."""
        assert self.folder_watcher is not None
        index = self.indexes[mount.virtual]
        now = set(_folders(index))
        new, gone = now - before, before - now
        if gone:
            self.folder_watcher.unwatch_folders(mount.virtual, _tops(gone))
        if not new:
            return
        top = _tops(new)
        self.folder_watcher.watch_folders(mount.virtual, top)
        log.info(
            "mount %s: %d folders made while the server was down now watched",
            mount.virtual,
            len(new),
        )
        for folder in top:
            yield index.refresh(folder)

    def _unbind(self) -> None:
        """Bound but never started: close the ROUTER and the authenticator."""
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            self._unbind()
            return
        self._post(b"STOP")
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("server thread did not stop within %.1f s", timeout)
        else:
            self._save_indexes()  # the loop owned the indexes; now they are ours
        self._thread = None
        with self._ctl_lock:
            if self._ctl is not None:
                self._ctl.close()
                self._ctl = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def __enter__(self) -> FileServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _save_indexes(self) -> None:
        for virtual, path in self.index_files.items():
            index = self.indexes[virtual]
            if not index.dirty and path.exists():
                continue
            try:
                index.save(path)
            except OSError as exc:
                log.warning("cannot save the index of %s to %s: %s", virtual, path, exc)

    @property
    def client_count(self) -> int:
        """Clients with a session (past OHAI, not expired or gone)."""
        return len(self._sessions)

    def stats(self) -> ServerStats:
        """A snapshot of the server's counters (safe from any thread; read-only).

        Read while the loop runs, so figures of different clients may be a message
        apart; a session ending meanwhile is counted once (in its own figures or in
        the totals of clients gone).
        """
        for _ in range(_SNAPSHOT_TRIES):
            try:
                sessions = list(self._sessions.values())
                break
            except RuntimeError:  # the loop changed the table while it was copied
                continue
        else:
            sessions = []
        subscribers = tuple(
            SubscriberStats(
                client=s.client_id.hex(),
                paths=tuple(s.subscriptions),
                queued=s.queued,
                sent_files=s.sent_files,
                sent_bytes=s.sent_bytes,
                connected_at=s.connected_at,
            )
            for s in sessions
        )
        return ServerStats(
            clients=len(sessions),
            sent_files=self.sent_files + sum(s.sent_files for s in subscribers),
            sent_bytes=self.sent_bytes + sum(s.sent_bytes for s in subscribers),
            resyncs=self.resyncs,
            rescans=self.rescans,
            index_files={virtual: len(index) for virtual, index in self.indexes.items()},
            subscribers=subscribers,
        )

    # -- thread-safe change API -----------------------------------------------

    def _post(self, *frames: bytes) -> None:
        with self._ctl_lock:
            if self._ctl is None:
                raise RuntimeError("server is not running")
            self._ctl.send_multipart(list(frames))

    def notify_changed(self, mount: str, name: str) -> None:
        """File ``name`` (relative) under mount ``mount`` (virtual path) was created/changed.

        The file is read again even if its size, mtime and inode look unchanged.
        """
        self._post(b"CHANGED", mount.encode(), name.encode("utf-8", "surrogateescape"), b"1")

    def notify_deleted(self, mount: str, name: str) -> None:
        """File ``name`` under ``mount`` was deleted (the loop checks the disk anyway)."""
        self._post(b"CHANGED", mount.encode(), name.encode("utf-8", "surrogateescape"), b"0")

    def rescan(self, mount: str | None = None, subtree: str = "") -> None:
        """Rescan one mount (or all; optionally one relative subtree) and push what changed."""
        self._post(b"RESCAN", (mount or "").encode(), subtree.encode("utf-8", "surrogateescape"))

    # -- the loop ---------------------------------------------------------------

    def _run(self) -> None:
        router, ctl = self._router, self._loop_ctl
        assert router is not None and ctl is not None
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(ctl, zmq.POLLIN)
        next_tick = time.monotonic() + 1.0
        next_rescan = time.monotonic() + self.rescan_interval
        next_save = time.monotonic() + self.save_interval
        watching_out = False  # the router is polled for POLLOUT too (``_out_wanted``)
        woke_out = False  # the last poll returned for POLLOUT alone
        try:
            if self._unverified:
                self._verify()
            while True:
                busy = self._pump()
                if woke_out and not self._unparked:
                    self._out_useless = True  # another client's room woke us: not again
                timeout = 0 if busy else (_STALL_WAIT_MS if self._stalled else 250)
                if not busy and self._bucket is not None:
                    timeout = min(timeout, self._throttled_ms())
                want_out = self._out_wanted()
                if want_out != watching_out:
                    poller.modify(router, _IN_OUT if want_out else zmq.POLLIN)
                    watching_out = want_out
                events = dict(poller.poll(timeout))
                self.loop_turns += 1
                if ctl in events and not self._control(ctl):
                    break
                flags = events.get(router, 0)
                woke_out = flags == zmq.POLLOUT and ctl not in events
                if flags & zmq.POLLIN:
                    self._drain(router)
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + 1.0
                    self._expire(now)
                    if self.rescan_interval > 0 and now >= next_rescan:
                        next_rescan = now + self.rescan_interval
                        self._rescan("")
                    if self.index_files and now >= next_save:
                        next_save = now + self.save_interval
                        self._save_indexes()
        except Exception:
            log.exception("filemq server loop failed")
        finally:
            for client in list(self._files):
                self._close_file(client)
            self._release_folders()
            self.sent_bytes += sum(s.sent_bytes for s in self._sessions.values())
            self.sent_files += sum(s.sent_files for s in self._sessions.values())
            self._sessions.clear()
            router.close()
            ctl.close()
            self._router = None

    def _control(self, ctl: zmq.Socket[Any]) -> bool:
        while True:
            try:
                frames = ctl.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return True
            command = frames[0]
            if command == b"STOP":
                return False
            try:
                if command == b"CHANGED":
                    name = frames[2].decode("utf-8", "surrogateescape")
                    self._changed(frames[1].decode(), name, rehash=frames[3] == b"1")
                elif command == b"RESCAN":
                    subtree = frames[2].decode("utf-8", "surrogateescape")
                    self._rescan(frames[1].decode(), subtree)
            except Exception:
                log.exception("control command %r failed", command)

    def _drain(self, router: zmq.Socket[Any]) -> None:
        now = time.monotonic()
        for _ in range(_DRAIN_BUDGET):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            try:
                self._dispatch(frames[0].bytes, frames[1:], now)
            except Exception:
                log.exception("error handling a message; client dropped")
                self._drop(frames[0].bytes)

    def _dispatch(self, client: bytes, body: list[Any], now: float) -> None:
        session = self._sessions.get(client)
        is_new = session is None
        if session is None:
            if len(self._sessions) >= self.max_clients:
                log.warning("client limit %d reached; message ignored", self.max_clients)
                return
            session = ServerSession(
                self.wire,
                client,
                now,
                chunk_size=self.chunk_size,
                peer_key=_peer_key(body[0]),
                access=self._access,
                max_live=self.max_live,
                up_to_date=self._up_to_date,
            )
        actions = session.receive(body, now)
        if is_new and session.state is not SessionState.EXPECT_OHAI:
            # registered before its OHAI-OK leaves: whoever hears the answer finds the session
            self._sessions[client] = session
            log.info("client %s connected", client.hex())
        # ICANHAZ-OK leaves once its resync is planned: a mirror's idle timer (how it
        # ends with a server that sends no completion marker) starts at that answer, and
        # planning 100,000 files on a loaded machine took longer than its 10 s: it ended
        # at once with nothing received (exit 0, an empty mirror)
        held: list[list[bytes]] = []
        subscribing = any(isinstance(action, Subscribe) for action in actions)
        for action in actions:
            if isinstance(action, Reply):
                if subscribing:
                    held.append(action.frames)
                else:
                    self._send(client, action.frames)
            elif isinstance(action, Subscribe):
                self._subscribe(session, action, held)
                for frames in held:
                    self._send(client, frames)
                held.clear()
            elif isinstance(action, Close):
                log.info("client %s closed: %s", client.hex(), action.reason)
                self._drop(client)
                return
        if is_new and client in self._sessions:
            self._prewarm(now)

    def _refresh_mount(self, mount: Mount) -> IndexDelta:
        self._refreshed[mount.virtual] = time.monotonic()
        return self.indexes[mount.virtual].refresh()

    def _prewarm(self, now: float) -> None:
        """A client said OHAI: refresh the indexes while it scans its DEST.

        Its ICANHAZ then reuses a refresh made after its OHAI instead of stat-ing
        every file again (see ``_subscribe``); at most one per mount every
        ``_PREWARM_EVERY`` seconds, so a crowd connecting at once costs little.
        """
        if self.indexes_live:
            return
        for mount in self.mounts:
            if now - self._refreshed[mount.virtual] >= _PREWARM_EVERY:
                self._publish(mount, self._refresh_mount(mount))

    def _access(self, peer_key: str, path: str) -> bool:
        return not self._denied(path)

    def _denied(self, name: str) -> bool:
        return any(name == d or name.startswith(d + "/") for d in self.deny)

    def _expire(self, now: float) -> None:
        for client, session in list(self._sessions.items()):
            if session.expired(now, self.client_ttl):
                log.info("client %s expired (silent %.0f s)", client.hex(), self.client_ttl)
                self._drop(client)

    def _drop(self, client: bytes) -> None:
        session = self._sessions.pop(client, None)
        if session is not None:
            self.sent_bytes += session.sent_bytes
            self.sent_files += session.sent_files
        self._stalled.pop(client, None)
        self._close_file(client)

    # -- sending ----------------------------------------------------------------

    def _send(self, client: bytes, frames: list[bytes]) -> bool:
        """Send or park; False when the client is parked or gone."""
        queue = self._stalled.get(client)
        if queue is not None:
            queue.append(frames)
            return False
        return self._try_send(client, frames)

    def _try_send(self, client: bytes, frames: list[bytes]) -> bool:
        assert self._router is not None
        send = self._router.send
        try:
            # what send_multipart does, without its per-frame checks and enum arithmetic.
            # Only the first frame can meet a full pipe: the message is queued whole or not.
            # A chunk's frame (ZERO_COPY_MIN and up) is sent zero-copy: libzmq keeps a
            # reference, no 1 MiB memcpy (small ones are copied: no GC-thread round trip).
            send(client, _MORE_NOBLOCK)
            for frame in frames[:-1]:
                send(frame, _MORE_NOBLOCK)
            last = frames[-1]
            if len(last) < ZERO_COPY_MIN:
                send(last, _NOBLOCK)
            elif type(last) is bytearray:  # a pool's frame: used again once libzmq is done
                self._frames.lent(last, send(last, _NOBLOCK, copy=False, track=True))
            else:
                send(last, _NOBLOCK, copy=False)
            return True
        except zmq.Again:
            self._stalled.setdefault(client, deque()).append(frames)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            log.info("client %s is gone", client.hex())
            self._drop(client)
        return False

    def _send_batch(self, batch: _SendBatch) -> None:
        """Send what a pump built, back to back (``_SendBatch``)."""
        for client, frames in batch.take():
            if client in self._sessions:  # (not dropped by a send before it)
                self._send(client, frames)

    def _flush_stalled(self) -> bool:
        """Send what parked clients hold, in order; True when some of it went out."""
        moved = False
        for client in list(self._stalled):
            queue = self._stalled.pop(client)
            while queue:
                if not self._try_send(client, queue[0]):
                    if client in self._stalled:  # parked again: keep the rest in order
                        self._stalled[client].pop()
                        self._stalled[client].extend(queue)
                    break
                queue.popleft()
                moved = True
        return moved

    def _out_wanted(self) -> bool:
        """Poll the router for POLLOUT too: a client is parked on its full pipe.

        With ``ROUTER_MANDATORY`` libzmq reports POLLOUT once *some* peer's pipe has room
        (below its high-water mark), so the loop wakes as soon as a parked client's pipe
        drains instead of after ``_STALL_WAIT_MS`` (measured: docs/performance.md, "FILEMQ small
        files, session 18").  With several clients that room may be another's: a
        POLLOUT wake-up that let no parked message go (``_unparked``) turns POLLOUT off
        for one wait (the timeout's), so a client that keeps its pipe full never makes
        the loop spin."""
        if not self._stalled:
            self._out_useless = False
            return False
        if self._out_useless:
            self._out_useless = False  # (one wait without it, then POLLOUT again)
            return False
        return True

    def _pump(self) -> bool:
        """Send chunks round-robin; True if some client could take more right now."""
        self._unparked = bool(self._stalled) and self._flush_stalled()
        self._shared.clear()  # (a round's clients share reads: ``filemq.sharedread``)
        self._release_folders()  # (walked again each round, as the reads are checked)
        active = [s for s in self._sessions.values() if s.has_work()]
        self._sharing = len(active) > 1  # (one client alone never reads a file twice)
        batch = _SendBatch()
        try:  # (whatever ends the rounds, each message built goes out: its sequence is given)
            if not self._send_rounds(active, batch):
                return False  # capped: the loop waits for tokens (_throttled_ms)
        finally:
            self._send_batch(batch)
        return any(
            s.has_work() and s.client_id not in self._stalled for s in self._sessions.values()
        )

    def _send_rounds(self, active: list[ServerSession], batch: _SendBatch) -> bool:
        """Round-robin over ``active``, one chunk per client per round, at most
        ``_PUMP_BUDGET`` messages, built into ``batch`` (sent when it is full, the rest
        by ``_pump``); False when the cap's bucket ran out of tokens."""
        budget = _PUMP_BUDGET
        bucket = self._bucket
        while active and budget > 0:
            ready = []
            for session in active:
                if session.client_id in self._stalled:
                    continue
                if bucket is not None and bucket.available(time.monotonic()) <= 0:
                    return False
                sent = session.sent_bytes
                try:
                    plan = session.next_chunk()
                    if plan is None:
                        continue
                    frames = self._build(session, plan)
                except Exception:  # never let one client's trouble stop the server
                    log.exception("client %s: cannot send; dropped", session.client_id.hex())
                    self._drop(session.client_id)
                    continue
                if bucket is not None:
                    bucket.take(session.sent_bytes - sent, time.monotonic())
                budget -= 1
                if frames is None:  # nothing to send for that file (unreadable now)
                    if session.has_work():
                        ready.append(session)
                    continue
                if batch.add(session.client_id, frames):
                    self._send_batch(batch)
                if session.has_work():
                    ready.append(session)
            active = ready
        return True

    def _throttled_ms(self) -> int:
        """With a cap: how long the loop may wait before tokens let a chunk go."""
        assert self._bucket is not None
        if not any(s.has_work() for s in self._sessions.values()):
            return 250
        return int(self._bucket.wait(1, time.monotonic()) * 1000) + 1

    def _build(
        self, session: ServerSession, plan: ChunkPlan, *, retry: bool = True
    ) -> list[bytes] | None:
        """The frames for ``plan`` (None: nothing to send, the file cannot be read now)."""
        op = plan.op
        client = session.client_id
        if op.operation is not Operation.CREATE or op.size == 0:
            return session.chunk_frames(plan, b"")
        shared = _shared_version(plan) if self._sharing else None
        if shared is not None:  # a small file sent whole: read once for every client
            data = self._shared.get(shared)
            if data is not None:
                self._close_file(client)
                return session.chunk_frames(plan, data)
        if plan.first:
            if client in self._files:  # (usually none is open: no call)
                self._close_file(client)
            try:
                fd, st = self._open_source(op.source_name or op.name)
            except OSError as exc:
                if op.source_name:  # a copied link's file went: the next resync tells
                    session.skip_current()
                    return None
                return self._unopenable(session, plan, exc, retry=retry)
            if (st.st_size, st.st_mtime_ns, st.st_ino) != (op.size, op.mtime_ns, op.inode):
                if op.source_name:  # its file changed: sent again as that file's change
                    os.close(fd)
                    session.skip_current()
                    return None
                fresh = self._refresh_op(op.name, session)
                if fresh is None:  # there, but not readable any more
                    os.close(fd)
                    session.skip_current()
                    return None
                if fresh.operation is not Operation.CREATE:
                    os.close(fd)
                    return session.chunk_frames(plan, None)
                new_plan = session.replace_current(fresh)
                assert new_plan is not None
                plan = new_plan
                if fresh.size == 0:
                    os.close(fd)
                    return session.chunk_frames(plan, b"")
            self._files[client] = (op.name, fd)
        held = self._files.get(client)
        if held is None:
            return session.chunk_frames(plan, None)
        if plan.size >= ZERO_COPY_MIN and shared is None:
            return self._read_into_frame(session, plan, held[1])
        try:
            data = os.pread(held[1], plan.size, plan.offset)
        except OSError as exc:
            log.error("%s: read failed at offset %d: %s", op.name, plan.offset, exc)
            data = b""  # the file ends short: the client's SHA-1 check fails, it asks again
        if plan.eof or len(data) < plan.size:
            self._close_file(client)
        if shared is not None and plan.op is op:  # (read as that version: fstat agreed)
            self._shared.put(shared, data)
        return session.chunk_frames(plan, data)

    def _read_into_frame(self, session: ServerSession, plan: ChunkPlan, fd: int) -> list[Any]:
        """A big chunk read straight into its frame, behind the encoded head (sent
        zero-copy: the file's bytes are copied once, by the kernel, into the frame)."""
        buffer = session.chunk_buffer(plan, self._frames.take)
        try:
            length = os.preadv(fd, [buffer.data], plan.offset)
        except OSError as exc:
            log.error("%s: read failed at offset %d: %s", plan.op.name, plan.offset, exc)
            length = 0  # the file ends short: the client's SHA-1 check fails, it asks again
        if plan.eof or length < plan.size:
            self._close_file(session.client_id)
        return session.chunk_filled(plan, buffer, length)

    def _open_source(self, name: str) -> tuple[int, os.stat_result]:
        """Open the regular file behind virtual ``name``, no link followed (``filemq.paths``):
        its descriptor and ``fstat``.  Its folder is walked once per round of sending
        (``_folder``): a folder swapped for a link within a round is still read where
        it went (never through the link), and its files are checked by ``fstat``."""
        located = self._locate(name)
        if located is None:
            raise FileNotFoundError(f"{name}: in no mount")
        mount, rel = located
        parts = local_parts(rel)
        fd = open_in(self._folder(mount.directory, parts[:-1]), parts, _READ_FLAGS)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise FileNotFoundError(f"{name}: not a regular file")
        return fd, st

    def _folder(self, directory: Path, parts: tuple[str, ...]) -> int:
        key = (directory, parts)
        fd = self._folders.get(key)
        if fd is None:
            fd = open_dir_beneath(directory, parts)
            if len(self._folders) >= _MAX_FOLDERS:  # the oldest goes
                os.close(self._folders.pop(next(iter(self._folders))))
            self._folders[key] = fd
        return fd

    def _release_folders(self) -> None:
        folders, self._folders = self._folders, {}
        for fd in folders.values():
            os.close(fd)

    def _unopenable(
        self, session: ServerSession, plan: ChunkPlan, exc: OSError, *, retry: bool
    ) -> list[bytes] | None:
        """The file about to be sent cannot be opened: gone (a delete) or unreadable (skip)."""
        name = plan.op.name
        located = self._locate(name)
        if located is not None and not absent(exc):
            mount, rel = located
            self.indexes[mount.virtual].mark_unreadable(rel, exc)
            session.skip_current()
            return None
        fresh = self._refresh_op(name, session)  # gone: tell every client, not just this one
        if fresh is None:
            session.skip_current()
            return None
        if fresh.operation is Operation.CREATE:  # there again (replaced meanwhile)
            if not retry:  # flapping: send nothing now, never a delete of what exists
                session.skip_current()
                return None
            new_plan = session.replace_current(fresh)
            assert new_plan is not None
            return self._build(session, new_plan, retry=False)
        return session.chunk_frames(plan, None)

    def _close_file(self, client: bytes) -> None:
        held = self._files.pop(client, None)
        if held is not None:
            os.close(held[1])

    # -- files and subscriptions ----------------------------------------------

    def _locate(self, name: str) -> tuple[Mount, str] | None:
        for prefix, mount in self._prefixes:
            if name.startswith(prefix):
                return mount, name[len(prefix) :]
        return None

    def _op(
        self, mount: Mount, entry: FileEntry, operation: Operation = Operation.CREATE
    ) -> FileOp:
        op = file_op(mount.prefix + entry.name, entry)  # (read by its name: ``_open_source``)
        return op if operation is Operation.CREATE else replace(op, operation=operation)

    def _published(self, name: str) -> bool:
        """May a client see virtual ``name`` (not denied, in the mount that owns it)?"""
        return not self._denied(name) and self._owner(name) is not None

    def _covering(self, session: ServerSession, name: str) -> str:
        """The subscription of ``session`` that covers ``name`` (its DEST), dir form."""
        for path in session.subscriptions:
            if name.startswith(path):
                return _dest_base(path)
        return "/"

    def _node_offer(
        self, session: ServerSession, mount: Mount, node: Node, name: str, base: str
    ) -> LinkOffer:
        offer = node_offer(
            name,
            node,
            directory=mount.directory,
            index=self.indexes[mount.virtual],
            base=base,
            prefix=mount.prefix,
            policy=session.links,
            links_on=self.links,
            published=lambda virtual: self._published(virtual) and self._owner(virtual) is mount,
        )
        if offer.copied_from:
            self._copied[mount.virtual].setdefault(offer.copied_from, set()).add(node.name)
        return offer

    def _refresh_op(self, name: str, sending: ServerSession) -> FileOp | None:
        """The file ``sending`` was about to send changed: index it again, tell the others.

        None when there is nothing to send: no such mount, or the file is there but
        cannot be read (``FileIndex.held``).
        """
        located = self._locate(name)
        if located is None:
            return None
        mount, rel = located
        index = self.indexes[mount.virtual]
        before = index.get(rel)
        entry = index.update(rel)
        if index.held(rel):
            return None
        op = delete_op(name) if entry is None else self._op(mount, entry)
        if entry is not before:
            self._queue_live([op], skip=sending)
            self._requeue_copies(mount, [rel], skip=sending)
        return op

    def _mirror_loop(self, sub: Subscribe) -> str:
        """Why the mirror asking for ``sub`` would copy itself without end ('' if not)."""
        dest = sub.options.get(OPTION_MIRROR_DEST)
        if not dest:
            return ""
        for i, rel in loopguard.locate_dest(dest, [m.directory for m in self.mounts]):
            mount = self.mounts[i]
            base = mount.prefix + (rel + "/" if rel else "")
            if base.startswith(sub.path) or sub.path.startswith(base):
                where = os.path.join(mount.directory, rel) if rel else str(mount.directory)
                return (
                    f"DEST is inside the directory it mirrors ({where}, published at {base}):"
                    " it would copy itself without end"
                )
        return ""

    def _subscribe(
        self, session: ServerSession, sub: Subscribe, answers: list[list[bytes]] | None = None
    ) -> None:
        """Plan the resync of a subscription; ``answers``: replies to send before a refusal
        (the caller sends them after the plan otherwise)."""
        loop = self._mirror_loop(sub)
        if loop:
            log.warning("client %s refused: %s", session.client_id.hex(), loop)
            for frames in answers or ():
                self._send(session.client_id, frames)
            if answers:
                answers.clear()
            for action in session.refuse(loop):
                if isinstance(action, Reply):
                    self._send(session.client_id, action.frames)
            return
        self.resyncs += 1
        log.info(
            "client %s subscribed to %s (resync=%s, cache %d)",
            session.client_id.hex(),
            sub.path,
            sub.resync,
            len(sub.cache),
        )
        if not sub.resync:
            return
        if sub.up_to_date:  # (``_up_to_date``: nothing differs, nothing to plan)
            self.resyncs_up_to_date += 1
            session.enqueue_marker(sub.path)
            log.info("client %s: %s is up to date", session.client_id.hex(), sub.path)
            return
        base = _dest_base(sub.path) if sub.listing else self._covering(session, sub.path)
        found = self._files_under(session, sub, base)
        files, nodes = found.files, found.nodes
        if sub.listing:  # files only, with their modes (``filemq.lister``)
            ops = [self._op(*files[name], Operation.STAT) for name in sorted(files)]
            session.enqueue(ops)
            session.enqueue_marker(sub.path)
            log.info(
                "client %s: listing of %s: %d files", session.client_id.hex(), sub.path, len(ops)
            )
            return
        cache, attrs = sub.cache, sub.attrs
        mask = sub.meta
        # deletes first (deepest first: a folder after what was in it), then creates in
        # name order (a folder before what goes in it); only what must be sent is sorted
        # (a no-change resync of 10,000 files sorts nothing)
        held = [*cache, *attrs] if mask is not None else list(cache)
        deletes = [
            name
            for name in dict.fromkeys(held)
            if name not in files
            and name not in found.has
            and name.startswith(sub.path)
            and not self._denied(name)
            and not self._held(name)
            and not self._left_out(session, base, name, attrs.get(name))
        ]
        deletes.sort(reverse=True)
        ops = [delete_op(name, attr_kind(attrs.get(name, "")) or Kind.FILE) for name in deletes]
        points = resume_points(sub.path, sub.options)
        sends: list[FileOp] = []
        heads: dict[int, str] = {}  # mode -> "f\t<mode>\t": what an ATTRS line says first
        for name, (mount, entry) in files.items():
            if cache.get(name) != entry.sha1:
                sends.append(self._resumed(session, self._op(mount, entry), points))
            elif mask is not None:
                if entry.mode >= 0:  # the common case inline: unchanged() says the same
                    head = heads.get(entry.mode)
                    if head is None:
                        head = heads[entry.mode] = attr_file(
                            local_mode(entry.mode, mask, Kind.FILE), 0
                        )[:-1]
                    if attrs.get(name) == f"{head}{entry.mtime_ns}":
                        continue
                touch = unchanged(entry, name, attrs, mask)
                if touch is not None:
                    sends.append(touch)
        if mask is not None:
            for name, (mount, node) in nodes.items():
                offer = self._node_offer(session, mount, node, name, base)
                if offer.entry is not None:  # a link copied as its file
                    if cache.get(name) != offer.entry.sha1:
                        sends.append(self._resumed(session, offer.op, points))
                    else:
                        touch = unchanged(offer.entry, name, attrs, mask)
                        if touch is not None:
                            sends.append(touch)
                elif not node_unchanged(offer, node, name, attrs, mask):
                    sends.append(offer.op)
        sends.sort(key=lambda op: op.name)
        ops += sends
        session.enqueue(plan_headers(ops))
        session.enqueue_marker(sub.path)
        log.info(
            "client %s: resync of %s queues %d operations",
            session.client_id.hex(),
            sub.path,
            len(ops),
        )

    def _up_to_date(
        self, session: ServerSession, sub: Subscribe, octets: bytes, attrs: str
    ) -> bool:
        """Does a resync of ``sub`` (its cache field as encoded, its ``ATTRS`` text) come
        from a mirror holding exactly what the server has (``filemq.uptodate``)?

        Only for the usual request: a whole mount whose index is live (checked against
        the disk before any answer, kept by the watcher), one mount under the path, no
        deny list, no links; the mirror's patterns (``sub.filters``) when they are
        matched from that mount's root (the session's DEST is the mount: as
        ``_files_under`` matches them).  Anything else, and any octet that differs, is
        planned file by file (``_subscribe``).
        """
        base = sub.path if sub.path.endswith("/") else sub.path + "/"
        under = [m for m in self.mounts if m.prefix.startswith(base) or base.startswith(m.prefix)]
        if not (
            self.indexes_live
            and not self._unverified
            and len(under) == 1
            and under[0].prefix == base
            and sub.links is LinkPolicy.SKIP
            and not self.deny
        ):
            return False
        filters = sub.filters
        if filters is not None and self._covering(session, sub.path) != base:
            return False  # (the patterns are matched from another folder than the mount's)
        index = self.indexes[under[0].virtual]
        skip: frozenset[str] = frozenset()
        if filters is not None:
            # what is kept per pattern list (the names left out; the encodings without
            # them when there are some: ~12 MiB for 100,000 files) is bounded: a list
            # past the first few since the index last changed is planned as before
            lists: set[tuple[str, ...]] = index.memo("pattern lists", set)
            if filters.lines not in lists:
                if len(lists) >= _PATTERN_LISTS_KEPT:
                    return False
                lists.add(filters.lines)
            skip = index.memo(
                ("left out", filters.lines), lambda: uptodate.left_out(index, filters)
            )
        key = ("cache", filters.lines) if skip and filters is not None else "cache"
        if octets != index.memo(key, lambda: uptodate.cache_octets(index, skip)):
            return False
        if sub.meta is None:  # (a client that sends no ATTRS: contents only)
            return not attrs
        expected = uptodate.attrs_texts(index, sub.meta, filters, skip)
        return expected is not None and uptodate.attrs_match(attrs, expected)

    def _resumed(
        self, session: ServerSession, op: FileOp, points: dict[str, tuple[int, str]]
    ) -> FileOp:
        """``op`` from where the client's partial copy of this version ends (RESUME)."""
        op = resume_from(op, points)
        if op.start:
            log.info(
                "client %s: %s resumes at byte %d", session.client_id.hex(), op.name, op.start
            )
        return op

    def _files_under(self, session: ServerSession, sub: Subscribe, base: str) -> _Found:
        """Every file, folder and link published under ``sub.path`` that the request's
        patterns (``sub.filters``, matched from ``base``, the client's DEST) admit."""
        files: dict[str, tuple[Mount, FileEntry]] = {}
        nodes: dict[str, tuple[Mount, Node]] = {}  # (META clients)
        has: set[str] = set()  # every name the server has under the path (never deleted)
        filters = sub.filters
        for mount in self.mounts:
            prefix = mount.prefix
            if not (prefix.startswith(sub.path) or sub.path.startswith(prefix)):
                continue
            rest = sub.path[len(prefix) :] if sub.path.startswith(prefix) else ""
            subdir = rest.rsplit("/", 1)[0] if "/" in rest else ""
            index = self.indexes[mount.virtual]
            if not self.indexes_live and self._refreshed[mount.virtual] < session.connected_at:
                self._publish(mount, index.refresh(subdir), skip=session)
            elif rest and not rest.endswith("/"):  # one file asked for again: check it now
                self._update_name(mount, rest, skip=session)
            shadowed = self._shadowing(mount)
            whole = prefix.startswith(sub.path)  # every file of this mount is wanted
            if whole and not shadowed and not self.deny and filters is None:
                # the usual resync of a whole mount: every name, copied at C speed
                # (~10x faster than the loop below for 100,000 files)
                for table, found in ((index.entries(), files), (index.nodes(), nodes)):
                    names = list(map(prefix.__add__, table))
                    has.update(names)
                    pairs = zip(itertools.repeat(mount), table.values())
                    found.update(zip(names, pairs, strict=False))  # type: ignore[arg-type]
                continue
            for table, found in ((index.entries(), files), (index.nodes(), nodes)):
                for name, item in table.items():
                    name = prefix + name
                    if not whole and not name.startswith(sub.path):
                        continue
                    if (self.deny and self._denied(name)) or (
                        shadowed and self._owner(name) is not mount
                    ):
                        continue
                    has.add(name)
                    if filters is not None and _patterns_exclude(
                        filters, name, base, getattr(item, "kind", "") == NODE_DIR
                    ):
                        continue
                    found[name] = (mount, item)  # type: ignore[assignment]
        return _Found(files, nodes, has)

    def _left_out(self, session: ServerSession, path: str, name: str, attr: str | None) -> bool:
        """Is ``name`` excluded by the client's patterns or the server's (then a copy a
        mirror has there is never deleted)?"""
        is_dir = attr is not None and attr_kind(attr) is Kind.DIR
        if session.filters is not None and session.excludes(name, path, is_dir):
            return True
        if self.filters is None:
            return False
        located = self._locate(name)
        return located is not None and self.filters.excluded_path(located[1], is_dir)

    def _publish(self, mount: Mount, delta: IndexDelta, skip: ServerSession | None = None) -> None:
        if self.events is not None:
            self._tell_events(mount, delta)
        ops = [self._op(mount, e) for e in delta.changed]
        removed = [(n, Kind.FILE) for n in delta.removed]
        for node_name in delta.removed_nodes:
            removed.append((node_name, Kind.DIR))  # (a link or folder: the client looks)
        ops += [delete_op(mount.prefix + n, kind) for n, kind in removed]
        self._queue_live([op for op in ops if self._owner(op.name) is mount], skip)
        if delta.nodes:
            self._queue_nodes(mount, delta.nodes, skip)
        if delta.changed or delta.removed:
            names = [e.name for e in delta.changed] + list(delta.removed)
            self._requeue_copies(mount, names, skip)

    def _tell_events(self, mount: Mount, delta: IndexDelta) -> None:
        events = self.events
        assert events is not None
        for e in delta.changed:
            name = mount.prefix + e.name
            if self._owner(name) is mount and not self._denied(name):
                events.file_changed(name, e.size, e.sha1, e.mtime_ns)
        for rel in delta.removed:
            name = mount.prefix + rel
            if self._owner(name) is mount and not self._denied(name):
                events.file_deleted(name)

    def _held(self, name: str) -> bool:
        """Is virtual ``name`` there but unreadable (so its copies must not be deleted)?"""
        located = self._locate(name)
        return located is not None and self.indexes[located[0].virtual].held(located[1])

    def _shadowing(self, mount: Mount) -> bool:
        """Does a more specific mount hide part of ``mount``'s tree?"""
        return any(m is not mount and m.prefix.startswith(mount.prefix) for m in self.mounts)

    def _owner(self, name: str) -> Mount | None:
        located = self._locate(name)
        return None if located is None else located[0]

    def _queue_live(self, ops: Iterable[FileOp], skip: ServerSession | None = None) -> None:
        ops = [op for op in ops if not self._denied(op.name)]
        for session in list(self._sessions.values()):
            if session is skip:
                continue
            wanted = [op for op in ops if session.wants(op.name)]
            if wanted:
                self._enqueue_live(session, wanted)

    def _enqueue_live(self, session: ServerSession, ops: list[FileOp]) -> None:
        """Queue live changes for ``session``; a client whose live queue passed
        ``max_live`` (it stopped reading) is told KTHXBAI and forgotten."""
        session.enqueue(ops, live=True)
        if not session.overflowed:
            return
        client = session.client_id
        log.warning("client %s: over %d live changes queued; closed", client.hex(), self.max_live)
        for action in session.overflow():
            if isinstance(action, Reply) and client not in self._stalled:
                self._try_send(client, action.frames)  # (a parked client never reads it)
        self._drop(client)

    def _queue_nodes(
        self, mount: Mount, nodes: Iterable[Node], skip: ServerSession | None = None
    ) -> None:
        """Folders and links that changed: to every META client that wants them."""
        named = [
            (mount.prefix + node.name, node)
            for node in nodes
            if self._owner(mount.prefix + node.name) is mount
            and not self._denied(mount.prefix + node.name)
        ]
        for session in list(self._sessions.values()):
            if session is skip or session.meta is None:
                continue
            ops = [
                self._node_offer(session, mount, node, name, self._covering(session, name)).op
                for name, node in named
                if session.wants(name, node.kind == NODE_DIR)
            ]
            if ops:
                self._enqueue_live(session, ops)

    def _requeue_copies(
        self, mount: Mount, names: Iterable[str], skip: ServerSession | None = None
    ) -> None:
        """Files that changed or went: links copied as them are sent again (copy clients)."""
        copied = self._copied[mount.virtual]
        if not copied:
            return
        links = {link for name in names for link in copied.pop(name, ())}
        index = self.indexes[mount.virtual]
        nodes = [node for node in map(index.node, sorted(links)) if node is not None]
        if not nodes:
            return
        for session in list(self._sessions.values()):
            if session is skip or session.meta is None or session.links is not LinkPolicy.COPY:
                continue
            ops = []
            for node in nodes:
                name = mount.prefix + node.name
                if self._denied(name) or not session.wants(name):
                    continue
                offer = self._node_offer(session, mount, node, name, self._covering(session, name))
                ops.append(offer.op)
            if ops:
                self._enqueue_live(session, ops)

    def _update_name(
        self,
        mount: Mount,
        rel: str,
        *,
        rehash: bool = False,
        skip: ServerSession | None = None,
    ) -> None:
        """Index ``rel`` again and tell the clients what changed there."""
        index = self.indexes[mount.virtual]
        before = index.lookup(rel)
        index.update(rel, rehash=rehash)
        after = index.lookup(rel)
        if after is before:
            return  # this version was published already
        if (
            isinstance(before, FileEntry)
            and isinstance(after, FileEntry)
            and after.same_version(before)
        ):
            return  # written again as it was (a new inode only): the clients hold it
        if after is not None:  # folders made for it first (their modes)
            self._publish(mount, self._folders_above(index, rel), skip=skip)
        if isinstance(after, FileEntry):
            self._publish(mount, IndexDelta((after,), ()), skip=skip)
        elif after is not None:
            self._publish(mount, IndexDelta((), (), (after,)), skip=skip)
        elif isinstance(before, Node):
            self._publish(mount, IndexDelta((), (), (), (rel,)), skip=skip)
        else:
            self._publish(mount, IndexDelta((), (rel,)), skip=skip)
        if after is None:  # folders it leaves behind, if they went too (a folder moved)
            self._publish(mount, self._folders_above(index, rel), skip=skip)

    def _folders_above(self, index: FileIndex, rel: str) -> IndexDelta:
        """Look at the folders above ``rel`` again (a watcher reports files, not folders):
        the ones made or gone, deepest first."""
        if not index.tree:
            return IndexDelta((), ())
        parts = rel.split("/")
        made: list[Node] = []
        gone: list[str] = []
        for depth in range(len(parts) - 1, 0, -1):
            folder = "/".join(parts[:depth])
            before = index.node(folder)
            index.update(folder)
            after = index.node(folder)
            if after is before:
                break  # (so are the ones above it)
            if after is not None:
                made.append(after)
            elif before is not None:
                gone.append(folder)
        return IndexDelta((), (), tuple(reversed(made)), tuple(gone))

    def _changed(self, mount_virtual: str, name: str, *, rehash: bool) -> None:
        mount = next((m for m in self.mounts if m.virtual == virtual_path(mount_virtual)), None)
        if mount is None:
            log.warning("change notice for unknown mount %r", mount_virtual)
            return
        full = mount.prefix + name
        located = self._locate(full)
        if located is None or located[0] is not mount:
            return  # shadowed by a more specific mount
        self._update_name(mount, located[1], rehash=rehash)

    def _rescan(self, mount_virtual: str, subtree: str = "") -> None:
        for mount in self.mounts:
            if mount_virtual and mount.virtual != virtual_path(mount_virtual):
                continue
            self.rescans += 1
            if subtree:
                delta = self.indexes[mount.virtual].refresh(subtree)
            else:
                delta = self._refresh_mount(mount)
            if delta.changed or delta.removed:
                log.info(
                    "rescan of %s%s: %d changed, %d removed",
                    mount.prefix,
                    subtree,
                    len(delta.changed),
                    len(delta.removed),
                )
            self._publish(mount, delta)


#: Content bytes of small-file messages a pump builds before it sends them together.
SEND_BATCH_BYTES = 256 << 10


class _SendBatch:
    """Messages built by one pump, sent together (``FileServer._send_batch``).

    Sent one at a time, each message of a small file woke libzmq's I/O thread on its
    own (a mailbox signal, an ``epoll`` round, one TCP ``send`` per message: ~10
    system calls per file on the server, as many wake-ups on the client); sent back
    to back, the I/O thread finds several waiting and writes them in one ``send``.
    Bounded: full at ``SEND_BATCH_BYTES`` of content (a big chunk fills it alone).
    """

    __slots__ = ("_bytes", "_messages")

    def __init__(self) -> None:
        self._messages: list[tuple[bytes, list[bytes]]] = []
        self._bytes = 0

    def add(self, client: bytes, frames: list[bytes]) -> bool:
        """Keep a message for ``client``; True when the batch is full (send it now)."""
        self._messages.append((client, frames))
        self._bytes += len(frames[-1])
        return self._bytes >= SEND_BATCH_BYTES

    def take(self) -> list[tuple[bytes, list[bytes]]]:
        """The messages kept, in the order added; the batch is empty again."""
        messages, self._messages, self._bytes = self._messages, [], 0
        return messages


@dataclass(frozen=True, slots=True)
class _Found:
    """What a resync or a listing covers (``FileServer._files_under``)."""

    files: dict[str, tuple[Mount, FileEntry]]  # virtual name -> its mount and entry
    nodes: dict[str, tuple[Mount, Node]]  # folders and links
    has: set[str]  # every name there, the excluded ones too (never deleted)


def _shared_version(plan: ChunkPlan) -> Version | None:
    """The version a plan sending a small file whole reads (``filemq.sharedread``)."""
    op = plan.op
    if not (plan.first and plan.eof and op.start == 0) or op.size > DEFAULT_MAX_FILE:
        return None
    return (op.source_name or op.name, op.size, op.mtime_ns, op.inode, op.sha1)


#: Mirrors' pattern lists whose up-to-date encodings an index keeps (until it changes).
_PATTERN_LISTS_KEPT = 4


def _dest_base(path: str) -> str:
    """Subscription ``path`` in folder form: where a client's patterns are matched from."""
    return path if path.endswith("/") else path.rpartition("/")[0] + "/"


def _patterns_exclude(filters: Filters, name: str, base: str, is_dir: bool) -> bool:
    """Do ``filters`` (a client's, matched from folder ``base``) leave out ``name``?"""
    rel = name[len(base) :].lstrip("/") if name.startswith(base) else ""
    return bool(rel) and filters.excluded_path(rel, is_dir)


def _peer_key(frame: Any) -> str:
    try:
        return str(frame.get("User-Id"))
    except (zmq.ZMQError, AttributeError, TypeError):
        return ""
