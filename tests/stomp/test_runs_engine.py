"""Runs of SENDs on the broker engine (``EngineDoor.op_publish_batch``: a connection's
pipelined SENDs reach the engine as one operation, ``Engine.publish_many``), against a
real listener and engine over sockets: what a hostile or unlucky client sees is what it
saw when each SEND was handed over alone."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
import zmq

from broker.engine.engine import Engine
from broker.engine.options import ChannelOptions
from broker.stomp.engine_mapping import QUEUE_ID, QUEUE_OPTIONS, channel_rest
from broker.stomp.frames import Command, Frame
from tests.broker.test_engine_publish_runs import Forbids
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]


def _raw(b: Broker) -> Raw:
    raw = Raw(b.listener.port)
    raw.connect()
    return raw


def _subscribe(raw: Raw, destination: str) -> None:
    raw.send(f"SUBSCRIBE\nid:s\ndestination:{destination}\nreceipt:sub\n\n\x00".encode())
    assert raw.next().command is Command.RECEIPT


def _engine(b: Broker, fn: Callable[[float], object]) -> None:
    """Run ``fn(now)`` on the engine thread and wait for it."""
    done = threading.Event()

    def op(now: float) -> list[object]:
        try:
            fn(now)
        finally:
            done.set()
        return []

    b.door.submit(op)  # type: ignore[arg-type]
    assert done.wait(10)


def test_a_run_the_queue_refuses_in_the_middle_takes_those_before_and_none_after(
    broker: Broker,
) -> None:
    limited = dataclasses.replace(QUEUE_OPTIONS, message_size_limit=10)
    base = broker.engine.config.channel_defaults

    def make(now: float) -> None:
        broker.engine.create_channel("full", ChannelOptions(**channel_rest(base)), [])
        broker.engine.create_queue("full", QUEUE_ID, limited, [])

    _engine(broker, make)
    producer = _raw(broker)
    bodies = ["m0", "m1", "m2", "x" * 11, "m4", "m5"]  # the fourth is over the limit
    burst = "".join(
        f"SEND\ndestination:/queue/full\nreceipt:r{i}\n\n{body}\x00"
        for i, body in enumerate(bodies)
    )
    producer.send(burst.encode())
    got = [producer.next() for _ in range(4)]
    assert [f.command for f in got] == [Command.RECEIPT] * 3 + [Command.ERROR]
    assert [f.header("receipt-id") for f in got] == ["r0", "r1", "r2", "r3"]
    assert producer.closed_by_server() and producer.frames == []
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/full")
    assert [consumer.next().body for _ in range(3)] == [b"m0", b"m1", b"m2"]
    queue = broker.engine.channels["full"].queues[QUEUE_ID]
    assert (
        queue.options.message_size_limit == 10 and queue.sequence == 3
    )  # m3..m5 never reached it


def test_a_reserved_header_in_the_middle_of_a_run_errors_after_those_before(
    broker: Broker,
) -> None:
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/r")
    producer = _raw(broker)
    frames = [f"SEND\ndestination:/queue/r\nreceipt:r{i}\n\nm{i}\x00" for i in range(4)]
    frames.append("SEND\ndestination:/queue/r\nCC:elsewhere\nreceipt:bad\n\nx\x00")
    frames += [f"SEND\ndestination:/queue/r\nreceipt:q{i}\n\nlate{i}\x00" for i in range(4)]
    producer.send("".join(frames).encode())
    assert producer.closed_by_server()
    *receipts, error = producer.frames
    # (a SEND refused before it reaches the engine ends the session at once: receipts of
    # the SENDs still waiting for the engine's answer are not sent, as before runs)
    assert [f.header("receipt-id") for f in receipts] == [f"r{i}" for i in range(len(receipts))]
    assert error.command is Command.ERROR and error.header("receipt-id") == "bad"
    assert "reserved" in str(error.header("message"))
    assert [consumer.next().body for _ in range(4)] == [f"m{i}".encode() for i in range(4)]
    consumer.send(b"SEND\ndestination:/queue/r\n\nafter\x00")
    assert consumer.next().body == b"after"  # nothing of the late ones came before it


#: Escaped header names and values (\\c and \\\\; a line break is refused by the engine)
#: and content-length bodies holding NULs and frame-like bytes, in one run.
_TRICKY = (
    b"SEND\ndestination:/queue/t\nk\\\\y:a\\cb\\\\e\ncontent-length:6\n\n\x00a\x00\n\n\x00\x00"
    b"SEND\ndestination:/queue/t\ncontent-length:14\nx:1\n\nSEND\n\n\x00MESSAGE\x00"
    b"SEND\ndestination:/queue/t\ny:\xc3\xa9\n\nplain\x00"
)


def _tricky_seen(frames: list[Frame]) -> list[tuple[bytes, str | None, str | None, str | None]]:
    return [(f.body, f.header("k\\y"), f.header("x"), f.header("y")) for f in frames]


_EXPECTED = [
    (b"\x00a\x00\n\n\x00", "a:b\\e", None, None),
    (b"SEND\n\n\x00MESSAGE", None, "1", None),
    (b"plain", None, None, "\u00e9"),
]


def test_a_run_with_escaped_headers_and_nul_bodies_arrives_intact(
    broker: Broker,
) -> None:
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/t")
    producer = _raw(broker)
    producer.send(_TRICKY)
    assert _tricky_seen([consumer.next() for _ in range(3)]) == _EXPECTED


def test_a_run_split_at_every_byte_boundary_arrives_intact(
    broker: Broker,
) -> None:
    """The run written in two pieces, for each split point (the parser holds the first
    piece's unfinished frame while the session hands over the frames it completed)."""
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/t")
    producer = _raw(broker)
    producer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for cut in range(1, len(_TRICKY)):
        producer.send(_TRICKY[:cut])
        producer.send(_TRICKY[cut:])
        assert _tricky_seen([consumer.next() for _ in range(3)]) == _EXPECTED, cut


@pytest.fixture
def guarded(zctx: Ctx) -> Iterator[Broker]:
    """A broker whose authorizer forbids pushes into channel ``forbidden``."""
    b = Broker(zctx, Engine(authorizer=Forbids()))
    yield b
    b.stop()


def _marker_after(consumer: Raw, destination: str) -> list[bytes]:
    """Bodies the consumer gets before a marker sent through the same queue now."""
    consumer.send(f"SEND\ndestination:{destination}\n\nmarker\x00".encode())
    bodies = []
    while (body := consumer.next().body) != b"marker":
        bodies.append(body)
    return bodies


def test_a_forbidden_destination_in_the_middle_of_a_run_errors_after_those_before(
    guarded: Broker,
) -> None:
    consumer = _raw(guarded)
    _subscribe(consumer, "/queue/a")
    producer = _raw(guarded)
    targets = ["a", "a", "forbidden", "a"]
    producer.send(
        "".join(
            f"SEND\ndestination:/queue/{t}\nreceipt:r{i}\n\nm{i}\x00"
            for i, t in enumerate(targets)
        ).encode()
    )
    assert producer.closed_by_server()
    assert [(f.command, f.header("receipt-id")) for f in producer.frames] == [
        (Command.RECEIPT, "r0"),
        (Command.RECEIPT, "r1"),
        (Command.ERROR, "r2"),
    ]
    assert "/queue/forbidden: push not allowed" in str(producer.frames[2].header("message"))
    assert [consumer.next().body for _ in range(2)] == [b"m0", b"m1"]
    assert _marker_after(consumer, "/queue/a") == []  # m3 never went in


@pytest.mark.parametrize("target", ["/queue/forbidden", "/queue/temp.default.999.gone"])
def test_a_whole_run_to_one_destination_it_cannot_use_takes_none_of_it(
    guarded: Broker, target: str
) -> None:
    """Every SEND of the run names one destination (the door finds its channel once):
    a channel the authorizer refuses pushes into, or a temporary queue whose connection
    is gone (no channel to be had).  The ERROR names the first SEND's receipt, no
    RECEIPT comes, nothing arrives; a run to a good queue after it is ignored."""
    consumer = _raw(guarded)
    _subscribe(consumer, "/queue/a")
    producer = _raw(guarded)
    run = "".join(f"SEND\ndestination:{target}\nreceipt:r{i}\n\nm{i}\x00" for i in range(4))
    after = "".join(f"SEND\ndestination:/queue/a\nreceipt:q{i}\n\nlate{i}\x00" for i in range(2))
    producer.send((run + after).encode())
    assert producer.closed_by_server()
    assert [(f.command, f.header("receipt-id")) for f in producer.frames] == [
        (Command.ERROR, "r0")
    ]
    assert target in str(producer.frames[0].header("message"))
    assert _marker_after(consumer, "/queue/a") == []


def test_a_send_that_does_not_parse_between_good_ones_errors_after_those_before(
    broker: Broker,
) -> None:
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/g")
    producer = _raw(broker)
    frames = [f"SEND\ndestination:/queue/g\nreceipt:r{i}\n\nm{i}\x00" for i in range(3)]
    frames.append("SEND\nreceipt:bad\n\nno destination\x00")
    frames += [f"SEND\ndestination:/queue/g\nreceipt:q{i}\n\nlate{i}\x00" for i in range(3)]
    producer.send("".join(frames).encode())
    assert producer.closed_by_server()
    *receipts, error = producer.frames
    # (refused before the engine: the session ends at once, and the receipts of SENDs
    # still waiting for the engine's answer are not sent -- as before runs)
    assert [f.header("receipt-id") for f in receipts] == [f"r{i}" for i in range(len(receipts))]
    assert error.command is Command.ERROR and error.header("receipt-id") == "bad"
    assert [consumer.next().body for _ in range(3)] == [b"m0", b"m1", b"m2"]
    assert _marker_after(consumer, "/queue/g") == []


def test_transactions_across_runs_keep_their_order_and_receipts(
    broker: Broker,
) -> None:
    """In one read: plain SENDs (runs) between a transaction's SENDs go at once, the
    transaction's at COMMIT, an aborted one's never; every receipt in frame order."""
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/tx")

    def send(body: str, extra: str = "") -> str:
        return f"SEND\ndestination:/queue/tx\n{extra}\n{body}\x00"

    producer = _raw(broker)
    burst = [
        "BEGIN\ntransaction:t\n\n\x00",
        send("t1", "transaction:t\n"),
        send("p1"),
        send("t2", "transaction:t\nreceipt:rt2\n"),
        send("p2", "receipt:rp2\n"),
        "COMMIT\ntransaction:t\nreceipt:commit\n\n\x00",
        "BEGIN\ntransaction:u\n\n\x00",
        send("x", "transaction:u\n"),
        send("p3"),
        "ABORT\ntransaction:u\nreceipt:abort\n\n\x00",
        send("p4", "receipt:end\n"),
    ]
    producer.send("".join(burst).encode())
    assert [producer.next().header("receipt-id") for _ in range(5)] == [
        "rt2",
        "rp2",
        "commit",
        "abort",
        "end",
    ]
    expected = [b"p1", b"p2", b"t1", b"t2", b"p3", b"p4"]
    assert [consumer.next().body for _ in expected] == expected
    assert _marker_after(consumer, "/queue/tx") == []  # x was aborted


def test_a_consumer_that_stops_reading_is_bounded_and_then_gets_every_run_in_order(
    broker: Broker,
) -> None:
    """Runs of SENDs to an ``ack:auto`` consumer that stopped reading: its unsent bytes
    stay within the listener's ``max_outbound`` (plus one frame) and the engine keeps
    the rest queued; once it reads again it gets every message, in order."""
    stalled = Raw(broker.listener.port, rcvbuf=4096)
    stalled.connect()
    _subscribe(stalled, "/queue/slow")
    producer = _raw(broker)
    total, body = 3000, "x" * 10_000  # (30 MB: more than the kernel buffers take)
    frames = [
        f"SEND\ndestination:/queue/slow\nn:{i}\n{'receipt:last' if i == total - 1 else ''}"
        f"\n\n{body}\x00"
        for i in range(total)
    ]
    for start in range(0, total, 100):  # runs of up to 100 SENDs per write
        producer.send("".join(frames[start : start + 100]).encode())
    assert producer.next().header("receipt-id") == "last"  # all taken by the engine
    queue = broker.engine.channels["slow"].queues[QUEUE_ID]
    limit = broker.listener.options.max_outbound + len(frames[0]) + 200
    assert wait_until(lambda: queue.message_count > 0)  # the rest waits in the engine

    def unsent() -> int:
        return sum(broker.listener.call(broker.listener.outbound_bytes).values())

    assert unsent() <= limit
    seen = [int(str(stalled.next().header("n"))) for _ in range(total)]
    assert seen == list(range(total))
    assert wait_until(
        lambda: queue.message_count == 0 and not (queue.pending or queue.auto_in_flight)
    )


def test_streaks_of_one_head_arrive_whole_and_in_order_across_reads_and_windows(
    broker: Broker,
) -> None:
    """5,000 SENDs of one head (a user header, content-length bodies holding NULs and
    frame-like bytes) written in pieces that cut frames anywhere: the listener reads
    them as streaks, across its window of 1,000 unanswered SENDs; the ``ack:auto``
    consumer gets every body in order with the user header, the last SEND's RECEIPT
    comes, and nothing else."""
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/streak")
    producer = _raw(broker)
    producer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    bodies = [b"%06d\0\nSEND\0" % i for i in range(5000)]
    head = b"SEND\ndestination:/queue/streak\nx:y\ncontent-length:%d\n\n" % len(bodies[0])
    stream = b"".join(head + body + b"\0" for body in bodies)
    stream += b"SEND\ndestination:/queue/streak\nreceipt:end\n\nlast\0"
    for at in range(0, len(stream), 7001):
        producer.send(stream[at : at + 7001])
    got = [consumer.next() for _ in range(5001)]
    assert [f.body for f in got] == [*bodies, b"last"]
    assert {f.header("x") for f in got[:-1]} == {"y"}
    receipt = producer.next()
    assert receipt.command is Command.RECEIPT and receipt.header("receipt-id") == "end"
    assert _marker_after(consumer, "/queue/streak") == []
