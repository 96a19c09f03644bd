"""End-to-end mirroring over real sockets: server thread + SyncClient in the test thread."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncClient, SyncRefused, SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree

Serve = Callable[..., FileServer]
Sync = Callable[..., SyncResult]


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_mirror_tree_with_big_empty_nested_unicode(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {
        "a.txt": b"alpha\n",
        "empty": b"",
        "nested/deeper/deepest/leaf.bin": os.urandom(70_000),
        "nested/empty-too": b"",
        "ünïcødé/日本語.txt": "héllo wörld".encode(),
        "big.bin": os.urandom(50 << 20),
    }
    write_tree(src, tree)
    os.utime(src / "a.txt", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    server = serve(src)
    result = sync_once(server.endpoint, dest)
    assert result.synced and result.marker
    assert result.files == len(tree) and result.errors == 0
    assert read_tree(dest) == tree
    assert (dest / "a.txt").stat().st_mtime_ns == 1_600_000_000_123_456_789
    assert not [p for p in dest.iterdir() if p.name.startswith(".filemq-part-")]


def test_resync_sends_only_missing_and_changed(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    tree = {f"d{i % 3}/f{i}.txt": f"file {i}\n".encode() * (i + 1) for i in range(30)}
    write_tree(src, tree)
    local = dict(tree)
    del local["d0/f0.txt"], local["d1/f1.txt"]  # missing locally
    local["d2/f2.txt"] = b"stale content"  # changed locally
    write_tree(dest, local)
    server = serve(src)
    result = sync_once(server.endpoint, dest)
    assert result.files == 3  # only the two missing and the one changed file
    assert read_tree(dest) == tree
    again = sync_once(server.endpoint, dest)
    assert again.files == 0 and again.synced and again.marker
    # SHA-1 of each server file computed once, however many clients synced
    assert server.indexes["/"].hashed_files == len(tree)


def test_replace_with_shorter_file_and_delete(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    write_tree(src, {"keep.txt": b"k", "shrink.txt": b"x" * 10_000, "gone.txt": b"bye"})
    server = serve(src)
    idx = tmp_path / "mirror.idx"  # (a known mirror: its deletes need no --delete-extraneous)
    sync_once(server.endpoint, dest, index_path=idx)
    (src / "shrink.txt").write_bytes(b"short")
    (src / "gone.txt").unlink()
    result = sync_once(server.endpoint, dest, index_path=idx)
    assert (result.files, result.deleted) == (1, 1)
    assert (dest / "shrink.txt").read_bytes() == b"short"
    assert sorted(read_tree(dest)) == ["keep.txt", "shrink.txt"]


def test_resync_deletes_local_extras_and_uses_saved_index(
    tmp_path: Path, serve: Serve, sync_once: Sync
) -> None:
    src, dest, idx = tmp_path / "src", tmp_path / "dest", tmp_path / "mirror.idx"
    write_tree(src, {"a": b"1", "b/c": b"2"})
    write_tree(dest, {"extra": b"local only", "b/old": b"old"})
    server = serve(src)
    result = sync_once(server.endpoint, dest, index_path=idx, delete_extraneous=True)
    assert result.deleted == 2 and read_tree(dest) == {"a": b"1", "b/c": b"2"}
    assert idx.exists()
    again = sync_once(server.endpoint, dest, index_path=idx)
    assert again.files == 0 and again.synced


def test_subpath_and_multiple_mounts(tmp_path: Path, serve: Serve, sync_once: Sync) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_tree(a, {"x.txt": b"from a", "sub/y.txt": b"a/sub"})
    write_tree(b, {"z.txt": b"from b"})
    server = serve((a, "/docs"), (b, "/img"))
    everything = sync_once(server.endpoint, tmp_path / "all")
    assert everything.files == 3
    assert read_tree(tmp_path / "all") == {
        "docs/x.txt": b"from a",
        "docs/sub/y.txt": b"a/sub",
        "img/z.txt": b"from b",
    }
    sync_once(server.endpoint, tmp_path / "docs", path="/docs")
    assert read_tree(tmp_path / "docs") == {"x.txt": b"from a", "sub/y.txt": b"a/sub"}
    sync_once(server.endpoint, tmp_path / "sub", path="/docs/sub/")
    assert read_tree(tmp_path / "sub") == {"y.txt": b"a/sub"}


def test_path_not_existing_yet_is_accepted(tmp_path: Path, serve: Serve, sync_once: Sync) -> None:
    write_tree(tmp_path / "src", {"a": b"1"})
    server = serve(tmp_path / "src")
    result = sync_once(server.endpoint, tmp_path / "dest", path="/later/")
    assert result.synced and result.marker and result.files == 0


def test_denied_path_gets_srsly(tmp_path: Path, serve: Serve, sync_once: Sync) -> None:
    tree = {"secret/key": b"s", "secretive/b": b"v", "secret.txt": b"t", "public/a": b"p"}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", deny=["/secret"])
    with pytest.raises(SyncRefused):
        sync_once(server.endpoint, tmp_path / "d1", path="/secret")
    with pytest.raises(SyncRefused):
        sync_once(server.endpoint, tmp_path / "d3", path="/secret/key")
    sync_once(server.endpoint, tmp_path / "d2")
    # never sent, even under "/"; a deny rule ends at a folder boundary: /secretive and
    # /secret.txt are other names and are served
    assert read_tree(tmp_path / "d2") == {k: v for k, v in tree.items() if k != "secret/key"}
    sync_once(server.endpoint, tmp_path / "d4", path="/secretive")
    assert read_tree(tmp_path / "d4") == {"b": b"v"}  # DEST mirrors the path asked for


def test_live_changes_pushed_to_subscribed_clients(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    src, dest, other = tmp_path / "src", tmp_path / "dest", tmp_path / "other"
    write_tree(src, {"docs/a.txt": b"first"})
    server = serve(src)
    clients = [
        SyncClient(zctx, server.endpoint, dest, path="/docs"),
        SyncClient(zctx, server.endpoint, other, path="/elsewhere"),
    ]
    threads = [threading.Thread(target=c.run) for c in clients]
    for t in threads:
        t.start()
    try:
        assert _wait(lambda: (dest / "a.txt").exists())
        (src / "docs" / "new.txt").write_bytes(b"pushed")
        server.notify_changed("/", "docs/new.txt")
        assert _wait(lambda: (dest / "new.txt").exists())
        assert (dest / "new.txt").read_bytes() == b"pushed"
        (src / "docs" / "a.txt").write_bytes(b"second version, longer")
        (src / "docs" / "new.txt").unlink()
        server.notify_changed("/", "docs/a.txt")
        server.notify_deleted("/", "docs/new.txt")
        assert _wait(lambda: not (dest / "new.txt").exists())
        assert _wait(lambda: (dest / "a.txt").read_bytes() == b"second version, longer")
        (src / "docs" / "c.txt").write_bytes(b"found by rescan")
        server.rescan("/")
        assert _wait(lambda: (dest / "c.txt").exists())
        assert read_tree(other) == {}  # a client subscribed elsewhere got nothing
    finally:
        for c in clients:
            c.stop()
        for t in threads:
            t.join(5)
    assert not any(t.is_alive() for t in threads)


def test_slow_client_does_not_block_others(
    tmp_path: Path, serve: Serve, sync_once: Sync, zctx: zmq.Context[Any]
) -> None:
    from filemq import fmq_msg

    src = tmp_path / "src"
    write_tree(src, {"big.bin": os.urandom(8 << 20)})
    server = serve(src, chunk_size=1024)
    slow = zctx.socket(zmq.DEALER)
    slow.linger = 0
    slow.rcvhwm = 1
    slow.connect(server.endpoint)
    try:
        slow.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
        assert slow.poll(5000)
        assert isinstance(fmq_msg.decode(slow.recv_multipart()), fmq_msg.OhaiOk)
        slow.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})))
        slow.send_multipart(fmq_msg.encode(fmq_msg.Nom(1 << 40, 0)))  # and never read again
        assert _wait(lambda: bool(server._stalled))  # its pipe filled up: parked
        result = sync_once(server.endpoint, tmp_path / "good")
        assert result.files == 1 and result.synced
        assert (tmp_path / "good" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    finally:
        slow.close()


@pytest.mark.parametrize("window", [1, 999, 1000, 1001])
def test_credit_windows_around_one_chunk(
    tmp_path: Path, serve: Serve, sync_once: Sync, window: int
) -> None:
    tree = {"f.bin": os.urandom(3_500), "e": b"", "g.bin": os.urandom(1_000)}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", chunk_size=1000)
    result = sync_once(server.endpoint, tmp_path / "dest", window=window)
    assert result.synced and read_tree(tmp_path / "dest") == tree


def test_silent_clients_expire_and_hugz_keeps_alive(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    from filemq import fmq_msg

    (tmp_path / "src").mkdir()
    # the TTL leaves the chatty client (a HUGZ every 0.1 s) 1.4 s of slack for a loaded
    # machine stalling either thread; expiry itself is tested with fake time in the engine
    server = serve(tmp_path / "src", client_ttl=1.5)
    silent, chatty = zctx.socket(zmq.DEALER), zctx.socket(zmq.DEALER)
    try:
        for s in (silent, chatty):
            s.linger = 0
            s.connect(server.endpoint)
            s.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
            assert s.poll(5000) and fmq_msg.decode(s.recv_multipart()) == fmq_msg.OhaiOk()
        assert server.client_count == 2
        deadline = time.monotonic() + 20
        while server.client_count != 1 and time.monotonic() < deadline:
            chatty.send_multipart(fmq_msg.encode(fmq_msg.Hugz()))
            assert chatty.poll(5000)
            assert fmq_msg.decode(chatty.recv_multipart()) == fmq_msg.HugzOk()
            time.sleep(0.1)  # heartbeat period of the chatty client, not synchronisation
        assert server.client_count == 1  # the silent one expired, the chatty one did not
        silent.send_multipart(fmq_msg.encode(fmq_msg.Nom(1, 0)))
        assert silent.poll(5000)
        assert isinstance(fmq_msg.decode(silent.recv_multipart()), fmq_msg.Rtfm)  # forgotten
    finally:
        silent.close()
        chatty.close()


def test_progress_line_on_a_tty(tmp_path: Path, serve: Serve, sync_once: Sync) -> None:
    import io

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    write_tree(tmp_path / "src", {"a": b"x" * 1000, "b": b"y"})
    server = serve(tmp_path / "src")
    out = Tty()
    sync_once(server.endpoint, tmp_path / "dest", progress=out)
    assert "2/2 files: 100%" in out.getvalue() and "B/s" in out.getvalue()


def test_asking_again_for_one_file_rechecks_it(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    import hashlib

    from filemq import fmq_msg

    write_tree(tmp_path / "src", {"d/f": b"version one"})
    server = serve(tmp_path / "src")
    s = zctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(server.endpoint)

    def chunks_until_marker() -> list[fmq_msg.Cheezburger]:
        got: list[fmq_msg.Cheezburger] = []
        while s.poll(5000):
            msg = fmq_msg.decode(s.recv_multipart())
            if isinstance(msg, fmq_msg.Cheezburger):
                if msg.operation == 0:
                    return got
                got.append(msg)
        raise AssertionError("no resync marker")

    try:
        s.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
        s.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/", {"RESYNC": "1"}, {})))
        s.send_multipart(fmq_msg.encode(fmq_msg.Nom(1 << 20, 0)))
        assert [c.chunk for c in chunks_until_marker()] == [b"version one"]
        (tmp_path / "src" / "d" / "f").write_bytes(b"version two, longer")  # no notice
        old = {"/d/f": hashlib.sha1(b"version one").hexdigest()}
        s.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/d/f", {"RESYNC": "1"}, old)))
        again = chunks_until_marker()
        assert [c.chunk for c in again] == [b"version two, longer"]
        assert again[-1].headers["sha1"] == hashlib.sha1(b"version two, longer").hexdigest()
    finally:
        s.close()


def test_saved_index_out_of_date_is_corrected(
    tmp_path: Path, serve: Serve, sync_once: Sync, caplog: pytest.LogCaptureFixture
) -> None:
    """ICANHAZ goes out with the saved index; what DEST really holds is asked for again."""
    src, dest, idx = tmp_path / "src", tmp_path / "dest", tmp_path / "mirror.idx"
    tree = {"a": b"1", "a.bak": b"5", "b/c": b"2", "d": b"4"}
    write_tree(src, tree)
    server = serve(src)
    assert sync_once(server.endpoint, dest, index_path=idx).files == 4
    # behind the saved index's back: a changed, b/c gone, d rewritten alike, extra added
    (dest / "a").write_bytes(b"changed locally")
    (dest / "b" / "c").unlink()
    (dest / "d").unlink()
    (dest / "d").write_bytes(b"4")
    (dest / "extra").write_bytes(b"local only")
    caplog.set_level("DEBUG", logger="filemq.client")
    result = sync_once(server.endpoint, dest, index_path=idx)
    # d too: its content is the same, its mtime is not (rewritten: asked again since
    # session 17, for its mtime; no content travels for it)
    assert "differs from its saved index in 4 files: asking again" in caplog.text
    assert result.synced and (result.files, result.deleted, result.errors) == (2, 1, 0)
    assert read_tree(dest) == tree  # a.bak (under the path "/a" asked for) not sent again
    assert (dest / "d").stat().st_mtime_ns == (src / "d").stat().st_mtime_ns
    assert sync_once(server.endpoint, dest, index_path=idx).files == 0


def test_saved_index_far_out_of_date_resyncs_everything(
    tmp_path: Path, serve: Serve, sync_once: Sync, caplog: pytest.LogCaptureFixture
) -> None:
    src, dest, idx = tmp_path / "src", tmp_path / "dest", tmp_path / "mirror.idx"
    tree = {f"f{i:03d}": b"v1 %d" % i for i in range(80)}
    write_tree(src, tree)
    server = serve(src)
    sync_once(server.endpoint, dest, index_path=idx)
    write_tree(dest, {f"f{i:03d}": b"local %d" % i for i in range(70)})
    (dest / "we\\ird").write_bytes(b"a name no ICANHAZ path may hold")
    caplog.set_level("DEBUG", logger="filemq.client")
    result = sync_once(server.endpoint, dest, index_path=idx)
    assert "differs from its saved index in 71 files: resyncing all" in caplog.text
    assert result.synced and result.files == 70 and result.errors == 0
    assert read_tree(dest) == {**tree, "we\\ird": b"a name no ICANHAZ path may hold"}


def test_unusual_local_name_never_becomes_an_icanhaz_path(
    tmp_path: Path, serve: Serve, sync_once: Sync, caplog: pytest.LogCaptureFixture
) -> None:
    src, dest, idx = tmp_path / "src", tmp_path / "dest", tmp_path / "mirror.idx"
    write_tree(src, {"a": b"1"})
    server = serve(src)
    sync_once(server.endpoint, dest, index_path=idx)
    (dest / "back\\slash").write_bytes(b"x")  # the server would answer SRSLY to that path
    caplog.set_level("DEBUG", logger="filemq.client")
    result = sync_once(server.endpoint, dest, index_path=idx)
    assert "differs from its saved index in 1 files: resyncing all" in caplog.text
    assert result.synced and result.errors == 0


def test_a_resync_planned_slowly_does_not_end_a_mirror_with_nothing(
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ICANHAZ-OK left before the server planned the resync; planning 100,000 files on
    a loaded machine took longer than a mirror's idle timeout (10 s), which then ended
    as with a server that sends no completion marker: exit 0, an empty mirror."""
    src = tmp_path / "src"
    write_tree(src, {"a": b"1", "d/b": b"22"})
    plan = FileServer._subscribe

    def slow(self: FileServer, *args: Any) -> None:
        time.sleep(1.0)  # the planning of a big tree (a fault made, not a synchronisation)
        plan(self, *args)

    monkeypatch.setattr(FileServer, "_subscribe", slow)
    server = serve(src)
    result = sync_once(server.endpoint, tmp_path / "d", idle_timeout=0.4)
    assert result.synced
    assert read_tree(tmp_path / "d") == read_tree(src)
