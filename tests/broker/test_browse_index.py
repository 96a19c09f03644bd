"""Browse and bounds read the queue's sequence index (broker.engine.queue.seqindex): the
same answers as a full scan of what the queue holds, while messages are consumed,
acknowledged, nacked and put back, expire, are purged, released or given back by a
consumer that goes away -- driven at random against the sans-IO engine (fake clock)."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest

from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Message
from broker.engine.queue import reading
from broker.engine.queue.queue import Queue
from broker.engine.queue.seqindex import SLACK, capacity, live
from broker.protocol import Header, Operation, QueueStatus
from broker.sequence import FROM_FIRST, FROM_LAST, MAX_BROWSE_LIMIT, decode_browse
from tests.broker.engine_kit import Kit, queue_messages


def scan(q: Queue) -> dict[int, Message]:
    """What the queue holds, found the slow way (every part of the queue looked at)."""
    held: dict[int, Message] = dict(q.retained.messages)
    for group in (q.messages.front, q.messages.priority, q.messages.regular):
        for m in group:
            if m.state == QUEUED:
                held[m.seq] = m.message
    for dl in q.tracker.pending.values():
        # a message finished (purged, expired) while another consumer still has a copy
        # to acknowledge is gone: its store record and producer were settled
        if dl.message.state != DONE:
            held[dl.message.seq] = dl.message.message
    for _, m, _where in q.tracker.delayed:
        if m.state == DELAYED:
            held[m.seq] = m.message
    return held


def check(q: Queue, rng: random.Random) -> None:
    held = scan(q)
    expected_first = min(held, default=q.sequence + 1)
    b = reading.bounds(q)
    assert (b.first, b.last) == (expected_first, q.sequence)
    for start in (FROM_FIRST, 1, rng.randint(1, q.sequence + 2), q.sequence, q.sequence + 5):
        limit = rng.choice((1, 3, 50, MAX_BROWSE_LIMIT))
        lo = 1 if start == FROM_FIRST else start
        want = sorted(s for s in held if s >= lo)[:limit]
        got = reading.browse(q, start, limit)
        assert [s for s, _ in got] == want, (start, limit)
        assert all(got_m.payload == held[s].payload for s, got_m in got)
    assert reading.browse(q, FROM_LAST, 10) == []
    # the index never keeps much more than the queue can hold
    ix = q.index
    assert ix is not None
    assert len(ix) <= max(ix.limit, 2 * capacity(q) + SLACK)
    # and what it keeps is held, or a message on its way through a socket
    in_sockets = sum(m.unsent for m in ix.items[ix.head :] if m.state == INFLIGHT)
    assert sum(1 for m in ix.items[ix.head :] if live(q, m)) <= len(held) + in_sockets


OPTION_SETS: list[dict[str, Any]] = [
    {"request_acknowledge": True, "acknowledge_timeout": 500, "message_timeout": 3000},
    {
        "request_acknowledge": True,
        "put_back_delay": 200,
        "retain": True,
        "retain_limit": 20,
        "allow_release": True,
    },
    {},  # plain: the fast path
    {"status": QueueStatus.PULL, "message_timeout": 2000},
    {"status": QueueStatus.ROUND_ROBIN, "request_acknowledge": True, "prefetch": 3},
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(sorted(o)) or "plain")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_index_answers_as_a_full_scan_under_random_traffic(
    options: dict[str, Any], seed: int
) -> None:
    rng = random.Random(seed)
    kit = Kit(auto_transmit=False)
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, **options)
    q = kit.engine.channels["ch"].queues[1]
    consumers: list[str] = []
    held_frames: dict[str, list[Any]] = {}
    check(q, rng)  # the index is built here, on an empty queue, and kept from now on
    serial = joined = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.40:
            for _ in range(rng.randint(1, 6)):
                serial += 1
                kit.push(producer, "ch", 1, b"p%d" % serial, high=rng.random() < 0.1)
        elif op < 0.50 and len(consumers) < 3:
            joined += 1
            name = kit.connect(f"c{joined}")
            kit.join(name, "ch")
            consumers.append(name)
            held_frames[name] = []
        elif op < 0.62 and consumers:
            name = rng.choice(consumers)
            kit.transmit(name, rng.randint(0, kit.unsent[name]))
            held_frames[name] += queue_messages(kit.take(name))
        elif op < 0.74 and consumers:
            name = rng.choice(consumers)
            frames = held_frames[name]
            rng.shuffle(frames)
            for f in frames[: rng.randint(0, len(frames))]:
                if f.pending_ack:
                    kit.ack(name, f, nack="rejected" if rng.random() < 0.3 else None)
                frames.remove(f)
        elif op < 0.80 and consumers:
            name = consumers.pop(rng.randrange(len(consumers)))
            held_frames.pop(name)
            kit.disconnect(name)  # its deliveries come back (given back, put back)
        elif op < 0.86:
            kit.advance(rng.choice((0.1, 0.3, 1.0, 4.0)))  # put-back delays, timeouts
        elif op < 0.89:
            kit.ok(producer, Operation.QUEUE_PURGE, "ch", headers=((Header.QUEUE_ID, "1"),))
        elif op < 0.92 and q.options.allow_release:
            kit.ok(
                producer,
                Operation.QUEUE_RELEASE,
                "ch",
                headers=((Header.QUEUE_ID, "1"), (Header.THROUGH_SEQ, str(q.sequence // 2))),
            )
        elif op < 0.95 and q.options.status == QueueStatus.PULL:
            joined += 1
            name = kit.connect(f"puller{joined}")
            kit.join(name, "ch")
            kit.pull(name, "ch", 1, headers=((Header.COUNT, str(rng.randint(1, 5))),))
            kit.disconnect(name)
        check(q, rng)
    assert q.sequence > 0


def test_plain_pushes_that_wait_are_browsable_and_sent_ones_are_not() -> None:
    """The fast path (Queue.push_plain) keeps no QueueMessage for a message it hands to a
    consumer at once (nothing is held, as on the general path without acknowledges), but
    one that waits for a consumer is held: the index lists it."""
    kit = Kit(auto_transmit=False)
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1)
    q = kit.engine.channels["ch"].queues[1]
    assert q.plain
    assert reading.browse(q, FROM_FIRST, 10) == []  # index built, empty
    for i in range(5):
        kit.push(producer, "ch", 1, b"w%d" % i)
    assert [s for s, _ in reading.browse(q, FROM_FIRST, 10)] == [1, 2, 3, 4, 5]
    kit.connect("c")
    kit.join("c", "ch")  # the waiting ones go to the consumer...
    kit.transmit("c")
    kit.push(producer, "ch", 1, b"direct")  # ...and this one straight to its socket
    assert len(queue_messages(kit.take("c"))) >= 5
    kit.transmit("c")
    assert reading.browse(q, FROM_FIRST, 10) == []
    assert reading.bounds(q).empty


def test_a_plain_delivery_given_back_is_browsable_again_in_its_place() -> None:
    kit = Kit(auto_transmit=False)
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1)
    q = kit.engine.channels["ch"].queues[1]
    c = kit.connect("c")
    kit.join(c, "ch")
    kit.push(producer, "ch", 1, b"one")  # straight to c's socket, not sent yet
    assert reading.browse(q, FROM_FIRST, 10) == []
    kit.disconnect(c)  # never sent: given back with its number
    got = reading.browse(q, FROM_FIRST, 10)
    assert [(s, bytes(m.payload)) for s, m in got] == [(1, b"one")]
    kit.push(producer, "ch", 1, b"two")
    assert [s for s, _ in reading.browse(q, 2, 10)] == [2]
    assert [s for s, _ in reading.browse(q, FROM_FIRST, 10)] == [1, 2]


def test_browse_beyond_the_head_and_huge_limits() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL)
    q = kit.engine.channels["ch"].queues[1]
    for i in range(30):
        kit.push(producer, "ch", 1, b"m%d" % i)
    assert reading.browse(q, 31, 10) == []
    assert reading.browse(q, 2**63 - 1, 10) == []
    assert reading.browse(q, 30, 10)[0][0] == 30
    assert reading.browse(q, 5, 0) == []
    assert len(reading.browse(q, FROM_FIRST, 10**9)) == 30
    # over the wire a huge Limit is cut to MAX_BROWSE_LIMIT (and the reply budget)
    for _ in range(MAX_BROWSE_LIMIT + 10):
        kit.push(producer, "ch", 1, b"")
    reply = kit.op(
        producer,
        Operation.QUEUE_BROWSE,
        "ch",
        headers=((Header.QUEUE_ID, "1"), (Header.FROM_SEQ, "0"), (Header.LIMIT, str(2**62))),
        response=True,
    )
    entries = decode_browse(reply.payload)
    assert 0 < len(entries) <= MAX_BROWSE_LIMIT
    assert [e.sequence for e in entries] == list(range(1, len(entries) + 1))


def test_a_long_queue_keeps_a_bounded_index_when_its_head_is_stuck() -> None:
    """One delivery never acknowledged at the head while thousands pass behind it: the
    index sweeps them (it must not keep every consumed message and its payload)."""
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, request_acknowledge=True, acknowledge_timeout=0)
    q = kit.engine.channels["ch"].queues[1]
    c = kit.connect("c")
    kit.join(c, "ch")
    reading.bounds(q)
    kit.push(producer, "ch", 1, b"stuck")
    (stuck,) = queue_messages(kit.take(c))
    for _ in range(5000):
        kit.push(producer, "ch", 1, b"x" * 10)
        (f,) = queue_messages(kit.take(c))
        kit.ack(c, f)
    assert q.index is not None and len(q.index) <= 2 * 1 + 2 * SLACK
    assert reading.bounds(q).first == 1
    assert [s for s, _ in reading.browse(q, FROM_FIRST, 10)] == [1]
    kit.ack(c, stuck)
    assert reading.bounds(q).empty


class _NoWalk(deque):  # type: ignore[type-arg]
    """A queue deque that fails the test when something walks it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("browse walked the whole queue")


def test_bounds_and_browse_do_not_walk_the_queue() -> None:
    """Regression (issue 14): browse and bounds scanned every held message per call; a
    reader of a long queue paid for the whole queue on every page.  After the first read
    (which builds the index) they must not iterate the queue's deques at all."""
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL)
    q = kit.engine.channels["ch"].queues[1]
    for i in range(2000):
        kit.push(producer, "ch", 1, b"m%d" % i)
    reading.bounds(q)  # builds the index (one pass)
    order = q.messages
    order.regular = _NoWalk(order.regular)
    order.priority = _NoWalk(order.priority)
    for i in range(200):  # more pushes: appended to the index, not found by a scan
        kit.push(producer, "ch", 1, b"n%d" % i)
    assert reading.bounds(q).first == 1
    got = reading.browse(q, 1500, 10)
    assert [s for s, _ in got] == list(range(1500, 1510))
    assert [s for s, _ in reading.browse(q, 2195, 100)] == list(range(2195, 2201))
