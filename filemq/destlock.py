"""One mirror per DEST: an exclusive ``flock`` on ``DEST/.filemq-part-lock``.

Two processes mirroring into one DEST (two ``filemq subscribe``, or a ``filemq
sync`` beside one) would clean up each other's temp files and undo each other's
work.  ``DestLock.acquire`` takes an exclusive, non-blocking ``fcntl.flock`` on
the lock file and writes the holder's pid into it; a second process gets
``DestLocked`` naming that pid at once (``filemq`` exits with code 5).

Why inside DEST (``mirror.LOCK_NAME``) rather than beside the mirror's index:
every process that writes into DEST finds it, whatever its ``--index``,
``$XDG_CACHE_HOME`` or user.  Its name starts with the temp prefix, so it is
never indexed, published by a server, accepted from one, or deleted as an
extra file; ``Mirror.clean_temp`` leaves it alone.

The kernel drops a ``flock`` when its holder dies (even by ``kill -9``): a lock
file left behind holds nothing, and the next process takes it over.  On a clean
exit the holder removes the file.  Because of that removal a process checks,
once it holds the lock, that the path still names the file it locked (else it
locked a removed file and tries again).  ``check()`` does the same for a running
holder: the lock file removed (DEST deleted, say) is taken again, or
``DestLocked`` when another process got there first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path

from filemq.engine import FilemqError
from filemq.mirror import LOCK_NAME

__all__ = ["DestLock", "DestLocked"]

_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_ATTEMPTS = 10  # lock files removed under us in a row before giving up (a race each time)


class DestLocked(FilemqError):
    """Another process is mirroring into this DEST."""

    def __init__(self, dest: Path, pid: int | None) -> None:
        self.dest = dest
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(
            f"{dest} is already being mirrored by {holder} "
            f"(lock {dest / LOCK_NAME}); stop it or use another DEST"
        )


class DestLock:
    """The lock of one DEST; ``acquire()`` / ``release()``, or a context manager."""

    def __init__(self, dest: str | os.PathLike[str]) -> None:
        self.dest = Path(dest)
        self.path = self.dest / LOCK_NAME
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def holder(self) -> int | None:
        """The pid written in the lock file (None when unreadable)."""
        try:
            text = self.path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def acquire(self) -> None:
        """Take the lock or raise ``DestLocked`` (``OSError`` when DEST is unusable)."""
        if self._fd >= 0:
            return
        for _attempt in range(_ATTEMPTS):
            fd = os.open(self.path, _FLAGS, 0o644)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):  # (a FIFO, a device...)
                    raise OSError(errno.EINVAL, "not a regular file", str(self.path))
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if self._names(os.fstat(fd)):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                    self._fd = fd
                    return
            except BlockingIOError:
                os.close(fd)
                raise DestLocked(self.dest, self.holder()) from None
            except BaseException:
                os.close(fd)  # (never left open: it would hold the lock until exit)
                raise
            os.close(fd)  # the holder removed that file as we opened it: again
        raise DestLocked(self.dest, self.holder())

    def _names(self, st: os.stat_result) -> bool:
        """Does the lock path still name the file ``st`` describes?"""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)

    def check(self) -> None:
        """While held: the lock file was removed or replaced? Take it again (or raise)."""
        if self._fd < 0 or self._names(os.fstat(self._fd)):
            return
        old = self._fd
        self._fd = -1
        try:
            self.dest.mkdir(parents=True, exist_ok=True)
            self.acquire()
        finally:
            os.close(old)

    def release(self) -> None:
        if self._fd < 0:
            return
        fd, self._fd = self._fd, -1
        try:
            if self._names(os.fstat(fd)):  # never remove another process's lock file
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            os.close(fd)  # (unlocks)

    def __enter__(self) -> DestLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
