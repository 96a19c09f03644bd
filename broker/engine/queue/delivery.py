"""Sending a queue's messages to the consumers of its channel.

:meth:`QueueDelivery.drain` takes waiting messages in order (high priority first) and
sends each to the consumers the status chooses (all of them, the next in round-robin
order, or the first acquirer) among those with room in their window (``broker.flow``),
as far as the delivery handler's hooks and the WaitForAcknowledge option allow.  A
delivery that needs a consumer acknowledge is tracked until it is acknowledged or times
out (``broker.engine.queue.acks``); every delivery is settled when the transport reports it
sent (:meth:`QueueDelivery.settle_sent`) or its consumer goes away first
(:meth:`QueueDelivery.settle_unsent`).  Pull requests are answered by ``broker.pull``
(through :meth:`broker.engine.queue.queue.Queue.pull`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker import tmqp
from broker.engine.delivery import ALLOW, PutBack
from broker.engine.flow import ACKED, BROADCAST, CACHE, COPY, PLAIN
from broker.engine.frames import derive
from broker.engine.message import INFLIGHT, Delivery, QueueMessage
from broker.engine.queue.acks import QueueAcknowledgements
from broker.protocol import Header, MessageType, NackReason, Outgoing, Tracked

if TYPE_CHECKING:
    from broker.engine.channel import Client

_QUEUE = int(MessageType.QUEUE)
_INF = float("inf")
#: ``Tracked(client_id, frame)`` without the named tuple's Python-level __new__.
_tracked = tuple.__new__
_DELIVERY_COUNT = Header.DELIVERY_COUNT.lower()


class QueueDelivery(QueueAcknowledgements):
    """Delivery to consumers (see the module docstring)."""

    def drain(self, now: float, out: list[Outgoing]) -> None:
        """Send waiting messages to consumers as far as the status and options allow."""
        if self._front:
            self.flush_front()
        self.stalled = False
        if not self.strategy.delivers:
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
            if not self.send(m, consumers, now, out):
                return

    def send(
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
        targets = self.strategy.targets(self, m, consumers, req_ack, keep)  # type: ignore[arg-type]
        if not targets:
            if keep:
                self.unpop(m)
                self.stalled = True
            return False
        frame = m.out
        if frame is None or m.out_version != self._out_version:
            frame = self._out_frame(m)
        m.transmitted = 0
        if req_ack:
            timeout = opts.acknowledge_timeout
            deadline = now + timeout / 1000.0 if timeout else _INF
            for c in targets:
                self.hand(c, ACKED, m, frame, out)
                self._track(m, c, deadline)
            m.state = INFLIGHT
            if self._h_received:
                for c in targets:
                    dl = self.pending.get((c.id, m.message_id))
                    if dl is not None:
                        self.side_effects(m, self.hook(m, "consumer_received", self, dl, c), out)
        else:
            m.state = INFLIGHT
            kind = COPY if keep else BROADCAST
            m.unsent += len(targets)
            for c in targets:
                self.hand(c, kind, m, frame, out)
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
        # A message without acknowledges is finished once the transport took a copy
        # (settle_sent), or goes back if none got there (settle_unsent).
        return m.state == INFLIGHT  # False: put back by a hook, stop this drain pass

    def with_room(
        self, m: QueueMessage, consumers: Sequence[Client], req_ack: bool, keep: bool
    ) -> list[Client]:
        """The consumers that may take ``m`` now; a broadcast copy for a consumer whose
        window is full is dropped and counted."""
        check = req_ack or self._h_can
        name = self.channel.name
        window = self.window
        used = self.used
        targets = []
        full = 0
        for c in consumers:
            if check and not self._eligible(m, c, req_ack):
                continue
            if used.get(c.id, 0) < (c.prefetch.get(name) or window):
                targets.append(c)
            else:
                full += 1
        if full and not keep:
            self.dropped += full
        return targets

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
        """Bookkeeping after ``m`` was handed to ``c`` outside a drain (pull)."""
        if req_ack:
            self._track(m, c, deadline)
        if self._h_received:
            dl = self.pending.get((c.id, m.message_id)) if req_ack else None
            self.side_effects(
                m, self.hook(m, "consumer_received", self, dl or Delivery(m, c, 0.0), c), out
            )
        if self._h_end:
            self.side_effects(m, self.hook(m, "end_send", self, m), out)

    def choose_one(
        self, m: QueueMessage, consumers: Sequence[Client], rotate: bool, req_ack: bool
    ) -> tuple[Client, ...]:
        n = len(consumers)
        start = self.rr % n if rotate else 0
        check = req_ack or self._h_can
        name = self.channel.name
        window = self.window
        used = self.used
        for i in range(n):
            c = consumers[(start + i) % n]
            if used.get(c.id, 0) >= (c.prefetch.get(name) or window):
                continue  # its window is full: the next one
            if not check or self._eligible(m, c, req_ack):
                if rotate:
                    self.rr = (start + i + 1) % n
                return (c,)
        return ()

    def _track(self, m: QueueMessage, c: Client, deadline: float) -> None:
        self.pending[(c.id, m.message_id)] = Delivery(m, c, deadline)
        m.inflight += 1
        c.pending_queues.add(self)
        if deadline != _INF:
            self._arm(deadline)

    def hand(
        self, c: Client, kind: int, m: QueueMessage | None, frame: tmqp.Frame, out: list[Outgoing]
    ) -> None:
        """Send ``frame`` to ``c`` as a tracked delivery holding a slot of its window."""
        out.append(_tracked(Tracked, (c.id, frame)))
        c.unsent.append((kind, self, m, None, 0))
        if kind != CACHE:
            used = self.used
            used[c.id] = used.get(c.id, 0) + 1

    def settle_plain(self, client_id: str, count: int, now: float) -> None:
        """The transport took ``count`` fast-path pushes to one consumer: sent, done."""
        self.deliveries += count
        self.sent += count
        self.last_sent = now
        used = self.used
        n = used.get(client_id, 0) - count
        if n > 0:
            used[client_id] = n
        else:
            used.pop(client_id, None)

    def settle_sent(self, kind: int, client_id: str, m: QueueMessage | None, now: float) -> None:
        """The transport took a delivery (``broker.flow.transmitted``): count it as sent."""
        if kind == PLAIN:
            self.settle_plain(client_id, 1, now)
            return
        self.deliveries += 1
        self.last_sent = now
        if m is None:  # CACHE
            self.sent += 1
            return
        if not m.transmitted:
            self.sent += 1  # the first copy of this send
        m.transmitted += 1
        m.delivered += 1  # a put-back resets m.out: the next send carries Delivery-Count
        if kind == ACKED:
            return  # the window slot is held until the acknowledge
        self._release(client_id)
        m.unsent -= 1
        if m.unsent <= 0 and m.state == INFLIGHT and self.alive:
            self._complete(m)  # (a removed queue took its messages and store with it)

    def settle_unsent(
        self,
        kind: int,
        client_id: str,
        m: QueueMessage | None,
        frame: tmqp.Frame | None,
        seq: int,
        now: float,
        out: list[Outgoing],
    ) -> None:
        """The consumer went away before the transport took a delivery (``flow.abandon``)."""
        if kind == PLAIN:
            self._release(client_id)
            assert frame is not None
            self._return(QueueMessage(seq, frame, None, False, now), out)
            return
        if m is None or kind == ACKED:
            return  # CACHE: nothing left the queue; ACKED: the acknowledge tracker returns it
        self._release(client_id)
        m.unsent -= 1
        if kind == BROADCAST:
            self.dropped += 1
        if m.unsent > 0 or m.state != INFLIGHT or not self.alive:
            return
        if m.transmitted or kind == BROADCAST:
            self._complete(m)  # a copy went out: done, as if this consumer had not been there
        else:
            self._return(m, out)

    def _out_frame(self, m: QueueMessage) -> tmqp.Frame:
        f = m.frame
        opts = self.options
        count = m.delivered
        if opts.request_acknowledge or (opts.hide_client_names and f.source) or count:
            source = "" if opts.hide_client_names else f.source
            headers = f.headers
            if count:
                headers = (
                    *((k, v) for k, v in headers if k.lower() != _DELIVERY_COUNT),
                    (Header.DELIVERY_COUNT, str(count + 1)),
                )
            f = derive(
                f,
                _QUEUE,
                False,
                opts.request_acknowledge,
                self.id,
                f.message_id,
                source,
                f.target,
                headers,
            )
        m.out = f
        m.out_version = self._out_version
        return f
