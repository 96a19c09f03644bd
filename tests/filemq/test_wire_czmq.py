"""``--wire czmq``: the reference C implementation's longstr path/filename variant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq import fmq_msg_czmq
from filemq.client import SyncRejected, SyncResult
from filemq.server import FileServer

from .conftest import read_tree, write_tree

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
