"""A run of acknowledged pushes into one queue whose handler decides the same for each.

Acknowledged pushes of one producer into one queue -- a TMQP batch (``broker.batch``), or
single pushes the server read in one drain of its socket (``Engine.receive_pushes``) -- are
taken here in one call instead of one general push (``Engine._push`` -> ``Queue.accept``)
per frame, when the queue's delivery handler answers every push alike:

* ``saves``: it saves every message and confirms it once saved (the ``persistent``
  handler: ``SAVE_ACK`` whatever the message);
* else: it confirms every message on receipt and saves none (the default handler on a
  queue that does not relay its consumers' acknowledges: ``ALLOW_ACK``).

How a producer hears the outcome (``answer``):

* a batch answers all its pushes with one acknowledge: a taken push needs no
  acknowledge frame of its own (it is marked acknowledged); one the store refused is
  reported by its position (the batch refuses it by index, ``failed``, as the negative
  acknowledge ``Queue.accept`` makes for it would have);
* single pushes (``answer``) each get the acknowledge :meth:`Ledger.ack_producer` gives
  them one by one, in the same place of the output: positive, or negative ``failed`` for
  one the store refused.

Every rule of the general path is kept, in its order, per message: a push that is not
acknowledged, carries headers or no message id, goes elsewhere, is a duplicate within
the queue's window, or that the queue (status, size, ``MessageLimit``) or the broker
(``max_queue_messages``) would refuse ends the run: it takes the general path, which
answers it, and the rest may come here again.  What cannot change within a run (the
queue, its handler, the producer's right to push, event and durable-subscription
watchers) the caller checks once for the run.

The run is taken in two steps.  First each message is checked, numbered and remembered
for duplicate suppression, as :meth:`Queue.accept` does before its handler's decision
(the count limits are checked against the queue's count plus the messages taken before
it, as if none of them left at once: a run may end earlier than one by one would, never
later).  Then, with ``saves``, the run is saved with one call (``Ledger.save_run``:
under the engine's ``Store.hold`` the saves go to the log as one group, one durability
wait), before any of it can reach a consumer (and be removed from the store); then each
message is acknowledged and admitted by the queue's status, as :meth:`Queue.accept`
does.  The outcome is what the frames handled one by one give (tested against it:
``tests/broker/test_saved_run.py``, ``tests/broker/test_acked_runs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from broker.engine.channels import Client
from broker.engine.frames import ack as ack_frame
from broker.engine.message import QueueMessage
from broker.engine.queue.queue import Queue
from broker.message import Message, derive
from broker.protocol import DEFAULT_TTL, MessageType, NackReason, Outgoing
from broker.tmqp import Frame as _Frame

_new = tuple.__new__
_ACK = int(MessageType.ACK)


def push_saved_run(
    q: Queue,
    ms: Sequence[Message],
    start: int,
    sender: Client,
    now: float,
    out: list[Outgoing],
    max_messages: int,
    refused: list[tuple[int, str]],
    *,
    saves: bool = True,
    answer: bool = False,
) -> int:
    """Take ``ms[start:]`` into ``q`` up to the first push the general path must see
    (see the module docstring); returns how many were taken.  Taken pushes whose
    producer must hear "no" go to ``refused`` as (position in ``ms``, reason): ``""``
    for one the store refused (it stays queued in memory: at least once; with
    ``answer`` it is answered in ``out`` instead), ``"internal error"`` for one during
    which a collaborator raised (counted as the queue's error; the numbering ends
    there, as the general path's answer to an exception would: never a false yes).
    ``max_messages``: the broker's bound on the messages one queue holds."""
    strategy = q.strategy
    if not strategy.accepts_pushes:
        return 0
    taken: list[QueueMessage] = []
    messages: list[Message] = []
    failed = _number(q, ms, start, sender, now, max_messages, taken, messages)
    if saves and taken:
        q.ledger.save_run(taken, messages)
    _admit(q, taken, messages, start, sender.id, now, out, refused, saves, answer)
    if failed:
        refused.append((start + len(taken), INTERNAL_ERROR))
        return len(taken) + 1
    return len(taken)


def _number(
    q: Queue,
    ms: Sequence[Message],
    start: int,
    sender: Client,
    now: float,
    max_messages: int,
    taken: list[QueueMessage],
    messages: list[Message],
) -> bool:
    """Step one: the queue messages of the run's pushes, numbered, indexed and counted,
    their ids remembered, in ``taken`` (their messages in ``messages``); True when a
    collaborator raised on the push after them (counted as the queue's error)."""
    opts = q.options
    strategy = q.strategy
    size_limit = opts.message_size_limit
    limit = opts.message_limit if strategy.limits_count else 0
    counted = strategy.limits_count
    dedupe = bool(opts.use_message_id and opts.duplicate_window)
    window = opts.duplicate_window
    recent = q.recent
    if dedupe:  # (what ``RecentIds.seen`` does first, once for the run's ``now``)
        recent.forget_expired(now, opts.duplicate_window_time)
    seen = recent.ids
    remember = recent.add_new
    index = q.index
    qid = q.id
    name = q.channel.name
    sid = sender.id
    count = q.message_count
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
            if dedupe and mid in seen:
                break  # a duplicate: answered by the general path
            if size_limit and len(m.payload) > size_limit:
                break  # refused by the general path
            if counted and ((limit and count >= limit) or count >= max_messages):
                break  # refused by the general path
            count += 1
            message = derive(m, False, qid, mid, sid, name, ())
            q.sequence += 1
            qm = QueueMessage(q.sequence, message, sender, True, now)
            if index is not None:
                index.add(qm)
            q.received += 1
            q.last_received = now
            if dedupe:
                remember(mid, now, window)
            taken.append(qm)
            messages.append(message)
    except Exception as exc:
        q.error("saved run", exc)
        return True
    finally:
        if dedupe and taken:
            recent.added_at(now)  # (the order bookkeeping of ``RecentIds.add``, once)
    return False


def _admit(
    q: Queue,
    taken: list[QueueMessage],
    messages: list[Message],
    start: int,
    sid: str,
    now: float,
    out: list[Outgoing],
    refused: list[tuple[int, str]],
    saves: bool,
    answer: bool,
) -> None:
    """Step two: each taken message acknowledged (see the module docstring) and admitted
    by the queue's status; one whose admission raised is refused too (counted as the
    queue's error; a single push was acknowledged already, as ``Queue.accept`` had done
    before the same exception) and the others go on."""
    admit = q.strategy.admit
    dispatch = q.dispatch
    qid = q.id
    name = q.channel.name
    for k, (qm, message) in enumerate(zip(taken, messages, strict=True), start):
        life = qm.lived()
        life.acked = True  # (answered here, or by the batch's acknowledge)
        if saves and not life.saved:
            if answer:  # (the handler's SAVE_ACK, refused: ``Ledger.side_effects``)
                frame = ack_frame(qid, qm.message_id, "", name, NackReason.FAILED)
                out.append(_new(Outgoing, (sid, frame)))
            else:
                refused.append((k, ""))
        elif answer:  # (``frames.ack`` of a positive acknowledge, made in place)
            frame = _Frame(False, False, _ACK, False, False, DEFAULT_TTL, qid, qm.message_id,
                           "", name, (), b"")  # fmt: skip
            out.append(_new(Outgoing, (sid, frame)))
        dispatch.fresh, dispatch.fresh_message = qm, message  # (as ``accept``)
        try:
            admit(q, qm, now, out)
        except Exception as exc:
            q.error("saved run", exc)
            if not refused or refused[-1][0] != k:
                refused.append((k, INTERNAL_ERROR))
        finally:
            dispatch.fresh = dispatch.fresh_message = None


#: The reason a run's push during which a collaborator raised is refused with.
INTERNAL_ERROR = "internal error"
