"""Many pause/resume cycles of an ``ack:auto`` consumer's transport while a producer
floods (slow: a stress test).  The listener's ``max_outbound`` is small, its kernel
send buffer too, and the bodies' lengths vary, so the consumer's unsent bytes cross it
hundreds of times at varying offsets: a crossing where the listener refuses deliveries
without the transport pausing (the edge ``test_outbound_edge.py`` builds to the byte)
leaves a window of them held and the consumer waiting.  Before the fix it stalled in 3
of 4 runs (after 31-146 pauses, 1000 deliveries held: ``bench_stomp``'s stall); after
it, 200-400 pauses a run and none.  Real engine thread (the TMQP server's loop), real
sockets."""

from __future__ import annotations

import random
import select
import time

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, shrink_send_buffers

pytestmark = pytest.mark.slow

COUNT = 20_000


#: The listener's bound on a connection's unsent output here (the ``small`` broker's).
OUTBOUND = 2048


@pytest.mark.parametrize("small", [OUTBOUND], indirect=True)
def test_a_consumer_paused_thousands_of_times_gets_every_message(small: Broker) -> None:
    rng = random.Random(18)
    consumer = Raw(small.listener.port, rcvbuf=4096)
    producer = Raw(small.listener.port)
    try:
        consumer.connect()
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/st\nack:auto\nreceipt:r\n\n\x00")
        assert consumer.next().header("receipt-id") == "r"
        # a small kernel send buffer on the listener's side (no autotuning): the bytes
        # wait in the transport, which pauses and resumes, not in the kernel
        shrink_send_buffers(small.listener)
        producer.connect()
        frames = [
            b"SEND\ndestination:/queue/st\n\n" + b"b" * rng.randrange(1, 300) + b"\x00"
            for _ in range(COUNT)
        ]
        for start in range(0, COUNT, 200):
            producer.sock.sendall(b"".join(frames[start : start + 200]))
        # read a piece of random size each time the listener holds deliveries back (its
        # transport full): the transport drains, pauses and resumes many times
        sock = consumer.sock
        seen = len(consumer.frames)
        last = time.monotonic()

        def holding() -> bool:
            return bool(small.door.stats()["stomp"]["held_deliveries"])

        while seen < COUNT:
            wait_until(holding, timeout=0.2, step=0.001)  # (at the end: none held)
            if not select.select([sock], [], [], 0.1)[0]:
                assert time.monotonic() - last < WAIT, (
                    f"no MESSAGE for {WAIT} s after {seen} of {COUNT}; listener figures "
                    f"{small.door.stats()['stomp']}"
                )
                continue
            chunk = sock.recv(rng.randrange(64, 4096))
            assert chunk, "the connection closed"
            seen += chunk.count(b"\x00")
            last = time.monotonic()
        assert seen == COUNT
        queue = small.engine.channels["st"].queues[QUEUE_ID]
        assert wait_until(
            lambda: queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)
        )
    finally:
        consumer.close()
        producer.close()
