"""``broker serve --stomp``: a producer that pipelines runs of SENDs with receipts and
vanishes (a reset, no DISCONNECT) before the broker answered them.  The broker does not
crash and keeps serving the others; what it stored is delivered exactly once, in order,
with no gap (a prefix of what was sent); nothing it receipted is lost, even across a
kill -9 and restart (persistent messages on the durable store)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command
from tests.stomp.test_listener import Raw
from tests.stomp.test_serve import Serve

#: SENDs per vanishing producer: several runs (a run ends at 1000 SENDs / 16 MiB).
_SENDS = 2500


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Serve]:
    server = Serve(tmp_path, "--data", str(tmp_path / "data"))
    yield server
    assert server.stop() == 0  # it did not crash


def connected(port: int) -> Raw:
    """A raw STOMP 1.2 client of ``port``, CONNECTED read."""
    raw = Raw(port)
    raw.connect()
    return raw


def _burst(queue: str) -> bytes:
    return b"".join(
        f"SEND\ndestination:/queue/{queue}\npersistent:true\nreceipt:r{i}\n\nm{i}\x00".encode()
        for i in range(_SENDS)
    )


def _vanish(raw: Raw) -> None:
    """Close with a reset (SO_LINGER 0): what the broker has not read yet is gone too."""
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


def drain(port: int, queue: str) -> list[bytes]:
    """Everything queued on ``queue``, up to a marker sent after it (client acks)."""
    consumer = connected(port)
    try:
        consumer.send(
            f"SUBSCRIBE\nid:s\ndestination:/queue/{queue}\nack:client-individual\n"
            "receipt:sub\n\n\x00".encode()
        )
        assert consumer.next().command is Command.RECEIPT
        consumer.send(f"SEND\ndestination:/queue/{queue}\n\nmarker\x00".encode())
        bodies: list[bytes] = []
        while True:
            frame = consumer.next()
            assert frame.command is Command.MESSAGE, frame
            consumer.send(f"ACK\nid:{frame.header('ack')}\n\n\x00".encode())
            if frame.body == b"marker":
                break
            bodies.append(frame.body)
        consumer.send(b"DISCONNECT\nreceipt:bye\n\n\x00")
        assert consumer.next().header("receipt-id") == "bye"
    finally:
        consumer.close()
    return bodies


@pytest.mark.parametrize(
    ("read_receipts", "kill9"), [(0, False), (1, False), (700, False), (700, True)]
)
def test_a_producer_that_vanishes_before_its_receipts_loses_nothing_receipted(
    durable: Serve, read_receipts: int, kill9: bool
) -> None:
    """``kill9``: the broker is then killed (kill -9, mid-burst maybe) and restarted
    before the queue is read: the receipted messages come back from its store."""
    bystander = connected(durable.port)
    bystander.send(b"SUBSCRIBE\nid:b\ndestination:/queue/calm\nreceipt:sub\n\n\x00")
    assert bystander.next().command is Command.RECEIPT
    queue = f"gone{read_receipts}"
    producer = connected(durable.port)
    producer.send(_burst(queue))
    receipted = [producer.next() for _ in range(read_receipts)]
    assert [f.header("receipt-id") for f in receipted] == [f"r{i}" for i in range(read_receipts)]
    _vanish(producer)

    # the others are served all along: the bystander's own round trip
    bystander.send(b"SEND\ndestination:/queue/calm\nreceipt:still\n\nok\x00")
    frames = [bystander.next(), bystander.next()]
    assert sorted(f.command.value for f in frames) == ["MESSAGE", "RECEIPT"]
    bystander.close()
    if kill9:
        durable.kill9()
        durable.restart()

    stored = drain(durable.port, queue)
    assert len(stored) >= read_receipts  # every receipted message is there
    assert stored == [f"m{i}".encode() for i in range(len(stored))]  # in order, no gap, once
    assert drain(durable.port, queue) == []  # delivered once: nothing comes again
