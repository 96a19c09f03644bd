"""The listener's plain runs (``EngineBackend._plain_prefix`` -> ``Session.deliver_plain``)
on a real listener and engine: a hand-over mixing plain ``ack:auto`` deliveries with
ones that carry headers, go to another subscription or come from other producers gives
the consumer every message once, in each producer's order, each frame as the usual
path writes it; a plain run larger than the connection's room is held, then handed in
order once the consumer reads again."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest

from broker.stomp.engine_mapping import QUEUE_ID
from tests.polling import wait_until
from tests.stomp.engine_side import Engineside, RawClient, header

NUL = b"\x00"


@pytest.fixture
def side() -> Iterator[Engineside]:
    made = Engineside(max_outbound=16 * 1024)
    yield made
    made.stop()


def _subscribe(consumer: RawClient, sub: bytes, destination: bytes) -> None:
    consumer.send(
        b"SUBSCRIBE\nid:%s\ndestination:%s\nack:auto\nreceipt:r-%s\n\n\x00"
        % (sub, destination, sub)
    )
    assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:r-" + sub)


def _send(destination: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"SEND\ndestination:%s\n%s\n%s\x00" % (destination, extra, body)


def test_a_mixed_hand_over_reaches_the_consumer_exactly(side: Engineside) -> None:
    consumer = RawClient(side)
    first, second = RawClient(side), RawClient(side)
    try:
        _subscribe(consumer, b"s", b"/queue/orders")
        _subscribe(consumer, b"t", b"/queue/other")
        # written before the engine runs: the door's operations pile up, one hand-over
        one = [
            _send(b"/queue/orders", b"a1"),
            _send(b"/queue/orders", b"a2"),
            _send(b"/queue/orders", b"a3", b"h:v\n"),  # a header to carry
            _send(b"/queue/orders", b"a4"),
            _send(b"/queue/other", b"a5"),  # the other subscription
            _send(b"/queue/orders", b"a6", b"content-type:text/x\n"),
            _send(b"/queue/orders", b"a7", b"receipt:one\n"),
        ]
        first.send(b"".join(one))
        second.send(
            _send(b"/queue/orders", b"b1") + _send(b"/queue/orders", b"b2", b"receipt:two\n")
        )
        frames = [consumer.next_frame() for _ in range(9)]
        assert first.next_frame().startswith(b"RECEIPT\nreceipt-id:one")
        assert second.next_frame().startswith(b"RECEIPT\nreceipt-id:two")
        bodies = [f.split(b"\n\n", 1)[1] for f in frames]
        assert sorted(bodies) == sorted(
            [b"a1", b"a2", b"a3", b"a4", b"a5", b"a6", b"a7", b"b1", b"b2"]
        )
        assert [b for b in bodies if b.startswith(b"a")] == [
            b"a1",
            b"a2",
            b"a3",
            b"a4",
            b"a5",
            b"a6",
            b"a7",
        ]
        assert [b for b in bodies if b.startswith(b"b")] == [b"b1", b"b2"]
        ids = [header(f, b"message-id") for f in frames]
        assert len(set(ids)) == 9
        for frame, body in zip(frames, bodies, strict=True):
            sub = b"t" if body == b"a5" else b"s"
            destination = b"/queue/other" if body == b"a5" else b"/queue/orders"
            extra = {b"a3": b"h:v\n", b"a6": b"content-type:text/x\n"}.get(body, b"")
            expected = (
                b"MESSAGE\nsubscription:%s\nmessage-id:%s\ndestination:%s\n%scontent-length:%d\n\n%s"
                % (sub, header(frame, b"message-id"), destination, b"", len(body), body)
            )
            if extra:  # the carried header after the usual ones
                assert frame.startswith(b"MESSAGE\nsubscription:s\n"), frame
                assert extra.rstrip(b"\n") in frame.split(b"\n\n", 1)[0].split(b"\n"), frame
            else:
                assert frame == expected, frame
        queue = side.engine.channels["orders"].queues[QUEUE_ID]
        assert side.pump(lambda: queue.acks == 8 and not queue.pending)
    finally:
        for client in (consumer, first, second):
            client.close()


def test_a_plain_run_larger_than_the_room_is_held_then_handed_in_order(
    side: Engineside,
) -> None:
    consumer = RawClient(side, rcvbuf=4096)
    producer = RawClient(side)
    try:
        _subscribe(consumer, b"s", b"/queue/big")
        count = 1500  # (3 MB: more than the kernel's socket buffers take)
        bodies = [b"%04d" % i + b"z" * 1996 for i in range(count)]
        producer.send(b"".join(_send(b"/queue/big", body) for body in bodies))
        # the consumer reads nothing: the listener's room (16 KiB) runs out mid-run
        assert side.pump(lambda: side.door.stats()["stomp"]["held_deliveries"] > 0)
        consumer.sock.setblocking(False)
        data = bytearray()

        def got_all() -> bool:
            side.door.run_ops(time.monotonic())
            while select.select([consumer.sock], [], [], 0)[0]:
                chunk = consumer.sock.recv(1 << 20)
                assert chunk, "the connection closed"
                data.extend(chunk)
            return data.count(b"\x00") >= count

        assert wait_until(got_all), f"read {data.count(NUL)} of {count} MESSAGEs"
        frames = bytes(data).split(b"\x00")[:-1]
        assert [f.split(b"\n\n", 1)[1] for f in frames] == bodies  # each once, in order
        queue = side.engine.channels["big"].queues[QUEUE_ID]
        assert side.pump(lambda: queue.acks == count and not queue.pending)
        assert side.door.stats()["stomp"]["held_deliveries"] == 0
    finally:
        consumer.close()
        producer.close()
