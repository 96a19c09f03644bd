"""Browse and bounds read the queue's sequence index (broker.engine.queue.seqindex): the
same answers as a full scan of what the queue holds, while messages are consumed,
acknowledged, nacked and put back, expire, are purged, released or given back by a
consumer that goes away -- driven at random against the sans-IO engine (fake clock); and
on persistent queues that page (a small ``Limits.paged_window``: most waiting messages
are numbers only, read back from the log as the window drains, by FIFO and LIFO pulls)."""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.limits import Limits
from broker.engine.message import DELAYED, DONE, INFLIGHT, QUEUED, Message
from broker.engine.options import BrokerConfig
from broker.engine.queue import reading
from broker.engine.queue.queue import Queue
from broker.engine.queue.seqindex import SLACK, capacity, live
from broker.protocol import Header, Operation, QueueStatus
from broker.sequence import FROM_FIRST, FROM_LAST, MAX_BROWSE_LIMIT, decode_browse
from broker.store.durable import DurableStore
from broker.store.log import LogStore
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
    for seq, waiting in q.messages.paged():  # paging: numbers behind the window
        if waiting is None:
            held[seq] = q.store.read(q.key, seq).message
        elif waiting.state == QUEUED:
            held[seq] = waiting.message
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
    entries = ix.items[ix.head :]
    seqs = [e if isinstance(e, int) else e.seq for e in entries]
    assert seqs == sorted(set(seqs))  # in order, each number once
    # a paged message is its number in the index (no payload kept), and only while paged
    paged = {seq for seq, waiting in q.messages.paged() if waiting is None}
    assert {e for e in entries if isinstance(e, int)} == paged
    # and what it keeps is held, or a message on its way through a socket
    objects = [m for m in entries if not isinstance(m, int)]
    in_sockets = sum(m.unsent for m in objects if m.state == INFLIGHT)
    assert sum(1 for m in entries if live(q, m)) <= len(held) + in_sockets


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


#: Persistent queues that page: the log holds what waits beyond the window.
PAGED_OPTION_SETS: list[dict[str, Any]] = [
    {"request_acknowledge": True, "acknowledge_timeout": 500},
    {
        "request_acknowledge": True,
        "put_back_delay": 200,
        "retain": True,
        "retain_limit": 20,
        "allow_release": True,
    },
    {},
    {"status": QueueStatus.PULL},
    {"status": QueueStatus.PULL, "message_timeout": 2000},  # (deadlines: held in a tail)
    {"status": QueueStatus.ROUND_ROBIN, "request_acknowledge": True, "prefetch": 3},
]

PAGED_WINDOW = 3


@contextmanager
def _paging_kit(directory: Path) -> Iterator[Kit]:
    limits = Limits(paged_window=PAGED_WINDOW)
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=limits)
    with LogStore(directory) as log:
        yield Kit(
            auto_transmit=False,
            store=DurableStore(log),
            handlers={"persistent": PersistentDeliveryHandler()},
            config=config,
        )


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(sorted(o)) or "plain")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_index_answers_as_a_full_scan_under_random_traffic(
    options: dict[str, Any], seed: int
) -> None:
    _random_traffic(Kit(auto_transmit=False), options, random.Random(seed))


@pytest.mark.parametrize(
    "options", PAGED_OPTION_SETS, ids=lambda o: ",".join(sorted(o)) or "persistent"
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_index_answers_as_a_full_scan_on_a_paging_queue(
    options: dict[str, Any], seed: int, tmp_path: Path
) -> None:
    """Messages enter the paged tails (as numbers), come back into the window (FIFO
    refills, LIFO pulls from the end), are cleared or released while paged: every
    browse and bounds must equal the full scan (paged payloads read from the log)."""
    with _paging_kit(tmp_path) as kit:
        q = _random_traffic(
            kit, {**options, "message_delivery_handler": "persistent"}, random.Random(seed)
        )
        assert q.messages.paging
        assert q.index is not None


def _random_traffic(kit: Kit, options: dict[str, Any], rng: random.Random) -> Queue:
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
            count = (Header.COUNT, str(rng.randint(1, 5)))
            order = (Header.ORDER, rng.choice(("FIFO", "LIFO")))  # LIFO: from a paged end
            kit.pull(name, "ch", 1, headers=(count, order))
            kit.disconnect(name)
        check(q, rng)
    assert q.sequence > 0
    return q


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


def _fill_paged(kit: Kit, count: int, high: frozenset[int] = frozenset()) -> str:
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL,
              message_delivery_handler="persistent")  # fmt: skip
    for i in range(1, count + 1):
        kit.push(producer, "ch", 1, b"p%d" % i, high=i in high)
    return producer


def _listed(q: Queue, start: int = FROM_FIRST, limit: int = 1000) -> list[tuple[int, bytes]]:
    return [(s, bytes(m.payload)) for s, m in reading.browse(q, start, limit)]


def test_an_index_built_over_paged_messages_and_after_a_restart(tmp_path: Path) -> None:
    """The index is built while most messages wait paged (numbers only), and again
    after a restart that restores the queue from the log's index (nothing read back
    beyond the window): both list every message in sequence order, payloads from the
    log, each once while pulls bring paged ones back into the window."""
    high = frozenset({4, 11, 17})
    every = [(i, b"p%d" % i) for i in range(1, 31)]
    with _paging_kit(tmp_path) as kit:
        _fill_paged(kit, 30, high)
        q = kit.engine.channels["ch"].queues[1]
        assert sum(1 for _, w in q.messages.paged() if w is None) > 20  # mostly paged
        assert _listed(q) == every  # built here, over the paged numbers
        assert reading.bounds(q).first == 1
        assert _listed(q, 12, 5) == every[11:16]
        assert q.index is not None and sum(isinstance(e, int) for e in q.index.items) > 20
        name = kit.connect("puller")
        kit.join(name, "ch")
        kit.pull(name, "ch", 1, headers=((Header.COUNT, "5"),))  # 4, 11, 17, 1, 2
        check(q, random.Random(1))  # (on their way through the socket: not held)
        kit.transmit(name)  # sent: consumed, gone from the log
        check(q, random.Random(1))
        assert _listed(q) == [e for e in every if e[0] not in (1, 2, 4, 11, 17)]
    with _paging_kit(tmp_path) as kit:
        assert kit.engine.recover(kit.now) == 25
        q = kit.engine.channels["ch"].queues[1]
        assert q.messages.paged_regular.seqs  # restored as numbers
        assert _listed(q) == [e for e in every if e[0] not in (1, 2, 4, 11, 17)]
        assert reading.bounds(q).first == 3
        check(q, random.Random(2))


def test_an_unreadable_paged_message_is_logged_and_skipped_by_browse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A paged message whose record is damaged on disk: a browse reports it and lists
    the others (the limit still filled from the messages behind it); the queue is not
    changed by the browse."""
    from tests.broker.store.test_paging import _put_offsets

    with _paging_kit(tmp_path) as kit:
        _fill_paged(kit, 20)
        q = kit.engine.channels["ch"].queues[1]
        assert _listed(q, 14, 3) == [(14, b"p14"), (15, b"p15"), (16, b"p16")]
        kit.engine.store.flush()
        path, puts = _put_offsets(tmp_path)
        victim = puts[14]  # message 15: paged
        with open(path, "r+b") as f:
            f.seek(victim.offset + victim.size - 2)
            octet = f.read(1)
            f.seek(victim.offset + victim.size - 2)
            f.write(bytes([octet[0] ^ 0x40]))
        with caplog.at_level(logging.WARNING):
            assert _listed(q, 14, 3) == [(14, b"p14"), (16, b"p16"), (17, b"p17")]
        assert "paged message 15 unreadable" in caplog.text
        assert q.message_count == 20  # a browse changes nothing
        assert reading.bounds(q).first == 1
