"""Selector starvation: what a selected message costs behind many that nobody selects.

A queue with the ``per-message`` handler and one consumer whose selector takes only
``kind = a`` holds N messages nobody selects (pushed first); then 1,000 selected
messages are pushed, each received and acknowledged.  Printed per N: the selected
messages delivered, CPU and wall microseconds per selected message, and selector calls
per selected message.  Before the queue set such messages aside, a message behind more
than ``LOOK_PAST_LIMIT`` (1,000) of them was never delivered and every push cost ~1,000
selector calls; now the cost should not grow with N.

A second table, the pass-over sel6 found: a queue with a window of one delivery per
consumer, ``full`` (no selector) and ``picky`` (selects ``kind = red``, one in 1,000);
N messages wait, ``full`` takes them one slot at a time (each acknowledge a drain).
Printed per N: delivered, CPU microseconds per message and ``picky``'s selector calls
per message.  Before the messages waiting for room had per-consumer cursors, each drain
asked about up to ``LOOK_PAST_LIMIT`` waiting messages again (O(n^2) overall).

Usage: ``python bench/bench_selectors.py [--sizes 1000,10000,100000] [--full-sizes
1000,10000]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence


def run(unselected: int, selected: int = 1000) -> tuple[int, float, float, float, float]:
    from broker.engine.delivery import PerMessageDeliveryHandler
    from broker.engine.per_message import PER_MESSAGE
    from broker.protocol import MessageType, QueueStatus
    from tests.broker.engine_kit import Kit

    calls = [0]

    def selects(headers: Sequence[tuple[str, str]]) -> bool:
        calls[0] += 1
        return dict(headers).get("kind") == "a"

    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
              message_delivery_handler=PER_MESSAGE)  # fmt: skip
    consumer = kit.connect("c")
    kit.join(consumer, "ch")
    handler.rules.set_selector("ch", consumer, selects)  # type: ignore[arg-type]
    fill_start = time.process_time()
    for i in range(unselected):
        kit.push(producer, "ch", 1, b"z%d" % i, headers=(("kind", "z"),))
    fill_cpu = time.process_time() - fill_start
    kit.take(producer)
    calls[0] = 0
    got = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(selected):
        kit.push(producer, "ch", 1, b"a%d" % i, headers=(("kind", "a"),))
        for f in kit.take(consumer):
            if f.message_type == MessageType.QUEUE:
                got += 1
                kit.ack(consumer, f)
        kit.take(producer)
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    return got, cpu / selected * 1e6, wall / selected * 1e6, calls[0] / selected, fill_cpu


def run_full(waiting: int) -> tuple[int, float, float]:
    """The pass-over table: (delivered, CPU us/msg, selector calls/msg)."""
    from broker.engine.delivery import PerMessageDeliveryHandler
    from broker.engine.per_message import PER_MESSAGE
    from broker.protocol import MessageType, QueueStatus
    from tests.broker.engine_kit import Kit

    calls = [0]

    def selects(headers: Sequence[tuple[str, str]]) -> bool:
        calls[0] += 1
        return dict(headers).get("kind") == "red"

    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
              message_delivery_handler=PER_MESSAGE, prefetch=1)  # fmt: skip
    full, picky = kit.connect("full"), kit.connect("picky")
    kit.join(full, "ch")
    kit.join(picky, "ch")
    handler.rules.set_selector("ch", picky, selects)  # type: ignore[arg-type]
    for i in range(waiting):
        kind = "red" if i % 1000 == 999 else "blue"
        kit.push(producer, "ch", 1, b"m%d" % i, headers=(("kind", kind),))
        if i % 1000 == 0:
            kit.advance(0.002)  # (the ticks the queue asks for to go on behind)
    kit.take(producer)
    calls[0] = 0
    got = 0
    cpu = time.process_time()
    while True:
        kit.advance(0.002)
        frames = [
            (name, f)
            for name in (full, picky)
            for f in kit.take(name)
            if f.message_type == MessageType.QUEUE
        ]
        if not frames:
            break
        for name, f in frames:
            got += 1
            kit.ack(name, f)
    cpu = time.process_time() - cpu
    return got, cpu / max(got, 1) * 1e6, calls[0] / max(got, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--full-sizes", default="1000,10000")
    args = parser.parse_args()
    print(f"{'unselected':>10} {'delivered':>9} {'CPU us/msg':>10} {'wall us/msg':>11} "
          f"{'sel calls/msg':>13} {'fill CPU s':>10}")  # fmt: skip
    for size in (int(s) for s in args.sizes.split(",")):
        got, cpu, wall, calls, fill = run(size)
        print(f"{size:>10} {got:>9} {cpu:>10.1f} {wall:>11.1f} {calls:>13.1f} {fill:>10.2f}")
    print()
    print(f"{'waiting':>10} {'delivered':>9} {'CPU us/msg':>10} {'sel calls/msg':>13}"
          "   (full consumer + selecting one with room)")  # fmt: skip
    for size in (int(s) for s in args.full_sizes.split(",")):
        got, cpu, calls = run_full(size)
        print(f"{size:>10} {got:>9} {cpu:>10.1f} {calls:>13.1f}")


if __name__ == "__main__":
    main()
