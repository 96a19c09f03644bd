"""Listing a published directory: fast tree walks, ignore patterns, and index reconciliation.

* :func:`scan_tree` walks a root with ``os.scandir`` (iterative, one directory open at a
  time) and yields ``(relpath, os.stat_result)`` for every regular file. Symlinks are never
  followed nor reported (each folder is opened through :func:`filemq.paths.open_beneath`,
  even one swapped for a link during the walk), so nothing outside the root is ever
  listed; FIFOs, sockets and devices are skipped; names that are not valid UTF-8 (they
  cannot travel in a FILEMQ message) and names matching the ignore patterns are skipped,
  with their subtrees. What is there but cannot be listed or stat'd is reported apart
  (``unreadable``): missing from a listing is not the same as deleted.
* :func:`stamp_tree` collects the same walk as ``{relpath: FileStamp}``.
* :func:`reconcile` diffs what a consumer knows against a fresh listing and returns the
  :class:`~filemq.changes.FileChanged` / :class:`~filemq.changes.FileDeleted` events that
  bring it up to date: what a consumer does on :class:`~filemq.changes.RescanNeeded`.
  Names under ``held`` (what the walk could not read) are never reported deleted.

Relpaths are POSIX (``a/b/c.txt``), relative to the root, never empty, never a directory.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping

from filemq.changes import FileChanged, FileDeleted, FileStamp
from filemq.paths import UnsafePathError, absent, open_beneath

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)

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


def scan_tree(
    root: str | os.PathLike[str],
    *,
    subtree: str = "",
    ignore: PathFilter | None = None,
    missing_ok: bool = False,
    unreadable: set[str] | None = None,
) -> Iterator[tuple[str, os.stat_result]]:
    """Yield ``(relpath, lstat)`` for every regular file under ``root/subtree``.

    Relpaths are relative to ``root`` (not to ``subtree``), in no particular order.
    A missing root raises FileNotFoundError unless ``missing_ok``; a missing subtree
    (or one reached through a symlink) yields nothing. Directories that vanish during the
    walk are skipped: the caller is racing writers anyway, and the publisher reports what
    changes after the walk. A directory that is there but cannot be listed, or an entry
    that cannot be stat'd (permission denied, I/O error), is added to ``unreadable`` (when
    given; logged either way): its files are unknown, not gone.
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
    try:
        root_fd = os.open(root_s, _DIR_FLAGS)
    except OSError as exc:
        logger.debug("cannot open %s: %s", root_s, exc)
        return
    try:
        stack: list[str] = [subtree]
        while stack:
            rel_dir = stack.pop()
            try:
                fd = open_beneath(root_fd, rel_dir.split("/") if rel_dir else (), _DIR_FLAGS)
            except (OSError, UnsafePathError) as exc:  # gone, a link, or unreadable
                _cannot_read(root_s, rel_dir, exc, unreadable)
                continue
            try:
                try:
                    entries = os.scandir(fd)
                except OSError as exc:
                    _cannot_read(root_s, rel_dir, exc, unreadable)
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
                                stack.append(rel)
                            elif entry.is_file(follow_symlinks=False):
                                yield rel, entry.stat(follow_symlinks=False)
                        except OSError as exc:  # vanished between readdir and stat?
                            _cannot_read(root_s, rel, exc, unreadable)
                            continue
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


def _cannot_read(root: str, rel: str, exc: BaseException, unreadable: set[str] | None) -> None:
    if absent(exc):
        logger.debug("%s: %r is gone or not a plain folder: %s", root, rel, exc)
        return
    logger.warning("%s: cannot read %r: %s", root, rel or "/", exc)
    if unreadable is not None:
        unreadable.add(rel)


def stamp_tree(
    root: str | os.PathLike[str],
    *,
    subtree: str = "",
    ignore: PathFilter | None = None,
    missing_ok: bool = True,
    unreadable: set[str] | None = None,
) -> dict[str, FileStamp]:
    """``{relpath: FileStamp}`` for :func:`scan_tree` (a missing root is empty here)."""
    walk = scan_tree(
        root, subtree=subtree, ignore=ignore, missing_ok=missing_ok, unreadable=unreadable
    )
    return {rel: FileStamp.from_stat(st) for rel, st in walk}


def reconcile(
    mount: str,
    known: Mapping[str, FileStamp | None],
    current: Mapping[str, FileStamp],
    *,
    subtree: str = "",
    held: Iterable[str] = (),
) -> list[FileChanged | FileDeleted]:
    """Events turning ``known`` into ``current`` within ``subtree`` ("" is everything).

    ``known`` maps relpaths to the stamp last seen (``None``: unknown, always re-announced);
    ``current`` is a fresh :func:`stamp_tree` of the same subtree. Deletions come first;
    nothing at or under a name in ``held`` (the walk's ``unreadable``; "" is the root) is
    reported deleted.
    """
    prefix = subtree + "/"
    kept = tuple(held)

    def inside(rel: str) -> bool:
        return not subtree or rel == subtree or rel.startswith(prefix)

    def unknown(rel: str) -> bool:
        return any(not h or rel == h or rel.startswith(h + "/") for h in kept)

    out: list[FileChanged | FileDeleted] = [
        FileDeleted(mount, rel)
        for rel in known
        if rel not in current and inside(rel) and not (kept and unknown(rel))
    ]
    for rel, stamp in current.items():
        if inside(rel) and (rel not in known or known[rel] != stamp):
            out.append(FileChanged(mount, rel, stamp))
    return out
