"""The adversary's review (session 22, adv22): ``broker serve --data DIR --stomp`` killed
(-9) while an ``ack:auto`` consumer drains a backlog of persistent messages mixed with
transient ones (the transient ones of the door's own ids leave as AUTO deliveries,
``Dispatcher.send_run``; the persistent ones stay tracked).

What "taken" promises for ``ack:auto`` (docs/stomp.md, "What is guaranteed"): a delivery
is acknowledged when the listener hands it to the connection's output.  After a RECEIPT
on a later frame (DISCONNECT's) those acknowledges are durable: a restart brings back
exactly the persistent messages never taken, in order, none twice.  Killed with no such
RECEIPT, every persistent message never taken comes back and, of those taken, the ones
whose removal was not yet on disk may come back too (at least once, never lost)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command
from tests.stomp.test_adversary_restart_ids import Durable
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve_gone import drain

QUEUE = "killdrain"
COUNT = 400  # messages in the backlog, every third one persistent
BODY = 2000  # octets each: the backlog is more than the consumer's connection holds


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Durable]:
    server = Durable(tmp_path)
    yield server
    server.stop()


def _body(i: int) -> bytes:
    return b"%06d-" % i + b"." * (BODY - 7)


def _persistent(i: int) -> bool:
    return i % 3 == 0


def _backlog(port: int) -> None:
    """``COUNT`` SENDs to the queue (no consumer yet), the last one with a receipt."""
    producer = Raw(port)
    try:
        producer.connect()
        parts = []
        for i in range(COUNT):
            flag = "persistent:true\n" if _persistent(i) else ""
            receipt = "receipt:all\n" if i == COUNT - 1 else ""
            head = f"SEND\ndestination:/queue/{QUEUE}\n{flag}{receipt}content-length:{BODY}\n\n"
            parts.append(head.encode() + _body(i) + b"\x00")
        producer.send(b"".join(parts))
        assert producer.next().header("receipt-id") == "all"
    finally:
        producer.close()


def _subscribed(port: int) -> Raw:
    consumer = Raw(port, rcvbuf=4096)
    consumer.connect()
    consumer.send(f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\n\n\x00".encode())
    return consumer


def _number(body: bytes) -> int:
    return int(body[:6])


def _drain(port: int) -> list[int]:
    """The numbers of what the queue holds, in order (client-individual acks, up to a
    marker sent after the SUBSCRIBE's RECEIPT)."""
    return [_number(body) for body in drain(port, QUEUE)]


@pytest.mark.parametrize("read", [0, 50, 200])
def test_kill_9_after_a_disconnect_receipt_brings_back_exactly_the_untaken(
    durable: Durable, read: int
) -> None:
    """The consumer reads ``read`` MESSAGEs, sends DISCONNECT with a receipt and reads
    everything up to the RECEIPT (what was taken: nothing is written after it); the
    broker is killed; restarted, the queue holds exactly the persistent messages the
    consumer never got, in order."""
    _backlog(durable.port)
    consumer = _subscribed(durable.port)
    try:
        got = [_number(consumer.next().body) for _ in range(read)]
        consumer.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        while True:
            frame = consumer.next()
            if frame.command is Command.RECEIPT:
                assert frame.header("receipt-id") == "bye"
                break
            assert frame.command is Command.MESSAGE, frame
            got.append(_number(frame.body))
    finally:
        consumer.close()
    durable.kill9()
    durable.restart()
    assert got == list(range(len(got)))  # taken: a prefix of the backlog, in order
    back = _drain(durable.port)
    assert back == [i for i in range(len(got), COUNT) if _persistent(i)]


@pytest.mark.parametrize("read", [0, 50, 200])
def test_kill_9_mid_drain_loses_no_persistent_message(durable: Durable, read: int) -> None:
    """Killed while the consumer reads (no receipt): every persistent message it did not
    read comes back, in order, once; of those it read, only some may."""
    _backlog(durable.port)
    consumer = _subscribed(durable.port)
    try:
        got = [_number(consumer.next().body) for _ in range(read)]
        durable.kill9()
        with contextlib.suppress(AssertionError, OSError):  # (reset or closed)
            while True:
                got.append(_number(consumer.next().body))
    finally:
        consumer.close()
    durable.restart()
    assert got == list(range(len(got)))
    back = _drain(durable.port)
    assert back == sorted(set(back))  # in order, once
    unread = [i for i in range(len(got), COUNT) if _persistent(i)]
    assert back[len(back) - len(unread) :] == unread
    assert all(_persistent(i) and i < len(got) for i in back[: len(back) - len(unread)])


def test_include_seq_with_ack_auto_after_a_restart_numbers_on(durable: Durable) -> None:
    """``ack:auto`` with ``include-seq`` after a kill -9 and restart: the restored
    messages keep their numbers and the new ones (AUTO deliveries and a backlog's) are
    numbered after them -- every MESSAGE numbered, in order, no number twice."""
    _backlog(durable.port)
    durable.kill9()
    durable.restart()
    kept = COUNT // 3 + (COUNT % 3 > 0)  # the persistent ones
    consumer = Raw(durable.port)
    producer = Raw(durable.port)
    try:
        consumer.connect()
        producer.connect()
        consumer.send(
            f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\ninclude-seq:seq\n"
            "receipt:sub\n\n\x00".encode()
        )
        frames = []
        while True:  # (the backlog's MESSAGEs may come before the RECEIPT)
            frame = consumer.next()
            if frame.command is Command.RECEIPT:
                break
            frames.append(frame)
        new = 50
        producer.send(
            b"".join(
                f"SEND\ndestination:/queue/{QUEUE}\n\nnew-{i}\x00".encode() for i in range(new)
            )
        )
        while len(frames) < kept + new:
            frames.append(consumer.next())
    finally:
        consumer.close()
        producer.close()
    assert all(f.command is Command.MESSAGE for f in frames)
    bodies = [f.body for f in frames]
    assert bodies[:kept] == [_body(i) for i in range(COUNT) if _persistent(i)]
    assert bodies[kept:] == [b"new-%d" % i for i in range(new)]
    seqs = [int(f.header("seq") or 0) for f in frames]
    assert seqs[:kept] == [i + 1 for i in range(COUNT) if _persistent(i)]
    first = seqs[kept]  # (after the restored ones; numbers of transient ones lost
    assert first > seqs[kept - 1]  # with the process may or may not be used again)
    assert seqs[kept:] == list(range(first, first + new))
