"""The services the engine lends its queues (their ``QueueHost``) and its timers.

:class:`QueueServices` holds what every queue shares: the configuration, the store, the
id factory, the delivery handlers, the wake-up timers, the error counter, a way to find
a connected client, and the engine's latest ``now`` (the time of the call being served).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from broker.engine.channel import Client
from broker.engine.delivery import DeliveryHandler
from broker.engine.errors import OperationError
from broker.engine.options import BrokerConfig
from broker.engine.queue.queue import Queue
from broker.engine.receipts import Receipts
from broker.protocol import ResultCode
from broker.store import Store

log = logging.getLogger("broker.engine.engine")


class QueueTimers:
    """Wake-up times of queues, earliest first (a queue may appear more than once: the
    entries a later wake-up supersedes are skipped when they come due)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Queue]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def wake(self, queue: Queue, when: float) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), queue))

    def pop_due(self, now: float) -> Queue | None:
        """The next queue whose wake-up time is ``<= now`` (None: nothing due)."""
        heap = self._heap
        if heap and heap[0][0] <= now:
            return heapq.heappop(heap)[2]
        return None

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and not heap[0][2].alive:
            heapq.heappop(heap)
        return heap[0][0] if heap else None


class QueueServices:
    """What a queue needs from the engine (``broker.engine.queue.protocols.QueueHost``)."""

    def __init__(
        self,
        config: BrokerConfig,
        store: Store,
        new_id: Callable[[], str],
        handler: DeliveryHandler,
        handlers: Mapping[str, DeliveryHandler],
        clients: Mapping[str, Client[Queue]],
    ) -> None:
        self.config = config
        self.store = store
        self.new_id = new_id
        self.handler = handler
        #: Delivery handlers a queue can select with its MessageDeliveryHandler option.
        self.handlers: dict[str, DeliveryHandler] = dict(handlers)
        self.clients = clients
        self.timers = QueueTimers()
        #: Errors caught inside the engine (hooks that raised, impossible counts...).
        self.errors = 0
        #: The ``now`` of the call being served (queues created on the fly drain with it).
        self.now = 0.0
        #: Receipts waiting for their message's fate (``broker.engine.receipts``).
        self.receipts = Receipts(new_id, config.limits.max_pending_receipts)
        #: How the message ids the doors of this engine make begin (each door's
        #: ``id_prefix``, :meth:`add_door_prefix`): only a message whose id begins so can
        #: share one with an AUTO delivery (``Dispatcher.send``).
        self.door_prefixes: tuple[str, ...] = ()

    def add_door_prefix(self, prefix: str) -> None:
        """A door makes ids beginning with ``prefix``.  Kept for the engine's life, a
        door closed included: its messages outlive it (queued, in flight to a consumer
        of another door).  One per door made: a handful in a process."""
        if prefix not in self.door_prefixes:
            self.door_prefixes += (prefix,)

    def client(self, client_id: str) -> Client[Any] | None:
        return self.clients.get(client_id)

    def wake(self, queue: Queue, when: float) -> None:
        self.timers.wake(queue, when)

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
