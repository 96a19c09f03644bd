"""A consumer whose unsent bytes land exactly on the listener's ``max_outbound``.

The listener stops handing a connection deliveries once its unsent bytes *reach*
``max_outbound`` (``_Connection._room`` is 0) and hands it the ones it held back when the
transport calls ``resume_writing``.  asyncio pauses a transport only once its buffer is
*above* the high-water mark; with that mark at ``max_outbound`` a buffer of exactly
``max_outbound`` bytes refused every delivery without pausing the transport, so no
``resume_writing`` ever came: the connection's deliveries waited in ``held`` forever
(never reported taken, a full window in flight: the stall seen once in ``bench_stomp``'s
100k ``ack:auto`` case, docs/stomp.md "STOMP on the engine").  The engine thread is the test
(``Engineside``): the buffer is filled to the byte while the consumer does not read.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.engine_side import Engineside, RawClient, header

MAX_OUTBOUND = 64 * 1024


@pytest.fixture
def side() -> Iterator[Engineside]:
    made = Engineside(max_outbound=MAX_OUTBOUND)
    yield made
    made.stop()


def _unsent(side: Engineside, conn_id: int) -> tuple[int, bool]:
    """The consumer's transport buffer (octets) and whether the listener may write."""

    def read() -> tuple[int, bool]:
        conn = side.listener.connections[conn_id]
        assert conn.transport is not None and conn.session is not None
        return conn.transport.get_write_buffer_size() + conn.session.pending_output, conn.writable

    return side.listener.call(read)


def _send(producer: RawClient, body: bytes) -> None:
    producer.send(b"SEND\ndestination:/queue/edge\n\n" + body + b"\x00")


def test_a_buffer_filled_to_exactly_max_outbound_still_gets_the_held_deliveries(
    side: Engineside,
) -> None:
    consumer = RawClient(side, rcvbuf=4096)
    producer = RawClient(side)
    try:
        consumer.send(b"SUBSCRIBE\nid:s\ndestination:/queue/edge\nack:auto\nreceipt:r\n\n\x00")
        assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:r")

        # the MESSAGE's size for a body of n octets, from one the consumer reads
        _send(producer, b"p" * 100)
        probe = consumer.next_frame()
        queue = side.engine.channels["edge"].queues[QUEUE_ID]
        assert probe.endswith(b"\n\n" + b"p" * 100)
        message_id = header(probe, b"message-id")
        fixed = len(probe) + 1 - 100 - len(b"100") - len(message_id)

        prefix, _, first = message_id.rpartition(b"-")  # (ids s<nonce>-<conn>-<count>)

        def frame_size(n: int, sent: int) -> int:  # of the MESSAGE of SEND number sent
            return fixed + len(prefix) + 1 + len(str(int(first) + sent)) + len(str(n)) + n

        # the consumer stops reading: fill its socket, then its transport's buffer
        sent = 1
        while _unsent(side, consumer.id)[0] == 0:
            assert sent < 1000, "the kernel kept taking every byte"
            _send(producer, b"f" * 30_000)
            sent += 1
            assert side.pump(lambda n=sent: queue.acks == n)  # taken, so written
        # then to exactly MAX_OUTBOUND octets, one sized MESSAGE at a time
        for _ in range(100):
            unsent, _writable = _unsent(side, consumer.id)
            gap = MAX_OUTBOUND - unsent
            assert gap >= 0, f"{unsent} octets unsent before the exact fill"
            if gap == 0:
                break
            size = gap if gap <= 8000 else 4000
            n = size - frame_size(0, sent) + 1
            while frame_size(n, sent) > size:
                n -= 1
            assert frame_size(n, sent) == size, (gap, size, n)
            _send(producer, b"g" * n)
            sent += 1
            assert side.pump(lambda n=sent: queue.acks == n)
        assert _unsent(side, consumer.id)[0] == MAX_OUTBOUND

        # one more: the listener holds it back (no room), then must hand it once the
        # consumer reads again
        _send(producer, b"last")
        assert side.pump(lambda: bool(queue.pending or queue.auto_in_flight))  # sent to it
        # held back, and the statistics say where (broker stats: the first page)
        assert side.pump(lambda: side.door.stats()["stomp"]["held_deliveries"] == 1)
        page, _more = side.door.stats_page(None, 1 << 20)
        assert page["stomp"] == {
            "connections": 2,
            "held_deliveries": 1,
            "held_by_connection": {str(consumer.id): 1},
        }
        consumer.sock.setblocking(False)
        data = bytearray()

        def got_last() -> bool:
            side.door.run_ops(time.monotonic())
            while select.select([consumer.sock], [], [], 0)[0]:
                chunk = consumer.sock.recv(1 << 20)
                assert chunk, "the connection closed"
                data.extend(chunk)
            return data.endswith(b"\n\nlast\x00")

        assert wait_until(got_last), (
            f"read {len(data)} octets, ending {bytes(data[-60:])!r}; unsent and writable "
            f"{_unsent(side, consumer.id)}; in flight {queue.pending}"
        )
        assert data.count(b"\x00") == sent  # every MESSAGE after the probe, once
        assert side.pump(lambda: not (queue.pending or queue.auto_in_flight))  # all taken
        assert side.door.stats()["stomp"]["held_deliveries"] == 0
    finally:
        consumer.close()
        producer.close()
