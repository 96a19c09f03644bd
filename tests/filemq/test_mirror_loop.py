"""A mirror inside the directory it mirrors is refused; a server never publishes its state."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncRefused, SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree
from .procs import read_endpoint

FILEMQ = [sys.executable, "-m", "filemq"]
WAIT = 30.0


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()


def _serve(procs: list[subprocess.Popen[str]], pub: Path, *args: str) -> str:
    proc = subprocess.Popen(
        [
            *FILEMQ,
            "serve",
            "--bind",
            "tcp://127.0.0.1:*",
            "--no-state",
            "--publish",
            str(pub),
            *args,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(proc)
    assert proc.stderr is not None
    endpoint = read_endpoint(proc.stderr)
    assert endpoint, "server did not report its endpoint"
    return endpoint


def _depth(root: Path) -> int:
    """How many 'loop' folders deep the mirror went."""
    depth, path = 0, root
    while (path / "loop").is_dir():
        depth, path = depth + 1, path / "loop"
    return depth


def _run_until_exit(proc: subprocess.Popen[str], pub: Path) -> int:
    """Wait for ``proc`` to end; fail as soon as the copy goes three levels deep."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            return code
        assert _depth(pub) < 3, "the mirror keeps copying itself into loop/loop/..."
        time.sleep(0.02)
    raise AssertionError("the mirror did not stop")


@pytest.mark.parametrize("watching", [True, False], ids=["watching", "no-watch"])
@pytest.mark.parametrize("command", ["subscribe", "sync"])
def test_mirror_inside_its_own_published_directory_is_refused(
    tmp_path: Path, processes: list[subprocess.Popen[str]], command: str, watching: bool
) -> None:
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a", "d/b.txt": b"b"})
    endpoint = _serve(processes, pub, *(() if watching else ("--no-watch",)))
    args = ["--once"] if command == "sync" else []
    client = subprocess.Popen(
        [*FILEMQ, command, endpoint, str(pub / "loop"), "--no-index", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processes.append(client)
    code = _run_until_exit(client, pub)
    assert client.stderr is not None
    err = client.stderr.read()
    assert code == 3, err  # the server refused the subscription (SRSLY)
    refusals = [line for line in err.splitlines() if "inside the directory it mirrors" in line]
    assert len(refusals) == 1 and "Traceback" not in err, err
    assert read_tree(pub / "loop") == {}  # refused before a single file was copied


def _state_files(tree: dict[str, bytes]) -> list[str]:
    return [name for name in tree if name.startswith(".state/")]


def test_server_state_inside_a_published_directory_is_not_published(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
) -> None:
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a"})
    server = serve(pub, state_dir=pub / ".state")
    assert list((pub / ".state").rglob("*.idx"))  # the state is there, inside pub
    result = sync_once(server.endpoint, tmp_path / "dest")
    assert result.synced and read_tree(tmp_path / "dest") == {"a.txt": b"a"}
    server.rescan()
    again = sync_once(server.endpoint, tmp_path / "dest")
    assert again.synced and again.files == 0 and read_tree(tmp_path / "dest") == {"a.txt": b"a"}


def test_change_notices_for_the_server_state_are_ignored(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    sync_once: Callable[..., SyncResult],
) -> None:
    """What a watcher reports about the state folder (the server writes it) is not published."""
    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a"})
    server = serve(pub, state_dir=pub / ".state", indexes_live=True)
    for saved in (pub / ".state").rglob("*.idx"):
        server.notify_changed("/", saved.relative_to(pub).as_posix())
    (pub / "sentinel").write_bytes(b"s")
    server.notify_changed("/", "sentinel")  # notices are handled in order
    result = sync_once(server.endpoint, tmp_path / "dest")
    got = read_tree(tmp_path / "dest")
    assert result.synced and "sentinel" in got and _state_files(got) == []


def test_loop_refused_through_a_link_and_only_where_the_subscription_overlaps(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    docs, img = tmp_path / "docs", tmp_path / "img"
    write_tree(docs, {"a.txt": b"a"})
    write_tree(img, {"b.png": b"b"})
    (tmp_path / "alias").symlink_to(img, target_is_directory=True)
    server = serve((docs, "/docs"), (img, "/img"))
    # /docs mirrored into a folder /img publishes: no loop, it is just published again
    ok = sync_once(server.endpoint, tmp_path / "alias" / "copy", path="/docs")
    assert ok.synced and read_tree(img / "copy") == {"a.txt": b"a"}
    for path in ("/", "/img", "/img/copy/"):  # these would send DEST's files back to it
        with pytest.raises(SyncRefused, match="inside the directory it mirrors"):
            sync_once(server.endpoint, tmp_path / "alias" / "copy", path=path)
    with pytest.raises(SyncRefused, match="inside the directory it mirrors"):
        sync_once(server.endpoint, docs, path="/docs")  # DEST is the published folder itself
    assert read_tree(docs) == {"a.txt": b"a"}


@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        "",
        "other-machine 1 2 /",
        "{machine} 0 0 {dest}",  # right path, wrong device and inode: not that folder
        "{machine} x y {dest}",
        "{machine} 1 2 relative/path",
        "{machine} 1 2 /no/such/folder\x00nul",
    ],
)
def test_forged_mirror_dest_options_are_ignored(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any], value: str
) -> None:
    from filemq import fmq_msg
    from filemq.engine import OPTION_MIRROR_DEST
    from filemq.loopguard import dest_option

    pub = tmp_path / "pub"
    write_tree(pub, {"a.txt": b"a", "loop/x": b"x"})
    machine = dest_option(pub).split(" ")[0]
    server = serve(pub)
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.endpoint)
    try:
        sock.send_multipart(fmq_msg.encode(fmq_msg.Ohai()))
        assert sock.poll(5000) and isinstance(
            fmq_msg.decode(sock.recv_multipart()), fmq_msg.OhaiOk
        )
        option = value.format(machine=machine, dest=pub / "loop")
        options = {"RESYNC": "1", OPTION_MIRROR_DEST: option}
        sock.send_multipart(fmq_msg.encode(fmq_msg.Icanhaz("/", options, {})))
        assert sock.poll(5000)
        assert isinstance(fmq_msg.decode(sock.recv_multipart()), fmq_msg.IcanhazOk)
        sock.send_multipart(fmq_msg.encode(fmq_msg.Nom(1000, 0)))
        names = []
        while sock.poll(5000):
            msg = fmq_msg.decode(sock.recv_multipart())
            assert isinstance(msg, fmq_msg.Cheezburger), msg  # never SRSLY
            if not msg.filename:
                break
            names.append(msg.filename)
        assert names == ["/a.txt", "/loop/x"]
    finally:
        sock.close()


def test_mirror_index_kept_inside_dest_is_left_alone(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    """The mirror's own index inside DEST is neither offered to the server nor deleted."""
    pub, dest = tmp_path / "pub", tmp_path / "dest"
    write_tree(pub, {"a.txt": b"a"})
    server = serve(pub)
    index = dest / ".mirror.idx"
    for _ in range(2):
        result = sync_once(server.endpoint, dest, index_path=index)
        assert result.synced and result.deleted == 0 and result.errors == 0
        assert index.is_file() and read_tree(dest)["a.txt"] == b"a"
