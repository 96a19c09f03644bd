"""The plain prefix of a run of pushes: how far a run stays plain, its ids remembered.

The two run paths for plain pushes -- ``Queue.push_plain_run`` (push and round-robin
queues) and ``broadcast_run.publish_plain_run`` (a broadcast queue's fan-out stream) --
take the pushes of one producer's run while each is one the general path would take
without a decision of its own.  The per-push checks are the same for both and live here,
in one loop over the run (one call per run, none per push):

* addressed to this queue (its id and its channel's name);
* no headers (a receipt, a CC or a selector's facts are asked by headers), no acknowledge
  wish, no first-acquirer flag;
* within the size limit (``MessageSizeLimit``);
* an id when ids are used (the general path gives it one), and not a duplicate: an id the
  window remembers, or one met earlier in the same run, ends the prefix there (the
  general path answers it).

The ids of the prefix are remembered as ``RecentIds.add_new`` does (inline: a call per push
costs more), one eviction per id stored: a window made smaller was trimmed where it was
made so (``Queue.apply_options``).  The caller then serves ``ms[start:end]`` its own way
(stamping each push's source, delivering or queueing or publishing it).  ``most`` caps
the prefix where the caller knows it cannot take more (a queue with a message limit takes
only what its consumers' windows have room for).

A push of the prefix that raises while it is served (before it is delivered, placed or
published) ends the run there: the caller counts the pushes before it as taken, gives
the failed one no number, forgets its id and those after it (:func:`forget_from`) and
raises :class:`~broker.engine.errors.RunFailed` (:func:`raise_failed`); the engine goes on
after the failed push, as it goes on after a push that raised alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from broker.engine.errors import RunFailed
from broker.engine.options import ChannelQueueOptions
from broker.engine.queue.dedupe import RecentIds
from broker.message import Message


def plain_prefix(
    ms: Sequence[Message],
    start: int,
    most: int,
    queue_id: int,
    channel: str,
    opts: ChannelQueueOptions,
    recent: RecentIds,
    now: float,
) -> int:
    """The end of the plain prefix of ``ms[start:]`` (at most ``most`` pushes), their ids
    remembered (see the module docstring); ``start`` when the first is not plain."""
    size_limit = opts.message_size_limit
    use_id = opts.use_message_id
    window = opts.duplicate_window
    dedupe = use_id and window
    seen = recent.ids
    if dedupe:
        recent.forget_expired(now, opts.duplicate_window_time)
    held = len(seen)  # (counted here: a len() per push costs a call)
    end = min(len(ms), start + most)
    k = start
    while k < end:
        # (one unpacking: a named tuple's attribute reads cost more per push)
        mid, _src, target, ct, _hp, first, wants_ack, _ttl, headers, payload, _w = ms[k]
        if (
            headers
            or wants_ack
            or first
            or ct != queue_id
            or target != channel
            or (size_limit and len(payload) > size_limit)
        ):
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
        k += 1
    if dedupe and k > start:
        recent.added_at(now)  # (the order bookkeeping of ``RecentIds.add``, once)
    return k


def forget_from(ms: Sequence[Message], failed: int, end: int, recent: RecentIds) -> None:
    """A push of the prefix ``..end`` failed at ``failed``: the ids of that push and of
    the pushes after it (remembered by :func:`plain_prefix`, never taken) are forgotten
    again, so a resend of any of them is taken (``broker.engine.errors.RunFailed``)."""
    seen = recent.ids
    for k in range(failed, end):
        mid = ms[k].message_id
        if mid:
            seen.pop(mid, None)


def raise_failed(error: BaseException, taken: int) -> NoReturn:
    """End a run whose push after the ``taken`` ones raised ``error``: as
    :class:`RunFailed` (``done``: those and the failed one), an interrupt as itself."""
    if not isinstance(error, Exception):
        raise error
    raise RunFailed(taken + 1, error) from error
