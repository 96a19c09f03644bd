"""Engine-only cost of push -> deliver (no sockets, no codec): what the broker adds.

Plain pushes into push and round-robin queues take the engine's fast path
(``Queue.push_plain``); the "general path" row turns it off for comparison.

Each case runs in its own process so garbage from one does not slow the next.  The
baseline is the cheapest conceivable dispatcher (a dict lookup and a list append per
message), measured in the same run.  Deliveries are reported sent to the engine
(flow control) every ``REPORT_EVERY`` pushes, as the server does; the "consumer behind"
row reports every 10,000 pushes, so the consumer's window (1,000) is full most of the
time and messages wait in the queue: what flow control costs with a slow consumer.

Rates are given by wall time and by the process's CPU time (``time.process_time``) over
the timed loop: on a shared machine the CPU column is the one to compare.

Usage: ``python bench/bench_engine.py [--messages N]`` (default 200,000; use a small N
for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from typing import Any

SIZE = 100
#: Pushes between two reports of sent deliveries (``Engine.transmitted``): the server
#: reports every 256 received messages during a socket drain.
REPORT_EVERY = 256


def _case(name: str, n: int, queue: dict[str, Any], source: str, producer_ack: bool,
          consumer_ack: bool, general: bool = False,
          report_every: int = 0) -> tuple[float, float]:  # fmt: skip
    from broker import tmqp
    from broker.engine.delivery import DefaultDeliveryHandler
    from broker.engine.engine import Engine
    from broker.protocol import ConnectionInfo, Header, MessageType, Operation, Tracked

    class GeneralPath(DefaultDeliveryHandler):
        """The default behaviour without the fast push path (Queue.push_plain)."""

        def received_from_producer(self, queue: Any, message: Any, sender: Any) -> Any:
            return super().received_from_producer(queue, message, sender)

    engine = Engine(handler=GeneralPath() if general else None)
    producer, _ = engine.connect(ConnectionInfo(client_id="prod"), 0.0)
    consumer, _ = engine.connect(ConnectionInfo(client_id="cons"), 0.0)
    join = tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.JOIN,
                      target="ch", message_id="j")  # fmt: skip
    engine.receive(consumer, join, 0.0)
    if queue:
        create = tmqp.Frame(message_type=MessageType.SERVER, content_type=Operation.QUEUE_CREATE,
                            target="ch", message_id="q", headers=((Header.QUEUE_ID, "1"),),
                            payload=json.dumps(queue).encode())  # fmt: skip
        engine.receive(producer, create, 0.0)
    payload = b"x" * SIZE
    pushes = [
        tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, target="ch",
                   message_id=f"m{i}", source=source, payload=payload, pending_ack=producer_ack)
        for i in range(n)
    ]  # fmt: skip
    acks = [
        tmqp.Frame(message_type=MessageType.ACK, content_type=1, target="ch", message_id=f"m{i}")
        for i in range(n)
    ]
    receive = engine.receive
    transmitted = engine.transmitted
    out = 0
    sent = 0  # the consumer's tracked deliveries since the last report, as the server counts

    def tracked(outs: list[Any]) -> int:
        return sum(1 for o in outs if type(o) is Tracked and o.client_id == consumer)

    start, cpu = time.perf_counter(), time.process_time()
    if consumer_ack:
        for i, (push, ack) in enumerate(zip(pushes, acks, strict=True)):
            outs = receive(producer, push, 1.0)
            out += len(outs)
            sent += tracked(outs)
            if not i % REPORT_EVERY:
                outs = transmitted({consumer: sent}, 1.0)
                out += len(outs)
                sent = tracked(outs)
            outs = receive(consumer, ack, 1.0)
            out += len(outs)
            sent += tracked(outs)
    else:
        every = report_every or REPORT_EVERY
        for i, push in enumerate(pushes):
            outs = receive(producer, push, 1.0)
            out += len(outs)
            sent += tracked(outs)
            if not i % every:
                outs = transmitted({consumer: sent}, 1.0)
                out += len(outs)
                sent = tracked(outs)
        while sent:  # a consumer behind: what waited in the queue goes out now
            outs = transmitted({consumer: sent}, 1.0)
            out += len(outs)
            sent = tracked(outs)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out >= n, (name, out)
    return elapsed, cpu


def _baseline(n: int) -> tuple[float, float]:
    from broker import tmqp

    routes = {"ch": ["cons"]}
    frames = [tmqp.Frame(message_type=0x11, content_type=1, target="ch", message_id=f"m{i}",
                         payload=b"x" * SIZE) for i in range(n)]  # fmt: skip
    out: list[tuple[str, tmqp.Frame]] = []
    start, cpu = time.perf_counter(), time.process_time()
    for frame in frames:
        for client in routes[frame.target]:
            out.append((client, frame))
    return time.perf_counter() - start, time.process_time() - cpu


CASES: list[tuple[Any, ...]] = [
    ("push queue (producer stamps its id as source)", {}, "prod", False, False, False),
    ("  same, general path (fast push path off)", {}, "prod", False, False, True),
    ("push queue (empty source: frame rebuilt)", {}, "", False, False, False),
    ("push queue, producer ack on receipt", {}, "prod", True, False, False),
    ("round-robin queue", {"Status": 2}, "prod", False, False, False),
    ("broadcast queue", {"Status": 0}, "prod", False, False, False),
    ("push queue, consumer ack (RequestAcknowledge)", {"RequestAcknowledge": True}, "prod",
     False, True, False),
    ("push queue, consumer behind (window full, queued)", {}, "prod", False, False, False,
     10_000),
]  # fmt: skip


def _run(target: Any, *args: Any) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        result: tuple[float, float] = pool.apply(target, args)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    n = parser.parse_args().messages
    base = _run(_baseline, n)
    rows = [("baseline: dict lookup + append", base)]
    for name, *args in CASES:
        rows.append((name, _run(_case, name, n, *args)))
    print(f"\nengine only, {n:,} messages of {SIZE} bytes")
    print(f"{'case':50s} {'msgs/s':>12s} {'us/msg':>8s} {'CPU msgs/s':>12s} {'CPU us':>8s}")
    print("-" * 94)
    for name, (elapsed, cpu) in rows:
        print(f"{name:50s} {n / elapsed:12,.0f} {elapsed / n * 1e6:8.2f} "
              f"{n / cpu:12,.0f} {cpu / n * 1e6:8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
