"""``refresh`` of a loaded index (packed rows, looked up by bisection) must find what
the check of an index made in memory finds (the oracle: every entry set one by one),
for every kind of change, and again once changed entries live beside the rows."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq.filters import Filters
from filemq.index import FileIndex, LeftOut

from .conftest import renamed_over, write_tree


def _tree() -> dict[str, bytes]:
    tree = {f"d{i % 3}/f{i:03d}.txt": b"content %03d" % i for i in range(90)}
    tree.update({f"d1/m{i}/g{i}.txt": b"nested %d" % i for i in range(3)})  # (between d1's)
    tree.update({"ünï/f.txt": b"not ascii", "top.txt": b"top", "d2/.filemq-part-x": b"t"})
    return tree


def _to_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside.txt").write_bytes(b"in")


def _f(root: Path, i: int) -> Path:
    return root / f"d{i % 3}" / f"f{i:03d}.txt"


# each change applied twice (k = 0, 1): the second time to another file of the same folder
CHANGES: dict[str, Callable[[Path, int], object]] = {
    "size": lambda r, k: _f(r, 3 + 30 * k).write_bytes(b"longer than it was"),
    "mtime": lambda r, k: os.utime(_f(r, 4 + 30 * k), ns=(10**9, 10**9)),
    "mode": lambda r, k: os.chmod(_f(r, 5 + 30 * k), 0o600),
    "replaced by rename": lambda r, k: renamed_over(_f(r, 6 + 30 * k)),
    "deleted": lambda r, k: _f(r, 7 + 30 * k).unlink(),
    "added": lambda r, k: (r / f"d2/new{k}.txt").write_bytes(b"new"),
    "file to folder": lambda r, k: _to_folder(_f(r, 9 + 30 * k)),
    "nested": lambda r, k: (r / f"d1/m{k}/g{k}.txt").write_bytes(b"changed nested"),
    "not ascii": lambda r, k: (r / "ünï/f.txt").write_bytes(b"changed, longer" * (k + 1)),
    "a whole folder": lambda r, k: [_f(r, i + 30 * k).write_bytes(b"x") for i in (2, 5, 8)],
}


def _same_view(loaded: FileIndex, oracle: FileIndex) -> None:
    assert loaded.entries() == oracle.entries()
    assert loaded.nodes() == oracle.nodes()


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_loaded_index_finds_what_the_one_by_one_check_finds(tmp_path: Path, change: str) -> None:
    root = tmp_path / "root"
    write_tree(root, _tree())
    skip = lambda name: name.startswith("d2/.filemq-part-")  # noqa: E731 (an exclude)
    oracle = FileIndex(root, tree=True, exclude=skip)
    oracle.refresh()
    oracle.save(tmp_path / "i.idx")
    loaded = FileIndex.load(tmp_path / "i.idx", root, tree=True, exclude=skip)
    assert loaded.refresh() == oracle.refresh()  # nothing changed: nothing found
    for k in range(2):  # (the second time, the first round's entries are not rows)
        CHANGES[change](root, k)
        found = loaded.refresh()
        assert found == oracle.refresh()
        assert found.changed or found.removed or found.nodes
        _same_view(loaded, oracle)
        assert "d2/.filemq-part-x" not in loaded


def _saved_and_loaded(tmp_path: Path, root: Path, **options: object) -> FileIndex:
    """An index of ``root`` saved, then loaded with ``options`` (its rows packed)."""
    made = FileIndex(root, tree=True)
    made.refresh()
    made.save(tmp_path / "i.idx")
    return FileIndex.load(tmp_path / "i.idx", root, tree=True, **options)  # type: ignore[arg-type]


def test_a_name_excluded_since_the_save_leaves_a_folder_otherwise_unchanged(
    tmp_path: Path,
) -> None:
    """The rows of a folder all match the disk, but one of its names is excluded now (the
    exclude changed between two runs): it leaves the index; the others stay unhashed."""
    root = tmp_path / "root"
    write_tree(root, _tree())
    loaded = _saved_and_loaded(tmp_path, root, exclude=lambda name: name == "d0/f003.txt")
    found = loaded.refresh()
    assert found.removed == ("d0/f003.txt",) and not found.changed
    assert "d0/f003.txt" not in loaded and "d0/f000.txt" in loaded
    assert loaded.hashed_files == 0


def test_a_left_out_asked_about_a_folder_says_what_it_says_of_each_name() -> None:
    """``LeftOut.any_in`` (a folder's files at once) against the call per name, for
    prefixes shorter, as long as and longer than the folder's name, names at the root,
    in the folder and below it."""
    bases = ["", "a/", "ab/", ".f/", ".f-/", "a/.f/", "zz/y/"]
    leaves_of = [[], ["x"], [".f-1", "x"], ["y", ".f"], ["f", "idx"], [".f-"], [".g", "idx2"]]
    tests = [
        LeftOut(()),
        LeftOut((".f-",)),
        LeftOut((".f-", "a/.")),
        LeftOut(("",)),
        LeftOut((".f-",), frozenset({"idx"})),
        LeftOut((".f-",), frozenset({"a/idx", "zz/y/f", "zz/idx"})),
        LeftOut(("ab/",), frozenset({".f/.f"})),
    ]
    for test in tests:
        for base in bases:
            for leaves in leaves_of:
                each = any(test(base + leaf) for leaf in leaves)
                assert test.any_in(base, leaves) is each, (test.prefixes, test.names, base, leaves)


def test_a_mirrors_left_out_names_leave_an_otherwise_unchanged_folder(tmp_path: Path) -> None:
    """A mirror's exclude (``LeftOut``: a prefix, an exact name) added since the save:
    what it leaves out leaves the index, in the root and in a folder, nothing is hashed."""
    root = tmp_path / "root"
    write_tree(root, _tree())
    left_out = LeftOut(("d1/f01", "d2/.filemq-part-"), frozenset({"top.txt", "d0/f003.txt"}))
    loaded = _saved_and_loaded(tmp_path, root, exclude=left_out)
    found = loaded.refresh()
    gone = sorted(n for n in _tree() if left_out(n))
    assert list(found.removed) == gone and not found.changed and len(gone) == 7
    assert not any(name in loaded for name in gone) and "d0/f000.txt" in loaded
    assert loaded.hashed_files == 0


def test_a_file_the_filters_leave_out_since_the_save_leaves_an_unchanged_folder(
    tmp_path: Path,
) -> None:
    """The same with filters (a mirror's ``--exclude`` added between two runs): the files
    they leave out leave the index, a folder they leave out whole too, nothing is hashed."""
    root = tmp_path / "root"
    write_tree(root, _tree())
    filters = Filters(["f01*.txt", "m1/"])
    loaded = _saved_and_loaded(tmp_path, root, filters=filters)
    found = loaded.refresh()
    gone = sorted(n for n in _tree() if n.rsplit("/", 1)[-1].startswith("f01") or "/m1/" in n)
    assert list(found.removed) == gone and not found.changed and len(gone) == 11
    assert not any(name in loaded for name in gone) and loaded.hashed_files == 0


@pytest.mark.parametrize(
    "lines", [["f01*.txt", "*.dat"], ["f0*.txt", "!f00*.txt"], ["d1/", "!d1/f01*"], ["*.none"]]
)
def test_filters_asked_about_a_folder_say_what_they_say_of_each_file(lines: list[str]) -> None:
    """``Filters.any_file_excluded`` (one regex mapped at C level when the lines are all
    excludes, else each name's ``excluded``) against ``excluded`` of each name."""
    filters = Filters(lines)
    folders = [[n for n in _tree() if n.startswith(top)] for top in ("d0/", "d1/", "t", "ü")]
    for names in [*folders, [], ["a.dat"], ["x/f011.txt", "y.txt"], ["d1/f001.txt"]]:
        each = any(filters.excluded(name) for name in names)
        assert filters.any_file_excluded(names) is each, (lines, names)


def test_a_refresh_with_filters_that_include_again_keeps_an_unchanged_folder(
    tmp_path: Path,
) -> None:
    """Filters with a ``!`` line (no single regex: each name asked) leave out what they
    exclude and keep what they include again; nothing is hashed."""
    root = tmp_path / "root"
    write_tree(root, _tree())
    filters = Filters(["f0*.txt", "!f00*.txt"])
    loaded = _saved_and_loaded(tmp_path, root, filters=filters)
    found = loaded.refresh()
    gone = sorted(n for n in _tree() if filters.excluded_path(n))
    assert list(found.removed) == gone and not found.changed and len(gone) == 90 - 10
    assert "d0/f000.txt" in loaded and "d1/f010.txt" not in loaded
    assert loaded.hashed_files == 0


def test_a_file_unreadable_last_time_is_read_again_in_an_unchanged_folder(
    tmp_path: Path,
) -> None:
    """A name marked unreadable is read again by the next refresh even though its folder
    matches the rows exactly (its key did not change: it was never read)."""
    root = tmp_path / "root"
    write_tree(root, _tree())
    loaded = _saved_and_loaded(tmp_path, root)
    loaded.mark_unreadable("d1/f001.txt", PermissionError(13, "Permission denied"))
    assert loaded.held("d1/f001.txt")
    loaded.refresh()
    assert loaded.hashed_files == 1
    assert not loaded.held("d1/f001.txt") and loaded.unreadable() == {}


@pytest.mark.parametrize("at_once", [4, 10_000])
def test_a_change_in_a_long_folder_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: int
) -> None:
    """A folder longer than the refresh tests at once (4 here: the folder is read as it
    comes, name by name) and one it tests at once: the same change found either way."""
    monkeypatch.setattr("filemq.index._FOLDER_AT_ONCE", at_once)
    root = tmp_path / "root"
    tree = {f"long/f{i:02d}": b"%d" % i for i in range(12)}
    write_tree(root, tree)
    loaded = _saved_and_loaded(tmp_path, root)
    assert loaded.refresh().changed == () and sorted(loaded.names()) == sorted(tree)
    (root / "long/f07").write_bytes(b"changed")
    (root / "long/f11").unlink()
    found = loaded.refresh()
    assert [e.name for e in found.changed] == ["long/f07"] and found.removed == ("long/f11",)
    assert loaded.get("long/f07") is not None and loaded.hashed_files == 1


def test_a_folder_whose_subfolder_sorts_between_its_files(tmp_path: Path) -> None:
    """``d/a``, ``d/b/x`` (a subfolder's row), ``d/c``: the folder's files are not one run
    of rows; unchanged they stay unhashed, a change to either kind is found."""
    root = tmp_path / "root"
    write_tree(root, {"d/a": b"a", "d/b/x": b"x", "d/c": b"c", "d/b.txt": b"dot sorts first"})
    loaded = _saved_and_loaded(tmp_path, root)
    unchanged = loaded.refresh()
    assert unchanged.changed == () and unchanged.removed == () and loaded.hashed_files == 0
    assert sorted(loaded.names()) == ["d/a", "d/b.txt", "d/b/x", "d/c"]
    (root / "d/c").write_bytes(b"changed c")
    (root / "d/b/x").write_bytes(b"changed x")
    found = loaded.refresh()
    assert sorted(e.name for e in found.changed) == ["d/b/x", "d/c"]
