"""Name safety rules and the versioned file index."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import stat
import time
from pathlib import Path

import pytest

from filemq.index import FORMAT_VERSION, FileIndex, IndexFormatError
from filemq.paths import (
    OutsideRootError,
    UnsafePathError,
    all_relative_safe,
    local_parts,
    lstat_beneath,
    open_beneath,
    open_dir_beneath,
    relative_inside,
    relative_parts,
    remove_beneath,
    replace_beneath,
    safe_target,
    under_prefix,
    virtual_path,
)


@pytest.mark.parametrize(
    "name", ["", "/abs", "a/../b", "..", ".", "a//b", "a/", "a\\b", "a\x00b", "a\nb", "C:x"]
)
def test_relative_parts_refuses(name: str) -> None:
    with pytest.raises(UnsafePathError):
        relative_parts(name)


def test_relative_parts_and_virtual_paths() -> None:
    assert relative_parts("a/b c/日本.txt") == ("a", "b c", "日本.txt")
    assert relative_parts("..hidden/x..y") == ("..hidden", "x..y")
    assert virtual_path("//docs//a/") == "/docs/a"
    assert virtual_path("/docs", directory=True) == "/docs/"
    assert virtual_path("/", directory=True) == "/"
    for bad in ("docs", "/a/../b", "/a/./b"):
        with pytest.raises(UnsafePathError):
            virtual_path(bad)
    assert under_prefix("/docs/a/b", "/docs/") == "a/b"
    assert under_prefix("/docsx/a", "/docs/") is None
    assert under_prefix("/a", "/") == "a"


def test_safe_target_refuses_symlinks_and_non_directories(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file").write_bytes(b"")
    (root / "dir").mkdir()
    for parts in (("link", "x"), ("file", "x"), ("dir",)):
        with pytest.raises(UnsafePathError):
            safe_target(root, parts)
    assert safe_target(root, ("new", "deep", "x")) == root / "new" / "deep" / "x"
    os.close(open_dir_beneath(root, ("new", "deep"), create=True))
    assert (root / "new" / "deep").is_dir()
    with pytest.raises(UnsafePathError):
        open_dir_beneath(root, ("link",), create=True)


def test_index_hashes_once_per_version_and_reports_changes(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "a").write_bytes(b"one")
    (tmp_path / "d" / "b").write_bytes(b"two")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    index = FileIndex(tmp_path)
    first = index.refresh()
    assert sorted(e.name for e in first.changed) == ["a", "d/b"]  # links are not indexed
    assert index.hashed_files == 2
    assert index.refresh().changed == () and index.hashed_files == 2
    (tmp_path / "a").write_bytes(b"changed!")
    (tmp_path / "d" / "b").unlink()
    delta = index.refresh()
    assert [e.name for e in delta.changed] == ["a"] and delta.removed == ("d/b",)
    assert index.hashed_files == 3
    entry = index.get("a")
    assert entry is not None and entry.sha1 == hashlib.sha1(b"changed!").hexdigest()
    assert index.update("a") == entry and index.update("missing") is None


def test_index_save_load_roundtrip_and_refusals(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "ünï").write_bytes(b"x" * 100)
    index = FileIndex(root)
    index.refresh()
    saved = tmp_path / "idx"
    index.save(saved)
    loaded = FileIndex.load(saved, root)
    assert loaded.entries() == index.entries() and not loaded.dirty
    loaded.refresh()
    assert loaded.hashed_files == 0  # nothing changed: nothing re-read
    index.save(saved, version=2)  # the JSON lines of version 2 (tampered with below)
    header, *rows = saved.read_text(encoding="utf-8").splitlines()
    assert json.loads(header)["version"] == 2 and len(rows) == 1
    with pytest.raises(IndexFormatError):
        FileIndex.load(saved, tmp_path)  # another root
    for text in (
        json.dumps({"format": "filemq-index", "version": 99, "root": str(root)}) + "\n",
        "not json\n",
        header + "\n" + '["a", 1]\n',
        header + "\n",  # count mismatch
    ):
        saved.write_text(text, encoding="utf-8")
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root)
    with pytest.raises(IndexFormatError):
        FileIndex.load(tmp_path / "missing", root)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []  # atomic save


_NAMES = ["a", "a/b", "", ".", "..", "a/./b", "a/../b", "a//b", "/a", "a/", "C:x", "ab:c"]
_NAMES += ["a\\b", "a\nb", "a\x00", "a\x7f", "é/ü", "..x", "a/.b", "x/.", "./x", "...", "\udcff"]


def test_all_relative_safe_agrees_with_relative_parts() -> None:
    def accepted(name: str) -> bool:
        try:
            relative_parts(name)
        except UnsafePathError:
            return False
        return True

    assert all_relative_safe([])
    for group in itertools.chain(
        ([n] for n in _NAMES), itertools.combinations(_NAMES, 2), itertools.combinations(_NAMES, 3)
    ):
        safe = all_relative_safe(group)
        # one scan per batch; a ':' (maybe a drive letter) is always left to the closer look
        assert safe == all(accepted(n) for n in group) or (
            not safe and any(":" in n for n in group)
        )


def test_index_load_checks_every_column(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "line\u2028sep").write_bytes(b"x")  # kept raw by the JSON encoder: not a newline
    (root / "b").write_bytes(b"y")
    index = FileIndex(root)
    index.refresh()
    saved = tmp_path / "idx"
    index.save(saved, version=2)
    loaded = FileIndex.load(saved, root)
    assert loaded.entries() == index.entries()
    assert loaded.digests() == {e.name: e.sha1 for e in index}
    header, good, *_ = saved.read_text(encoding="utf-8").split("\n")
    sha1 = "0" * 40
    for bad in (
        f'["a", "1", 2, 3, "{sha1}"]',
        f'["a", 1, 2.5, 3, "{sha1}"]',
        f'["a", true, 2, 3, "{sha1}"]',
        f'[1, 1, 2, 3, "{sha1}"]',
        '["a", 1, 2, 3, "abc"]',
        '["a", 1, 2, 3, 4]',
        f'{{"name": "a", "sha1": "{sha1}"}}',
        f'["a", 1, 2, 3, "{sha1}", "extra"]',
    ):
        saved.write_text(f"{header}\n{good}\n{bad}\n", encoding="utf-8")
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root)


def test_refresh_never_follows_a_symlinked_folder(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    (root / "d" / "f").write_bytes(b"f")
    (root / "link").symlink_to(outside, target_is_directory=True)
    index = FileIndex(root)
    assert [e.name for e in index.refresh().changed] == ["d/f"]
    assert index.refresh("link").changed == ()  # a subtree given by name: not followed either
    assert sorted(e.name for e in index) == ["d/f"]


def test_beneath_helpers_never_follow_a_link_below_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d" / "e").mkdir(parents=True)
    outside.mkdir()
    (outside / "victim").write_bytes(b"v")
    (root / "d" / "e" / "f").write_bytes(b"f")
    (root / "out").symlink_to(outside, target_is_directory=True)
    (root / "d" / "back").symlink_to("..", target_is_directory=True)
    with pytest.raises(OutsideRootError, match="symbolic link"):
        open_beneath(root, ("out", "victim"))
    with pytest.raises(OutsideRootError):
        open_beneath(root, ("d", "back", "d", "e", "f"))  # a link, even one leading inside
    with pytest.raises(OutsideRootError, match="not a folder"):
        lstat_beneath(root, ("d", "e", "f", "g"))
    with pytest.raises(FileNotFoundError):
        lstat_beneath(root, ("d", "missing", "g"))
    for bad in ((), ("..", "outside", "victim"), ("d", ".", "e"), ("d", "", "e"), ("a\0b",)):
        with pytest.raises(UnsafePathError):
            open_beneath(root, bad)
    assert stat.S_ISREG(lstat_beneath(root, ("d", "e", "f")).st_mode)
    tmp = tmp_path / "tmp"
    tmp.write_bytes(b"new")
    with pytest.raises(OutsideRootError):
        replace_beneath(str(tmp), root, ("out", "victim"))
    replace_beneath(str(tmp), root, ("n1", "n2", "file"))  # folders made on the way
    assert (root / "n1" / "n2" / "file").read_bytes() == b"new"
    assert remove_beneath(root, ("n1", "n2", "file")) and not (root / "n1").exists()
    with pytest.raises(OutsideRootError):
        remove_beneath(root, ("out", "victim"))
    assert not remove_beneath(root, ("d", "missing"))
    assert remove_beneath(root, ("out",))  # the link itself, not what it points to
    assert (outside / "victim").read_bytes() == b"v"


def test_relative_inside_and_local_parts(tmp_path: Path) -> None:
    (tmp_path / "root" / "state").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "root", target_is_directory=True)
    assert relative_inside(tmp_path / "root", tmp_path / "alias" / "state" / "x") == "state/x"
    assert relative_inside(tmp_path / "alias", tmp_path / "root") == ""
    assert relative_inside(tmp_path / "root", tmp_path / "rootx") is None
    assert local_parts("a\\b/C:/x") == ("a\\b", "C:", "x")  # ordinary names on disk
    for bad in ("", "/a", "a/", "a/../b", "./a", "a\0"):
        with pytest.raises(UnsafePathError):
            local_parts(bad)


def test_an_empty_index_saved_and_loaded_again(tmp_path: Path) -> None:
    """An empty mirror saves an empty index; loading it is not 'tampered' (regression)."""
    root = tmp_path / "root"
    root.mkdir()
    saved = tmp_path / "empty.idx"
    FileIndex(root).save(saved)
    assert len(FileIndex.load(saved, root)) == 0  # raised IndexFormatError before the fix


def _tree_index(tmp_path: Path) -> tuple[Path, FileIndex]:
    root = tmp_path / "root"
    write = {"a": b"1", "d/ünï": b"22", "d/new\nline": b"333", "d/e/f\u2028g": b"4444"}
    for name, data in write.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "empty").mkdir()
    os.symlink("a", root / "link")
    os.chmod(root / "a", 0o600)
    index = FileIndex(root, tree=True)
    index.refresh()
    return root, index


def test_index_version_3_roundtrip_of_names_modes_nodes(tmp_path: Path) -> None:
    root, index = _tree_index(tmp_path)
    saved = tmp_path / "idx"
    index.save(saved)
    assert json.loads(saved.read_bytes().split(b"\n")[0])["version"] == FORMAT_VERSION == 3
    loaded = FileIndex.load(saved, root, tree=True)
    assert loaded.entries() == index.entries() and loaded.nodes() == index.nodes()
    assert loaded.get("a") is not None and loaded.get("a").mode == 0o600  # type: ignore[union-attr]
    assert not loaded.dirty and loaded.loaded
    assert loaded.refresh() == type(loaded.refresh())((), ())  # nothing changed
    assert loaded.hashed_files == 0
    empty = FileIndex(root)
    empty.save(saved)
    assert len(FileIndex.load(saved, root)) == 0


@pytest.mark.parametrize("version", [1, 2])
def test_index_of_an_older_version_loads_and_is_saved_again_as_3(
    tmp_path: Path, version: int, caplog: pytest.LogCaptureFixture
) -> None:
    root, index = _tree_index(tmp_path)
    saved = tmp_path / "idx"
    index.save(saved, version=2)
    if version == 1:  # no nodes, rows without mode
        header, *lines = saved.read_text(encoding="utf-8").rstrip("\n").split("\n")
        head = json.loads(header)
        rows = [json.loads(line) for line in lines[head.pop("nodes") :]]
        head["version"] = 1
        text = "\n".join([json.dumps(head), *(json.dumps(r[:5]) for r in rows)]) + "\n"
        saved.write_text(text, encoding="utf-8")
    with caplog.at_level("INFO", logger="filemq.index"):
        loaded = FileIndex.load(saved, root, tree=True)
    assert f"index version {version} read" in caplog.text
    assert {e.name: e.sha1 for e in loaded} == index.digests()
    assert loaded.dirty  # its owner saves it again, in the current format
    loaded.refresh()
    assert loaded.hashed_files == 0  # (version 1: modes filled in from lstat, not hashed)
    loaded.save(saved)
    again = FileIndex.load(saved, root, tree=True)
    assert again.entries() == index.entries() and not again.dirty


def test_corrupt_version_3_index_is_refused_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from filemq.state import load_index

    root, index = _tree_index(tmp_path)
    saved = tmp_path / "idx"
    index.save(saved)
    good = saved.read_bytes()
    header, rest = good.split(b"\n", 1)
    head = json.loads(header)
    damaged = [
        good[:-1],  # torn: last octet missing
        good + b"\0",  # one octet too many
        good[:-5] + bytes([good[-5] ^ 1]) + good[-4:],  # a SHA-1 bit flipped
        header + b"\n" + rest.replace(b"new", b"nex"),  # a name changed (same length)
        header.replace(b'"entries": 4', b'"entries": 3') + b"\n" + rest,
        json.dumps({**head, "names": head["names"] + 1}).encode() + b"\n" + rest,
        json.dumps({**head, "crc32": "x"}).encode() + b"\n" + rest,
        header + b"\n",
    ]
    for data in damaged:
        saved.write_bytes(data)
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root, tree=True)
        with caplog.at_level("WARNING"):
            rebuilt = load_index(saved, root, tree=True)
        assert len(rebuilt) == 0 and not rebuilt.loaded  # never trusted: made anew
        assert "rebuilt" in caplog.text
        caplog.clear()


def test_version_3_index_with_a_valid_checksum_but_bad_values_is_refused(
    tmp_path: Path,
) -> None:
    """What an adversary who knows the format writes: the checksum matches."""
    import zlib

    root, index = _tree_index(tmp_path)
    saved = tmp_path / "idx"
    for field, value in (("mode", 0o17777), ("mode", -2), ("size", -1)):
        bad = FileIndex(root)
        for entry in index:
            bad.record(entry)
        bad.record(index.get("a")._replace(**{field: value}))  # type: ignore[union-attr]
        bad.save(saved)
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root)
    # names that are not UTF-8, or that hold an extra NUL (one more name than counted)
    index.save(saved)
    header, rest = saved.read_bytes().split(b"\n", 1)
    head = json.loads(header)
    for old, new in ((b"a\0", b"\xff\0"), (b"a\0", b"\0\0")):
        body = rest.replace(old, new, 1)
        head["crc32"] = zlib.crc32(body)
        saved.write_bytes(json.dumps(head).encode() + b"\n" + body)
        with pytest.raises(IndexFormatError):
            FileIndex.load(saved, root, tree=True)


def test_refresh_finds_a_removal_hidden_by_an_addition(tmp_path: Path) -> None:
    """One file gone and one new, the rest unchanged: as many names found as before,
    yet the gone one is reported (the unchanged ones are counted, not kept in a set)."""
    root = tmp_path / "root"
    for i in range(20):
        (root / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 3}" / f"f{i}").write_bytes(b"%d" % i)
    index = FileIndex(root)
    index.refresh()
    (root / "d1" / "f1").unlink()
    (root / "d2" / "new").write_bytes(b"new")
    (root / "d0" / "f0").write_bytes(b"changed")
    delta = index.refresh()
    assert delta.removed == ("d1/f1",)
    assert sorted(e.name for e in delta.changed) == ["d0/f0", "d2/new"]
    assert len(index) == 20 and "d1/f1" not in index
    assert index.refresh() == type(delta)((), ())


def test_version_3_index_with_names_out_of_order_is_refused(tmp_path: Path) -> None:
    """Loaded names are found by bisection: a tampered file whose names are not in
    order (or twice), checksum recomputed, is refused instead of hiding entries."""
    import zlib

    root = tmp_path / "root"
    root.mkdir()
    for name in ("ab", "ba", "ca"):
        (root / name).write_bytes(name.encode())
    index = FileIndex(root)
    index.refresh()
    saved = tmp_path / "idx"
    index.save(saved)
    header, rest = saved.read_bytes().split(b"\n", 1)
    head = json.loads(header)
    for names in (b"ba\0ab\0ca", b"ab\0ab\0ca"):
        body = names + rest[len(names) :]
        head["crc32"] = zlib.crc32(body)
        saved.write_bytes(json.dumps(head).encode() + b"\n" + body)
        with pytest.raises(IndexFormatError, match="out of order"):
            FileIndex.load(saved, root)


def test_a_loaded_index_changed_after_its_load_agrees_with_one_made_anew(
    tmp_path: Path,
) -> None:
    """Entries set, replaced and removed after a load (kept beside the loaded rows):
    look-ups, iteration, a cache taken before the changes (a snapshot), and the index
    saved again all agree with an index built from the disk."""
    root = tmp_path / "root"
    for i in range(60):
        (root / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 4}" / f"f{i:02d}").write_bytes(b"%d" % i)
    index = FileIndex(root)
    index.refresh()
    saved = tmp_path / "idx"
    index.save(saved)
    loaded = FileIndex.load(saved, root)
    before = loaded.digests()
    assert dict(before) == {e.name: e.sha1 for e in index} and len(before) == 60
    (root / "d1" / "f01").unlink()
    (root / "d2" / "f02").write_bytes(b"changed")
    (root / "d3" / "new").write_bytes(b"new")
    os.chmod(root / "d0" / "f00", 0o600)
    delta = loaded.refresh()
    assert delta.removed == ("d1/f01",)
    assert sorted(e.name for e in delta.changed) == ["d0/f00", "d2/f02", "d3/new"]
    assert loaded.hashed_files == 2  # the mode alone is no reason to read again
    loaded.forget("d0/f04")
    assert loaded.update("d0/f04") is not None  # read again from the disk
    fresh = FileIndex(root)
    fresh.refresh()
    assert loaded.entries() == fresh.entries() and len(loaded) == len(fresh) == 60
    assert sorted(loaded, key=lambda e: e.name) == sorted(fresh, key=lambda e: e.name)
    assert "d1/f01" not in loaded and loaded.get("d1/f01") is None
    assert loaded.get("d0/f00").mode == 0o600  # type: ignore[union-attr]
    # the cache taken before is what the index held then
    assert len(before) == 60 and "d1/f01" in before and "d3/new" not in before
    assert before["d2/f02"] == index.get("d2/f02").sha1  # type: ignore[union-attr]
    assert dict(loaded.digests()) == {e.name: e.sha1 for e in fresh}
    loaded.save(saved)
    assert FileIndex.load(saved, root).entries() == fresh.entries()
    # loaded and saved again with no change: the same file
    data = saved.read_bytes()
    FileIndex.load(saved, root).save(saved)
    assert saved.read_bytes() == data


def test_entries_made_for_one_caller_follow_every_later_change(tmp_path: Path) -> None:
    """``entries()`` keeps what it made for the next caller (a server answering many
    resyncs): every kind of change after it shows in the next copy, and a copy
    handed out is the caller's own."""
    root = tmp_path / "root"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / name).write_bytes(name.encode())
    index = FileIndex(root)
    index.refresh()
    index.save(tmp_path / "idx")
    loaded = FileIndex.load(tmp_path / "idx", root)
    first = loaded.entries()
    first.pop("a")  # the caller's copy
    assert sorted(loaded.entries()) == ["a", "b", "c"]
    (root / "b").write_bytes(b"bb")
    (root / "d").write_bytes(b"d")
    loaded.refresh()
    assert sorted(loaded.entries()) == ["a", "b", "c", "d"]
    assert loaded.entries()["b"].sha1 == hashlib.sha1(b"bb").hexdigest()
    loaded.forget("c")
    assert sorted(loaded.entries()) == ["a", "b", "d"]
    entry = loaded.get("a")
    assert entry is not None
    loaded.record(entry._replace(sha1="0" * 40))
    assert loaded.entries()["a"].sha1 == "0" * 40
    (root / "d").unlink()
    loaded.update("d")
    assert sorted(loaded.entries()) == ["a", "b"]


_SAVER = """
import sys
from filemq.index import FileEntry, FileIndex
index = FileIndex(sys.argv[1])
for i in range(5_000):
    index.record(FileEntry(f"d{i % 50}/f{i:05d}", i, i, i, f"{i:040x}", 0o644))
while True:
    index.save(sys.argv[2])
    print("saved", flush=True)
"""


def test_kill_9_mid_save_leaves_the_index_whole_and_its_temp_file_is_removed(
    tmp_path: Path,
) -> None:
    """A saver killed at any moment: the index on disk is a whole one (loaded as it
    was, never a torn one trusted), and the temp file the dead save left (as big as
    the index, one per crash) is removed by the next save (it stayed forever)."""
    import signal
    import subprocess
    import sys

    from filemq.state import load_index

    root, saved = tmp_path / "root", tmp_path / "idx"
    root.mkdir()
    for delay in (0.0, 0.02):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(root), str(saved)], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"saved\n"  # (bounded: the save takes ~0.1 s)
        time.sleep(delay)  # a spread of moments in the next saves, not a synchronisation
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()
        loaded = load_index(saved, root)
        assert loaded.loaded and len(loaded) == 5_000
        assert loaded.get("d7/f04357").sha1 == f"{4357:040x}"  # type: ignore[union-attr]
    dead = tmp_path / f".idx.{proc.pid}.tmp"  # (as a kill mid-write leaves it)
    dead.write_bytes(b"torn")
    alive = tmp_path / f".idx.{os.getpid()}1.tmp.keep"  # not one of its temp files
    alive.write_bytes(b"")
    loaded.save(saved)
    assert not dead.exists() and alive.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".idx." + f"{os.getpid()}1.tmp.keep", "idx", "root"]
    )
