"""Fixtures shared by the STOMP tests that run one ``broker serve`` per module: a module
defines ``server`` (a ``tests.stomp.test_serve.Serve``); ``clients`` makes stomp.py
connections to it and ``raws`` raw-frame sockets, all closed after the test.  A module
with fixtures of these names of its own (other signatures) keeps them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
