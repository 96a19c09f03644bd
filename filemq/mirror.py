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

* With ``direct_min`` (``sync --direct-io``: ``DIRECT_MIN``, 8 MiB) a file that big
  is written around the page cache (``filemq.directio``: ``O_DIRECT`` while the
  alignment allows); everything else above holds as it is.

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
deleted through; a folder removed meanwhile is made again.  (The descriptor of a
folder walked is kept for the next renames into it until the client next waits
for the socket -- at most 256 messages -- or a delete, folder change or DEST check
comes: ``release_folders``, or ``expire_folders`` while the placer thread may be
renaming; at most ``MAX_FOLDER_FDS`` kept.  This saves four
system calls per small file; a folder swapped within one such batch still
receives that batch's files in the folder it was, wherever it was moved: never
through the link.)  Deletes also remove
the folders they empty (unless the server mirrors folders: ``delete``).  A
verified file whose place in DEST is held by a directory (a local change)
replaces that directory and everything under it: DEST is a mirror
(``forget_folders`` drops what was remembered when DEST changed).

Metadata (``filemq.meta``): a verified file gets the server's ``mode & mask`` and
its ``mtime`` on the temp file's descriptor, *after* verification and *before* the
rename, so it shows up at its name complete, with its final mode and mtime at once
(never with wider permissions in between; the temp file of a file received in
chunks is created 0600; one sent whole, verified before it is written, is created
with its final permission bits when they are plain rwx bits, and ``fchmod``-ed only
when the umask took some away).
``mask`` is 0o777 by default: setuid, setgid and sticky bits are stripped unless
the mirror keeps them (``--special-bits``).  A later version of a file of mode 000
is still put in place (a rename needs no access to the old file); mode and mtime
alone are changed through an ``O_PATH`` descriptor (``touch``), which needs none
either.  Folders (``make_dir``) get ``mode & mask | 0o700``: the mirror can always
write into them.  Links (``make_link``) are made under a temp name and renamed into
place; their targets were checked by the engine (``check_link_target``).  A delete
from a server that says what it deletes (it mirrors folders itself) removes a file,
a link or an *empty* folder and leaves the folders above alone.

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
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filemq.engine import HEADER_MTIME, HEADER_SHA1, HEADER_SIZE
from filemq.index import NODE_DIR, NODE_SYMLINK, FileEntry, FileIndex, Node
from filemq.meta import PERMISSION_BITS, EntryMeta, Kind, local_mode
from filemq.partial import Journal, PartialStore, ResumePoint, Version, new_sha1
from filemq.paths import (
    OutsideRootError,
    UnsafePathError,
    lstat_beneath,
    open_dir_beneath,
    remove_beneath,
    replace_beneath,
    replace_in,
    rmdir_beneath,
    safe_target,
    set_attrs_beneath,
)
from filemq.writer import ChunkWriter, write_all

if TYPE_CHECKING:  # imported by a --direct-io file only (start-up of every `filemq sync`)
    from filemq.stagedwriter import StagedWriter

__all__ = [
    "DIRECT_MIN",
    "LOCK_NAME",
    "PARTIAL_PREFIX",
    "RESUME_MIN_SIZE",
    "TEMP_PREFIX",
    "Mirror",
]

log = logging.getLogger(__name__)

#: Temp files under DEST start with this; such names are never indexed or accepted.
TEMP_PREFIX = ".filemq-part-"
#: The lock file of the process mirroring into DEST (``filemq.destlock``).
LOCK_NAME = TEMP_PREFIX + "lock"
#: Resumable partial files and their journals (``filemq.partial``).
PARTIAL_PREFIX = TEMP_PREFIX + "resume-"
#: Files at least this big are received into resumable partial files.
RESUME_MIN_SIZE = 8 << 20
#: Files this big and bigger are written around the page cache when the mirror is
#: asked to (``direct_min``; ``filemq.directio``): the files received in many chunks.
DIRECT_MIN = 8 << 20
#: Folder descriptors kept between walks (``Mirror._folder``); beyond: the oldest closed.
MAX_FOLDER_FDS = 128
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_TEMP_MODE = 0o600  # until verified and given its own mode: readable by the mirror only


def _verify(size: int, digest: str, headers: dict[str, str]) -> str:
    """Why a received file does not match the server's headers ('' when it does)."""
    want_size = headers.get(HEADER_SIZE)
    if want_size is not None and want_size != str(size):
        return f"size {size}, server said {want_size}"
    want_sha1 = headers.get(HEADER_SHA1)
    if want_sha1 is not None and want_sha1.lower() != digest:
        return f"SHA-1 {digest}, server said {want_sha1}"
    return ""


def _umask() -> int:
    """This process's umask, read without changing it (``/proc``), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: What a file gets when the server sends no mode (as if created by ``open``).
_DEFAULT_MODE = 0o666 & ~_umask()


def _final_mode(headers: dict[str, str], meta: EntryMeta | None, mask: int) -> int:
    """The permission bits a received file gets: the server's mode ``& mask``, or
    ``0o666 & ~umask`` without one (as if created in place)."""
    if meta is not None and meta.mode is not None:
        return local_mode(meta.mode, mask, Kind.FILE)
    return _DEFAULT_MODE


def _stamp_and_close(
    fd: int, headers: dict[str, str], meta: EntryMeta | None, mask: int, mode: int = -1
) -> os.stat_result:
    """Set the server's mode (``& mask``, ``_final_mode``) and mtime on the open temp
    file, stat it, close it.

    ``meta`` is what the engine checked; without it (an older caller) the mtime
    header is used when it is a plain number.  A file created with its final mode
    already (``Mirror.place``: verified content; the ``fstat`` shows it) is not
    ``fchmod``-ed: one system call less per small file.  ``mode``: that final mode
    when the caller has it already (-1: worked out here).
    """
    try:
        if mode < 0:
            mode = _final_mode(headers, meta, mask)
        if meta is not None:
            ns = meta.mtime_ns
        else:
            mtime = headers.get(HEADER_MTIME)
            ns = int(mtime) if mtime is not None and mtime.isdigit() else None
        if ns is not None:
            try:
                os.utime(fd, ns=(ns, ns))
            except (OverflowError, OSError) as exc:  # a time the file system cannot hold
                log.warning("cannot set mtime %d: %s", ns, exc)
        st = os.fstat(fd)
        if stat.S_IMODE(st.st_mode) != mode:  # (chmod keeps the mtime just set)
            os.fchmod(fd, mode)
            st = os.fstat(fd)
        return st
    finally:
        os.close(fd)


class Mirror:
    """Writes into DEST (``root``) and keeps its ``index`` up to date; see the module doc."""

    def __init__(
        self,
        root: Path,
        index: FileIndex,
        *,
        mask: int = PERMISSION_BITS,
        resume_min: int = RESUME_MIN_SIZE,
        direct_min: int | None = None,
    ) -> None:
        self.root = root
        self.resume_min = resume_min
        #: Files of at least this size are written around the page cache (None: none).
        self.direct_min = direct_min
        self.partials = PartialStore(root, PARTIAL_PREFIX)
        self._journal: Journal | None = None  # the file being received is resumable
        #: Permission bits applied from the server's modes (``filemq.meta``).
        self.mask = mask
        self._root = str(root)
        self.index = index
        self._safe_dirs: set[tuple[str, ...]] = set()
        #: Descriptors of folders walked (``open_dir_beneath``) this receive batch.
        self._dir_fds: dict[tuple[str, ...], int] = {}
        self._expired = False  # released before the next use (``expire_folders``)
        self._temp_base = f"{self._root}/{TEMP_PREFIX}{os.getpid()}-"
        self._counter = 0
        self._fd = -1
        self._tmp = ""
        self._parts: tuple[str, ...] = ()
        self._sha1: Any = None
        self._size = 0
        self._writer: ChunkWriter | StagedWriter | None = None  # writes and hashes the chunks

    def clean_temp(self) -> None:
        """Remove temp files an interrupted run left in DEST (not the lock file)."""
        for entry in os.scandir(self.root):
            if (
                entry.name.startswith(TEMP_PREFIX)
                and entry.name != LOCK_NAME
                and not self.partials.owns(entry.name)
                and (entry.is_file(follow_symlinks=False) or entry.is_symlink())
            ):
                os.unlink(entry.path)

    def forget_folders(self) -> None:
        """DEST changed under us: check every folder again before writing into it."""
        self._safe_dirs.clear()
        self.release_folders()

    def release_folders(self) -> None:
        """Close the folder descriptors kept for renames: the next rename walks DEST
        again (before each wait for the socket: see the module doc and ``expire_folders``)."""
        fds, self._dir_fds = self._dir_fds, {}
        for fd in fds.values():
            os.close(fd)

    def expire_folders(self) -> None:
        """The folder descriptors kept are released before the next rename uses one
        (``release_folders`` there): what the client asks before each wait for the
        socket while the placer may still be renaming (``filemq.placer``: this thread
        then closes nothing the placer uses; it is the placer that walks DEST again)."""
        self._expired = True

    def _folder(self, parts: tuple[str, ...]) -> int:
        """A descriptor of folder ``parts`` (made when missing), walked without following
        a link (``open_dir_beneath``) once per receive batch and then reused."""
        if self._expired:
            self._expired = False
            self.release_folders()
        fd = self._dir_fds.get(parts)
        if fd is None:
            fd = open_dir_beneath(self.root, parts, create=True)
            if len(self._dir_fds) >= MAX_FOLDER_FDS:  # the oldest goes
                os.close(self._dir_fds.pop(next(iter(self._dir_fds))))
            self._dir_fds[parts] = fd
        return fd

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

    def _rename_into_place(self, tmp: str, parts: tuple[str, ...]) -> None:
        try:
            self._replace(tmp, parts)
        except (OSError, UnsafePathError):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _replace(self, tmp: str, parts: tuple[str, ...]) -> None:
        """Rename ``tmp`` to ``parts`` under DEST (``filemq.paths.replace_beneath``)."""
        try:
            replace_in(tmp, self._folder(parts[:-1]), parts[-1])
        except IsADirectoryError:  # DEST holds a directory where the server has this file
            self._remove_directory(parts)
            replace_beneath(tmp, self.root, parts)
        except FileNotFoundError:  # the folder kept was removed meanwhile: walk (make) again
            self.release_folders()
            replace_beneath(tmp, self.root, parts)
        if parts[:-1] not in self._safe_dirs:
            self._note_folders(parts)
            self._safe_dirs.add(parts[:-1])

    def _note_folders(self, parts: tuple[str, ...]) -> None:
        """Index the folders above ``parts`` that the rename may have made (so a check of
        DEST does not take the mirror's own folders for local changes)."""
        if not self.index.tree:
            return
        for depth in range(1, len(parts)):
            name = "/".join(parts[:depth])
            if self.index.node(name) is not None:
                continue
            try:
                st = lstat_beneath(self.root, parts[:depth])
            except (OSError, UnsafePathError):
                return
            if stat.S_ISDIR(st.st_mode):
                self.index.record_node(Node(name, NODE_DIR, _perms(st)))

    def _remove_directory(self, parts: tuple[str, ...]) -> None:
        """Remove the directory at ``parts`` (reached through ``open_dir_beneath``; the
        removal itself follows no link: ``shutil.rmtree`` relative to that folder)."""
        import shutil  # (here: its bz2 and lzma are start-up time of every ``filemq sync``)

        if not shutil.rmtree.avoids_symlink_attacks:
            raise UnsafePathError(f"{'/'.join(parts)!r}: a directory is in the way")
        self.release_folders()
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
        self,
        parts: tuple[str, ...],
        target: str,
        data: bytes,
        headers: dict[str, str],
        meta: EntryMeta | None = None,
    ) -> tuple[bool, str]:
        """Verify a complete file and put it at ``target`` (from ``target()``).

        Returns (verified, reason); nothing is written when it does not verify.
        Raises OSError or UnsafePathError when a verified file cannot be placed.
        """
        self.abort()
        digest = new_sha1(data).hexdigest()
        reason = _verify(len(data), digest, headers)
        if reason:
            return False, reason
        tmp = self._temp_name()
        mode = _final_mode(headers, meta, self.mask)  # (verified: no need to hide it)
        fd = os.open(tmp, _TEMP_FLAGS, mode if mode <= PERMISSION_BITS else _TEMP_MODE)
        try:
            write_all(fd, data)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        try:
            st = _stamp_and_close(fd, headers, meta, self.mask, mode)
        except BaseException:
            os.unlink(tmp)
            raise
        self._rename_into_place(tmp, parts)
        self.index.record(
            FileEntry("/".join(parts), st.st_size, st.st_mtime_ns, st.st_ino, digest, _perms(st))
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
        name = "/".join(parts)
        version = Version.from_headers(headers or {})
        if version is not None and version.size >= self.resume_min:
            self._fd, self._journal = self.partials.start(name, version)
            tmp = self.partials.data_path(name)
        else:
            self.partials.discard(name)
            tmp = self._temp_name()
            self._fd = os.open(tmp, _TEMP_FLAGS, _TEMP_MODE)
        self._tmp, self._parts = tmp, parts
        self._sha1 = new_sha1()
        self._size = 0
        self._writer = self._chunk_writer(0, version)

    def _chunk_writer(self, size: int, version: Version | None) -> ChunkWriter | StagedWriter:
        """The writer of this file's chunks: for a big file with ``direct_min``,
        ``filemq.stagedwriter`` (direct, each chunk hashed right after it was staged);
        else ``filemq.writer`` (through the page cache; writing and hashing on two
        threads: one thread writing then hashing each chunk hot saved 0.1-0.4 CPU s per
        GiB plain, none over CURVE, and serialised the two: docs/performance.md, sha18)."""
        if self.direct_min is not None and version is not None and version.size >= self.direct_min:
            from filemq.stagedwriter import StagedWriter

            return StagedWriter(
                self._fd, self._sha1, size=size, journal=self._journal, direct=True
            )
        return ChunkWriter(self._fd, self._sha1, size=size, journal=self._journal)

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
        self._tmp, self._parts = self.partials.data_path(name), parts
        self._size = offset
        self._writer = self._chunk_writer(offset, version)
        return ""

    def write(self, data: bytes) -> None:
        """Queue the next chunk of the file being received (``filemq.writer``: written
        and hashed off the receive loop); raises the ``OSError`` of an earlier one."""
        assert self._writer is not None
        self._writer.write(data)
        self._size += len(data)

    def flush(self) -> None:
        """Wait until the chunks written so far are on disk; raise a write's failure."""
        if self._writer is not None:
            self._writer.settle()

    def finish(self, headers: dict[str, str], meta: EntryMeta | None = None) -> tuple[bool, str]:
        """Verify and rename into place: (verified, reason).

        Raises OSError/UnsafePathError when a verified file cannot be placed.
        """
        try:
            self.flush()
        except OSError:
            self.abort()  # (as after a failed write: a resumable partial file stays)
            raise
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        fd, self._fd = self._fd, -1
        tmp, self._tmp = self._tmp, ""
        journal, self._journal = self._journal, None
        name = "/".join(self._parts)
        if journal is not None:
            journal.close()
        try:
            st = _stamp_and_close(fd, headers, meta, self.mask)
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
            self._rename_into_place(tmp, parts)
        finally:
            self.partials.forget_journal(name)
        self.index.record(
            FileEntry(name, st.st_size, st.st_mtime_ns, st.st_ino, digest, _perms(st))
        )
        return True, ""

    def abort(self) -> None:
        """Stop receiving the file being received: a resumable partial file stays (with
        its journal) for the next session; any other temp file goes."""
        if self._writer is not None:  # (before the descriptors close: it may be writing)
            if self._journal is not None:
                self._writer.close()  # what was received is kept for the next session
            else:
                self._writer.discard()  # (the temp file goes)
            self._writer = None
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

    def delete(self, parts: tuple[str, ...], *, prune: bool = True) -> bool:
        """Remove a file or link (and, with ``prune``, the folders it leaves empty), or an
        empty folder; False when there was nothing to remove (a folder that is not empty
        stays: what it holds is not the server's to delete)."""
        self.index.forget("/".join(parts))
        self.release_folders()  # (a delete may remove folders: walked again)
        for depth in range(1, len(parts)):  # checked again from DEST on the next write
            self._safe_dirs.discard(parts[:depth])
        try:
            st = lstat_beneath(self.root, parts)
        except FileNotFoundError:
            return False  # (a link on the way raises: never deleted through, and said so)
        if stat.S_ISDIR(st.st_mode):
            self._safe_dirs = {d for d in self._safe_dirs if d[: len(parts)] != parts}
            return rmdir_beneath(self.root, parts)
        return remove_beneath(self.root, parts, prune=prune)

    # -- folders, links, modes --------------------------------------------------------

    def make_dir(self, parts: tuple[str, ...], mode: int | None) -> Node:
        """Make folder ``parts`` (a file or link in the way goes) with the server's mode."""
        name = "/".join(parts)
        self.release_folders()  # (a file in the way may go)
        try:
            os.close(open_dir_beneath(self.root, parts, create=True))
        except OutsideRootError:  # the last component is a file or link: DEST is a mirror
            try:
                st = lstat_beneath(self.root, parts)
            except FileNotFoundError:
                st = None
            if st is None or stat.S_ISDIR(st.st_mode):
                raise
            log.warning("%s: replacing what DEST holds there by the server's folder", name)
            remove_beneath(self.root, parts, prune=False)
            self.index.forget(name)
            os.close(open_dir_beneath(self.root, parts, create=True))
        bits = None if mode is None else local_mode(mode, self.mask, Kind.DIR)
        st = set_attrs_beneath(self.root, parts, mode=bits)
        node = Node(name, NODE_DIR, _perms(st))
        self.index.record_node(node)
        return node

    def make_link(self, parts: tuple[str, ...], target: str) -> Node:
        """Make symbolic link ``parts`` -> ``target`` (checked by the engine), replacing
        what is there; made under a temp name, then renamed into place."""
        self.abort()
        tmp = self._temp_name()
        os.symlink(target, tmp)
        self._rename_into_place(tmp, parts)
        st = lstat_beneath(self.root, parts)
        node = Node("/".join(parts), NODE_SYMLINK, 0, target, st.st_mtime_ns, st.st_ino)
        self.index.record_node(node)
        return node

    def touch(self, parts: tuple[str, ...], meta: EntryMeta, sha1: str, size: int) -> bool:
        """Set mode and mtime of the file DEST holds at ``parts`` when it is the version
        with ``sha1`` and ``size`` (as the index knows it, unchanged since); else False."""
        entry = self.index.get("/".join(parts))
        if entry is None or entry.sha1 != sha1 or entry.size != size:
            return False
        try:
            st = lstat_beneath(self.root, parts)
        except (FileNotFoundError, UnsafePathError):
            return False
        if not stat.S_ISREG(st.st_mode) or entry.key != (st.st_size, st.st_mtime_ns, st.st_ino):
            return False
        bits = None if meta.mode is None else local_mode(meta.mode, self.mask, Kind.FILE)
        st = set_attrs_beneath(self.root, parts, mode=bits, mtime_ns=meta.mtime_ns)
        self.index.record(entry._replace(mtime_ns=st.st_mtime_ns, mode=_perms(st)))
        return True

    def same_within(
        self, parts: tuple[str, ...], meta: EntryMeta, sha1: str, size: int, window_ns: int
    ) -> bool:
        """DEST's file at ``parts`` is the version ``sha1``/``size`` with the mode ``meta``
        gives and an mtime within ``window_ns`` of it (``--modify-window``: nothing to
        set).  Read from the index (the caller's resync checked it against the disk)."""
        entry = self.index.get("/".join(parts))
        if entry is None or entry.sha1 != sha1 or entry.size != size or meta.mtime_ns is None:
            return False
        if meta.mode is not None and local_mode(meta.mode, self.mask, Kind.FILE) != entry.mode:
            return False
        return abs(entry.mtime_ns - meta.mtime_ns) <= window_ns


def _perms(st: os.stat_result) -> int:
    return st.st_mode & 0o7777
