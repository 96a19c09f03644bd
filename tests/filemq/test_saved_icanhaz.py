"""The first ICANHAZ of a ``filemq sync`` is made from a ``SavedIndex`` view of the saved
index (rows read a slice at a time from the file), and the index is loaded once that
frame has left: the mirror never holds the loaded index and the ICANHAZ frame at once
(100,000 files: peak RSS 52.6 -> ~41 MiB, docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from filemq import fmq_msg
from filemq.client import _attrs_text, _file_lines
from filemq.index import FileIndex, IndexFormatError, SavedIndex
from filemq.meta import LinkPolicy
from filemq.server import FileServer

from .conftest import read_tree, write_tree


def _tree(root: Path, count: int, folders: int = 40) -> None:
    """``count`` small files in ``folders`` folders (names of 22 characters), a link."""
    for i in range(folders):
        (root / f"dir{i:04d}").mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (root / f"dir{i % folders:04d}" / f"file{i:06d}.dat").write_bytes(b"%d" % i)
    (root / "link").symlink_to("dir0000")


def _saved(tmp_path: Path, count: int) -> tuple[Path, Path, FileIndex]:
    root = tmp_path / "root"
    _tree(root, count)
    index = FileIndex(root, tree=True)
    index.refresh()
    path = tmp_path / "idx"
    index.save(path)
    return root, path, FileIndex.load(path, root, tree=True)


@pytest.mark.parametrize("count", [0, 1, 5_000])
def test_the_view_reads_what_the_loaded_index_holds(tmp_path: Path, count: int) -> None:
    """Names (across slices of 64 KiB), SHA-1s, modes, mtimes, folders and links: the
    view says what ``FileIndex.load`` gives; look-ups find each name and no other."""
    root, path, loaded = _saved(tmp_path, count)
    view = SavedIndex.read(path, root)
    assert view is not None
    try:
        assert len(view) == len(loaded) == count
        digests = view.digests()
        assert list(digests.items()) == list(loaded.digests().items())
        assert list(digests) == sorted(loaded.digests())
        assert list(view.stamps()) == list(loaded.stamps(ordered=True))
        assert view.nodes() == loaded.nodes() and "link" in view.nodes()
        for name in list(loaded.digests())[:: max(1, count // 50)]:
            assert digests[name] == loaded.digests()[name]
        for absent in ("", "dir0000", "zzz", "dir0000/file", "dir0000/file000000.dat~"):
            assert absent not in digests
        text = _attrs_text(view, "/", "/", LinkPolicy.LINKS)
        assert text == _attrs_text(loaded, "/", "/", LinkPolicy.LINKS)
    finally:
        view.close()


def test_attrs_lines_from_runs_are_the_loaded_index_lines(tmp_path: Path) -> None:
    """The first ICANHAZ's ATTRS is made from the view's columns a run at a time (one mode
    text per mode, C-level joins): the same text as the loaded index's line per file,
    with many modes, and with names holding a tab or a line break left out (their runs
    made a line at a time)."""
    root = tmp_path / "root"
    root.mkdir()
    for i in range(6_000):
        (root / f"f{i:05d}").write_bytes(b"")
        os.chmod(root / f"f{i:05d}", 0o600 + i % 64)  # (every run holds several modes)
    for odd in ("tab\there", "line\nbreak"):
        (root / odd).write_bytes(b"odd")
    index = FileIndex(root, tree=True)
    index.refresh()
    path = tmp_path / "idx"
    index.save(path)
    view = SavedIndex.read(path, root)
    assert view is not None
    try:
        text = _attrs_text(view, "/", "/", LinkPolicy.SKIP)
    finally:
        view.close()
    loaded = FileIndex.load(path, root, tree=True)
    assert text == _attrs_text(loaded, "/", "/", LinkPolicy.SKIP)
    lines = text.split("\n")
    assert len(lines) == 6_000 and "f00063\tf\t677\t" in text
    assert not any(line.startswith(("tab", "line", "break")) for line in lines)


def test_attrs_lines_leave_out_a_file_whose_mode_is_not_known() -> None:
    """A row whose mode is -1 (a version 1 index) is left out of a run, as of a line."""
    lines = _file_lines(["a", "b", "c"], array("i", [0o644, -1, 0o600]), array("q", [1, 2, 3]))
    assert lines == "a\tf\t644\t1\nc\tf\t600\t3"


def test_a_long_name_spans_slices(tmp_path: Path) -> None:
    """A slice ends after the last whole name it holds: names around a cut, and a run of
    names longer than a slice, read whole."""
    root = tmp_path / "root"
    names = [f"d{i:03d}/" + "x" * 200 + f"{i:05d}" for i in range(800)]  # ~170 KiB of names
    write_tree(root, {name: name.encode() for name in names})
    index = FileIndex(root)
    index.refresh()
    index.save(tmp_path / "idx")
    view = SavedIndex.read(tmp_path / "idx", root)
    assert view is not None
    try:
        assert list(view.digests()) == sorted(names)
        assert dict(view.digests().items()) == dict(index.digests().items())
    finally:
        view.close()


def test_no_view_of_a_damaged_foreign_or_older_file(tmp_path: Path) -> None:
    """A torn or damaged file (length, checksum), another root, version 2, a names part
    that holds another count of names (checksum recomputed), a missing file: no view
    (the loader says why, and the mirror loads or rebuilds as before)."""
    root, path, loaded = _saved(tmp_path, 300)
    data = path.read_bytes()
    header, body = data.split(b"\n", 1)
    head = json.loads(header)
    extra = body.replace(b"\0", b"\0\0", 1)
    head_extra = {**head, "crc32": zlib.crc32(extra)}
    cases = {
        "torn": data[:-7],
        "damaged": data[:-30] + bytes(30),
        "extra name": json.dumps(head_extra).encode() + b"\n" + extra,
        "foreign": json.dumps({**head, "root": "/elsewhere"}).encode() + b"\n" + body,
    }
    for what, bad in cases.items():
        path.write_bytes(bad)
        assert SavedIndex.read(path, root) is None, what
        with pytest.raises(IndexFormatError):
            FileIndex.load(path, root)
    loaded.save(path, version=2)
    assert SavedIndex.read(path, root) is None
    assert len(FileIndex.load(path, root)) == 300
    assert SavedIndex.read(tmp_path / "missing", root) is None


def test_a_saved_index_the_loader_refuses_after_its_cache_went_is_fetched_whole(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., object],
) -> None:
    """The adversary's index: names out of order, checksum recomputed.  The view
    (length and checksum only) sends its cache -- which claims a file DEST lacks --, the
    loader then refuses the file: the mirror asks for everything again, and DEST ends
    exact (the file the cache claimed is fetched)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {"ab": b"ab", "ba": b"ba", "ca": b"ca"}
    write_tree(src, tree)
    server = serve(src)
    first = sync_once(server.endpoint, dest, index_path=tmp_path / "idx")
    assert first.synced and read_tree(dest) == tree  # type: ignore[attr-defined]
    (dest / "ba").unlink()  # the saved index still says DEST has it
    data = (tmp_path / "idx").read_bytes()
    header, body = data.split(b"\n", 1)
    head = json.loads(header)
    nodes = b"".join(body.splitlines(keepends=True)[: head["nodes"]])
    rows = body[len(nodes) :]
    swapped = b"ba\0ab\0ca" + rows[len(b"ab\0ba\0ca") :]
    head["crc32"] = zlib.crc32(swapped, zlib.crc32(nodes))
    (tmp_path / "idx").write_bytes(json.dumps(head).encode() + b"\n" + nodes + swapped)
    view = SavedIndex.read(tmp_path / "idx", dest)
    assert view is not None and "ba" in list(view.digests())
    view.close()
    with pytest.raises(IndexFormatError, match="out of order"):
        FileIndex.load(tmp_path / "idx", dest)
    again = sync_once(server.endpoint, dest, index_path=tmp_path / "idx", delete_extraneous=True)
    assert again.synced and read_tree(dest) == tree  # type: ignore[attr-defined]


_TRACED_SYNC = """
import sys, tracemalloc
import zmq, filemq.cli, filemq.client, filemq.fmq_msg, filemq.index, filemq.mirror
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
sys.argv = ["filemq", "-q", "sync", *sys.argv[1:]]
try:
    code = filemq.cli.main()
finally:
    print("PEAK", tracemalloc.get_traced_memory()[1] - base, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
def test_a_no_change_resync_never_holds_the_loaded_index_and_the_icanhaz_at_once(
    tmp_path: Path, serve: Callable[..., FileServer]
) -> None:
    """A real ``filemq sync --once`` process (tracemalloc, bytes traced above what its
    imports hold) resyncs 20,000 files its saved index lists (DEST made a copy of the
    source, mtimes kept): its peak stays below the loaded index plus the ICANHAZ frame
    it sends.  Before, it held both, the ATTRS text and a join of every name beside
    them."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    _tree(src, 20_000)
    _tree(dest, 20_000)
    for folder in src.iterdir():
        if folder.is_dir() and not folder.is_symlink():
            for path in folder.iterdir():
                st = path.stat()
                os.utime(dest / folder.name / path.name, ns=(st.st_atime_ns, st.st_mtime_ns))
    index_path = tmp_path / "dest.idx"
    made = FileIndex(dest, tree=True)
    made.refresh()
    made.save(index_path)
    server = serve(src)
    tracemalloc.start()
    try:
        held = FileIndex.load(index_path, dest, tree=True)
        index_octets = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    options = {"RESYNC": "1", "ATTRS": _attrs_text(held, "/", "/", LinkPolicy.SKIP)}
    frame = fmq_msg.encode(fmq_msg.Icanhaz("/", options, dict(held.digests().items())))[0]
    cmd = [sys.executable, "-c", _TRACED_SYNC, server.endpoint, str(dest), "--once"]
    cmd += ["--index", str(index_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    peak = int(done.stderr.rsplit("PEAK", 1)[1].split()[0])
    assert peak < index_octets + len(frame), (peak, index_octets, len(frame))
    assert read_tree(dest) == read_tree(src)
