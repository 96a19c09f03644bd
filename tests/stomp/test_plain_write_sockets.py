"""The listener's write side under consumers that misbehave, real sockets and the real
engine thread: a consumer that stops reading while runs of plain ``ack:auto`` MESSAGEs
are written to it (the unsent bytes stay bounded by ``max_outbound`` plus one frame,
the rest is held and comes in order once it reads again), and one that resets its
connection while the listener holds a full transport for it (the listener goes on, the
deliveries it held go to the next consumer, in order)."""

from __future__ import annotations

import logging
import socket
import struct

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import SMALL_OUTBOUND, Broker, numbered, shrink_send_buffers

MAX_OUTBOUND = SMALL_OUTBOUND
COUNT = 3000
BODY = 100


def _sends(queue: str) -> bytes:
    return b"".join(
        b"SEND\ndestination:/queue/%s\n\n%s\x00" % (queue.encode(), numbered(i))
        for i in range(COUNT)
    )


def auto_consumer(small: Broker, queue: str) -> Raw:
    """A consumer of ``/queue/QUEUE`` (``ack:auto``) with small socket buffers on both
    ends: what it does not read waits in the listener, not in the kernel."""
    consumer = Raw(small.listener.port, rcvbuf=4096)
    consumer.connect()
    consumer.send(
        b"SUBSCRIBE\nid:s\ndestination:/queue/%s\nack:auto\nreceipt:r\n\n\x00" % queue.encode()
    )
    assert consumer.next().header("receipt-id") == "r"
    shrink_send_buffers(small.listener)
    return consumer


def _most_unsent(small: Broker) -> int:
    """The most unsent bytes of a connection: its transport's and its session's."""

    def look() -> int:
        return max(
            conn.transport.get_write_buffer_size() + conn.session.pending_output
            for conn in small.listener.connections.values()
            if conn.transport is not None and conn.session is not None
        )

    return small.listener.call(look)


def _drained(small: Broker, queue: str) -> bool:
    q = small.engine.channels[queue].queues[QUEUE_ID]
    return q.message_count == 0 and not (q.pending or q.auto_in_flight)


def test_a_consumer_that_stops_reading_stays_bounded_and_gets_the_rest_in_order(
    small: Broker,
) -> None:
    consumer = auto_consumer(small, "stop")
    producer = Raw(small.listener.port)
    try:
        producer.connect()
        producer.send(_sends("stop"))
        assert wait_until(lambda: small.held_deliveries() > 0)  # (its transport is full)
        frame = BODY + 100  # (a MESSAGE's head is well under 100 bytes)
        assert _most_unsent(small) < MAX_OUTBOUND + frame
        bodies = [consumer.next().body for _ in range(COUNT)]
        assert bodies == [numbered(i) for i in range(COUNT)]
        assert wait_until(lambda: _drained(small, "stop"))
    finally:
        consumer.close()
        producer.close()


def test_a_consumer_reset_while_its_transport_is_full_leaves_the_rest_to_the_next(
    small: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="broker.stomp")
    gone = auto_consumer(small, "cut")
    producer = Raw(small.listener.port)
    try:
        producer.connect()
        producer.send(_sends("cut"))
        assert wait_until(lambda: small.held_deliveries() > 0)
        # a reset (no FIN): the listener learns it on its next write or read
        gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()
        assert wait_until(lambda: len(small.listener.connections) == 1)  # (the producer)
        assert wait_until(lambda: small.held_deliveries() == 0)  # (handed back to the engine)
        follower = Raw(small.listener.port)
        try:
            follower.connect()
            follower.send(b"SUBSCRIBE\nid:f\ndestination:/queue/cut\nack:auto\n\n\x00")
            got = []
            while not got or got[-1] != numbered(COUNT - 1):
                got.append(follower.next().body)
            numbers = [int(body[:6]) for body in got]
            assert numbers == sorted(set(numbers))  # (in order, each once)
            assert len(numbers) < COUNT  # (the reset one took some)
            assert wait_until(lambda: _drained(small, "cut"))
        finally:
            follower.close()
    finally:
        producer.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
