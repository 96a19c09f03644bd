"""The state of a channel queue: its messages, counters, options, store and hooks.

Messages wait in two deques (high priority first).  Removal from the middle (message
timeout) is lazy: the message is marked finished and skipped when reached, while the
counters stay exact.  Every message gets a per-queue sequence number that grows
monotonically.

:class:`QueueCore` is the bottom layer of :class:`broker.engine.queue.queue.Queue`: it holds every
attribute, takes messages out of and back into the deques, saves and forgets them in the
store, acknowledges producers, removes messages (drop, clear, close) and calls the
delivery handler's hooks.  The layers above it: ``broker.engine.queue.acks`` (acknowledges,
put-backs, timers), ``broker.engine.queue.delivery`` (sending to consumers) and
``broker.queue`` (pushes, options).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any, Protocol

from broker.engine.delivery import (
    ALLOW,
    AckWhen,
    Decision,
    DefaultDeliveryHandler,
    DeliveryHandler,
    PutBack,
)
from broker.engine.frames import ack as ack_frame
from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Delivery, QueueMessage
from broker.engine.options import BrokerConfig, ChannelQueueOptions
from broker.engine.queue.statuses import StatusStrategy, strategy_for
from broker.protocol import NackReason, Outgoing
from broker.store import Store, StoredMessage

if TYPE_CHECKING:
    from broker.engine.channel import Channel, Client
    from broker.engine.queue.queue import Queue

_INF = float("inf")


class QueueHost(Protocol):
    """What a queue needs from the engine."""

    store: Store
    config: BrokerConfig

    def client(self, client_id: str) -> Client | None: ...

    def new_id(self) -> str: ...

    def wake(self, queue: Queue, when: float) -> None: ...

    def handler_for(self, key: str | None) -> DeliveryHandler: ...

    def count_error(self, where: str, error: Exception) -> None: ...


_PLAIN_RECEIVED = (
    DeliveryHandler.received_from_producer,
    DefaultDeliveryHandler.received_from_producer,
)


def _overrides(handler: DeliveryHandler, name: str) -> bool:
    return getattr(type(handler), name) is not getattr(DeliveryHandler, name)


class QueueCore:
    """State, message deques, store and hooks of a queue (see the module docstring)."""

    #: Deadline of a delivery whose queue has no acknowledge timeout.
    NEVER = _INF

    def __init__(
        self, channel: Channel, queue_id: int, options: ChannelQueueOptions, host: QueueHost
    ) -> None:
        self.channel = channel
        self.id = queue_id
        self.key = (channel.name, queue_id)
        self.host = host
        self.priority: deque[QueueMessage] = deque()
        self.regular: deque[QueueMessage] = deque()
        self.n_priority = 0
        self.n_regular = 0
        self._front: list[QueueMessage] = []  # put back at the start, not yet in a deque
        self.pending: OrderedDict[tuple[str, str], Delivery] = OrderedDict()
        self._expiry: deque[tuple[float, QueueMessage]] = deque()
        self._delayed: deque[tuple[float, QueueMessage, PutBack]] = deque()
        self.sequence = 0
        self.alive = True
        self.rr = 0
        #: Deliveries in flight per consumer id (see ``broker.flow``); absent means none.
        self.used: dict[str, int] = {}
        #: The last drain stopped with messages waiting and no consumer able to take one
        #: (full windows): the next settled delivery drains again.
        self.stalled = False
        #: Earliest deadline the engine was asked to wake this queue for (None: nothing).
        self.wake_at: float | None = None
        self._out_version = 0
        # counters (QueueInformation)
        self.received = 0
        self.sent = 0
        self.deliveries = 0
        self.acks = 0
        self.nacks = 0
        self.timeouts = 0
        self.saves = 0
        self.removed = 0
        #: Broadcast copies not sent because the consumer's window was full or it left.
        self.dropped = 0
        self.errors = 0
        self.last_received: float | None = None
        self.last_sent: float | None = None
        self.options = options
        self.status = options.status
        #: What the status decides (``broker.engine.queue.statuses``).
        self.strategy: StatusStrategy = strategy_for(options.status)
        self.window = self._window(options)
        self.handler = host.handler_for(options.message_delivery_handler)
        self._bind_handler()

    # ------------------------------------------------------------------ options

    def _window(self, options: ChannelQueueOptions) -> int:
        """Deliveries in flight per consumer unless it asked for its own at JOIN."""
        config = self.host.config
        return min(options.prefetch or config.prefetch, config.max_prefetch)

    def _bind_handler(self) -> None:
        h = self.handler
        self.wants_begin_send = _overrides(h, "begin_send")
        self._h_can = _overrides(h, "can_consumer_receive")
        self._h_received = _overrides(h, "consumer_received")
        self._h_end = _overrides(h, "end_send")
        self._h_dequeued = _overrides(h, "message_dequeued")
        # The default handler's received_from_producer only acknowledges a producer that
        # waits for it, and such pushes never take push_plain.
        self._h_from = type(h).received_from_producer not in _PLAIN_RECEIVED
        self._refresh_plain()

    def _refresh_plain(self) -> None:
        """Decide whether pushes may take :meth:`push_plain` (nothing can intervene)."""
        opts = self.options
        self.plain = not (
            self._h_from
            or self.wants_begin_send
            or self._h_can
            or self._h_received
            or self._h_end
            or self._h_dequeued
            or opts.request_acknowledge
            or opts.send_only_first_acquirer
            or opts.hide_client_names
            or opts.message_timeout
        )

    @property
    def message_count(self) -> int:
        return self.n_priority + self.n_regular

    def waiting(self) -> bool:
        """Messages wait in the queue (a new one would queue behind them)."""
        return bool(self.n_priority or self.n_regular or self._front)

    def blocked(self) -> bool:
        """WaitForAcknowledge holds every send until the pending acknowledges arrive."""
        return bool(self.options.wait_for_acknowledge and self.pending)

    def enqueue(self, m: QueueMessage) -> None:
        """Append a new message to the end of its deque."""
        if m.high_priority:
            self.priority.append(m)
            self.n_priority += 1
        else:
            self.regular.append(m)
            self.n_regular += 1

    def is_empty(self) -> bool:
        return not (self.n_priority or self.n_regular or self.pending or self._delayed)

    # ------------------------------------------------------------------ windows

    def room(self, c: Client) -> bool:
        """May consumer ``c`` take one more delivery of this queue now?"""
        limit = c.prefetch.get(self.channel.name) or self.window
        return self.used.get(c.id, 0) < limit

    def _release(self, client_id: str) -> None:
        """One of the consumer's deliveries left its window."""
        used = self.used
        n = used.get(client_id, 0) - 1
        if n > 0:
            used[client_id] = n
        else:
            used.pop(client_id, None)

    def _return(self, m: QueueMessage, out: list[Outgoing]) -> None:
        """A message that never reached its consumer goes back to the front of the queue."""
        if not self.alive:
            return  # removed with its queue (and the queue's store)
        if not self.strategy.keeps_returns:
            self.drop(m, out, NackReason.CLEARED)
        else:
            self._requeue(m, PutBack.START)

    # ------------------------------------------------------------------ the deques

    def next_first(self) -> QueueMessage | None:
        dq = self.priority
        while dq:
            m = dq.popleft()
            if m.state == QUEUED:
                self.n_priority -= 1
                return m
        dq = self.regular
        while dq:
            m = dq.popleft()
            if m.state == QUEUED:
                self.n_regular -= 1
                return m
        return None

    def next_last(self) -> QueueMessage | None:
        for dq, high in ((self.priority, True), (self.regular, False)):
            while dq:
                m = dq.pop()
                if m.state == QUEUED:
                    if high:
                        self.n_priority -= 1
                    else:
                        self.n_regular -= 1
                    return m
        return None

    def unpop(self, m: QueueMessage, last: bool = False) -> None:
        m.state = QUEUED
        dq = self.priority if m.high_priority else self.regular
        if last:
            dq.append(m)
        else:
            dq.appendleft(m)
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1

    def flush_front(self) -> None:
        front = self._front
        self._front = []
        for m in reversed(front):
            (self.priority if m.high_priority else self.regular).appendleft(m)

    def _requeue(self, m: QueueMessage, where: PutBack) -> None:
        m.state = QUEUED
        m.out = None  # the next send may carry a Delivery-Count
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1
        if where is PutBack.START:
            self._front.append(m)
        else:
            (self.priority if m.high_priority else self.regular).append(m)

    def restore(self, stored: StoredMessage, producer: Client | None, now: float) -> None:
        """Re-enqueue a message recovered from the store (keeps its sequence number)."""
        m = QueueMessage(stored.sequence, stored.frame, producer, False, now)
        m.saved = True
        m.put_backs = stored.put_backs
        self.sequence = max(self.sequence, m.seq)
        self._requeue(m, PutBack.END)

    # ------------------------------------------------------------------ store, producer

    def side_effects(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> None:
        """Save and acknowledge effects of a decision."""
        if d.save and not m.saved:
            self._save(m)
        if d.send_ack is not AckWhen.NONE:
            self._ack(m, d.send_ack, out, NackReason.NONE)

    def _ack(
        self, m: QueueMessage, when: AckWhen, out: list[Outgoing], reason: str, source: str = ""
    ) -> None:
        """Acknowledge the producer (once per message, only if it waits for it)."""
        if m.acked or not m.producer_waits or (when is AckWhen.IF_SAVED and not m.saved):
            return
        m.acked = True
        producer = m.producer
        if producer is None or self.host.client(producer.id) is not producer:
            return  # gone: nobody to tell
        nack = reason if when is AckWhen.NEGATIVE else None
        frame = ack_frame(self.id, m.message_id, source, self.channel.name, nack)
        out.append(Outgoing(producer.id, frame))

    def _save(self, m: QueueMessage) -> None:
        try:
            producer = m.producer.id if m.producer is not None else ""
            self.host.store.append(self.key, StoredMessage(m.seq, m.frame, producer, m.put_backs))
        except Exception as exc:
            self._error("store.append", exc)
            return
        m.saved = True
        self.saves += 1

    def _finish(self, m: QueueMessage) -> None:
        m.state = DONE
        if m.saved:
            m.saved = False
            try:
                self.host.store.remove(self.key, m.seq)
            except Exception as exc:
                self._error("store.remove", exc)
        if self._h_dequeued:
            try:
                self.handler.message_dequeued(self, m)  # type: ignore[arg-type]
            except Exception as exc:
                self._error("message_dequeued", exc)

    def _complete(self, m: QueueMessage) -> None:
        self._finish(m)

    # ------------------------------------------------------------------ removal

    def drop(self, m: QueueMessage, out: list[Outgoing], reason: str, count: bool = True) -> None:
        """Remove a message that was not consumed; a waiting producer gets a nack."""
        if count:
            self.removed += 1
        self._ack(m, AckWhen.NEGATIVE, out, reason)
        self._finish(m)

    def clear(self, out: list[Outgoing], *, priority: bool, regular: bool, in_flight: bool) -> int:
        """Remove waiting (and optionally in-flight / delayed) messages; returns the count."""
        if self._front:
            self.flush_front()
        removed = 0
        for wanted, dq in ((priority, self.priority), (regular, self.regular)):
            if not wanted:
                continue
            for m in dq:
                if m.state == QUEUED:
                    self.drop(m, out, NackReason.CLEARED)
                    removed += 1
            dq.clear()
        if priority:
            self.n_priority = 0
        if regular:
            self.n_regular = 0
        if in_flight:
            for dl in self.pending.values():
                self._release(dl.receiver.id)
                if dl.message.state == INFLIGHT:
                    self.drop(dl.message, out, NackReason.CLEARED)
            self.pending.clear()
            for _, m, _where in self._delayed:
                if m.state == DELAYED:
                    self.drop(m, out, NackReason.CLEARED)
            self._delayed.clear()
            self._expiry.clear()
        return removed

    def close(self, out: list[Outgoing]) -> None:
        """The queue is removed: drop everything and stop timers."""
        self.clear(out, priority=True, regular=True, in_flight=True)
        self.alive = False

    # ------------------------------------------------------------------ hooks

    def hook(self, m: QueueMessage | None, name: str, *args: Any) -> Decision:
        try:
            result: Decision = getattr(self.handler, name)(*args)
            return result
        except Exception as exc:
            self._error(name, exc)
            try:
                return self.handler.exception_thrown(self, m, exc)  # type: ignore[arg-type]
            except Exception as exc2:
                self._error("exception_thrown", exc2)
                return ALLOW

    def _error(self, where: str, exc: Exception) -> None:
        self.errors += 1
        self.host.count_error(f"queue {self.channel.name}/{self.id} {where}", exc)
