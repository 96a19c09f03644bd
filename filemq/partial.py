"""Resumable partial files in a mirror's DEST: the bytes received so far, and a journal.

A big file (``Mirror``'s ``resume_min``, default 8 MiB) received in several
chunks is written to ``DEST/<prefix><key>`` (``key``: from the SHA-1 of its
relative name) and journalled beside it in ``DEST/<prefix><key>.journal``::

    filemq-partial 1 SHA1 SIZE MTIME_NS NAME      the version being received
    OFFSET PREFIX_SHA1                            a checkpoint, one per CHECKPOINT_BYTES
    ...

A checkpoint says: the first OFFSET bytes of the partial file have the SHA-1
PREFIX_SHA1 (the running hash of what was received, taken as it was written).
The version comes from the first chunk's headers (``filemq.engine``).

After an interruption (connection lost, the mirror stopped or killed with -9, a
write that failed), ``PartialStore.scan`` *proves* each partial file before it
is offered: it reads the file from its start, hashes it, and keeps it up to the
last checkpoint whose SHA-1 matches (the file is cut there, the journal after
that line).  A journal that is not one (garbage, another format, a name that is
not a plain relative name or not the one its key was made from, a version that
is not a SHA-1 and a size), a partial file that is missing or not a regular
file, or no matching checkpoint: both files go and the file will come from
zero.  Cost: reading what is kept once (~0.5 s per GiB here), at the start of a
session that has partial files.

The offer (``ResumePoint``: name, offset, the version's SHA-1) goes to the
server (ICANHAZ option ``RESUME``), which starts at that offset only when its
current version of the file has that SHA-1: then the proven prefix is a prefix of
what it sends.  Else it starts at 0 and the partial file is replaced.  The hash
of the prefix carries on with the new bytes, and the whole file is still verified
against the SHA-1 of the last chunk before it is renamed into place: a partial
file changed after it was proven, a server file changed in the middle of the
transfer, anything, fails that check; the mirror then drops the partial file and
fetches the file again from zero.

Limits: at most ``MAX_PARTIALS`` partial files per DEST (a new one removes the
oldest ones not in use); a journal over ``MAX_JOURNAL`` bytes is garbage.
Partial files an offer did not bring back (the server no longer has that version)
are removed when the resync ends (``discard_unused``).

Every file here is directly in DEST and opened with ``filemq.paths.open_beneath``
(no symbolic link followed, a FIFO not waited on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filemq.engine import HEADER_MTIME, HEADER_SHA1, HEADER_SIZE, FilemqError
from filemq.paths import UnsafePathError, open_beneath, relative_parts

__all__ = [
    "CHECKPOINT_BYTES",
    "MAX_JOURNAL",
    "MAX_PARTIALS",
    "Journal",
    "JournalError",
    "PartialStore",
    "ResumePoint",
    "Version",
    "format_checkpoint",
    "format_header",
    "new_sha1",
    "parse_journal",
]

log = logging.getLogger(__name__)

#: Bytes received between two checkpoints (the most a resume re-fetches beyond what
#: was in flight when the transfer stopped).
CHECKPOINT_BYTES = 1 << 20
#: Partial files kept per DEST.
MAX_PARTIALS = 4
#: A journal longer than this is not one (one line per MiB: a 100 GiB file's is ~6 MiB).
MAX_JOURNAL = 16 << 20
_READ_BLOCK = 1 << 20
_MAGIC = b"filemq-partial 1 "
_JOURNAL = ".journal"
_PARTIAL_MODE = 0o600  # a partial file and its journal (filemq.mirror's temp files too)
_HEADER = re.compile(rb"filemq-partial 1 ([0-9a-f]{40}) (\d{1,19}) (\d{1,19}) ([^\n]+)")
_CHECKPOINT = re.compile(rb"(\d{1,19}) ([0-9a-f]{40})")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted in DEST must not block us


class JournalError(FilemqError, ValueError):
    """A journal is not one (it and its partial file are dropped)."""


@dataclass(frozen=True, slots=True)
class Version:
    """Which version of a file is being received (from the chunk headers)."""

    sha1: str
    size: int
    mtime_ns: int

    @classmethod
    def from_headers(cls, headers: dict[str, str]) -> Version | None:
        sha1 = headers.get(HEADER_SHA1, "").lower()
        size = headers.get(HEADER_SIZE, "")
        mtime = headers.get(HEADER_MTIME, "0")
        if len(sha1) != 40 or not size.isdigit() or not mtime.isdigit():
            return None
        try:
            int(sha1, 16)
        except ValueError:
            return None
        return cls(sha1, int(size), int(mtime))


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """A partial file proven up to ``offset`` bytes of version ``sha1`` of ``name``."""

    name: str
    offset: int
    sha1: str


@dataclass(frozen=True, slots=True)
class _Checkpoint:
    """A journal line: the SHA-1 of the first ``offset`` bytes."""

    offset: int
    sha1: str
    end: int  # where its line ends in the journal


def format_header(name: str, version: Version) -> bytes:
    return _MAGIC + f"{version.sha1} {version.size} {version.mtime_ns} {name}\n".encode()


def format_checkpoint(offset: int, sha1: str) -> bytes:
    return f"{offset} {sha1}\n".encode("ascii")


def parse_journal(data: bytes) -> tuple[str, Version, list[_Checkpoint]]:
    """A journal's name, version and checkpoints; ``JournalError`` when it is not one.

    Checkpoints are read up to the first line that is not one (a torn last line:
    the process was killed as it wrote), an offset that does not grow or one past
    the size.
    """
    line_end = data.find(b"\n")
    found = _HEADER.fullmatch(data[:line_end]) if line_end > 0 else None
    if found is None:
        raise JournalError("not a filemq partial-file journal")
    try:
        name = found.group(4).decode("utf-8")
        relative_parts(name)
    except (UnicodeDecodeError, UnsafePathError) as exc:
        raise JournalError(f"bad file name in journal: {exc}") from None
    version = Version(found.group(1).decode(), int(found.group(2)), int(found.group(3)))
    checkpoints: list[_Checkpoint] = []
    pos = line_end + 1
    while True:
        end = data.find(b"\n", pos)
        if end < 0:
            break
        point = _CHECKPOINT.fullmatch(data[pos:end])
        if point is None:
            break
        offset = int(point.group(1))
        if offset > version.size or (checkpoints and offset <= checkpoints[-1].offset):
            break
        checkpoints.append(_Checkpoint(offset, point.group(2).decode(), end + 1))
        pos = end + 1
    return name, version, checkpoints


class Journal:
    """The open journal of a partial file being written: appends checkpoints."""

    def __init__(self, fd: int, recorded: int) -> None:
        self._fd = fd
        self._recorded = recorded

    def checkpoint(self, size: int, hasher: Any) -> None:
        """``size`` bytes written so far, hashed by ``hasher``: a line every CHECKPOINT_BYTES."""
        if size - self._recorded >= CHECKPOINT_BYTES:
            os.write(self._fd, format_checkpoint(size, hasher.hexdigest()))
            self._recorded = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(slots=True)
class _Proven:
    """A partial file checked up to ``offset``, its hasher ready to go on."""

    offset: int
    version: Version
    hasher: Any  # SHA-1 of the first ``offset`` bytes
    age: float  # the journal's mtime (the oldest goes first past MAX_PARTIALS)


def new_sha1(data: bytes = b"") -> Any:
    """A SHA-1 hasher fed ``data`` (``hashlib`` imported on first use)."""
    import hashlib  # deferred: OpenSSL's ~3 ms start-up, which a no-change sync never needs

    return hashlib.sha1(data)


def _regular(fd: int, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise JournalError(f"{what} is not a regular file")
    return st


class PartialStore:
    """The partial files of one DEST (``root``), named ``prefix`` + key (see module doc)."""

    def __init__(self, root: Path, prefix: str, *, limit: int = MAX_PARTIALS) -> None:
        self.root = root
        self.prefix = prefix
        self.limit = max(1, limit)
        self._ready: dict[str, _Proven] = {}  # proven by scan(), not in use yet

    # -- names ------------------------------------------------------------------------

    def data_name(self, name: str) -> str:
        """The partial file of relative ``name`` (directly in DEST)."""
        return self.prefix + new_sha1(name.encode("utf-8", "surrogateescape")).hexdigest()

    def data_path(self, name: str) -> str:
        return os.path.join(self.root, self.data_name(name))

    def owns(self, entry: str) -> bool:
        """Is ``entry`` (a name in DEST) one of the files kept here?"""
        return entry.startswith(self.prefix)

    def _unlink(self, entry: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.root, entry))

    def discard(self, name: str) -> None:
        """Remove the partial file of ``name`` and its journal (if any)."""
        self._ready.pop(name, None)
        data = self.data_name(name)
        self._unlink(data + _JOURNAL)
        self._unlink(data)

    def forget_journal(self, name: str) -> None:
        """The file was renamed into place (or dropped): its journal goes."""
        self._unlink(self.data_name(name) + _JOURNAL)

    def discard_unused(self) -> list[str]:
        """Remove every proven partial file that no transfer took up; their names."""
        names = list(self._ready)
        for name in names:
            self.discard(name)
        return names

    # -- writing ----------------------------------------------------------------------

    def start(self, name: str, version: Version) -> tuple[int, Journal]:
        """A new partial file for ``name`` (replacing any): its descriptor and journal."""
        self.discard(name)
        while len(self._ready) > self.limit - 1:  # (room for this one)
            oldest = min(self._ready, key=lambda n: self._ready[n].age)
            log.info("%s: too many partial files, dropping the oldest", oldest)
            self.discard(oldest)
        data = self.data_name(name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC
        # readable by the mirror only until verified and given the server's mode
        fd = open_beneath(self.root, (data,), flags, _PARTIAL_MODE)
        try:
            journal = open_beneath(
                self.root, (data + _JOURNAL,), flags | os.O_APPEND, _PARTIAL_MODE
            )
        except BaseException:
            os.close(fd)
            self._unlink(data)
            raise
        try:
            os.write(journal, format_header(name, version))
        except BaseException:
            os.close(fd)
            os.close(journal)
            self.discard(name)
            raise
        return fd, Journal(journal, 0)

    def resume(self, name: str, offset: int, version: Version) -> tuple[int, Journal, Any] | None:
        """Take up the proven partial file of ``name`` at ``offset`` for ``version``:
        its descriptor (positioned at ``offset``), journal and prefix hash; None when
        there is none, or it is not that one (the partial file is then removed)."""
        proven = self._ready.pop(name, None)
        if proven is None or proven.offset != offset or proven.version.sha1 != version.sha1:
            self.discard(name)
            return None
        data = self.data_name(name)
        fd = -1
        try:
            fd = open_beneath(self.root, (data,), os.O_WRONLY | _NONBLOCK | _CLOEXEC)
            if _regular(fd, data).st_size != offset:
                raise JournalError(f"{data} changed since it was checked")
            os.lseek(fd, offset, os.SEEK_SET)
            journal = open_beneath(
                self.root, (data + _JOURNAL,), os.O_WRONLY | os.O_APPEND | _CLOEXEC
            )
        except (OSError, UnsafePathError, JournalError) as exc:
            log.warning("%s: cannot resume its partial file: %s", name, exc)
            if fd >= 0:
                os.close(fd)
            self.discard(name)
            return None
        return fd, Journal(journal, offset), proven.hasher

    # -- after an interruption --------------------------------------------------------

    def scan(self) -> list[ResumePoint]:
        """Prove every partial file in DEST (see the module doc); what can be resumed."""
        self._ready.clear()
        try:
            entries = [e.name for e in os.scandir(self.root) if self.owns(e.name)]
        except OSError as exc:
            log.warning("cannot list %s for partial files: %s", self.root, exc)
            return []
        journals = {e for e in entries if e.endswith(_JOURNAL)}
        for entry in entries:  # a partial file without its journal cannot be proven
            if entry not in journals and entry + _JOURNAL not in journals:
                self._unlink(entry)
        points: list[ResumePoint] = []
        for journal in sorted(journals):
            point = self._prove(journal)
            if point is not None:
                points.append(point)
        while len(self._ready) > self.limit:
            self.discard(min(self._ready, key=lambda n: self._ready[n].age))
        return [p for p in points if p.name in self._ready]

    def _prove(self, journal: str) -> ResumePoint | None:
        data = journal[: -len(_JOURNAL)]
        try:
            name, version, checkpoints, age, journal_fd = self._read_journal(journal)
        except (OSError, UnsafePathError, JournalError) as exc:
            log.warning("dropping partial file %s: %s", data, exc)
            self._unlink(journal)
            self._unlink(data)
            return None
        try:
            if self.data_name(name) != data:
                raise JournalError(f"journal {journal} names another file ({name!r})")
            offset, hasher, end = self._longest_proven(data, checkpoints)
            if not offset:
                raise JournalError("no checkpoint matches what it holds")
            os.ftruncate(journal_fd, end)  # checkpoints past the proven one are void
        except (OSError, UnsafePathError, JournalError) as exc:
            log.warning("dropping partial file %s: %s", data, exc)
            self._unlink(journal)
            self._unlink(data)
            return None
        finally:
            os.close(journal_fd)
        self._ready[name] = _Proven(offset, version, hasher, age)
        log.info("%s: partial file proven up to byte %d of %d", name, offset, version.size)
        return ResumePoint(name, offset, version.sha1)

    def _read_journal(self, journal: str) -> tuple[str, Version, list[_Checkpoint], float, int]:
        fd = open_beneath(self.root, (journal,), os.O_RDWR | _NONBLOCK | _CLOEXEC)
        try:
            st = _regular(fd, journal)
            if st.st_size > MAX_JOURNAL:
                raise JournalError(f"{journal} is too big to be a journal")
            chunks = []
            while True:
                block = os.read(fd, _READ_BLOCK)
                if not block:
                    break
                chunks.append(block)
            name, version, checkpoints = parse_journal(b"".join(chunks))
        except BaseException:
            os.close(fd)
            raise
        return name, version, checkpoints, st.st_mtime, fd

    def _longest_proven(self, data: str, checkpoints: list[_Checkpoint]) -> tuple[int, Any, int]:
        """Hash partial file ``data`` from its start: the last checkpoint it matches (its
        offset, the hash there, where its line ends); the file is cut at that offset."""
        fd = open_beneath(self.root, (data,), os.O_RDWR | _NONBLOCK | _CLOEXEC)
        try:
            size = _regular(fd, data).st_size
            hasher = new_sha1()
            position = 0
            proven: tuple[int, Any, int] = (0, None, 0)
            for point in checkpoints:
                if point.offset > size:
                    break
                while position < point.offset:
                    block = os.pread(fd, min(_READ_BLOCK, point.offset - position), position)
                    if not block:
                        break
                    hasher.update(block)
                    position += len(block)
                if position != point.offset or hasher.hexdigest() != point.sha1:
                    break
                proven = (point.offset, hasher.copy(), point.end)
            if proven[0] and size != proven[0]:
                os.ftruncate(fd, proven[0])  # bytes past the last proven checkpoint go
            return proven
        finally:
            os.close(fd)
