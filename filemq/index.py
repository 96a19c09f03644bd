"""The per-root file index: relative name -> size, mtime_ns, inode, SHA-1, mode.

One ``FileIndex`` describes the regular files under one root directory (a
published directory on the server, the DEST of a mirror on the client).  The
SHA-1 of a file is computed once per *file version*, identified by the key
``(size, mtime_ns, inode)``: ``refresh()`` stats every file and re-reads only
those whose key changed.  Symbolic links, devices and names that are not valid
UTF-8 are never indexed (a link could lead out of the root).  Every file and
folder is reached through ``filemq.paths.open_beneath`` / ``lstat_beneath``: no
symbolic link below the root is followed, not even by a name given to
``update`` or ``refresh`` (a watcher's notice, a client's exact-path request).

Missing is not the same as unreadable.  A name that is gone, or is not a
regular file reached without links, leaves the index (a delete for mirrors).  A
file that exists but cannot be read (permission denied, I/O error, changing
faster than it can be hashed), or a folder that cannot be listed, is an error:
logged once, listed by ``unreadable()``, and *held* -- its last readable entry
stays (or, never read, it is at least not reported as removed), and ``held()``
tells callers not to delete mirrors' copies.  Held names are tried again by
every ``refresh``.

Permission bits (``FileEntry.mode``) come from the same ``lstat``: a ``chmod``
makes a new entry with the same SHA-1 (nothing is read again).  With ``tree=True``
the index also lists folders (``Node`` of kind ``dir``, with their permission bits)
and symbolic links (kind ``symlink``, with what the link says, read again only when
the link's inode or mtime changed) -- as names, never followed.  ``filters``
(``filemq.filters``) leave out names, and everything below a folder they leave out.

On-disk format (``save``/``load``), version 3 -- a JSON header line, the folders
and links as JSON lines, then the files as columns (little-endian)::

    {"format": "filemq-index", "version": 3, "root": "/abs/root", "entries": N,
     "nodes": M, "names": B, "crc32": C}
    ["folder", "d", mode]                            (M lines of folders and links,
    ["link", "l", "target", mtime_ns, inode]          sorted by name)
    B octets: the N names (UTF-8, sorted) joined by NUL (no file name holds one)
    N x int64 size, N x int64 mtime_ns, N x uint64 inode, N x int32 mode,
    N x 20 octets SHA-1

``C`` is the CRC-32 of everything after the header line: a torn or damaged
file is refused, never trusted.  The names must be in order, each once (they
are looked up by bisection).  Loading it parses no text per file and makes no
object per file but its name: in memory the loaded rows *stay* columns (names in
a sorted list, ``array`` columns, the SHA-1s in one ``bytes``: ~130 octets a file
for 22-character names, against ~350 as a ``FileEntry`` in a dict); a
``FileEntry`` is made when one is asked for, and entries set or removed after
the load are kept beside the rows (``_Entries``).  ``digests()`` (a resync
cache) is a snapshot view of the rows, not a dict.

Version 2 (still read, and written by ``save(version=2)``) is UTF-8 JSON lines:
the same header without ``names``/``crc32``, the node lines, then one line
``["relative/name", size, mtime_ns, inode, "sha1hex", mode]`` per file.
Version 1 (no nodes, file rows without ``mode``) is still read: its entries get
``mode`` -1, which the next ``refresh`` fills in from ``lstat`` without hashing.
An index read from version 1 or 2 is ``dirty``: its owner saves it again as
version 3 (logged once).

``load`` refuses another ``format``, another ``version``, another ``root``, a
wrong count, a malformed line or a name that is not a plain relative name
(``..``, absolute, backslash, NUL...: a tampered file) with
``IndexFormatError``; callers treat that as "no index" and rebuild.  ``save``
writes a temp file beside the target and renames it into place, so a crash
never leaves a half-written index; the temp file of a save that failed is removed, and
those of writers killed mid-save (their pid gone) by the next ``save``.  A newer format
gets a new version number and a reader for the old one here, behind ``load``; nothing
outside this module knows the layout.  Where index files
live (server state dir, mirror cache) is ``filemq.state``'s business.

Speed (every ``filemq sync`` loads and refreshes its DEST's index; 10,000
files on this machine): ``load`` ~6 ms (one JSON parse, columns checked with
C-level passes; 100,000 files: ~0.06 s CPU and ~14 MiB, was ~0.2 s and ~55 MiB
as entries), ``refresh`` ~20 ms of which ~12 ms are the ``lstat`` calls (made
relative to an open folder descriptor), both with the cyclic GC paused.  A
refresh of a loaded index tests a folder at a time against the run of rows it
must be (``_unchanged_files``: sorted entries, C-level ``lstat`` and comparisons;
100,000 unchanged files: 0.75 Python calls a file, was 8.6); every name is still
``lstat``-ed (a folder's mtime does not move when a file in it is rewritten).  What
the key cannot see: a rewrite in place whose size and mtime_ns are put back (the
ctime is not kept), as rsync's quick check.
Making every entry (``entries()``, iterating) costs ~1.5 us a file that a dict of
entries did not.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
import json
import logging
import os
import stat
import sys
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, ItemsView, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, compress, repeat, starmap
from json.encoder import encode_basestring as _json_string
from operator import add, attrgetter, itemgetter, lt, methodcaller
from pathlib import Path
from stat import S_IMODE, S_ISDIR, S_ISLNK, S_ISREG
from struct import iter_unpack
from typing import Any, BinaryIO, NamedTuple

from filemq.engine import FilemqError
from filemq.filters import Filters
from filemq.paths import (
    UnsafePathError,
    absent,
    local_parts,
    lstat_beneath,
    open_beneath,
    readlink_beneath,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FileEntry",
    "FileIndex",
    "IndexDelta",
    "IndexFormatError",
    "LeftOut",
    "Node",
    "NotRegularFile",
    "SavedIndex",
    "sha1_beneath",
    "sha1_file",
]

log = logging.getLogger(__name__)

FORMAT_NAME = "filemq-index"
FORMAT_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)
_PERMS = 0o7777
NODE_DIR = "dir"
NODE_SYMLINK = "symlink"
_HASH_RETRIES = 3


class IndexFormatError(FilemqError):
    """A saved index cannot be used (wrong format, version, root, or corrupt)."""


class FileEntry(NamedTuple):
    """One indexed file version.

    A named tuple rather than a frozen dataclass: an index holds one per file and
    loading 10,000 of them is on the start-up path of every ``filemq sync``
    (~0.5 us each instead of ~0.6 us per field).
    """

    name: str  # relative, '/'-separated
    size: int
    mtime_ns: int
    inode: int
    sha1: str  # lowercase hex
    mode: int = -1  # permission bits (st_mode & 0o7777); -1: not known yet (a version 1 index)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.mtime_ns, self.inode)

    def same_version(self, other: FileEntry) -> bool:
        """What a mirror receives of both is the same (contents, size, mode, mtime):
        they may differ only by inode, as a file written again with the same bytes."""
        return (self.sha1, self.size, self.mode, self.mtime_ns) == (
            other.sha1,
            other.size,
            other.mode,
            other.mtime_ns,
        )


class Node(NamedTuple):
    """A folder or a symbolic link under the root (``FileIndex(tree=True)``)."""

    name: str
    kind: str  # NODE_DIR or NODE_SYMLINK
    mode: int = 0  # folders: permission bits
    target: str = ""  # links: what the link says (never followed here)
    mtime_ns: int = 0  # links: with inode, when to read the target again
    inode: int = 0


@dataclass(frozen=True, slots=True)
class IndexDelta:
    """What a refresh found: new or changed entries, and names that disappeared.

    ``nodes`` / ``removed_nodes``: the same for folders and links (``tree=True``).
    """

    changed: tuple[FileEntry, ...]
    removed: tuple[str, ...]
    nodes: tuple[Node, ...] = ()
    removed_nodes: tuple[str, ...] = ()


class LeftOut:
    """What an index leaves out by name alone (``FileIndex(exclude=...)``): the names that
    start with one of ``prefixes`` and the names in ``names`` (a mirror's temp files and
    its own index file in DEST).  Called with a name as any ``exclude``; a refresh also
    asks it about a folder's files at once (``any_in``), not with a call per name.
    (A plain class: made at import without a dataclass's compiled methods.)"""

    __slots__ = ("names", "prefixes")

    def __init__(self, prefixes: tuple[str, ...], names: frozenset[str] = frozenset()) -> None:
        self.prefixes = prefixes
        self.names = names

    def __call__(self, name: str) -> bool:
        return name.startswith(self.prefixes) or name in self.names

    def any_in(self, base: str, leaves: list[str]) -> bool:
        """Is one of the names ``base`` + leaf left out?  ``base`` is a folder's name and
        '/' ('' for the root), ``leaves`` the names in it (never holding '/' or NUL)."""
        joined = None
        for prefix in self.prefixes:
            if len(prefix) <= len(base):  # (decided by the folder's name: all or none)
                if base.startswith(prefix):
                    return bool(leaves)
            elif prefix.startswith(base):  # (a leaf must start with the rest)
                if joined is None:
                    joined = "\0" + "\0".join(leaves)
                if "\0" + prefix[len(base) :] in joined:
                    return True
        return any(name.startswith(base) and name[len(base) :] in leaves for name in self.names)


def _any_left_out(
    leave_out: list[Callable[[str], bool] | Filters], base: str, leaves: list[str]
) -> tuple[bool, list[str]]:
    """Does one of ``leave_out`` (the exclude, the filters) leave out one of a folder's
    files (``base`` + each of ``leaves``)?  With the names it made for the tests that
    take whole names ([] when none did: a ``LeftOut`` asks the leaves)."""
    names: list[str] = []
    for test in leave_out:
        if type(test) is LeftOut:
            if test.any_in(base, leaves):
                return True, names
            continue
        if not names:
            names = list(map(add, repeat(base), leaves))  # (not base.__add__: a slot wrapper)
        if test.any_file_excluded(names) if isinstance(test, Filters) else any(map(test, names)):
            return True, names
    return False, names


_NAME = attrgetter("name")
_LSTAT = methodcaller("stat", follow_symlinks=False)
#: ``DirEntry.stat()`` of an entry that is not a link: its ``lstat`` (the same object,
#: kept by the entry), for a link what it leads to (never asked for one: ``_IS_LINK``).
_DIR_ENTRY_STAT = os.DirEntry.stat
#: (The method itself, as ``_DIR_ENTRY_STAT``: a ``methodcaller`` looks it up for every
#: entry, ~50 ns more; 100,000 entries ~6 -> ~1.3 ms CPU.)
_IS_LINK = os.DirEntry.is_symlink
# An ``lstat``'s fields by their place in the ``stat_result`` sequence where they have one
# (a tuple's item: ~10 ns less than the attribute, 3 fields of every file a refresh tests);
# ``st_mtime_ns`` is an attribute only.
_MODE = itemgetter(stat.ST_MODE)
_INODE = itemgetter(stat.ST_INO)
_SIZE = itemgetter(stat.ST_SIZE)
_MTIME = attrgetter("st_mtime_ns")
#: Entries of one folder a refresh sorts and compares with the index's rows at once
#: (``_unchanged_files``); a longer folder is read and tested name by name (its
#: ``DirEntry`` objects are not all kept: ~150 octets each).
_FOLDER_AT_ONCE = 10_000


def _in_name_order(listing: Iterator[os.DirEntry[str]]) -> Iterable[os.DirEntry[str]]:
    """A folder's ``scandir`` as a list in name order (a refresh meets the index's rows in
    their order), or as it comes when it is longer than ``_FOLDER_AT_ONCE``."""
    first = list(itertools.islice(listing, _FOLDER_AT_ONCE))
    if len(first) == _FOLDER_AT_ONCE:  # a long folder: as it comes
        return itertools.chain(first, listing)
    first.sort(key=_NAME)
    return first


def _unchanged_files(
    entries: _Entries,
    base: str,
    first: list[os.DirEntry[str]],
    leave_out: list[Callable[[str], bool] | Filters],
    retry: set[str],
) -> tuple[list[str], list[os.DirEntry[str]]]:
    """A folder's files the index holds unchanged, tested at once: (their names as the
    index holds them, the entries left to test one by one, in name order).

    ``base`` is the folder's name and '/' ('' for the root), ``first`` its entries
    (``_in_name_order``).  When its regular files are exactly a run of the index's
    rows, alive and with the same ``lstat`` values, none left out (a name one of
    ``leave_out`` says True of: the exclude, the filters) nor waiting to be read again
    (``retry``), they are all hits; what else the folder holds (folders, links) is
    left.  Otherwise (a file changed, added or gone; a name that is not ASCII; an
    ``lstat`` that fails) nothing is taken here: the caller's test of each name
    decides, as before this shortcut (it finds the rows it needs by the hint of the
    last one, in name order).
    """
    leaves = list(map(_NAME, first))
    if not first or not "".join(leaves).isascii():
        return [], first
    try:  # (each lstat kept by its DirEntry for the caller's test)
        if any(map(_IS_LINK, first)):
            stats = list(map(_LSTAT, first))
        else:  # no link: stat() is the lstat, called without a keyword (~0.3 us less)
            stats = list(map(_DIR_ENTRY_STAT, first))
    except OSError:
        return [], first
    regular = list(map(S_ISREG, map(_MODE, stats)))
    others: list[os.DirEntry[str]] = []
    if not all(regular):
        leaves = list(compress(leaves, regular))
        stats = list(compress(stats, regular))
        others = list(itertools.filterfalse(_is_regular, first))
        if not leaves:
            return [], first
    left_out, names = _any_left_out(leave_out, base, leaves)
    if left_out or (retry and not retry.isdisjoint(names or map(add, repeat(base), leaves))):
        return [], first
    held = entries.same_rows(base, leaves, stats)
    return ([], first) if held is None else (held, others)


def _is_regular(entry: os.DirEntry[str]) -> bool:
    return S_ISREG(entry.stat(follow_symlinks=False).st_mode)


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC passes while thousands of acyclic entries are made (~20% faster)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class NotRegularFile(FileNotFoundError):
    """What was opened is not a regular file (it was swapped for a folder, FIFO, ...)."""


# O_NONBLOCK: a name swapped for a FIFO after its lstat must not block the opener
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)


def _digest(open_file: Callable[[], int], what: object) -> tuple[str, os.stat_result]:
    import hashlib  # deferred: OpenSSL's ~3 ms start-up, which a no-change sync never needs

    for _attempt in range(_HASH_RETRIES):
        with os.fdopen(open_file(), "rb") as f:
            before = os.fstat(f.fileno())
            if not stat.S_ISREG(before.st_mode):
                raise NotRegularFile(f"{what}: not a regular file")
            digest = hashlib.file_digest(f, "sha1").hexdigest()
            after = os.fstat(f.fileno())
        if _key(before) == _key(after):
            return digest, after
    raise OSError(f"{what}: kept changing while it was hashed")


def sha1_file(path: str | os.PathLike[str]) -> tuple[str, os.stat_result]:
    """Hex SHA-1 of a regular file (links not followed) and its stat during hashing.

    Retries when the file changes while it is read; raises OSError when it
    cannot be read or never stays still (``NotRegularFile`` when it is not a
    regular file).
    """
    flags = _READ_FLAGS | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return _digest(lambda: os.open(path, flags), path)


def sha1_beneath(root: str | os.PathLike[str], name: str) -> tuple[str, os.stat_result]:
    """``sha1_file`` of relative ``name`` under ``root``, reached without following links.

    Raises ``FileNotFoundError`` (or its ``NotRegularFile``) and ``UnsafePathError`` when
    ``name`` is not a regular file reached that way; any other ``OSError`` when it is one
    but cannot be read.
    """
    parts = local_parts(name)
    return _digest(lambda: open_beneath(root, parts, _READ_FLAGS), name)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_listing(root: str, root_fd: int, rel: str) -> tuple[Any, int]:
    """``os.scandir`` of folder ``rel`` under ``root``, and a descriptor to close (or -1).

    Through descriptors: each entry's ``lstat`` then looks up one name instead of
    the whole path (~20% faster for 10,000 files), and the folder is reached
    through ``open_beneath`` (no symbolic link followed on the way).
    """
    if not rel:
        return os.scandir(root_fd), -1  # (scandir works on its own copy of the descriptor)
    fd = open_beneath(root_fd, rel.split("/"), _DIR_FLAGS)
    try:
        return os.scandir(fd), fd
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def _closing_fd(fd: int) -> Iterator[None]:
    try:
        yield
    finally:
        if fd >= 0:
            os.close(fd)


_entry = tuple.__new__  # FileEntry from a checked row, without a Python-level __new__


def _check_rows(rows: Any, path: str | os.PathLike[str], width: int = 6) -> None:
    """Raise IndexFormatError unless every row is [str, int, int, int, 40-char str, int]
    (without the last int when ``width`` is 5: version 1).

    Column by column with C-level passes (about 10x faster than a Python loop
    over 10,000 rows); a bad index is then searched for the row to report.
    """
    if type(rows) is not list:
        raise IndexFormatError(f"{path}: corrupt index")
    if not rows:
        return
    if set(map(type, rows)) == {list} and set(map(len, rows)) == {width}:
        names, sizes, mtimes, inodes, sha1s, *modes = zip(*rows, strict=True)
        if (
            set(map(type, names)) == {str}
            and {*map(type, sizes), *map(type, mtimes), *map(type, inodes)} == {int}
            and set(map(type, sha1s)) == {str}
            and set(map(len, sha1s)) == {40}
            and all(set(map(type, column)) == {int} for column in modes)
        ):
            return
    for row in rows:
        if not (
            type(row) is list
            and len(row) == width
            and type(row[0]) is str
            and all(type(n) is int for n in row[1:4])
            and type(row[4]) is str
            and len(row[4]) == 40
            and all(type(n) is int for n in row[5:])
        ):
            raise IndexFormatError(f"{path}: malformed entry {str(row)[:80]}")
    raise IndexFormatError(f"{path}: malformed entries")  # not reached


# What no name a refresh indexes can hold, once every '/' of the names joined by NUL is
# a NUL too (each component then framed by NULs, but the first and the last): an empty
# name or component, '.' or '..' ('/./', '\0./', '/.\0' ...: one search each, not twelve)
_NOT_FROM_A_WALK = ("\0\0", "\0.\0", "\0..\0")
_BAD_FIRST = ("\0", ".\0", "..\0")
_BAD_LAST = ("\0", "\0.", "\0..")


def _check_names(names: list[Any], path: str | os.PathLike[str]) -> None:
    """Raise IndexFormatError unless every name is one a walk of the root could index.

    A tampered index could name ``../x`` or ``/etc/passwd``; a name with a
    backslash or a colon is an ordinary file name here and stays.
    """
    if not all(type(name) is str for name in names):
        raise IndexFormatError(f"{path}: malformed entries")
    if names:  # (an empty mirror's index: framing two NULs would read as an empty name)
        _check_joined("\0".join(names), len(names), path)


def _check_joined(joined: str, count: int, path: str | os.PathLike[str]) -> None:
    """``_check_names`` of ``count`` names given joined by NUL (version 3 stores them so:
    no list to walk, no join to make)."""
    parts = joined.replace("/", "\0")
    bad = (
        joined.count("\0") != count - 1
        or parts in ("", ".", "..")
        or parts.startswith(_BAD_FIRST)
        or parts.endswith(_BAD_LAST)
        or any(b in parts for b in _NOT_FROM_A_WALK)
    )
    del parts
    if not bad and not joined.isascii():
        try:
            joined.encode("utf-8")
        except UnicodeEncodeError:
            bad = True
    if bad:
        raise IndexFormatError(f"{path}: a name in the index cannot be a file under its root")


class _Entries:
    """name -> ``FileEntry`` of one index: the rows a saved index held, packed, and a
    dict of the entries set since.

    A loaded row costs its name (a ``str`` in a sorted list) and 48 octets of
    columns (size, mtime_ns, inode, mode in ``array`` columns, the SHA-1 as 20
    octets of one ``bytes``), about 130 octets for a 22-character name instead of
    ~350 as a ``FileEntry`` in a dict; an entry is made when it is asked for.
    Rows never change: setting or removing a name marks its row gone (``_alive``)
    and keeps a new entry in ``_over``.  Names are found by bisection, the row
    after the last one found tried first (look-ups in name order cost one
    comparison each).
    """

    __slots__ = (
        "_alive",
        "_hint",
        "_inodes",
        "_live",
        "_made",
        "_memo",
        "_modes",
        "_mtimes",
        "_names",
        "_over",
        "_sha1",
        "_sizes",
    )

    def __init__(self) -> None:
        self._names: list[str] = []  # sorted, unique
        self._sizes = array("q")
        self._mtimes = array("q")
        self._inodes = array("Q")
        self._modes = array("i")
        self._sha1 = b""  # 20 octets a row
        self._alive = bytearray()  # 1: the row is the name's entry; 0: replaced or removed
        self._live = 0  # rows alive
        self._over: dict[str, FileEntry] = {}  # entries set since the rows were loaded
        self._hint = -1  # the row found last
        self._made: dict[str, FileEntry] | None = None  # every entry, kept till a change
        self._memo: dict[Any, Any] = {}  # values derived from the entries, till a change

    @classmethod
    def packed(cls, names: list[str], columns: list[array[int]], sha1: bytes) -> _Entries:
        """Entries from rows in name order (``names`` sorted and unique: checked by the
        caller), ``columns`` size, mtime_ns, inode, mode."""
        table = cls()
        table._names = names
        table._sizes, table._mtimes, table._inodes, table._modes = columns
        table._sha1 = sha1
        table._alive = bytearray(b"\1") * len(names)
        table._live = len(names)
        return table

    def _row(self, name: str) -> int:
        """The alive row of ``name``, or -1."""
        if not self._live:
            return -1
        names = self._names
        row = self._hint + 1
        if not (row < len(names) and names[row] == name):
            row = bisect_left(names, name)
            if row >= len(names) or names[row] != name:
                return -1
        self._hint = row
        return row if self._alive[row] else -1

    def _entry_at(self, row: int) -> FileEntry:
        at = 20 * row
        return _entry(
            FileEntry,
            (
                self._names[row],
                self._sizes[row],
                self._mtimes[row],
                self._inodes[row],
                self._sha1[at : at + 20].hex(),
                self._modes[row],
            ),
        )

    def same(self, name: str, size: int, mtime_ns: int, inode: int, mode: int) -> str | None:
        """Does ``name`` have an entry with these values (the quick test of a refresh,
        once per file: ``_row`` written out)?  Its name as the index holds it when it
        does (a refresh lists that one, not the one it built: 100,000 unchanged files
        kept ~7 MiB of new names until the end of the refresh), else None."""
        if self._over:
            old = self._over.get(name)
            if old is not None:
                return (
                    old.name
                    if old.size == size
                    and old.mtime_ns == mtime_ns
                    and old.inode == inode
                    and old.mode == mode
                    else None
                )
        if not self._live:
            return None
        names = self._names
        row = self._hint + 1
        if row >= len(names) or names[row] != name:
            row = bisect_left(names, name)
            if row >= len(names) or names[row] != name:
                return None
        self._hint = row
        if (
            self._alive[row]
            and self._sizes[row] == size
            and self._mtimes[row] == mtime_ns
            and self._inodes[row] == inode
            and self._modes[row] == mode
        ):
            return names[row]
        return None

    @property
    def has_rows(self) -> bool:
        """Some loaded rows are still entries (``same_rows`` may find them)."""
        return self._live > 0

    def same_rows(
        self, base: str, leaves: list[str], stats: list[os.stat_result]
    ) -> list[str] | None:
        """Do the names ``base`` + each of ``leaves`` (sorted, unique: one folder's files;
        ``base`` its name and '/', '' for the root) hold exactly the loaded rows from the
        first of them on, alive and with these ``lstat`` values (size, mtime_ns, inode,
        permission bits)?  The rows' names when they do (a refresh lists those), else
        None (the caller tests the names one by one).

        The quick test of a whole folder: a bisection for its first name, then C-level
        passes (string, ``array`` and ``bytes`` comparisons) instead of Python per name.
        The names are compared joined by NUL, which no name holds: two strings made per
        folder, not a string per name (100,000 names: ~7.5 -> ~3 ms).
        """
        rows = self._names
        first = bisect_left(rows, base + leaves[0])
        end = first + len(leaves)
        held = rows[first:end]
        if (
            len(held) != len(leaves)
            or "\0".join(held) != base + ("\0" + base).join(leaves)
            or self._alive.find(0, first, end) >= 0  # (a name set since: its row is gone)
            or self._sizes[first:end] != array("q", map(_SIZE, stats))
            or self._mtimes[first:end] != array("q", map(_MTIME, stats))
            or self._inodes[first:end] != array("Q", map(_INODE, stats))
            or self._modes[first:end] != array("i", map(S_IMODE, map(_MODE, stats)))
        ):
            return None
        self._hint = end - 1
        return held

    def get(self, name: str) -> FileEntry | None:
        old = self._over.get(name)
        if old is not None:
            return old
        row = self._row(name)
        return None if row < 0 else self._entry_at(row)

    def __contains__(self, name: object) -> bool:
        return name in self._over or (type(name) is str and self._row(name) >= 0)

    def __len__(self) -> int:
        return self._live + len(self._over)

    def table(self) -> dict[str, FileEntry]:
        """A copy of name -> entry.  The entries made are kept until the next change: a
        server answering many resyncs of an unchanged tree makes them once."""
        if self._made is None:
            entries = list(self.values())
            self._made = dict(zip(map(itemgetter(0), entries), entries, strict=True))
        return dict(self._made)

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, kept under ``key`` until the entries change (a set, a removal)."""
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = make()
            return value

    def update(self, pairs: Iterable[tuple[str, FileEntry]]) -> None:
        self._made = None
        self._memo.clear()
        if not self._live:
            self._over.update(pairs)
            return
        for name, entry in pairs:
            self[name] = entry

    def __setitem__(self, name: str, entry: FileEntry) -> None:
        self._made = None
        self._memo.clear()
        self._drop_row(name)
        self._over[name] = entry

    def _drop_row(self, name: str) -> bool:
        row = self._row(name)
        if row < 0:
            return False
        self._alive[row] = 0
        self._live -= 1
        return True

    def pop(self, name: str) -> FileEntry | None:
        """Remove ``name``: its entry, or None when it had none."""
        self._made = None
        self._memo.clear()
        old = self._over.pop(name, None)
        if old is not None:
            return old
        row = self._row(name)
        if row < 0:
            return None
        self._alive[row] = 0
        self._live -= 1
        return self._entry_at(row)

    def __delitem__(self, name: str) -> None:
        self._made = None
        self._memo.clear()
        if self._over.pop(name, None) is None and not self._drop_row(name):
            raise KeyError(name)

    def _alive_now(self) -> bytes | None:
        """A copy of the rows' alive marks, or None when every row is alive."""
        return None if self._live == len(self._alive) else bytes(self._alive)

    def __iter__(self) -> Iterator[str]:
        """The names (a snapshot: the table may change while they are read)."""
        alive = self._alive_now()
        names = self._names if alive is None else compress(self._names, alive)
        return iter([*names, *self._over])

    def values(self) -> Iterator[FileEntry]:
        """The entries, made one at a time (C-level passes) from a snapshot."""
        over = list(self._over.values())
        alive = self._alive_now()
        if self._live:
            rows: Iterator[tuple[Any, ...]] = zip(
                self._names,
                self._sizes,
                self._mtimes,
                self._inodes,
                _hexes(self._sha1),
                self._modes,
                strict=True,
            )
            if alive is not None:
                rows = compress(rows, alive)
            yield from map(_entry, repeat(FileEntry), rows)
        yield from over

    def stamps(self, ordered: bool = False) -> Iterator[tuple[str, int, int]]:
        """(name, mode, mtime_ns) of every entry, from a snapshot (no entry made); in
        name order with ``ordered`` (the rows are: those set since are merged in)."""
        over = [(e.name, e.mode, e.mtime_ns) for e in self._over.values()]
        rows: Iterator[tuple[str, int, int]] = iter(())
        if self._live:
            rows = zip(self._names, self._modes, self._mtimes, strict=True)
            alive = self._alive_now()
            rows = rows if alive is None else compress(rows, alive)
        if ordered:
            yield from heapq.merge(rows, sorted(over))
            return
        yield from rows
        yield from over

    def digests(self) -> _Digests:
        """name -> SHA-1 hex now (``FileIndex.digests``)."""
        over = {name: entry.sha1 for name, entry in self._over.items()}
        return _Digests(self._names, self._sha1, self._alive_now(), self._live, over)

    def columns(self) -> tuple[list[str], list[array[int]], bytes] | None:
        """The rows as loaded (names, columns, SHA-1s) when nothing changed since."""
        if self._over or self._live != len(self._names):
            return None
        return self._names, [self._sizes, self._mtimes, self._inodes, self._modes], self._sha1


class _Digests(Mapping[str, str]):
    """name -> SHA-1 hex of an index at one moment (a resync cache), read from its rows.

    (A loaded row and an entry set since never share a name.)  A snapshot that costs a
    copy of the rows' alive marks (none while every row is) and of the entries set
    since (the rows themselves never change), not a dict of every name.
    """

    def __init__(
        self,
        names: list[str],
        sha1: bytes,
        alive: bytes | None,
        live: int,
        over: dict[str, str],
    ) -> None:
        self._names, self._sha1, self._alive, self._live, self._over = (
            names,
            sha1,
            alive,
            live,
            over,
        )

    def _row(self, name: str) -> int:
        if not self._live:
            return -1
        names = self._names
        row = bisect_left(names, name)
        if row < len(names) and names[row] == name and (self._alive is None or self._alive[row]):
            return row
        return -1

    def __getitem__(self, name: str) -> str:
        found = self._over.get(name)
        if found is not None:
            return found
        row = self._row(name) if type(name) is str else -1
        if row < 0:
            raise KeyError(name)
        return self._sha1[20 * row : 20 * row + 20].hex()

    def __iter__(self) -> Iterator[str]:
        if self._live:
            names = self._names
            yield from names if self._alive is None else compress(names, self._alive)
        yield from self._over

    def __len__(self) -> int:
        return self._live + len(self._over)

    def items(self) -> _DigestItems:
        return _DigestItems(self)

    def pairs(self) -> Iterator[tuple[str, str]]:
        """(name, SHA-1 hex) in row order, made at C level."""
        if self._live:
            pairs: Iterator[tuple[str, str]] = zip(self._names, _hexes(self._sha1), strict=True)
            yield from pairs if self._alive is None else compress(pairs, self._alive)
        yield from self._over.items()

    def ordered_pairs(self) -> Iterator[tuple[str, str]]:
        """``pairs`` in name order, one at a time (the rows are in order; the entries set
        since are sorted and merged in): no list of every pair."""
        rows: Iterator[tuple[str, str]] = iter(())
        if self._live:
            rows = zip(self._names, _hexes(self._sha1), strict=True)
            rows = rows if self._alive is None else compress(rows, self._alive)
        return heapq.merge(rows, sorted(self._over.items()))


def _hexes(sha1: bytes) -> Iterator[str]:
    """The hex SHA-1s of 20-octet rows, one at a time."""
    return map(bytes.hex, map(itemgetter(0), iter_unpack("20s", sha1)))


class _DigestItems(ItemsView[str, str]):
    """``_Digests.items()``: (name, SHA-1) pairs read in row order, no look-up each."""

    _mapping: _Digests

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return self._mapping.pairs()


class FileIndex:
    """Index of the regular files under ``root`` (not thread-safe; one owner)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        exclude: Callable[[str], bool] | None = None,
        filters: Filters | None = None,
        tree: bool = False,
    ):
        self.root = Path(root)
        self._exclude = exclude
        self._filters = filters if filters else None
        #: Folders and links are listed too (``nodes()``).
        self.tree = tree
        self._entries = _Entries()
        self._nodes: dict[str, Node] = {}
        self._unreadable: dict[str, str] = {}  # file name -> why it cannot be read
        self._unlisted: dict[str, str] = {}  # folder name ("" the root) -> why
        self._logged: dict[str, str] = {}  # marks a refresh dropped (not logged again)
        #: Files and bytes hashed so far (tests and logs use these).
        self.hashed_files = 0
        self.hashed_bytes = 0
        #: True when entries changed since the index was created, loaded or saved.
        self.dirty = False
        #: Read from a saved file by ``load`` (not made anew).
        self.loaded = False

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[FileEntry]:
        """The entries as they are now (made one at a time: the index may change meanwhile)."""
        return self._entries.values()

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> FileEntry | None:
        return self._entries.get(name)

    def names(self) -> list[str]:
        """The names of the entries now (no entry made)."""
        return list(self._entries)

    def entries(self) -> dict[str, FileEntry]:
        """A snapshot copy of name -> entry."""
        return self._entries.table()

    def nodes(self) -> dict[str, Node]:
        """A snapshot copy of name -> folder or link (``tree=True``)."""
        return dict(self._nodes)

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def lookup(self, name: str) -> FileEntry | Node | None:
        """What the index has at ``name``: a file entry, a folder or link, or None."""
        return self._entries.get(name) or self._nodes.get(name)

    def excluded(self, name: str, is_dir: bool = False) -> bool:
        """Is ``name`` (or a folder above it) left out by ``exclude`` or ``filters``?"""
        if self._exclude is not None and self._exclude(name):
            return True
        return self._filters is not None and self._filters.excluded_path(name, is_dir)

    def digests(self) -> Mapping[str, str]:
        """name -> SHA-1 hex of every entry now (a resync cache): a snapshot that reads
        the loaded rows instead of holding a string for each."""
        return self._entries.digests()

    def ordered_digests(self) -> Iterator[tuple[str, str]]:
        """(name, SHA-1 hex) of every entry now, in name order, made one at a time."""
        return self._entries.digests().ordered_pairs()

    def stamps(self, ordered: bool = False) -> Iterator[tuple[str, int, int]]:
        """(name, mode, mtime_ns) of every entry now, made without the entries (what a
        mirror tells its server besides contents); in name order with ``ordered``."""
        return self._entries.stamps(ordered)

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """A value derived from the file entries (``make()``), made once and kept under
        ``key`` until an entry is set or removed (folders and links are not covered: a
        value that depends on them must not be kept here)."""
        return self._entries.memo(key, make)

    # -- what cannot be read ------------------------------------------------

    def unreadable(self) -> dict[str, str]:
        """Files that exist but cannot be read, and folders that cannot be listed
        (their names end in '/'; the root is '/'), with the reason."""
        out = dict(self._unreadable)
        out.update((f"{name}/" if name else "/", why) for name, why in self._unlisted.items())
        return out

    def held(self, name: str) -> bool:
        """Is ``name`` (or a folder above it) there but unreadable?  Never delete its copies."""
        if not self._unlisted:
            return name in self._unreadable
        if name in self._unreadable or "" in self._unlisted:
            return True
        parts = name.split("/")
        return any("/".join(parts[:i]) in self._unlisted for i in range(1, len(parts)))

    def _cannot_read(self, name: str, exc: OSError) -> None:
        why = exc.strerror or str(exc)
        if self._unreadable.get(name, self._logged.get(name)) != why:
            log.error("%s: cannot read %r (%s): kept, not deleted", self.root, name, why)
        self._unreadable[name] = why

    def _cannot_list(self, folder: str, exc: OSError) -> None:
        why = exc.strerror or str(exc)
        if self._unlisted.get(folder, self._logged.get(folder)) != why:
            log.error(
                "%s: cannot list %r (%s): what it holds is kept, not deleted",
                self.root,
                folder or "/",
                why,
            )
        self._unlisted[folder] = why

    @contextlib.contextmanager
    def _logging_anew(self) -> Iterator[None]:
        try:
            yield
        finally:
            self._logged.clear()

    def _readable_again(self, name: str) -> None:
        if self._unreadable.pop(name, None) is not None:
            log.info("%s: %r is readable again", self.root, name)

    # -- building ---------------------------------------------------------

    def _hash(self, name: str, st: os.stat_result, rehash: bool = False) -> FileEntry | None:
        """The entry of ``name`` now: None when it is gone (or never readable: see held()).

        A file that cannot be read keeps its last entry and is marked unreadable.
        """
        old = self._entries.get(name)
        if old is not None and old.key == _key(st) and not rehash:
            mode = st.st_mode & _PERMS
            return old if old.mode == mode else old._replace(mode=mode)
        try:
            digest, st = sha1_beneath(self.root, name)
        except OSError as exc:
            if absent(exc):
                self._unreadable.pop(name, None)
                return None
            self._cannot_read(name, exc)
            return old
        except UnsafePathError:
            self._unreadable.pop(name, None)
            return None
        if self._unreadable:
            self._readable_again(name)
        self.hashed_files += 1
        self.hashed_bytes += st.st_size
        mode = st.st_mode & _PERMS
        if old is not None and old.key == _key(st) and old.sha1 == digest and old.mode == mode:
            return old  # re-read on request, same version after all
        return FileEntry(name, st.st_size, st.st_mtime_ns, st.st_ino, digest, mode)

    def _forget_marks(self, subdir: str) -> set[str]:
        """Drop the unreadable marks under ``subdir`` (the walk sets them again).

        Returns the files that were marked: the walk reads them again even when
        their key did not change, and does not log them again if still unreadable.
        """
        prefix = subdir + "/" if subdir else ""
        files = {n: why for n, why in self._unreadable.items() if n.startswith(prefix)}
        for name in files:
            del self._unreadable[name]
        for folder in [
            f for f in self._unlisted if not subdir or f == subdir or f.startswith(prefix)
        ]:
            self._logged[folder] = self._unlisted.pop(folder)
        self._logged.update(files)
        return set(files)

    def refresh(self, subdir: str = "") -> IndexDelta:
        """Re-stat the files under ``subdir`` ('' for all); hash only changed versions.

        One tight loop (it runs on every ``filemq sync`` start): a file whose
        ``(size, mtime_ns, inode)`` matches its entry costs one ``lstat``.  A
        ``subdir`` that is not a plain relative name, or is reached through a
        link, holds nothing.
        """
        subdir = subdir.strip("/")
        if subdir:
            try:
                local_parts(subdir)
            except UnsafePathError as exc:
                log.warning("index %s: refresh of %r refused: %s", self.root, subdir, exc)
                return IndexDelta((), ())
        entries = self._entries
        same = entries.same
        nodes = self._nodes
        tree = self.tree
        exclude = self._exclude
        filters = self._filters
        root = os.fspath(self.root)
        seen: set[str] = set()  # names found, but those unchanged (listed in hits)
        hits: list[str] = []  # unchanged files (each name listed once: one visit each)
        seen_nodes: set[str] = set()
        changed: list[FileEntry] = []
        changed_nodes: list[Node] = []
        retry = self._forget_marks(subdir)  # unreadable last time: read again
        leave_out: list[Callable[[str], bool] | Filters] = [] if exclude is None else [exclude]
        if filters is not None:  # (what leaves a file out)
            leave_out.append(filters)
        stack = [subdir]
        if subdir and tree:  # the folder itself (a walk lists what is inside it only)
            self._update_node_of(subdir, changed_nodes, seen_nodes)
        if subdir and self.excluded(subdir, True):
            stack = []  # left out whole: what the index has below it goes
        try:
            root_fd = os.open(root, _DIR_FLAGS)
        except OSError as exc:
            if not absent(exc):  # there, but cannot be opened: hold everything
                self._cannot_list("", exc)
                self._logged.clear()
                return IndexDelta((), ())
            root_fd = -1
            stack = []
        with _gc_paused(), _closing_fd(root_fd), self._logging_anew():
            while stack:
                current = stack.pop()
                base = current + "/" if current else ""
                try:
                    it, fd = _open_listing(root, root_fd, current)
                except (OSError, UnsafePathError) as exc:
                    if not absent(exc):  # cannot list it: what it holds stays
                        assert isinstance(exc, OSError)
                        self._cannot_list(current, exc)
                        seen.update(n for n in entries if n.startswith(base))
                        seen_nodes.update(n for n in nodes if n.startswith(base))
                    continue
                with _closing_fd(fd), it:
                    listing = _in_name_order(it)
                    if entries.has_rows and type(listing) is list:
                        unchanged, listing = _unchanged_files(
                            entries, base, listing, leave_out, retry
                        )
                        hits.extend(unchanged)
                    for d in listing:
                        name = base + d.name
                        if not d.name.isascii():
                            try:
                                name.encode("utf-8")
                            except UnicodeEncodeError:
                                log.warning("index %s: skipping non-UTF-8 name %r", root, name)
                                continue
                        if exclude is not None and exclude(name):
                            continue
                        if filters is not None and filters.excluded(
                            name, d.is_dir(follow_symlinks=False)
                        ):
                            continue
                        try:
                            st = d.stat(follow_symlinks=False)
                        except OSError as exc:
                            if not absent(exc) and name in entries:  # there, cannot stat it
                                self._cannot_read(name, exc)
                                seen.add(name)
                            continue
                        if not S_ISREG(st.st_mode):
                            if S_ISDIR(st.st_mode):
                                stack.append(name)
                            if tree and (S_ISDIR(st.st_mode) or S_ISLNK(st.st_mode)):
                                node = self._node_now(name, st, fd if fd >= 0 else root_fd)
                                if node is not None:
                                    seen_nodes.add(name)
                                    if nodes.get(name) is not node:
                                        nodes[name] = node
                                        changed_nodes.append(node)
                                        self.dirty = True
                            continue  # devices, sockets are never indexed
                        held = same(
                            name, st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode & _PERMS
                        )
                        if held is not None and (not retry or name not in retry):
                            hits.append(held)  # (cheaper than a set: most names land here)
                            continue
                        old = entries.get(name)
                        entry = self._hash(name, st, rehash=name in retry)
                        if entry is None:
                            if name in self._unreadable:
                                seen.add(name)  # never read: nothing to keep, nothing removed
                            continue
                        seen.add(name)
                        if entry != old:
                            entries[name] = entry
                            changed.append(entry)
                            self.dirty = True
        prefix = subdir + "/" if subdir else ""
        disjoint = not seen or seen.isdisjoint(hits)  # (they are: a safety belt)
        if not subdir and disjoint and len(seen) + len(hits) == len(entries):
            removed: list[str] = []  # every entry was seen (the common case: a quick check)
        else:
            seen.update(hits)
            removed = [n for n in entries if n.startswith(prefix) and n not in seen]
        for name in removed:
            del entries[name]
        removed_nodes: list[str] = []
        if nodes and not (not subdir and len(seen_nodes) == len(nodes)):
            removed_nodes = [
                n for n in nodes if (n.startswith(prefix) or n == subdir) and n not in seen_nodes
            ]
            for name in removed_nodes:
                del nodes[name]
        self.dirty = self.dirty or bool(removed) or bool(removed_nodes)
        return IndexDelta(
            tuple(changed),
            tuple(sorted(removed)),
            tuple(changed_nodes),
            tuple(sorted(removed_nodes)),
        )

    def _node_now(self, name: str, st: os.stat_result, dir_fd: int) -> Node | None:
        """The node of folder or link ``name`` (``st`` its lstat, ``dir_fd`` its folder):
        the one the index has when nothing changed; None when the link cannot be read."""
        old = self._nodes.get(name)
        if S_ISDIR(st.st_mode):
            mode = st.st_mode & _PERMS
            if old is not None and old.kind == NODE_DIR and old.mode == mode:
                return old
            return Node(name, NODE_DIR, mode)
        if (
            old is not None
            and old.kind == NODE_SYMLINK
            and (old.mtime_ns, old.inode) == (st.st_mtime_ns, st.st_ino)
        ):
            return old
        try:
            if dir_fd >= 0:
                target = os.readlink(name.rpartition("/")[2], dir_fd=dir_fd)
            else:
                target = readlink_beneath(self.root, local_parts(name))
        except (OSError, UnsafePathError):
            return None
        return Node(name, NODE_SYMLINK, 0, target, st.st_mtime_ns, st.st_ino)

    def _update_node_of(self, name: str, changed: list[Node], seen: set[str]) -> None:
        """Look at folder or link ``name`` alone (its own entry, not what is inside)."""
        try:
            st = lstat_beneath(self.root, local_parts(name))
        except (OSError, UnsafePathError):
            return
        if not (S_ISDIR(st.st_mode) or S_ISLNK(st.st_mode)) or self.excluded(
            name, S_ISDIR(st.st_mode)
        ):
            return
        node = self._node_now(name, st, -1)
        if node is None:
            return
        seen.add(name)
        if self._nodes.get(name) is not node:
            self._nodes[name] = node
            changed.append(node)
            self.dirty = True

    def update(self, name: str, *, rehash: bool = False) -> FileEntry | None:
        """Re-stat one file: its (possibly new) entry, or None when it is gone.

        With ``rehash`` the content is read again even when ``(size, mtime_ns,
        inode)`` did not change (a watcher saw a write: two same-size writes
        within one mtime tick keep the key); the old entry is returned when the
        SHA-1 is the same.  A name that is not a plain relative name, is
        excluded, or is reached through a symbolic link is never indexed.  A
        file that cannot be read keeps its entry (see ``held``).  With ``tree``
        a folder or link at ``name`` updates its node (``lookup`` tells).
        """
        try:
            parts = local_parts(name)
        except UnsafePathError:
            self.forget(name)
            return None
        if self._exclude is not None and self._exclude(name):
            self.forget(name)
            return None
        try:
            st: os.stat_result | None = lstat_beneath(self.root, parts)
        except UnsafePathError:
            st = None
        except OSError as exc:
            if not absent(exc):
                self._cannot_read(name, exc)
                return self._entries.get(name)
            st = None
        if (
            st is not None
            and self._filters is not None
            and self._filters.excluded_path(name, S_ISDIR(st.st_mode))
        ):
            st = None
        if st is not None and self.tree and (S_ISDIR(st.st_mode) or S_ISLNK(st.st_mode)):
            self._unreadable.pop(name, None)
            self._forget_file(name)
            node = self._node_now(name, st, -1)
            if node is None:
                self._forget_node(name)
            elif self._nodes.get(name) is not node:
                self._nodes[name] = node
                self.dirty = True
            return None
        self._forget_node(name)
        if st is None or not stat.S_ISREG(st.st_mode):
            entry = None
            self._unreadable.pop(name, None)
        else:
            entry = self._hash(name, st, rehash)
        if entry is None:
            if name not in self._unreadable:
                self._forget_file(name)
        elif self._entries.get(name) != entry:
            self._entries[name] = entry
            self.dirty = True
        return entry

    def mark_unreadable(self, name: str, exc: OSError) -> None:
        """``name`` exists but could not be read just now (its entry is kept)."""
        self._cannot_read(name, exc)

    def record(self, entry: FileEntry) -> None:
        """Store an entry whose SHA-1 is already known (a file the caller just wrote)."""
        self._nodes.pop(entry.name, None)
        self._entries[entry.name] = entry
        self.dirty = True

    def record_node(self, node: Node) -> None:
        """Store a folder or link the caller just made."""
        self._entries.pop(node.name)
        self._nodes[node.name] = node
        self.dirty = True

    def forget(self, name: str) -> None:
        """Drop whatever the index has at ``name`` (file, folder or link)."""
        self._forget_file(name)
        self._forget_node(name)

    def _forget_file(self, name: str) -> None:
        if self._entries.pop(name) is not None:
            self.dirty = True

    def _forget_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self.dirty = True

    # -- persistence ------------------------------------------------------

    def save(self, path: str | os.PathLike[str], *, version: int = FORMAT_VERSION) -> None:
        """Write the index atomically to ``path`` (format 3; ``version=2``: the JSON
        lines an older zerohub reads)."""
        if version not in (2, 3):
            raise ValueError(f"cannot write index version {version}")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        _remove_dead_saves(target)
        entries, nodes = self._entries, self._nodes
        node_text = "".join(
            json.dumps(_node_row(nodes[name]), ensure_ascii=False) + "\n" for name in sorted(nodes)
        ).encode("utf-8")
        header: dict[str, Any] = {
            "format": FORMAT_NAME,
            "version": version,
            "root": str(self.root.resolve()),
            "entries": len(entries),
            "nodes": len(nodes),
        }
        try:
            if version == 3:
                body = _pack_entries(entries)
                header["names"] = body[0]
                blob = b"".join(body[1])
                header["crc32"] = zlib.crc32(blob, zlib.crc32(node_text))
                with open(tmp, "wb") as fb:
                    fb.write(json.dumps(header).encode() + b"\n")
                    fb.write(node_text)
                    fb.write(blob)
            else:
                # the same text json.dumps(row, ensure_ascii=False) gives, ~5x faster (only
                # the name needs escaping; the SHA-1 is hex)
                rows = (
                    f'[{_json_string(e.name)}, {e.size}, {e.mtime_ns}, {e.inode}, "{e.sha1}", '
                    f"{e.mode}]\n"
                    for e in sorted(entries.values())
                )
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(json.dumps(header) + "\n")
                    f.write(node_text.decode("utf-8"))
                    f.writelines(rows)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk keeps no partial copy
            raise
        self.dirty = False

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        root: str | os.PathLike[str],
        *,
        exclude: Callable[[str], bool] | None = None,
        filters: Filters | None = None,
        tree: bool = False,
    ) -> FileIndex:
        """Read an index saved by ``save`` for ``root`` (raises IndexFormatError).

        Reads versions 1 and 2 too (version 1: file modes unknown until the next
        refresh); an index read from an older version is ``dirty``, so its owner
        saves it again in the current format.
        """
        index = cls(root, exclude=exclude, filters=filters, tree=tree)
        try:
            with open(path, "rb") as f:
                header, version, node_lines = _read_head(f, path, index.root)
                with _gc_paused():
                    if version >= 3:
                        index._entries = _read_entries(f, header, node_lines, path)
                    else:
                        _load_rows(index, f.read(), path, version)
                    node_rows = [json.loads(line or b"null") for line in node_lines]
                    _check_names(
                        [row[0] if type(row) is list and row else None for row in node_rows],
                        path,
                    )
                    for row in node_rows:
                        node = _row_node(row, path)
                        index._nodes[node.name] = node
        except OSError as exc:
            raise IndexFormatError(f"{path}: cannot read: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise IndexFormatError(f"{path}: corrupt index: {exc}") from None
        if len(index._entries) != header.get("entries") or len(index._nodes) != len(node_lines):
            raise IndexFormatError(f"{path}: entry count does not match the header")
        if index.dirty:
            log.info(
                "%s: index version %s read; it is saved again as version %d",
                path,
                version,
                FORMAT_VERSION,
            )
        if not tree:
            index._nodes.clear()
        index.loaded = True
        return index


# Version 3 columns after the names, in this order: typecode, octets per entry
_COLUMNS = (("q", 8), ("q", 8), ("Q", 8), ("i", 4))  # size, mtime_ns, inode, mode
_ROW_OCTETS = 8 + 8 + 8 + 4 + 20  # the columns and the SHA-1 of one entry
_SWAP = sys.byteorder != "little"
#: The octet of a native int64 that holds its sign bit (tested for every size at once).
_SIGN_OCTET = 0 if _SWAP else 7


def _column(typecode: str, values: Iterator[int] | list[int]) -> bytes:
    column = array(typecode, values)
    if _SWAP:
        column.byteswap()
    return column.tobytes()


def _remove_dead_saves(target: Path) -> None:
    """Remove the temp files of saves of ``target`` by processes that are gone (a
    ``kill -9`` mid-save leaves one as big as the index, never read: the index
    itself is replaced whole or not at all)."""
    mine = os.getpid()
    head = f".{target.name}."
    try:
        found = [n for n in os.listdir(target.parent) if n.startswith(head)]
    except OSError:
        return
    for name in found:
        pid = name[len(head) : -4] if name.endswith(".tmp") else ""
        if not (pid.isascii() and pid.isdigit()) or int(pid) == mine or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(target.parent / name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process: there)
        return True
    return True


def _pack_entries(entries: _Entries) -> tuple[int, list[bytes]]:
    """Version 3 body: (octets of the names, [names, sizes, mtimes, inodes, modes, sha1s])."""
    loaded = entries.columns()
    if loaded is not None:  # nothing changed since the load: the rows as they are
        names, columns, sha1 = loaded
        text = "\0".join(names).encode("utf-8")
        parts = [text]
        for column in columns:
            if _SWAP:
                column = array(column.typecode, column)
                column.byteswap()
            parts.append(column.tobytes())
        parts.append(sha1)
        return len(text), parts
    rows = sorted(entries.values())
    names = list(map(itemgetter(0), rows))
    text = "\0".join(names).encode("utf-8")
    parts = [text]
    for (typecode, _width), field in zip(_COLUMNS, (1, 2, 3, 5), strict=True):
        parts.append(_column(typecode, map(itemgetter(field), rows)))
    parts.append(bytes.fromhex("".join(map(itemgetter(4), rows))))
    return len(text), parts


def _read_head(f: BinaryIO, path: Any, root: Path) -> tuple[dict[str, Any], int, list[bytes]]:
    """The header (checked: format, a readable version, ``root``), its version and the
    node lines of the saved index open as ``f``; ``f`` is left at the file rows."""
    header = json.loads(f.readline())
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{path}: not a filemq index")
    version = header.get("version")
    if version not in _READABLE_VERSIONS:
        raise IndexFormatError(
            f"{path}: index version {version!r} "
            f"(this reader knows {', '.join(map(str, _READABLE_VERSIONS))})"
        )
    if header.get("root") != str(root.resolve()):
        raise IndexFormatError(f"{path}: index of {header.get('root')!r}")
    node_count = header.get("nodes", 0) if version >= 2 else 0
    if type(node_count) is not int or node_count < 0:
        raise IndexFormatError(f"{path}: corrupt header")
    return header, version, _node_lines(f, node_count, path)


def _node_lines(f: BinaryIO, count: int, path: Any) -> list[bytes]:
    """The ``count`` node lines the header announces, read up to the end of the file at
    most: a damaged count (the header is outside the CRC-32) is refused at the end of
    the file, never turned into ``count`` empty reads and a list of that length (a
    count of 10**9 was minutes of reads and ~8 GiB before any check)."""
    lines = list(itertools.islice(f, count))  # (a C-level loop; ends at the end of the file)
    if len(lines) < count:
        raise IndexFormatError(f"{path}: corrupt index (fewer node lines than it says)")
    return lines


def _load_rows(index: FileIndex, body: bytes, path: Any, version: int) -> None:
    """The file rows of a version 1 or 2 index (JSON lines) into ``index`` (dirty)."""
    # one parse of all rows (JSON strings never hold a raw newline)
    text = body.decode("utf-8").rstrip("\n")
    rows = json.loads("[" + text.replace("\n", ",") + "]")
    del text
    _check_rows(rows, path, 6 if version >= 2 else 5)
    _check_names([row[0] for row in rows], path)
    if version < 2:
        rows = [[*row, -1] for row in rows]
    index._entries.update(
        zip(map(itemgetter(0), rows), map(_entry, repeat(FileEntry), rows), strict=True)
    )
    index.dirty = True  # saved again in the current format


#: Octets of a saved index read at a time to check its CRC-32 (nothing of it kept).
_CRC_READ = 1 << 16


def _v3_layout(
    f: BinaryIO, header: dict[str, Any], node_lines: list[bytes], path: Any
) -> tuple[int, int, int]:
    """(entries, octets of the names, offset of the names) of the version 3 index open as
    ``f`` (at its rows), its length and CRC-32 checked by a pass that keeps nothing
    (a damaged file is refused before any of it is decoded); ``f`` is left at the names."""
    count, size = header.get("entries"), header.get("names")
    if type(count) is not int or type(size) is not int or count < 0 or size < 0:
        raise IndexFormatError(f"{path}: corrupt header")
    at = f.tell()
    crc = zlib.crc32(b"".join(node_lines))
    length = 0
    while piece := f.read(_CRC_READ):
        crc = zlib.crc32(piece, crc)
        length += len(piece)
    if length != size + count * _ROW_OCTETS:
        raise IndexFormatError(f"{path}: corrupt index (length)")
    if crc != header.get("crc32"):
        raise IndexFormatError(f"{path}: corrupt index (checksum)")
    f.seek(at)
    return count, size, at


def _read_column(f: BinaryIO, typecode: str, count: int) -> array[int]:
    column = array(typecode)
    column.fromfile(f, count)
    if _SWAP:
        column.byteswap()
    return column


def _read_entries(
    f: BinaryIO, header: dict[str, Any], node_lines: list[bytes], path: Any
) -> _Entries:
    """The entries of a version 3 index (IndexFormatError when it is not one): kept as
    its columns, no object made per file but its name.  Read in two passes (the CRC,
    then the parts, the names decoded before the columns are read): at most the names
    twice and the list of them are held at once, never the whole file beside them
    (100,000 files: a peak of ~15 MiB, was ~20)."""
    count, size, _at = _v3_layout(f, header, node_lines, path)
    joined = f.read(size).decode("utf-8")
    names = joined.split("\0") if count else []
    if len(names) != count or (not count and size):
        raise IndexFormatError(f"{path}: entry count does not match the header")
    if count:
        _check_joined(joined, count, path)
    del joined
    # found by bisection: the names must be in order, each once (a tampered file may not be)
    # (operator.lt: a direct comparison, half the CPU of calling the slot str.__lt__)
    if not all(map(lt, names, itertools.islice(names, 1, None))):
        raise IndexFormatError(f"{path}: names out of order")
    columns = [_read_column(f, typecode, count) for typecode, _width in _COLUMNS]
    sizes, modes = columns[0], columns[3]
    negative = not sizes.tobytes()[_SIGN_OCTET::8].isascii()  # (a sign bit set: < 0)
    if count and (negative or min(modes) < -1 or max(modes) > _PERMS):
        raise IndexFormatError(f"{path}: malformed entries")
    return _Entries.packed(names, columns, f.read(20 * count))


class SavedIndex:
    """What a mirror's first ICANHAZ says, read from its saved index (version 3) without
    loading it: names, SHA-1s, modes and mtimes read from the open file a slice of
    rows at a time, the folders and links.

    ``digests()`` (the resync cache) and ``stamps()`` / ``nodes()`` (the ATTRS text)
    make each name as they reach it: a 100,000-file cache is encoded while a slice of
    rows is held, not a loaded index's ~12.6 MiB of name objects and columns, which the
    mirror loads after the ICANHAZ has gone (peak RSS of a 100,000-file resync: see
    docs/performance.md).  ``read`` checks the file's length and CRC-32 and that its names are
    ``entries`` UTF-8 names (a damaged file is no view); their order and shape are the
    loader's to check: a caller that sent a view of a file ``FileIndex.load`` then
    refuses asks for everything again.  The file stays open (``close()``): a save
    meanwhile replaces it by a rename, and this view reads the file it checked.
    """

    __slots__ = ("_count", "_f", "_names_at", "_nodes", "_size")

    def __init__(
        self, f: BinaryIO, names_at: int, size: int, count: int, nodes: dict[str, Node]
    ) -> None:
        self._f, self._names_at, self._size, self._count = f, names_at, size, count
        self._nodes = nodes

    @classmethod
    def read(cls, path: str | os.PathLike[str], root: str | os.PathLike[str]) -> SavedIndex | None:
        """The view of the version 3 index saved at ``path`` for ``root``; None when there
        is none, it is another version or it is unusable (``FileIndex.load`` says why)."""
        try:
            f = open(path, "rb")  # noqa: SIM115 (kept open by the view: close())
        except OSError:
            return None
        try:
            header, version, node_lines = _read_head(f, path, Path(root))
            if version == 3:
                count, size, at = _v3_layout(f, header, node_lines, path)
                nodes = {}
                for line in node_lines:
                    node = _row_node(json.loads(line or b"null"), path)
                    nodes[node.name] = node
                view = cls(f, at, size, count, nodes)
                # (names counted by their separators: no string made per name)
                if sum(text.count("\0") + 1 for text in view._texts()) == count:
                    return view
        except (OSError, ValueError, TypeError, IndexFormatError):
            pass
        f.close()
        return None

    def close(self) -> None:
        self._f.close()

    def __len__(self) -> int:
        return self._count

    def _texts(self) -> Iterator[str]:
        """The saved names a slice at a time, in order: whole names joined by NUL, decoded
        (a name that is not UTF-8 raises ``UnicodeDecodeError``)."""
        fd, at, end = self._f.fileno(), self._names_at, self._names_at + self._size
        rest = b""
        while self._count and at < end:
            piece = rest + os.pread(fd, min(_NAMES_SLICE, end - at), at)
            at += len(piece) - len(rest)
            if at < end:  # (cut after the last whole name; the rest starts the next slice)
                cut = piece.rfind(b"\0")
                rest, piece = piece[cut + 1 :], piece[:cut] if cut >= 0 else b""
                if cut < 0:
                    continue
            yield piece.decode("utf-8")
        if self._count and not self._size:
            yield ""  # (one empty name: the loader refuses it)

    def _slices(self) -> Iterator[tuple[list[str], int]]:
        """(names, the row of the first) for every slice of the saved names, in order."""
        row = 0
        for text in self._texts():
            names = text.split("\0")
            yield names, row
            row += len(names)

    def _rows(self, row: int, count: int, width: int, before: int) -> bytes:
        """``count`` values of ``width`` octets from ``row`` of the column that starts
        ``before`` octets per entry past the names."""
        at = self._names_at + self._size + before * self._count + width * row
        return os.pread(self._f.fileno(), width * count, at)

    # The iterators below step through a slice's rows at C level (``chain`` over a
    # ``zip`` per slice): Python runs once per slice, not once per name (a generator's
    # ``yield from`` resumes its frame for every row: 100,000 pairs 38 -> ~10 ms).

    def names(self) -> Iterator[str]:
        """The names, in order."""
        return chain.from_iterable(map(itemgetter(0), self._slices()))

    def pairs(self) -> Iterator[tuple[str, str]]:
        """(name, SHA-1 hex) in order."""
        return chain.from_iterable(starmap(self._pairs_of, self._slices()))

    def _pairs_of(self, names: list[str], row: int) -> Iterator[tuple[str, str]]:
        return zip(names, _hexes(self._rows(row, len(names), 20, 28)), strict=True)

    def digests(self) -> Mapping[str, str]:
        """name -> SHA-1 hex (a resync cache), read from the saved rows."""
        return _SavedDigests(self)

    def stamps(self, ordered: bool = False) -> Iterator[tuple[str, int, int]]:
        """(name, mode, mtime_ns) of every file (``FileIndex.stamps``; always in order)."""
        return chain.from_iterable(starmap(zip, self.stamp_runs()))

    def stamp_runs(self) -> Iterator[tuple[list[str], array[int], array[int]]]:
        """(names, modes, mtimes_ns) of the files, a slice of rows at a time, in order:
        columns for a caller that makes text of them at C level (the ATTRS lines)."""
        for names, row in self._slices():
            modes, mtimes = array("i"), array("q")
            modes.frombytes(self._rows(row, len(names), 4, 24))
            mtimes.frombytes(self._rows(row, len(names), 8, 8))
            if _SWAP:
                modes.byteswap()
                mtimes.byteswap()
            yield names, modes, mtimes

    def nodes(self) -> dict[str, Node]:
        """The folders and links saved (``FileIndex.nodes``)."""
        return dict(self._nodes)


#: Octets of saved names read, decoded and split at a time (C-level passes).
_NAMES_SLICE = 1 << 16


class _SavedDigests(Mapping[str, str]):
    """``SavedIndex.digests()``: name -> SHA-1 hex from the saved rows.  Iterating (what
    an encoder does) reads a slice of rows at a time; a look-up reads the slices up to
    the one that holds the name (the names are in order)."""

    def __init__(self, saved: SavedIndex) -> None:
        self._saved = saved

    def __iter__(self) -> Iterator[str]:
        return self._saved.names()

    def __len__(self) -> int:
        return len(self._saved)

    def items(self) -> ItemsView[str, str]:
        return _SavedPairs(self)

    def __getitem__(self, name: str) -> str:
        if type(name) is str:
            for names, row in self._saved._slices():
                if names[-1] >= name:
                    at = bisect_left(names, name)
                    if names[at] == name:
                        return self._saved._rows(row + at, 1, 20, 28).hex()
                    break
        raise KeyError(name)


class _SavedPairs(ItemsView[str, str]):
    _mapping: _SavedDigests

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return self._mapping._saved.pairs()


def _node_row(node: Node) -> list[Any]:
    if node.kind == NODE_DIR:
        return [node.name, "d", node.mode]
    return [node.name, "l", node.target, node.mtime_ns, node.inode]


def _row_node(row: Any, path: str | os.PathLike[str]) -> Node:
    """A node from a saved row (IndexFormatError when it is not one ``_node_row`` makes)."""
    if type(row) is list and len(row) == 3 and row[1] == "d" and type(row[2]) is int:
        return Node(row[0], NODE_DIR, row[2])
    if (
        type(row) is list
        and len(row) == 5
        and row[1] == "l"
        and type(row[2]) is str
        and row[2]
        and "\0" not in row[2]
        and type(row[3]) is int
        and type(row[4]) is int
    ):
        return Node(row[0], NODE_SYMLINK, 0, row[2], row[3], row[4])
    raise IndexFormatError(f"{path}: malformed node {str(row)[:80]}")
