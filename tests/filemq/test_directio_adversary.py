"""``--direct-io`` when the file system or the device says no part way (adversary tests).

``filemq.directio`` writes a big file's aligned chunks with ``O_DIRECT`` and falls back
to the page cache when the file system refuses the flag or a direct write (``EINVAL``),
or after a short, unaligned write; any other failure is the write's failure.  What must
hold whatever the refusal: the mirror ends exact (the SHA-1 of every file equal to the
source's), nothing outside DEST is touched, and a file that was not written whole is
never presented under its name.  The refusals are made in-process at the ``os`` level
(``fcntl`` / ``os.write`` on a descriptor with ``O_DIRECT`` set: this kernel's tmpfs
takes ``O_DIRECT``, so no local file system refuses it), and for real on a full tmpfs
(``ENOSPC``, ``filemq sync --direct-io`` as a process).  The kill -9 mid-file with
``--direct-io`` and a size limit (``EFBIG``) mid-file: ``test_resume.py``.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from filemq.mirror import DIRECT_MIN, TEMP_PREFIX
from filemq.server import FileServer

from .conftest import write_tree
from .test_full_disk import _grow, small_tmpfs, sync_exits_0, sync_into_full_dest

MiB = 1 << 20
Serve = Callable[..., FileServer]
Sync = Callable[..., Any]
_O_DIRECT = getattr(os, "O_DIRECT", 0)

pytestmark = pytest.mark.skipif(not _O_DIRECT, reason="no O_DIRECT on this system")

#: Big enough to be written direct (``DIRECT_MIN``), none a multiple of the alignment.
TREE = {
    "big/odd.bin": os.urandom(DIRECT_MIN + 4095),
    "big/even_plus_one.bin": os.urandom(DIRECT_MIN + MiB + 1),
    "small.txt": b"small",
}


def _sha1s(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.startswith(TEMP_PREFIX):
            out[path.relative_to(root).as_posix()] = hashlib.sha1(path.read_bytes()).hexdigest()
    return out


def _outside(tmp_path: Path, dest: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``tmp_path`` but DEST's: (size, mtime)."""
    out = {}
    for path in tmp_path.rglob("*"):
        if path == dest or dest in path.parents:
            continue
        st = path.lstat()
        out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


class DirectFaults:
    """Counts the writes made with ``O_DIRECT`` set and injects a fault at one of them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.direct_writes = 0
        self.buffered_after = 0  # writes without O_DIRECT to a file written direct before
        self.fail_at: int | None = None  # the direct write (1-based) that fails
        self.error = errno.EINVAL
        self.short = False  # at fail_at: write 1000 octets (unaligned) instead of failing
        self.refuse_flag = False  # F_SETFL with O_DIRECT: EINVAL (a file system without)
        self._direct_fds: set[int] = set()
        real_write, real_fcntl = os.write, fcntl.fcntl

        def write(fd: int, data: Any) -> int:
            if fd in self._direct_fds and not real_fcntl(fd, fcntl.F_GETFL) & _O_DIRECT:
                self.buffered_after += 1
            if fd >= 0 and real_fcntl(fd, fcntl.F_GETFL) & _O_DIRECT:
                self._direct_fds.add(fd)
                self.direct_writes += 1
                if self.direct_writes == self.fail_at:
                    if self.short:
                        return real_write(fd, memoryview(data)[:1000])
                    raise OSError(self.error, os.strerror(self.error))
            return real_write(fd, data)

        def fcntl_(fd: int, cmd: int, arg: Any = 0) -> Any:
            if self.refuse_flag and cmd == fcntl.F_SETFL and arg & _O_DIRECT:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            return real_fcntl(fd, cmd, arg)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(fcntl, "fcntl", fcntl_)


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> Iterator[DirectFaults]:
    yield DirectFaults(monkeypatch)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    src = tmp_path / "src"
    write_tree(src, TREE)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_bytes(b"not DEST's")
    yield src, tmp_path / "dest"


def test_a_file_system_refusing_o_direct_is_written_through_the_cache(
    tmp_path: Path,
    serve: Serve,
    sync_once: Sync,
    faults: DirectFaults,
    tree: tuple[Path, Path],
) -> None:
    src, dest = tree
    faults.refuse_flag = True
    server = serve(src)
    before = _outside(tmp_path, dest)
    result = sync_once(server.endpoint, dest, direct_io=True)
    assert result.synced and result.errors == 0
    assert faults.direct_writes == 0  # (the documented fallback: buffered writes)
    assert _sha1s(dest) == _sha1s(src)
    assert _outside(tmp_path, dest) == before


@pytest.mark.parametrize("at", [1, 3])  # (3: the first file's third direct write)
@pytest.mark.parametrize("fault", ["einval", "short"])
def test_a_direct_write_refused_mid_file_falls_back_and_the_mirror_is_exact(
    tmp_path: Path,
    serve: Serve,
    sync_once: Sync,
    faults: DirectFaults,
    tree: tuple[Path, Path],
    fault: str,
    at: int,
) -> None:
    src, dest = tree
    faults.fail_at = at
    faults.short = fault == "short"
    server = serve(src)
    before = _outside(tmp_path, dest)
    result = sync_once(server.endpoint, dest, direct_io=True)
    assert result.synced and result.errors == 0
    assert faults.direct_writes >= at  # direct up to the fault ...
    assert faults.buffered_after > 0  # ... through the cache after it
    assert _sha1s(dest) == _sha1s(src)
    assert _outside(tmp_path, dest) == before


def test_an_io_error_mid_file_is_an_error_and_never_a_whole_file(
    tmp_path: Path,
    serve: Serve,
    sync_once: Sync,
    faults: DirectFaults,
    tree: tuple[Path, Path],
) -> None:
    src, dest = tree
    faults.fail_at = 3
    faults.error = errno.EIO
    server = serve(src)
    before = _outside(tmp_path, dest)
    result = sync_once(server.endpoint, dest, direct_io=True)
    assert result.errors >= 1
    held = _sha1s(dest)
    want = _sha1s(src)
    assert {name: want.get(name) for name in held} == held  # whatever is there is whole
    assert len(held) < len(want)  # the file that failed is not presented
    assert _outside(tmp_path, dest) == before
    faults.fail_at = None  # the device is well again: the next run makes DEST exact
    result = sync_once(server.endpoint, dest, direct_io=True)
    assert result.synced and result.errors == 0
    assert _sha1s(dest) == want
    assert _outside(tmp_path, dest) == before


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of 6 MiB (``test_full_disk.small_tmpfs``: mount, root only)."""
    with small_tmpfs(tmp_path / "disk", "6m") as where:
        yield where


def test_sync_direct_io_into_a_disk_that_fills_mid_file_then_exact(
    tmp_path: Path, small_disk: Path, serve: Serve
) -> None:
    src = tmp_path / "src"
    big = {"big.bin": os.urandom(DIRECT_MIN + 777)}  # (more than the disk holds)
    write_tree(src, big)
    server = serve(src)
    dest = small_disk / "dest"
    sync = ["sync", server.endpoint, str(dest), "--once", "--direct-io"]
    sync += ["--index", str(tmp_path / "d.idx")]
    line = sync_into_full_dest(tmp_path, sync, dest)
    assert "No space left on device" in line
    assert _sha1s(dest) == {}  # nothing presented as whole
    assert sorted(p.name for p in small_disk.iterdir()) == ["dest"]  # nothing beside DEST
    _grow(small_disk)  # (64 MiB)
    sync_exits_0(tmp_path, sync)
    assert _sha1s(dest) == _sha1s(src)
    assert sorted(p.name for p in small_disk.iterdir()) == ["dest"]
