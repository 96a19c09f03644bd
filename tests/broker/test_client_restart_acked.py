"""A producer's acknowledged 4 KiB pushes through a broker killed -9 and restarted (real
processes; the client's outbox batches, session 16).

The threaded client queues ``push_async``'s frames with their message ids and packs its
batches into one buffer it reuses; a session lost in the middle of a batch and the new
one after the restart must not mix them up:

* every future ends: acknowledged, its value the ACK of its own message id, or failed
  with a ``ClientError`` (the loss, or no answer in time);
* the same client goes on pushing once it reconnected, and what it pushes then is
  acknowledged;
* every acknowledged push is in the queue once with its own bytes, and nothing is there
  twice or that was never pushed.

Every wait is a deadline polled for.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future
from typing import Any

import zmq

from broker.client.blocking import Client
from broker.client.errors import ClientError
from tests.broker.test_acked_4k import body
from tests.broker.test_durable_serve import PERSISTENT, Broker
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
#: pushes in flight (the outbox gathers them into batches)
WINDOW = 48
#: acknowledged pushes before the kill, and after the restart
BEFORE, AFTER = 150, 150


class Tally:
    """The producer's pushes in flight and how each ended."""

    def __init__(self) -> None:
        self.inflight: deque[tuple[str, Future[Any]]] = deque()
        self.pushed: set[str] = set()
        self.acked: list[str] = []
        self.failed: list[str] = []

    def settle_oldest(self) -> None:
        mid, future = self.inflight.popleft()
        try:
            answer = future.result(60)  # (the client's own timeout ends it sooner)
        except ClientError:
            self.failed.append(mid)
            return
        assert answer.message_id == mid, f"{mid} settled by the ACK of {answer.message_id}"
        self.acked.append(mid)


def queued(endpoint: str, zctx: Ctx, expect: set[str]) -> dict[str, int]:
    """How many times each message id is in the queue (each one taken and acknowledged),
    its bytes checked: once ``expect`` came and the queue is empty."""
    got: dict[str, int] = {}
    with Client(endpoint, context=zctx, timeout=20).connect() as consumer:
        consumer.join("big")

        def drained() -> bool:
            m = consumer.receive(timeout=0.5)
            if m is not None:
                assert bytes(m.payload) == body(m.id), f"{m.id}: the bytes changed"
                got[m.id] = got.get(m.id, 0) + 1
                consumer.ack(m)
                return False
            if not expect <= got.keys():
                return False
            info = consumer.queue_info("big", 1)
            return info["Messages"] == 0 and info["PendingAcknowledges"] == 0

        assert wait_until(drained, 120, step=0), f"the queue never emptied ({len(got)} taken)"
    return got


def test_a_producer_pushing_through_a_kill_9_and_restart_keeps_its_acknowledges_straight(
    served: Broker, zctx: Ctx
) -> None:
    with Client(served.endpoint, context=zctx, timeout=10).connect() as admin:
        admin.create_queue("big", 1, PERSISTENT)
    client = Client(
        served.endpoint, context=zctx, timeout=10, ping_interval=0.3, peer_timeout=2.0,
        backoff=(0.05, 0.2),
    )  # fmt: skip
    client.connect()
    tally = Tally()
    restarted_at = -1  # acknowledged pushes when the broker was restarted
    deadline = time.monotonic() + 240
    try:
        n = 0
        while restarted_at < 0 or len(tally.acked) < restarted_at + AFTER:
            assert time.monotonic() < deadline, f"stuck: {len(tally.acked)} acknowledged"
            if len(tally.inflight) >= WINDOW:
                tally.settle_oldest()
            if restarted_at < 0 and len(tally.acked) >= BEFORE:
                served.kill()  # (batches in flight, in the outbox, being packed)
                served.start()
                restarted_at = len(tally.acked)
            mid = f"p-{n}"
            n += 1
            tally.pushed.add(mid)
            tally.inflight.append((mid, client.push_async("big", 1, body(mid), message_id=mid)))
        while tally.inflight:
            tally.settle_oldest()
        assert wait_until(lambda: client.connected, 30)
    finally:
        client.close()
    got = queued(served.endpoint, zctx, set(tally.acked))
    assert not (got.keys() - tally.pushed), "the queue holds ids nobody pushed"
    twice = [mid for mid, count in got.items() if count != 1]
    assert not twice, f"pushes in the queue more than once: {twice[:3]}"
    assert len(tally.acked) + len(tally.failed) == len(tally.pushed)
    assert tally.failed, "the kill failed no push: it did not hit the traffic"
