"""Fixtures shared by the broker tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client import Client
from broker.engine import Engine
from broker.server import Server, ServerOptions
from tests.broker.test_durable_serve import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
MakeClient = Callable[..., Client]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Broker]:
    """A started ``broker serve --data DIR`` process (killed at the end if still running)."""
    b = Broker(tmp_path / "data")
    b.start()
    yield b
    if b.proc is not None:
        b.proc.kill()
        b.proc.wait(10)


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    """An in-process TMQP server on a fresh engine, random loopback port (a module may
    define its own ``server``)."""
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        yield srv


@pytest.fixture
def make_client(zctx: Ctx, server: Server) -> Iterator[MakeClient]:
    """Connected clients of ``server`` (timeout 10 s unless given), closed at the end."""
    made: list[Client] = []

    def make(**kw: Any) -> Client:
        assert server.endpoint is not None
        kw.setdefault("timeout", 10.0)
        client = Client(server.endpoint, context=zctx, **kw).connect()
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
