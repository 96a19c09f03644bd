"""Sending a queue's messages to the consumers of its channel.

:meth:`QueueDelivery.drain` takes waiting messages in order (high priority first) and
sends each to the consumers the status chooses (all of them, the next in round-robin
order, or the first acquirer), as far as the delivery handler's hooks and the
WaitForAcknowledge option allow.  A delivery that needs a consumer acknowledge is
tracked until it is acknowledged or times out (``broker.queue_acks``).  Pull requests
are answered by ``broker.pull`` (through :meth:`broker.queue.Queue.pull`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from broker import tmqp
from broker.delivery import ALLOW, PutBack
from broker.frames import derive
from broker.message import INFLIGHT, Delivery, QueueMessage
from broker.protocol import MessageType, NackReason, Outgoing, QueueStatus
from broker.queue_acks import QueueAcknowledgements

if TYPE_CHECKING:
    from broker.channel import Client

_QUEUE = int(MessageType.QUEUE)
_PUSH = QueueStatus.PUSH
_RR = QueueStatus.ROUND_ROBIN
_BROADCAST = QueueStatus.BROADCAST
_INF = float("inf")


class QueueDelivery(QueueAcknowledgements):
    """Delivery to consumers (see the module docstring)."""

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
                return bool(self.handler.can_consumer_receive(self, m, c))  # type: ignore[arg-type]
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
        c.pending_queues.add(self)  # type: ignore[arg-type]
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
