"""Batches on a persistent queue (``broker serve --data DIR``, real processes): kill -9
while producers push batches; every push the broker acknowledged is there after the
restart, once, in its producer's order."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from broker.client.blocking import Client
from tests.broker.test_durable_serve import PERSISTENT, Broker, consume

Ctx = zmq.Context[zmq.Socket[bytes]]
BATCH = 100  # pushes per push_many call


@pytest.mark.slow
def test_kill_9_mid_batch_loses_nothing_acknowledged(served: Broker, zctx: Ctx) -> None:
    broker = served
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as admin:
        admin.create_queue("orders", 1, PERSISTENT)
        # the pushes travel as batches: one ZeroMQ message, one store wait, one ack each
        assert admin.push_many("orders", 1, [b"warm-%d" % i for i in range(BATCH)]) == []
        assert admin.stats()["server"]["batched_in"] >= BATCH
    acked: dict[int, list[str]] = {0: [], 1: []}
    stop = threading.Event()

    def produce(p: int) -> None:
        client = Client(broker.endpoint, context=zctx, timeout=3, reconnect=False).connect()
        try:
            for n in range(10_000):
                if stop.is_set():
                    break
                ids = [f"p{p}-{n:05d}-{i:03d}" for i in range(BATCH)]
                # the ids travel as the payloads (push_many gives the message ids itself)
                futures = client.push_many_async("orders", 1, [mid.encode() for mid in ids])
                for mid, future in zip(ids, futures, strict=True):
                    future.result(3)  # raises once the broker is gone
                    acked[p].append(mid)
        except Exception:
            pass  # the broker died under us
        finally:
            client.close(timeout=1)

    threads = [threading.Thread(target=produce, args=(p,)) for p in acked]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(len(v) for v in acked.values()) < 600 and time.monotonic() < deadline:
        time.sleep(0.01)
    broker.kill()  # mid-batch: appends in flight, batch acknowledges held for the fsync
    stop.set()
    for t in threads:
        t.join(30)
    assert sum(len(v) for v in acked.values()) >= 600
    broker.start()
    got = [payload for _mid, payload in consume(broker.endpoint, zctx)]
    got = [g for g in got if not g.startswith("warm-")]
    assert len(got) == len(set(got))  # nothing twice
    for p, ids in acked.items():
        mine = [m for m in got if m.startswith(f"p{p}-")]
        assert mine == sorted(mine)  # in its order
        assert set(ids) <= set(mine)  # every acknowledged one
