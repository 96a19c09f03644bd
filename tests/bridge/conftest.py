"""Shared peers of the bridge tests: one RabbitMQ node (AMQP and STOMP) for the session.

A node takes ~10 s to boot on a loaded 2-core machine: the AMQP and STOMP tests share it
(each test uses its own queue names; the restart tests leave it running).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.client import Client
from broker.engine import Engine
from broker.server import Server, ServerOptions
from tests.bridge.peers import RabbitMQ

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture(scope="session")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    node = RabbitMQ(tmp_path_factory.mktemp("rabbit"))
    node.start()
    yield node
    node.close()


@pytest.fixture
def server(zctx: Ctx) -> Iterator[Server]:
    """The local broker of a bridge test: an in-process server, random loopback port."""
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        yield srv


@pytest.fixture
def local(zctx: Ctx, server: Server) -> Iterator[Client]:
    """The test's own client of the local broker."""
    assert server.endpoint is not None
    with Client(server.endpoint, context=zctx, timeout=5.0) as client:
        yield client
