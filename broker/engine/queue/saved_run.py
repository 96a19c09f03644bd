"""A run of acknowledged pushes into one queue that saves every push on receipt.

A TMQP batch (``broker.batch``) of a producer that waits for acknowledges, into a queue
whose delivery handler saves every message and confirms it once saved (the
``persistent`` handler: ``SAVE_ACK`` whatever the message), is taken here in one call
instead of one general push (``Engine._push`` -> ``Queue.accept``) per frame.  The batch
answers all its pushes with one acknowledge, so a saved push needs no acknowledge frame
of its own: it is marked acknowledged; a push the store refused is reported by its
position (the batch refuses it by index, ``failed``, as the negative acknowledge
``Queue.accept`` makes for it would have).

Every rule of the general path is kept, in its order, per message: a push that is not
acknowledged, carries headers or no message id, goes elsewhere, is a duplicate within
the queue's window, or that the queue (status, size, ``MessageLimit``) or the broker
(``max_queue_messages``) would refuse ends the run: it takes the general path, which
answers it, and the rest may come here again.  What cannot change within a batch (the
queue, its handler, the producer's right to push, event and durable-subscription
watchers) the caller checks once for the run.  Each taken message is numbered, saved
(``Ledger.save``: under the engine's ``Store.hold`` the batch's saves go to the log as
one group, one durability wait), remembered for duplicate suppression and admitted by
the queue's status as :meth:`Queue.accept` does; the outcome is what the frames handled
one by one give (tested against it: ``tests/broker/test_saved_run.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.engine.channels import Client
from broker.engine.message import QueueMessage
from broker.engine.queue.queue import Queue
from broker.message import Message, derive
from broker.protocol import Outgoing


def push_saved_run(
    q: Queue,
    ms: Sequence[Message],
    start: int,
    sender: Client,
    now: float,
    out: list[Outgoing],
    max_messages: int,
    refused: list[tuple[int, str]],
) -> int:
    """Take ``ms[start:]`` into ``q`` up to the first push the general path must see
    (see the module docstring); returns how many were taken.  Taken pushes whose
    producer must hear "no" go to ``refused`` as (position in ``ms``, reason): ``""``
    for one the store refused (it stays queued in memory: at least once), ``"internal
    error"`` for one during which a collaborator raised (counted as the queue's error;
    the run ends there, as the general path's answer to an exception would: never a
    false yes).  ``max_messages``: the broker's bound on the messages one queue holds."""
    strategy = q.strategy
    if not strategy.accepts_pushes:
        return 0
    opts = q.options
    size_limit = opts.message_size_limit
    limit = opts.message_limit if strategy.limits_count else 0
    counted = strategy.limits_count
    dedupe = bool(opts.use_message_id and opts.duplicate_window)
    window, window_time = opts.duplicate_window, opts.duplicate_window_time
    recent = q.recent
    index = q.index
    save = q.save
    admit = strategy.admit
    dispatch = q.dispatch
    qid = q.id
    name = q.channel.name
    sid = sender.id
    taken = 0
    k = start
    try:
        for k in range(start, len(ms)):
            m = ms[k]
            mid = m.message_id
            if (
                not mid
                or not m.wants_ack
                or m.headers
                or m.content_type != qid
                or m.target != name
            ):
                break
            if dedupe and recent.seen(mid, now, window_time):
                break  # a duplicate: answered by the general path
            size = len(m.payload)
            if size_limit and size > size_limit:
                break  # refused by the general path
            if counted:
                count = q.message_count
                if (limit and count >= limit) or count >= max_messages:
                    break  # refused by the general path
            message = derive(m, False, qid, mid, sid, name, ())
            q.sequence += 1
            qm = QueueMessage(q.sequence, message, sender, True, now)
            if index is not None:
                index.add(qm)
            q.received += 1
            q.last_received = now
            save(qm)  # (the handler's SAVE_ACK: saved, then acknowledged)
            life = qm.lived()
            life.acked = True  # the batch's acknowledge answers it (or its refusal)
            if not life.saved:
                refused.append((k, ""))
            taken += 1
            if dedupe:
                recent.add(mid, now, window)
            dispatch.fresh, dispatch.fresh_message = qm, message  # (as ``accept``)
            admit(q, qm, now, out)
            dispatch.fresh = dispatch.fresh_message = None
    except Exception as exc:
        dispatch.fresh = dispatch.fresh_message = None
        q.error("saved run", exc)
        if taken == k - start:  # (raised before it was counted: it is taken here)
            taken += 1
        if not refused or refused[-1][0] != k:
            refused.append((k, INTERNAL_ERROR))
    return taken


#: The reason a run's push during which a collaborator raised is refused with.
INTERNAL_ERROR = "internal error"
