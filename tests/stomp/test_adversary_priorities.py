"""The adversary's review (session 22, adv22): high-priority TMQP pushes into a STOMP
queue whose ``ack:auto`` consumer has stopped reading with its window full of AUTO
deliveries (``Dispatcher.send_run``'s) and a backlog waiting behind them.  The
priority messages must overtake the waiting backlog -- each delivered no later than
after the window in flight when it came in -- and nothing may be lost or repeated.  One
engine behind both doors (``tests.stomp.two_doors``), real sockets on loopback."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from broker.client.blocking import Client
from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.server import ListenerOptions
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import FAST, Broker, Ctx

QUEUE = "prio"
COUNT = 3_000
BODY = 100
STOP = 500  # where the consumer stops reading
WINDOW = 1_000  # the consumer's window (the engine's default prefetch)
PRIORITY = 5


@pytest.fixture
def small(zctx: Ctx) -> Iterator[Broker]:
    made = Broker(zctx, options=ListenerOptions(port=0, session=FAST, max_outbound=8192))
    yield made
    made.stop()


def _body(i: int) -> bytes:
    return b"%06d" % i + b"." * (BODY - 6)


def test_priority_pushes_overtake_a_backlog_drained_as_auto(small: Broker, zctx: Ctx) -> None:
    consumer = Raw(small.listener.port, rcvbuf=4096)
    producer = Raw(small.listener.port)
    admin = Client(small.endpoint, context=zctx, timeout=10.0).connect()
    try:
        consumer.connect()
        consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\n\n\x00".encode())

        def shrink() -> None:
            for conn in small.listener.connections.values():
                assert conn.transport is not None
                conn.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096
                )

        small.listener.call(shrink)
        producer.connect()
        head = f"SEND\ndestination:/queue/{QUEUE}\n\n".encode()
        producer.send(b"".join(head + _body(i) + b"\x00" for i in range(COUNT)))
        got = [bytes(consumer.next().body) for _ in range(STOP)]
        queues = small.engine.channels[QUEUE].queues
        q = queues[QUEUE_ID]
        # stopped: the window full of AUTO deliveries, the rest waiting
        assert wait_until(lambda: q.received == COUNT and q.auto_in_flight == WINDOW)
        for i in range(PRIORITY):
            admin.push(QUEUE, 0, b"priority-%d" % i, high_priority=True)
        assert wait_until(lambda: q.received == COUNT + PRIORITY)
        # taken by then (the consumer's socket may still take a little meanwhile: at
        # least what was taken when each priority message came in)
        taken = q.acks
        assert q.message_count > PRIORITY  # (a backlog still waits behind them)
        while len(got) < COUNT + PRIORITY:
            got.append(bytes(consumer.next().body))
    finally:
        admin.close()
        consumer.close()
        producer.close()
    positions = [got.index(b"priority-%d" % i) for i in range(PRIORITY)]
    # each one overtook the backlog: no later than after the window in flight when it
    # came in, and the priority messages before it
    assert all(p <= taken + WINDOW + i for i, p in enumerate(positions)), (taken, positions)
    assert positions == sorted(positions)
    rest = [b for b in got if not b.startswith(b"priority-")]
    assert rest == [_body(i) for i in range(COUNT)]
    assert wait_until(lambda: q.message_count == 0 and not q.auto_in_flight and not q.pending)
