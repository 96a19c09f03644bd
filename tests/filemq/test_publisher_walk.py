"""scan_tree / stamp_tree / reconcile / PathFilter on real directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from filemq.changes import FileChanged, FileDeleted, FileStamp
from filemq.walk import PathFilter, check_relpath, reconcile, scan_tree, stamp_tree


def make(root: Path, rel: str, data: bytes = b"x") -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_scan_tree_lists_regular_files_with_posix_relpaths(tmp_path: Path) -> None:
    for rel in ("top.txt", "a/one", "a/b/c/deep.bin"):
        make(tmp_path, rel, rel.encode())
    (tmp_path / "empty" / "dir").mkdir(parents=True)
    got = dict(scan_tree(tmp_path))
    assert sorted(got) == ["a/b/c/deep.bin", "a/one", "top.txt"]
    st = os.lstat(tmp_path / "a/b/c/deep.bin")
    assert got["a/b/c/deep.bin"].st_ino == st.st_ino
    assert got["a/b/c/deep.bin"].st_size == len(b"a/b/c/deep.bin")


def test_scan_tree_never_follows_or_reports_symlinks(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(root, "real")
    make(outside, "secret")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    (root / "filelink").symlink_to(outside / "secret")
    (root / "inner").symlink_to(root / "real")
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    assert [rel for rel, _ in scan_tree(root)] == ["real"]


def test_scan_tree_skips_fifos(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    make(tmp_path, "file")
    assert [rel for rel, _ in scan_tree(tmp_path)] == ["file"]


def test_scan_tree_skips_ignored_names_and_their_subtrees(tmp_path: Path) -> None:
    make(tmp_path, "keep")
    make(tmp_path, ".keep.fmqtmp12ab")  # a FILEMQ client's download in progress
    make(tmp_path, "cache/skip.o")
    make(tmp_path, "sub/ok.c")
    make(tmp_path, "sub/x.o")
    filt = PathFilter(["*.fmqtmp*", "*.o", "cache"])
    assert sorted(rel for rel, _ in scan_tree(tmp_path, ignore=filt)) == ["keep", "sub/ok.c"]
    default = sorted(rel for rel, _ in scan_tree(tmp_path))
    assert default == ["cache/skip.o", "keep", "sub/ok.c", "sub/x.o"]


def test_scan_tree_skips_names_that_are_not_utf8(tmp_path: Path) -> None:
    make(tmp_path, "fine-é")
    with open(os.path.join(os.fsencode(tmp_path), b"bad-\xff"), "wb") as f:
        f.write(b"x")
    assert [rel for rel, _ in scan_tree(tmp_path)] == ["fine-é"]


def test_scan_tree_missing_root(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list(scan_tree(tmp_path / "nope"))
    assert list(scan_tree(tmp_path / "nope", missing_ok=True)) == []
    assert stamp_tree(tmp_path / "nope") == {}


def test_scan_subtree_keeps_root_relative_paths(tmp_path: Path) -> None:
    make(tmp_path, "a/b/f")
    make(tmp_path, "a/g")
    make(tmp_path, "ab/h")
    assert sorted(rel for rel, _ in scan_tree(tmp_path, subtree="a")) == ["a/b/f", "a/g"]
    assert list(scan_tree(tmp_path, subtree="missing")) == []


def test_scan_subtree_through_a_symlink_is_empty(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    make(outside, "d/secret")
    root.mkdir()
    (root / "link").symlink_to(outside)
    assert list(scan_tree(root, subtree="link/d")) == []


@pytest.mark.parametrize("bad", ["../x", "/etc", "a//b", "a/./b", "a/..", "x\0y"])
def test_subtree_must_stay_inside(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="relative path"):
        check_relpath(bad)
    with pytest.raises(ValueError):
        list(scan_tree(tmp_path, subtree=bad))


def test_stamp_tree_matches_lstat(tmp_path: Path) -> None:
    path = make(tmp_path, "d/f", b"12345")
    st = os.lstat(path)
    assert stamp_tree(tmp_path) == {"d/f": FileStamp(5, st.st_mtime_ns, st.st_ino)}


def test_reconcile_turns_known_into_current() -> None:
    same, old, new = FileStamp(1, 1, 1), FileStamp(2, 2, 2), FileStamp(3, 3, 3)
    known: dict[str, FileStamp | None] = {
        "same": same,
        "changed": old,
        "gone": old,
        "unknown": None,
    }
    current = {"same": same, "changed": new, "unknown": same, "added": new}
    got = reconcile("m", known, current)
    assert got[0] == FileDeleted("m", "gone")  # deletions first
    assert set(got[1:]) == {
        FileChanged("m", "changed", new),
        FileChanged("m", "unknown", same),
        FileChanged("m", "added", new),
    }
    assert reconcile("m", current, current) == []


def test_reconcile_subtree_leaves_the_rest_alone() -> None:
    s = FileStamp(1, 1, 1)
    known: dict[str, FileStamp | None] = {"a/x": s, "a/b/y": s, "ab/z": s, "top": s}
    got = reconcile("m", known, {"a/new": s}, subtree="a")
    assert set(got) == {
        FileDeleted("m", "a/x"),
        FileDeleted("m", "a/b/y"),
        FileChanged("m", "a/new", s),
    }


def test_path_filter_matches_every_component() -> None:
    filt = PathFilter(["*.tmp", ".git"])
    assert filt.accepts("a/b/c.txt")
    assert not filt.accepts("a/b.tmp/c.txt")
    assert not filt.accepts(".git/config")
    assert not filt.accepts("x/" + os.fsdecode(b"\xff"))
    assert PathFilter([]).accepts("anything.fmqtmp1")
    assert not PathFilter().accepts(".f.fmqtmp1")
    assert not PathFilter().accepts("sub/.filemq-part-12-3")


def test_server_exclusion_fast_path_agrees_with_the_patterns() -> None:
    """The server's per-name check (a cheap test first) excludes exactly what the
    ignore patterns and the UTF-8 rule exclude, at any depth."""
    from filemq.server import _excluded
    from filemq.walk import DEFAULT_IGNORE, PathFilter

    full = PathFilter(DEFAULT_IGNORE)
    names = ["a.txt", "d/.filemq-part-12-3", ".filemq-part-1", "d/e/x.fmqtmp9", "x.fmqtmp"]
    names += ["d.f/plain", ".f", "d/.filemq-part", "é/.filemq-part-1", "é/ok", "bad\udcff"]
    names += ["d\udcff/ok", ".fmqtmp/inside", "a.fmqtm"]
    for name in names:
        assert _excluded(name) == (not full.accepts_name(name.rpartition("/")[2])), name
    assert _excluded("d/.filemq-part-1") and not _excluded("d/file.dat")
