"""The messages a queue holds, in sequence order, for reading by sequence (``reading``).

A browse from a sequence number must not walk the whole queue: the index keeps every
:class:`~broker.engine.queue.queue.Queue` message that may still be held in a list
sorted by sequence number, so a browse finds where to start by bisection and reads on
from there -- O(log n + k + d) for ``k`` messages, ``d`` being entries of messages that
left and are not swept yet (see below); bounds look at the head only.

The index is built on the first bounds or browse of a queue (one pass over what it holds)
and kept from then on: a queue nobody reads by sequence pays nothing per message.  Once
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

Sans-IO, no clock: pure bookkeeping over the queue's parts.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from operator import attrgetter
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

_seq = attrgetter("seq")


def held(q: Queue, m: QueueMessage) -> Message | None:
    """The message ``m`` stands for if the queue still holds it, else None."""
    state = m.state
    if state in (QUEUED, DELAYED) or (state == INFLIGHT and m.inflight > 0):
        return m.message
    if state == DONE:
        return q.retained.messages.get(m.seq)
    return None  # INFLIGHT without an acknowledge to wait for: gone once sent


def live(q: Queue, m: QueueMessage) -> bool:
    """May the entry still be (or become again) held?"""
    return m.state != DONE or m.seq in q.retained.messages


def capacity(q: Queue) -> int:
    """An upper bound on how many messages ``q`` holds (deliveries to several
    consumers count once each)."""
    return q.messages.count + len(q.tracker.pending) + len(q.tracker.delayed) + len(q.retained)


class SequenceIndex:
    """The entries of one queue by sequence number (see the module docstring)."""

    __slots__ = ("head", "items", "limit", "q")

    def __init__(self, q: Queue) -> None:
        self.q = q
        #: QueueMessages by ascending sequence number; ``items[:head]`` are swept.
        self.items: list[QueueMessage] = []
        self.head = 0
        #: Length past which a full sweep may run (twice what the last one kept).
        self.limit = SLACK

    @classmethod
    def build(cls, q: Queue) -> SequenceIndex:
        """The index of what ``q`` holds now (one pass, one sort)."""
        ix = cls(q)
        seen: dict[int, QueueMessage] = {}
        messages = q.messages
        for group in (messages.front, messages.priority, messages.regular):
            for m in group:
                if m.state == QUEUED:
                    seen[m.seq] = m
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
        ix.items = sorted(seen.values(), key=_seq)
        return ix

    def __len__(self) -> int:
        return len(self.items) - self.head

    def add(self, m: QueueMessage) -> None:
        """A new message of the queue (or one given back with its number)."""
        items = self.items
        if not items or items[-1].seq < m.seq:
            items.append(m)
        else:
            at = bisect_left(items, m.seq, self.head, key=_seq)
            if at < len(items) and items[at].seq == m.seq:
                items[at] = m  # the same number again (a give-back's new QueueMessage)
            else:
                insort(items, m, self.head, key=_seq)
        self.tidy()

    def tidy(self) -> None:
        """Sweep dead entries from the head; all of them when there are too many."""
        items, q = self.items, self.q
        head, end = self.head, len(self.items)
        while head < end and not live(q, items[head]):
            head += 1
        self.head = head
        n = end - head
        if n > self.limit and n > 2 * capacity(q) + SLACK:
            kept = [m for m in items[head:] if live(q, m)]
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
            if held(q, items[at]) is not None:
                return items[at].seq
        return None

    def read(self, start: int, limit: int) -> list[tuple[int, Message]]:
        """Up to ``limit`` held messages numbered ``start`` or more, in order."""
        self.tidy()
        items, q = self.items, self.q
        at = bisect_left(items, start, self.head, key=_seq)
        out: list[tuple[int, Message]] = []
        end = len(items)
        while at < end and len(out) < limit:
            m = items[at]
            message = held(q, m)
            if message is not None:
                out.append((m.seq, message))
            at += 1
        return out
