"""Server side of FILEMQ as a sans-IO state machine: one ``ServerSession`` per client.

``ServerSession.receive(frames, now)`` takes one decoded-from-the-wire message
(the frames after the ROUTER routing id) and returns actions: ``Reply`` (frames
to send back), ``Subscribe`` (the server must compute which files to queue) and
``Close`` (forget this client).  Sending file data is pull-based:
``next_chunk()`` says which bytes of which file may go out now (within credit),
the I/O layer reads them, and ``chunk_frames(plan, data)`` encodes the
CHEEZBURGER and advances offset, credit and sequence.  For a big chunk the I/O layer
reads straight into the frame instead: ``chunk_buffer(plan)`` encodes the head into a
buffer with room for the chunk, ``chunk_filled(plan, buffer, n)`` advances (a short
read falls back to ``chunk_frames``): the chunk is never copied into a joined frame.

Rules enforced here:

* a message without the FILEMQ signature is dropped silently; any other
  malformed or unexpected command gets RTFM and the session is closed;
* OHAI with another protocol or version gets RTFM (the codec refuses it);
* ICANHAZ needs a path starting with '/'; a path with '.' or '..' components,
  or one the access policy refuses, gets SRSLY and every later command from
  the client is discarded;
* data is sent only while credit >= 1 byte; a chunk is
  ``min(chunk_size, credit, bytes left)`` so there is no livelock at any credit;
  empty files, deletes and the resync marker cost no credit;
* the chunks of one file are consecutive; sequence numbers count CHEEZBURGERs
  per client from 0; the last chunk has eof=1 and the sha1/size/mtime_ns headers
  (and ``mode`` when the op knows it, ``filemq.meta``), and so has the first chunk
  of a file sent in several; a folder, link or touch (``kind``/``touch`` in the
  op's own headers) is one chunk that carries only its own headers;
* a file the client holds part of (ICANHAZ option ``RESUME``, ``resume_points``)
  starts at that offset when its version (SHA-1) is the one the client was
  receiving (``resume_from``), else at 0;
* a listing (ICANHAZ option ``LIST=1``) is answered with STAT operations (no
  content, the version headers and ``mode``) and is not a subscription: no live
  changes follow it, and its options do not change the session's;
* a resync's cache is kept as its octets (the model's ``lazy`` field): the I/O
  layer's ``up_to_date(session, subscription, octets, ATTRS text)`` may say the client
  holds exactly what the server has (``filemq.uptodate``), and the subscription
  then has nothing to plan (``Subscribe.up_to_date``, cache and attributes not
  decoded); otherwise the entries are decoded here, and one that is malformed
  gets RTFM as a malformed command does;
* ICANHAZ options ``META``, ``LINKS``, ``FILTER`` (``filemq.meta``) are checked
  here: one that cannot be used (a bad mask, an unknown policy, a pattern over the
  limits of ``filemq.filters``) gets SRSLY; ``ATTRS`` lines that cannot be read are
  left out (those entries are sent again).  The latest options hold for the whole
  session; ``wants(name)`` leaves out names the client's patterns exclude, matched
  relative to the subscription that covers the name (the client's DEST);
* live changes queued for one client and not sent yet are bounded
  (``max_live``, default ``DEFAULT_MAX_LIVE`` operations; a change to a name
  already queued replaces it and costs nothing): a client that stops reading
  while changes keep coming is told KTHXBAI and closed (``overflowed``) rather
  than queued for without end.  Nothing is lost: the client reconnects and its
  resync (by its cache) sends what it lacks.  A resync's own operations are not
  counted (it queues what the path holds, however many files);
* on a wire with ``empty_final_chunk`` (``--wire czmq``) every data chunk has
  eof=0 and a file ends with one more chunk, zero-length, eof=1, at offset =
  bytes sent, carrying those headers: the reference C client closes a file on a
  zero-length chunk only.  (An empty file is that one chunk alone.)  It costs no
  credit but, like any chunk, waits for credit >= 1 byte.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from filemq.engine import (
    DEFAULT_CHUNK_SIZE,
    HEADER_BYTES,
    HEADER_FILES,
    HEADER_MTIME,
    HEADER_PATH,
    HEADER_RESYNC,
    HEADER_SHA1,
    HEADER_SIZE,
    OPTION_LIST,
    OPTION_RESUME,
    RESYNC_COMPLETE,
    Operation,
    Wire,
    clip_reason,
)
from filemq.filters import Filters
from filemq.meta import (
    HEADER_KIND,
    HEADER_MODE,
    HEADER_TOUCH,
    OPTION_ATTRS,
    OPTION_FILTER,
    OPTION_LINKS,
    OPTION_META,
    LinkPolicy,
    decode_attrs,
    format_mode,
    parse_mask,
)
from filemq.paths import UnsafePathError, all_relative_safe, relative_parts, virtual_path

__all__ = [
    "DEFAULT_MAX_LIVE",
    "AccessPolicy",
    "ChunkBuffer",
    "ChunkPlan",
    "Close",
    "FileOp",
    "Reply",
    "ServerSession",
    "SessionState",
    "Subscribe",
    "UpToDate",
    "plan_headers",
    "resolve_attrs",
    "resolve_cache",
    "resume_from",
    "resume_points",
]

log = logging.getLogger(__name__)

#: (client key or "", subscription path) -> allowed?
AccessPolicy = Callable[[str, str], bool]
#: (the session asking, its subscription, the cache field as encoded, the ATTRS text)
#: -> does the client hold exactly what the server has there?  (``filemq.uptodate``;
#: the I/O layer's index; the session's subscriptions say where its patterns apply.)
UpToDate = Callable[["ServerSession", "Subscribe", bytes, str], bool]
_MAX_CREDIT = (1 << 63) - 1
_MAX_RESUME_POINTS = 64  # RESUME lines read from one ICANHAZ (a client holds a few)
#: Live operations queued for one client, not sent yet, before it is closed (KTHXBAI).
DEFAULT_MAX_LIVE = 10_000


class SessionState(Enum):
    EXPECT_OHAI = "expect-ohai"
    READY = "ready"
    REFUSED = "refused"  # after SRSLY: everything from the client is discarded
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class FileOp:
    """One operation queued for a client: create (send a file), delete, or the marker."""

    name: str  # virtual path sent as the CHEEZBURGER filename
    operation: Operation
    # local file to read (create) for an I/O layer that reads by path; ``FileServer``
    # reads by virtual name (no path made per queued file) and leaves it empty
    source: str = ""
    size: int = 0
    mtime_ns: int = 0
    sha1: str = ""
    # extra headers (first chunk only): a marker's, or all of a folder's, link's, touch's
    headers: tuple[tuple[str, str], ...] = ()
    inode: int = -1  # of the indexed version (the server checks it before sending)
    start: int = 0  # first byte to send (a resumed transfer: the client holds the rest)
    mode: int = -1  # permission bits, sent as the ``mode`` header (-1: not sent)
    source_name: str = ""  # virtual name to read from, when not ``name`` (a copied link)

    @property
    def described(self) -> bool:
        """Its own headers say all there is (a folder, link or touch): no version added."""
        if not self.headers:  # (a file's op: asked for on every chunk sent)
            return False
        return any(key in (HEADER_KIND, HEADER_TOUCH) for key, _value in self.headers)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """Bytes the I/O layer should read and hand to ``chunk_frames``."""

    op: FileOp
    offset: int
    size: int
    first: bool
    eof: bool


@dataclass(frozen=True, slots=True)
class ChunkBuffer:
    """A CHEEZBURGER's frame with room for its chunk: ``data`` (a view of ``frame``'s
    tail, after the encoded head) is where the I/O layer reads the file's bytes."""

    frame: bytearray
    data: memoryview


@dataclass(frozen=True, slots=True)
class Reply:
    frames: list[bytes]


@dataclass(frozen=True, slots=True)
class Subscribe:
    """The client subscribed to ``path``; with ``resync`` queue what it lacks."""

    path: str
    resync: bool
    cache: dict[str, str] = field(default_factory=dict)  # virtual path -> sha1 hex
    options: dict[str, str] = field(default_factory=dict)  # ICANHAZ options, as sent
    meta: int | None = None  # META: the permission bits the mirror applies; None: old client
    links: LinkPolicy = LinkPolicy.SKIP
    filters: Filters | None = None  # the client's patterns (relative to ``path``)
    attrs: dict[str, str] = field(default_factory=dict)  # virtual path -> ATTRS text
    #: The cache and ATTRS say exactly what the server has (``UpToDate``): nothing to
    #: plan, ``cache`` and ``attrs`` were not decoded (left empty).
    up_to_date: bool = False

    @property
    def listing(self) -> bool:
        """Only a listing is asked for (STAT operations, no content)."""
        return self.options.get(OPTION_LIST) == "1"


@dataclass(frozen=True, slots=True)
class Close:
    reason: str


Action = Reply | Subscribe | Close


def resolve_attrs(path: str, text: str) -> dict[str, str]:
    """``ATTRS`` lines as {virtual path: text after the name} (names relative to
    ``path``, or absolute under it, as cache keys; unsafe names are left out)."""
    base = path if path.endswith("/") else path + "/"
    attrs = decode_attrs(text)
    if all_relative_safe(attrs):  # (map and zip: ~2x faster than a comprehension)
        return dict(zip(map(base.__add__, attrs), attrs.values(), strict=True))
    out: dict[str, str] = {}
    for name, attr in attrs.items():  # as cache keys: relative, or absolute under path
        try:
            if name.startswith("/"):
                if not name.startswith(path):
                    continue
                out[virtual_path(name)] = attr
            else:
                relative_parts(name)
                out[base + name] = attr
        except UnsafePathError:
            continue
    return out


def resolve_cache(path: str, cache: Mapping[str, str]) -> dict[str, str]:
    """Cache keys as virtual paths, as spec 35 says.

    A key starting with '/' must start with ``path`` or it is ignored; any other
    key is relative to ``path``.  Keys with unsafe components are ignored.
    """
    base = path if path.endswith("/") else path + "/"
    if all_relative_safe(cache):  # the usual cache: relative names, checked in one pass
        digests = "".join(cache.values())
        if digests == digests.lower():
            return dict(zip(map(base.__add__, cache), cache.values(), strict=True))
        return {base + key: digest.lower() for key, digest in cache.items()}
    out: dict[str, str] = {}
    for key, digest in cache.items():
        try:
            if key.startswith("/"):
                if not key.startswith(path):
                    continue
                name = virtual_path(key)
            else:
                relative_parts(key)
                name = base + key
        except UnsafePathError:
            continue
        out[name] = digest.lower()
    return out


def plan_headers(ops: list[FileOp]) -> list[FileOp]:
    """``ops`` (one resync's) with the resync plan headers on the first: how many files
    and content bytes they send (``filemq.engine``, for a client's progress)."""
    creates = [op for op in ops if op.operation is Operation.CREATE and not op.described]
    if not creates:
        return ops
    size = sum(op.size - op.start for op in creates)
    plan = ((HEADER_FILES, str(len(creates))), (HEADER_BYTES, str(size)))
    return [replace(ops[0], headers=ops[0].headers + plan), *ops[1:]]


def resume_points(path: str, options: dict[str, str]) -> dict[str, tuple[int, str]]:
    """The ``RESUME`` option: virtual name -> (offset, SHA-1) of the partial files a
    client holds under ``path``.  Malformed lines and names elsewhere are ignored;
    at most ``_MAX_RESUME_POINTS`` lines are read."""
    text = options.get(OPTION_RESUME)
    if not text:
        return {}
    points: dict[str, tuple[int, str]] = {}
    for line in text.split("\n")[:_MAX_RESUME_POINTS]:
        offset, _, rest = line.partition(" ")
        sha1, _, name = rest.partition(" ")
        if not (offset.isdigit() and len(offset) < 20 and len(sha1) == 40):
            continue
        try:
            if virtual_path(name) != name or not name.startswith(path):
                continue
        except UnsafePathError:
            continue
        points[name] = (int(offset), sha1.lower())
    return points


def resume_from(op: FileOp, points: dict[str, tuple[int, str]]) -> FileOp:
    """``op`` starting where the client's partial copy ends, when that copy is of this
    very version (same SHA-1) and inside it; else ``op`` unchanged (from byte 0)."""
    point = points.get(op.name)
    if point is None or op.operation is not Operation.CREATE:
        return op
    offset, sha1 = point
    if sha1 != op.sha1.lower() or not 0 < offset < op.size:
        return op
    return replace(op, start=offset)


class ServerSession:
    """Protocol state of one client of the server."""

    def __init__(
        self,
        wire: Wire,
        client_id: bytes,
        now: float,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        peer_key: str = "",
        access: AccessPolicy | None = None,
        max_live: int = DEFAULT_MAX_LIVE,
        up_to_date: UpToDate | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        if max_live < 1:
            raise ValueError("max_live must be >= 1")
        self.wire = wire
        self.codec: Any = wire.codec
        self.client_id = client_id
        self.peer_key = peer_key
        self.chunk_size = chunk_size
        self.state = SessionState.EXPECT_OHAI
        self.last_seen = now
        self.connected_at = now
        self.credit = 0
        self.subscriptions: list[str] = []
        self._access = access
        self._up_to_date = up_to_date
        self._sequence = 0
        self._queue: deque[str] = deque()  # names in send order (may hold stale names)
        self._pending: dict[str, FileOp] = {}  # name -> latest op not yet started
        self._current: FileOp | None = None
        self._offset = 0
        self._empty_final = wire.empty_final_chunk
        self._ending = False  # (empty_final_chunk) the data of _current is all sent
        self._markers = 0
        self.max_live = max_live
        self._live: set[str] = set()  # names queued by live changes, not sent yet
        #: Closed because its live queue passed ``max_live`` (it stopped reading).
        self.overflowed = False
        #: The client's META mask (None: it takes files only), link policy and patterns.
        self.meta: int | None = None
        self.links = LinkPolicy.SKIP
        self.filters: Filters | None = None
        #: CHEEZBURGERs, content bytes and whole files sent (for logs, tests and metrics).
        self.sent_messages = 0
        self.sent_bytes = 0
        self.sent_files = 0
        self._table: dict[tuple[SessionState, int], Callable[[Any], list[Action]]] = {
            (SessionState.EXPECT_OHAI, self.codec.MessageId.OHAI): self._on_ohai,
            (SessionState.EXPECT_OHAI, self.codec.MessageId.KTHXBAI): self._on_kthxbai,
            (SessionState.READY, self.codec.MessageId.ICANHAZ): self._on_icanhaz,
            (SessionState.READY, self.codec.MessageId.NOM): self._on_nom,
            (SessionState.READY, self.codec.MessageId.HUGZ): self._on_hugz,
            (SessionState.READY, self.codec.MessageId.HUGZ_OK): self._on_ignore,
            (SessionState.READY, self.codec.MessageId.KTHXBAI): self._on_kthxbai,
        }

    # -- input --------------------------------------------------------------

    def receive(self, frames: list[Any], now: float) -> list[Action]:
        """Handle one message from the client (frames after the routing id)."""
        if self.state is SessionState.CLOSED:
            return []
        try:
            msg = self.codec.decode(frames)
        except self.codec.DecodeError as exc:
            if not exc.signature_ok:
                return []  # spec: silently discard messages without the signature
            if self.state is SessionState.REFUSED:
                return []
            return self._rtfm(f"malformed command: {exc.reason}")
        self.last_seen = now
        if self.state is SessionState.REFUSED:  # discard all but the goodbye
            return self._on_kthxbai(msg) if msg.ID == self.codec.MessageId.KTHXBAI else []
        handler = self._table.get((self.state, msg.ID))
        if handler is None:
            return self._rtfm(f"unexpected {msg.ID.name} in state {self.state.value}")
        return handler(msg)

    def _rtfm(self, reason: str) -> list[Action]:
        self._stop(SessionState.CLOSED)
        return [Reply(self.codec.encode(self.codec.Rtfm(clip_reason(reason)))), Close(reason)]

    def _stop(self, state: SessionState) -> None:
        self.state = state
        self._queue.clear()
        self._pending.clear()
        self._live.clear()
        self._current = None
        self._ending = False
        self.credit = 0

    def _on_ohai(self, msg: Any) -> list[Action]:
        self.state = SessionState.READY
        return [Reply(self.codec.encode(self.codec.OhaiOk()))]

    def _on_icanhaz(self, msg: Any) -> list[Action]:
        raw = msg.path
        if not raw.startswith("/"):
            return self._rtfm(f"ICANHAZ path must start with '/': {raw[:100]!r}")
        try:
            virtual_path(raw)
        except UnsafePathError as exc:
            return self._srsly(f"path refused: {exc}")
        if self._access is not None and not self._access(self.peer_key, raw):
            return self._srsly(f"access to {raw[:200]} refused")
        options = msg.options
        try:
            meta = parse_mask(options[OPTION_META]) if OPTION_META in options else None
            links = LinkPolicy(options.get(OPTION_LINKS, LinkPolicy.SKIP.value))
            filters = Filters.from_option(options.get(OPTION_FILTER, "")) or None
        except ValueError as exc:  # MetaError, FilterError, an unknown policy
            return self._srsly(f"option refused: {exc}")
        resync = options.get("RESYNC") == "1"
        subscribe = Subscribe(raw, resync, {}, dict(options), meta, links, filters)
        if subscribe.listing:  # a listing, not a subscription: no live changes, and the
            # session's options (for the live changes of its subscriptions) stay
            return [Reply(self.codec.encode(self.codec.IcanhazOk())), subscribe]
        self.meta, self.links, self.filters = meta, links, filters
        if not any(raw.startswith(p) for p in self.subscriptions):
            self.subscriptions = [p for p in self.subscriptions if not p.startswith(raw)]
            self.subscriptions.append(raw)
        if resync:
            text = options.get(OPTION_ATTRS, "") if meta else ""
            octets = getattr(msg.cache, "octets", None)  # (a lazy field: as it came)
            if (
                octets is not None
                and self._up_to_date is not None
                and self._up_to_date(self, subscribe, octets, text)
            ):
                subscribe = replace(subscribe, up_to_date=True)
            else:
                cache = resolve_cache(raw, msg.cache)  # (a lazy cache: walked by decode)
                attrs = resolve_attrs(raw, text) if meta else {}
                subscribe = replace(subscribe, cache=cache, attrs=attrs)
        return [Reply(self.codec.encode(self.codec.IcanhazOk())), subscribe]

    def refuse(self, reason: str) -> list[Action]:
        """The I/O layer refuses the subscription (SRSLY); later commands are discarded."""
        return self._srsly(reason)

    def _srsly(self, reason: str) -> list[Action]:
        self._stop(SessionState.REFUSED)
        return [Reply(self.codec.encode(self.codec.Srsly(clip_reason(reason))))]

    def _on_nom(self, msg: Any) -> list[Action]:
        self.credit = min(self.credit + msg.credit, _MAX_CREDIT)
        return []

    def _on_hugz(self, msg: Any) -> list[Action]:
        return [Reply(self.codec.encode(self.codec.HugzOk()))]

    def _on_ignore(self, msg: Any) -> list[Action]:
        return []

    def _on_kthxbai(self, msg: Any) -> list[Action]:
        self._stop(SessionState.CLOSED)
        return [Close("client said KTHXBAI")]

    # -- queueing -------------------------------------------------------------

    def wants(self, name: str, is_dir: bool = False) -> bool:
        """Does a live change to virtual path ``name`` concern this client?"""
        if self.state is not SessionState.READY:
            return False
        for path in self.subscriptions:
            if name.startswith(path):
                return not self.excludes(name, path, is_dir)
        return False

    def excludes(self, name: str, path: str, is_dir: bool = False) -> bool:
        """Do the client's patterns leave out virtual ``name`` (under subscription ``path``)?"""
        if self.filters is None:
            return False
        rel = name[len(path) :].lstrip("/")
        return bool(rel) and self.filters.excluded_path(rel, is_dir)

    def enqueue(self, ops: Iterable[FileOp], *, live: bool = False) -> int:
        """Queue operations; a not-yet-started op for the same name is replaced.

        ``live``: changes seen while the client is subscribed, counted against
        ``max_live``; past it the session is closed (see ``overflow``).
        """
        if self.state is not SessionState.READY:
            return 0
        count = 0
        for op in ops:
            if len(op.name.encode("utf-8", "surrogateescape")) > self.wire.max_name_octets:
                log.warning("skipping %r: name too long for the %s wire", op.name, self.wire.name)
                continue
            if op.name not in self._pending:
                self._queue.append(op.name)
                if live:
                    self._live.add(op.name)
            self._pending[op.name] = op
            count += 1
        if len(self._live) > self.max_live:
            self.overflowed = True
        return count

    def overflow(self) -> list[Action]:
        """The live queue passed ``max_live``: KTHXBAI, and the session ends (its
        client reconnects and resyncs by its cache: nothing is lost)."""
        reason = f"more than {self.max_live} live changes queued: the client is not reading"
        self._stop(SessionState.CLOSED)
        return [Reply(self.codec.encode(self.codec.Kthxbai())), Close(reason)]

    def enqueue_marker(self, path: str) -> None:
        """Queue the resync-complete marker (after everything queued so far)."""
        self._markers += 1
        headers = ((HEADER_RESYNC, RESYNC_COMPLETE), (HEADER_PATH, path))
        key = f"\x00marker{self._markers}"
        self._queue.append(key)
        self._pending[key] = FileOp("", Operation.MARKER, headers=headers)

    @property
    def queued(self) -> int:
        return len(self._pending) + (self._current is not None)

    def has_work(self) -> bool:
        return (
            self.state is SessionState.READY
            and self.credit > 0
            and (self._current is not None or bool(self._pending))
        )

    # -- output ---------------------------------------------------------------

    def _pop(self) -> FileOp | None:
        while self._queue:
            name = self._queue.popleft()
            op = self._pending.pop(name, None)
            if op is not None:
                if self._live:
                    self._live.discard(name)
                return op
        return None

    def next_chunk(self) -> ChunkPlan | None:
        """What may be sent now, or None (no credit, nothing queued, not ready)."""
        if self.state is not SessionState.READY or self.credit <= 0:
            return None
        if self._current is None:
            self._current = self._pop()
            self._ending = False
            if self._current is None:
                return None
            self._offset = self._current.start
        op = self._current
        if op.operation is not Operation.CREATE:
            return ChunkPlan(op, 0, 0, True, True)
        left = op.size - self._offset
        first = self._offset == op.start
        if self._empty_final:
            if self._ending or left <= 0:  # the zero-length chunk that ends the file
                return ChunkPlan(op, self._offset, 0, first, True)
            size = min(self.chunk_size, self.credit, left)
            return ChunkPlan(op, self._offset, size, first, False)
        size = min(self.chunk_size, self.credit, left)
        return ChunkPlan(op, self._offset, size, first, size >= left)

    def _started(self) -> bool:
        return self._current is not None and self._offset != self._current.start

    def replace_current(self, op: FileOp) -> ChunkPlan | None:
        """Before the first chunk went out: the file changed; send version ``op`` instead."""
        if self._current is None or self._started():
            raise ValueError("replace_current only before the first chunk")
        self._current = op
        self._offset = op.start
        return self.next_chunk()

    def skip_current(self) -> None:
        """Before the first chunk went out: the file cannot be read now; send nothing for it.

        (Not a delete: the client keeps whatever copy it has.)
        """
        if self._current is None or self._started():
            raise ValueError("skip_current only before the first chunk")
        self._current = None

    def chunk_frames(self, plan: ChunkPlan, data: bytes | None) -> list[bytes]:
        """Encode the CHEEZBURGER for ``plan`` with ``data`` read from the source.

        ``data`` is None when the source could not be opened; a file not started
        yet then becomes a delete, a started one ends early (the client's SHA-1
        check fails and it fetches the file again).  A short read also ends the
        file early.
        """
        self._check_current(plan)
        operation = plan.op.operation
        if data is None:
            data = b""
            if operation is Operation.CREATE and plan.first:
                operation = Operation.DELETE
        eof, headers = self._chunk_ending(plan, operation, len(data))
        msg = self.codec.Cheezburger(
            self._sequence, int(operation), plan.op.name, plan.offset, int(eof), headers, data
        )
        frames: list[bytes] = self.codec.encode(msg)
        self._chunk_sent(plan, operation, eof, len(data))
        return frames

    def chunk_buffer(
        self, plan: ChunkPlan, alloc: Callable[[int], bytearray] = bytearray
    ) -> ChunkBuffer:
        """A buffer for ``plan``'s bytes, read whole, behind the encoded head of its
        CHEEZBURGER (``encode_cheezburger_head``): the I/O layer reads the file into
        ``data`` and hands the buffer to ``chunk_filled``.  The chunk is never copied
        into a joined frame.  Nothing advances until ``chunk_filled``.  ``alloc(n)``
        gives the frame (``n`` octets, any content: all of it is written here or by the
        read), e.g. one used again (``filemq.framepool``)."""
        self._check_current(plan)
        op = plan.op
        if op.operation is not Operation.CREATE:
            raise ValueError("chunk_buffer: only a file's content is read into a buffer")
        eof, headers = self._chunk_ending(plan, op.operation, plan.size)
        head = self.codec.encode_cheezburger_head(
            plan.size, self._sequence, int(op.operation), op.name, plan.offset, int(eof), headers
        )
        frame = alloc(len(head) + plan.size)
        frame[: len(head)] = head
        return ChunkBuffer(frame, memoryview(frame)[len(head) :])

    def chunk_filled(self, plan: ChunkPlan, buffer: ChunkBuffer, length: int) -> list[Any]:
        """The frames for ``plan`` once ``length`` bytes were read into ``buffer.data``:
        the buffer itself when the read was whole, else (a short read: the file ends
        early) what ``chunk_frames`` makes of the bytes read."""
        if length != plan.size:
            data = bytes(buffer.data[:length])
            buffer.data.release()
            return self.chunk_frames(plan, data)
        self._check_current(plan)
        eof, _headers = self._chunk_ending(plan, plan.op.operation, length)
        buffer.data.release()  # (the frame goes whole; nothing else may write into it)
        self._chunk_sent(plan, plan.op.operation, eof, length)
        return [buffer.frame]

    def _check_current(self, plan: ChunkPlan) -> None:
        if plan.op is not self._current or plan.offset != self._offset:
            raise ValueError("chunk_frames: plan is not the current one")

    def _chunk_ending(
        self, plan: ChunkPlan, operation: Operation, length: int
    ) -> tuple[bool, dict[str, str]]:
        """The eof flag and headers of ``plan``'s CHEEZBURGER carrying ``length`` bytes."""
        op = plan.op
        if self._empty_final and operation is Operation.CREATE and length:
            eof = False  # a data chunk never ends a file: the empty chunk does
        else:
            eof = plan.eof or length < plan.size or operation is not Operation.CREATE
        headers: dict[str, str] = dict(op.headers) if plan.first else {}
        if (not op.headers or not op.described) and (  # (a file's op: no call)
            operation is Operation.STAT or (operation is Operation.CREATE and (eof or plan.first))
        ):  # the version: on the last chunk, the first (the file is resumable) and a STAT
            headers[HEADER_SHA1] = op.sha1
            headers[HEADER_SIZE] = str(op.size)
            headers[HEADER_MTIME] = str(op.mtime_ns)
            if op.mode >= 0:
                headers[HEADER_MODE] = format_mode(op.mode)
        return eof, headers

    def _chunk_sent(self, plan: ChunkPlan, operation: Operation, eof: bool, length: int) -> None:
        """Sequence, credit, offset and counts advanced past ``plan``'s CHEEZBURGER."""
        if self._empty_final and operation is Operation.CREATE and length:
            self._ending = length < plan.size  # a short read: the end comes next
        self._sequence += 1
        self.credit -= length
        self._offset += length
        self.sent_messages += 1
        self.sent_bytes += length
        if eof:
            op = plan.op
            if operation is Operation.CREATE and (not op.headers or not op.described):
                # (not a folder, link; a file's op has no headers of its own: no call)
                self.sent_files += 1
            self._current = None
            self._offset = 0
            self._ending = False

    def expired(self, now: float, ttl: float) -> bool:
        return now - self.last_seen > ttl
