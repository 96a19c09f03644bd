"""CPU and Python calls per push *with headers* through the engine's typed push path.

The ``Retain`` header (``broker.engine.retain``) is looked for in the headers of every
push that has some (``Engine._push``); pushes without headers take the queue's fast path
and never look (``bench/bench_push_path.py`` measures those).  This bench measures what
that look costs: one engine, one round-robin queue without acknowledges, one consumer,
``--messages`` pushes of 100 octets carrying three headers (none of them ``Retain``)
given to ``Engine.receive`` one by one, the consumer's flow reported every 256.  CPU time
(``time.process_time``, best of ``--repeat``) and Python calls per push (cProfile,
``bench/call_count.py``: deterministic).  ``--baseline CHECKOUT`` measures another
checkout in a child process, this one and that one in alternating turns.

Usage: ``python bench/bench_headed_push.py [--messages N] [--repeat R] [--turns K]
[--baseline CHECKOUT]``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path
from typing import Any

from checkout_child import child_result

HEADERS = (("region", "eu"), ("priority", "7"), ("trace", "t-0001"))
PAYLOAD = b"x" * 100
REPORT_EVERY = 256


def _setup() -> tuple[Any, Any]:
    from broker.engine.engine import Engine
    from broker.engine.options import ChannelQueueOptions
    from broker.protocol import ConnectionInfo, QueueStatus

    engine = Engine()
    consumer, _ = engine.connect(ConnectionInfo(client_id="c"), 0.0)
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), 0.0)
    engine.create_channel("ch")
    engine.create_queue("ch", 1, ChannelQueueOptions(status=QueueStatus.ROUND_ROBIN), [])
    engine.subscribe(consumer, "ch", 0.0)
    return engine, producer


def _frames(count: int) -> list[Any]:
    from broker import tmqp
    from broker.protocol import MessageType

    return [
        tmqp.Frame(
            message_type=MessageType.QUEUE,
            content_type=1,
            target="ch",
            message_id=f"m{i}",
            source="p",
            headers=HEADERS,
            payload=PAYLOAD,
        )
        for i in range(count)
    ]


def _push_all(engine: Any, producer: str, frames: list[Any]) -> None:
    sent = 0
    for frame in frames:
        engine.receive(producer, frame, 1.0)
        sent += 1
        if sent == REPORT_EVERY:
            engine.transmitted({"c": sent}, 1.0)
            sent = 0
    if sent:
        engine.transmitted({"c": sent}, 1.0)


def measure(messages: int, repeat: int) -> dict[str, float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from call_count import python_calls

    best = float("inf")
    for _ in range(repeat):
        engine, producer = _setup()
        frames = _frames(messages)
        start = time.process_time()
        _push_all(engine, producer, frames)
        best = min(best, time.process_time() - start)
    engine, producer = _setup()
    frames = _frames(messages)
    prof = cProfile.Profile()
    prof.enable()
    _push_all(engine, producer, frames)
    prof.disable()
    return {"us": best / messages * 1e6, "calls": python_calls(prof) / messages}


def _run(checkout: str, messages: int, repeat: int) -> dict[str, float]:
    return child_result(__file__, checkout, "--messages", str(messages), "--repeat", str(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another checkout (e.g. main)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.messages < 1 or args.repeat < 1 or args.turns < 1:
        parser.error("--messages, --repeat and --turns must be at least 1")
    if args.child:
        print(json.dumps(measure(args.messages, args.repeat)))
        return 0
    here = str(Path(__file__).resolve().parent.parent)
    print(f"{'turn':>4} {'checkout':>9} {'CPU us/push':>12} {'calls/push':>11}")
    for turn in range(1, args.turns + 1):
        order = [("this", here)]
        if args.baseline:
            base = ("baseline", args.baseline)
            order = [base, *order] if turn % 2 else [*order, base]
        for name, checkout in order:
            got = _run(checkout, args.messages, args.repeat)
            print(f"{turn:>4} {name:>9} {got['us']:12.2f} {got['calls']:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
