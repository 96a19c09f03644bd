"""Issue 11, hostile: a producer that pipelines SENDs asking for receipts and never reads
its socket.  Its RECEIPTs pile up on the broker's side; the broker must stop reading
that connection (not take its SENDs and buffer their answers without end): the unsent
bytes stay within the listener's ``max_outbound`` plus one window of answers and one
read, while everyone else is served.  Once the producer reads, every RECEIPT comes, in
order, and every SEND was taken once.  Real engine, server and listener, real sockets
(the consumer-side twins: ``test_listener.py::test_client_that_never_reads_is_bounded``,
``test_runs_engine.py::test_a_consumer_that_stops_reading...``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import Command
from broker.stomp.session import SessionConfig
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx

SENDS = 10_000
#: receipt ids this long make the answers ~20 MB: far beyond the socket buffers
RECEIPT_ID = 2_000
CHUNK = 50  # SENDs per write
#: seconds the broker is watched once the producer's unsent bytes reached half the
#: bound: time to take every SEND were it to read on (a slow machine only watches less)
WATCH = 3.0


@pytest.fixture
def broker(zctx: Ctx) -> Iterator[Broker]:
    b = Broker(zctx)
    yield b
    b.stop()


def _receipt(i: int) -> str:
    return f"r{i:08d}".ljust(RECEIPT_ID, "x")


def _send(i: int) -> bytes:
    return f"SEND\ndestination:/queue/stalled\nreceipt:{_receipt(i)}\n\nm{i}\x00".encode()


def _sender(raw: Raw, done: list[int]) -> None:
    """Write every SEND (blocks while the broker reads none); ``done``: SENDs written."""
    frames = [_send(i) for i in range(SENDS)]
    try:
        for start in range(0, SENDS, CHUNK):
            raw.sock.sendall(b"".join(frames[start : start + CHUNK]))
            done.append(start + CHUNK)
    except OSError:
        pass  # closed by the test


def test_a_producer_that_never_reads_its_receipts_is_bounded(broker: Broker) -> None:
    listener = broker.listener
    session: SessionConfig = listener.options.session
    receipt_frame = len(f"RECEIPT\nreceipt-id:{_receipt(0)}\n\n\x00")
    bound = (
        listener.options.max_outbound
        + session.max_unanswered_sends * receipt_frame  # one window of answers
        + (1 << 18) // len(_send(0)) * receipt_frame  # the answers of one read (256 KiB)
    )
    assert bound < SENDS * receipt_frame // 4, "the test could not tell bounded from not"
    producer = Raw(listener.port, rcvbuf=4096)
    producer.sock.settimeout(None)  # the sender blocks for as long as the broker stalls it
    producer.connect()
    done: list[int] = []
    sender = threading.Thread(target=_sender, args=(producer, done))
    sender.start()

    def unsent() -> int:
        return sum(listener.call(listener.outbound_bytes).values())

    try:
        assert wait_until(lambda: unsent() >= bound // 4, timeout=WAIT * 6)
        peak, until = 0, time.monotonic() + WATCH
        while time.monotonic() < until:
            peak = max(peak, unsent())
        assert peak <= bound, f"{peak} unsent bytes for a client that reads nothing"
        assert not done or done[-1] < SENDS, "the broker took every SEND of a stalled client"
        bystander = Raw(listener.port)  # the listener serves the others meanwhile
        try:
            bystander.connect()
            bystander.send(b"SEND\ndestination:/queue/calm\nreceipt:calm\n\nok\x00")
            assert bystander.next().header("receipt-id") == "calm"
        finally:
            bystander.close()
        producer.sock.settimeout(WAIT * 6)
        for i in range(SENDS):  # it reads at last: every RECEIPT, in order
            frame = producer.next()
            assert frame.command is Command.RECEIPT and frame.header("receipt-id") == _receipt(i)
    finally:
        producer.close()
        sender.join(WAIT)
    queue = broker.engine.channels["stalled"].queues[QUEUE_ID]
    assert wait_until(lambda: queue.message_count == SENDS)  # each taken once
