"""AMQP 0-9-1 connector (pika, RabbitMQ) — ``pip install 'zerohub[bridges]'``.

* Publishes persistent messages (delivery mode 2) with ``mandatory`` on a channel in
  confirm mode: the broker's confirm is the acceptance; a nack or an unroutable return is a
  refusal (published again after the reconnect or at once).  pika's blocking channel waits
  for each confirm, so publishing is one message at a time (correct, not fast).
* A copy published again (after a reconnect or a refusal) carries the message header
  ``zerohub-resent: true``; a delivery RabbitMQ flags ``redelivered`` is pushed locally with
  ``Bridge-Redelivered: true``: duplicates are only ever flagged copies.
* Consumes the inbound queues with manual acks and ``basic_qos(prefetch_count=window)``:
  a delivery is acknowledged (``basic_ack``) only when the bridge says so.
* Remote names: outbound ``EXCHANGE/ROUTING_KEY``, or ``QUEUE`` (the default exchange
  routes it to that queue); inbound ``QUEUE``.  The bridge declares nothing: queues and
  bindings are the remote administrator's (a missing queue is a refusal, logged).
"""

from __future__ import annotations

import contextlib
from typing import Any

from broker.bridge.config import RemoteUrl, Route
from broker.bridge.connectors import Sink
from broker.bridge.core import RESENT_HEADER
from broker.bridge.errors import ConnectorError, MissingLibrary
from broker.bridge.events import RemoteAccepted, RemoteMessage, RemoteRefused

try:
    import pika
    import pika.exceptions
except ImportError:  # pragma: no cover - depends on the install
    pika = None

#: Seconds between AMQP heartbeats.
DEFAULT_HEARTBEAT = 30


class AmqpConnector:
    def __init__(
        self,
        url: RemoteUrl,
        routes: tuple[Route, ...],
        *,
        window: int,
        heartbeat: int = DEFAULT_HEARTBEAT,
    ) -> None:
        if pika is None:
            raise MissingLibrary("the AMQP bridge needs pika: pip install 'zerohub[bridges]'")
        self.url = url
        self.inbound = routes
        self.window = window
        self.heartbeat = heartbeat
        self._connection: Any = None
        self._channel: Any = None
        self._sink: Sink | None = None
        self._generation = 0

    def open(self, sink: Sink, generation: int, timeout: float) -> None:
        self._sink, self._generation = sink, generation
        credentials = pika.PlainCredentials(
            self.url.username or "guest", self.url.password or "guest"
        )
        params = pika.ConnectionParameters(
            host=self.url.host,
            port=self.url.port,
            virtual_host=self.url.vhost,
            credentials=credentials,
            heartbeat=self.heartbeat,
            socket_timeout=timeout,
            stack_timeout=timeout,
            blocked_connection_timeout=timeout * 6,
            connection_attempts=1,
        )
        try:
            self._connection = pika.BlockingConnection(params)
            channel = self._connection.channel()
            channel.confirm_delivery()
            channel.basic_qos(prefetch_count=min(self.window, 65535))
            for route in self.inbound:
                channel.basic_consume(
                    queue=route.remote, on_message_callback=self._consumer(route), auto_ack=False
                )
            self._channel = channel
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise ConnectorError(f"{self.url.redacted()}: {_describe(exc)}")
        except OSError as exc:
            self.close()
            raise ConnectorError(f"{self.url.redacted()}: {exc}")

    def _consumer(self, route: Route) -> Any:
        def delivered(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            if self._sink is None:
                return
            headers = [("Bridge-Queue", route.remote)]
            if method.redelivered:
                headers.append(("Bridge-Redelivered", "true"))
            ref = method.delivery_tag
            self._sink(RemoteMessage(route, body, ref, self._generation, tuple(headers)))

        return delivered

    def publish(self, token: int, remote: str, payload: bytes, resent: bool = False) -> None:
        exchange, slash, key = remote.rpartition("/")
        if not slash:
            exchange, key = "", remote
        assert self._sink is not None
        try:
            self._channel.basic_publish(
                exchange=exchange,
                routing_key=key,
                body=payload,
                properties=pika.BasicProperties(
                    delivery_mode=2, headers={RESENT_HEADER: "true"} if resent else None
                ),
                mandatory=True,
            )
        except (pika.exceptions.UnroutableError, pika.exceptions.NackError) as exc:
            self._sink(RemoteRefused(token, self._generation, _describe(exc)))
            return
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise ConnectorError(_describe(exc))
        self._sink(RemoteAccepted(token, self._generation))

    def ack(self, ref: Any) -> None:
        try:
            self._channel.basic_ack(delivery_tag=ref)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise ConnectorError(_describe(exc))

    def pump(self, timeout: float) -> None:
        try:
            self._connection.process_data_events(time_limit=timeout)
        except (pika.exceptions.AMQPError, OSError) as exc:
            raise ConnectorError(_describe(exc))

    def close(self) -> None:
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None and connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                connection.close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
