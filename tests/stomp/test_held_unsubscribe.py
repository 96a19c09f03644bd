"""A subscription removed while the listener holds deliveries for it (adversary tests).

A consumer stops reading: its connection fills (``max_outbound``), the listener takes no
more of its deliveries and keeps the ones the engine handed over in ``held`` (each still in
flight on the engine, docs/stomp.md "Held deliveries").  Then the subscription goes: an
UNSUBSCRIBE (read only once the consumer reads again: reading pauses with writing), one of
two subscriptions of that connection, a DISCONNECT, or the socket reset.  What must hold:

- nothing of the removed subscription reaches the socket after the RECEIPT of the
  UNSUBSCRIBE (or DISCONNECT);
- every delivery the consumer did not take comes back to the queue: with ``client`` /
  ``client-individual`` every one not acknowledged (the ones read too: at least once);
  with ``ack:auto`` a delivery is taken (and acknowledged) when the listener hands it to
  the connection's output -- what was held, never written, is not lost;
- another consumer then gets them, in order, each once;
- the connection that unsubscribed reads on and stays healthy.

The engine thread is the test (``Engineside``): deliveries move only while it pumps.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from broker.engine.queue.queue import Queue
from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.engine_side import Engineside, RawClient, header
from tests.stomp.two_doors import shrink_send_buffers

MAX_OUTBOUND = 16 * 1024
BODY = 2000  # octets of each message: several fill the connection
COUNT = 60  # messages sent: more than the connection and the kernel hold


@pytest.fixture
def side() -> Iterator[Engineside]:
    made = Engineside(max_outbound=MAX_OUTBOUND)
    yield made
    made.stop()


def _body(queue: str, i: int) -> bytes:
    return f"{queue}-{i:04d}-".encode().ljust(BODY, b".")


def _send_all(producer: RawClient, queue: str) -> list[bytes]:
    bodies = [_body(queue, i) for i in range(COUNT)]
    for i, body in enumerate(bodies):
        receipt = f"receipt:sent-{queue}\n".encode() if i == COUNT - 1 else b""
        producer.send(
            f"SEND\ndestination:/queue/{queue}\n".encode() + receipt + b"\n" + body + b"\x00"
        )
    assert producer.next_frame().startswith(f"RECEIPT\nreceipt-id:sent-{queue}".encode())
    return bodies


def _subscribe(client: RawClient, sub: str, queue: str, ack: str) -> None:
    client.send(
        f"SUBSCRIBE\nid:{sub}\ndestination:/queue/{queue}\nack:{ack}\nreceipt:sub-{sub}\n\n\x00".encode()
    )
    assert client.next_frame().startswith(f"RECEIPT\nreceipt-id:sub-{sub}".encode())


def _small_consumer(side: Engineside) -> RawClient:
    """A client whose socket holds little: a 4 KiB receive buffer, and the listener's end
    of it a 4 KiB send buffer (so a few messages fill the kernel, then the listener)."""
    client = RawClient(side, rcvbuf=4096)
    shrink_send_buffers(side.listener, lambda cid, _: cid == client.id)
    return client


def _held(side: Engineside) -> int:
    figures = side.door.stats()["stomp"]
    assert isinstance(figures, dict)
    return int(figures["held_deliveries"])


def _fill_until_held(side: Engineside, count: int = 1) -> None:
    """Run the engine until the listener holds ``count`` deliveries or more (the consumer
    reads nothing meanwhile)."""
    assert side.pump(lambda: _held(side) >= count), f"held {_held(side)}"


def _frame_in(side: Engineside, client: RawClient, frame: bytes, how: str) -> None:
    """``client`` sends ``frame``.  ``socket``: through its socket, where the listener reads
    it once the connection has room again (reading pauses while writing does, and
    ``flush`` hands held deliveries over until the transport pauses: by then none is
    held).  ``read-while-held``: the listener reads it now, while it holds deliveries
    (its read callback called on its loop thread): the state a transport that reads
    while deliveries are held would make (not seen over TCP or TLS in 90 racing runs,
    docs/stomp.md), which the backend must handle all the same."""
    if how == "socket":
        client.send(frame)
        return
    assert _held(side) > 0

    def read() -> None:
        side.listener.connections[client.id].data_received(frame)

    side.listener.call(read)


class Reader:
    """Reads a raw client's socket without blocking, the engine thread run meanwhile."""

    def __init__(self, side: Engineside, client: RawClient) -> None:
        self.side = side
        self.client = client
        self.data = bytearray(client.buffer)
        self.closed = False
        client.buffer = b""
        client.sock.setblocking(False)

    def read_until(self, marker: bytes) -> bool:
        def step() -> bool:
            self.side.door.run_ops(time.monotonic())
            self._drain()
            return marker in self.data

        return wait_until(step)

    def _drain(self) -> None:
        sock = self.client.sock
        while not self.closed and select.select([sock], [], [], 0)[0]:
            chunk = sock.recv(1 << 20)
            self.closed = not chunk
            self.data.extend(chunk)

    def settle_and_drain(self) -> None:
        """The engine and the listener run until the engine has nothing more for anyone
        (no operation left), then whatever reached the socket is read."""
        for _ in range(20):
            self.side.door.run_ops(time.monotonic())
            self.side.listener.call(lambda: None)  # (one turn of the listener's loop)
            self._drain()

    def frames(self) -> list[bytes]:
        return [f.lstrip(b"\n") for f in bytes(self.data).split(b"\x00") if f.strip(b"\n")]


def _messages(frames: list[bytes]) -> list[bytes]:
    return [f.split(b"\n\n", 1)[1] for f in frames if f.startswith(b"MESSAGE\n")]


def _collect(side: Engineside, client: RawClient, want: int, ack: bool) -> list[bytes]:
    """``want`` MESSAGE bodies read by ``client`` (acknowledged one by one if ``ack``)."""
    bodies: list[bytes] = []
    while len(bodies) < want:
        frame = client.next_frame()
        assert frame.startswith(b"MESSAGE\n"), frame[:200]
        bodies.append(frame.split(b"\n\n", 1)[1])
        if ack:
            client.send(b"ACK\nid:" + header(frame, b"ack") + b"\n\n\x00")
    return bodies


def _nothing_more(side: Engineside, client: RawClient) -> None:
    """No MESSAGE waits for ``client`` (a receipted frame answered, nothing before it)."""
    client.send(b"BEGIN\ntransaction:probe\nreceipt:probe\n\n\x00")
    frame = client.next_frame()
    assert frame.startswith(b"RECEIPT\nreceipt-id:probe"), frame[:200]
    client.send(b"ABORT\ntransaction:probe\n\n\x00")


def _names(bodies: list[bytes]) -> list[str]:
    """The bodies' names (``queue-number``), for a readable assertion."""
    return [b.split(b"-.", 1)[0].rstrip(b"-").decode() for b in bodies]


def _queue(side: Engineside, name: str) -> Queue:
    return side.engine.channels[name].queues[QUEUE_ID]


def _idle(queue: Queue) -> bool:
    """Nothing of the queue in flight on the engine (tracked or AUTO, ``flow.AUTO``)."""
    return not (queue.pending or queue.auto_in_flight)


HOW = ["socket", "read-while-held"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("ack", ["client", "client-individual", "auto"])
def test_unsubscribe_with_held_deliveries_returns_them_all_in_order(
    side: Engineside, ack: str, how: str
) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "held", ack)
        bodies = _send_all(producer, "held")
        _fill_until_held(side)
        # it unsubscribes while full (the listener reads it once it reads again)
        _frame_in(side, consumer, b"UNSUBSCRIBE\nid:s\nreceipt:gone\n\n\x00", how)
        reader = Reader(side, consumer)
        assert reader.read_until(b"receipt-id:gone"), bytes(reader.data[-200:])
        reader.settle_and_drain()
        frames = reader.frames()
        at = next(i for i, f in enumerate(frames) if f.startswith(b"RECEIPT\nreceipt-id:gone"))
        assert all(not f.startswith(b"MESSAGE\n") for f in frames[at + 1 :]), (
            "a MESSAGE after the RECEIPT"
        )
        read = _messages(frames[:at])
        assert read == bodies[: len(read)]  # what it read came in order
        queue = _queue(side, "held")
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        # another consumer gets the rest: all of them unless ack:auto took some
        expected = bodies[len(read) :] if ack == "auto" else bodies
        _subscribe(other, "o", "held", "client-individual")
        got = _names(_collect(side, other, len(expected), ack=True))
        assert got == _names(expected), " ".join(got)
        _nothing_more(side, other)
        # the consumer that left is healthy: it subscribes again and gets a new one
        consumer.sock.setblocking(True)
        consumer.buffer = b""
        _subscribe(consumer, "again", "held", "auto")
        producer.send(b"SEND\ndestination:/queue/held\n\nafter\x00")
        other.close()  # (so the new message can only go to the consumer)
        assert _names(_collect(side, consumer, 1, ack=False)) == _names([b"after"])
    finally:
        consumer.close()
        producer.close()
        other.close()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("ack", ["client-individual", "auto"])
def test_unsubscribing_one_of_two_full_subscriptions_spares_the_other(
    side: Engineside, ack: str, how: str
) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "a", "qa", ack)
        _subscribe(consumer, "b", "qb", ack)
        # interleaved: both subscriptions have deliveries in flight and held
        bodies_a = [_body("qa", i) for i in range(COUNT)]
        bodies_b = [_body("qb", i) for i in range(COUNT)]
        for body_a, body_b in zip(bodies_a, bodies_b, strict=True):
            producer.send(b"SEND\ndestination:/queue/qa\n\n" + body_a + b"\x00")
            producer.send(b"SEND\ndestination:/queue/qb\n\n" + body_b + b"\x00")
        producer.send(b"BEGIN\ntransaction:t\nreceipt:sent\n\n\x00")
        assert producer.next_frame().startswith(b"RECEIPT\nreceipt-id:sent")
        _fill_until_held(side, 2)
        _frame_in(side, consumer, b"UNSUBSCRIBE\nid:a\nreceipt:gone\n\n\x00", how)
        reader = Reader(side, consumer)
        assert reader.read_until(b"receipt-id:gone")
        # b goes on: every one of its messages arrives, in order, each once
        prefix = b"qb-%04d-" % (COUNT - 1)

        def read_b() -> bool:
            reader.settle_and_drain()
            return prefix in reader.data

        assert wait_until(read_b)
        reader.settle_and_drain()
        frames = reader.frames()
        at = next(i for i, f in enumerate(frames) if f.startswith(b"RECEIPT\nreceipt-id:gone"))
        assert all(b"subscription:a\n" not in f for f in frames[at + 1 :]), (
            "a MESSAGE of a after the RECEIPT"
        )
        read_a = [m for m in _messages(frames[:at]) if m.startswith(b"qa-")]
        assert read_a == bodies_a[: len(read_a)]
        got_b = [m for m in _messages(frames) if m.startswith(b"qb-")]
        assert got_b == bodies_b
        assert side.pump(lambda: _idle(_queue(side, "qa")) and _held(side) == 0)
        expected = bodies_a[len(read_a) :] if ack == "auto" else bodies_a
        _subscribe(other, "o", "qa", "client-individual")
        got = _names(_collect(side, other, len(expected), ack=True))
        # every one, each once; in order unless held behind b's (left: docs/stomp.md,
        # "Held deliveries of a subscription that goes": those come back when the
        # connection has room, each put back ahead of the ones returned before)
        assert sorted(got) == _names(expected), " ".join(got)
        if how == "socket":
            assert got == _names(expected), " ".join(got)
        _nothing_more(side, other)
    finally:
        consumer.close()
        producer.close()
        other.close()


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("ack", ["client-individual", "auto"])
def test_disconnect_with_held_deliveries_returns_them(
    side: Engineside, ack: str, how: str
) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "bye", ack)
        bodies = _send_all(producer, "bye")
        _fill_until_held(side)
        _frame_in(side, consumer, b"DISCONNECT\nreceipt:bye\n\n\x00", how)
        reader = Reader(side, consumer)
        assert reader.read_until(b"receipt-id:bye")
        reader.settle_and_drain()
        frames = reader.frames()
        assert frames[-1].startswith(b"RECEIPT\nreceipt-id:bye"), "a frame after the RECEIPT"
        read = _messages(frames)
        assert read == bodies[: len(read)]
        queue = _queue(side, "bye")
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        expected = bodies[len(read) :] if ack == "auto" else bodies
        _subscribe(other, "o", "bye", "client-individual")
        got = _names(_collect(side, other, len(expected), ack=True))
        assert got == _names(expected), " ".join(got)
        _nothing_more(side, other)
    finally:
        consumer.close()
        producer.close()
        other.close()


@pytest.mark.parametrize("ack", ["client-individual", "auto"])
def test_a_reset_with_held_deliveries_loses_nothing_not_taken(side: Engineside, ack: str) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "reset", ack)
        bodies = _send_all(producer, "reset")
        _fill_until_held(side)
        queue = _queue(side, "reset")
        # the consumer vanishes: a reset (SO_LINGER 0), nothing read
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        consumer.close()
        assert side.pump(lambda: side.session_state(consumer.id) is None)
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        # ack:auto: the ones handed to the connection's output were taken (acknowledged);
        # every one after them comes back.  Client modes: every one comes back.
        taken = queue.acks if ack == "auto" else 0
        _subscribe(other, "o", "reset", "client-individual")
        assert _names(_collect(side, other, COUNT - taken, ack=True)) == _names(bodies[taken:])
        _nothing_more(side, other)
    finally:
        consumer.close()
        producer.close()
        other.close()


@pytest.mark.parametrize("ack", ["client-individual", "auto"])
def test_held_deliveries_of_a_gone_subscription_return_though_the_reader_stopped(
    side: Engineside, ack: str
) -> None:
    """The consumer unsubscribes and never reads again: its connection never has room,
    so the deliveries held for the subscription must not wait for it (they went back only
    on the next hand-over before session 19: for ever in flight here)."""
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "stuck", ack)
        bodies = _send_all(producer, "stuck")
        _fill_until_held(side)
        queue = _queue(side, "stuck")
        _frame_in(side, consumer, b"UNSUBSCRIBE\nid:s\nreceipt:gone\n\n\x00", "read-while-held")
        assert side.pump(lambda: _held(side) == 0 and _idle(queue)), (
            f"held {_held(side)}, in flight {len(queue.pending)}"
        )
        # auto: the ones handed to its output, acknowledged by taking; counted once the
        # engine is idle, not when the listener first held one: it holds the rest of a
        # hand-over before it reports the taken part (its settle leaves with the
        # listener's next loop turn), so a count read then could miss some
        taken = queue.acks if ack == "auto" else 0
        _subscribe(other, "o", "stuck", "client-individual")
        got = _names(_collect(side, other, COUNT - taken, ack=True))
        assert got == _names(bodies[taken:]), " ".join(got)
        _nothing_more(side, other)
    finally:
        consumer.close()
        producer.close()
        other.close()
