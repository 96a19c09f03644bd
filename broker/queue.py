"""A channel queue: statuses, delivery to consumers, acknowledges, timeouts, put-backs.

Messages wait in two deques (high priority first).  Removal from the middle (message
timeout) is lazy: the message is marked finished and skipped when reached, while the
counters stay exact.  Deliveries waiting for a consumer acknowledge live in an ordered
dict keyed by (consumer id, message id) in send order, so the oldest deadline is always
first (after an AcknowledgeTimeout change, deliveries made under the old value may time
out up to that difference late).  Every message gets a per-queue sequence number that
grows monotonically.

The queue never reads a clock and never touches the wire: it appends
:class:`~broker.protocol.Outgoing` frames to the list it is given and asks its host (the
engine) to wake it at its next deadline.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from broker import models, tmqp
from broker.delivery import (
    ALLOW,
    AckWhen,
    Decision,
    DefaultDeliveryHandler,
    DeliveryHandler,
    PutBack,
)
from broker.frames import ack as ack_frame
from broker.frames import derive
from broker.message import DELAYED, DONE, INFLIGHT, QUEUED, Delivery, QueueMessage
from broker.options import ChannelQueueOptions
from broker.protocol import (
    Header,
    MessageType,
    NackReason,
    Outgoing,
    QueueStatus,
    ResultCode,
    header,
)
from broker.store import Store, StoredMessage

if TYPE_CHECKING:
    from broker.channel import Channel, Client

_QUEUE = int(MessageType.QUEUE)
_PUSH = QueueStatus.PUSH
_RR = QueueStatus.ROUND_ROBIN
_BROADCAST = QueueStatus.BROADCAST
_INF = float("inf")
#: ``Outgoing(client_id, frame)`` without the named tuple's Python-level __new__.
_outgoing = tuple.__new__


class QueueHost(Protocol):
    """What a queue needs from the engine."""

    store: Store

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


class Queue:
    """One queue of a channel; see the module docstring."""

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
        self._rr = 0
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
        self.errors = 0
        self.last_received: float | None = None
        self.last_sent: float | None = None
        self.options = options
        self.status = options.status
        self.handler = host.handler_for(options.message_delivery_handler)
        self._bind_handler()

    # ------------------------------------------------------------------ options

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

    def apply_options(self, options: ChannelQueueOptions, now: float, out: list[Outgoing]) -> None:
        """Switch options (status included) at runtime; only Stopped clears messages."""
        old = self.options
        self.options = options
        self.status = options.status
        self._out_version += 1
        if options.message_delivery_handler != old.message_delivery_handler:
            self.handler = self.host.handler_for(options.message_delivery_handler)
            self._bind_handler()
        else:
            self._refresh_plain()
        if options.status is QueueStatus.STOPPED and old.status is not QueueStatus.STOPPED:
            self.clear(out, priority=True, regular=True, in_flight=True)
        self.drain(now, out)

    def information(self, wall: float, now: float) -> dict[str, Any]:
        """QueueInformation (document model); ``wall``/``now``: current wall/monotonic."""
        return models.queue_information(self, wall, now)

    def summary(self) -> dict[str, Any]:
        """QueueSummary / QueueEvent model."""
        return models.queue_summary(self)

    @property
    def message_count(self) -> int:
        return self.n_priority + self.n_regular

    def is_empty(self) -> bool:
        return not (self.n_priority or self.n_regular or self.pending or self._delayed)

    # ------------------------------------------------------------------ push

    def check_push(self, size: int) -> int:
        """Result code a push of ``size`` payload octets would get (0 = accepted)."""
        status = self.status
        if status is QueueStatus.STOPPED:
            return ResultCode.UNACCEPTABLE
        opts = self.options
        if opts.message_size_limit and size > opts.message_size_limit:
            return ResultCode.LIMIT_EXCEEDED
        if (
            opts.message_limit
            and status is not _BROADCAST
            and self.n_priority + self.n_regular >= opts.message_limit
        ):
            return ResultCode.LIMIT_EXCEEDED
        return 0

    def push_plain(
        self, frame: tmqp.Frame, sender: Client, now: float, out: list[Outgoing]
    ) -> bool:
        """Deliver a push at once when nothing could decide otherwise; False: use accept.

        Taken when the queue is :attr:`plain` (default hooks, no acknowledge requests,
        no message timeout, names not hidden), in push or round-robin status, nothing
        waits in it, the frame is a QUEUE frame of this queue without headers or wait
        flags, and it passes the size limit.  Then :meth:`accept` would send the frame
        (source stamped) to the consumers and finish the message: this does the same,
        counters included, without the per-message bookkeeping objects.  The caller has
        checked the authorization and that no MESSAGE_PRODUCED subscriber waits.
        """
        status = self.status
        consumers = self.channel.consumer_list
        if (
            not self.plain
            or (status is not _PUSH and status is not _RR)
            or not consumers
            or self.n_priority
            or self.n_regular
            or self._front
            or frame.headers
            or frame.pending_ack
            or frame.pending_response
            or frame.first_acquirer
            or frame.message_type != _QUEUE
            or frame.content_type != self.id
            or frame.target != self.channel.name
        ):
            return False
        opts = self.options
        if (opts.wait_for_acknowledge and self.pending) or (
            opts.message_size_limit and len(frame.payload) > opts.message_size_limit
        ):
            return False
        if not frame.message_id and opts.use_message_id:
            return False  # accept() gives it an id
        if frame.source != sender.id:
            frame = frame.replace(source=sender.id)
        self.sequence += 1
        self.received += 1
        self.sent += 1
        self.last_received = self.last_sent = now
        if status is _RR:
            i = self._rr % len(consumers)
            self._rr = (i + 1) % len(consumers)
            out.append(_outgoing(Outgoing, (consumers[i].id, frame)))
            self.deliveries += 1
        else:
            for c in consumers:
                out.append(_outgoing(Outgoing, (c.id, frame)))
            self.deliveries += len(consumers)
        return True

    def accept(
        self,
        frame: tmqp.Frame,
        sender: Client | None,
        now: float,
        out: list[Outgoing],
        producer_waits: bool,
        headers: tuple[tuple[str, str], ...] | None = None,
        message_id: str | None = None,
    ) -> QueueMessage | None:
        """Enqueue (or broadcast) a pushed message that passed :meth:`check_push`.

        ``headers``/``message_id`` override the frame's (CC copies, routers).  Returns
        the message, or None when the delivery handler rejected it.
        """
        opts = self.options
        mid = frame.message_id if message_id is None else message_id
        if not mid and (opts.use_message_id or opts.request_acknowledge or producer_waits):
            mid = self.host.new_id()
        src = sender.id if sender is not None else frame.source
        hdrs = frame.headers if headers is None else headers
        if (
            frame.source != src
            or frame.message_id != mid
            or frame.pending_ack
            or frame.pending_response
            or frame.content_type != self.id
            or frame.target != self.channel.name
            or frame.message_type != _QUEUE
            or hdrs is not frame.headers
        ):
            frame = derive(frame, _QUEUE, False, False, self.id, mid, src, self.channel.name, hdrs)
        self.sequence += 1
        m = QueueMessage(self.sequence, frame, sender, producer_waits, now)
        self.received += 1
        self.last_received = now
        try:
            d = self.handler.received_from_producer(self, m, sender)
        except Exception as exc:
            self._error("received_from_producer", exc)
            d = Decision(allow=False, send_ack=AckWhen.NEGATIVE)
        if d is not ALLOW:
            if d.save:
                self._save(m)
            if d.send_ack is not AckWhen.NONE:
                self._ack(m, d.send_ack, out, NackReason.UNACCEPTABLE)
            if not d.allow and d.put_back is PutBack.NO:
                self.drop(m, out, NackReason.UNACCEPTABLE)
                return None
        status = self.status
        if status is _BROADCAST:
            consumers = self.channel.consumer_list
            sent = bool(consumers) and self._send(m, consumers, now, out, keep=False)
            if not sent and m.state == QUEUED:  # nobody took it: broadcast does not keep it
                self.drop(m, out, NackReason.NO_CONSUMERS, count=False)
            return m
        if status is QueueStatus.CACHE:
            self.clear(out, priority=True, regular=True, in_flight=False)
        if opts.message_timeout:
            m.deadline = now + opts.message_timeout / 1000.0
            self._expiry.append((m.deadline, m))
            if self.wake_at is None:
                self._arm(m.deadline)
        if status is _PUSH or status is _RR:
            consumers = self.channel.consumer_list
            if (
                consumers
                and not (self.n_priority or self.n_regular or self._front)
                and not (opts.wait_for_acknowledge and self.pending)
            ):
                # fast path: nothing waits ahead of it, send without queueing
                # (a message nobody can take is put at the front by _send)
                self._send(m, consumers, now, out)
                return m
        if m.high_priority:
            self.priority.append(m)
            self.n_priority += 1
        else:
            self.regular.append(m)
            self.n_regular += 1
        if status is _PUSH or status is _RR:
            self.drain(now, out)
        return m

    # ------------------------------------------------------------------ delivery

    def drain(self, now: float, out: list[Outgoing]) -> None:
        """Send waiting messages to consumers as far as the status and options allow."""
        if self._front:
            self.flush_front()
        status = self.status
        if status is not _PUSH and status is not _RR and status is not _BROADCAST:
            return
        consumers = self.channel.consumer_list
        if not consumers or not (self.n_priority or self.n_regular):
            return
        wait = self.options.wait_for_acknowledge
        while True:
            if wait and self.pending:
                return
            m = self.next_first()
            if m is None:
                return
            if m.deadline and m.deadline <= now:
                self.expire(m, out)
                continue
            if not self._send(m, consumers, now, out):
                return

    def _send(
        self,
        m: QueueMessage,
        consumers: Sequence[Client],
        now: float,
        out: list[Outgoing],
        keep: bool = True,
    ) -> bool:
        """Send a dequeued message; False stops the drain (message back at the front).

        With ``keep`` False (a broadcast message never enqueued) a message no consumer can
        take stays out of the queue, in state QUEUED, for the caller to drop.
        """
        if self.wants_begin_send:
            d = self.hook(m, "begin_send", self, m)
            if d is not ALLOW:
                self.side_effects(m, d, out)
                if not d.allow:
                    if d.put_back is not PutBack.NO:
                        self.put_back(m, d.put_back, now, out)
                        return False
                    self.drop(m, out, NackReason.UNACCEPTABLE)
                    return True
        opts = self.options
        req_ack = opts.request_acknowledge
        targets: Sequence[Client]
        if self.status is _RR:
            targets = self._choose_one(m, consumers, True, req_ack)
        elif opts.send_only_first_acquirer or m.frame.first_acquirer:
            targets = self._choose_one(m, consumers, False, req_ack)
        elif self._h_can or req_ack:
            targets = [c for c in consumers if self._eligible(m, c, req_ack)]
        else:
            targets = consumers
        if not targets:
            if keep:
                self.unpop(m)
            return False
        frame = m.out
        if frame is None or m.out_version != self._out_version:
            frame = self._out_frame(m)
        self.sent += 1
        self.last_sent = now
        self.deliveries += len(targets)
        if req_ack:
            timeout = opts.acknowledge_timeout
            deadline = now + timeout / 1000.0 if timeout else _INF
            for c in targets:
                out.append(Outgoing(c.id, frame))
                self._track(m, c, deadline)
            m.state = INFLIGHT
            if self._h_received:
                for c in targets:
                    dl = self.pending.get((c.id, m.message_id))
                    if dl is not None:
                        self.side_effects(m, self.hook(m, "consumer_received", self, dl, c), out)
        else:
            m.state = INFLIGHT
            for c in targets:
                out.append(Outgoing(c.id, frame))
            if self._h_received:
                for c in targets:
                    d = self.hook(m, "consumer_received", self, Delivery(m, c, 0.0), c)
                    if d is not ALLOW:
                        self.side_effects(m, d, out)
                        if d.put_back is not PutBack.NO and m.state == INFLIGHT:
                            self.put_back(m, d.put_back, now, out)
        if self._h_end:
            d = self.hook(m, "end_send", self, m)
            if d is not ALLOW:
                self.side_effects(m, d, out)
                if not req_ack and d.put_back is not PutBack.NO and m.state == INFLIGHT:
                    self.put_back(m, d.put_back, now, out)
        if m.state != INFLIGHT:
            return False  # put back by a hook: stop this drain pass
        if not req_ack:
            self._complete(m)
        return True

    def _eligible(self, m: QueueMessage, c: Client, req_ack: bool) -> bool:
        if req_ack and (c.id, m.message_id) in self.pending:
            return False  # same id still unacknowledged by this consumer
        if self._h_can:
            try:
                return bool(self.handler.can_consumer_receive(self, m, c))
            except Exception as exc:
                self._error("can_consumer_receive", exc)
                return False
        return True

    def eligible(self, m: QueueMessage, c: Client) -> bool:
        """May consumer ``c`` receive ``m`` (the handler's can_consumer_receive)?"""
        return not self._h_can or self._eligible(m, c, False)

    def after_send(
        self, m: QueueMessage, c: Client, req_ack: bool, deadline: float, out: list[Outgoing]
    ) -> None:
        """Bookkeeping after ``m`` went to ``c`` outside a drain (pull)."""
        if req_ack:
            self._track(m, c, deadline)
        if self._h_received:
            dl = self.pending.get((c.id, m.message_id)) if req_ack else None
            self.side_effects(
                m, self.hook(m, "consumer_received", self, dl or Delivery(m, c, 0.0), c), out
            )
        if self._h_end:
            self.side_effects(m, self.hook(m, "end_send", self, m), out)
        if not req_ack and m.state == INFLIGHT:
            self._complete(m)

    def _choose_one(
        self, m: QueueMessage, consumers: Sequence[Client], rotate: bool, req_ack: bool
    ) -> tuple[Client, ...]:
        n = len(consumers)
        start = self._rr % n if rotate else 0
        check = req_ack or self._h_can
        for i in range(n):
            c = consumers[(start + i) % n]
            if not check or self._eligible(m, c, req_ack):
                if rotate:
                    self._rr = (start + i + 1) % n
                return (c,)
        return ()

    def _track(self, m: QueueMessage, c: Client, deadline: float) -> None:
        self.pending[(c.id, m.message_id)] = Delivery(m, c, deadline)
        m.inflight += 1
        c.pending_queues.add(self)
        if deadline != _INF:
            self._arm(deadline)

    def _out_frame(self, m: QueueMessage) -> tmqp.Frame:
        f = m.frame
        opts = self.options
        if opts.request_acknowledge or (opts.hide_client_names and f.source):
            source = "" if opts.hide_client_names else f.source
            f = derive(
                f,
                _QUEUE,
                False,
                opts.request_acknowledge,
                self.id,
                f.message_id,
                source,
                f.target,
                f.headers,
            )
        m.out = f
        m.out_version = self._out_version
        return f

    # ------------------------------------------------------------------ pull

    def pull(
        self, client: Client, request: tmqp.Frame, now: float, out: list[Outgoing], max_count: int
    ) -> None:
        """Answer a pull request from a consumer of the channel (checks done by the caller)."""
        from broker.pull import answer_pull

        answer_pull(self, client, request, now, out, max_count)

    # ------------------------------------------------------------------ acknowledges

    def on_ack(self, client: Client, ack: tmqp.Frame, now: float, out: list[Outgoing]) -> bool:
        """A consumer acknowledge for this queue; False when no delivery matches."""
        dl = self.pending.pop((client.id, ack.message_id), None)
        if dl is None:
            return False
        m = dl.message
        m.inflight -= 1
        reason = header(ack, Header.NACK_REASON) if ack.headers else None
        success = reason is None
        if success:
            self.acks += 1
        else:
            self.nacks += 1
        d = self.hook(m, "acknowledge_received", self, ack, dl, success)
        self._resolve(m, d, now, out, reason or NackReason.NONE, client.id, success)
        self.drain(now, out)
        return True

    def consumer_gone(self, client: Client, now: float, out: list[Outgoing]) -> None:
        """The consumer disconnected: its unacknowledged deliveries fail."""
        gone = [(key, dl) for key, dl in self.pending.items() if key[0] == client.id]
        for key, dl in reversed(gone):  # reversed: put-backs at the start keep their order
            del self.pending[key]
            m = dl.message
            m.inflight -= 1
            self.nacks += 1
            d = self.hook(m, "consumer_receive_failed", self, dl, client)
            self._resolve(m, d, now, out, NackReason.SEND_ERROR, "", False)

    def _resolve(
        self,
        m: QueueMessage,
        d: Decision,
        now: float,
        out: list[Outgoing],
        reason: str,
        source: str,
        success: bool,
    ) -> None:
        if d.save and not m.saved:
            self._save(m)
        when = d.send_ack
        if when is not AckWhen.NONE:
            if when is AckWhen.ALWAYS and not success:
                when = AckWhen.NEGATIVE
            self._ack(m, when, out, reason, source)
        if d.put_back is not PutBack.NO:
            if m.state == INFLIGHT:
                self.put_back(m, d.put_back, now, out)
            return
        if m.inflight <= 0 and m.state == INFLIGHT:
            self._complete(m)

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

    # ------------------------------------------------------------------ timers

    def tick(self, now: float, out: list[Outgoing]) -> None:
        """Run put-back delays, acknowledge timeouts and message timeouts due by ``now``."""
        self.wake_at = None
        if not self.alive:
            return
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            _, m, where = delayed.popleft()
            if m.state == DELAYED:
                self._requeue(m, where)
        pending = self.pending
        while pending:
            key = next(iter(pending))
            dl = pending[key]
            if dl.deadline > now:
                break
            del pending[key]
            m = dl.message
            m.inflight -= 1
            self.nacks += 1
            d = self.hook(m, "acknowledge_timed_out", self, dl)
            self._resolve(m, d, now, out, NackReason.TIMEOUT, "", False)
        expiry = self._expiry
        while expiry and expiry[0][0] <= now:
            _, m = expiry.popleft()
            if m.state == QUEUED:
                if m.high_priority:
                    self.n_priority -= 1
                else:
                    self.n_regular -= 1
                self.expire(m, out)
        self.drain(now, out)
        self._schedule()

    def next_deadline(self) -> float | None:
        when = _INF
        if self._delayed:
            when = self._delayed[0][0]
        if self.pending:
            when = min(when, next(iter(self.pending.values())).deadline)
        if self._expiry:
            when = min(when, self._expiry[0][0])
        return None if when == _INF else when

    def _schedule(self) -> None:
        when = self.next_deadline()
        if when is not None:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self.wake_at is None or when < self.wake_at:
            self.wake_at = when
            self.host.wake(self, when)

    def expire(self, m: QueueMessage, out: list[Outgoing]) -> None:
        """A queued message (already uncounted) passed its MessageTimeout."""
        m.state = DONE
        self.timeouts += 1
        d = self.hook(m, "message_timed_out", self, m)
        if d.save and not m.saved:
            self._save(m)
        if d.send_ack is not AckWhen.NONE:
            self._ack(m, d.send_ack, out, NackReason.TIMEOUT)
        self._finish(m)

    # ------------------------------------------------------------------ internals

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
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1
        if where is PutBack.START:
            self._front.append(m)
        else:
            (self.priority if m.high_priority else self.regular).append(m)

    def put_back(self, m: QueueMessage, where: PutBack, now: float, out: list[Outgoing]) -> None:
        m.put_backs += 1
        limit = self.options.put_back_limit
        if limit and m.put_backs > limit:
            self.drop(m, out, NackReason.LIMIT_EXCEEDED)
            return
        if not self.alive or self.status is QueueStatus.STOPPED:
            self.drop(m, out, NackReason.CLEARED)
            return
        delay = self.options.put_back_delay
        if delay:
            m.state = DELAYED
            due = now + delay / 1000.0
            self._delayed.append((due, m, where))
            self._arm(due)
        else:
            self._requeue(m, where)

    def side_effects(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> None:
        """Save and acknowledge effects of a decision."""
        if d.save and not m.saved:
            self._save(m)
        if d.send_ack is not AckWhen.NONE:
            self._ack(m, d.send_ack, out, NackReason.NONE)

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
                self.handler.message_dequeued(self, m)
            except Exception as exc:
                self._error("message_dequeued", exc)

    def _complete(self, m: QueueMessage) -> None:
        self._finish(m)

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

    def restore(self, stored: StoredMessage, producer: Client | None, now: float) -> None:
        """Re-enqueue a message recovered from the store (keeps its sequence number)."""
        m = QueueMessage(stored.sequence, stored.frame, producer, False, now)
        m.saved = True
        m.put_backs = stored.put_backs
        self.sequence = max(self.sequence, m.seq)
        self._requeue(m, PutBack.END)

    def hook(self, m: QueueMessage | None, name: str, *args: Any) -> Decision:
        try:
            result: Decision = getattr(self.handler, name)(*args)
            return result
        except Exception as exc:
            self._error(name, exc)
            try:
                return self.handler.exception_thrown(self, m, exc)
            except Exception as exc2:
                self._error("exception_thrown", exc2)
                return ALLOW

    def _error(self, where: str, exc: Exception) -> None:
        self.errors += 1
        self.host.count_error(f"queue {self.channel.name}/{self.id} {where}", exc)
