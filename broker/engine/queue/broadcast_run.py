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
one by one needs the dispatcher).  Checked per push, by ``plain_prefix`` (shared with
``Queue.push_plain_run``; the first failing one ends the run there, it and the rest go
on as ``push_plain_run``'s caller says): addressed to this queue, no headers (a receipt
or a CC is asked by a header), no acknowledge wish, no first-acquirer flag, within the
size limit, an id when ids are used, not a duplicate.
The outcome is what the general path gives one push at a time (tested against it:
``tests/broker/test_fanout_push_runs.py``).  A push that raises ends the run there: the
ones published before it are counted, it and the rest are not taken (``plain_prefix``:
their ids forgotten, ``RunFailed``; ``tests/broker/test_run_failed_mid.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from broker.engine.queue.plain_prefix import forget_from, plain_prefix, raise_failed
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
    end = plain_prefix(ms, start, len(ms), q.id, q.channel.name, opts, q.recent, now)
    if end == start:
        return 0
    sid = sender.id
    publish = stream.publish
    k = start
    failed: BaseException | None = None
    try:
        for k in range(start, end):
            m = ms[k]
            if m.source != sid:
                m = with_source(m, sid)
            publish(m, out)
    except BaseException as exc:  # push k raised before it was published
        failed = exc
        forget_from(ms, k, end, q.recent)
        end = k
    taken = end - start
    q.sequence += taken
    q.received += taken
    q.last_received = now
    q.sent += taken
    q.deliveries += taken * len(stream.members)
    q.last_sent = now
    if failed is not None:
        raise_failed(failed, taken)
    return taken
