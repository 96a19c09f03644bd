"""CURVE on the broker: allowed client keys connect, others are refused before the engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client import sockets
from broker.client.blocking import Client, ConnectError
from broker.client.errors import AccessRefused
from broker.engine.engine import Engine
from broker.server.server import Server, ServerError, ServerOptions
from tests.dropped_pipe import DEADLINE, dial_until_dropped
from zerohub.zmqkit import new_certificate

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    allow = tmp_path / "allow"
    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    good_pub, good_sec = new_certificate("good", tmp_path / "clients")
    _bad_pub, bad_sec = new_certificate("bad", tmp_path / "clients")
    allow.mkdir()
    (allow / "good.key").write_bytes(good_pub.read_bytes())
    return {
        "server_pub": server_pub,
        "server_sec": server_sec,
        "good_sec": good_sec,
        "bad_sec": bad_sec,
        "allow": allow,
    }


@pytest.fixture
def curve_server(zctx: Ctx, keys: dict[str, Path]) -> Iterator[tuple[Server, Engine]]:
    engine = Engine()
    options = ServerOptions(
        endpoint="tcp://127.0.0.1:*",
        curve_secret=str(keys["server_sec"]),
        allow_dir=str(keys["allow"]),
    )
    with Server(engine, options, context=zctx) as srv:
        yield srv, engine


def test_allowed_key_connects_and_works(
    zctx: Ctx, keys: dict[str, Path], curve_server: tuple[Server, Engine]
) -> None:
    srv, _engine = curve_server
    assert srv.endpoint is not None
    with Client(
        srv.endpoint,
        context=zctx,
        server_key=keys["server_pub"],
        curve_secret=keys["good_sec"],
        timeout=5,
    ) as client:
        client.create_queue("secure", 1, {"Status": 1})
        client.join("secure")
        client.push("secure", 1, b"secret", ack=True)
        message = client.receive(timeout=5)
        assert message is not None and message.payload == b"secret"


def test_unknown_key_is_refused(
    zctx: Ctx, keys: dict[str, Path], curve_server: tuple[Server, Engine]
) -> None:
    srv, engine = curve_server
    assert srv.endpoint is not None
    client = Client(
        srv.endpoint,
        context=zctx,
        server_key=keys["server_pub"],
        curve_secret=keys["bad_sec"],
        timeout=5,
    )
    with pytest.raises(ConnectError, match="refused this client's CURVE key"):
        client.connect()
    assert engine.clients == {}


def test_plain_client_gets_nothing_from_a_curve_server(
    zctx: Ctx, curve_server: tuple[Server, Engine]
) -> None:
    srv, engine = curve_server
    assert srv.endpoint is not None
    client = Client(srv.endpoint, context=zctx, timeout=0.5)
    with pytest.raises(ConnectError):
        client.connect()
    assert engine.clients == {}


def refused_before_the_hello(monkeypatch: pytest.MonkeyPatch, driver: Any) -> None:
    """Make ``driver`` (a client module) dial as on a loaded machine where the client's
    thread is descheduled between connect and the hello: the server's refusal of the
    handshake has already ended the connection (libzmq drops the DEALER's pipe for good,
    and a send would find no room: zmq.Again, or an async send that waits forever)."""
    opened = sockets.open_dealer

    def late(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        def close(dialled: tuple[Any, Any]) -> None:
            sock, monitor = dialled
            if monitor is not None:
                monitor.close(sock)
            sock.close(linger=0)

        return dial_until_dropped(
            lambda: opened(*args, **kwargs),
            # (an asyncio socket's poll is a future: poll a plain shadow of it)
            lambda dialled: zmq.Socket.shadow(dialled[0].underlying),
            close,
        )

    monkeypatch.setattr(driver, "open_dealer", late)


def test_a_plain_client_refused_before_its_hello_is_a_connect_error(
    zctx: Ctx, curve_server: tuple[Server, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: zmq.Again from the hello's send killed the I/O thread ("client I/O thread
    failed"), seen under load."""
    from broker.client import io

    refused_before_the_hello(monkeypatch, io)
    srv, engine = curve_server
    assert srv.endpoint is not None
    # the dial above runs on the client's clock: its connect waits out the whole search
    client = Client(srv.endpoint, context=zctx, timeout=2 * DEADLINE)
    with pytest.raises(AccessRefused, match="requires CURVE"):
        client.connect()
    assert engine.clients == {}


def test_curve_needs_an_allow_list(zctx: Ctx, keys: dict[str, Path]) -> None:
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", curve_secret=str(keys["server_sec"]))
    srv = Server(Engine(), options, context=zctx)
    with pytest.raises(ServerError, match="allow-list"):
        srv.start()
    srv.stop()


def test_curve_allows_a_non_loopback_bind(zctx: Ctx, keys: dict[str, Path]) -> None:
    options = ServerOptions(
        endpoint="tcp://0.0.0.0:*",
        curve_secret=str(keys["server_sec"]),
        allow_dir=str(keys["allow"]),
    )
    with Server(Engine(), options, context=zctx) as srv:
        assert srv.endpoint is not None and srv.endpoint.startswith("tcp://0.0.0.0:")


def test_client_with_a_public_key_file_as_secret_fails_clearly(
    zctx: Ctx, keys: dict[str, Path], curve_server: tuple[Server, Engine]
) -> None:
    srv, _engine = curve_server
    assert srv.endpoint is not None
    client = Client(
        srv.endpoint,
        context=zctx,
        server_key=keys["server_pub"],
        curve_secret=keys["server_pub"],
        timeout=2,
    )
    with pytest.raises(ConnectError, match="no secret key"):
        client.connect()
