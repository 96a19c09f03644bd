"""A whole small file put in place (``filemq.mirror.Mirror.place``): written to a temp
file in DEST, stamped, renamed over its name.

The crash rule: a process killed -9 at any point of a placement never leaves a wrong
file under the final name (nothing, or the old version, or the new one whole).  The
kills here are real ``SIGKILL``s of a child process at the named moment (its own
``write_all``/``replace_in`` replaced by a kill of itself): the file system's state
after each is what the parent checks, and the next mirror's ``clean_temp`` leaves
DEST exact.
"""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from filemq.index import FileIndex
from filemq.meta import EntryMeta
from filemq.mirror import Mirror

from .conftest import read_tree, write_tree

MTIME_NS = 1_600_000_000_123_456_789


def _headers(data: bytes) -> dict[str, str]:
    return {"size": str(len(data)), "sha1": hashlib.sha1(data).hexdigest()}


def _place(mirror: Mirror, name: str, data: bytes, mode: int = 0o640) -> None:
    parts = tuple(name.split("/"))
    meta = EntryMeta(mode=mode, mtime_ns=MTIME_NS)
    ok, reason = mirror.place(parts, mirror.target(parts), data, _headers(data), meta)
    assert ok, reason


def _names(root: Path) -> list[str]:
    """Every name under ``root`` (files, folders, links, temp files), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_new_file_appears_whole_with_its_mode_mtime_and_indexed_inode(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    mirror = Mirror(dest, FileIndex(dest))
    _place(mirror, "a/b/new.txt", b"fresh bytes" * 100)
    mirror.release_folders()
    st = (dest / "a/b/new.txt").lstat()
    assert (dest / "a/b/new.txt").read_bytes() == b"fresh bytes" * 100
    assert st.st_mode & 0o7777 == 0o640 and st.st_mtime_ns == MTIME_NS
    entry = mirror.index.get("a/b/new.txt")
    assert entry is not None and entry.key == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert _names(dest) == ["a", "a/b", "a/b/new.txt"]  # (no temp file left)


@pytest.mark.parametrize("in_the_way", ["file", "link out of DEST", "folder", "dangling link"])
def test_a_name_held_by_what_the_index_does_not_know_is_replaced(
    tmp_path: Path, in_the_way: str
) -> None:
    """The index says the name is free, DEST holds something there (a local change): the
    verified file replaces it, never writing through a link (what it points at is left
    as it was), and no temp file stays."""
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    write_tree(outside, {"victim.txt": b"not the mirror's"})
    (dest / "d").mkdir(parents=True)
    target = dest / "d" / "f.txt"
    if in_the_way == "file":
        target.write_bytes(b"local")
    elif in_the_way == "link out of DEST":
        target.symlink_to(outside / "victim.txt")
    elif in_the_way == "dangling link":
        target.symlink_to(outside / "nothing-here")
    else:
        write_tree(target, {"inside.txt": b"in a folder"})
    mirror = Mirror(dest, FileIndex(dest))
    _place(mirror, "d/f.txt", b"the server's")
    mirror.release_folders()
    assert not target.is_symlink() and target.read_bytes() == b"the server's"
    assert read_tree(outside) == {"victim.txt": b"not the mirror's"}
    assert not (outside / "nothing-here").exists()
    assert _names(dest) == ["d", "d/f.txt"]


_CHILD = textwrap.dedent(
    """
    import hashlib, os, signal, sys
    from pathlib import Path
    import filemq.mirror
    from filemq.index import FileIndex
    from filemq.mirror import Mirror

    dest, name, moment = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    data = b"new version " * 1000

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    def half_then_killed(fd, data):
        os.write(fd, bytes(data)[: len(data) // 2])
        killed()

    index = FileIndex(dest)
    index.refresh()  # (what DEST holds)
    mirror = Mirror(dest, index)
    if moment == "mid-write":
        filemq.mirror.write_all = half_then_killed
    elif moment == "before the rename":
        filemq.mirror.replace_in = killed
    parts = tuple(name.split("/"))
    headers = {"size": str(len(data)), "sha1": hashlib.sha1(data).hexdigest()}
    mirror.place(parts, mirror.target(parts), data, headers)
    sys.exit(3)  # (never reached: killed at the moment named)
    """
)


@pytest.mark.parametrize(
    ("moment", "before"),
    [
        ("mid-write", None),
        ("mid-write", b"old version"),
        ("before the rename", None),
        ("before the rename", b"old version"),
    ],
)
def test_killed_during_a_placement_no_wrong_file_under_the_final_name(
    tmp_path: Path, moment: str, before: bytes | None
) -> None:
    """``filemq sync`` killed -9 while placing a small file: the final name shows
    nothing (a new name) or the old version (a replacement), never a partial or
    unverified file; the temp file stays in DEST's top folder only, where the next
    mirror's ``clean_temp`` removes it."""
    dest = tmp_path / "dest"
    (dest / "sub").mkdir(parents=True)
    if before is not None:
        (dest / "sub" / "f.dat").write_bytes(before)
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(dest), "sub/f.dat", moment],
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    in_sub = [n for n in _names(dest) if n.startswith("sub")]
    if before is None:
        assert in_sub == ["sub"]
    else:
        assert in_sub == ["sub", "sub/f.dat"]
        assert (dest / "sub" / "f.dat").read_bytes() == before
    assert [n for n in _names(dest) if not n.startswith("sub")]  # (the temp file, at the top)
    Mirror(dest, FileIndex(dest)).clean_temp()
    assert _names(dest) == in_sub
