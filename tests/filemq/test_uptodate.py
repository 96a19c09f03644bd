"""A no-change resync answered from the server's own encoding (``filemq.uptodate``), and
every change that must still reach a mirror once that answer has been given."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import client, uptodate
from filemq.client import SyncClient, SyncResult
from filemq.index import FileIndex
from filemq.live import LiveFileServer
from filemq.server import Mount
from tests.polling import wait_until

from .conftest import read_tree, write_tree

WAIT = 30.0


@pytest.fixture
def live(zctx: zmq.Context[Any], loopback: str) -> Iterator[Callable[..., LiveFileServer]]:
    servers: list[LiveFileServer] = []

    def start(src: Path, virtual: str = "/", **kwargs: Any) -> LiveFileServer:
        kwargs.setdefault("endpoint", loopback)
        server = LiveFileServer(zctx, [Mount(src, virtual)], **kwargs)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _sync(zctx: zmq.Context[Any], endpoint: str, dest: Path, **kwargs: Any) -> SyncResult:
    kwargs.setdefault("index_path", dest.parent / f"{dest.name}.idx")
    kwargs.setdefault("connect_timeout", 10.0)
    kwargs.setdefault("idle_timeout", 10.0)
    return SyncClient(zctx, endpoint, dest, once=True, **kwargs).run()


def _tree(n: int) -> dict[str, bytes]:
    return {f"d{i % 5}/sub{i % 2}/f{i:03d}.txt": b"content %d" % i for i in range(n)}


def _modes(root: Path) -> dict[str, tuple[int, int]]:
    """Permission bits of every file and folder, and the mtime of every file (what a
    mirror keeps besides contents; a folder's own mtime is not kept)."""
    out = {}
    for folder, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            if not name.startswith(".filemq"):
                path = os.path.join(folder, name)
                st = os.stat(path)
                mtime = 0 if name in dirs else st.st_mtime_ns
                out[os.path.relpath(path, root)] = (st.st_mode & 0o777, mtime)
    return out


def test_a_no_change_resync_from_a_mirror_is_answered_without_a_plan(
    tmp_path: Path, zctx: zmq.Context[Any], live: Callable[..., LiveFileServer]
) -> None:
    """The octets a mirror sends (cache in name order from its saved index, ATTRS lines)
    are the ones the server writes from its index: a mirror that changed nothing is
    answered by one comparison (a drift between the two encodings would silently cost
    the full plan again: 1 s of server CPU for 100,000 files)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, _tree(60))
    os.chmod(src / "d1" / "sub1" / "f001.txt", 0o600)
    os.chmod(src / "d2", 0o750)
    server = live(src).server
    first = _sync(zctx, server.endpoint, dest)
    assert first.files == 60 and server.resyncs_up_to_date == 0
    again = _sync(zctx, server.endpoint, dest)
    assert again.marker and again.files == 0 and again.deleted == 0
    assert server.resyncs_up_to_date == 1
    plain = _sync(zctx, server.endpoint, dest, index_path=None)  # (re-read whole)
    assert plain.files == 0 and server.resyncs_up_to_date == 1  # no saved index: planned
    assert read_tree(dest) == read_tree(src) and _modes(dest) == _modes(src)


def test_a_subscription_below_a_mount_and_a_mirror_of_another_mount_are_planned(
    tmp_path: Path, zctx: zmq.Context[Any], live: Callable[..., LiveFileServer]
) -> None:
    src = tmp_path / "src"
    write_tree(src, _tree(20))
    server = live(src, "/pub").server
    for path, dest in (("/pub/", tmp_path / "whole"), ("/pub/d1/", tmp_path / "part")):
        _sync(zctx, server.endpoint, dest, path=path)
        assert _sync(zctx, server.endpoint, dest, path=path).files == 0
    assert server.resyncs_up_to_date == 1  # the whole mount only
    assert read_tree(tmp_path / "part") == read_tree(src / "d1")


@pytest.mark.parametrize(
    "change",
    ["content", "same-size content", "mode", "mtime", "new file", "delete", "new folder",
     "folder mode", "delete folder"],
)  # fmt: skip
def test_a_change_on_the_server_after_an_up_to_date_answer_reaches_the_next_resync(
    tmp_path: Path, zctx: zmq.Context[Any], live: Callable[..., LiveFileServer], change: str
) -> None:
    """The server's encoding of its index is kept until an entry changes: a change seen
    by the watcher after a no-change answer must make the next resync send it (a kept
    encoding that outlived its index would tell that mirror it is up to date forever)."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {**_tree(30), "e/empty/.keep": b""})
    server = live(src).server
    _sync(zctx, server.endpoint, dest)
    _sync(zctx, server.endpoint, dest)
    assert server.resyncs_up_to_date == 1  # the encoding is made and kept
    target = src / "d3" / "sub1" / "f003.txt"
    if change == "content":
        target.write_bytes(b"a longer content than before")
    elif change == "same-size content":
        stat = target.stat()
        target.write_bytes(b"CONTENT 3")
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # (rsync would miss it)
    elif change == "mode":
        os.chmod(target, 0o640)
    elif change == "mtime":
        os.utime(target, ns=(1_000_000_000, 1_000_000_000))
    elif change == "new file":
        (src / "d0" / "new.txt").write_bytes(b"new")
    elif change == "delete":
        target.unlink()
    elif change == "new folder":
        (src / "d4" / "new-folder").mkdir()
    elif change == "folder mode":
        os.chmod(src / "d2", 0o700)
        server.rescan()  # (the watcher does not report a folder's chmod: the rescan does)
    else:
        (src / "e" / "empty" / ".keep").unlink()
        (src / "e" / "empty").rmdir()

    def mirrored() -> bool:  # (the watcher takes a moment: ask again until it is seen)
        _sync(zctx, server.endpoint, dest)
        return read_tree(dest) == read_tree(src) and _modes(dest) == _modes(src)

    assert wait_until(mirrored, WAIT, step=0.05)
    before = server.resyncs_up_to_date
    _sync(zctx, server.endpoint, dest)
    assert server.resyncs_up_to_date == before + 1  # and a new encoding says so again


@pytest.mark.parametrize("copy_below", [client._COPY_BELOW, 0], ids=["copied", "handed-over"])
def test_a_mirror_changed_behind_its_saved_index_is_repaired(
    tmp_path: Path,
    zctx: zmq.Context[Any],
    live: Callable[..., LiveFileServer],
    monkeypatch: pytest.MonkeyPatch,
    copy_below: int,
) -> None:
    """The ICANHAZ goes out with the saved index (up to date as far as it knows) while
    DEST is checked: what the check finds changed is asked for again, a mode or an
    mtime changed alone too (before session 17 those two stayed: the ICANHAZ had told
    the saved ones and only a changed SHA-1 was asked again).  Both ways the
    ICANHAZ can leave: copied into libzmq's memory (a small DEST: nothing waits for it
    to leave) and handed over as it is (a big one: tracked, the index loaded once it
    has gone)."""
    monkeypatch.setattr(client, "_COPY_BELOW", copy_below)
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, _tree(30))
    server = live(src).server
    _sync(zctx, server.endpoint, dest)
    (dest / "d0" / "sub0" / "f000.txt").write_bytes(b"local damage")
    (dest / "d1" / "sub1" / "f001.txt").unlink()
    (dest / "d2" / "sub0" / "f002.txt").chmod(0o600)  # content the same: mode only
    os.utime(dest / "d3" / "sub1" / "f003.txt", ns=(10**18, 10**18))  # mtime only
    _sync(zctx, server.endpoint, dest)
    assert read_tree(dest) == read_tree(src)
    assert _modes(dest) == _modes(src)


def test_the_encoding_the_server_expects_is_the_one_a_mirror_sends(tmp_path: Path) -> None:
    """``cache_octets`` of an index is the ICANHAZ cache field the client encodes from
    the same index saved and loaded (names in order), whatever order entries were set."""
    from filemq import fmq_msg

    root = tmp_path / "root"
    write_tree(root, {"b.txt": b"b", "a/c.txt": b"c", "a/b.txt": b"ab", "é.txt": b"e"})
    index = FileIndex(root, tree=True)
    index.refresh()
    index.save(tmp_path / "i.idx")
    loaded = FileIndex.load(tmp_path / "i.idx", root, tree=True)
    frame = fmq_msg.encode(fmq_msg.Icanhaz("/", {}, loaded.digests()))[0]
    assert bytes(frame).endswith(uptodate.cache_octets(index))
    assert uptodate.cache_octets(index) == uptodate.cache_octets(loaded)
    assert uptodate.attrs_texts(index, 0o777) == uptodate.attrs_texts(loaded, 0o777)
    (root / "a" / "0.txt").write_bytes(b"sorts first, set after the load")
    (root / "b.txt").write_bytes(b"changed")
    for each in (index, loaded):  # (rows and entries set since, merged in name order)
        each.refresh()
    assert uptodate.cache_octets(index) == uptodate.cache_octets(loaded)
    assert uptodate.attrs_texts(index, 0o755) == uptodate.attrs_texts(loaded, 0o755)
    names = [line.split("\t")[0] for line in uptodate.attrs_texts(loaded, 0o755)[0].split("\n")]
    assert names == sorted(names) == sorted(loaded.names())


def _admitted(tree: dict[str, bytes], hidden: tuple[str, ...]) -> dict[str, bytes]:
    return {name: data for name, data in tree.items() if name not in hidden}


@pytest.mark.parametrize(
    "patterns",
    [["*.tmp", "build/"], ["*.log", "d1/sub0/", "f00[0-1].txt"]],
    ids=["leave-out-nothing-held", "leave-out-files-and-a-folder"],
)
def test_a_mirror_with_patterns_is_answered_without_a_plan_and_repaired(
    tmp_path: Path,
    zctx: zmq.Context[Any],
    live: Callable[..., LiveFileServer],
    patterns: list[str],
) -> None:
    """A mirror's patterns (``FILTER``) leave names out of its cache and ``ATTRS``: the
    server compares them with its encodings made without those names (before session
    18 any pattern made it plan every file: ~0.5 s of server CPU for 100,000 names,
    which a 100,000-file `sync --exclude ...` waited for).  What differs is still sent:
    a change on the server to a name the patterns admit, a file gone or damaged in DEST;
    a change to a name they leave out is not."""
    from filemq.filters import Filters

    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {**_tree(40), "d1/sub0/x.log": b"log", "e/f.log": b"log too"}
    write_tree(src, tree)
    hidden: tuple[str, ...] = ()  # (worked out by hand: every d1/sub0/ file, *.log, f000/f001)
    if "*.log" in patterns:
        hidden = (*(n for n in tree if n.startswith("d1/sub0/")), "e/f.log", "d0/sub0/f000.txt")
        hidden = (*hidden, "d1/sub1/f001.txt")
    server = live(src).server
    filters = Filters(patterns)
    first = _sync(zctx, server.endpoint, dest, filters=filters)
    assert first.files == len(_admitted(tree, hidden))
    assert read_tree(dest) == _admitted(tree, hidden) and server.resyncs_up_to_date == 0
    again = _sync(zctx, server.endpoint, dest, filters=filters)
    assert again.marker and (again.files, again.deleted) == (0, 0)
    assert server.resyncs_up_to_date == 1
    # a change the mirror takes, one it leaves out, damage in DEST
    (src / "d2" / "sub0" / "f002.txt").write_bytes(b"changed on the server")
    (src / "e" / "f.log").write_bytes(b"changed, left out by *.log")
    (dest / "d3" / "sub1" / "f003.txt").unlink()
    expected = _admitted({**read_tree(src)}, hidden)

    def mirrored() -> bool:  # (the watcher takes a moment: ask again until it is seen)
        _sync(zctx, server.endpoint, dest, filters=filters)
        return read_tree(dest) == expected

    assert wait_until(mirrored, WAIT, step=0.05)
    before = server.resyncs_up_to_date
    assert _sync(zctx, server.endpoint, dest, filters=filters).files == 0
    assert server.resyncs_up_to_date == before + 1
    assert _modes(dest) == {k: v for k, v in _modes(src).items() if k in _modes(dest)}


def test_what_the_server_keeps_for_mirrors_patterns_is_bounded(
    tmp_path: Path, zctx: zmq.Context[Any], live: Callable[..., LiveFileServer]
) -> None:
    """Each pattern list that leaves names out costs the server its own encodings
    (~12 MiB for 100,000 files) until the index changes: past the first few lists,
    a mirror's no-change resync is planned file by file (the same answer, no more
    memory); a change on the server starts the count again."""
    from filemq import server as server_module
    from filemq.filters import Filters

    src = tmp_path / "src"
    write_tree(src, _tree(20))
    server = live(src).server
    kept = server_module._PATTERN_LISTS_KEPT
    lists = [Filters([f"f00{i}.txt"]) for i in range(kept + 1)]
    for i, filters in enumerate(lists):
        dest = tmp_path / f"dest{i}"
        _sync(zctx, server.endpoint, dest, filters=filters)
        before = server.resyncs_up_to_date
        again = _sync(zctx, server.endpoint, dest, filters=filters)
        assert again.marker and (again.files, again.deleted) == (0, 0)
        assert server.resyncs_up_to_date == before + (1 if i < kept else 0)
        assert f"d{i}/sub{i % 2}/f00{i}.txt" not in read_tree(dest)
    (src / "d0" / "new.txt").write_bytes(b"new")  # (the index changes: nothing kept)
    last = tmp_path / f"dest{kept}"

    def mirrored() -> bool:  # (the watcher takes a moment: ask again until it is seen)
        _sync(zctx, server.endpoint, last, filters=lists[-1])
        return (last / "d0" / "new.txt").exists()

    assert wait_until(mirrored, WAIT, step=0.05)
    before = server.resyncs_up_to_date
    _sync(zctx, server.endpoint, last, filters=lists[-1])
    assert server.resyncs_up_to_date == before + 1
