"""FILEMQ manifests: every file of a tree with its SHA-1 and xxh3, as a Parquet table.

A manifest has one row per regular file under a root, sorted by path::

    path      string  relative, '/'-separated (the names a FileIndex holds)
    size      int64   octets
    mtime_ns  int64   modification time, nanoseconds since the epoch
    sha1      string  40 hex digits (what FILEMQ sends and checks)
    xxh3      string  16 hex digits, xxh3-64 (a change check ~12x faster than SHA-1)

The walk is ``filemq.walk.scan_tree``'s, with the policy of ``filemq.index.FileIndex``
(what a server indexes): no symbolic link is followed or listed, names that are not
UTF-8 are left out.  A file that changes while
it is hashed is read again (up to ``_HASH_RETRIES`` times); one that cannot be read is
left out of the manifest and counted (``ManifestStats.unreadable``).

Made here in one process (:func:`build`), or on Spark by ``filemq.manifest_spark``, which
lists and hashes the tree in parallel with the same functions (:func:`split_tree` gives
the driver a list of subtrees, :func:`rows_of` is what each task runs).

Uses of a manifest:

* :func:`import_index`: the index a FILEMQ server (or a mirror) loads at start-up, so it
  does not hash the tree again.  A row is trusted only for the file it describes: the
  file at that path must still be a regular file of the same size and mtime_ns; its
  inode and mode come from ``lstat`` now.  Rows that no longer match are left out (the
  server hashes those files at start-up as usual).
* :func:`diff`: what changed between two manifests (two snapshots, or a server's tree
  and a mirror's).

pyarrow (the ``spark`` extra) is needed to read or write a manifest.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from filemq.engine import FilemqError
from filemq.index import FileEntry, FileIndex
from filemq.paths import UnsafePathError, absent, local_parts, lstat_beneath, open_beneath
from filemq.walk import PathFilter, scan_tree

__all__ = [
    "COLUMNS",
    "Change",
    "ImportResult",
    "ManifestError",
    "ManifestRow",
    "ManifestStats",
    "build",
    "diff",
    "hash_file",
    "import_index",
    "read",
    "rows_of",
    "split_tree",
    "table_of",
    "write",
]

#: The manifest's columns, in order.
COLUMNS = ("path", "size", "mtime_ns", "sha1", "xxh3")
_READ_BUFFER = 1 << 20  # octets read at a time while hashing (1 MiB)
_HASH_RETRIES = 3  # a file that keeps changing while it is hashed is left out after this
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


#: What the walk keeps: every UTF-8 name (an index's policy; no ignore patterns)
_EVERY_UTF8_NAME = PathFilter(())


class ManifestError(FilemqError):
    """A manifest cannot be made, read or used (the message says why)."""


@dataclass(frozen=True, slots=True)
class ManifestRow:
    path: str
    size: int
    mtime_ns: int
    sha1: str
    xxh3: str


@dataclass(frozen=True, slots=True)
class ManifestStats:
    """What a manifest job did: files in the manifest, their octets, files left out."""

    files: int
    octets: int
    unreadable: int


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ManifestError("manifests need pyarrow: pip install 'zerohub[spark]'") from None
    return pyarrow, pyarrow.parquet


def _schema() -> Any:
    pa, _ = _pyarrow()
    return pa.schema(
        [
            ("path", pa.string()),
            ("size", pa.int64()),
            ("mtime_ns", pa.int64()),
            ("sha1", pa.string()),
            ("xxh3", pa.string()),
        ]
    )


# -- hashing ------------------------------------------------------------------------------


def hash_file(root: str | os.PathLike[str], path: str) -> ManifestRow:
    """The row of the regular file ``path`` under ``root`` (no link followed on the way).

    Raises ``FileNotFoundError`` when it is gone or not a regular file, ``UnsafePathError``
    when ``path`` is not a plain relative name or is reached through a link, and any other
    ``OSError`` when it cannot be read or never stays still while it is read.
    """
    import hashlib  # deferred: OpenSSL's start-up

    import xxhash

    parts = local_parts(path)
    buffer = bytearray(_READ_BUFFER)
    view = memoryview(buffer)
    for _attempt in range(_HASH_RETRIES):
        fd = open_beneath(root, parts, _READ_FLAGS)
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise FileNotFoundError(f"{path}: not a regular file")
            sha1, xxh3 = hashlib.sha1(), xxhash.xxh3_64()
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
                while n := f.readinto(buffer):
                    sha1.update(view[:n])
                    xxh3.update(view[:n])
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (before.st_size, before.st_mtime_ns, before.st_ino) == (
            after.st_size,
            after.st_mtime_ns,
            after.st_ino,
        ):
            return ManifestRow(
                path, after.st_size, after.st_mtime_ns, sha1.hexdigest(), xxh3.hexdigest()
            )
    raise OSError(f"{path}: kept changing while it was hashed")


def rows_of(
    root: str | os.PathLike[str], subtrees: Iterable[str] = ("",), files: Iterable[str] = ()
) -> Iterator[ManifestRow | OSError]:
    """Hash ``files`` and every file below each of ``subtrees`` (relative to ``root``).

    Yields a row per file, or the ``OSError`` of a file that could not be read (a file
    that vanished meanwhile yields nothing).  What a Spark task runs on its share.
    """
    walker = _EVERY_UTF8_NAME
    names: list[Iterable[str]] = [files]
    names.extend(
        (rel for rel, _st in scan_tree(root, subtree=sub, ignore=walker, missing_ok=True))
        for sub in subtrees
    )
    for group in names:
        for name in group:
            try:
                yield hash_file(root, name)
            except (OSError, UnsafePathError) as exc:
                if isinstance(exc, OSError) and not absent(exc):
                    yield exc


def split_tree(root: str | os.PathLike[str], want: int) -> tuple[list[str], list[str]]:
    """Cut the tree under ``root`` into at least ``want`` subtrees, if it has that many.

    Returns ``(files, subtrees)``: the files met on the levels that were opened, and the
    folders whose whole content is left to ``rows_of``.  Opens one level at a time
    (breadth first), so the driver lists a few folders and the tasks list the rest.
    """
    walker = _EVERY_UTF8_NAME
    root_s = os.fspath(root)
    if not os.path.isdir(root_s):
        raise ManifestError(f"{root_s}: not a directory")
    files: list[str] = []
    level = [""]
    while level and len(level) < want:
        below: list[str] = []
        for folder in level:
            sub_files, sub_folders = _children(root_s, folder, walker)
            files.extend(sub_files)
            below.extend(sub_folders)
        level = below
    return files, level


def _children(root: str, folder: str, walker: PathFilter) -> tuple[list[str], list[str]]:
    """The regular files and the folders directly in ``folder`` (no link followed)."""
    files: list[str] = []
    folders: list[str] = []
    try:
        fd = open_beneath(root, folder.split("/") if folder else (), _DIR_FLAGS)
    except (OSError, UnsafePathError):
        return files, folders
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not walker.accepts_name(entry.name):
                    continue
                rel = f"{folder}/{entry.name}" if folder else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(rel)
                    elif entry.is_file(follow_symlinks=False):
                        files.append(rel)
                except OSError:
                    continue
    except OSError:
        pass  # cannot list it: the tasks' walk of its parent would not either
    finally:
        os.close(fd)
    return files, folders


# -- tables -------------------------------------------------------------------------------


def table_of(rows: Sequence[ManifestRow]) -> Any:
    """A pyarrow Table of ``rows``, sorted by path."""
    pa, _ = _pyarrow()
    ordered = sorted(rows, key=lambda r: r.path)
    return pa.table(
        {
            "path": [r.path for r in ordered],
            "size": [r.size for r in ordered],
            "mtime_ns": [r.mtime_ns for r in ordered],
            "sha1": [r.sha1 for r in ordered],
            "xxh3": [r.xxh3 for r in ordered],
        },
        schema=_schema(),
    )


def build(root: str | os.PathLike[str]) -> tuple[Any, ManifestStats]:
    """The manifest of ``root``, made in this process: (pyarrow Table, stats)."""
    if not os.path.isdir(root):
        raise ManifestError(f"{os.fspath(root)}: not a directory")
    rows: list[ManifestRow] = []
    unreadable = 0
    for row in rows_of(root):
        if isinstance(row, ManifestRow):
            rows.append(row)
        else:
            unreadable += 1
    return table_of(rows), ManifestStats(len(rows), sum(r.size for r in rows), unreadable)


def write(table: Any, out: str | os.PathLike[str]) -> None:
    """Write ``table`` as one Parquet file at ``out`` (never over an existing path).

    Written beside ``out`` and renamed into place: a crash leaves no half manifest.
    """
    _, pq = _pyarrow()
    target = Path(out)
    if target.exists() or target.is_symlink():
        raise ManifestError(f"{target}: already exists")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        if target.exists():
            raise ManifestError(f"{target}: already exists")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def read(path: str | os.PathLike[str]) -> Any:
    """The manifest at ``path`` (a Parquet file, or a folder of them as Spark writes),
    as a pyarrow Table sorted by path; ManifestError when it is not a manifest."""
    pa, pq = _pyarrow()
    if not os.path.exists(path):
        raise ManifestError(f"{os.fspath(path)}: no such manifest")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ManifestError(f"{os.fspath(path)}: not a Parquet manifest ({exc})") from None
    try:
        table = table.select(list(COLUMNS)).cast(_schema())
    except (KeyError, pa.ArrowException) as exc:
        raise ManifestError(f"{os.fspath(path)}: not a manifest ({exc})") from None
    return table.sort_by("path")


def _rows(table: Any) -> Iterator[ManifestRow]:
    columns = [table.column(name).to_pylist() for name in COLUMNS]
    for values in zip(*columns, strict=True):
        yield ManifestRow(*values)


# -- import -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImportResult:
    """``imported``: rows now in the index; ``stale``: rows whose file changed or went
    away since the manifest (hashed again by the index's owner); ``refused``: rows whose
    path or SHA-1 cannot be a file of this root (a damaged or foreign manifest)."""

    imported: int
    stale: int
    refused: int


def import_index(
    manifest: str | os.PathLike[str],
    root: str | os.PathLike[str],
    index_path: str | os.PathLike[str],
) -> ImportResult:
    """Write the index of ``root`` at ``index_path`` from ``manifest`` (see the module doc).

    An existing index at ``index_path`` is replaced (atomically).
    """
    if not os.path.isdir(root):
        raise ManifestError(f"{os.fspath(root)}: not a directory")
    table = read(manifest)
    index = FileIndex(root)
    imported = stale = refused = 0
    for row in _rows(table):
        if not _plausible(row):
            refused += 1
            continue
        try:
            st = lstat_beneath(root, local_parts(row.path))
        except (OSError, UnsafePathError):
            stale += 1
            continue
        if not stat.S_ISREG(st.st_mode) or (st.st_size, st.st_mtime_ns) != (
            row.size,
            row.mtime_ns,
        ):
            stale += 1
            continue
        mode = st.st_mode & 0o7777
        index.record(FileEntry(row.path, st.st_size, st.st_mtime_ns, st.st_ino, row.sha1, mode))
        imported += 1
    index.save(index_path)
    return ImportResult(imported, stale, refused)


_HEX = frozenset("0123456789abcdef")


def _plausible(row: ManifestRow) -> bool:
    if row.path is None or row.sha1 is None or row.size is None or row.mtime_ns is None:
        return False
    if len(row.sha1) != 40 or not _HEX.issuperset(row.sha1) or row.size < 0:
        return False
    try:
        local_parts(row.path)
    except UnsafePathError:
        return False
    return True


# -- diff ---------------------------------------------------------------------------------


class Change(Enum):
    """How a path differs from manifest A to manifest B."""

    ADDED = "added"  # only in B
    REMOVED = "removed"  # only in A
    CHANGED = "changed"  # content differs (size, SHA-1 or xxh3)
    TOUCHED = "touched"  # same content, another mtime


def classify(a: ManifestRow | None, b: ManifestRow | None) -> Change | None:
    """The change from ``a`` to ``b`` (rows of one path; None: absent), None when equal."""
    if a is None:
        return Change.ADDED if b is not None else None
    if b is None:
        return Change.REMOVED
    if (a.size, a.sha1, a.xxh3) != (b.size, b.sha1, b.xxh3):
        return Change.CHANGED
    if a.mtime_ns != b.mtime_ns:
        return Change.TOUCHED
    return None


def diff(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> list[tuple[Change, str]]:
    """What differs from manifest ``a`` to manifest ``b``: (change, path), sorted by path."""
    left = {row.path: row for row in _rows(read(a))}
    right = {row.path: row for row in _rows(read(b))}
    out: list[tuple[Change, str]] = []
    for path in sorted(left.keys() | right.keys()):
        change = classify(left.get(path), right.get(path))
        if change is not None:
            out.append((change, path))
    return out
