"""What follows a delivery: consumer acknowledges, put-backs and the queue's timers.

Deliveries waiting for a consumer acknowledge live in an ordered dict keyed by
(consumer id, message id) in send order, so the oldest deadline is always first (after
an AcknowledgeTimeout change, deliveries made under the old value may time out up to
that difference late).  An acknowledge, a failed consumer or an expired deadline asks
the delivery handler what to do: complete, put back (at once or after PutBackDelay),
save, acknowledge the producer.  Message timeouts and put-back delays are timers too;
the queue asks its host (the engine) to wake it at its next deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker import tmqp
from broker.engine.delivery import AckWhen, Decision, PutBack
from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, QueueMessage
from broker.engine.queue.core import QueueCore
from broker.protocol import Header, NackReason, Outgoing, header

if TYPE_CHECKING:
    from broker.engine.channel import Client

_INF = float("inf")


class QueueAcknowledgements(QueueCore):
    """Acknowledges, put-backs and timers of a queue (see the module docstring)."""

    if TYPE_CHECKING:
        # provided by broker.engine.queue.delivery.QueueDelivery
        def drain(self, now: float, out: list[Outgoing]) -> None: ...

    # ------------------------------------------------------------------ acknowledges

    def on_ack(self, client: Client, ack: tmqp.Frame, now: float, out: list[Outgoing]) -> bool:
        """A consumer acknowledge for this queue; False when no delivery matches."""
        dl = self.pending.pop((client.id, ack.message_id), None)
        if dl is None:
            return False
        self._release(client.id)
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
        for key, dl in gone:  # in send order: put-backs at the start keep that order
            del self.pending[key]
            self._release(client.id)
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

    def put_back(self, m: QueueMessage, where: PutBack, now: float, out: list[Outgoing]) -> None:
        m.put_backs += 1
        limit = self.options.put_back_limit
        if limit and m.put_backs > limit:
            self.drop(m, out, NackReason.LIMIT_EXCEEDED)
            return
        if not self.alive or not self.strategy.keeps_returns:
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
            self._release(dl.receiver.id)
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
            self.host.wake(self, when)  # type: ignore[arg-type]

    def start_timeout(self, m: QueueMessage, now: float) -> None:
        """Start the message's MessageTimeout (if the queue has one)."""
        timeout = self.options.message_timeout
        if timeout:
            m.deadline = now + timeout / 1000.0
            self._expiry.append((m.deadline, m))
            if self.wake_at is None:
                self._arm(m.deadline)

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
