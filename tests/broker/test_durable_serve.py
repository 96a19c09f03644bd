"""``broker serve --data DIR``: persistent queues survive kill -9 (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from tests.broker.test_cli import start_serve
from tests.ports import free_port
from tests.variants import variants

PERSISTENT = {"MessageDeliveryHandler": "persistent", "RequestAcknowledge": True, "Tag": "kept"}
N = 200


class Broker:
    """One ``broker serve --data DIR`` process, restartable on the same directory."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_serve("--bind", self.endpoint, "--data", str(self.data))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(10) == 0
        self.proc = None


@pytest.fixture
def broker(served: Broker) -> Broker:
    return served  # (tests/broker/conftest.py)


def push_acked(endpoint: str, zctx: zmq.Context[zmq.Socket[bytes]], n: int) -> list[str]:
    """Create the persistent queue, push ``n`` messages; the ids the broker acknowledged."""
    with Client(endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("orders", 1, PERSISTENT)
        futures = [
            producer.push_async("orders", 1, f"payload-{i}", message_id=f"m{i:04d}")
            for i in range(n)
        ]
        for f in futures:
            f.result(10)  # raises on a negative acknowledge
    return [f"m{i:04d}" for i in range(n)]


def consume(
    endpoint: str, zctx: zmq.Context[zmq.Socket[bytes]], idle: float = 1.5
) -> list[tuple[str, str]]:
    """Join and take (and acknowledge) everything: until ``idle`` seconds pass without a
    message and the queue says it holds none (a slow machine's pause is not the end);
    (id, payload) in arrival order."""
    got: list[tuple[str, str]] = []
    deadline = time.monotonic() + 120
    info: dict[str, Any] = {}
    with Client(endpoint, context=zctx, timeout=10).connect() as consumer:
        consumer.join("orders")
        while time.monotonic() < deadline:
            m = consumer.receive(timeout=idle)
            if m is not None:
                got.append((m.id, bytes(m.payload).decode()))
                consumer.ack(m)
                continue
            info = consumer.queue_info("orders", 1)
            if info["Messages"] == 0 and info["PendingAcknowledges"] == 0:
                break
    assert info.get("Messages") == 0 and info.get("PendingAcknowledges") == 0
    return got


def test_acked_messages_survive_kill_9_in_order_and_consumed_ones_stay_gone(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    acked = push_acked(broker.endpoint, zctx, N)
    broker.kill()
    broker.start()
    got = consume(broker.endpoint, zctx)
    assert [mid for mid, _ in got] == acked  # every one, once, in order
    assert all(payload == f"payload-{int(mid[1:])}" for mid, payload in got)
    broker.stop()  # the acknowledges' removals are written on a clean stop
    broker.start()
    assert consume(broker.endpoint, zctx, idle=0.5) == []
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as producer:
        # the queue came back with its options, not as an auto-created default queue
        info = producer.queue_info("orders", 1)
        assert info["Tag"] == "kept" and info["RequestAcknowledge"] is True
        producer.push("orders", 1, "after", ack=True, message_id="late")
    broker.kill()  # the recovered queue is still persistent
    broker.start()
    assert consume(broker.endpoint, zctx) == [("late", "after")]


def test_torn_tail_keeps_every_intact_record(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    acked = push_acked(broker.endpoint, zctx, N)
    broker.kill()
    segments = sorted(p for p in broker.data.glob("*.seg") if p.stat().st_size > 64)
    newest = segments[-1]
    data_end = len(newest.read_bytes().rstrip(b"\0"))  # (zeros the writer put ahead)
    with newest.open("r+b") as f:  # a crash mid-write: the last record is cut short
        f.truncate(data_end - 10)
    broker.start()
    got = [mid for mid, _ in consume(broker.endpoint, zctx)]
    assert got == acked[:-1]  # the torn last message is gone, every intact one is back


def test_a_data_directory_in_use_or_unusable_is_one_line_exit_1(
    broker: Broker, tmp_path: Path
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    for data in (broker.data, a_file):
        other = f"tcp://127.0.0.1:{free_port()}"
        proc = subprocess.run(
            [sys.executable, "-m", "broker", "serve", "--bind", other, "--data", str(data)],
            capture_output=True,
            timeout=30,
        )
        assert proc.returncode == 1
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and "serve --data" in lines[0], lines


@pytest.mark.slow
def test_kill_9_mid_push_from_several_producers_loses_nothing_acked(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """Four producers push with acknowledges; the broker is killed while they push.
    After the restart every acknowledged message is there once, each producer's in its
    order, and nothing that was never pushed."""
    kill_mid_push(broker, zctx, 800)


@pytest.mark.slow
@pytest.mark.parametrize("seed", variants(chosen=range(3), every=range(8)))  # tests/variants.py
def test_kill_9_mid_push_at_random_points(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]], seed: int
) -> None:
    import random

    kill_mid_push(broker, zctx, random.Random(seed).randrange(1, 3000))


def test_kill_9_after_acks_of_single_pushes_taken_as_runs_loses_nothing_acked(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """As above, each producer sending every push alone (client ``batch=0``, no TMQP
    batches): the server reads several of a producer in one drain and hands them to the
    engine as one run (``Engine.receive_pushes``, counted in its ``run_pushes``), each
    answered with its own acknowledge once the drain's saves are durable.  Every
    acknowledged one is back after the kill -9, once, in its producer's order."""
    assert kill_mid_push(broker, zctx, 800, batch=0) > 0  # runs were served before the kill


def test_kill_9_mid_push_of_4_kib_pushes_loses_nothing_acked(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    """4 KiB pushes, 64 in flight per producer (the benchmark's window): drains of ~1 MiB
    whose records the log's writer sends with one ``pwritev`` of their own parts, durable
    in the same call (``RWF_DSYNC``).  Killed mid-push: every acknowledged one is back,
    once, intact, in its producer's order."""
    kill_mid_push(broker, zctx, 1500, size=4096, window=64)  # (its checks: see there)


def kill_mid_push(
    broker: Broker,
    zctx: zmq.Context[zmq.Socket[bytes]],
    kill_after: int,
    size: int = 100,
    window: int = 16,
    **client: Any,
) -> int:
    """Kill the broker once ``kill_after`` pushes were acknowledged; check the restart.
    ``size``: payload octets; ``window``: pushes each producer keeps unacknowledged;
    ``client``: the producers' client options.  Returns the pushes the server had served
    in drain runs (its ``run_pushes``) once the acknowledges were counted."""
    import threading
    from collections import deque

    with Client(broker.endpoint, context=zctx, timeout=10).connect() as admin:
        admin.create_queue("orders", 1, PERSISTENT)
    acked: dict[int, list[str]] = {p: [] for p in range(4)}
    stop = threading.Event()

    def produce(p: int) -> None:
        client = Client(broker.endpoint, context=zctx, timeout=3, reconnect=False,
                        **client_options).connect()  # fmt: skip
        inflight: deque[tuple[str, Any]] = deque()
        try:
            for i in range(100_000):
                if stop.is_set():
                    break
                if len(inflight) >= window:
                    mid, future = inflight.popleft()
                    future.result(3)
                    acked[p].append(mid)
                mid = f"p{p}-{i:06d}"
                payload = mid.encode().ljust(size, b"x")
                inflight.append((mid, client.push_async("orders", 1, payload, message_id=mid)))
        except Exception:
            pass  # the broker died under us
        finally:
            client.close(timeout=1)

    client_options = client
    threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(len(v) for v in acked.values()) < kill_after and time.monotonic() < deadline:
        time.sleep(0.01)
    with Client(broker.endpoint, context=zctx, timeout=10).connect() as admin:
        counters = admin.stats()["server"]
    served_in_runs = int(counters["run_pushes"])
    broker.kill()  # mid-push: appends in flight, acks held, fsyncs pending
    stop.set()
    for t in threads:
        t.join(30)
    assert sum(len(v) for v in acked.values()) >= kill_after
    broker.start()
    consumed = consume(broker.endpoint, zctx)
    got = [mid for mid, _ in consumed]
    assert len(got) == len(set(got))  # nothing twice
    assert all(m[:3] in ("p0-", "p1-", "p2-", "p3-") for m in got)  # nothing invented
    for p, ids in acked.items():
        mine = [m for m in got if m.startswith(f"p{p}-")]
        assert mine == sorted(mine)  # in its order
        assert set(ids) <= set(mine)  # every acknowledged one
        pushed_up_to = (int(ids[-1].split("-")[1]) if ids else -1) + window
        assert all(int(m.split("-")[1]) <= pushed_up_to for m in mine)
    assert all(payload == mid.ljust(size, "x") for mid, payload in consumed)  # intact
    return served_in_runs
