"""The messages a queue holds, in sequence order, for reading by sequence (``reading``).

A browse from a sequence number must not walk the whole queue: the index keeps every
:class:`~broker.engine.queue.queue.Queue` message that may still be held in a list
sorted by sequence number, so a browse finds where to start by bisection and reads on
from there -- O(log n + k + d) for ``k`` messages, ``d`` being entries of messages that
left and are not swept yet (see below); bounds look at the head only.

The index is built on the first bounds or browse of a queue (one pass over what it holds
and the copies in flight that await no acknowledge: :meth:`SequenceIndex.build`) and kept
from then on: a queue nobody reads by sequence pays nothing per message.  Once
built, the queue adds each message it creates (:meth:`add`); numbers grow, so that is an
append (a message given back with its old number is put in its place by bisection).

Nothing is told when a message leaves: an entry is *held* (listed) while its message
waits, is delayed for a put-back, is in flight to a consumer that must acknowledge it, or
is kept by the queue's ``Retain`` option (:func:`held`).  It is *dead* once its message
is finished and not retained (:func:`live`; finished is final) -- not before: a message
handed to a consumer's socket without an acknowledge request is not held, but comes back
if the consumer leaves before the transport took it.  Dead entries are swept lazily: from
the head on every add and read, and everywhere (one pass) once the list is longer than
twice what the queue can hold plus :data:`SLACK` and than twice what the last sweep kept,
so the sweeps cost O(1) per message, amortised, and the list stays within those bounds.

Paging (``messages``: "Paging").  A message paged out to the store waits as its number
alone, and so is its entry: a plain ``int`` in place of the QueueMessage (the index must
not keep the payload paging let go of).  The queue tells the index what happens to those
numbers, as nothing else would show it: paged out (:meth:`enqueued`), read back
(:meth:`paged_in`: the entry becomes the new QueueMessage, whose state is then followed
as any other's), or gone without being read back -- cleared, released, lost to an
unreadable record (:meth:`discard`).  A number entry is held until then; a read returns
it with no message (:meth:`read`: the caller reads the payload from the store).  A
message that waits in a paged tail as an object (not pageable, or put back) keeps its
object entry.  (A cache pull of the newest message reads a paged one back without
taking it, ``MessageOrder.latest``: its entry is then that copy, still QUEUED, until
the message is read back for good or goes.)

Sans-IO, no clock: pure bookkeeping over the queue's parts.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import Any, Protocol

from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Message, QueueMessage
from broker.engine.queue.messages import MessageOrder
from broker.engine.queue.retained import Retained


class Queue(Protocol):
    """What the index reads of its queue (no import of the queue module: no cycle)."""

    messages: MessageOrder
    retained: Retained

    @property
    def tracker(self) -> Any: ...


#: Dead entries tolerated beyond twice the held count before a full sweep.
SLACK = 64

#: An entry: the queue message, or the number of one paged out to the store.
Entry = QueueMessage | int

#: ``read`` gives this for a paged message: its payload is in the store.
PAGED = None


def _seq(e: Entry) -> int:
    return e if isinstance(e, int) else e.seq


def held(q: Queue, m: QueueMessage) -> Message | None:
    """The message ``m`` stands for if the queue still holds it, else None."""
    state = m.state
    if state in (QUEUED, DELAYED):
        return m.message
    if state == INFLIGHT:
        life = m.life  # waiting for an acknowledge (not gone with the send)
        return m.message if life is not None and life.inflight > 0 else None
    if state == DONE:
        return q.retained.messages.get(m.seq)
    return None


def live(q: Queue, e: Entry) -> bool:
    """May the entry still be (or become again) held?  (A paged number is, until the
    queue says otherwise.)"""
    if isinstance(e, int):
        return True
    return e.state != DONE or e.seq in q.retained.messages


def capacity(q: Queue) -> int:
    """An upper bound on how many messages ``q`` holds, paged ones included (deliveries
    to several consumers count once each)."""
    return q.messages.count + len(q.tracker.pending) + len(q.tracker.delayed) + len(q.retained)


def _paged_now(order: MessageOrder, m: QueueMessage) -> bool:
    """Did :meth:`MessageOrder.enqueue` just page ``m`` out (its number alone kept)?"""
    tail = order.paged_priority if m.high_priority else order.paged_regular
    seqs = tail.seqs
    return bool(seqs) and seqs[-1] == m.seq and m.seq not in tail.held


class SequenceIndex:
    """The entries of one queue by sequence number (see the module docstring)."""

    __slots__ = ("head", "items", "limit", "q")

    def __init__(self, q: Queue) -> None:
        self.q = q
        #: Entries by ascending sequence number; ``items[:head]`` are swept.
        self.items: list[Entry] = []
        self.head = 0
        #: Length past which a full sweep may run (twice what the last one kept).
        self.limit = SLACK

    @classmethod
    def build(cls, q: Queue, in_flight: Iterable[QueueMessage] = ()) -> SequenceIndex:
        """The index of what ``q`` holds now (one pass, one sort), and of ``in_flight``:
        messages on their way to consumers that await no acknowledge (not held now, but
        one comes back if its consumer leaves before the transport took it, and is
        retained once taken when the queue has ``Retain``)."""
        ix = cls(q)
        seen: dict[int, Entry] = {}
        for m in in_flight:
            seen[m.seq] = m  # (a message also held below is that same object)
        messages = q.messages
        groups = (messages.front, messages.aside_priority, messages.aside_regular)
        for group in (*groups, messages.priority, messages.regular):
            for m in group:
                if m.state == QUEUED:
                    seen[m.seq] = m
        for seq, waiting in messages.paged():
            if waiting is None:
                seen[seq] = seq  # paged out: its number
            elif waiting.state == QUEUED:
                seen[seq] = waiting
        for dl in q.tracker.pending.values():
            seen[dl.message.seq] = dl.message
        for _, m, _where in q.tracker.delayed:
            if m.state == DELAYED:
                seen[m.seq] = m
        for seq, message in q.retained.messages.items():
            if seq not in seen:
                kept = QueueMessage(seq, message, None, False, 0.0)
                kept.state = DONE
                seen[seq] = kept
        ix.items = [seen[seq] for seq in sorted(seen)]
        return ix

    def __len__(self) -> int:
        return len(self.items) - self.head

    def _at(self, seq: int) -> int:
        """Where the entry numbered ``seq`` is (or would go)."""
        return bisect_left(self.items, seq, self.head, key=_seq)

    def add(self, m: QueueMessage) -> None:
        """A new message of the queue (or one given back with its number)."""
        items = self.items
        if not items or _seq(items[-1]) < m.seq:
            items.append(m)
        else:
            self._put(m)
        self.tidy()

    def _put(self, m: QueueMessage) -> None:
        items = self.items
        at = self._at(m.seq)
        if at < len(items) and _seq(items[at]) == m.seq:
            items[at] = m  # the same number again (a give-back's or a page-in's object)
        else:
            insort(items, m, self.head, key=_seq)

    def enqueued(self, order: MessageOrder, m: QueueMessage) -> None:
        """``m`` was just enqueued in ``order``: if it was paged out, its entry becomes
        its number (the index must not keep its payload in memory)."""
        if not _paged_now(order, m):
            return
        items, seq = self.items, m.seq
        at = self._at(seq)
        if at < len(items) and _seq(items[at]) == seq:
            items[at] = seq
        else:
            insort(items, seq, self.head, key=_seq)

    def paged_in(self, found: Iterable[QueueMessage]) -> None:
        """Paged messages read back from the store: their entries are these objects."""
        for m in found:
            self._put(m)

    def discard(self, seqs: Iterable[int]) -> None:
        """Paged numbers that left the queue without being read back (cleared, released,
        unreadable): their entries go."""
        gone = set(seqs)
        if not gone:
            return
        items = self.items
        if len(gone) <= 8:
            for seq in gone:
                at = self._at(seq)
                if at < len(items) and _seq(items[at]) == seq:
                    del items[at]
            return
        self.items = [e for e in items[self.head :] if _seq(e) not in gone]
        self.head = 0

    def tidy(self) -> None:
        """Sweep dead entries from the head; all of them when there are too many."""
        items, q = self.items, self.q
        head, end = self.head, len(self.items)
        while head < end and not live(q, items[head]):
            head += 1
        self.head = head
        n = end - head
        if n > self.limit and n > 2 * capacity(q) + SLACK:
            kept = [e for e in items[head:] if live(q, e)]
            self.items = kept
            self.head = 0
            self.limit = 2 * len(kept) + SLACK
        elif head > SLACK and head * 2 > end:
            del items[:head]  # keep the swept prefix from pinning memory
            self.head = 0

    def first(self) -> int | None:
        """The lowest held sequence number (None: nothing held)."""
        self.tidy()
        items, q = self.items, self.q
        for at in range(self.head, len(items)):  # past messages in a socket (not held)
            e = items[at]
            if isinstance(e, int):
                return e
            if held(q, e) is not None:
                return e.seq
        return None

    def read(self, start: int, limit: int) -> list[tuple[int, Message | None]]:
        """Up to ``limit`` held messages numbered ``start`` or more, in order; a paged
        one comes as its number with :data:`PAGED` (the caller reads the store)."""
        self.tidy()
        items, q = self.items, self.q
        at = self._at(start)
        out: list[tuple[int, Message | None]] = []
        end = len(items)
        while at < end and len(out) < limit:
            e = items[at]
            if isinstance(e, int):
                out.append((e, PAGED))
            else:
                message = held(q, e)
                if message is not None:
                    out.append((e.seq, message))
            at += 1
        return out
