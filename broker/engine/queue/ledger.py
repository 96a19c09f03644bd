"""A queue's producers and store: saving messages, acknowledging producers, finishing.

A message is saved in the store when its delivery handler decides so, and removed from
the store when it is finished (consumed, dropped, timed out).  A producer that waits for
an acknowledge gets at most one per message, positive or negative, and only while it is
still the connected client that pushed it.  A message its handler wanted saved and
acknowledged once saved (``AckWhen.IF_SAVED``) that the store refused gets a negative
acknowledge (``failed``); it stays in the queue in memory (a producer that retries may
make a duplicate: at-least-once).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.engine.delivery import AckWhen, Decision
from broker.engine.frames import ack as ack_frame
from broker.engine.message import DONE, INFLIGHT, QueueMessage
from broker.engine.queue.protocols import QueueCore
from broker.message import Message
from broker.protocol import NackReason, Outgoing
from broker.store import StoredMessage

_new = tuple.__new__


class Ledger:
    """The store and producer side of one queue (see the module docstring)."""

    __slots__ = ("q",)

    def __init__(self, queue: QueueCore) -> None:
        self.q = queue

    def side_effects(self, m: QueueMessage, d: Decision, out: list[Outgoing]) -> None:
        """Save and acknowledge effects of a decision."""
        if d.save and not m.saved:
            self.save(m)
            if not m.saved and d.send_ack is AckWhen.IF_SAVED:
                # the store refused it (full, failed disk): the producer that waits hears
                # it was not made durable, instead of waiting for an ack that never comes
                self.ack_producer(m, AckWhen.NEGATIVE, out, NackReason.FAILED)
                return
        if d.send_ack is not AckWhen.NONE:
            self.ack_producer(m, d.send_ack, out, NackReason.NONE)

    def ack_producer(
        self, m: QueueMessage, when: AckWhen, out: list[Outgoing], reason: str, source: str = ""
    ) -> None:
        """Acknowledge the producer (once per message, only if it waits for it)."""
        life = m.life  # (None: nobody waits for it)
        if (
            life is None
            or life.acked
            or not life.producer_waits
            or (when is AckWhen.IF_SAVED and not life.saved)
        ):
            return
        life.acked = True
        producer = m.producer
        q = self.q
        if producer is None or q.client(producer.id) is not producer:
            return  # gone: nobody to tell
        nack = reason if when is AckWhen.NEGATIVE else None
        frame = ack_frame(q.id, m.message_id, source, q.channel.name, nack)
        out.append(Outgoing(producer.id, frame))

    def save(self, m: QueueMessage) -> None:
        """Save one message; one the store refuses stays unsaved (``saved`` False,
        counted in ``unsaved``)."""
        q = self.q
        try:
            q.store.append(q.key, self._stored(m))
        except Exception as exc:
            q.error("store.append", exc)
            q.unsaved += 1
            q.recent.forget(m.message_id)  # (a retry of it is no duplicate)
            return
        m.saved = True
        q.saves += 1

    def save_run(
        self, run: Sequence[QueueMessage], messages: Sequence[Message] | None = None
    ) -> None:
        """:meth:`save` of each message of ``run``, in order, with one call (a run of
        pushes taken at once: ``saved_run``): the store still takes or refuses each on
        its own (``Store.append_each``; a held store writes them as one group), so a
        refusal (a full or failed disk) concerns exactly its message.  ``messages``:
        the run's messages as they were taken (``m.message`` of each, already made):
        what a store that encodes at once saves of them (see :meth:`_stored_run`)."""
        q = self.q
        stored: list[StoredMessage]
        kept: Sequence[QueueMessage]
        if messages is not None and not q.store.keeps_messages and not q.options.message_timeout:
            stored, kept = self._stored_run(run, messages), run
        else:
            stored, kept = [], []
            for m in run:
                try:
                    stored.append(self._stored(m))
                except Exception as exc:
                    q.error("store.append", exc)
                    q.unsaved += 1
                    q.recent.forget(m.message_id)
                    continue
                kept.append(m)
        try:
            refused = q.store.append_each(q.key, stored)
        except Exception as failure:  # (it should not raise: none counts as saved)
            refused = [(k, failure) for k in range(len(stored))]
        for _k, error in refused:
            q.error("store.append", error)
        q.unsaved += len(refused)
        q.saves += len(kept) - len(refused)
        if not refused:
            for m in kept:
                (m.life or m.lived()).saved = True
            return
        skip = {k for k, _exc in refused}
        for k, m in enumerate(kept):
            if k not in skip:
                m.lived().saved = True
            else:
                q.recent.forget(m.message_id)  # (a retry of it is no duplicate)

    def _stored_run(
        self, run: Sequence[QueueMessage], messages: Sequence[Message]
    ) -> list[StoredMessage]:
        """:meth:`_stored` of each message of a run just taken, on a queue without a
        MessageTimeout, into a store that keeps no messages: ``messages`` are given as
        they are (no ``m.message`` made again per message: the store encodes them at
        once, their wire form unused), each tuple made without a call.  A message whose
        clock runs anyway (a deadline of its own) goes through :meth:`_stored`."""
        stored: list[StoredMessage] = []
        add = stored.append
        for m, message in zip(run, messages, strict=True):
            life = m.life
            producer = m.producer
            if life is None:
                put_backs = delivered = 0
            elif life.deadline:
                add(self._stored(m))
                continue
            else:
                put_backs, delivered = life.put_backs, life.delivered
            add(_new(StoredMessage, (m.seq, message, "" if producer is None else producer.id,
                                     put_backs, delivered, 0.0)))  # fmt: skip
        return stored

    def _stored(self, m: QueueMessage) -> StoredMessage:
        """What the store keeps of ``m``: the message without a door's octets, its
        producer, counts and the wall-clock deadline of its MessageTimeout."""
        q = self.q
        producer = m.producer.id if m.producer is not None else ""
        message = m.message
        if message.wire is not None and q.store.keeps_messages:
            message = message.replace()  # a store keeps messages, not a door's octets
        life = m.life
        timeout = q.options.message_timeout
        if life is not None and life.deadline:  # (saved after its clock started: the rest)
            deadline = q.host.config.wall_clock() + (life.deadline - q.host.now)
        elif timeout:  # (saved on receipt: the clock starts now)
            deadline = q.host.config.wall_clock() + timeout / 1000.0
        else:
            deadline = 0.0
        if life is None:
            return StoredMessage(m.seq, message, producer, 0, 0, deadline)
        return StoredMessage(m.seq, message, producer, life.put_backs, life.delivered, deadline)

    def delivered(self, m: QueueMessage, now: float, *, durable: bool = False) -> None:
        """A saved message went out once more (or, ``durable``, was put back): the store
        learns its delivery count and put-backs, so that a restart neither resets them
        nor restarts its TTL clock.  A put-back's update is one the engine's next answers
        wait for (``Store.update(durable=True)``): the message is seen requeued (by a
        consumer, by a reply after the nack) only once its new count is kept."""
        q = self.q
        if not m.saved:
            return
        deadline = q.host.config.wall_clock() + (m.deadline - now) if m.deadline else 0.0
        stored = StoredMessage(m.seq, m.message, "", m.put_backs, m.delivered, max(deadline, 0.0))
        try:
            q.store.update(q.key, stored, durable=durable)
        except Exception as exc:
            q.error("store.update", exc)

    def finish(self, m: QueueMessage) -> None:
        """The message leaves the queue for good (and the store, if saved); one that was
        consumed (in flight until now) stays readable on a ``Retain`` queue."""
        q = self.q
        # (a message at or below the last release is not kept: ``reading.Retained.floor``)
        retain = m.state == INFLIGHT and q.options.retain and m.seq > q.retained.floor
        m.state = DONE
        receipts = q.host.receipts
        if receipts.pending:  # its fate is known: a receipt asked for goes now
            receipts.finished(q.key, m.seq)
        if retain:
            self.retain(m)
        elif m.life is not None and m.life.saved:  # (the field: no property call)
            m.saved = False
            try:
                q.store.remove(q.key, m.seq)
            except Exception as exc:
                q.error("store.remove", exc)
        if q.hooks.dequeued:
            q.hooks.message_dequeued(m)

    def retain(self, m: QueueMessage) -> None:
        """Keep a consumed message readable by sequence (``reading``), in the store too
        when it was saved; forget those pushed out past ``RetainLimit``.  The sequence
        index (when built) gets its entry: one that was in a consumer's socket when the
        index was built has none (it was not held then)."""
        q = self.q
        message = m.message
        if message.wire is not None:
            message = message.replace()
        try:
            if m.saved:
                m.saved = False
                producer = m.producer.id if m.producer is not None else ""
                stored = StoredMessage(m.seq, message, producer, m.put_backs)
                q.store.retain(q.key, stored)
            for seq in q.retained.keep(m.seq, message, q.options.retain_limit):
                q.store.forget_retained(q.key, seq)
        except Exception as exc:
            q.error("store.retain", exc)
        if q.index is not None:  # (after keep: a retained entry is live, never swept)
            q.index.add(m)

    def drop(self, m: QueueMessage, out: list[Outgoing], reason: str, count: bool = True) -> None:
        """Remove a message that was not consumed; a waiting producer gets a nack."""
        if count:
            self.q.removed += 1
        self.ack_producer(m, AckWhen.NEGATIVE, out, reason)
        m.state = DONE  # dropped, not consumed: never retained
        self.finish(m)
