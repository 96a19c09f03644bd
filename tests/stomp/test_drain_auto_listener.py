"""A backlog drained as AUTO deliveries through the real listener and engine thread: a
producer sends 20,000 SENDs to a ``/queue/`` whose ``ack:auto`` consumer stops reading
twice (its socket and the listener's hold fill, the rest waits in the queue) and
resumes; every message reaches it once, in order, and the queue ends empty with
every delivery acknowledged by taking.  While it is stopped, what is in flight to it
waits as AUTO deliveries (``Queue.auto_in_flight``), not as ``pending`` entries: the
backlog is drained the AUTO way (``Dispatcher.send_run``)."""

from __future__ import annotations

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.test_plain_write_sockets import auto_consumer
from tests.stomp.two_doors import Broker, numbered

COUNT = 20_000
#: Where the consumer stops reading (twice), then resumes.
STOPS = (1_500, 9_000)
#: The consumer's window (``Prefetch``: the engine's default, ``BrokerConfig.prefetch``).
WINDOW = 1_000


#: The listener's bound on a connection's unsent output here (the ``small`` broker's).
OUTBOUND = 8192


@pytest.mark.parametrize("small", [OUTBOUND], indirect=True)
def test_a_backlog_drained_to_a_consumer_that_stops_and_resumes(small: Broker) -> None:
    queue = "drained"
    consumer = auto_consumer(small, queue)
    producer = Raw(small.listener.port)
    try:
        producer.connect()
        head = b"SEND\ndestination:/queue/%s\n\n" % queue.encode()
        for start in range(0, COUNT, 1_000):  # (a few reads' worth at a time)
            producer.send(
                b"".join(head + numbered(i) + b"\x00" for i in range(start, start + 1_000))
            )
        queues = small.engine.channels[queue].queues
        assert wait_until(lambda: QUEUE_ID in queues)  # (made by the first SEND)
        q = queues[QUEUE_ID]
        got: list[bytes] = []
        for stop in (*STOPS, COUNT):
            while len(got) < stop:
                got.append(consumer.next().body)
            if stop == COUNT:
                break
            # stopped: the consumer's window fills with deliveries, the rest waits
            assert wait_until(lambda: q.message_count > 0 and q.auto_in_flight == WINDOW)
            assert not q.pending  # (what the drain sent waits as AUTO deliveries)
        assert got == [numbered(i) for i in range(COUNT)]
        assert wait_until(lambda: q.message_count == 0 and not q.auto_in_flight)
        assert not q.pending and not q.used
        counters = (q.received, q.sent, q.deliveries, q.acks, q.nacks)
        assert counters == (COUNT, COUNT, COUNT, COUNT, 0)
    finally:
        consumer.close()
        producer.close()


@pytest.mark.parametrize("small", [OUTBOUND], indirect=True)
def test_include_seq_on_an_auto_ack_subscription_numbers_every_delivery(small: Broker) -> None:
    """``ack:auto`` with ``include-seq``: every MESSAGE carries its queue sequence, those
    sent at once as those drained from a backlog (the stopped consumer's), in order.
    (The sequence is read from the delivery's ``pending`` entry: an AUTO delivery has
    none, so such a subscription is acknowledged by the listener, not by taking.)"""
    consumer = Raw(small.listener.port, rcvbuf=4096)
    producer = Raw(small.listener.port)
    try:
        consumer.connect()
        consumer.send(
            b"SUBSCRIBE\nid:s\ndestination:/queue/numbered\nack:auto\n"
            b"include-seq:seq\nreceipt:r\n\n\x00"
        )
        assert consumer.next().header("receipt-id") == "r"
        producer.connect()
        count = 3 * WINDOW
        head = b"SEND\ndestination:/queue/numbered\n\n"
        producer.send(b"".join(head + numbered(i) + b"\x00" for i in range(count)))
        got = [consumer.next() for _ in range(count)]
        assert [(f.body, f.header("seq")) for f in got] == [
            (numbered(i), str(i + 1)) for i in range(count)
        ]
        q = small.engine.channels["numbered"].queues[QUEUE_ID]
        assert wait_until(lambda: q.message_count == 0 and not q.pending and not q.used)
        assert q.acks == count
    finally:
        consumer.close()
        producer.close()
