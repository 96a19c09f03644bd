"""A consumer that dies mid batch-acknowledge on a persistent queue (real processes).

The consumer takes a few hundred messages, acknowledges them all with ``ack_many`` (a
few batch frames, sent by its I/O thread) and is killed -9 at once: some of its batches
reach the broker, the rest die with it.  Whatever the broker got is gone for good; every
other message comes back, once, flagged ``Redelivered: true`` (also after a kill -9 of the
broker: an acknowledge's removal written late costs a flagged redelivery, never a loss).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from tests.broker.test_durable_serve import PERSISTENT, Broker
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
ROOT = Path(__file__).resolve().parents[2]
N = 600

# Takes the N messages and prints their ids; acknowledges the first half with ack_many
# and waits for an answer sent after them (so the broker took those); then acknowledges
# the second half with ack_many and is killed -9 straight after: mid batch-acknowledge.
CONSUMER = """
import os, signal, sys
from broker.client.blocking import Client
client = Client(sys.argv[1], timeout=10).connect()
client.join("orders")
got = []
while len(got) < int(sys.argv[2]) and (m := client.receive(timeout=10)) is not None:
    assert m.header("Redelivered") is None, m.id
    got.append(m)
print(" ".join(m.id for m in got), flush=True)
half = len(got) // 2
client.ack_many(got[:half])
client.queue_info("orders", 1)
client.ack_many(got[half:])
os.kill(os.getpid(), signal.SIGKILL)
"""


def redelivered(m: object) -> bool:
    return (m.header("Redelivered") or "").lower() == "true"  # type: ignore[attr-defined]


def drain(endpoint: str, zctx: Ctx, expect: int | None = None) -> list[tuple[str, bool]]:
    """(id, flagged redelivered) of everything waiting, each acknowledged: until
    ``expect`` came and then 0.3 s without more, else until 1.5 s without any."""
    got: list[tuple[str, bool]] = []
    with Client(endpoint, context=zctx, timeout=10).connect() as consumer:
        consumer.join("orders")
        idle = lambda: 1.5 if expect is None else (10.0 if len(got) < expect else 0.3)  # noqa: E731
        while (m := consumer.receive(timeout=idle())) is not None:
            got.append((m.id, redelivered(m)))
            consumer.ack(m)
    return got


@pytest.mark.slow  # ~5 s on a quiet machine (two broker starts), 10-30 s under load
def test_a_consumer_killed_mid_batch_acknowledge_loses_and_doubles_nothing_unflagged(
    served: Broker, zctx: Ctx
) -> None:
    broker = served
    ids = [f"m{i:04d}" for i in range(N)]
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as admin:
        admin.create_queue("orders", 1, PERSISTENT)
        futures = [admin.push_async("orders", 1, i, message_id=i) for i in ids]
        for f in futures:
            f.result(10)  # every one acknowledged by the broker: on its disk
        done = subprocess.run(
            [sys.executable, "-c", CONSUMER, broker.endpoint, str(N)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert done.returncode == -9, done.stderr[-2000:]
        taken = done.stdout.split()
        assert sorted(taken) == ids  # it had them all when it acknowledged

        info = lambda: admin.queue_info("orders", 1)  # noqa: E731
        # the broker notices the death, puts back what it holds unacknowledged
        assert wait_until(lambda: info()["PendingAcknowledges"] == 0, 30.0), info()
        acked = int(info()["Acks"])
        waiting = int(info()["Messages"])
        assert acked + waiting == N, info()  # each one removed or back: none lost
        assert acked >= N // 2  # the first half surely, some of the second maybe

    back = drain(broker.endpoint, zctx, waiting)
    assert len(back) == waiting
    assert not {mid for mid, _ in back} & set(taken[: N // 2])  # acknowledged: gone
    assert len({mid for mid, _ in back}) == len(back)  # once each
    assert all(flag for _mid, flag in back), [m for m, f in back if not f][:5]

    broker.kill()  # removals not yet written come back, flagged
    broker.start()
    again = drain(broker.endpoint, zctx)
    assert len({mid for mid, _ in again}) == len(again)
    assert all(flag for _mid, flag in again), [m for m, f in again if not f][:5]
    assert {mid for mid, _ in again} <= set(ids)
