"""The per-root file index: relative name -> size, mtime_ns, inode, SHA-1.

One ``FileIndex`` describes the regular files under one root directory (a
published directory on the server, the DEST of a mirror on the client).  The
SHA-1 of a file is computed once per *file version*, identified by the key
``(size, mtime_ns, inode)``: ``refresh()`` stats every file and re-reads only
those whose key changed.  Symbolic links, devices and names that are not valid
UTF-8 are never indexed (a link could lead out of the root).

On-disk format (``save``/``load``), version 1 -- UTF-8 JSON lines::

    {"format": "filemq-index", "version": 1, "root": "/abs/root", "entries": N}
    ["relative/name", size, mtime_ns, inode, "sha1hex"]
    ...                                              (N lines, sorted by name)

``load`` refuses another ``format``, another ``version``, another ``root``, a
wrong count or a malformed line with ``IndexFormatError``; callers treat that
as "no index" and rebuild.  ``save`` writes a temp file beside the target and
renames it into place, so a crash never leaves a half-written index.  A newer
format gets a new version number and a reader for the old one here, behind
``load``; nothing outside this module knows the layout.  Where index files
live (server state dir, mirror cache) is ``filemq.state``'s business.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from filemq.engine import FilemqError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FileEntry",
    "FileIndex",
    "IndexDelta",
    "IndexFormatError",
    "sha1_file",
]

log = logging.getLogger(__name__)

FORMAT_NAME = "filemq-index"
FORMAT_VERSION = 1
_HASH_RETRIES = 3


class IndexFormatError(FilemqError):
    """A saved index cannot be used (wrong format, version, root, or corrupt)."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One indexed file version."""

    name: str  # relative, '/'-separated
    size: int
    mtime_ns: int
    inode: int
    sha1: str  # lowercase hex

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.mtime_ns, self.inode)


@dataclass(frozen=True, slots=True)
class IndexDelta:
    """What a refresh found: new or changed entries, and names that disappeared."""

    changed: tuple[FileEntry, ...]
    removed: tuple[str, ...]


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def sha1_file(path: str | os.PathLike[str]) -> tuple[str, os.stat_result]:
    """Hex SHA-1 of a regular file (links not followed) and its stat during hashing.

    Retries when the file changes while it is read; raises OSError when it
    cannot be read or never stays still.
    """
    for _attempt in range(_HASH_RETRIES):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as f:
            before = os.fstat(f.fileno())
            if not stat.S_ISREG(before.st_mode):
                raise OSError(f"{path}: not a regular file")
            digest = hashlib.file_digest(f, "sha1").hexdigest()
            after = os.fstat(f.fileno())
        if _key(before) == _key(after):
            return digest, after
    raise OSError(f"{path}: kept changing while it was hashed")


class FileIndex:
    """Index of the regular files under ``root`` (not thread-safe; one owner)."""

    def __init__(
        self, root: str | os.PathLike[str], *, exclude: Callable[[str], bool] | None = None
    ):
        self.root = Path(root)
        self._exclude = exclude
        self._entries: dict[str, FileEntry] = {}
        #: Files and bytes hashed so far (tests and logs use these).
        self.hashed_files = 0
        self.hashed_bytes = 0
        #: True when entries changed since the index was created, loaded or saved.
        self.dirty = False

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(list(self._entries.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> FileEntry | None:
        return self._entries.get(name)

    def entries(self) -> dict[str, FileEntry]:
        """A snapshot copy of name -> entry."""
        return dict(self._entries)

    # -- building ---------------------------------------------------------

    def _hash(self, name: str, st: os.stat_result, rehash: bool = False) -> FileEntry | None:
        old = self._entries.get(name)
        if old is not None and old.key == _key(st) and not rehash:
            return old
        try:
            digest, st = sha1_file(self.root / name)
        except OSError as exc:
            log.warning("index %s: cannot hash %r: %s", self.root, name, exc)
            return None
        self.hashed_files += 1
        self.hashed_bytes += st.st_size
        if old is not None and old.key == _key(st) and old.sha1 == digest:
            return old  # re-read on request, same version after all
        return FileEntry(name, st.st_size, st.st_mtime_ns, st.st_ino, digest)

    def _walk(self, rel: str) -> Iterator[tuple[str, os.stat_result]]:
        stack = [rel]
        while stack:
            current = stack.pop()
            try:
                it = os.scandir(self.root / current if current else self.root)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                log.warning("index %s: cannot list %r: %s", self.root, current, exc)
                continue
            with it:
                for d in it:
                    name = f"{current}/{d.name}" if current else d.name
                    if not d.name.isascii():
                        try:
                            name.encode("utf-8")
                        except UnicodeEncodeError:
                            log.warning("index %s: skipping non-UTF-8 name %r", self.root, name)
                            continue
                    if self._exclude is not None and self._exclude(name):
                        continue
                    try:
                        st = d.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(name)
                    elif stat.S_ISREG(st.st_mode):
                        yield name, st

    def refresh(self, subdir: str = "") -> IndexDelta:
        """Re-stat the files under ``subdir`` ('' for all); hash only changed versions."""
        subdir = subdir.strip("/")
        seen: set[str] = set()
        changed: list[FileEntry] = []
        for name, st in self._walk(subdir):
            entry = self._hash(name, st)
            if entry is None:
                continue
            seen.add(name)
            if self._entries.get(name) is not entry:  # _hash returns the old entry if unchanged
                self._entries[name] = entry
                changed.append(entry)
                self.dirty = True
        prefix = subdir + "/" if subdir else ""
        removed = [n for n in self._entries if n.startswith(prefix) and n not in seen]
        for name in removed:
            del self._entries[name]
        self.dirty = self.dirty or bool(removed)
        return IndexDelta(tuple(changed), tuple(sorted(removed)))

    def update(self, name: str, *, rehash: bool = False) -> FileEntry | None:
        """Re-stat one file: its (possibly new) entry, or None when it is gone.

        With ``rehash`` the content is read again even when ``(size, mtime_ns,
        inode)`` did not change (a watcher saw a write: two same-size writes
        within one mtime tick keep the key); the old entry is returned when the
        SHA-1 is the same.
        """
        path = self.root / name
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            entry = None
        else:
            entry = self._hash(name, st, rehash)
        if entry is None:
            self.forget(name)
        elif self._entries.get(name) is not entry:
            self._entries[name] = entry
            self.dirty = True
        return entry

    def record(self, entry: FileEntry) -> None:
        """Store an entry whose SHA-1 is already known (a file the caller just wrote)."""
        self._entries[entry.name] = entry
        self.dirty = True

    def forget(self, name: str) -> None:
        if self._entries.pop(name, None) is not None:
            self.dirty = True

    # -- persistence ------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index (format version 1) atomically to ``path``."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "root": str(self.root.resolve()),
            "entries": len(self._entries),
        }
        dumps = json.JSONEncoder(ensure_ascii=False).encode
        rows = (
            dumps([e.name, e.size, e.mtime_ns, e.inode, e.sha1])
            for e in (self._entries[n] for n in sorted(self._entries))
        )
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
            f.writelines(row + "\n" for row in rows)
        os.replace(tmp, target)
        self.dirty = False

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        root: str | os.PathLike[str],
        *,
        exclude: Callable[[str], bool] | None = None,
    ) -> FileIndex:
        """Read an index saved by ``save`` for ``root`` (raises IndexFormatError)."""
        index = cls(root, exclude=exclude)
        try:
            with open(path, encoding="utf-8") as f:
                header = json.loads(f.readline())
                if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
                    raise IndexFormatError(f"{path}: not a filemq index")
                if header.get("version") != FORMAT_VERSION:
                    raise IndexFormatError(
                        f"{path}: index version {header.get('version')!r} "
                        f"(this reader knows {FORMAT_VERSION})"
                    )
                if header.get("root") != str(index.root.resolve()):
                    raise IndexFormatError(f"{path}: index of {header.get('root')!r}")
                lines = f.read().splitlines()
                rows = json.loads("[" + ",".join(lines) + "]")  # one parse: much faster
                for row in rows:
                    name, size, mtime_ns, inode, sha1 = row
                    if (
                        type(name) is not str
                        or type(size) is not int
                        or type(mtime_ns) is not int
                        or type(inode) is not int
                        or type(sha1) is not str
                        or len(sha1) != 40
                    ):
                        raise IndexFormatError(f"{path}: malformed entry {str(row)[:80]}")
                    index._entries[name] = FileEntry(name, size, mtime_ns, inode, sha1)
        except OSError as exc:
            raise IndexFormatError(f"{path}: cannot read: {exc}") from None
        except (ValueError, TypeError) as exc:
            raise IndexFormatError(f"{path}: corrupt index: {exc}") from None
        if len(index._entries) != header.get("entries"):
            raise IndexFormatError(f"{path}: entry count does not match the header")
        return index
