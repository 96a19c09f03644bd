"""The federation client's id is reserved for this broker's own federation client.

The engine remembers the ``Fed-Id`` of what ``zerohub-federation`` pushes and answers a
later push with a remembered id as done (``broker.engine.federated``).  So whoever holds
that id could pre-mark guessable federation ids as seen and block the real messages.
The server gives the id only to a connection showing the secret the broker made for its
own federation client and, on a CURVE broker, authenticated with the federation's key
(``ServerOptions.federation_secret``/``federation_key``).  Real sockets, in-process server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client, ConnectError
from broker.engine.engine import Engine
from broker.engine.federated import FED_ID_HEADER, FEDERATION_CLIENT
from broker.protocol import Header
from broker.server.server import Server, ServerOptions
from zerohub.zmqkit import load_public, new_certificate

Ctx = zmq.Context[zmq.Socket[bytes]]
SECRET = "the-secret-broker-serve-made-for-its-federation"
FED_ID = "P/1"  # a guessable federation id: the peer's id and a counter


def _serve(zctx: Ctx, **options: str) -> Server:
    server = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*", **options), context=zctx)
    server.start()
    return server


def _client(zctx: Ctx, endpoint: str, secret: str | None = None, **keys: Path) -> Client:
    props = {} if secret is None else {Header.FEDERATION_SECRET: secret}
    return Client(endpoint, context=zctx, timeout=5, client_id=FEDERATION_CLIENT,
                  properties=props, **keys)  # fmt: skip


def _real_push_arrives(zctx: Ctx, endpoint: str, federation: Client, **keys: Path) -> bool:
    """The federation client pushes FED_ID: does a consumer get it?"""
    with Client(endpoint, context=zctx, timeout=5, **keys) as consumer:
        consumer.create_queue("orders", 1, {"Status": "Push"})
        consumer.join("orders")
        federation.push("orders", 1, b"real", headers=((FED_ID_HEADER, FED_ID),), ack=True)
        got = consumer.receive(timeout=5)
        return got is not None and got.payload == b"real"


@pytest.fixture
def plain(zctx: Ctx) -> Iterator[str]:
    server = _serve(zctx, federation_secret=SECRET)
    assert server.endpoint is not None
    yield server.endpoint
    server.stop()


@pytest.mark.parametrize("secret", [None, "a-guess", ""])
def test_an_impostor_taking_the_federation_id_is_refused(
    zctx: Ctx, plain: str, secret: str | None
) -> None:
    """Without CURVE: no secret or a wrong one is a refusal saying why (401), and the
    real federation client connects afterwards and its federated message arrives."""
    impostor = _client(zctx, plain, secret)
    with pytest.raises(ConnectError, match="reserved for this broker's own federation"):
        impostor.connect()
    impostor.close(timeout=1)
    with _client(zctx, plain, SECRET) as federation:
        assert _real_push_arrives(zctx, plain, federation)


def test_a_broker_without_a_federation_refuses_the_id_to_everyone(zctx: Ctx) -> None:
    server = _serve(zctx)  # no federation_secret: a broker that does not federate
    try:
        assert server.endpoint is not None
        for secret in (None, SECRET):
            client = _client(zctx, server.endpoint, secret)
            with pytest.raises(ConnectError, match="reserved"):
                client.connect()
            client.close(timeout=1)
    finally:
        server.stop()


def test_under_curve_only_the_federation_key_with_its_secret_gets_the_id(
    zctx: Ctx, tmp_path: Path
) -> None:
    """CURVE: an impostor with a key the broker allows, even knowing the secret, is
    refused; the federation's key without the secret too; the two together connect."""
    server_pub, server_sec = new_certificate("server", tmp_path / "server")
    allow = tmp_path / "allow"
    allow.mkdir()
    secrets = {}
    for name in ("federation", "other"):
        public, secret = new_certificate(name, tmp_path / name)
        (allow / f"{name}.key").write_bytes(public.read_bytes())
        secrets[name] = secret
    fed_key = load_public(allow / "federation.key").decode("ascii")
    server = _serve(zctx, curve_secret=str(server_sec), allow_dir=str(allow),
                    federation_secret=SECRET, federation_key=fed_key)  # fmt: skip
    try:
        assert server.endpoint is not None
        for who, secret in (("other", SECRET), ("other", None), ("federation", None)):
            keys = {"server_key": server_pub, "curve_secret": secrets[who]}
            impostor = _client(zctx, server.endpoint, secret, **keys)
            with pytest.raises(ConnectError, match="reserved"):
                impostor.connect()
            impostor.close(timeout=1)
        keys = {"server_key": server_pub, "curve_secret": secrets["federation"]}
        with _client(zctx, server.endpoint, SECRET, **keys) as federation:
            other = {"server_key": server_pub, "curve_secret": secrets["other"]}
            assert _real_push_arrives(zctx, server.endpoint, federation, **other)
    finally:
        server.stop()
