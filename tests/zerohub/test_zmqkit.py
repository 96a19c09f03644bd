"""``zerohub.zmqkit.HandshakeWatch``: what a connecting socket learns of a failed
handshake, on real CURVE sockets (the one classification both clients, filemq and broker,
use).  Peers that hang up or never answer: ``test_handshake_watch.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zerohub import zmqkit

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def curve_server(zctx: Ctx, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A CURVE ROUTER allowing the keys in ``allowed/``; (endpoint, key folder)."""
    zmqkit.new_certificate("server", tmp_path)
    zmqkit.new_certificate("allowed", tmp_path / "allowed")
    zmqkit.new_certificate("stranger", tmp_path)
    auth = zmqkit.start_authenticator(zctx, tmp_path / "allowed")
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    try:
        zmqkit.configure_server(router, tmp_path / "server.key_secret")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        yield f"tcp://127.0.0.1:{port}", tmp_path
    finally:
        router.close(linger=0)
        auth.stop()


def _report(zctx: Ctx, endpoint: str, keys: tuple[Path, Path] | None) -> zmqkit.MonitorReport:
    """Connect a DEALER (CURVE when ``keys``) and read its monitor until it reports."""
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    if keys is not None:
        zmqkit.configure_client(sock, *keys)
    watch = zmqkit.HandshakeWatch(
        sock.get_monitor_socket(zmqkit.HANDSHAKE_EVENTS), curve=keys is not None
    )
    try:
        sock.connect(endpoint)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            watch.socket.poll(200)
            report = watch.read()
            if report.handshake is not None:
                return report
        return zmqkit.MonitorReport()
    finally:
        watch.close(sock)
        sock.close(linger=0)


def test_a_key_the_server_does_not_allow(zctx: Ctx, curve_server: tuple[str, Path]) -> None:
    endpoint, keys = curve_server
    report = _report(zctx, endpoint, (keys / "stranger.key_secret", keys / "server.key"))
    assert report == zmqkit.MonitorReport(handshake=zmqkit.Handshake.KEY_REFUSED)


def test_a_plain_client_learns_the_server_requires_curve(
    zctx: Ctx, curve_server: tuple[str, Path]
) -> None:
    endpoint, _keys = curve_server
    report = _report(zctx, endpoint, None)
    assert report.handshake is zmqkit.Handshake.CURVE_REQUIRED


def test_an_allowed_key_reports_nothing(zctx: Ctx, curve_server: tuple[str, Path]) -> None:
    endpoint, keys = curve_server
    sock = zctx.socket(zmq.DEALER)
    sock.linger = 0
    zmqkit.configure_client(sock, keys / "allowed" / "allowed.key_secret", keys / "server.key")
    events = zmqkit.HANDSHAKE_EVENTS | zmq.EVENT_HANDSHAKE_SUCCEEDED
    watch = zmqkit.HandshakeWatch(sock.get_monitor_socket(events), curve=True)
    try:
        sock.connect(endpoint)
        assert watch.socket.poll(10_000)  # the handshake's outcome, whatever it is
        assert watch.read() == zmqkit.MonitorReport()
    finally:
        watch.close(sock)
        sock.close(linger=0)


def test_servers_on_one_context_share_its_zap_handler(zctx: Ctx, tmp_path: Path) -> None:
    """A context has one ZAP endpoint: a second handler could not bind it (the hub's file
    server and broker with CURVE failed so).  Same folder: shared; the handler outlives
    the first server to stop; another folder on the same context is refused."""
    zmqkit.new_certificate("server", tmp_path)
    zmqkit.new_certificate("allowed", tmp_path / "allowed")
    zmqkit.new_certificate("stranger", tmp_path)
    (tmp_path / "other").mkdir()
    first = zmqkit.start_authenticator(zctx, tmp_path / "allowed")
    second = zmqkit.start_authenticator(zctx, tmp_path / "allowed")
    with pytest.raises(zmqkit.SecurityError, match="share one allow-list"):
        zmqkit.start_authenticator(zctx, tmp_path / "other")
    router = zctx.socket(zmq.ROUTER)
    router.linger = 0
    try:
        zmqkit.configure_server(router, tmp_path / "server.key_secret")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        first.stop()
        first.stop()  # (a second stop of the same hold changes nothing)
        # still checked by the handler (with none, libzmq would let any key in)
        keys = (tmp_path / "stranger.key_secret", tmp_path / "server.key")
        report = _report(zctx, f"tcp://127.0.0.1:{port}", keys)
        assert report.handshake is zmqkit.Handshake.KEY_REFUSED
    finally:
        router.close(linger=0)
        second.stop()
    assert zmqkit._AUTHENTICATORS == {}  # the last one out stopped the handler
