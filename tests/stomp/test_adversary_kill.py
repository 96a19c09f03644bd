"""The adversary's review: ``broker serve --data DIR --stomp`` killed (-9) in the middle of
a producer's persistent streaks (session 21, adv21).

The producer pipelines streaks of ``persistent:true`` SENDs of one head (bodies21's
``SendStreak`` -> one ``publish_many`` per run), each followed by a SEND asking for a
receipt, and reads its RECEIPTs as they come; after the ``KILL_AFTER``-th the broker is
killed at once.  After a restart on the same store every SEND up to the last one
receipted is there; what survives is a prefix of what was sent (in order, no gap, once)
and is delivered once."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.stomp.frames import Command
from tests.polling import WAIT
from tests.stomp.test_serve import Serve
from tests.stomp.test_serve_gone import connected, drain

STREAKS = 40
STREAK = 100  # persistent SENDs of one head, then one with a receipt


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Serve]:
    server = Serve(tmp_path, "--data", str(tmp_path / "data"))
    yield server
    server.stop()


def _body(i: int) -> bytes:
    return b"p%06d" % i


def _stream(queue: str) -> bytes:
    head = f"SEND\ndestination:/queue/{queue}\npersistent:true\ncontent-length:7\n\n".encode()
    parts = []
    n = 0
    for s in range(STREAKS):
        for _ in range(STREAK):
            parts.append(head + _body(n) + b"\x00")
            n += 1
        parts.append(
            f"SEND\ndestination:/queue/{queue}\npersistent:true\nreceipt:r{s}\n\n".encode()
            + _body(n)
            + b"\x00"
        )
        n += 1
    return b"".join(parts)


@pytest.mark.parametrize(
    "kill_after",
    [
        1,
        pytest.param(STREAKS // 2, marks=pytest.mark.slow),
        pytest.param(STREAKS - 1, marks=pytest.mark.slow),
    ],
)
def test_kill_9_mid_streaks_keeps_every_receipted_send(durable: Serve, kill_after: int) -> None:
    producer = connected(durable.port)
    receipts: list[str] = []
    killed = threading.Event()

    def read_receipts() -> None:
        try:
            while len(receipts) < kill_after:
                frame = producer.next()
                assert frame.command is Command.RECEIPT, frame
                receipts.append(frame.header("receipt-id") or "")
            durable.kill9()  # at once: no time to write more after this RECEIPT
        finally:
            killed.set()

    reader = threading.Thread(target=read_receipts)
    reader.start()
    with contextlib.suppress(OSError):  # (killed while the stream was still going out)
        producer.send(_stream("killed"))
    assert killed.wait(WAIT)
    reader.join(WAIT)
    producer.close()
    assert receipts == [f"r{s}" for s in range(kill_after)]
    durable.restart()
    stored = drain(durable.port, "killed")
    receipted = kill_after * (STREAK + 1)  # every SEND up to the last receipt
    assert len(stored) >= receipted
    assert stored == [_body(i) for i in range(len(stored))]  # a prefix: in order, once
    assert drain(durable.port, "killed") == []  # delivered once
