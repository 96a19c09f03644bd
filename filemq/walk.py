"""Listing a published directory: fast tree walks, ignore patterns, and index reconciliation.

* :func:`scan_tree` walks a root with ``os.scandir`` (iterative, one directory open at a
  time) and yields ``(relpath, os.stat_result)`` for every regular file. Symlinks are never
  followed nor reported, so nothing outside the root is ever listed; FIFOs, sockets and
  devices are skipped; names that are not valid UTF-8 (they cannot travel in a FILEMQ
  message) and names matching the ignore patterns are skipped, with their subtrees.
* :func:`stamp_tree` collects the same walk as ``{relpath: FileStamp}``.
* :func:`reconcile` diffs what a consumer knows against a fresh listing and returns the
  :class:`~filemq.changes.FileChanged` / :class:`~filemq.changes.FileDeleted` events that
  bring it up to date: what a consumer does on :class:`~filemq.changes.RescanNeeded`.

Relpaths are POSIX (``a/b/c.txt``), relative to the root, never empty, never a directory.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping

from filemq.changes import FileChanged, FileDeleted, FileStamp

logger = logging.getLogger(__name__)

DEFAULT_IGNORE: tuple[str, ...] = (".filemq-part-*", "*.fmqtmp*")
"""Temporary files of FILEMQ clients while a file downloads: ``.filemq-part-<pid>-<n>``
(``filemq.client.TEMP_PREFIX``) and ``*.fmqtmp*``."""


class PathFilter:
    """Decides which names are published: not ignored, and valid UTF-8.

    ``patterns`` are shell patterns (:mod:`fnmatch`, case-sensitive) matched against each
    component of a relpath, so an ignored directory hides everything below it.
    """

    def __init__(self, patterns: Iterable[str] = DEFAULT_IGNORE) -> None:
        self.patterns: tuple[str, ...] = tuple(patterns)
        joined = "|".join(fnmatch.translate(p) for p in self.patterns)
        self._regex = re.compile(joined) if joined else None

    def accepts_name(self, name: str) -> bool:
        if self._regex is not None and self._regex.match(name):
            return False
        return _is_utf8(name)

    def accepts(self, relpath: str) -> bool:
        if self._regex is None:
            return _is_utf8(relpath)
        return all(self.accepts_name(part) for part in relpath.split("/"))


def _is_utf8(name: str) -> bool:
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes from os.fsdecode
        return False
    return True


def check_relpath(relpath: str) -> str:
    """``relpath`` if it is a clean relative POSIX path inside a root, else ValueError."""
    if relpath == "":
        return relpath
    parts = relpath.split("/")
    if relpath.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in relpath:
        raise ValueError(f"not a clean relative path: {relpath!r}")
    return relpath


def _subtree_dir(root: str, subtree: str) -> str | None:
    """The directory for ``subtree`` if every component is a real directory (no symlink)."""
    path = root
    for part in subtree.split("/") if subtree else ():
        path = os.path.join(path, part)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path


def scan_tree(
    root: str | os.PathLike[str],
    *,
    subtree: str = "",
    ignore: PathFilter | None = None,
    missing_ok: bool = False,
) -> Iterator[tuple[str, os.stat_result]]:
    """Yield ``(relpath, lstat)`` for every regular file under ``root/subtree``.

    Relpaths are relative to ``root`` (not to ``subtree``), in no particular order.
    A missing root raises FileNotFoundError unless ``missing_ok``; a missing subtree
    (or one reached through a symlink) yields nothing. Directories that vanish or cannot be
    read during the walk are skipped (logged at debug level): the caller is racing writers
    anyway, and the publisher reports what changes after the walk.
    """
    root_s = os.fspath(root)
    filt = ignore if ignore is not None else PathFilter()
    check_relpath(subtree)
    if not os.path.isdir(root_s):
        if missing_ok:
            return
        raise FileNotFoundError(f"no such directory: {root_s}")
    if subtree and not filt.accepts(subtree):
        return
    start = _subtree_dir(root_s, subtree)
    if start is None:
        return
    stack: list[tuple[str, str]] = [(subtree, start)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            entries = os.scandir(abs_dir)
        except OSError as exc:
            logger.debug("cannot list %s: %s", abs_dir, exc)
            continue
        with entries:
            for entry in entries:
                name = entry.name
                if not filt.accepts_name(name):
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                try:
                    if entry.is_symlink():
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((rel, entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        yield rel, entry.stat(follow_symlinks=False)
                except OSError:  # vanished between readdir and stat
                    continue


def stamp_tree(
    root: str | os.PathLike[str],
    *,
    subtree: str = "",
    ignore: PathFilter | None = None,
    missing_ok: bool = True,
) -> dict[str, FileStamp]:
    """``{relpath: FileStamp}`` for :func:`scan_tree` (a missing root is empty here)."""
    return {
        rel: FileStamp.from_stat(st)
        for rel, st in scan_tree(root, subtree=subtree, ignore=ignore, missing_ok=missing_ok)
    }


def reconcile(
    mount: str,
    known: Mapping[str, FileStamp | None],
    current: Mapping[str, FileStamp],
    *,
    subtree: str = "",
) -> list[FileChanged | FileDeleted]:
    """Events turning ``known`` into ``current`` within ``subtree`` ("" is everything).

    ``known`` maps relpaths to the stamp last seen (``None``: unknown, always re-announced);
    ``current`` is a fresh :func:`stamp_tree` of the same subtree. Deletions come first.
    """
    prefix = subtree + "/"

    def inside(rel: str) -> bool:
        return not subtree or rel == subtree or rel.startswith(prefix)

    out: list[FileChanged | FileDeleted] = [
        FileDeleted(mount, rel) for rel in known if rel not in current and inside(rel)
    ]
    for rel, stamp in current.items():
        if inside(rel) and (rel not in known or known[rel] != stamp):
            out.append(FileChanged(mount, rel, stamp))
    return out
