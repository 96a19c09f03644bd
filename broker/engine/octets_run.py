"""A producer's run of plain pushes handed to its queue's one consumer as the octets they
came in (issue 15, session 18).

The TMQP server reads a producer's pushes in one drain of its socket (``Peer.run``).  When
they go into one queue that has a single consumer with room and nothing waiting, each push
is delivered unchanged: what the consumer gets is the very octets the producer sent.  So no
:class:`~broker.message.Message` need be made for it: its id is sliced out and decoded for
the duplicate window, its octets leave the engine as the delivery
(``Tracked(consumer id, octets)``, which the server's send path appends to the consumer's
delivery batch as it would a message's wire form) and wait in the consumer's ``unsent``
deque as a ``PLAIN`` transit holding the octets.  A message is made only if the delivery
must go back to the queue (the consumer went away before the transport took it:
``broker.engine.flow.abandon``, ``tmqp_door.message_of_octets``).

Checked once for the run (any failing: nothing taken, the run takes the record path,
``Engine.receive_pushes``): the queue takes ``Queue.push_plain_run``'s fast path
(``Engine._run_queue``: the producer may push, no event subscriber, no durable
subscription; ``Queue.plain``: no handler hook, no acknowledges requested, no message
time-out, no retained messages), its status hands plain pushes to one consumer, it waits
for no acknowledge, nothing waits in it, it has exactly one consumer, the status chooses
that consumer, and the door reads its deliveries as octets (``readers``: a TMQP peer; a
STOMP subscriber is not one).  The first push is decoded (``tmqp_door.shape_of``): a plain
push (no headers, no acknowledge or response awaited, no first acquirer) from the
producer itself (its source field is the client id: nothing to stamp).

Checked per push, in order (the first failing ends the run there; it and the rest take
the record path, which answers or queues them as before): its octets match the first's
shape (flags, options, source, target, content type: so it decodes to the same fields but
its id and payload), its one-octet payload length adds up to its size, its id decodes
(UTF-8), the consumer has room left in its window, the payload is within the queue's size
limit, it has an id when the queue uses ids, and its id is not in the duplicate window
(then remembered there).  The outcome is what ``Queue.push_plain_run`` gives for the same
pushes (tested against it: ``tests/broker/test_octets_run.py``).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import TYPE_CHECKING, Any

from broker.engine.flow import PLAIN
from broker.engine.tmqp_door import HEAD, SHORT_PAYLOAD, PushShape
from broker.protocol import Outgoing, Tracked

if TYPE_CHECKING:
    from broker.engine.channel import Client as _Client
    from broker.engine.queue.queue import Queue

    Client = _Client[Any]

_tracked = tuple.__new__


def single_reader(queue: Queue, readers: Container[str]) -> Client | None:
    """The consumer a run of plain pushes into ``queue`` goes to as octets, or None (see
    the module docstring: the run's checks)."""
    if not queue.plain or not queue.strategy.takes_plain:
        return None
    if queue.options.wait_for_acknowledge and queue.tracker.pending:
        return None
    consumers = queue.channel.consumer_list
    messages = queue.messages
    if len(consumers) != 1 or messages.n_priority or messages.n_regular or messages.front:
        return None
    one = queue.strategy.plain_target(queue, consumers)
    if one is None or one.id not in readers:
        return None
    return one


def push_octets_run(
    queue: Queue,
    one: Client,
    datas: Sequence[bytes],
    shape: PushShape,
    now: float,
    out: list[Outgoing],
) -> int:
    """Deliver the pushes of ``datas`` (from the first on) that fit ``shape`` to ``one``
    as their octets; returns how many (the module docstring's per-push checks)."""
    name = queue.channel.name
    used = queue.used
    cid = one.id
    room = (one.prefetch.get(name) or queue.window) - used.get(cid, 0)
    opts = queue.options
    size_limit = opts.message_size_limit
    most = SHORT_PAYLOAD if not size_limit or size_limit > SHORT_PAYLOAD else size_limit
    use_id = opts.use_message_id
    window = opts.duplicate_window
    dedupe = use_id and window
    recent = queue.recent
    seen = recent.ids
    if dedupe:
        recent.forget_expired(now, opts.duplicate_window_time)
    held = len(seen)
    flags, options, fixed, names = shape
    names_size = len(names)
    deliver = out.append
    keep = one.unsent.append
    seq = queue.sequence
    taken = 0
    for data in datas:
        if room <= 0:
            break
        size = len(data)
        if size <= HEAD or data[0] != flags or data[1] != options or data[3:7] != fixed:
            break
        names_at = HEAD + data[2]
        payload_at = names_at + names_size
        payload = data[7]
        if payload > most or payload_at + payload != size or data[names_at:payload_at] != names:
            break
        try:
            mid = data[HEAD:names_at].decode()
        except UnicodeDecodeError:
            break
        if not mid:
            if use_id:
                break  # (the general path gives it an id)
        elif dedupe:
            if mid in seen:
                break  # (a duplicate: answered by the general path)
            seen[mid] = now
            if held < window:
                held += 1
            else:  # (one in, one out)
                seen.popitem(last=False)
        seq += 1
        deliver(_tracked(Tracked, (cid, data)))
        keep((PLAIN, queue, None, data, seq))
        taken += 1
        room -= 1
    if taken:
        queue.sequence = seq
        used[cid] = used.get(cid, 0) + taken
        queue.received += taken
        queue.last_received = now
        if dedupe:
            recent.added_at(now)
    return taken
