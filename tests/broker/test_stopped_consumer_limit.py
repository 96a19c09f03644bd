"""A consumer process whose client is frozen (SIGSTOP: its I/O thread reads nothing, acks
nothing) while its persistent queue fills to its ``MessageLimit`` on a ``broker serve
--data DIR`` process.

The consumer holds its window (``Prefetch``) of unacknowledged deliveries; the queue keeps
at most ``MessageLimit`` messages (the limit holds, whatever the consumer does); past it
every acknowledged push is refused with LimitExceeded (482, docs/broker.md "Limits") and nothing
else changes.  Once the consumer resumes (SIGCONT) it reads and acknowledges every push
that was acknowledged to the producer, once each, in order, and none that was refused;
the refusals lift as the queue drains.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client, RemoteError
from broker.protocol import ResultCode
from tests.broker.test_cli import start_serve
from tests.broker.test_durable_serve import PERSISTENT
from tests.broker.test_flow_live import StoppedConsumer
from tests.polling import WAIT, wait_until
from tests.ports import free_port

Ctx = zmq.Context[zmq.Socket[bytes]]
LIMIT = 150
PREFETCH = 20
#: Pushes tried after the first refusal, all refused while the consumer is stopped.
MORE = 40
#: A persistent queue (the producer's acknowledge: once saved; the consumer acknowledges
#: each delivery), at most LIMIT messages, PREFETCH deliveries in flight per consumer.
OPTIONS = {**PERSISTENT, "Status": 1, "MessageLimit": LIMIT, "Prefetch": PREFETCH}


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[str]:
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = start_serve("--bind", address, "--data", str(tmp_path / "data"))
    yield address
    proc.kill()
    proc.wait(WAIT)
    if proc.stderr is not None:
        proc.stderr.close()


def push(producer: Client, i: int) -> bool:
    """An acknowledged push of index ``i``: True if acknowledged, False if refused as over
    the queue's limit (any other failure fails the test)."""
    try:
        producer.push_async("full", 1, b"%d" % i).result(WAIT * 3)
    except RemoteError as exc:
        assert exc.code == ResultCode.LIMIT_EXCEEDED, exc
        return False
    return True


def test_a_frozen_consumer_and_a_full_queue_refuse_then_lose_nothing_acked(
    endpoint: str, zctx: Ctx, tmp_path: Path
) -> None:
    consumer: StoppedConsumer | None = None
    with Client(endpoint, context=zctx, timeout=WAIT * 3).connect() as producer:
        try:
            producer.create_queue("full", 1, OPTIONS)
            consumer = StoppedConsumer(endpoint, "full", tmp_path / "full.log", ack=True)
            assert wait_until(
                lambda: consumer.log.exists() and b"joined" in consumer.log.read_bytes(), WAIT * 3
            )
            acked = [i for i in range(10) if push(producer, i)]
            assert acked == list(range(10))
            consumer.stop_after(10)  # (read and acknowledged them, then frozen)

            i = 10
            while push(producer, i):  # until the queue is full
                acked.append(i)
                i += 1
                assert i < 10 + LIMIT + PREFETCH + 10, "the limit never refused a push"
            refused = [i] + [j for j in range(i + 1, i + 1 + MORE) if not push(producer, j)]
            assert refused == list(range(i, i + 1 + MORE))  # every one while it is frozen
            info = producer.queue_info("full", 1)
            # the limit holds: LIMIT waiting, a full window in flight (the last of the
            # first ten may still be among them: its ack not sent when it froze)
            assert (info["Messages"], info["InFlight"]) == (LIMIT, PREFETCH), info
            assert len(acked) in (10 + PREFETCH + LIMIT, 10 + PREFETCH + LIMIT - 1)

            os.kill(consumer.proc.pid, signal.SIGCONT)
            assert wait_until(lambda: len(consumer.logged()) >= len(acked), WAIT * 3)
            after = i + 1 + MORE  # the queue drained: pushes are taken again
            assert wait_until(lambda: push(producer, after), WAIT * 3)
            acked.append(after)
            assert wait_until(lambda: consumer.logged()[-1:] == [after], WAIT * 3)
            assert consumer.logged() == acked  # every acknowledged push, once, in order
            assert not set(refused) & set(consumer.logged())
            assert wait_until(lambda: producer.queue_info("full", 1)["InFlight"] == 0, WAIT * 3)
            assert consumer.proc.poll() is None  # (still running: it read all of it)
        finally:
            if consumer is not None and consumer.proc.poll() is None:
                os.kill(consumer.proc.pid, signal.SIGCONT)
                consumer.kill()
