"""CURVE: an allowed client syncs; a client whose key is not allowed gets nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from filemq.client import SyncClient, SyncRefused, SyncResult
from filemq.server import FileServer
from tests.dropped_pipe import dial_until_dropped
from zerohub.zmqkit import HandshakeWatch, SecurityError, new_certificate

from .conftest import read_tree, write_tree


def test_curve_allowed_and_denied(
    tmp_path: Path, serve: Callable[..., FileServer], sync_once: Callable[..., SyncResult]
) -> None:
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    server_pub, server_sec = new_certificate("server", keys)
    good_pub, good_sec = new_certificate("good", keys)
    _bad_pub, bad_sec = new_certificate("bad", keys)
    allowed.mkdir()
    (allowed / "good.key").write_bytes(good_pub.read_bytes())
    tree = {"secret.txt": b"only for good", "dir/x": b"x" * 5000}
    write_tree(tmp_path / "src", tree)
    server = serve(tmp_path / "src", curve_secret=server_sec, allow_dir=allowed)

    result = sync_once(
        server.endpoint, tmp_path / "ok", curve_secret=good_sec, server_key=server_pub
    )
    assert result.synced and read_tree(tmp_path / "ok") == tree

    with pytest.raises(SyncRefused):
        sync_once(
            server.endpoint, tmp_path / "denied", curve_secret=bad_sec, server_key=server_pub
        )
    assert read_tree(tmp_path / "denied") == {}
    with pytest.raises(SyncRefused):  # plain text against a CURVE server
        sync_once(server.endpoint, tmp_path / "plain", connect_timeout=1.0, max_retries=0)
    assert read_tree(tmp_path / "plain") == {}


def test_non_loopback_bind_needs_curve_or_insecure(
    tmp_path: Path, serve: Callable[..., FileServer]
) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(SecurityError):
        serve(tmp_path / "src", endpoint="tcp://0.0.0.0:*")
    server = serve(tmp_path / "src", endpoint="tcp://0.0.0.0:*", insecure=True)
    assert server.endpoint.startswith("tcp://0.0.0.0:")


def test_plain_client_refused_even_when_the_handshake_fails_before_ohai(
    tmp_path: Path,
    serve: Callable[..., FileServer],
    zctx: zmq.Context[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The failed handshake drops the DEALER's only pipe: OHAI must not wait forever."""
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    _server_pub, server_sec = new_certificate("server", keys)
    allowed.mkdir()
    write_tree(tmp_path / "src", {"a": b"a"})
    server = serve(tmp_path / "src", curve_secret=server_sec, allow_dir=allowed)
    make_socket = SyncClient._socket
    dropped: list[bool] = []

    def _close(dialled: tuple[zmq.Socket[Any], HandshakeWatch]) -> None:
        sock, monitor = dialled
        monitor.close(sock)
        sock.close(linger=0)

    def socket_after_the_handshake_failed(
        self: SyncClient,
    ) -> tuple[zmq.Socket[Any], HandshakeWatch]:
        # see tests.dropped_pipe: libzmq keeps the pipe of about 30% of refused connections
        dialled = dial_until_dropped(lambda: make_socket(self), lambda d: d[0], _close)
        dropped.append(True)
        return dialled  # OHAI goes out now, with nowhere to go

    monkeypatch.setattr(SyncClient, "_socket", socket_after_the_handshake_failed)
    client = SyncClient(
        zctx, server.endpoint, tmp_path / "plain", once=True, connect_timeout=1.0, max_retries=0
    )
    with pytest.raises(SyncRefused):
        client.run()
    assert dropped and read_tree(tmp_path / "plain") == {}
