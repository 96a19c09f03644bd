"""``--wire czmq``: the reference C implementation's longstr path/filename variant."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg_czmq
from filemq.client import SyncRejected, SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree
from .procs import read_endpoint
from .reference_client import ReferenceLikeClient

FILEMQ = [sys.executable, "-m", "filemq"]

LONG = "d" * 200 + "/" + "f" * 200  # a 401-octet virtual path: only longstr carries it


def test_czmq_wire_end_to_end_with_long_names(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    tree = {"a.txt": b"short name", LONG: b"long name"}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", wire="czmq")
    result = sync_once(server.endpoint, tmp_path / "dest", wire="czmq")
    assert result.synced and read_tree(tmp_path / "dest") == tree

    spec_server = serve(tmp_path / "src")  # the spec wire cannot carry the long name
    result = sync_once(spec_server.endpoint, tmp_path / "spec")
    assert read_tree(tmp_path / "spec") == {"a.txt": b"short name"}


def test_czmq_server_speaks_longstr(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    write_tree(tmp_path / "src", {"f": b"x"})
    server = serve(tmp_path / "src", wire="czmq")
    s = zctx.socket(zmq.DEALER)
    s.linger = 0
    s.connect(server.endpoint)
    try:
        for msg in (
            fmq_msg_czmq.Ohai(),
            fmq_msg_czmq.Icanhaz("/", {"RESYNC": "1"}, {}),
            fmq_msg_czmq.Nom(100, 0),
        ):
            s.send_multipart(fmq_msg_czmq.encode(msg))
        got: list[list[bytes]] = []
        while len(got) < 4 and s.poll(5000):
            got.append(s.recv_multipart())
        chunk = fmq_msg_czmq.decode(got[2])
        assert isinstance(chunk, fmq_msg_czmq.Cheezburger) and chunk.filename == "/f"
        assert got[2][0][12:16] == b"\x00\x00\x00\x02"  # 4-octet filename length
    finally:
        s.close()


def test_wire_mismatch_gets_rtfm_and_client_gives_up(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    write_tree(tmp_path / "src", {"f": b"x"})
    server = serve(tmp_path / "src", wire="czmq")
    with pytest.raises(SyncRejected):  # RTFM, one fresh connection, RTFM again
        sync_once(server.endpoint, tmp_path / "dest")
    assert read_tree(tmp_path / "dest") == {}


# -- how a file ends: the reference client closes a file only on a zero-length chunk --

# sizes around the chunk size (1000 below): empty, 1, chunk - 1, chunk, chunk + 1, many chunks
ENDINGS = {
    "a.bin": 2500,
    "b.empty": 0,
    "c.bin": 1000,
    "d/e.bin": 1,
    "f.bin": 999,
    "g.bin": 1001,
    "h/i/j.bin": 7 * 1000 + 3,
}


def _tree(sizes: dict[str, int]) -> dict[str, bytes]:
    return {name: os.urandom(size) for name, size in sizes.items()}


def test_reference_like_client_gets_every_file_byte_exact(
    tmp_path: Path, serve: Callable[..., FileServer], zctx: zmq.Context[Any]
) -> None:
    """Files queued back to back (a resync): each one ends with an empty chunk."""
    tree = _tree(ENDINGS)
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", wire="czmq", chunk_size=1000)
    client = ReferenceLikeClient(zctx, server.endpoint, tmp_path / "inbox")
    try:
        client.subscribe("/", resync=True)
        assert client.pump(lambda: bool(client.skipped))  # up to the resync marker
        assert sorted(client.delivered) == sorted(tree)  # each file closed once
        assert read_tree(tmp_path / "inbox") == tree  # byte-exact, nothing written astray
        assert client.skipped == [""]  # the resync marker: no leading '/', skipped
    finally:
        client.close()


def test_reference_like_client_follows_a_live_czmq_server(
    tmp_path: Path, zctx: zmq.Context[Any]
) -> None:
    """A real ``filemq serve --wire czmq`` process pushing changes; ICANHAZ without RESYNC."""
    src, inbox = tmp_path / "src", tmp_path / "inbox"
    src.mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [
            *FILEMQ,
            "serve",
            "--bind",
            "tcp://127.0.0.1:*",
            "--publish",
            str(src),
            "--wire",
            "czmq",
            "--chunk-size",
            "1000",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    client = None
    try:
        assert proc.stderr is not None
        endpoint = read_endpoint(proc.stderr)
        assert endpoint, "the server did not report its endpoint"
        client = ReferenceLikeClient(zctx, endpoint, inbox)
        client.subscribe("/")
        first = _tree(ENDINGS)
        write_tree(src, first)
        assert client.pump(lambda: read_tree(inbox) == first), read_tree(inbox).keys()
        second = {"k.bin": os.urandom(3333), "l.bin": os.urandom(1000)}
        write_tree(src, second)
        (src / "a.bin").unlink()
        want = {**first, **second}
        del want["a.bin"]
        assert client.pump(lambda: read_tree(inbox) == want), read_tree(inbox).keys()
        assert "a.bin" in client.deleted
    finally:
        if client is not None:
            client.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def test_zerohub_client_with_the_czmq_ending(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    """Our client on a server ending files with an empty chunk: no extra files, SHA-1 checked."""
    tree = _tree(ENDINGS)
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", wire="czmq", chunk_size=1000)
    dest = tmp_path / "dest"
    result = sync_once(server.endpoint, dest, wire="czmq", window=2500)
    assert result.synced and result.marker
    assert (result.files, result.errors, result.refetched) == (len(tree), 0, 0)
    assert read_tree(dest) == tree  # no empty or duplicate files, no temp files left
    assert result.bytes == sum(ENDINGS.values())
