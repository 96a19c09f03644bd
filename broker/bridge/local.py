"""The bridge's local side: the public broker client (``broker.Client``), threaded.

Outbound routes: the local queue is made (``RequestAcknowledge``) when missing, and the
channel joined with ``prefetch = window``, so the broker never hands the bridge more than a
window of unacknowledged messages per queue.  Deliveries and push results are reported to
the driver's sink; the client reconnects by itself (re-joining its channels).
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from typing import Any

import zmq

from broker.bridge.config import Direction, Route, Settings
from broker.bridge.connectors import Sink
from broker.bridge.errors import ConfigError
from broker.bridge.events import LocalAccepted, LocalDelivery, LocalRefused
from broker.client.blocking import Client, Message, RemoteError

log = logging.getLogger(__name__)


class LocalSide:
    def __init__(
        self,
        endpoint: str,
        settings: Settings,
        sink: Sink,
        *,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.sink = sink
        self._routes: dict[str, Route] = {}
        for route in settings.routes_of(Direction.OUT):
            if route.channel in self._routes:
                raise ConfigError(f"two outbound routes from channel {route.channel!r}")
            self._routes[route.channel] = route
        self.client = Client(endpoint, context=context, **(client_options or {}))

    def start(self) -> None:
        client = self.client
        client.on_message(self._delivered)
        client.connect()
        try:
            for route in self._routes.values():
                self._ensure_queue(route)
                client.join(route.channel, prefetch=self.settings.window)
        except BaseException:
            client.close()
            raise

    def _ensure_queue(self, route: Route) -> None:
        try:
            info = self.client.queue_info(route.channel, route.queue_id)
        except RemoteError:
            self.client.create_queue(
                route.channel, route.queue_id, {"Status": "Push", "RequestAcknowledge": True}
            )
            return
        if not info.get("RequestAcknowledge"):
            log.warning(
                "queue %s/%s does not request acknowledgements: a message taken by the "
                "bridge leaves it before the remote accepted it",
                route.channel,
                route.queue_id,
            )

    def close(self) -> None:
        self.client.close()

    def _delivered(self, message: Message) -> None:
        """On the client's I/O thread: hand the delivery to the driver."""
        route = self._routes.get(message.channel)
        if route is None:  # not ours (the client joins only our channels)
            log.warning("delivery from unexpected channel %r ignored", message.channel)
            return
        self.sink(LocalDelivery(route, message))

    def ack(self, message: Message) -> None:
        if message.needs_ack:
            self.client.ack(message)

    def push(self, token: int, route: Route, payload: bytes, headers: Any) -> None:
        future = self.client.push_async(route.channel, route.queue_id, payload, headers=headers)
        future.add_done_callback(lambda done: self._pushed(token, done))

    def _pushed(self, token: int, done: Future[Any]) -> None:
        error = done.exception()
        if error is None:
            self.sink(LocalAccepted(token))
        else:
            self.sink(LocalRefused(token, str(error) or type(error).__name__))

    def dead_letter(self, record: dict[str, Any]) -> None:
        target = self.settings.dead_letter
        if target is None:
            return
        body = json.dumps(record, sort_keys=True).encode()
        self.client.push_async(target[0], target[1], body).add_done_callback(_log_failure)


def _log_failure(done: Future[Any]) -> None:
    error = done.exception()
    if error is not None:
        log.warning("dead-letter record not stored: %s", error)
