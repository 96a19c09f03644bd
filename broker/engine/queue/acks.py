"""What follows a delivery: consumer acknowledges, put-backs and the queue's timers.

Deliveries waiting for a consumer acknowledge live in an ordered dict keyed by
(consumer id, message id) in send order, so the oldest deadline is always first (after
an AcknowledgeTimeout change, deliveries made under the old value may time out up to
that difference late).  An acknowledge, a failed consumer or an expired deadline asks
the delivery handler what to do: complete, put back (at once or after PutBackDelay),
save, acknowledge the producer.  A negative acknowledge with ``Put-Back: no`` overrides
a put-back: the message goes to the trash with the nack reason (a dead letter; the
federation's for a forward a linked broker refused for good).  Message timeouts and
put-back delays are timers too; the queue asks its host (the engine) to wake it at its
next deadline.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

from broker.engine.delivery import ALLOW, ALLOW_ACK, AckWhen, Decision, PutBack
from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Delivery, QueueMessage
from broker.engine.queue.protocols import QueueCore
from broker.message import DEFAULT_TTL, Message
from broker.protocol import Header, NackReason, Outgoing

if TYPE_CHECKING:
    from broker.engine.channel import Client

_INF = float("inf")
#: ``Message(...)`` from a tuple of every field, without the named tuple's Python-level
#: ``__new__`` (one positive acknowledge per delivery taken by an auto-acked consumer).
_new_message = tuple.__new__


def _not_put_back(nack: Message) -> bool:
    """The consumer asked that its nacked delivery not be put back (``Put-Back: no``):
    it goes to the trash with the nack reason, a waiting producer is nacked."""
    return (nack.header(Header.PUT_BACK) or "").strip().lower() == "no"


class AckTracker:
    """Acknowledges, put-backs and timers of one queue (see the module docstring)."""

    __slots__ = ("delayed", "expiry", "pending", "q", "wake_at")

    def __init__(self, queue: QueueCore) -> None:
        self.q = queue
        #: Deliveries waiting for their consumer's acknowledge, in send order.
        self.pending: OrderedDict[tuple[str, str], Delivery] = OrderedDict()
        #: Messages waiting for their MessageTimeout, in deadline order.
        self.expiry: deque[tuple[float, QueueMessage]] = deque()
        #: Messages put back after PutBackDelay, in due order.
        self.delayed: deque[tuple[float, QueueMessage, PutBack]] = deque()
        #: Earliest deadline the engine was asked to wake the queue for (None: nothing).
        self.wake_at: float | None = None

    def idle(self) -> bool:
        """Nothing in flight waits for an acknowledge and nothing waits to come back."""
        return not (self.pending or self.delayed)

    # ------------------------------------------------------------------ acknowledges

    def track(self, m: QueueMessage, c: Client[Any], deadline: float) -> Delivery:
        """``m`` was sent to ``c``, which must acknowledge it by ``deadline``: the
        delivery now waiting (what the handler's ``consumer_received`` is given)."""
        dl = self.pending[(c.id, m.message_id)] = Delivery(m, c, deadline)
        (m.life or m.lived()).inflight += 1  # (the field itself: no property call)
        c.pending_queues.add(self.q)
        if deadline != _INF:
            self.arm(deadline)
        return dl

    def on_ack(self, client: Client[Any], ack: Message, now: float, out: list[Outgoing]) -> bool:
        """A consumer acknowledge for this queue; False when no delivery matches."""
        dl = self.pending.pop((client.id, ack.message_id), None)
        if dl is None:
            return False
        self._settle(client, ack, dl, now, out)
        self.q.drain(now, out)
        return True

    def ack_taken(
        self, client: Client[Any], message_id: str, now: float, out: list[Outgoing]
    ) -> None:
        """The transport took a delivery of a consumer that acknowledges what it takes
        (``Client.auto_acked``, ``broker.engine.flow.transmitted``): acknowledged as if
        its positive acknowledge had come (the caller drains the queue after its batch).

        What :meth:`_settle` then :meth:`resolve` do for a positive acknowledge, inline (a
        call each per delivery; the acknowledge has no headers, so no ``Nack-Reason``),
        and for the handler's usual answers (``ALLOW_ACK``, ``ALLOW``) with no producer
        waiting, the message finished at once; any other answer goes to :meth:`resolve`."""
        dl = self.pending.pop((client.id, message_id), None)
        if dl is None:
            return
        q = self.q
        cid = client.id
        used = q.used  # (q.release without its call: its window slot freed)
        n = used.get(cid, 0) - 1
        if n > 0:
            used[cid] = n
        else:
            used.pop(cid, None)
        m = dl.message
        life = m.life or m.lived()
        life.inflight -= 1
        q.acks += 1
        receipts = q.host.receipts
        if receipts.pending:
            receipts.succeeded(q.key, m.seq, cid)
        hooks = q.hooks
        quiet = False  # (the handler's acknowledge_received would change nothing: not called)
        test = hooks.quiet
        if test is not None:
            try:
                quiet = test(m.headers)
            except Exception as exc:
                quiet = hooks.quiet_failed(exc)
        if quiet:
            d = ALLOW_ACK
        else:
            d = self._ask_taken(client, message_id, dl)
        if (d is ALLOW_ACK or d is ALLOW) and not life.producer_waits:
            # (resolve: nothing to save, nobody to answer, nothing put back)
            if life.inflight <= 0 and m.state == INFLIGHT:
                q.finish(m)
            return
        self.resolve(m, d, now, out, NackReason.NONE, cid, True)

    def _ask_taken(self, client: Client[Any], message_id: str, dl: Delivery) -> Decision:
        """The handler's ``acknowledge_received`` for a delivery acknowledged by taking."""
        q = self.q
        # (id, source, channel, queue, no flags, the default TTL, nothing else)
        ack = _new_message(
            Message,
            (
                message_id,
                client.id,
                q.channel.name,
                q.id,
                False,
                False,
                False,
                DEFAULT_TTL,
                (),
                b"",
                None,
            ),
        )
        hooks = q.hooks
        try:  # (hooks.call without its call: a hook per delivery)
            return hooks.methods["acknowledge_received"](q, ack, dl, True)
        except Exception as exc:
            return hooks.failed(dl.message, "acknowledge_received", exc)

    def _settle(
        self, client: Client[Any], ack: Message, dl: Delivery, now: float, out: list[Outgoing]
    ) -> None:
        """A delivery taken out of ``pending`` ends with ``ack`` (negative with a
        ``Nack-Reason`` header): counted, then as the handler decides."""
        q = self.q
        q.release(client.id)
        m = dl.message
        (m.life or m.lived()).inflight -= 1
        reason = ack.header(Header.NACK_REASON) if ack.headers else None
        success = reason is None
        if success:
            q.acks += 1
            receipts = q.host.receipts
            if receipts.pending:
                receipts.succeeded(q.key, m.seq, client.id)
        else:
            q.nacks += 1
        hooks = q.hooks
        quiet = False  # (a positive one the handler would not act on: not asked)
        test = hooks.quiet
        if success and test is not None:
            try:
                quiet = test(m.headers)
            except Exception as exc:
                quiet = hooks.quiet_failed(exc)
        if quiet:
            d = ALLOW_ACK
        else:
            try:  # (hooks.call without its call: a hook per delivery)
                d = hooks.methods["acknowledge_received"](q, ack, dl, success)
            except Exception as exc:
                d = hooks.failed(m, "acknowledge_received", exc)
        if not success and d.put_back is not PutBack.NO and _not_put_back(ack):
            d = Decision(allow=False, save=d.save, send_ack=AckWhen.NEGATIVE)
        self.resolve(m, d, now, out, reason or NackReason.NONE, client.id, success)

    def place(self, orders: list[tuple[str, list[tuple[str, bool]]]]) -> None:
        """Deliveries just made tracked (``flow.make_tracked``), whose ``pending`` entries
        were appended, take their places in send order: ``orders`` gives, per consumer id,
        the message ids of its deliveries still unsent that wait for an acknowledge, in
        send order, True for the new ones.  Each new one goes right before the next older
        entry of its consumer that was sent after it (none: it stays at the end, where
        it is), so a consumer's entries are in the order it was sent them, as if they had
        been tracked when sent, and the others keep their order.  (Which of two consumers'
        deliveries went first is not known: the new ones are put as late as that allows.)"""
        pending = self.pending
        before: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for cid, order in orders:
            waiting: list[tuple[str, str]] = []  # new ones sent before the next older one
            for mid, new in order:
                key = (cid, mid)
                if new:
                    waiting.append(key)
                elif waiting and key in pending:
                    before.setdefault(key, []).extend(waiting)
                    waiting = []
        if not before:
            return
        moved = {key for keys in before.values() for key in keys}
        entries = list(pending.items())
        deliveries = dict(entries)
        pending.clear()
        for key, dl in entries:
            if key in moved:
                continue
            for earlier in before.get(key, ()):
                pending[earlier] = deliveries[earlier]
            pending[key] = dl

    def consumer_gone(self, client: Client[Any], now: float, out: list[Outgoing]) -> None:
        """The consumer disconnected: its unacknowledged deliveries fail."""
        q = self.q
        gone = [(key, dl) for key, dl in self.pending.items() if key[0] == client.id]
        for key, dl in gone:  # in send order: put-backs at the start keep that order
            del self.pending[key]
            q.release(client.id)
            m = dl.message
            m.inflight -= 1
            q.nacks += 1
            d = q.hooks.call(m, "consumer_receive_failed", q, dl, client)
            self.resolve(m, d, now, out, NackReason.SEND_ERROR, "", False)

    def resolve(
        self,
        m: QueueMessage,
        d: Decision,
        now: float,
        out: list[Outgoing],
        reason: str,
        source: str,
        success: bool,
    ) -> None:
        """Carry out what the handler decided about a delivery that ended."""
        q = self.q
        if d.save and not m.saved:
            q.save(m)
        when = d.send_ack
        waits = m.life is not None and m.life.producer_waits  # (else ack_producer does nothing)
        if when is not AckWhen.NONE and waits:
            if when is AckWhen.ALWAYS and not success:
                when = AckWhen.NEGATIVE
            q.ack_producer(m, when, out, reason, source)
        if d.put_back is not PutBack.NO:
            if m.state == INFLIGHT:
                self.put_back(m, d.put_back, now, out)
            return
        life = m.life  # (none: nothing in flight; read directly, per delivery)
        if (life is None or life.inflight <= 0) and m.state == INFLIGHT:
            if not success:  # nacked (or failed) and not put back: to the trash
                q.to_trash(m, reason)
                m.state = DONE  # not consumed: never retained
            q.finish(m)

    def put_back(self, m: QueueMessage, where: PutBack, now: float, out: list[Outgoing]) -> None:
        """``m`` returns to the queue (after PutBackDelay), unless past PutBackLimit."""
        q = self.q
        m.put_backs += 1
        limit = q.options.put_back_limit
        if limit and m.put_backs > limit:
            q.to_trash(m, "put-back-limit")
            q.drop(m, out, NackReason.LIMIT_EXCEEDED)
            return
        if not q.alive or not q.strategy.keeps_returns:
            q.drop(m, out, NackReason.CLEARED)
            return
        q.put_back_saved(m, now)  # kept before anything can see it requeued
        delay = q.options.put_back_delay
        if delay:
            m.state = DELAYED
            due = now + delay / 1000.0
            self.delayed.append((due, m, where))
            self.arm(due)
        else:
            q.messages.requeue(m, where)

    def clear(self, out: list[Outgoing]) -> None:
        """Drop every delivery in flight and every delayed put-back; stop the timers."""
        q = self.q
        for dl in self.pending.values():
            q.release(dl.receiver.id)
            if dl.message.state == INFLIGHT:
                q.drop(dl.message, out, NackReason.CLEARED)
        self.pending.clear()
        for _, m, _where in self.delayed:
            if m.state == DELAYED:
                q.drop(m, out, NackReason.CLEARED)
        self.delayed.clear()
        self.expiry.clear()

    # ------------------------------------------------------------------ timers

    def tick(self, now: float, out: list[Outgoing]) -> None:
        """Run put-back delays, acknowledge timeouts and message timeouts due by ``now``."""
        self.wake_at = None
        q = self.q
        if not q.alive:
            return
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, m, where = delayed.popleft()
            if m.state == DELAYED:
                q.messages.requeue(m, where)
        pending = self.pending
        while pending:
            key = next(iter(pending))
            dl = pending[key]
            if dl.deadline > now:
                break
            del pending[key]
            q.release(dl.receiver.id)
            m = dl.message
            m.inflight -= 1
            q.nacks += 1
            d = q.hooks.call(m, "acknowledge_timed_out", q, dl)
            self.resolve(m, d, now, out, NackReason.TIMEOUT, "", False)
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            _, m = expiry.popleft()
            if m.state == QUEUED:
                q.messages.uncount(m)
                self.expire(m, out)
        paged = q.messages.paged_deadline()
        if paged is not None and paged <= now:
            q.expire_paged(now, out)
        q.drain(now, out)
        self.schedule()

    def next_deadline(self) -> float | None:
        when = _INF
        if self.delayed:
            when = self.delayed[0][0]
        if self.pending:
            when = min(when, next(iter(self.pending.values())).deadline)
        if self.expiry:
            when = min(when, self.expiry[0][0])
        paged = self.q.messages.paged_deadline()  # (paged out: their deadlines kept apart)
        if paged is not None:
            when = min(when, paged)
        return None if when == _INF else when

    def schedule(self) -> None:
        when = self.next_deadline()
        if when is not None:
            self.arm(when)

    def arm(self, when: float) -> None:
        if self.wake_at is None or when < self.wake_at:
            self.wake_at = when
            self.q.wake(when)

    def start_timeout(self, m: QueueMessage, now: float) -> None:
        """Start the message's MessageTimeout (if the queue has one)."""
        timeout = self.q.options.message_timeout
        if timeout:
            m.deadline = deadline = now + timeout / 1000.0
            expiry = self.expiry
            if expiry and expiry[-1][0] > deadline:  # (the timeout was shortened: in order)
                expiry.insert(bisect_right(expiry, deadline, key=_first), (deadline, m))
            else:
                expiry.append((deadline, m))
            if self.wake_at is None or deadline < self.wake_at:
                self.arm(deadline)

    def restore_deadlines(self, pairs: list[tuple[float, QueueMessage]]) -> None:
        """Recovered messages keep their deadlines: each one set, the expiry kept in
        deadline order (the new ones sorted once, then merged)."""
        for deadline, m in pairs:
            m.deadline = deadline
        ordered = sorted(pairs, key=_first)
        if self.expiry and self.expiry[-1][0] > ordered[0][0]:
            self.expiry = deque(heapq.merge(self.expiry, ordered, key=_first))
        else:
            self.expiry.extend(ordered)
        self.arm(ordered[0][0])

    def expire(self, m: QueueMessage, out: list[Outgoing]) -> None:
        """A queued message (already uncounted) passed its MessageTimeout."""
        q = self.q
        m.state = DONE
        q.timeouts += 1
        d = q.hooks.call(m, "message_timed_out", q, m)
        if d.save and not m.saved:
            q.save(m)
        if d.send_ack is not AckWhen.NONE:
            q.ack_producer(m, d.send_ack, out, NackReason.TIMEOUT)
        q.to_trash(m, "expired")
        q.finish(m)


def _first(entry: tuple[float, QueueMessage]) -> float:
    return entry[0]
