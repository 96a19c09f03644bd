"""``ack:auto`` deliveries as AUTO transits (``broker.engine.flow.AUTO``) through the real
STOMP listener over loopback, the engine thread being the test (``Engineside``).

Each case runs three times: with AUTO transits as the door asks for them (the door's
runs of SENDs, ``unique_ids``; a single consumer's run of them as ONE item and ONE
``unsent`` entry, its transport taking runs: ``broker.engine.flow.AUTO_RUN``), with AUTO
transits one by one (``acknowledge_taken`` without ``runs``: a ``Tracked`` frame each),
and without (the engine's
``publish_many`` told the ids are not the door's own: every delivery tracked, as
before).  All must give the same outcome: every message read once,
in order, nothing taken lost; what never reached a socket comes back as a first delivery
(no ``redeliveries`` header); the queue's counters (sent, deliveries, acks, nacks,
pending acknowledges) as the traffic says.  The first must have made runs, the second
AUTO transits (no run), the third neither.

The cases: UNSUBSCRIBE while the listener holds deliveries (``_return_held``); deliveries
that reach the listener after their subscription went ("unsubscribed meanwhile" in
``EngineBackend._deliver_to``); a reset (kill -9) and a DISCONNECT with deliveries held;
an ``ack:auto`` and an ``ack:client-individual`` consumer on one queue."""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.engine.engine import Engine
from broker.engine.flow import AUTO, AUTO_RUN
from broker.engine.queue.queue import Queue
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.server import ListenerOptions
from tests.polling import wait_until
from tests.stomp.engine_side import FAST, Engineside, RawClient, header
from tests.stomp.two_doors import shrink_send_buffers

MAX_OUTBOUND = 16 * 1024
BODY = 2000  # octets of each message: several fill the connection
COUNT = 60


class Side(Engineside):
    """``Engineside`` whose sessions show a redelivery (``redeliveries`` header), with
    AUTO transits (``mode``: "auto-runs", "auto-transits") or without ("tracked"),
    counting the AUTO transits and the runs of them the engine made."""

    def __init__(self, mode: str) -> None:
        self.engine = Engine()
        self.door = EngineDoor(self.engine)
        session = dataclasses.replace(FAST, add_redeliveries_header="redeliveries")
        options = ListenerOptions(port=0, session=session, max_outbound=MAX_OUTBOUND)
        self.listener = listen(self.door, lambda fd, fn: None, options)
        self.listener.start()
        self.autos = 0
        self.runs = 0
        #: Only a queue's single consumer gets runs (several take turns one by one).
        self.single = True
        publish_many = self.engine.publish_many

        def publish(client_id: str, messages: Any, now: float, **kw: Any) -> Any:
            if mode == "tracked":
                kw["unique_ids"] = False  # (every delivery tracked)
            result = publish_many(client_id, messages, now, **kw)
            for client in self.engine.clients.values():
                self.autos += sum(1 for t in client.unsent if t[0] == AUTO)
                self.runs += sum(1 for t in client.unsent if t[0] == AUTO_RUN)
            return result

        self.engine.publish_many = publish  # type: ignore[method-assign]
        if mode != "auto-runs":  # its consumers' transports take no runs: a Tracked
            by_taking = self.engine.acknowledge_taken  # frame per delivery (Client.auto_runs)

            def one_by_one(client_id: str, channel: str, on: bool = True, **_: Any) -> bool:
                return by_taking(client_id, channel, on)

            self.engine.acknowledge_taken = one_by_one  # type: ignore[method-assign]


@pytest.fixture(params=["auto-runs", "auto-transits", "tracked"])
def side(request: Any) -> Iterator[Side]:
    made = Side(request.param)
    yield made
    made.stop()
    if request.param == "auto-runs" and made.single:
        assert made.runs > 0, "no run of AUTO transits was made"
    elif request.param == "auto-runs":
        assert made.autos > 0 and made.runs == 0
    elif request.param == "auto-transits":
        assert made.autos > 0 and made.runs == 0, "no AUTO transit was made"
    else:
        assert made.autos == 0 and made.runs == 0


def _bodies(queue: str, n: int = COUNT) -> list[bytes]:
    return [f"{queue}-{i:04d}-".encode().ljust(BODY, b".") for i in range(n)]


def _send(producer: RawClient, queue: str, bodies: list[bytes], tag: str = "sent") -> None:
    """All in one write: the listener reads them as runs (the engine's AUTO path)."""
    frames = [
        b"SEND\ndestination:/queue/" + queue.encode() + b"\n\n" + b + b"\x00" for b in bodies
    ]
    frames.append(f"BEGIN\ntransaction:{tag}\nreceipt:{tag}\n\n\x00".encode())
    producer.send(b"".join(frames))
    assert producer.next_frame().startswith(f"RECEIPT\nreceipt-id:{tag}".encode())


def _subscribe(client: RawClient, sub: str, queue: str, ack: str) -> None:
    client.send(
        f"SUBSCRIBE\nid:{sub}\ndestination:/queue/{queue}\nack:{ack}\nreceipt:sub-{sub}\n\n\x00".encode()
    )
    assert client.next_frame().startswith(f"RECEIPT\nreceipt-id:sub-{sub}".encode())


def _small_consumer(side: Side) -> RawClient:
    """A consumer whose socket holds little (4 KiB each way): the listener soon holds."""
    client = RawClient(side, rcvbuf=4096)
    shrink_send_buffers(side.listener, lambda cid, _: cid == client.id)
    return client


def _held(side: Side) -> int:
    figures = side.door.stats()["stomp"]
    assert isinstance(figures, dict)
    return int(figures["held_deliveries"])


def _queue(side: Side, name: str) -> Queue:
    return side.engine.channels[name].queues[QUEUE_ID]


def _idle(queue: Queue) -> bool:
    return not (queue.pending or queue.auto_in_flight)


def _pending_acks(side: Side, name: str) -> int:
    info = _queue(side, name).information(time.time(), time.monotonic())
    return int(info["PendingAcknowledges"])


def _read_messages(side: Side, client: RawClient, until: bytes) -> list[bytes]:
    """MESSAGE frames ``client`` reads until a frame holding ``until``."""
    frames: list[bytes] = []
    while True:
        frame = client.next_frame()
        if until in frame:
            return frames
        assert frame.startswith(b"MESSAGE\n"), frame[:200]
        frames.append(frame)


def _collect(client: RawClient, want: int, ack: bool) -> list[bytes]:
    frames: list[bytes] = []
    while len(frames) < want:
        frame = client.next_frame()
        assert frame.startswith(b"MESSAGE\n"), frame[:200]
        frames.append(frame)
        if ack:
            client.send(b"ACK\nid:" + header(frame, b"ack") + b"\n\n\x00")
    return frames


def _body(frame: bytes) -> bytes:
    return frame.split(b"\n\n", 1)[1]


def _first_deliveries(frames: list[bytes]) -> bool:
    return all(b"\nredeliveries:" not in f.split(b"\n\n", 1)[0] for f in frames)


def _read_while_held(side: Side, client: RawClient, frame: bytes) -> None:
    """The listener reads ``frame`` now, while it holds deliveries for ``client`` (its
    read callback on its loop thread; through the socket it would read it only once the
    connection had room: tests/stomp/test_held_unsubscribe.py)."""
    assert _held(side) > 0
    side.listener.call(lambda: side.listener.connections[client.id].data_received(frame))


def _read_to_the_end(side: Side, client: RawClient) -> list[bytes]:
    """The bodies of the MESSAGE frames ``client`` reads until the listener closes the
    connection (the engine thread run meanwhile)."""
    data = bytearray(client.buffer)
    client.sock.setblocking(False)
    closed = False

    def step() -> bool:
        nonlocal closed
        side.door.run_ops(time.monotonic())
        while select.select([client.sock], [], [], 0)[0]:
            chunk = client.sock.recv(1 << 20)
            if not chunk:
                closed = True
                break
            data.extend(chunk)
        return closed

    assert wait_until(step)
    frames = [f.lstrip(b"\n") for f in bytes(data).split(b"\x00") if f.strip(b"\n")]
    return [_body(f) for f in frames if f.startswith(b"MESSAGE\n")]


def _nothing_more(client: RawClient) -> None:
    client.send(b"BEGIN\ntransaction:probe\nreceipt:probe\n\n\x00")
    frame = client.next_frame()
    assert frame.startswith(b"RECEIPT\nreceipt-id:probe"), frame[:200]
    client.send(b"ABORT\ntransaction:probe\n\n\x00")


def test_unsubscribe_while_held_returns_first_deliveries_in_order(side: Side) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "held", "auto")
        bodies = _bodies("held")
        _send(producer, "held", bodies)
        assert side.pump(lambda: _held(side) > 0)
        _read_while_held(side, consumer, b"UNSUBSCRIBE\nid:s\nreceipt:gone\n\n\x00")
        read = [_body(f) for f in _read_messages(side, consumer, b"receipt-id:gone")]
        assert read == bodies[: len(read)]
        queue = _queue(side, "held")
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        returned = COUNT - len(read)
        assert returned > 0
        assert (queue.sent, queue.deliveries, queue.acks) == (len(read),) * 3
        # each NACKed twice: once as held (_return_held), and once more as it reached
        # the listener after the subscription went (the NACK put it back before the
        # engine heard of the UNSUBSCRIBE, so it went to the same consumer again)
        assert queue.nacks == 2 * returned
        _subscribe(other, "o", "held", "auto")
        got = _collect(other, returned, ack=False)
        assert [_body(f) for f in got] == bodies[len(read) :]
        assert _first_deliveries(got)  # they never reached the first consumer's socket
        _nothing_more(other)
        assert (queue.sent, queue.deliveries, queue.acks) == (COUNT,) * 3
        assert _pending_acks(side, "held") == 0
    finally:
        consumer.close()
        producer.close()
        other.close()


def test_deliveries_reaching_a_subscription_gone_meanwhile_come_back(side: Side) -> None:
    """The listener removes the subscription before the engine runs the SENDs: every
    delivery reaches it gone ("unsubscribed meanwhile") and goes back, unwritten."""
    consumer = RawClient(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "gone", "auto")
        bodies = _bodies("gone", 20)
        frames = [b"SEND\ndestination:/queue/gone\n\n" + b + b"\x00" for b in bodies]
        producer.send(b"".join(frames))
        consumer.send(b"UNSUBSCRIBE\nid:s\n\n\x00")

        def both_read() -> bool:  # (the listener read both, the engine ran nothing)
            return side.door.pending_ops >= 3

        assert wait_until(both_read)
        # the engine runs the SENDs (sent to the consumer it still has), then the
        # UNSUBSCRIBE; the listener gets the deliveries with the subscription gone
        assert side.pump(lambda: _queue(side, "gone").received == len(bodies))
        queue = _queue(side, "gone")
        assert side.pump(lambda: _idle(queue) and queue.nacks == len(bodies))
        assert (queue.sent, queue.deliveries, queue.acks) == (0, 0, 0)
        assert queue.nacks == queue.message_count == len(bodies)
        _subscribe(other, "o", "gone", "auto")
        got = _collect(other, len(bodies), ack=False)
        assert [_body(f) for f in got] == bodies
        assert _first_deliveries(got)
        _nothing_more(other)
        assert not consumer.readable()
        assert (queue.sent, queue.deliveries, queue.acks) == (len(bodies),) * 3
    finally:
        consumer.close()
        producer.close()
        other.close()


@pytest.mark.parametrize("how", ["reset", "disconnect"])
def test_a_consumer_that_leaves_while_held_loses_nothing_not_taken(side: Side, how: str) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "bye", "auto")
        bodies = _bodies("bye")
        _send(producer, "bye", bodies)
        assert side.pump(lambda: _held(side) > 0)
        queue = _queue(side, "bye")
        if how == "reset":  # kill -9: nothing read, the connection reset
            consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            consumer.close()
            read: list[bytes] = []
        else:
            _read_while_held(side, consumer, b"DISCONNECT\n\n\x00")
            read = _read_to_the_end(side, consumer)
        assert side.pump(lambda: side.session_state(consumer.id) is None)
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        taken = queue.acks  # handed to the connection's output: taken (ack:auto)
        assert 0 < taken < COUNT
        assert read == bodies[: len(read)]
        if how == "disconnect":
            assert len(read) == taken  # (all it was handed, nothing more)
        assert (queue.sent, queue.deliveries) == (taken, taken)
        assert queue.nacks == COUNT - taken  # (the tracked path counts a nack each)
        _subscribe(other, "o", "bye", "client-individual")
        got = _collect(other, COUNT - taken, ack=True)
        assert [_body(f) for f in got] == bodies[taken:]
        assert _first_deliveries(got)
        _nothing_more(other)
        assert queue.acks == COUNT and _pending_acks(side, "bye") == 0
    finally:
        consumer.close()
        producer.close()
        other.close()


def test_an_auto_and_a_client_consumer_share_a_queue_exactly(side: Side) -> None:
    auto = RawClient(side)
    client = RawClient(side)
    producer = RawClient(side)
    try:
        _subscribe(auto, "a", "mixed", "auto")
        _subscribe(client, "c", "mixed", "client-individual")
        bodies = _bodies("mixed", 40)
        _send(producer, "mixed", bodies, "first")
        # round robin: half each, in order each
        got_a = _collect(auto, 20, ack=False)
        got_c = _collect(client, 20, ack=True)
        assert sorted(_body(f) for f in got_a + got_c) == bodies
        assert [_body(f) for f in got_a] == bodies[0::2]
        # the client-acknowledging one goes: the auto one alone (AUTO transits)
        client.send(b"UNSUBSCRIBE\nid:c\nreceipt:left\n\n\x00")
        assert client.next_frame().startswith(b"RECEIPT\nreceipt-id:left")
        more = _bodies("more", 30)
        _send(producer, "mixed", more, "second")
        got = _collect(auto, 30, ack=False)
        assert [_body(f) for f in got] == more
        assert _first_deliveries(got_a + got_c + got)
        queue = _queue(side, "mixed")
        assert side.pump(lambda: _idle(queue))
        assert (queue.sent, queue.deliveries, queue.acks, queue.nacks) == (70, 70, 70, 0)
    finally:
        auto.close()
        client.close()
        producer.close()


def test_a_delivery_to_a_gone_subscription_behind_a_held_run_keeps_its_place(side: Side) -> None:
    """One batch of deliveries: a run for a live subscription that fills the connection,
    then one for a subscription the listener removed meanwhile.  The gone one is reported
    at its place (after the run); counted ahead of the run's held deliveries it settled
    one of them as taken -- acknowledged while still held, lost if the connection then
    resets -- and left its own transit behind (a DEFECT found in session 20)."""
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "a", "live", "auto")
        _subscribe(consumer, "b", "left", "auto")
        bodies = _bodies("live", 30)
        frames = [b"SEND\ndestination:/queue/live\n\n" + b + b"\x00" for b in bodies]
        frames.append(b"SEND\ndestination:/queue/left\n\nleft-0\x00")
        frames.append(b"SEND\ndestination:/queue/left\n\nleft-1\x00")
        before = side.door.pending_ops
        producer.send(b"".join(frames))
        assert wait_until(lambda: side.door.pending_ops > before)  # (read, not run)
        consumer.send(b"UNSUBSCRIBE\nid:b\n\n\x00")
        assert wait_until(lambda: side.door.pending_ops > before + 1)
        live, left = _queue_when(side, "live"), _queue_when(side, "left")
        assert side.pump(lambda: _held(side) > 1 and not side.door.pending_ops)
        backend: Any = side.listener.backend
        held = side.listener.call(lambda: [m.target for m in backend.conns[consumer.id].held])
        handed = live.acks  # what the connection's output took: acknowledged
        assert handed == len(bodies) - held.count("live") > 0  # (not one held counted)
        # the consumer vanishes (kill -9): everything not handed comes back
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        consumer.close()
        assert side.pump(lambda: side.session_state(consumer.id) is None)
        assert side.pump(lambda: _idle(live) and _idle(left) and _held(side) == 0)
        assert live.acks == handed  # nothing acknowledged that was not handed
        _subscribe(other, "o", "live", "auto")
        got = _collect(other, len(bodies) - handed, ack=False)
        assert [_body(f) for f in got] == bodies[handed:]
        _subscribe(other, "p", "left", "auto")
        assert [_body(f) for f in _collect(other, 2, ack=False)] == [b"left-0", b"left-1"]
        _nothing_more(other)
    finally:
        consumer.close()
        producer.close()
        other.close()


def _queue_when(side: Side, name: str) -> Queue:
    """The channel's queue, once the engine made it (pumped)."""
    assert side.pump(lambda: name in side.engine.channels and side.engine.channels[name].queues)
    return _queue(side, name)


def test_two_auto_consumers_take_turns_exactly(side: Side) -> None:
    side.single = False
    first = RawClient(side)
    second = RawClient(side)
    producer = RawClient(side)
    try:
        _subscribe(first, "a", "turns", "auto")
        _subscribe(second, "b", "turns", "auto")
        bodies = _bodies("turns", 40)
        _send(producer, "turns", bodies)
        got_first = _collect(first, 20, ack=False)
        got_second = _collect(second, 20, ack=False)
        assert [_body(f) for f in got_first] == bodies[0::2]
        assert [_body(f) for f in got_second] == bodies[1::2]
        assert _first_deliveries(got_first + got_second)
        queue = _queue(side, "turns")
        assert side.pump(lambda: _idle(queue))
        assert (queue.sent, queue.deliveries, queue.acks, queue.nacks) == (40, 40, 40, 0)
        _nothing_more(first)
        _nothing_more(second)
    finally:
        first.close()
        second.close()
        producer.close()
