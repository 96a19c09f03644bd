"""Metadata against other peers: a hostile server, a server that sends no metadata, the
reference-like client, and a mirror without privileges over files of mode 000."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from filemq.client import SyncResult
from filemq.index import FileIndex
from filemq.meta import EntryMeta
from filemq.mirror import Mirror
from filemq.server import FileServer

from . import test_live, test_malicious_server, test_unreadable
from .conftest import read_tree, write_tree
from .reference_client import ReferenceLikeClient

scripted = test_malicious_server.scripted  # (the fixture: a scripted, hostile server)
shared_dir = test_unreadable.shared_dir  # (the fixture: a folder `nobody` can use)
MARKER = test_malicious_server.MARKER
Sync = Callable[..., SyncResult]


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _file(
    name: str, data: bytes, **headers: str
) -> tuple[int, str, int, int, dict[str, str], bytes]:
    return (1, name, 0, 1, {"sha1": _sha1(data), "size": str(len(data)), **headers}, data)


def _entry(name: str, **headers: str) -> tuple[int, str, int, int, dict[str, str], bytes]:
    return (1, name, 0, 1, dict(headers), b"")


def test_hostile_metadata_is_refused_and_nothing_escapes(
    tmp_path: Path, scripted: Any, sync_once: Sync
) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.mkdir()
    (outside / "target").write_bytes(b"outside")
    script = [
        _file("/all-bits", b"x", mode="7777", mtime_ns="1000000000"),  # setuid etc stripped
        _file("/bad-mode", b"x", mode="rwxrwxrwx"),
        _file("/big-mode", b"x", mode="77777"),
        _file("/bad-mtime", b"x", mtime_ns="99999999999999999999999999"),
        _file("/neg-mode", b"x", mode="-1"),
        _entry("/up", kind="symlink", target="../outside/target"),
        _entry("/abs", kind="symlink", target=str(outside / "target")),
        _entry("/sub/hop", kind="symlink", target="x/../../../outside"),
        _entry("/dot", kind="symlink", target="./../outside"),
        _entry("/nul", kind="symlink", target="a\x00b"),
        _entry("/weird", kind="blockdevice"),
        _entry("/empty-dir", kind="dir"),
        (1, "/data-dir", 0, 1, {"kind": "dir"}, b"payload"),
        _entry("/ok-link", kind="symlink", target="all-bits"),
        _entry("/d", kind="dir", mode="7777"),
        MARKER,
    ]
    server = scripted(lambda n, req: script if n == 1 else [MARKER])
    result = sync_once(server.endpoint, dest, links=_links())
    assert result.synced
    assert result.refused == 11 and result.errors == 11  # each refused entry said so
    assert stat.S_IMODE((dest / "all-bits").stat().st_mode) == 0o777
    assert (dest / "all-bits").stat().st_mtime_ns == 1_000_000_000
    assert os.readlink(dest / "ok-link") == "all-bits"
    assert stat.S_IMODE((dest / "d").stat().st_mode) == 0o777  # (0o7777 without special bits)
    assert (dest / "empty-dir").is_dir()
    left = {p.relative_to(dest).as_posix() for p in dest.rglob("*")}
    assert left == {"all-bits", "ok-link", "d", "empty-dir"}
    assert (outside / "target").read_bytes() == b"outside"
    assert [p.name for p in outside.iterdir()] == ["target"]


def _links() -> Any:
    from filemq.meta import LinkPolicy

    return LinkPolicy.LINKS


def test_a_server_without_metadata_still_mirrors(
    tmp_path: Path, scripted: Any, sync_once: Sync
) -> None:
    """No mode, no kind, no attrs: files as before, and deletes prune emptied folders."""
    dest = tmp_path / "dest"
    first = [_file("/a/b/c.txt", b"c"), _file("/top.txt", b"t"), MARKER]
    second = [(2, "/a/b/c.txt", 0, 1, {}, b""), MARKER]
    server = scripted(lambda n, req: first if n == 1 else second)
    idx = tmp_path / "idx"
    assert sync_once(server.endpoint, dest, index_path=idx).errors == 0
    assert read_tree(dest) == {"a/b/c.txt": b"c", "top.txt": b"t"}
    assert stat.S_IMODE((dest / "top.txt").stat().st_mode) == 0o666 & ~_umask()
    options = server.icanhaz[0].options
    assert options["META"] == "777" and "ATTRS" in options  # asked, never answered
    assert sync_once(server.endpoint, dest, index_path=idx).deleted == 1
    assert read_tree(dest) == {"top.txt": b"t"} and not (dest / "a").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_reference_like_client_gets_files_only(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """Folders and links are never sent to a client that did not ask (it would write them
    as empty files); the mode header it ignores."""
    src = tmp_path / "src"
    write_tree(src, {"a.txt": b"alpha", "d/b.txt": b"beta"})
    (src / "empty").mkdir()
    os.symlink("a.txt", src / "link")
    (src / "a.txt").chmod(0o600)
    server = serve(src, wire="czmq")
    client = ReferenceLikeClient(zctx, server.endpoint, tmp_path / "inbox")
    try:
        client.subscribe("/", resync=True)
        client.pump(lambda: len(client.delivered) >= 2, timeout=10)
        client.pump(lambda: False, timeout=0.5)  # anything more would arrive now
    finally:
        client.close()
    assert sorted(client.delivered) == ["a.txt", "d/b.txt"]
    assert read_tree(tmp_path / "inbox") == {"a.txt": b"alpha", "d/b.txt": b"beta"}


def test_mode_000_on_the_mirror_never_blocks_updates(shared_dir: Path) -> None:
    """Without privileges: a file of mode 000 is replaced by its next version, and its
    mode and mtime changed, through the mirror."""
    dest = shared_dir / "dest"
    dest.mkdir()
    dest.chmod(0o777)

    def as_mirror() -> tuple[int, bytes, int, int]:
        mirror = Mirror(dest, FileIndex(dest, tree=True))
        zero = EntryMeta(mode=0o000, mtime_ns=5)
        for data in (b"one", b"two, longer"):
            ok, why = mirror.place(
                ("f",),
                str(dest / "f"),
                data,
                {"sha1": _sha1(data), "size": str(len(data))},
                zero,
            )
            assert ok, why
        assert stat.S_IMODE((dest / "f").stat().st_mode) == 0
        entry = mirror.index.get("f")
        assert entry is not None
        touched = mirror.touch(("f",), EntryMeta(mode=0o640, mtime_ns=7), entry.sha1, entry.size)
        mirror.make_dir(("locked",), 0o000)
        ok, why = mirror.place(
            ("locked", "in"), str(dest / "locked" / "in"), b"i", {"sha1": _sha1(b"i")}, zero
        )
        assert ok, why
        st = (dest / "f").stat()
        return int(touched), (dest / "f").read_bytes(), stat.S_IMODE(st.st_mode), st.st_mtime_ns

    touched, data, mode, mtime = test_unreadable._as_server_user(as_mirror)
    assert (touched, data, mode, mtime) == (1, b"two, longer", 0o640, 7)
    assert stat.S_IMODE((dest / "locked").stat().st_mode) == 0o700  # the owner keeps rwx


live = test_live.live  # (the fixtures: a watching server, and subscribers)
subscribe = test_live.subscribe


def test_live_mirror_follows_modes_folders_and_links(
    tmp_path: Path, live: Callable[..., Any], subscribe: Callable[..., Any]
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"a.txt": b"a"})
    server = live(src)
    sub = subscribe(server.endpoint, dest, links=_links())
    assert sub.wait_synced(test_live.WAIT)
    wait = test_live.wait_until

    (src / "a.txt").chmod(0o600)
    assert wait(lambda: stat.S_IMODE((dest / "a.txt").stat().st_mode) == 0o600)
    os.utime(src / "a.txt", ns=(7, 7))
    assert wait(lambda: (dest / "a.txt").stat().st_mtime_ns == 7)
    (src / "empty").mkdir()  # a folder that stays empty
    assert wait(lambda: (dest / "empty").is_dir())
    os.symlink("a.txt", src / "link")
    assert wait(lambda: (dest / "link").is_symlink() and os.readlink(dest / "link") == "a.txt")
    (src / "empty").rmdir()
    assert wait(lambda: not (dest / "empty").exists())
    (src / "link").unlink()
    assert wait(lambda: not os.path.lexists(dest / "link"))


def test_a_refetch_keeps_the_mirrors_patterns_rooted_at_dest(
    tmp_path: Path, live: Callable[..., Any], subscribe: Callable[..., Any], caplog: Any
) -> None:
    """An ICANHAZ asking again for one name (a local change repaired) is matched against
    the mirror's patterns from DEST, not from that name: an anchored pattern still holds."""
    import logging

    from filemq.filters import Filters

    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"sub/x.log": b"excluded", "sub/x.txt": b"taken"})
    server = live(src)
    sub = subscribe(server.endpoint, dest, filters=Filters(["/sub/x.log"]), check_interval=0.05)
    assert sub.wait_synced(test_live.WAIT)
    assert read_tree(dest) == {"sub/x.txt": b"taken"}
    caplog.set_level(logging.INFO, logger="filemq.server")
    (dest / "sub" / "x").write_bytes(b"local")  # repaired: ICANHAZ /sub/x covers x.log too
    assert test_live.wait_until(lambda: not (dest / "sub" / "x").exists())
    assert test_live.wait_until(lambda: "resync of /sub/x queues" in caplog.text)
    queued = [
        r.getMessage() for r in caplog.records if "resync of /sub/x queues" in r.getMessage()
    ]
    assert queued and all(m.endswith("queues 1 operations") for m in queued), queued
    assert read_tree(dest) == {"sub/x.txt": b"taken"}
