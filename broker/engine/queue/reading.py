"""Reading a queue by sequence number: bounds, browse, release (``broker.sequence``).

A queue *holds* a message while it waits, while it is in flight to a consumer (until
acknowledged) or delayed for a put-back, and, on a queue with the ``Retain`` option,
after it was consumed, until released or pushed out by newer ones past ``RetainLimit``
(``broker.engine.queue.retained``).  Browsing lists held messages by sequence number
without changing anything: no consumer sees a browse, no counter moves.  Releasing finishes held
messages up to a sequence number as if consumed (a producer waiting for the consumer's
acknowledge gets a positive one); deliveries in flight are left to their consumers.

A message a fast-path push handed straight to a consumer's socket (``Queue.push_plain``)
is not held; a queue with ``Retain`` never takes that path.

Sans-IO: everything here works on the queue's parts and appends to ``out``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from broker.engine.delivery import AckWhen
from broker.engine.message import DELAYED, DONE, QUEUED, Message, QueueMessage
from broker.protocol import NackReason, Outgoing
from broker.sequence import FROM_FIRST, FROM_LAST, SequenceBounds

if TYPE_CHECKING:
    from broker.engine.queue.queue import Queue


def _held(q: Queue) -> Iterator[tuple[int, QueueMessage | Message | None]]:
    """Every message the queue holds with its sequence number, in no particular order
    (a message in flight to several consumers may come more than once); None for one
    paged out to the store (``messages``: "Paging")."""
    yield from q.retained.messages.items()
    messages = q.messages
    for group in (messages.front, messages.priority, messages.regular):
        for m in group:
            if m.state == QUEUED:
                yield m.seq, m
    for seq, held in messages.paged():
        if held is None or held.state == QUEUED:
            yield seq, held
    for dl in q.tracker.pending.values():
        yield dl.message.seq, dl.message
    for _, m, _where in q.tracker.delayed:
        if m.state == DELAYED:
            yield m.seq, m


def bounds(q: Queue) -> SequenceBounds:
    """The oldest held sequence number and the newest given (``first = last + 1``: none)."""
    last = q.sequence
    first = min((seq for seq, _ in _held(q)), default=last + 1)
    return SequenceBounds(first, last)


def browse(q: Queue, from_seq: int, limit: int) -> list[tuple[int, Message]]:
    """Up to ``limit`` held messages numbered ``from_seq`` or more, in sequence order
    (``FROM_FIRST``: from the oldest held; ``FROM_LAST``: only newer than the newest).

    One pass over what the queue holds, keeping only the ``limit`` lowest numbers: the
    time grows with the queue, the memory only with ``limit``."""
    if from_seq == FROM_LAST:
        return []
    start = 1 if from_seq == FROM_FIRST else from_seq
    wanted = heapq.nsmallest(limit, ((seq, item) for seq, item in _held(q) if seq >= start),
                             key=_first)  # fmt: skip
    out: list[tuple[int, Message]] = []
    last = 0
    for seq, item in wanted:
        if seq == last:
            continue  # in flight to several consumers
        last = seq
        if item is None:  # paged: read back
            try:
                item = q.store.read(q.key, seq).message
            except Exception as exc:
                q.error(f"paged message {seq} unreadable", exc)
                continue
        out.append((seq, item.message if isinstance(item, QueueMessage) else item))
    return out


def _first(entry: tuple[int, object]) -> int:
    return entry[0]


def release(q: Queue, through: int, out: list[Outgoing]) -> int:
    """Finish every held message numbered ``through`` or less that no consumer has in
    flight, as consumed; returns how many."""
    gone = q.retained.release(through, q.sequence)
    for seq in gone:
        try:
            q.store.forget_retained(q.key, seq)
        except Exception as exc:
            q.error("store.forget_retained", exc)
    count = len(gone)
    messages = q.messages
    messages.flush_front()
    taken: list[QueueMessage] = []
    for group in (messages.priority, messages.regular):
        for m in group:
            if m.seq <= through and m.state == QUEUED:
                taken.append(m)
    for m in taken:
        messages.uncount(m)
        _consumed(q, m, out)
    held, paged = messages.take_paged(wanted=lambda seq: seq <= through)
    for m in held:
        _consumed(q, m, out)
    taken += held
    q.forget_paged(paged)  # (their producers were answered: only the store is told)
    count += len(paged)
    for _, m, _where in q.tracker.delayed:
        if m.seq <= through and m.state == DELAYED:
            _consumed(q, m, out)
            taken.append(m)
    q.removed += len(taken)
    return count + len(taken)


def _consumed(q: Queue, m: QueueMessage, out: list[Outgoing]) -> None:
    m.state = DONE  # not retained: released means gone
    q.ack_producer(m, AckWhen.ALWAYS, out, NackReason.NONE)
    q.finish(m)
