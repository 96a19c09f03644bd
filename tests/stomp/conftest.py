"""Fixtures shared by the STOMP tests that run one ``broker serve`` per module: a module
defines ``server`` (a ``tests.stomp.test_serve.Serve``); ``clients`` makes stomp.py
connections to it and ``raws`` raw-frame sockets, all closed after the test.
``small``: a TMQP server and a STOMP listener on one engine (``tests.stomp.two_doors``)
whose connections hold little unsent output.  ``engine_side`` and ``held_clients``: a
listener whose engine thread is the test itself (``tests.stomp.engine_side``).  A module
with fixtures of these names of its own (other signatures) keeps them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from broker.stomp.server import ListenerOptions
from tests.stomp.engine_side import Engineside, RawClient
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, stomp12
from tests.stomp.two_doors import FAST, SMALL_OUTBOUND, Broker


@pytest.fixture
def clients(server: Serve) -> Iterator[Callable[[], Any]]:
    made: list[Any] = []

    def make() -> Any:
        conn = stomp12(server.port)
        made.append(conn)
        return conn

    yield make
    for conn in made:
        if conn.is_connected():
            conn.disconnect()


@pytest.fixture
def raws(server: Serve) -> Iterator[Callable[[], Raw]]:
    made: list[Raw] = []

    def make() -> Raw:
        raw = Raw(server.port)
        raw.connect()
        made.append(raw)
        return raw

    yield make
    for raw in made:
        raw.close()


@pytest.fixture
def engine_side() -> Iterator[Engineside]:
    """A listener whose engine thread is the test (``tests.stomp.engine_side``)."""
    side = Engineside()
    yield side
    side.stop()


@pytest.fixture
def held_clients(engine_side: Engineside) -> Iterator[Callable[[], RawClient]]:
    """Raw-frame clients of ``engine_side`` (its door's operations run while they wait)."""
    made: list[RawClient] = []

    def make() -> RawClient:
        made.append(RawClient(engine_side))
        return made[-1]

    yield make
    for raw in made:
        raw.close()


@pytest.fixture
def small(
    zctx: zmq.Context[zmq.Socket[bytes]], request: pytest.FixtureRequest
) -> Iterator[Broker]:
    """A broker whose listener lets a connection hold only ``SMALL_OUTBOUND`` bytes
    unsent (another bound: parametrize ``small`` indirectly with it): a consumer that
    stops reading fills it at once."""
    bound = getattr(request, "param", SMALL_OUTBOUND)
    made = Broker(zctx, options=ListenerOptions(port=0, session=FAST, max_outbound=bound))
    yield made
    made.stop()
