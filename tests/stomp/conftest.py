"""Fixtures shared by the STOMP tests that run one ``broker serve`` per module: a module
defines ``server`` (a ``tests.stomp.test_serve.Serve``); ``clients`` makes stomp.py
connections to it and ``raws`` raw-frame sockets, all closed after the test.
``engine_side`` and ``held_clients``: a listener whose engine thread is the test itself
(``tests.stomp.engine_side``).  A module with fixtures of these names of its own (other
signatures) keeps them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.stomp.engine_side import Engineside, RawClient
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve, stomp12


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
