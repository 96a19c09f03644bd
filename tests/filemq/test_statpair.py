"""``PairedStat``: a folder's entries ``lstat``-ed by two threads (``filemq.statpair``)
give what one thread gives, fail as one thread fails, and a refresh using them
(``FileIndex.refresh``) never reads through a folder swapped for a link mid-walk."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from filemq.index import FileIndex
from filemq.statpair import PAIR_MIN, PairedStat

#: Long enough to be split between the two threads.
_LONG = 4 * PAIR_MIN


def _folder(root: Path, count: int) -> Path:
    """``count`` files of different sizes, a folder and a link to a file outside."""
    root.mkdir()
    for i in range(count):
        (root / f"f{i:04d}").write_bytes(b"x" * i)
    (root / "sub").mkdir()
    os.symlink("/etc/hostname", root / "link")
    return root


def _entries(folder: Path) -> Iterator[list[os.DirEntry[str]]]:
    """The folder's entries from a descriptor-based ``scandir`` (as a refresh lists)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with os.scandir(fd) as listing:
            yield sorted(listing, key=lambda e: e.name)
    finally:
        os.close(fd)


def _fields(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns)


def test_two_threads_give_every_entrys_lstat_in_order(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "src", _LONG)
    with closing(PairedStat(paired=True)) as pair:
        for entries in _entries(folder):
            got = pair.stat_all(entries)
            assert len(got) == len(entries) == _LONG + 2
            for entry, st in zip(entries, got, strict=True):
                assert _fields(st) == _fields(os.lstat(folder / entry.name)), entry.name
            names = {e.name: st for e, st in zip(entries, got, strict=True)}
            assert stat.S_ISLNK(names["link"].st_mode)  # (the link itself)
            assert names["f0100"].st_size == 100


@pytest.mark.parametrize("half", ["first", "second"])
def test_a_name_gone_before_its_lstat_raises_and_the_worker_stays_usable(
    tmp_path: Path, half: str
) -> None:
    folder = _folder(tmp_path / "src", _LONG)
    with closing(PairedStat(paired=True)) as pair:
        for entries in _entries(folder):
            gone = entries[1] if half == "first" else entries[-3]
            (folder / gone.name).unlink()
            with pytest.raises(FileNotFoundError):
                pair.stat_all(entries)
        for entries in _entries(folder):  # the next folder: both halves again
            assert len(pair.stat_all(entries)) == len(entries)


def test_close_stops_the_worker_and_short_lists_start_none(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "src", PAIR_MIN - 3)  # (+ folder + link: still short)
    before = {t.name for t in threading.enumerate()}
    with closing(PairedStat(paired=True)) as pair:
        for entries in _entries(folder):
            assert len(pair.stat_all(entries)) == len(entries)
        assert "filemq-lstat" not in {t.name for t in threading.enumerate()} - before
    long_folder = _folder(tmp_path / "long", _LONG)
    pair = PairedStat(paired=True)
    for entries in _entries(long_folder):
        pair.stat_all(entries)
    assert "filemq-lstat" in {t.name for t in threading.enumerate()}
    pair.close()
    assert "filemq-lstat" not in {t.name for t in threading.enumerate()} - before


def test_a_folder_swapped_for_a_link_mid_refresh_is_not_read_through(tmp_path: Path) -> None:
    """The walk's exclude test runs as it goes: at the first name of one folder it swaps
    the other (not walked yet, long enough for two threads) for a link to a folder
    outside the root.  The refresh must index nothing of the outside, and the folder
    walked first whole (a fresh index and a loaded one: the loaded one takes the
    two-thread path)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for i in range(_LONG):
        (outside / f"secret{i:03d}").write_bytes(b"secret")
    root = tmp_path / "root"
    root.mkdir()
    for folder in ("a", "b"):
        (root / folder).mkdir()
        for i in range(_LONG):
            (root / folder / f"f{i:03d}").write_bytes(b"mine %d" % i)
    made = FileIndex(root)
    made.refresh()
    saved = tmp_path / "index"
    made.save(saved)

    for loaded in (False, True):
        walked: list[str] = []  # the folder met first, then the one swapped

        def swap_other(name: str, walked: list[str] = walked) -> bool:
            folder = name.split("/")[0]
            if "/" in name and not walked:
                other = "b" if folder == "a" else "a"
                os.rename(root / other, tmp_path / "moved")
                os.symlink(outside, root / other)
                walked += [folder, other]
            return False

        if loaded:
            index = FileIndex.load(saved, root, exclude=swap_other)
            assert index.loaded
        else:
            index = FileIndex(root, exclude=swap_other)
        index.paired_stat = True  # (as the server's)
        index.refresh()
        assert walked, "the walk met a folder and swapped the other"
        first, other = walked
        names = set(index.names())
        assert not any("secret" in n for n in names), sorted(names)[:5]
        mine = {f"{first}/f{i:03d}" for i in range(_LONG)}
        assert {n for n in names if n.startswith(f"{first}/")} == mine
        os.unlink(root / other)  # (back as it was for the next round)
        os.rename(tmp_path / "moved", root / other)


def test_a_refresh_on_two_threads_finds_what_one_thread_finds(tmp_path: Path) -> None:
    """The same saved index refreshed with ``paired_stat`` and without, after changes of
    every kind in long folders: the same delta and the same entries."""
    root = tmp_path / "root"
    for folder in ("a", "b", "c"):
        (root / folder).mkdir(parents=True)
        for i in range(_LONG):
            (root / folder / f"f{i:03d}").write_bytes(b"v1 %d" % i)
    made = FileIndex(root, tree=True)
    made.refresh()
    saved = tmp_path / "index"
    made.save(saved)
    (root / "a" / "f005").write_bytes(b"changed, longer")  # changed
    (root / "b" / "f010").unlink()  # gone
    (root / "b" / "new").write_bytes(b"new")  # added
    (root / "c" / "f020").unlink()
    (root / "c" / "f020").mkdir()  # a file became a folder
    (root / "c" / "f020" / "inside").write_bytes(b"in")
    found = {}
    for paired in (False, True):
        index = FileIndex.load(saved, root, tree=True)
        index.paired_stat = paired
        delta = index.refresh()
        found[paired] = (
            sorted(e.name for e in delta.changed),
            sorted(delta.removed),
            sorted((e.name, e.size, e.inode, e.sha1) for e in index),
        )
    assert found[True] == found[False]
    changed, removed, _entries = found[True]
    assert changed == ["a/f005", "b/new", "c/f020/inside"]
    assert removed == ["b/f010", "c/f020"]
