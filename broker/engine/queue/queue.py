"""A channel queue: statuses, delivery to consumers, acknowledges, timeouts, put-backs.

:class:`Queue` is built in layers, one module each (every layer is a base class of the
next, so a method call costs what it did when the queue was one class):

* ``broker.engine.queue.core`` -- the state: message deques, counters, options, the
  store, producer acknowledges, removal, delivery handler hooks;
* ``broker.engine.queue.acks`` -- consumer acknowledges, put-backs and timers;
* ``broker.engine.queue.delivery`` -- sending waiting messages to consumers;
* this module -- pushes (the general :meth:`Queue.accept` and the plain-push fast path
  :meth:`Queue.push_plain`), pull requests and runtime option changes.

Everything that depends on the queue's status (is a push accepted, is it sent, kept or
dropped, who receives it, is a pull answered, what a switch does) is decided by its
:attr:`Queue.strategy`, one small object per status (``broker.engine.queue.statuses``),
chosen from a table when the status is set; ``Queue.status`` stays the QueueStatus.

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
from broker.engine.queue import pull
from broker.engine.queue.core import QueueHost
from broker.engine.queue.delivery import QueueDelivery
from broker.engine.queue.statuses import strategy_for
from broker.protocol import MessageType, NackReason, Outgoing, ResultCode, Tracked

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
        self.strategy = strategy_for(options.status)
        self.window = self._window(options)
        self._out_version += 1
        if options.message_delivery_handler != old.message_delivery_handler:
            self.handler = self.host.handler_for(options.message_delivery_handler)
            self._bind_handler()
        else:
            self._refresh_plain()
        self.strategy.entered(self, old.status, out)
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
        strategy = self.strategy
        if not strategy.accepts_pushes:
            return ResultCode.UNACCEPTABLE
        opts = self.options
        if opts.message_size_limit and size > opts.message_size_limit:
            return ResultCode.LIMIT_EXCEEDED
        if (
            opts.message_limit
            and strategy.limits_count
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
        strategy = self.strategy
        if (
            not self.plain
            or not strategy.takes_plain
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
            if len(consumers) == 1 or strategy.plain_many:
                c = strategy.plain_target(self, consumers)  # None: full windows, it waits
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

    def next_with_room(self, consumers: list[Client]) -> Client | None:
        """Round robin: the next consumer with room in its window (None: all full)."""
        n = len(consumers)
        start = self.rr % n
        for i in range(n):
            c = consumers[(start + i) % n]
            if self.room(c):
                self.rr = (start + i + 1) % n
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
        self.strategy.admit(self, m, now, out)
        return m

    # ------------------------------------------------------------------ pull

    def pull(
        self, client: Client, request: tmqp.Frame, now: float, out: list[Outgoing], max_count: int
    ) -> None:
        """Answer a pull request from a consumer of the channel (checks done by the caller)."""
        self.strategy.pull(self, client, request, now, out, max_count)

    def pull_messages(
        self, client: Client, request: tmqp.Frame, now: float, out: list[Outgoing], limit: int
    ) -> None:
        """Pull status: up to ``Count`` messages leave the queue (``pull``)."""
        pull.pull_messages(self, client, request, now, out, limit)

    def pull_latest(self, client: Client, request: tmqp.Frame, out: list[Outgoing]) -> None:
        """Cache status: the latest message, which stays in the queue (``pull``)."""
        pull.pull_latest(self, client, request, out)

    def refuse_pull(self, client: Client, request: tmqp.Frame, out: list[Outgoing]) -> None:
        """A status without pull: Unacceptable and End markers (``pull``)."""
        pull.refuse_pull(self, client, request, out)
