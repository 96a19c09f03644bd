"""The adversary's review: SEND streaks and AUTO runs while other clients share the queue
(session 21, adv21), a real listener, TMQP server and engine over loopback sockets.

* a TMQP consumer (acknowledging each) and a STOMP ``ack:auto`` consumer on one queue
  while a producer's streaks flow, a TMQP browse in the middle: round robin gives each
  message to one of them, once, each in order; the browse lists held messages in
  sequence order and takes none;
* two producers interleaving their streaks (different heads) to one queue: each
  producer's SENDs reach the consumer in its order, every one once.
"""

from __future__ import annotations

import select
from collections.abc import Callable

from broker.client.blocking import Client
from broker.stomp.frames import Command
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker

COUNT = 3000
CHUNK = 300  # SENDs per write: a streak (and a run) each


def _body(tag: bytes, i: int) -> bytes:
    return tag + b"%06d" % i + b"." * 40


def _raw(b: Broker, made: list[Raw]) -> Raw:
    raw = Raw(b.listener.port)
    made.append(raw)
    raw.connect()
    return raw


def _ready(raw: Raw) -> bool:
    """A frame is parsed or bytes wait on the socket (no waiting)."""
    return bool(raw.frames) or bool(select.select([raw.sock], [], [], 0)[0])


def test_a_tmqp_and_a_stomp_consumer_share_the_runs_once_each_and_a_browse_takes_none(
    broker: Broker, tmqp: Callable[[], Client]
) -> None:
    made: list[Raw] = []
    try:
        stomp_consumer = _raw(broker, made)
        stomp_consumer.send(
            b"SUBSCRIBE\nid:s\ndestination:/queue/mix\nack:auto\nreceipt:s\n\n\x00"
        )
        assert stomp_consumer.next().header("receipt-id") == "s"
        tmqp_consumer = tmqp()
        tmqp_consumer.join("mix")
        browser = tmqp()
        producer = _raw(broker, made)
        got_stomp: list[int] = []
        got_tmqp: list[int] = []

        def take() -> bool:
            """Read what is there on both consumers; True once all came."""
            while _ready(stomp_consumer):
                frame = stomp_consumer.next()
                assert frame.command is Command.MESSAGE, frame
                got_stomp.append(int(frame.body[1:7]))
            while (m := tmqp_consumer.receive(timeout=0)) is not None:
                got_tmqp.append(int(bytes(m.payload)[1:7]))
                tmqp_consumer.ack(m)
            return len(got_stomp) + len(got_tmqp) >= COUNT

        browsed = []
        for start in range(0, COUNT, CHUNK):
            producer.send(
                b"".join(
                    b"SEND\ndestination:/queue/mix\n\n%s\x00" % _body(b"m", i)
                    for i in range(start, start + CHUNK)
                )
            )
            take()
            if start == COUNT // 2:  # mid-run (some delivered): what the queue holds now
                assert wait_until(lambda: take() or bool(got_stomp or got_tmqp))
                browsed = browser.browse("mix", 0, 0, limit=COUNT)
        assert wait_until(take, WAIT)
    finally:
        for raw in made:
            raw.close()
    assert got_stomp == sorted(set(got_stomp))  # each in order, once
    assert got_tmqp == sorted(set(got_tmqp))
    assert not set(got_stomp) & set(got_tmqp)  # one consumer each
    assert sorted(got_stomp + got_tmqp) == list(range(COUNT))
    assert got_stomp and got_tmqp  # round robin: both took turns
    sequences = [b.sequence for b in browsed]
    assert sequences == sorted(set(sequences))
    numbers = [int(bytes(b.message.payload)[1:7]) for b in browsed]
    assert numbers == sorted(set(numbers))  # (sequence order is send order here)


def test_two_producers_interleaving_streaks_keep_each_ones_order(broker: Broker) -> None:
    made: list[Raw] = []
    try:
        consumer = _raw(broker, made)
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/two\nack:auto\nreceipt:s\n\n\x00")
        assert consumer.next().header("receipt-id") == "s"
        one, two = _raw(broker, made), _raw(broker, made)
        heads = {
            one: b"SEND\ndestination:/queue/two\n\n",
            two: b"SEND\ndestination:/queue/two\nfrom:two\ncontent-length:47\n\n",
        }
        tags = {one: b"a", two: b"b"}
        half = COUNT // 2
        step = 50
        for start in range(0, half, step):
            for producer in (one, two):
                producer.send(
                    b"".join(
                        heads[producer] + _body(tags[producer], i) + b"\x00"
                        for i in range(start, start + step)
                    )
                )
        for producer in (one, two):  # the end of each: a receipt after its last SEND
            producer.send(b"SEND\ndestination:/queue/two\nreceipt:end\n\nend\x00")
            assert producer.next().header("receipt-id") == "end"
        bodies = [consumer.next().body for _ in range(COUNT + 2)]
    finally:
        for raw in made:
            raw.close()
    assert bodies.count(b"end") == 2
    for tag in (b"a", b"b"):
        numbers = [int(body[1:7]) for body in bodies if body[:1] == tag]
        assert numbers == list(range(half)), tag  # its order, every one once
