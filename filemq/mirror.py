"""Writing received files into a mirror's DEST: temp file, verify, rename into place.

``Mirror`` is the client's file-system side (``filemq.client`` drives it).  A
file arrives as one or more CHEEZBURGER chunks; the last one carries the
``size`` and ``sha1`` headers.

* A file that fits in one chunk (the common case for many small files) goes
  through ``place()``: its size and SHA-1 are checked against the headers
  *before* anything touches the disk, then it is written to a temp file
  ``DEST/.filemq-part-<pid>-<n>``, stamped with the server's ``mtime_ns`` and
  renamed over the target: 5 system calls per file (open, write, utime,
  fstat, close) plus the rename.
* A longer file goes through ``begin()`` / ``write()`` / ``finish()``: chunks are
  written to the temp file as they come and hashed on the way; ``finish()``
  verifies and renames, or discards the temp file.
* A file of at least ``resume_min`` bytes (default 8 MiB) whose first chunk names
  its version is written to a *partial file* with a journal instead
  (``filemq.partial``): when the transfer stops (``abort()``: connection lost, the
  mirror stopped, a write failed; or the process killed) both stay, and the next
  session proves them (``resume_points()``) and offers them to the server;
  ``resume()`` takes one up where the server restarts.  The whole file is still
  verified by its SHA-1 before the rename; when that fails the partial file goes.

Either way DEST never shows a partial file, and a replaced file has exactly the
new size.  Verified files are recorded in the index with the SHA-1 just
computed (never read back).

Durability: no ``fsync``.  The rename makes a file visible only complete, but
after a power loss the most recently received files may come back empty or
missing.  The index copes: an entry is trusted only while the file's
``(size, mtime_ns, inode)`` still match, so the next resync hashes such a file
again and fetches it.  (rsync does not fsync by default either.)

Folders: a target's parent folders are checked (no symlink, no non-directory,
inside DEST) before a file is received, and created when missing.  The rename
into place and every delete then walk DEST again through ``filemq.paths`` (one
descriptor per folder, no symbolic link followed), so a folder swapped for a
link pointing out of DEST while the mirror runs is refused, not written or
deleted through; a folder removed meanwhile is made again.  Deletes also remove
the folders they empty.  A verified file whose place in DEST is held by a
directory (a local change) replaces that directory and everything under it:
DEST is a mirror (``forget_folders`` drops what was remembered when DEST
changed).

Names FILEMQ keeps in DEST all start with ``TEMP_PREFIX`` (never indexed,
published or accepted from a server): temp files ``.filemq-part-<pid>-<n>``
and the lock ``LOCK_NAME`` (``filemq.destlock``), which ``clean_temp`` keeps, and
the partial files ``PARTIAL_PREFIX...`` with their journals, which it leaves to
``filemq.partial``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from filemq.engine import HEADER_MTIME, HEADER_SHA1, HEADER_SIZE
from filemq.index import FileEntry, FileIndex
from filemq.partial import Journal, PartialStore, ResumePoint, Version
from filemq.paths import (
    UnsafePathError,
    open_dir_beneath,
    remove_beneath,
    replace_beneath,
    safe_target,
)

__all__ = ["LOCK_NAME", "PARTIAL_PREFIX", "RESUME_MIN_SIZE", "TEMP_PREFIX", "Mirror"]

log = logging.getLogger(__name__)

#: Temp files under DEST start with this; such names are never indexed or accepted.
TEMP_PREFIX = ".filemq-part-"
#: The lock file of the process mirroring into DEST (``filemq.destlock``).
LOCK_NAME = TEMP_PREFIX + "lock"
#: Resumable partial files and their journals (``filemq.partial``).
PARTIAL_PREFIX = TEMP_PREFIX + "resume-"
#: Files at least this big are received into resumable partial files.
RESUME_MIN_SIZE = 8 << 20
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _sha1(data: bytes = b"") -> Any:
    import hashlib  # deferred: OpenSSL's ~3 ms start-up, which a no-change sync never needs

    return hashlib.sha1(data)


def _verify(size: int, digest: str, headers: dict[str, str]) -> str:
    """Why a received file does not match the server's headers ('' when it does)."""
    want_size = headers.get(HEADER_SIZE)
    if want_size is not None and want_size != str(size):
        return f"size {size}, server said {want_size}"
    want_sha1 = headers.get(HEADER_SHA1)
    if want_sha1 is not None and want_sha1.lower() != digest:
        return f"SHA-1 {digest}, server said {want_sha1}"
    return ""


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # a short write (rare): finish it
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _stamp_and_close(fd: int, headers: dict[str, str]) -> os.stat_result:
    """Set the server's mtime on the open temp file, stat it and close it."""
    try:
        mtime = headers.get(HEADER_MTIME)
        if mtime is not None and mtime.isdigit():
            ns = int(mtime)
            os.utime(fd, ns=(ns, ns))
        return os.fstat(fd)
    finally:
        os.close(fd)


class Mirror:
    """Writes into DEST (``root``) and keeps its ``index`` up to date; see the module doc."""

    def __init__(self, root: Path, index: FileIndex, *, resume_min: int = RESUME_MIN_SIZE) -> None:
        self.root = root
        self.resume_min = resume_min
        self.partials = PartialStore(root, PARTIAL_PREFIX)
        self._journal: Journal | None = None  # the file being received is resumable
        self._root = str(root)
        self.index = index
        self._safe_dirs: set[tuple[str, ...]] = set()
        self._temp_base = f"{self._root}/{TEMP_PREFIX}{os.getpid()}-"
        self._counter = 0
        self._fd = -1
        self._tmp = ""
        self._target_path = ""
        self._parts: tuple[str, ...] = ()
        self._sha1: Any = None
        self._size = 0

    def clean_temp(self) -> None:
        """Remove temp files an interrupted run left in DEST (not the lock file)."""
        for entry in os.scandir(self.root):
            if (
                entry.name.startswith(TEMP_PREFIX)
                and entry.name != LOCK_NAME
                and not self.partials.owns(entry.name)
                and entry.is_file(follow_symlinks=False)
            ):
                os.unlink(entry.path)

    def forget_folders(self) -> None:
        """DEST changed under us: check every folder again before writing into it."""
        self._safe_dirs.clear()

    def target(self, parts: tuple[str, ...]) -> str:
        """Where ``parts`` goes; raises UnsafePathError when that is not a safe place.

        A directory there is no error: a verified file replaces it (see the module doc).
        """
        if parts[:-1] not in self._safe_dirs:
            return str(safe_target(self.root, parts, directory_ok=True))
        return self._root + "/" + "/".join(parts)

    def _temp_name(self) -> str:
        self._counter += 1
        return f"{self._temp_base}{self._counter}"

    def _rename_into_place(self, tmp: str, parts: tuple[str, ...], target: str) -> None:
        try:
            self._replace(tmp, parts)
        except (OSError, UnsafePathError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _replace(self, tmp: str, parts: tuple[str, ...]) -> None:
        """Rename ``tmp`` to ``parts`` under DEST (``filemq.paths.replace_beneath``)."""
        try:
            replace_beneath(tmp, self.root, parts)
        except IsADirectoryError:  # DEST holds a directory where the server has this file
            self._remove_directory(parts)
            replace_beneath(tmp, self.root, parts)
        self._safe_dirs.add(parts[:-1])

    def _remove_directory(self, parts: tuple[str, ...]) -> None:
        """Remove the directory at ``parts`` (reached through ``open_dir_beneath``; the
        removal itself follows no link: ``shutil.rmtree`` relative to that folder)."""
        if not shutil.rmtree.avoids_symlink_attacks:
            raise UnsafePathError(f"{'/'.join(parts)!r}: a directory is in the way")
        parent = open_dir_beneath(self.root, parts[:-1])
        try:
            try:
                mode = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return  # gone meanwhile: the rename decides
            if not stat.S_ISDIR(mode):
                return
            name = "/".join(parts)
            log.warning("%s: replacing the directory DEST holds there by the server's file", name)
            shutil.rmtree(parts[-1], dir_fd=parent)
        finally:
            os.close(parent)
        prefix = name + "/"
        for entry in self.index:
            if entry.name.startswith(prefix):
                self.index.forget(entry.name)
        self._safe_dirs = {d for d in self._safe_dirs if d[: len(parts)] != parts}

    # -- whole files in one message -------------------------------------------------

    def place(
        self, parts: tuple[str, ...], target: str, data: bytes, headers: dict[str, str]
    ) -> tuple[bool, str]:
        """Verify a complete file and put it at ``target`` (from ``target()``).

        Returns (verified, reason); nothing is written when it does not verify.
        Raises OSError or UnsafePathError when a verified file cannot be placed.
        """
        self.abort()
        digest = _sha1(data).hexdigest()
        reason = _verify(len(data), digest, headers)
        if reason:
            return False, reason
        tmp = self._temp_name()
        fd = os.open(tmp, _TEMP_FLAGS, 0o666)
        try:
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        try:
            st = _stamp_and_close(fd, headers)
        except BaseException:
            os.unlink(tmp)
            raise
        self._rename_into_place(tmp, parts, target)
        self.index.record(
            FileEntry("/".join(parts), st.st_size, st.st_mtime_ns, st.st_ino, digest)
        )
        return True, ""

    # -- files in several chunks ----------------------------------------------------

    @property
    def busy(self) -> bool:
        """A file is being received in chunks."""
        return self._fd >= 0

    def begin(
        self, parts: tuple[str, ...], target: str, headers: dict[str, str] | None = None
    ) -> None:
        """Start a file received in chunks, going to ``target`` (from ``target()``);
        ``headers`` of its first chunk (a big file's version: resumable)."""
        self.abort()
        self._target_path = target
        name = "/".join(parts)
        version = Version.from_headers(headers or {})
        if version is not None and version.size >= self.resume_min:
            self._fd, self._journal = self.partials.start(name, version)
            tmp = self.partials.data_path(name)
        else:
            self.partials.discard(name)
            tmp = self._temp_name()
            self._fd = os.open(tmp, _TEMP_FLAGS, 0o666)
        self._tmp, self._parts = tmp, parts
        self._sha1 = _sha1()
        self._size = 0

    def resume_points(self) -> list[ResumePoint]:
        """Partial files left by an interrupted transfer, proven (``filemq.partial``)."""
        return self.partials.scan()

    def resume(
        self, parts: tuple[str, ...], target: str, offset: int, headers: dict[str, str]
    ) -> str:
        """Take up the partial file of ``parts`` at ``offset`` (the server resumed there):
        '' when done, else why not (the partial file is gone; fetch from zero)."""
        self.abort()
        name = "/".join(parts)
        version = Version.from_headers(headers)
        if version is None:
            self.partials.discard(name)
            return "the server named no version"
        taken = self.partials.resume(name, offset, version)
        if taken is None:
            return f"no partial file of this version up to byte {offset}"
        self._fd, self._journal, self._sha1 = taken
        self._target_path = target
        self._tmp, self._parts = self.partials.data_path(name), parts
        self._size = offset
        return ""

    def write(self, data: bytes) -> None:
        _write_all(self._fd, data)
        self._sha1.update(data)
        self._size += len(data)
        if self._journal is not None:
            self._journal.checkpoint(self._size, self._sha1)

    def finish(self, headers: dict[str, str]) -> tuple[bool, str]:
        """Verify and rename into place: (verified, reason).

        Raises OSError/UnsafePathError when a verified file cannot be placed.
        """
        fd, self._fd = self._fd, -1
        tmp, self._tmp = self._tmp, ""
        journal, self._journal = self._journal, None
        name = "/".join(self._parts)
        if journal is not None:
            journal.close()
        try:
            st = _stamp_and_close(fd, headers)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            self.partials.forget_journal(name)
            raise
        parts, digest = self._parts, self._sha1.hexdigest()
        reason = _verify(self._size, digest, headers)
        if reason:
            os.unlink(tmp)
            self.partials.forget_journal(name)
            return False, reason
        try:
            self._rename_into_place(tmp, parts, self._target_path)
        finally:
            self.partials.forget_journal(name)
        self.index.record(FileEntry(name, st.st_size, st.st_mtime_ns, st.st_ino, digest))
        return True, ""

    def abort(self) -> None:
        """Stop receiving the file being received: a resumable partial file stays (with
        its journal) for the next session; any other temp file goes."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._journal is not None:
            self._journal.close()
            self._journal = None
            self._tmp = ""
        if self._tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = ""

    # -- deletes --------------------------------------------------------------------

    def delete(self, parts: tuple[str, ...]) -> bool:
        """Remove a file (and the folders it leaves empty); False when it was not there."""
        self.index.forget("/".join(parts))
        for depth in range(1, len(parts)):  # checked again from DEST on the next write
            self._safe_dirs.discard(parts[:depth])
        return remove_beneath(self.root, parts)
