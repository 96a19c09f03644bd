"""The adversary's review: a producer that writes 100,000 SENDs and reads nothing (session
21, adv21), its RECEIPTs piling up -- one on every SEND (receipt-led runs) or one after
each streak of same-head SENDs (bodies21's ``SendStreak``).

The listener stops reading it once its unsent bytes reach ``max_outbound``: what it
holds for the connection (its transport's buffer and its session's output) stays within
``max_outbound`` plus one window of answers (``max_unanswered_sends`` RECEIPTs) and the
answers of one read (256 KiB of SENDs); the rest waits in the kernel (the producer's
writes block), while another client is served.  Once the producer reads, every RECEIPT
comes, in order, and every SEND was taken once.  (``test_producer_never_reads.py`` is
the 10k-SEND twin with huge receipt ids, watched for a while; this one samples at every
turn until the producer is stalled with its backlog in the kernel.)"""

from __future__ import annotations

import array
import fcntl
import termios
import threading
from collections.abc import Iterator

import pytest
import zmq

from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import Command
from broker.stomp.server import ListenerOptions
from broker.stomp.session import SessionConfig
from tests.polling import WAIT, wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import FAST, Broker, shrink_send_buffers

SENDS = 100_000
MAX_OUTBOUND = 64 * 1024
CHUNK = 500  # SENDs per write
READ = 256 * 1024  # what asyncio's transport reads at most per call
RECEIPT_ID = 40  # octets of each receipt id: the answers far beyond the bound


@pytest.fixture
def small(zctx: zmq.Context[zmq.Socket[bytes]]) -> Iterator[Broker]:
    made = Broker(zctx, options=ListenerOptions(port=0, session=FAST, max_outbound=MAX_OUTBOUND))
    yield made
    made.stop()


def _receipt(i: int) -> str:
    return f"r{i:08d}".ljust(RECEIPT_ID, "x")


def _send(i: int, every: int) -> bytes:
    """SEND ``i``; every ``every``-th asks for a receipt (the others share one head)."""
    receipt = f"receipt:{_receipt(i)}\n" if i % every == every - 1 else ""
    return f"SEND\ndestination:/queue/stalled\n{receipt}\nm{i:06d}\x00".encode()


def _kernel_unread(b: Broker) -> int:
    """Bytes waiting in the kernel for the listener to read, over its connections."""

    def look() -> int:
        total = 0
        for conn in b.listener.connections.values():
            if conn.transport is not None:
                fd = conn.transport.get_extra_info("socket").fileno()
                count = array.array("i", [0])
                fcntl.ioctl(fd, termios.FIONREAD, count, True)
                total += count[0]
        return total

    return b.listener.call(look)


def _unsent(b: Broker) -> int:
    """What the listener holds to write, over its connections (transport and session)."""

    def look() -> int:
        return sum(
            conn.transport.get_write_buffer_size() + conn.session.pending_output
            for conn in b.listener.connections.values()
            if conn.transport is not None and conn.session is not None
        )

    return b.listener.call(look)


def _shrink(b: Broker, raw: Raw) -> None:
    """The server's socket of ``raw`` sends with a small buffer: what the client does not
    read waits in the listener, not in the kernel (which would take megabytes)."""
    ours = raw.sock.getsockname()
    shrink_send_buffers(
        b.listener, lambda _, conn: conn.transport.get_extra_info("peername") == ours
    )


def _reading(b: Broker, raw: Raw) -> bool:
    """Does the listener read ``raw``'s connection (its transport not paused)?"""
    ours = raw.sock.getsockname()

    def look() -> bool:
        for conn in b.listener.connections.values():
            transport = conn.transport
            if transport is not None and transport.get_extra_info("peername") == ours:
                return transport.is_reading()
        return False

    return b.listener.call(look)


def _taken(b: Broker) -> int:
    """Messages the engine holds in ``stalled`` (read on its thread)."""
    box: list[int] = []

    def op(now: float) -> list[object]:
        channel = b.engine.channels.get("stalled")
        queue = channel.queues.get(QUEUE_ID) if channel is not None else None
        box.append(queue.message_count if queue is not None else 0)
        return []

    b.door.submit(op)  # type: ignore[arg-type]
    assert wait_until(lambda: bool(box))
    return box[0]


@pytest.mark.slow
@pytest.mark.parametrize("every", [1, 10], ids=["receipt-each", "receipt-per-streak"])
def test_a_producer_of_100k_sends_that_never_reads_is_bounded_and_served_in_order(
    small: Broker, every: int
) -> None:
    session: SessionConfig = small.listener.options.session
    receipt_frame = len(f"RECEIPT\nreceipt-id:{_receipt(0)}\n\n\x00")
    smallest_send = len(_send(0, SENDS + 1))
    bound = (  # (every ``every``-th SEND is answered with a RECEIPT)
        MAX_OUTBOUND
        + (session.max_unanswered_sends // every + 1) * receipt_frame  # a window's answers
        + (READ // smallest_send // every + 1) * receipt_frame  # the answers of one read
    )
    answers = SENDS // every * receipt_frame
    assert bound * 2 < answers, "the test could not tell bounded from not"
    producer = Raw(small.listener.port, rcvbuf=4096)
    producer.sock.settimeout(None)  # its writes block for as long as the broker stalls it
    producer.connect()
    _shrink(small, producer)
    written: list[int] = []

    def write_all() -> None:
        try:
            for start in range(0, SENDS, CHUNK):
                producer.sock.sendall(
                    b"".join(_send(i, every) for i in range(start, start + CHUNK))
                )
                written.append(start + CHUNK)
        except OSError:
            pass  # closed by the test

    writer = threading.Thread(target=write_all)
    writer.start()
    peak = 0

    def stalled() -> bool:
        """Sampled at every poll (the most the listener held for it yet); True once the
        listener holds RECEIPTs for it and stopped reading it."""
        nonlocal peak
        unsent = _unsent(small)
        peak = max(peak, unsent)
        return unsent >= MAX_OUTBOUND // 2 and not _reading(small, producer)

    try:
        assert wait_until(stalled, timeout=WAIT * 6)
        for _ in range(50):  # (and a while longer: the window's answers still come)
            stalled()
        assert peak <= bound, f"{peak} unsent bytes for a client that reads nothing"
        assert _kernel_unread(small) > 0  # (its SENDs wait in the kernel, unread)
        assert _taken(small) < SENDS
        bystander = Raw(small.listener.port)  # the others are served meanwhile
        try:
            bystander.connect()
            bystander.send(b"SEND\ndestination:/queue/calm\nreceipt:calm\n\nok\x00")
            assert bystander.next().header("receipt-id") == "calm"
        finally:
            bystander.close()
        producer.sock.settimeout(WAIT * 6)
        for i in range(every - 1, SENDS, every):  # it reads at last: every RECEIPT, in order
            frame = producer.next()
            assert (frame.command, frame.header("receipt-id")) == (Command.RECEIPT, _receipt(i))
    finally:
        producer.close()
        writer.join(WAIT)
    queue = small.engine.channels["stalled"].queues[QUEUE_ID]
    assert wait_until(lambda: queue.message_count == SENDS)  # each taken once
