"""The bridge tests' own pika connection to the test RabbitMQ: declare, publish with
confirms, read back (with the bridge's resent flag), count what waits."""

from __future__ import annotations

import pytest

from broker.bridge.core import RESENT_HEADER
from tests.bridge.peers import RabbitMQ

pika = pytest.importorskip("pika", reason="pika not installed ([bridges])")


class AmqpPeer:
    """A plain pika connection (publisher confirms on) to ``rabbit``."""

    def __init__(self, rabbit: RabbitMQ) -> None:
        self.connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def declare(self, *queues: str) -> None:
        for name in queues:
            self.channel.queue_declare(name, durable=True)

    def publish(self, queue: str, payload: bytes) -> None:
        self.channel.basic_publish(
            "", queue, payload, pika.BasicProperties(delivery_mode=2), mandatory=True
        )

    def drain_flagged(self, queue: str) -> list[tuple[bytes, bool]]:
        """(payload, flagged as resent by the bridge) of every message on ``queue``
        (taken)."""
        got: list[tuple[bytes, bool]] = []
        while True:
            method, props, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            flagged = (props.headers or {}).get(RESENT_HEADER) in ("true", b"true")
            got.append((body, flagged))

    def drain(self, queue: str) -> list[bytes]:
        """The payloads of every message on ``queue`` (taken)."""
        return [body for body, _ in self.drain_flagged(queue)]

    def depth(self, queue: str) -> int:
        """Messages ready on ``queue`` (not those delivered and not yet acknowledged)."""
        result = self.channel.queue_declare(queue, durable=True, passive=True)
        return int(result.method.message_count)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()
