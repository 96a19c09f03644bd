"""A server's start from its saved index, against an unlucky or hostile disk: a damaged
header, files changed while it was down with their size and mtime put back, a folder
swapped for a link between the index's load and its check (issue 15, session 13)."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from filemq.index import FileIndex, IndexFormatError, SavedIndex, _check_joined
from filemq.state import load_index

from .conftest import renamed_over, write_tree

#: Peak of Python allocations allowed while a damaged saved index is refused (octets):
#: far above what reading a small file's header takes, far below one list of the
#: node lines a damaged count announces (8 octets a line).
_REFUSAL_PEAK = 1 << 20


def _saved(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    write_tree(root, {f"d{i % 3}/f{i}.txt": b"file %d" % i for i in range(12)})
    index = FileIndex(root, tree=True)
    index.refresh()
    saved = tmp_path / "index"
    index.save(saved)
    return root, saved


def test_a_header_announcing_more_node_lines_than_the_file_holds_is_refused_at_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The header line is outside the CRC-32: a damaged ``nodes`` count must be refused
    where the file ends, not read as that many (empty) lines first."""
    root, saved = _saved(tmp_path)
    header, rest = saved.read_bytes().split(b"\n", 1)
    head = json.loads(header)
    saved.write_bytes(json.dumps({**head, "nodes": 1_000_000}).encode() + b"\n" + rest)
    tracemalloc.start()
    try:
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root, tree=True)
        assert SavedIndex.read(saved, root) is None  # (a mirror's first ICANHAZ: no view)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < _REFUSAL_PEAK, f"{peak:,} octets allocated to refuse it"
    with caplog.at_level("WARNING"):
        index = load_index(saved, root, tree=True)  # the server's start: one line, rebuilt
    assert not index.loaded and "rebuilt" in caplog.text
    index.refresh()
    assert len(index) == 12 and index.hashed_files == 12


def _in_place_restored(path: Path) -> None:
    """Rewritten in place (same inode), then size and mtime_ns put back exactly."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(path.read_bytes().upper())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _same_second(path: Path) -> None:
    """Rewritten in place, its mtime put back to the same second (not the same ns):
    what rsync's default quick check (one-second resolution) misses."""
    st = path.stat()
    path.write_bytes(path.read_bytes().upper())
    second = st.st_mtime_ns // 10**9 * 10**9
    moved = second + (st.st_mtime_ns - second + 1) % 10**9
    os.utime(path, ns=(st.st_atime_ns, moved))


@pytest.mark.parametrize(
    ("change", "caught"),
    [(_same_second, True), (renamed_over, True), (_in_place_restored, False)],
    ids=["mtime same second", "renamed over", "in place, size and mtime_ns restored"],
)
def test_a_change_made_while_the_server_was_down_with_size_and_mtime_put_back(
    tmp_path: Path, change: object, caught: bool
) -> None:
    """The quick check's rules as docs/filemq.md states them: a file is the indexed version
    while its size, mtime_ns, inode and permission bits are; so a same-second rewrite
    and a file renamed over are found (re-hashed), and only a rewrite in place with
    size and mtime_ns restored to the nanosecond keeps the indexed SHA-1 (as rsync's
    quick check; ``ctime`` is not in the index)."""
    root, saved = _saved(tmp_path)
    target = root / "d1" / "f4.txt"
    assert callable(change)
    change(target)
    index = load_index(saved, root, tree=True)
    assert index.loaded
    delta = index.refresh()
    entry = index.get("d1/f4.txt")
    assert entry is not None
    now = hashlib.sha1(target.read_bytes()).hexdigest()
    if caught:
        assert [e.name for e in delta.changed] == ["d1/f4.txt"] and entry.sha1 == now
    else:
        assert not delta.changed and entry.sha1 != now and index.hashed_files == 0


def test_a_folder_swapped_for_a_link_between_the_load_and_the_check(tmp_path: Path) -> None:
    """The index loaded, then a folder it lists replaced by a link to a folder outside
    the root holding files of the same names: the check drops the folder's files and
    indexes nothing of the outside (the link itself is a node, never followed)."""
    root, saved = _saved(tmp_path)
    outside = tmp_path / "outside"
    write_tree(outside, {f"f{i}.txt": b"secret %d" % i for i in range(1, 12, 3)})
    index = load_index(saved, root, tree=True)
    assert index.loaded and index.get("d1/f1.txt") is not None
    os.rename(root / "d1", tmp_path / "moved")
    os.symlink(outside, root / "d1")
    delta = index.refresh()
    assert not any(n.startswith("d1/") for n in index.names())
    assert sorted(delta.removed) == sorted(f"d1/f{i}.txt" for i in range(1, 12, 3))
    assert not delta.changed and index.hashed_files == 0
    node = index.node("d1")
    assert node is not None and node.kind == "symlink"


def _walk_could_index(names: list[str]) -> bool:
    """The oracle, name by name: no empty name or component, none '.' or '..', no NUL."""
    return all(
        name and "\0" not in name and all(c not in ("", ".", "..") for c in name.split("/"))
        for name in names
    )


@settings(max_examples=600, deadline=None)
@given(st.lists(st.text(alphabet="a./\0", max_size=7), min_size=1, max_size=6))
def test_the_joined_names_check_refuses_exactly_what_no_walk_indexes(names: list[str]) -> None:
    """The check a load makes of every saved name at once (searches in the names joined
    by NUL) against the rule written name by name."""
    joined = "\0".join(names)
    try:
        _check_joined(joined, len(names), "idx")
        refused = False
    except IndexFormatError:
        refused = True
    assert refused is not _walk_could_index(names), names


def test_a_file_moved_outside_and_replaced_by_a_link_to_it_is_no_longer_a_file(
    tmp_path: Path,
) -> None:
    """The file renamed out of the root (same inode, size, mtime, mode) and a link to it
    left in its place: what the link leads to has exactly the indexed values, so only
    an ``lstat`` tells the change.  The folder's quick check must see a link, not the
    indexed file (the name leaves the files; a tree index lists it as a link)."""
    root, saved = _saved(tmp_path)
    (tmp_path / "outside").mkdir()
    moved = tmp_path / "outside" / "f2.txt"
    os.rename(root / "d2" / "f2.txt", moved)
    os.symlink(moved, root / "d2" / "f2.txt")
    index = load_index(saved, root, tree=True)
    assert index.loaded
    delta = index.refresh()
    assert index.get("d2/f2.txt") is None and delta.removed == ("d2/f2.txt",)
    node = index.node("d2/f2.txt")
    assert node is not None and node.kind == "symlink"
    assert len(index) == 11 and index.hashed_files == 0
