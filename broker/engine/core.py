"""The engine's state and the services every part of it uses.

:class:`EngineCore` is the bottom layer of :class:`broker.engine.Engine`: it holds the
configuration, the delivery handlers, the authorizer, the store and every table
(clients, channels, routers, event subscriptions, direct requests, queue timers), acts
as the queues' :class:`~broker.queue.QueueHost`, builds the answers to server
operations and failed requests, and keeps the routers.  The layers above it:
``broker.engine_channels`` (channels and queues), ``broker.engine_clients`` (clients
and direct messages) and ``broker.engine`` (frames in, time, recovery).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from broker import tmqp
from broker.engine import frames
from broker.engine.auth import AllowAll, Authorizer
from broker.engine.channel import Channel, Client
from broker.engine.delivery import DefaultDeliveryHandler, DeliveryHandler
from broker.engine.errors import OperationError
from broker.engine.events import EventHub
from broker.engine.options import BrokerConfig
from broker.engine.router import Router, router_from_json
from broker.protocol import Outgoing, ResultCode
from broker.store import MemoryStore, Store

if TYPE_CHECKING:
    from broker.engine.queue.queue import Queue

log = logging.getLogger("broker.engine.engine")


def _default_id_factory() -> Callable[[], str]:
    prefix = os.urandom(4).hex()
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter):x}"


class EngineCore:
    """State, queue host, replies and routers of the engine (see the module docstring)."""

    def __init__(
        self,
        *,
        handler: DeliveryHandler | None = None,
        authorizer: Authorizer | None = None,
        store: Store | None = None,
        new_id: Callable[[], str] | None = None,
        config: BrokerConfig | None = None,
        handlers: Mapping[str, DeliveryHandler] | None = None,
    ) -> None:
        self.config = config or BrokerConfig()
        self.handler = handler or DefaultDeliveryHandler()
        #: Delivery handlers a queue can select with its MessageDeliveryHandler option.
        self.handlers: dict[str, DeliveryHandler] = dict(handlers or {})
        self.authorizer = authorizer or AllowAll()
        self.store = store if store is not None else MemoryStore()
        self.new_id = new_id or _default_id_factory()
        self.clients: dict[str, Client] = {}
        self.channels: dict[str, Channel] = {}
        self.routers: dict[str, Router] = {}
        #: Queues in all channels (bounded by ``config.limits.max_queues``).
        self.queue_count = 0
        self.events = EventHub()
        self._by_name: dict[str, list[Client]] = {}
        self._by_type: dict[str, list[Client]] = {}
        self._requests: dict[tuple[str, str], set[str]] = {}
        self._timers: list[tuple[float, int, Queue]] = []
        self._timer_seq = itertools.count()
        for spec in self.config.routers:
            self.add_router(router_from_json(spec))
        self._now = 0.0
        self.errors = 0
        self.unmatched_acks = 0
        from broker.engine import operations

        self._operations = operations

    # ------------------------------------------------------------------ QueueHost

    def client(self, client_id: str) -> Client | None:
        return self.clients.get(client_id)

    def wake(self, queue: Queue, when: float) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), queue))

    def handler_for(self, key: str | None) -> DeliveryHandler:
        if key is None:
            return self.handler
        return self.handlers.get(key, self.handler)

    def check_handler(self, key: str | None) -> None:
        """OperationError (400) unless ``key`` names a registered delivery handler."""
        if key is not None and key not in self.handlers:
            raise OperationError(ResultCode.BAD_REQUEST, f"unknown delivery handler {key!r}")

    def count_error(self, where: str, error: Exception) -> None:
        self.errors += 1
        log.warning("error in %s: %r", where, error)

    # ------------------------------------------------------------------ replies

    def ack_frame(
        self, frame: tmqp.Frame, code: int, err: OperationError | None, high: bool = False
    ) -> tmqp.Frame:
        token, reason = (err.token, err.reason) if err is not None else (None, None)
        return frames.ack(code, frame.message_id, "", frame.target, token, reason, high)

    def reply(
        self,
        client: Client,
        frame: tmqp.Frame,
        out: list[Outgoing],
        *,
        response: bool,
        payload: bytes = b"",
        error: OperationError | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Answer a server operation: ACK (or RESPONSE when asked/for lists), code inside."""
        code = error.code if error is not None else ResultCode.OK
        if response or (frame.pending_response and not frame.pending_ack):
            reason = error.reason if error is not None else None
            out.append(
                Outgoing(
                    client.id,
                    frames.response(frame.message_id, client.id, code, reason, payload, headers),
                )
            )
        else:
            out.append(Outgoing(client.id, self.ack_frame(frame, code, error)))

    def answer_failure(
        self,
        client: Client,
        frame: tmqp.Frame,
        out: list[Outgoing],
        err: OperationError,
        direct: bool = False,
    ) -> None:
        """Tell a waiting sender why its message went nowhere (silence if it waits for none)."""
        if frame.pending_response:
            out.append(
                Outgoing(
                    client.id,
                    frames.response(frame.message_id, client.id, err.code, err.reason),
                )
            )
        elif frame.pending_ack:
            out.append(Outgoing(client.id, self.ack_frame(frame, err.code, err, high=direct)))

    # ------------------------------------------------------------------ routers

    def add_router(self, router: Router) -> Router:
        """Register a router (Python API; the wire has operation 601)."""
        if router.name in self.routers:
            raise OperationError(ResultCode.ALREADY_CREATED, f"router {router.name!r} exists")
        if len(self.routers) >= self.config.limits.max_routers:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many routers")
        if len(router.bindings) > self.config.limits.max_bindings_per_router:
            raise OperationError(ResultCode.LIMIT_EXCEEDED, "too many bindings")
        self.routers[router.name] = router
        return router

    def remove_router(self, name: str) -> bool:
        return self.routers.pop(name, None) is not None
