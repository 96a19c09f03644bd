"""Issue 10, through a real ``broker serve --data DIR``: a byte flipped in the middle of
the log (not its tail) costs that record only, and the broker says where.

The store-level twins (every offset, garbage, bad headers) are in
``tests/broker/store/test_corruption.py``; ``test_durable_serve.py`` cuts the tail.  Here
the whole broker: acknowledged pushes, kill -9, one byte of one message's payload
flipped on disk, restart: one warning line naming the segment file and an offset at or
before the flipped byte, every other message back once and in order, and the broker
serves the queue on (a new push saved and consumed).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import zmq

from broker.client.blocking import Client
from tests.broker.test_durable_serve import consume, push_acked
from tests.broker.test_full_disk_runs import _serve
from tests.ports import free_port

N = 50
VICTIM = 25  # the message whose record is damaged
DAMAGE = re.compile(r"segment (\S+) offset (\d+)")


def _flip(data: Path, needle: bytes) -> tuple[str, int]:
    """Flip one byte of ``needle`` where it lies in the log: (segment file, position)."""
    found = [(p, p.read_bytes().find(needle)) for p in sorted(data.glob("*.seg"))]
    hits = [(p, at) for p, at in found if at >= 0]
    assert len(hits) == 1, hits
    path, at = hits[0]
    at += len(needle) // 2
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    return path.name, at


def test_a_flipped_byte_mid_log_loses_that_message_only_and_is_named(
    tmp_path: Path, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    data = tmp_path / "data"
    proc = _serve(endpoint, data, tmp_path / "first.log")
    try:
        acked = push_acked(endpoint, zctx, N)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    segment, at = _flip(data, f"payload-{VICTIM}".encode())
    log = tmp_path / "second.log"  # (its own file: _serve waits for its ready line)
    proc = _serve(endpoint, data, log)
    try:
        said = log.read_text()
        named = [(m.group(1), int(m.group(2))) for m in DAMAGE.finditer(said)]
        assert len(named) == 1, said  # one line, for the one damaged record
        assert named[0][0] == segment and named[0][1] <= at
        got = consume(endpoint, zctx)
        assert [mid for mid, _ in got] == [m for i, m in enumerate(acked) if i != VICTIM]
        assert all(payload == f"payload-{int(mid[1:])}" for mid, payload in got)
        with Client(endpoint, context=zctx, timeout=10).connect() as producer:
            producer.push("orders", 1, "after", ack=True, message_id="after")
        assert consume(endpoint, zctx) == [("after", "after")]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
