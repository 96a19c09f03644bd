"""A ``Retain`` queue read by sequence while a consumed message is still on its way
through a consumer's socket (session 21, adv21).

The sequence index (``broker.engine.queue.seqindex``) is built on the first bounds or
browse of a queue from what the queue holds then.  A message of a queue without
acknowledges that sits in a consumer's socket, not yet taken by the transport, is not
held (a browse does not list it) -- but once the transport takes it, it is consumed and
a ``Retain`` queue keeps it: it is held again, and a browse must list it.  Before the fix
the index built in between had no entry for it, so browse never listed it while bounds
did (``tests/broker/test_sequence.py::test_retain_limit_pushes_out_the_oldest`` failed
about once in 150 runs under load, its browse stuck at ``[3, 4]``)."""

from __future__ import annotations

import pytest

from broker.engine.queue import reading
from broker.sequence import FROM_FIRST, SequenceBounds
from tests.broker.engine_kit import Kit


def _seqs(kit: Kit, channel: str, queue_id: int) -> list[int]:
    q = kit.engine.channels[channel].queues[queue_id]
    return [seq for seq, _ in reading.browse(q, FROM_FIRST, 100)]


@pytest.mark.parametrize("in_socket", [1, 2, 5])
def test_a_message_consumed_after_the_index_was_built_is_listed_once_retained(
    in_socket: int,
) -> None:
    kit = Kit(auto_transmit=False)
    c = kit.connect("c")
    kit.queue(c, "log", 3, retain=True, retain_limit=3)
    kit.join(c, "log")
    for i in range(5):
        kit.push(c, "log", 3, b"r%d" % i)
    kit.transmit("c", 5 - in_socket)  # the last ``in_socket`` still in the socket
    first = 5 - in_socket  # (retained so far: the newest three of those taken)
    assert _seqs(kit, "log", 3) == list(range(max(1, first - 2), first + 1))  # (builds it)
    kit.transmit("c")  # the transport takes the rest: consumed, retained
    q = kit.engine.channels["log"].queues[3]
    assert list(q.retained.messages) == [3, 4, 5]
    assert _seqs(kit, "log", 3) == [3, 4, 5]
    assert reading.bounds(q) == SequenceBounds(3, 5)


def test_bounds_and_browse_agree_when_the_index_was_built_mid_send() -> None:
    """The same with a limit above what was sent: nothing pushed out, every message
    listed in order once taken, bounds from the first."""
    kit = Kit(auto_transmit=False)
    c = kit.connect("c")
    kit.queue(c, "log", 1, retain=True, retain_limit=100)
    kit.join(c, "log")
    for i in range(10):
        kit.push(c, "log", 1, b"m%d" % i)
        if i % 3 == 0:  # (a browse now and then: all are in the socket, none held)
            assert _seqs(kit, "log", 1) == []
    kit.transmit("c", 4)
    assert _seqs(kit, "log", 1) == [1, 2, 3, 4]
    kit.transmit("c")
    q = kit.engine.channels["log"].queues[1]
    assert _seqs(kit, "log", 1) == list(range(1, 11))
    assert reading.bounds(q) == SequenceBounds(1, 10)
