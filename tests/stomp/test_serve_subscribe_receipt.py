"""A SUBSCRIBE with a receipt, sent right after ACKs on the same connection, on
``broker serve --stomp --data DIR`` (a real process, raw frames): its RECEIPT says every
frame before it was applied.  A browser's (``browser:true``): once it is read a second
browser (another connection) sees none of the acknowledged messages, and neither does
one after a ``kill -9`` of the broker at the moment the RECEIPT was read (the ACKs were
durable by then).  A second plain subscription to the queue the connection already
consumes (the engine is not asked anything): the same after a kill -9 at its RECEIPT
(a defect until session 13: its RECEIPT left at once).

A SUBSCRIBE's RECEIPT is sent when ``subscribe`` returns (``_APPLIED_ON_RETURN``): it
holds because the engine backend's ``subscribe`` runs a call that waits for the
operations before it and their writes to be durable.  The kill -9 cases are the sharp
ones: with the browse's first page submitted without the wait, the browser case failed 3
runs in 3 (session 13); the live case cannot race (the second browser's SUBSCRIBE is
behind the ACKs anyway)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command, Frame
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve

QUEUE = b"/queue/browsed-acks"
COUNT = 40


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Serve]:
    made = Serve(tmp_path, "--data", str(tmp_path / "data"))
    yield made
    made.stop()


@pytest.fixture
def raws() -> Iterator[Callable[[int], Raw]]:
    made: list[Raw] = []

    def make(port: int) -> Raw:
        made.append(Raw(port))
        made[-1].connect()
        return made[-1]

    yield make
    for raw in made:
        raw.close()


def publish(raw: Raw, bodies: list[bytes]) -> None:
    """Persistent SENDs, each receipted, all in one write; every RECEIPT read."""
    raw.send(
        b"".join(
            b"SEND\ndestination:%s\npersistent:true\nreceipt:p%d\n\n%s\x00" % (QUEUE, i, body)
            for i, body in enumerate(bodies)
        )
    )
    got = [raw.next() for _ in bodies]
    assert [(f.command, f.header("receipt-id")) for f in got] == [
        (Command.RECEIPT, f"p{i}") for i in range(len(bodies))
    ]


def browse(raw: Raw, sub_id: str) -> list[bytes]:
    """The bodies a browser subscription sees up to its ``browser:end`` marker."""
    raw.send(b"SUBSCRIBE\nid:%s\nbrowser:true\ndestination:%s\n\n\x00" % (sub_id.encode(), QUEUE))
    seen: list[bytes] = []
    while (frame := raw.next()).header("browser") != "end":
        assert frame.command is Command.MESSAGE and frame.header("subscription") == sub_id
        seen.append(frame.body)
    return seen


def ack_then_browse(raw: Raw, messages: list[Frame], receipt: str) -> list[Frame]:
    """ACK ``messages`` and SUBSCRIBE a browser with ``receipt``, all in one write; the
    frames read up to and with the RECEIPT."""
    acks = b"".join(b"ACK\nid:%s\n\n\x00" % m.header("ack").encode() for m in messages)
    sub = b"SUBSCRIBE\nid:b\nbrowser:true\ndestination:%s\nreceipt:%s\n\n\x00" % (
        QUEUE,
        receipt.encode(),
    )
    raw.send(acks + sub)
    frames: list[Frame] = []
    while not frames or frames[-1].command is not Command.RECEIPT:
        frames.append(raw.next())
    assert frames[-1].header("receipt-id") == receipt
    return frames


def consume_unacked(raw: Raw, count: int) -> list[Frame]:
    raw.send(b"SUBSCRIBE\nid:c\nack:client-individual\ndestination:%s\n\n\x00" % QUEUE)
    got = [raw.next() for _ in range(count)]
    assert all(f.command is Command.MESSAGE and f.header("subscription") == "c" for f in got)
    return got


@pytest.mark.parametrize("killed", [False, True], ids=["live", "kill-9-at-receipt"])
def test_a_browser_receipt_after_acks_means_the_acks_were_applied(
    server: Serve, raws: Callable[[int], Raw], killed: bool
) -> None:
    bodies = [b"m%02d" % i for i in range(COUNT)]
    publish(raws(server.port), bodies)
    consumer = raws(server.port)
    delivered = consume_unacked(consumer, COUNT)
    assert [m.body for m in delivered] == bodies
    acked = delivered[::2]  # every other one: the kept ones are interleaved with them
    ack_then_browse(consumer, acked, "after-acks")
    if killed:
        server.kill9()
        server.restart()
    second = raws(server.port)
    kept = [m.body for m in delivered[1::2]]
    seen = browse(second, "b2")
    assert not set(seen) & {m.body for m in acked}, "a browser after the RECEIPT saw acked ones"
    assert seen == kept


def test_a_second_subscription_receipt_after_acks_means_the_acks_were_durable(
    server: Serve, raws: Callable[[int], Raw]
) -> None:
    """A second plain SUBSCRIBE to a queue this connection already consumes (it shares the
    first one's engine consumer: nothing to ask the engine) with a receipt, right after
    ACKs: the RECEIPT still waits for the ACKs to be applied and durable.  Before session
    13 it left at once, the ACKs still batched on the listener: a kill -9 as it was read
    brought acknowledged messages back."""
    bodies = [b"m%02d" % i for i in range(COUNT)]
    publish(raws(server.port), bodies)
    consumer = raws(server.port)
    delivered = consume_unacked(consumer, COUNT)
    acked = delivered[::2]
    acks = b"".join(b"ACK\nid:%s\n\n\x00" % m.header("ack").encode() for m in acked)
    again = b"SUBSCRIBE\nid:c2\nack:client-individual\ndestination:%s\nreceipt:r2\n\n\x00" % QUEUE
    consumer.send(acks + again)
    frame = consumer.next()
    assert (frame.command, frame.header("receipt-id")) == (Command.RECEIPT, "r2")
    server.kill9()
    server.restart()
    seen = browse(raws(server.port), "b2")
    assert not set(seen) & {m.body for m in acked}, "acked messages came back after the RECEIPT"
    assert seen == [m.body for m in delivered[1::2]]
