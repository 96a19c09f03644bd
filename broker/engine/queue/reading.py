"""Reading a queue by sequence number: bounds, browse, release (``broker.sequence``).

A queue *holds* a message while it waits, while it is in flight to a consumer (until
acknowledged) or delayed for a put-back, and, on a queue with the ``Retain`` option,
after it was consumed, until released or pushed out by newer ones past ``RetainLimit``
(``broker.engine.queue.retained``).  Browsing lists held messages by sequence number
without changing anything: no consumer sees a browse, no counter moves.  Releasing finishes held
messages up to a sequence number as if consumed (a producer waiting for the consumer's
acknowledge gets a positive one); deliveries in flight are left to their consumers.

A message a fast-path push handed straight to a consumer's socket (``Queue.push_plain``)
is not held (as a message sent without an acknowledge request on the general path is
not); one that waits for a consumer is, and a browse lists it.  A queue with ``Retain``
never takes that path.  An ``ack:auto`` delivery sent without its tracked bookkeeping
(``broker.engine.flow.AUTO``, ``AUTO_RUN``) is held as the tracked one it stands for:
bounds and browse first make the queue's AUTO deliveries still on their way tracked
(``Queue.track_in_flight``), listed until taken (acknowledged by taking).  Bounds and
browse read the queue's sequence index
(``broker.engine.queue.seqindex``), not the whole queue.  A message paged out to the
store (``messages``: "Paging") is held and listed in its place: a browse reads its payload
back from the store (the queue unchanged); one that cannot be read is reported and skipped.

Sans-IO: everything here works on the queue's parts and appends to ``out``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.engine.delivery import AckWhen
from broker.engine.message import DELAYED, DONE, QUEUED, Message, QueueMessage
from broker.engine.queue.seqindex import SequenceIndex
from broker.protocol import NackReason, Outgoing
from broker.sequence import FROM_FIRST, FROM_LAST, SequenceBounds
from broker.store import StoredMessage

if TYPE_CHECKING:
    from broker.engine.queue.queue import Queue


def index(q: Queue) -> SequenceIndex:
    """The queue's sequence index, built on first use (``seqindex``), with the messages
    of deliveries in flight that await no acknowledge (one may come back, or be
    retained).  AUTO deliveries on their way first become the tracked ones they stand
    for (``Queue.track_in_flight``): listed as those are, until acknowledged."""
    if q.auto_in_flight:
        q.track_in_flight(q.host.now)  # (a message's time is not kept: any now will do)
    ix = q.index
    if ix is None:
        ix = q.index = SequenceIndex.build(q, q.copies_in_flight())
    return ix


def bounds(q: Queue) -> SequenceBounds:
    """The oldest held sequence number and the newest given (``first = last + 1``: none)."""
    last = q.sequence
    first = index(q).first()
    return SequenceBounds(last + 1 if first is None else first, last)


def browse(q: Queue, from_seq: int, limit: int) -> list[tuple[int, Message]]:
    """Up to ``limit`` held messages numbered ``from_seq`` or more, in sequence order
    (``FROM_FIRST``: from the oldest held; ``FROM_LAST``: only newer than the newest).

    Bisection in the queue's sequence index, then a walk of ``limit`` entries (plus the
    dead ones not swept yet), paged ones read back from the store in one batch: the time
    does not grow with the queue (``seqindex``).  The caller bounds ``limit``
    (``broker.sequence.MAX_BROWSE_LIMIT``)."""
    if from_seq == FROM_LAST or limit <= 0:
        return []
    start = 1 if from_seq == FROM_FIRST else from_seq
    if start > q.sequence:
        return []
    ix = index(q)
    out: list[tuple[int, Message]] = []
    while len(out) < limit:
        wanted = limit - len(out)
        entries = ix.read(start, wanted)
        if not entries:
            break
        paged = [seq for seq, m in entries if m is None]
        stored = _read_paged(q, paged) if paged else {}
        for seq, m in entries:
            if m is None:  # paged: its payload is in the store
                s = stored.get(seq)
                if not isinstance(s, StoredMessage):
                    q.error(f"paged message {seq} unreadable", s or LookupError(seq))
                    continue  # (skipped: the next entries fill its place)
                m = s.message
            out.append((seq, m))
        if len(entries) < wanted:
            break  # the index has no more
        start = entries[-1][0] + 1
    return out


def _read_paged(q: Queue, seqs: list[int]) -> dict[int, StoredMessage | Exception]:
    """Paged messages' payloads read back for a browse (the queue is not changed)."""
    try:
        return q.store.read_many(q.key, seqs)
    except Exception as exc:  # (each then reported unreadable)
        return dict.fromkeys(seqs, exc)


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
    messages.restore_aside()
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
