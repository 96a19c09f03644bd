"""A run of plain pushes into a broadcast queue published on its fan-out stream at once.

``Queue.push_plain_run`` hands a run here when the queue is a broadcast queue whose
channel has a fan-out stream (``broker.engine.fanout``): the general path
(``Queue.accept`` then ``Broadcast.admit``) would make a ``QueueMessage`` per push, ask the
delivery handler, derive the delivery, publish it on the stream and finish the message at
once.  For the pushes where nothing can decide otherwise that comes to: the source
stamped, a queue number, the id remembered for duplicates, one ``Stream.publish``.  This
does exactly that per push and the counting once per run.

Checked once for the run (any one failing: 0 taken, every push takes the general path):
the queue is plain (the caller), keeps no browse index, has no message limit, waits for
no acknowledge, and every consumer of the channel is a fan-out member (a consumer reading
one by one needs the dispatcher).  Checked per push, in order (the first failing one ends
the run there; it and the rest go on as ``push_plain_run``'s caller says): addressed to
this queue, no headers (a receipt or a CC is asked by a header), no acknowledge wish, no
first-acquirer flag, within the size limit, an id when ids are used, not a duplicate.
The outcome is what the general path gives one push at a time (tested against it:
``tests/broker/test_fanout_push_runs.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker.engine.queue.protocols import QueueCore
from broker.message import Message, with_source
from broker.protocol import Outgoing

if TYPE_CHECKING:
    from broker.engine.channel import Client as _Client

    Client = _Client[Any]


def publish_plain_run(
    q: QueueCore,
    stream: Any,
    ms: Sequence[Message],
    start: int,
    sender: Client,
    now: float,
    out: list[Outgoing],
) -> int:
    """Publish ``ms[start:]`` on ``stream`` (the queue's channel's) while each push is
    plain (see the module docstring); how many were taken from ``start`` on."""
    opts = q.options
    if (
        q.index is not None
        or opts.message_limit
        or (opts.wait_for_acknowledge and q.pending)
        or stream.others(q.channel.consumer_list)
    ):
        return 0
    size_limit = opts.message_size_limit
    use_id = opts.use_message_id
    window = opts.duplicate_window
    dedupe = use_id and window
    recent = q.recent
    if dedupe:
        recent.forget_expired(now, opts.duplicate_window_time)
    seen = recent.ids
    name = q.channel.name
    qid = q.id
    sid = sender.id
    publish = stream.publish
    taken = 0
    for k in range(start, len(ms)):
        m = ms[k]
        mid, src, target, ct, _hp, first, wants_ack, _ttl, headers, payload, _w = m
        if (
            headers
            or wants_ack
            or first
            or ct != qid
            or target != name
            or (size_limit and len(payload) > size_limit)
        ):
            break
        if not mid:
            if use_id:
                break  # (the general path gives it an id)
        elif dedupe and mid in seen:
            break  # (a duplicate: answered by the general path)
        if src != sid:
            m = with_source(m, sid)
        if dedupe:  # (RecentIds.add_new, inline as in push_plain_run)
            seen[mid] = now
            if len(seen) > window:  # (a smaller window: trimmed by apply_options)
                seen.popitem(last=False)
        taken += 1
        publish(m, out)
    if taken:
        q.sequence += taken
        q.received += taken
        q.last_received = now
        q.sent += taken
        q.deliveries += taken * len(stream.members)
        q.last_sent = now
        if dedupe:
            recent.added_at(now)
    return taken
