"""A channel queue: statuses, delivery to consumers, acknowledges, timeouts, put-backs.

:class:`Queue` is built in layers, one module each (every layer is a base class of the
next, so a method call costs what it did when the queue was one class):

* ``broker.queue_core`` -- the state: message deques, counters, options, the store,
  producer acknowledges, removal, delivery handler hooks;
* ``broker.queue_acks`` -- consumer acknowledges, put-backs and timers;
* ``broker.queue_delivery`` -- sending waiting messages to consumers;
* this module -- pushes (the general :meth:`Queue.accept` and the plain-push fast path
  :meth:`Queue.push_plain`), pull requests and runtime option changes.

The lower layers pass ``self`` where a :class:`Queue` is expected (the handler's hooks,
the engine's timers): it always is one, which the type checker cannot know, hence their
few ``type: ignore[arg-type]`` comments.

The queue never reads a clock and never touches the wire: it appends
:class:`~broker.protocol.Outgoing` frames to the list it is given and asks its host (the
engine) to wake it at its next deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker import tmqp
from broker.engine import models
from broker.engine.delivery import ALLOW, AckWhen, Decision, PutBack
from broker.engine.flow import PLAIN
from broker.engine.frames import derive
from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Delivery, QueueMessage
from broker.engine.options import ChannelQueueOptions
from broker.engine.queue.core import QueueHost
from broker.engine.queue.delivery import QueueDelivery
from broker.protocol import MessageType, NackReason, Outgoing, QueueStatus, ResultCode, Tracked

if TYPE_CHECKING:
    from broker.engine.channel import Client

__all__ = [
    "DELAYED",
    "DONE",
    "INFLIGHT",
    "QUEUED",
    "Delivery",
    "Queue",
    "QueueHost",
    "QueueMessage",
]

_QUEUE = int(MessageType.QUEUE)
_PUSH = QueueStatus.PUSH
_RR = QueueStatus.ROUND_ROBIN
_BROADCAST = QueueStatus.BROADCAST
#: ``Tracked(client_id, frame)`` without the named tuple's Python-level __new__.
_tracked = tuple.__new__


class Queue(QueueDelivery):
    """One queue of a channel; see the module docstring."""

    # ------------------------------------------------------------------ options

    def apply_options(self, options: ChannelQueueOptions, now: float, out: list[Outgoing]) -> None:
        """Switch options (status included) at runtime; only Stopped clears messages."""
        old = self.options
        self.options = options
        self.status = options.status
        self.window = self._window(options)
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
        """Take a push without the general path when nothing could decide otherwise.

        Taken when the queue is :attr:`plain` (default hooks, no acknowledge requests,
        no message timeout, names not hidden), in push or round-robin status, the frame
        is a QUEUE frame of this queue without headers or wait flags, and it passes the
        size limit.  Then :meth:`accept` would send the frame (source stamped) to a
        consumer or queue it: this does the same with less bookkeeping.  Sent at once
        (nothing waits, one consumer takes it: round robin, or push with one consumer)
        it needs no QueueMessage at all: the frame and its sequence number are enough
        to put it back if the consumer goes away before it is sent (``broker.flow``).
        Returns False (use :meth:`accept`) for anything else.  The caller has checked
        the authorization and that no MESSAGE_PRODUCED subscriber waits.
        """
        status = self.status
        if (
            not self.plain
            or (status is not _PUSH and status is not _RR)
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
        consumers = self.channel.consumer_list
        c: Client | None = None
        if consumers and not (self.n_priority or self.n_regular or self._front):
            if len(consumers) == 1:
                c = consumers[0]
                if not self.room(c):
                    c = None  # its window is full: the message waits in the queue
                elif status is _RR:
                    self._rr = 0  # (as _choose_one leaves it)
            elif status is _RR:
                c = self._next_with_room(consumers)
            else:
                return False  # a push to several consumers is followed as a QueueMessage
        if c is None and opts.message_limit:
            return False  # accept() after check_push
        if frame.source != sender.id:
            frame = frame.replace(source=sender.id)
        self.sequence += 1
        self.received += 1
        self.last_received = now
        if c is not None:
            cid = c.id
            out.append(_tracked(Tracked, (cid, frame)))
            c.unsent.append((PLAIN, self, None, frame, self.sequence))
            used = self.used
            used[cid] = used.get(cid, 0) + 1
            return True
        m = QueueMessage(self.sequence, frame, sender, False, now)
        if m.high_priority:
            self.priority.append(m)
            self.n_priority += 1
        else:
            self.regular.append(m)
            self.n_regular += 1
        if consumers and (not self.stalled or m.high_priority):
            self.drain(now, out)  # (stalled: see accept)
        return True

    def _next_with_room(self, consumers: list[Client]) -> Client | None:
        """Round robin: the next consumer with room in its window (None: all full)."""
        n = len(consumers)
        start = self._rr % n
        for i in range(n):
            c = consumers[(start + i) % n]
            if self.room(c):
                self._rr = (start + i + 1) % n
                return c
        return None

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
        if (status is _PUSH or status is _RR) and (not self.stalled or m.high_priority):
            # (stalled: the head of the queue waits for room; a push behind it cannot
            # change that, the next settled delivery or acknowledge drains)
            self.drain(now, out)
        return m

    # ------------------------------------------------------------------ pull

    def pull(
        self, client: Client, request: tmqp.Frame, now: float, out: list[Outgoing], max_count: int
    ) -> None:
        """Answer a pull request from a consumer of the channel (checks done by the caller)."""
        from broker.engine.queue.pull import answer_pull

        answer_pull(self, client, request, now, out, max_count)
