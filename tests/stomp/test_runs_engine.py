"""Runs of SENDs on the broker engine (``EngineDoor.op_publish_batch``: a connection's
pipelined SENDs reach the engine as one operation, ``Engine.publish_many``), against a
real listener and engine over sockets: what a hostile or unlucky client sees is what it
saw when each SEND was handed over alone."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Callable

from broker.engine.options import ChannelOptions
from broker.stomp.engine_mapping import QUEUE_ID, QUEUE_OPTIONS, channel_rest
from broker.stomp.frames import Command, Frame
from tests.stomp.test_engine_backend import Broker, broker  # noqa: F401  (fixture)
from tests.stomp.test_listener import Raw


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
    broker: Broker,  # noqa: F811
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
    broker: Broker,  # noqa: F811
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
    broker: Broker,  # noqa: F811
) -> None:
    consumer = _raw(broker)
    _subscribe(consumer, "/queue/t")
    producer = _raw(broker)
    producer.send(_TRICKY)
    assert _tricky_seen([consumer.next() for _ in range(3)]) == _EXPECTED


def test_a_run_split_at_every_byte_boundary_arrives_intact(
    broker: Broker,  # noqa: F811
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
