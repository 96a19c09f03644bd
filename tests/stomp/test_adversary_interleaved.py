"""The adversary's review: other frames inside and between SEND streaks and AUTO runs on one
connection (session 21, adv21), a real listener and engine over loopback sockets.

* DISCONNECT (with a receipt) in the middle of a streak, in one write: the SENDs before
  it are taken and answered, the ones after it take no effect;
* a transaction opened and committed between streaks of the same head (its SENDs carry
  ``transaction``): the plain SENDs go at once, the transaction's at its COMMIT;
* a streak of large bodies cut by the window of unanswered bytes: parked, then taken in
  order;
* a consumer stalled with AUTO runs in flight that switches to ``client-individual``
  (UNSUBSCRIBE and SUBSCRIBE with the same id, pipelined): what it got before is
  settled, what it gets after must be ACKed, each message once, the queue empty at the
  end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.frames import Command, Frame
from broker.stomp.server import ListenerOptions
from broker.stomp.session import SessionConfig
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import FAST, Broker, shrink_send_buffers

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def raws() -> Iterator[list[Raw]]:
    made: list[Raw] = []
    yield made
    for raw in made:
        raw.close()


def _raw(b: Broker, made: list[Raw], rcvbuf: int | None = None) -> Raw:
    raw = Raw(b.listener.port, rcvbuf=rcvbuf)
    made.append(raw)
    raw.connect()
    return raw


def _subscribed(b: Broker, made: list[Raw], queue: str, rcvbuf: int | None = None) -> Raw:
    raw = _raw(b, made, rcvbuf)
    raw.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:auto\nreceipt:s\n\n\x00".encode())
    assert raw.next().header("receipt-id") == "s"
    return raw


def _send(queue: str, body: bytes, extra: str = "") -> bytes:
    return f"SEND\ndestination:/queue/{queue}\n{extra}\n".encode() + body + b"\x00"


def _marker(consumer: Raw, producer: Raw, queue: str) -> list[bytes]:
    producer.send(_send(queue, b"marker"))
    bodies = []
    while (body := consumer.next().body) != b"marker":
        bodies.append(body)
    return bodies


def test_a_disconnect_inside_a_streak_takes_what_came_before_and_nothing_after(
    broker: Broker, raws: list[Raw]
) -> None:
    consumer = _subscribed(broker, raws, "bye")
    producer = _raw(broker, raws)
    before = b"".join(_send("bye", b"b%04d" % i) for i in range(700))
    after = b"".join(_send("bye", b"a%04d" % i) for i in range(700))
    producer.send(before + b"DISCONNECT\nreceipt:bye\n\n\x00" + after)
    frame = producer.next()
    assert (frame.command, frame.header("receipt-id")) == (Command.RECEIPT, "bye")
    assert producer.closed_by_server()
    assert producer.frames == []
    got = _marker(consumer, _raw(broker, raws), "bye")
    assert got == [b"b%04d" % i for i in range(700)]


def test_a_transaction_between_streaks_of_one_head_commits_in_its_place(
    broker: Broker, raws: list[Raw]
) -> None:
    consumer = _subscribed(broker, raws, "tx")
    producer = _raw(broker, raws)
    plain = [_send("tx", b"p%03d" % i) for i in range(60)]
    held = [_send("tx", b"t%03d" % i, "transaction:t\n") for i in range(20)]
    producer.send(
        b"".join(plain[:20])
        + b"BEGIN\ntransaction:t\n\n\x00"
        + b"".join(held[:10])
        + b"".join(plain[20:40])  # (not in the transaction: at once)
        + b"".join(held[10:])
        + b"COMMIT\ntransaction:t\nreceipt:c\n\n\x00"
        + b"".join(plain[40:])
    )
    assert producer.next().header("receipt-id") == "c"
    got = _marker(consumer, producer, "tx")
    expected = [b"p%03d" % i for i in range(40)] + [b"t%03d" % i for i in range(20)]
    expected += [b"p%03d" % i for i in range(40, 60)]
    assert got == expected


@pytest.fixture
def narrow(zctx: Ctx) -> Iterator[Broker]:
    """Sessions whose window of unanswered SENDs holds 256 KiB of bodies."""
    session = SessionConfig(max_unanswered_bytes=256 * 1024, die_delay=0.1, heartbeat=(0, 0))
    made = Broker(zctx, options=ListenerOptions(port=0, session=session))
    yield made
    made.stop()


def test_a_streak_of_large_bodies_cut_by_the_byte_window_arrives_in_order(
    narrow: Broker, raws: list[Raw]
) -> None:
    consumer = _subscribed(narrow, raws, "large")
    producer = _raw(narrow, raws)
    size = 100_000  # (three fill the window: the streak is cut again and again)
    head = f"SEND\ndestination:/queue/large\ncontent-length:{size}\n\n".encode()
    bodies = [(b"%03d" % i) * (size // 3) + b"#" for i in range(40)]
    producer.send(b"".join(head + body + b"\x00" for body in bodies))
    got = [consumer.next().body for _ in bodies]
    assert got == bodies
    assert _marker(consumer, producer, "large") == []


@pytest.mark.parametrize("switch", ["at-once", "mid-run", "once-held"])
def test_a_stalled_auto_consumer_switching_to_client_acks_gets_each_once(
    zctx: Ctx, raws: list[Raw], switch: str
) -> None:
    b = Broker(zctx, options=ListenerOptions(port=0, session=FAST, max_outbound=4096))
    try:
        consumer = _subscribed(b, raws, "switch", rcvbuf=4096)
        shrink_send_buffers(b.listener)
        producer = _raw(b, raws)
        count = 2000
        producer.send(b"".join(_send("switch", b"%06d" % i + b"." * 90) for i in range(count)))
        auto: list[int] = []
        if switch == "once-held":  # (its input is read again once it took what was held)
            assert wait_until(lambda: b.held_deliveries() > 0)
        elif switch == "mid-run":  # some taken, runs in flight to it
            auto += [int(consumer.next().body[:6]) for _ in range(300)]
        consumer.send(
            b"UNSUBSCRIBE\nid:s\n\n\x00"
            b"SUBSCRIBE\nid:s\ndestination:/queue/switch\nack:client-individual\n"
            b"receipt:again\n\n\x00"
        )
        acked: list[int] = []
        receipted = False
        while len(auto) + len(acked) < count or not receipted:
            frame: Frame = consumer.next()
            if frame.command is Command.RECEIPT:
                assert frame.header("receipt-id") == "again"
                receipted = True
                continue
            assert frame.command is Command.MESSAGE, frame
            number = int(frame.body[:6])
            ack = frame.header("ack")
            if ack is None:  # (delivered under the ack:auto subscription)
                assert not receipted, frame  # (none after the new one's RECEIPT)
                auto.append(number)
                continue
            acked.append(number)
            consumer.send(f"ACK\nid:{ack}\n\n\x00".encode())
        assert auto == sorted(set(auto))
        assert len(set(acked)) == len(acked)
        assert sorted(auto + acked) == list(range(count))
        queue = b.engine.channels["switch"].queues[QUEUE_ID]
        assert wait_until(
            lambda: queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)
        )
    finally:
        for raw in raws:
            raw.close()
        raws.clear()
        b.stop()
