"""No path escapes its root: a real server, real sockets, symlinks planted to lead out.

The hostile side here is a peer (or a local user) who plants or swaps symbolic links
inside a published directory or a mirror's DEST and then asks for, announces or
deletes names that go through them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg
from filemq.client import SyncClient
from filemq.engine import Operation
from filemq.events import EventKind, MirrorEvent
from filemq.index import FileEntry, FileIndex, IndexFormatError
from filemq.server import FileServer
from filemq.state import load_index, server_index_path

from .conftest import read_tree, write_tree

Serve = Callable[..., FileServer]
SECRET = b"secret outside the published root\n"


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """``pub`` publishes one file and holds ``rootlink`` -> a folder outside with a secret."""
    pub, outside = tmp_path / "pub", tmp_path / "outside"
    write_tree(pub, {"plain.txt": b"published"})
    write_tree(outside, {"secret.txt": SECRET, "sub/secret.txt": SECRET})
    (pub / "rootlink").symlink_to(outside, target_is_directory=True)
    (pub / "filelink").symlink_to(outside / "secret.txt")
    return pub, outside


def _ask(ctx: zmq.Context[Any], endpoint: str, path: str) -> list[fmq_msg.Cheezburger]:
    """A raw client: OHAI, ICANHAZ ``path`` with RESYNC, plenty of credit; every CHEEZBURGER
    up to the resync-complete marker."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(endpoint)
    got: list[fmq_msg.Cheezburger] = []
    try:
        sock.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
        assert sock.poll(5000) and isinstance(
            fmq_msg.decode(sock.recv_multipart()), fmq_msg.OhaiOk
        )
        sock.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz(path, {"RESYNC": "1"}, {})))
        sock.send_multipart(fmq_msg.encode(fmq_msg.Nom(1 << 30, 0)))
        while sock.poll(5000):
            msg = fmq_msg.decode(sock.recv_multipart())
            if isinstance(msg, fmq_msg.IcanhazOk):
                continue
            assert isinstance(msg, fmq_msg.Cheezburger), msg
            if msg.operation == Operation.MARKER:
                return got
            got.append(msg)
        raise AssertionError(f"no resync-complete marker for {path}")
    finally:
        sock.close()


def _leaked(burgers: list[fmq_msg.Cheezburger]) -> list[str]:
    return [b.filename for b in burgers if b.operation == Operation.CREATE and SECRET in b.chunk]


@pytest.mark.parametrize("live", [False, True], ids=["stat-on-subscribe", "indexes-live"])
@pytest.mark.parametrize(
    "path", ["/rootlink/secret.txt", "/rootlink/sub/secret.txt", "/rootlink/sub/", "/filelink"]
)
def test_exact_path_icanhaz_through_a_symlink_gets_nothing(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any], path: str, live: bool
) -> None:
    pub, _outside = _planted(tmp_path)
    server = serve(pub, indexes_live=live)
    assert _leaked(_ask(zctx, server.endpoint, path)) == []
    # nothing stayed in the index for later subscribers either
    everything = _ask(zctx, server.endpoint, "/")
    assert [b.filename for b in everything] == ["/plain.txt"] and _leaked(everything) == []
    assert sorted(server.indexes["/"].entries()) == ["plain.txt"]


def test_change_notices_and_rescans_never_index_through_links(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any]
) -> None:
    """What a watcher (or any caller of the public notice API) says cannot lead out either."""
    pub, _outside = _planted(tmp_path)
    server = serve(pub, indexes_live=True)
    for name in (
        "rootlink/secret.txt",
        "rootlink/sub/secret.txt",
        "filelink",
        "../outside/secret.txt",
    ):
        server.notify_changed("/", name)
    for subtree in ("rootlink", "rootlink/sub", "../outside"):
        server.rescan("/", subtree)
    server.notify_changed("/", "plain.txt")  # processed in order: after it, the rest was too
    everything = _ask(zctx, server.endpoint, "/")
    assert [b.filename for b in everything] == ["/plain.txt"] and _leaked(everything) == []
    assert sorted(server.indexes["/"].entries()) == ["plain.txt"]


def _tamper(index_file: Path, names: tuple[str, ...], like: Path, version: int = 2) -> None:
    """Add rows for ``names`` to a saved index, with the stat of ``like`` (a file outside).

    Version 2: edits the JSON lines; version 3: a well-formed file with a valid checksum
    (what an adversary who knows the format writes), through the writer itself.
    """
    st = like.stat()
    if version == 3:
        index = FileIndex.load(
            index_file, json.loads(index_file.read_bytes().split(b"\n")[0])["root"]
        )
        for n in names:
            index.record(FileEntry(n, st.st_size, st.st_mtime_ns, st.st_ino, "0" * 40, 0o644))
        index.save(index_file)
        return
    header, *rows = index_file.read_text(encoding="utf-8").splitlines()
    rows += [json.dumps([n, st.st_size, st.st_mtime_ns, st.st_ino, "0" * 40]) for n in names]
    head = json.loads(header)
    head["entries"] = len(rows)
    index_file.write_text("\n".join([json.dumps(head), *rows]) + "\n", encoding="utf-8")


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("name", ["../outside/secret.txt", "/etc/passwd", "./x", "a//x", "a/", ""])
def test_tampered_index_naming_what_no_walk_could_is_refused(
    tmp_path: Path, name: str, version: int
) -> None:
    pub, outside = _planted(tmp_path)
    index_file = tmp_path / "state" / "pub.idx"
    good = FileIndex(pub)
    good.refresh()
    good.save(index_file, version=version)
    _tamper(index_file, (name,), outside / "secret.txt", version)
    with pytest.raises(IndexFormatError):
        FileIndex.load(index_file, pub)
    assert len(load_index(index_file, pub)) == 0  # unusable: rebuilt from the disk


@pytest.mark.parametrize("version", [2, 3])
def test_tampered_server_state_is_not_served(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any], version: int
) -> None:
    """Names through links in a saved index (well formed, so loaded) never reach a client."""
    pub, outside = _planted(tmp_path)
    state = tmp_path / "state"
    index_file = server_index_path(state, pub, "/")
    good = FileIndex(pub)
    good.refresh()
    good.save(index_file, version=version)
    _tamper(index_file, ("rootlink/secret.txt", "filelink"), outside / "secret.txt", version)
    server = serve(pub, state_dir=state, indexes_live=True)
    assert _leaked(_ask(zctx, server.endpoint, "/rootlink/secret.txt")) == []
    everything = _ask(zctx, server.endpoint, "/")
    assert [b.filename for b in everything] == ["/plain.txt"]


class _Events:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[MirrorEvent] = []

    def __call__(self, event: MirrorEvent) -> None:
        with self.lock:
            self.seen.append(event)

    def has(self, kind: EventKind, name: str) -> bool:
        with self.lock:
            return any(e.kind is kind and e.name == name for e in self.seen)


@pytest.mark.parametrize("change", ["create", "delete"])
def test_mirror_never_writes_or_deletes_through_a_folder_swapped_for_a_link(
    tmp_path: Path, serve: Serve, zctx: zmq.Context[Any], change: str
) -> None:
    """DEST/sub is a real folder when the mirror first writes into it, then a local user
    swaps it for a link to a folder outside DEST; later creates and deletes under it must
    not touch the outside folder."""
    pub, dest, outside = tmp_path / "pub", tmp_path / "dest", tmp_path / "victim"
    write_tree(pub, {"sub/a.txt": b"first", "sub/keep.txt": b"keep"})
    write_tree(outside, {"a.txt": b"victim's own a", "keep.txt": b"victim's keep"})
    before = read_tree(outside)
    server = serve(pub, indexes_live=True)
    events = _Events()
    client = SyncClient(
        zctx, server.endpoint, dest, index_path=None, max_retries=None, on_event=events,
        heartbeat=0.5, timeout=5.0, connect_timeout=5.0,
    )  # fmt: skip
    runner = threading.Thread(target=client.run)
    runner.start()
    try:
        assert _wait(lambda: events.has(EventKind.RESYNC_COMPLETE, ""))
        assert read_tree(dest) == {"sub/a.txt": b"first", "sub/keep.txt": b"keep"}
        (dest / "sub").rename(tmp_path / "moved-away")
        (dest / "sub").symlink_to(outside, target_is_directory=True)
        if change == "create":
            (pub / "sub" / "b.txt").write_bytes(b"planted")
            server.notify_changed("/", "sub/b.txt")
        else:
            (pub / "sub" / "a.txt").unlink()
            server.notify_deleted("/", "sub/a.txt")
        (pub / "sentinel").write_bytes(b"s")  # live changes arrive in order
        server.notify_changed("/", "sentinel")
        assert _wait(lambda: events.has(EventKind.CREATE, "sentinel"))
    finally:
        client.stop()
        runner.join(10)
    assert read_tree(outside) == before
    assert client.result.errors >= 1  # refused, and said so
