"""Client side of FILEMQ as a sans-IO state machine (``ClientSession``).

``start(now)`` returns the OHAI to send; ``receive(frames, now)`` handles one
message from the server and returns actions: ``Send`` (frames for the server),
``FileChunk`` / ``FileDelete`` (what to do under DEST, names already checked),
``FileRefused`` (an unsafe name: log it, skip the file, the session goes on),
``Subscribed``, ``ResyncDone``, and the terminal ``Refused`` (SRSLY),
``Rejected`` (RTFM) and ``ServerClosed`` (KTHXBAI).  ``tick(now)`` produces
heartbeats and raises ``PeerTimeout`` when the server has been silent too long.

Protocol errors from the server raise ``RemoteProtocolError``: a CHEEZBURGER
whose sequence is not the next one, a first chunk with a non-zero offset,
offsets that are not consecutive, a chunk of another file before the previous
one ended, more data than credit granted, an unknown operation, or an
unexpected command.  The I/O layer then drops any partial file and reconnects.

Credit is a sliding window: ``window`` bytes are granted after OHAI-OK and
every ``window // 4`` bytes received are granted again, so the server always has
3/4 of a window to send while the client writes.  With a bandwidth cap (``rate``
bytes/s, ``filemq.ratelimit``) credit is granted only as a token bucket allows
(the window shrinks to the bucket's size; ``tick(now)`` grants what accrued): the
server never has credit for more than ``burst + rate * t`` bytes by time ``t``.

Resume (``offer_resume``, before the ICANHAZ): partial files the client holds go
out in the ICANHAZ option ``RESUME`` (``filemq.engine``).  A first chunk at a
non-zero offset is accepted only at the offset offered for that file (else a
protocol error); any first chunk of a file uses up its offer (at offset 0: the
server's version changed).  ``forget_offers`` drops the offers left unused.

Listing (``listing=True``): the ICANHAZ carries ``LIST=1``; STAT operations become
``FileListed`` actions; file content is a protocol error (a server that does not
know ``LIST``).  STAT anywhere else is a protocol error too.

A file ends with the chunk that has ``eof=1``: the last data chunk (this
server on the spec wire) or an extra zero-length chunk after ``eof=0`` data
chunks (the reference C server, and this server on the czmq wire).  A
zero-length chunk that follows a file's ``eof`` chunk at that file's end offset
is the other ending repeated, and is dropped: it never creates a new (empty)
version of the file.

Metadata (``filemq.meta``): the headers of a file's last chunk are checked
(``parse_entry``) and travel as ``FileChunk.meta``; a folder, a link, a link the
server does not offer and a touch arrive as ``MakeDir``, ``MakeLink`` and
``Touch`` (one empty chunk each).  A header that cannot be true (unknown kind,
mode or mtime that is not a number in range, a link target that would lead out
of DEST: absolute, ``..`` after a name, climbing above DEST) makes that entry
``FileRefused`` -- the session goes on.  With ``excluded`` (the mirror's
patterns), a create of an excluded name is dropped (``FileSkipped``) and a delete
of one ignored: the server may not know the patterns.  ``attrs`` (what DEST
holds: a function of the ICANHAZ path giving the text) go out as the ``ATTRS``
option of every ICANHAZ.

``synced`` is true once every RESYNC asked for has been answered with the
completion marker (see ``filemq.engine``) and no file is half received.
``last_traffic`` is when the last message other than a heartbeat arrived: an
idle timer counts file traffic, not HUGZ/HUGZ-OK.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from filemq.engine import (
    DEFAULT_CREDIT_WINDOW,
    HEADER_BYTES,
    HEADER_FILES,
    HEADER_PATH,
    HEADER_RESYNC,
    OPTION_LIST,
    OPTION_RESUME,
    RESYNC_COMPLETE,
    LocalProtocolError,
    Operation,
    RemoteProtocolError,
    Wire,
)
from filemq.meta import (
    HEADER_KIND,
    OPTION_ATTRS,
    EntryMeta,
    Kind,
    MetaError,
    parse_entry,
)
from filemq.paths import UnsafePathError, relative_parts, virtual_path

if TYPE_CHECKING:  # imported by a capped session only (start-up of every `filemq sync`)
    from filemq.ratelimit import TokenBucket

__all__ = [
    "ClientSession",
    "ClientState",
    "FileChunk",
    "FileDelete",
    "FileListed",
    "FileRefused",
    "FileSkipped",
    "MakeDir",
    "MakeLink",
    "PeerTimeout",
    "Refused",
    "Rejected",
    "ResyncDone",
    "ResyncPlan",
    "Send",
    "ServerClosed",
    "Subscribed",
    "Touch",
]


_DIR = Kind.DIR.value  # (read once: an Enum member's value is a descriptor call)
_FILE = Kind.FILE


class _MadeWhenEncoded(dict[str, str]):
    """ICANHAZ options whose value under ``key`` is made when the codec reads the options
    (``items()``) and is not kept: ``ATTRS`` is ~5 MiB of text for 100,000 files, which
    otherwise stayed alive beside the frame while the ~7 MiB cache was appended to it
    (the peak of a big no-change ``filemq sync``).  ``options[key]`` itself is ""."""

    __slots__ = ("_key", "_make")

    def __init__(self, options: Mapping[str, str], key: str, make: Callable[[], str]) -> None:
        super().__init__(options)
        self[key] = ""  # (counted by len(): the codec writes the count first)
        self._key, self._make = key, make

    def items(self) -> Iterator[tuple[str, str]]:  # type: ignore[override]
        key = self._key
        for name, value in super().items():
            yield name, self._make() if name == key else value


class PeerTimeout(RemoteProtocolError):
    """The server sent nothing for longer than the timeout."""


class ClientState(Enum):
    START = "start"
    EXPECT_OHAI_OK = "expect-ohai-ok"
    ACTIVE = "active"
    CLOSED = "closed"


_ACTIVE = ClientState.ACTIVE  # (read once per message: a module global, not a class's)


@dataclass(frozen=True, slots=True)
class Send:
    """Frames to send to the server."""

    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class FileChunk:
    """A chunk of file ``name`` to write (version headers on the first and last)."""

    name: str  # relative name under DEST
    parts: tuple[str, ...]
    offset: int  # a first chunk at offset > 0 resumes a partial file (offered)
    data: bytes
    first: bool
    eof: bool
    headers: dict[str, str] = field(default_factory=dict)  # of the first and last chunks
    meta: EntryMeta | None = None  # on the last chunk: mode and mtime, checked


@dataclass(frozen=True, slots=True)
class FileListed:
    """One entry of a listing (STAT): ``name`` relative to the path, the headers."""

    name: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class ResyncPlan:
    """A resync is about to send ``files`` files, ``bytes`` bytes of content."""

    files: int
    bytes: int


@dataclass(frozen=True, slots=True)
class FileDelete:
    """The server deleted ``name``: remove the mirror's copy."""

    name: str
    parts: tuple[str, ...]
    kinded: bool = False  # the server said what it deleted: it mirrors folders itself


@dataclass(frozen=True, slots=True)
class MakeDir:
    """A folder (its mode in ``meta``)."""

    name: str
    parts: tuple[str, ...]
    meta: EntryMeta


@dataclass(frozen=True, slots=True)
class MakeLink:
    """A symbolic link (``meta.target``, checked), or one not offered (``meta.skip``)."""

    name: str
    parts: tuple[str, ...]
    meta: EntryMeta


@dataclass(frozen=True, slots=True)
class Touch:
    """Content unchanged (``sha1``, ``size``): set ``meta.mode`` and ``meta.mtime_ns``."""

    name: str
    parts: tuple[str, ...]
    meta: EntryMeta
    sha1: str
    size: int


@dataclass(frozen=True, slots=True)
class FileSkipped:
    """An entry the mirror's patterns exclude (nothing written)."""

    name: str


@dataclass(frozen=True, slots=True)
class FileRefused:
    """An entry whose name was refused (unsafe): nothing written."""

    name: str  # as received
    reason: str


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The server confirmed the subscription to ``path`` (ICANHAZ-OK)."""

    path: str


@dataclass(frozen=True, slots=True)
class ResyncDone:
    """The resync of ``path`` is complete (its end marker came)."""

    path: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The server refused a request (RTFM): ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """The server refused the session for good (SRSLY): ``reason``."""

    reason: str


@dataclass(frozen=True, slots=True)
class ServerClosed:
    """The server ended the session: ``reason``."""

    reason: str


Action = (
    Send
    | FileChunk
    | FileDelete
    | FileRefused
    | FileListed
    | FileSkipped
    | MakeDir
    | MakeLink
    | Touch
    | Subscribed
    | ResyncPlan
    | ResyncDone
    | Refused
    | Rejected
    | ServerClosed
)


@dataclass(slots=True)
class _Transfer:
    """The file being received: its name on the wire and where it goes."""

    wire_name: str
    parts: tuple[str, ...] | None  # None: refused name, chunks are checked and dropped
    next_offset: int = 0


class ClientSession:
    """Protocol state of a client subscribed to one virtual path."""

    def __init__(
        self,
        wire: Wire,
        path: str,
        cache: Mapping[str, str],
        now: float,
        *,
        window: int = DEFAULT_CREDIT_WINDOW,
        heartbeat: float = 5.0,
        timeout: float = 30.0,
        reserved: Callable[[tuple[str, ...]], bool] | None = None,
        options: dict[str, str] | None = None,
        rate: int | None = None,
        listing: bool = False,
        excluded: Callable[[str, bool], bool] | None = None,
        attrs: Callable[[str], str] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1 byte")
        #: Bandwidth cap (bytes/s): credit is granted through this bucket.
        self.bucket: TokenBucket | None = None
        if rate is not None:
            from filemq.ratelimit import TokenBucket, burst_for

            self.bucket = TokenBucket(rate, burst_for(rate), now)
        if self.bucket is not None:
            window = min(window, int(self.bucket.burst))
        self.listing = listing
        self.wire = wire
        self.codec: Any = wire.codec
        self.path = virtual_path(path, directory=True)
        self._path_len = len(self.path)
        if len(self.path.encode()) > wire.max_name_octets:
            raise LocalProtocolError(f"path {path!r} too long for the {wire.name} wire")
        self.cache = cache
        self.window = window
        self.slice = max(1, window // 4)
        self.heartbeat = heartbeat
        self.timeout = timeout
        self.state = ClientState.START
        self._reserved = reserved
        self._excluded = excluded
        #: The ``ATTRS`` text for an ICANHAZ of a path (what DEST holds besides contents).
        self.attrs = attrs
        self._options = {"RESYNC": "1", **(options or {})}  # of every ICANHAZ
        if listing:
            self._options[OPTION_LIST] = "1"
        self._offers: dict[str, tuple[int, str]] = {}  # wire name -> (offset, sha1)
        self._now = now
        self._last_seq = 0
        self._last_heard = now
        self._last_sent = now
        self._expected_seq = 0
        self._outstanding = 0  # credit granted and not yet used by the server
        self._unreported = 0  # bytes received and not yet granted again
        self._pending_oks = 0
        self._pending_resyncs = 0
        self._current: _Transfer | None = None
        self._ended: tuple[str, int] | None = None  # (wire name, end offset) of the last file
        #: When the last message other than HUGZ/HUGZ-OK arrived (``now`` values).
        self.last_traffic = now
        mid = self.codec.MessageId
        self._heartbeats = (mid.HUGZ, mid.HUGZ_OK)
        self._table: dict[tuple[ClientState, int], Callable[[Any], list[Action]]] = {
            (ClientState.EXPECT_OHAI_OK, mid.OHAI_OK): self._on_ohai_ok,
            (ClientState.ACTIVE, mid.ICANHAZ_OK): self._on_icanhaz_ok,
            (ClientState.ACTIVE, mid.CHEEZBURGER): self._on_cheezburger,
            (ClientState.ACTIVE, mid.HUGZ): self._on_hugz,
            (ClientState.EXPECT_OHAI_OK, mid.HUGZ): self._on_hugz,
            (ClientState.ACTIVE, mid.HUGZ_OK): self._on_nothing,
        }
        for state in (ClientState.EXPECT_OHAI_OK, ClientState.ACTIVE):
            self._table[(state, mid.SRSLY)] = self._on_srsly
            self._table[(state, mid.RTFM)] = self._on_rtfm
            self._table[(state, mid.KTHXBAI)] = self._on_kthxbai
        #: The ACTIVE state's rows keyed by message id alone: looked up once per message
        #: without hashing a ``ClientState`` (an Enum's ``__hash__`` is a Python call).
        self._active = {
            msg_id: handler
            for (state, msg_id), handler in self._table.items()
            if state is ClientState.ACTIVE
        }

    # -- helpers ------------------------------------------------------------

    def _send(self, msg: Any) -> Send:
        return Send(self.codec.encode(msg))

    @property
    def confirmed(self) -> bool:
        """Has every ICANHAZ sent been answered (ICANHAZ-OK)?"""
        return self._pending_oks == 0

    @property
    def synced(self) -> bool:
        return (
            self.state is ClientState.ACTIVE
            and self._pending_resyncs == 0
            and self._pending_oks == 0
            and self._current is None
        )

    @property
    def in_file(self) -> bool:
        return self._current is not None

    def _icanhaz(self, path: str, cache: Mapping[str, str]) -> Send:
        limit = min(255, self.wire.max_name_octets)  # a hash key is a 1-octet-length string
        if max(map(len, cache), default=0) <= limit and all(map(str.isascii, cache)):
            # every key fits (the usual case; checked in C, a key at a time: a join of
            # 100,000 keys listed them all first, ~10 MiB)
            wire_cache: Mapping[str, str] = cache
        else:
            wire_cache = {k: v for k, v in cache.items() if len(k.encode()) <= limit}
        self._pending_oks += 1
        self._pending_resyncs += 1
        options = self._options
        offers = [
            f"{offset} {sha1} {name}"
            for name, (offset, sha1) in self._offers.items()
            if name.startswith(path)
        ]
        if offers:
            options = {**options, OPTION_RESUME: "\n".join(offers)}
        if self.attrs is not None:
            attrs = self.attrs
            options = _MadeWhenEncoded(options, OPTION_ATTRS, lambda: attrs(path))
        return self._send(self.codec.Icanhaz(path, options, wire_cache))

    def _grant(self, now: float) -> list[Action]:
        """Credit back for what the server used (as the cap's bucket allows)."""
        grant = self._unreported
        if self.bucket is not None:
            grant = min(grant, self.bucket.available(now))
        if grant < self.slice or grant <= 0:
            return []
        if self.bucket is not None:
            self.bucket.take(grant, now)
        self._outstanding += grant
        self._unreported -= grant
        return [self._send(self.codec.Nom(grant, self._last_seq))]

    # -- resume -------------------------------------------------------------

    def offer_resume(self, points: Mapping[str, tuple[int, str]]) -> None:
        """Partial files held: relative name -> (bytes held and verified, SHA-1 of the
        version being received).  Sent with every ICANHAZ whose path covers them."""
        for rel, (offset, sha1) in points.items():
            try:
                relative_parts(rel)
            except UnsafePathError:
                continue
            if offset > 0 and len(sha1) == 40:
                self._offers[self.path + rel] = (offset, sha1.lower())

    def forget_offers(self) -> list[str]:
        """Drop the offers no file used; their relative names."""
        names = [name[len(self.path) :] for name in self._offers]
        self._offers.clear()
        return names

    # -- driving ------------------------------------------------------------

    def start(self, now: float) -> list[Action]:
        if self.state is not ClientState.START:
            raise LocalProtocolError("session already started")
        self.state = ClientState.EXPECT_OHAI_OK
        self._last_sent = self._last_heard = now
        return [self._send(self.codec.Ohai())]

    def tick(self, now: float) -> list[Action]:
        if self.state in (ClientState.START, ClientState.CLOSED):
            return []
        if now - self._last_heard > self.timeout:
            raise PeerTimeout(f"server silent for {now - self._last_heard:.1f} s")
        if self.state is not ClientState.ACTIVE:
            return []
        actions = self._grant(now) if self.bucket is not None else []
        if now - self._last_sent >= self.heartbeat:
            self._last_sent = now
            actions.append(self._send(self.codec.Hugz()))
        return actions

    def wakeup(self, now: float) -> float:
        """Seconds until ``tick`` may grant capped credit (inf when nothing waits)."""
        if self.bucket is None or self.state is not ClientState.ACTIVE:
            return float("inf")
        if self._unreported < self.slice:
            return float("inf")
        return self.bucket.wait(self.slice, now)

    def restart_timers(self, now: float) -> None:
        """The I/O layer was busy (scanning DEST): start the silence timers again."""
        self._last_heard = self._last_sent = self.last_traffic = now

    def sent(self, now: float) -> None:
        """The I/O layer sent something (resets the heartbeat timer)."""
        self._last_sent = now

    def close(self) -> list[Action]:
        if self.state is ClientState.CLOSED:
            return []
        was = self.state
        self.state = ClientState.CLOSED
        if was is ClientState.START:
            return []
        return [self._send(self.codec.Kthxbai())]

    def refetch(self, name: str, local: Mapping[str, str]) -> list[Action]:
        """Ask again for relative ``name`` (its SHA-1 did not match)."""
        if self.state is not ClientState.ACTIVE:
            return []
        prefix = self.path + name
        cache = {self.path + k: v for k, v in local.items() if (self.path + k).startswith(prefix)}
        return [self._icanhaz(prefix, cache)]

    def receive(self, frames: list[Any], now: float) -> list[Action]:
        if self.state in (ClientState.START, ClientState.CLOSED):
            return []
        try:
            msg = self.codec.decode(frames)
        except self.codec.DecodeError as exc:
            if not exc.signature_ok:
                return []
            raise RemoteProtocolError(f"malformed message from server: {exc.reason}") from None
        self._last_heard = self._now = now
        if msg.ID not in self._heartbeats:
            self.last_traffic = now
        if self.state is _ACTIVE:
            handler = self._active.get(msg.ID)
        else:
            handler = self._table.get((self.state, msg.ID))
        if handler is None:
            raise RemoteProtocolError(f"unexpected {msg.ID.name} in state {self.state.value}")
        return handler(msg)

    # -- handlers -----------------------------------------------------------

    def _on_ohai_ok(self, msg: Any) -> list[Action]:
        self.state = ClientState.ACTIVE
        icanhaz = self._icanhaz(self.path, self.cache)
        self._outstanding = self.window
        if self.bucket is not None:
            self.bucket.take(self.window, self._now)
        return [icanhaz, self._send(self.codec.Nom(self.window, 0))]

    def _on_icanhaz_ok(self, msg: Any) -> list[Action]:
        if self._pending_oks <= 0:
            raise RemoteProtocolError("ICANHAZ-OK without an ICANHAZ")
        self._pending_oks -= 1
        return [Subscribed(self.path)]

    def _on_hugz(self, msg: Any) -> list[Action]:
        return [self._send(self.codec.HugzOk())]

    def _on_nothing(self, msg: Any) -> list[Action]:
        return []

    def _on_srsly(self, msg: Any) -> list[Action]:
        self.state = ClientState.CLOSED
        return [Refused(msg.reason)]

    def _on_rtfm(self, msg: Any) -> list[Action]:
        self.state = ClientState.CLOSED
        return [Rejected(msg.reason)]

    def _on_kthxbai(self, msg: Any) -> list[Action]:
        self.state = ClientState.CLOSED
        return [ServerClosed("server said KTHXBAI")]

    def _map_name(self, filename: str) -> tuple[str, tuple[str, ...]]:
        if filename.startswith("/"):
            # (``under_prefix`` inline, once per file: ``self.path`` ends in '/')
            rel = filename[self._path_len :] if filename.startswith(self.path) else ""
            if not rel:
                raise UnsafePathError(f"{filename!r} is outside subscription {self.path}")
        else:
            rel = filename
        parts = relative_parts(rel)
        if self._reserved is not None and self._reserved(parts):
            raise UnsafePathError(f"{filename!r} uses a name reserved for temp files")
        return rel, parts

    def _on_cheezburger(self, msg: Any) -> list[Action]:
        if msg.sequence != self._expected_seq:
            raise RemoteProtocolError(
                f"CHEEZBURGER sequence {msg.sequence}, expected {self._expected_seq}"
            )
        self._expected_seq += 1
        size = len(msg.chunk)
        self._outstanding -= size
        if self._outstanding < 0:
            raise RemoteProtocolError("server sent more data than the credit granted")
        self._unreported += size
        self._last_seq = msg.sequence
        actions = self._apply(msg, size)
        if HEADER_FILES in msg.headers:  # the first operation of a resync: its plan
            plan = _count(msg.headers[HEADER_FILES]), _count(msg.headers.get(HEADER_BYTES))
            actions.insert(0, ResyncPlan(*plan))
        if self._unreported >= self.slice:
            actions += self._grant(self._now)
        return actions

    def _apply(self, msg: Any, size: int) -> list[Action]:
        """The actions of one CHEEZBURGER carrying ``size`` content bytes."""
        op = msg.operation
        ended, self._ended = self._ended, None  # only the very next chunk may repeat an end
        if op == Operation.MARKER:
            if self._current is not None or msg.chunk:
                raise RemoteProtocolError("resync marker inside a file transfer")
            if msg.headers.get(HEADER_RESYNC) == RESYNC_COMPLETE and self._pending_resyncs > 0:
                self._pending_resyncs -= 1
                return [ResyncDone(msg.headers.get(HEADER_PATH, self.path))]
            return []
        if op == Operation.STAT:
            if not self.listing or self._current is not None or msg.chunk:
                raise RemoteProtocolError("STAT outside a listing, or with content")
            try:
                rel, _parts = self._map_name(msg.filename)
            except UnsafePathError as exc:
                return [FileRefused(msg.filename, str(exc))]
            return [FileListed(rel, dict(msg.headers))]
        if op == Operation.DELETE:
            if self._current is not None:
                raise RemoteProtocolError("delete inside a file transfer")
            try:
                rel, parts = self._map_name(msg.filename)
            except UnsafePathError as exc:
                return [FileRefused(msg.filename, str(exc))]
            kind = msg.headers.get(HEADER_KIND)
            if self._excluded is not None and self._excluded(rel, kind == _DIR):
                return []  # never delete what the mirror's patterns leave out
            return [FileDelete(rel, parts, kinded=kind is not None)]
        if op != Operation.CREATE:
            raise RemoteProtocolError(f"unknown CHEEZBURGER operation {op}")
        if self.listing:  # even an empty file: a server that knows LIST sends STAT only
            raise RemoteProtocolError("a file sent to a listing (the server lacks LIST)")
        actions: list[Action] = []
        current = self._current
        first = current is None
        if current is None:
            if not msg.chunk and ended == (msg.filename, msg.offset) and msg.offset:
                return actions  # eof on the last data chunk, then the empty chunk too
            # (used up either way; most sessions have none)
            offer = self._offers.pop(msg.filename, None) if self._offers else None
            if msg.offset != 0 and (offer is None or offer[0] != msg.offset):
                raise RemoteProtocolError(f"{msg.filename!r}: first chunk at offset {msg.offset}")
            try:
                rel, parts = self._map_name(msg.filename)
                current = _Transfer(msg.filename, parts, msg.offset)
            except UnsafePathError as exc:
                actions.append(FileRefused(msg.filename, str(exc)))
                current = _Transfer(msg.filename, None, msg.offset)
            else:
                excluded = self._excluded
                if excluded is not None and excluded(rel, msg.headers.get(HEADER_KIND) == _DIR):
                    actions.append(FileSkipped(rel))
                    current = _Transfer(msg.filename, None, msg.offset)
            self._current = current
        elif msg.filename != current.wire_name:
            raise RemoteProtocolError(
                f"chunk of {msg.filename!r} before {current.wire_name!r} ended"
            )
        elif msg.offset != current.next_offset:
            raise RemoteProtocolError(
                f"{msg.filename!r}: offset {msg.offset}, expected {current.next_offset}"
            )
        current.next_offset += size
        if current.parts is not None:
            meta = None
            if msg.eof:
                try:
                    meta = parse_entry(msg.headers, current.parts)
                    # (a file's content, the usual case, without a call)
                    entry = (
                        None
                        if meta.kind is _FILE and not meta.touch
                        else self._entry(current.parts, meta, msg, first)
                    )
                except MetaError as exc:
                    actions.append(FileRefused(msg.filename, str(exc)))
                    entry = None
                    meta = None
                    current.parts = None
                if entry is not None:
                    actions.append(entry)
                    current.parts = None
            if current.parts is not None:
                actions.append(
                    FileChunk(
                        "/".join(current.parts),
                        current.parts,
                        msg.offset,
                        msg.chunk,
                        first,
                        bool(msg.eof),
                        msg.headers if msg.eof or first else {},
                        meta,
                    )
                )
        if msg.eof:
            self._current = None
            self._ended = (current.wire_name, current.next_offset)
        return actions

    def _entry(
        self, parts: tuple[str, ...], meta: EntryMeta, msg: Any, first: bool
    ) -> Action | None:
        """The action for a folder, link or touch (None: a file's content)."""
        if meta.kind is Kind.FILE and not meta.touch:
            return None
        if not first or msg.chunk or msg.offset:
            raise MetaError(f"a {meta.kind.value} entry with content")
        name = "/".join(parts)
        if meta.kind is Kind.DIR:
            return MakeDir(name, parts, meta)
        if meta.kind is Kind.SYMLINK:
            return MakeLink(name, parts, meta)
        sha1 = msg.headers.get("sha1", "").lower()
        size = msg.headers.get("size", "")
        if len(sha1) != 40 or not size.isdigit() or len(size) > 19:
            raise MetaError("touch without a SHA-1 and size")
        return Touch(name, parts, meta, sha1, int(size))


def _count(text: str | None) -> int:
    """A non-negative count from a header ('' or garbage: 0)."""
    return int(text) if text is not None and text.isdigit() and len(text) < 20 else 0
