"""Shared peers of the bridge tests: one RabbitMQ node (AMQP and STOMP) for the session.

A node takes ~10 s to boot on a loaded 2-core machine: the AMQP and STOMP tests share it
(each test uses its own queue names; the restart tests leave it running).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.bridge.peers import RabbitMQ


@pytest.fixture(scope="session")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    node = RabbitMQ(tmp_path_factory.mktemp("rabbit"))
    node.start()
    yield node
    node.close()
