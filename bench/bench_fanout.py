"""Broadcast fan-out to N consumer processes against raw pyzmq PUB/SUB, in one run.

Every party runs in its own (spawned) process on loopback TCP, 100-byte messages; the
rows take turns, ``--rounds`` times (default 2):

* raw pyzmq PUB -> N SUB: each SUB ``recv()``s and checks the length (the ceiling);
* zerohub broadcast queue (Status 0) published on the broker's fan-out socket
  (``serve --fanout``, ``broker.engine.fanout``), a producer pushing fire-and-forget,
  N poll-on-call consumers (``Client(threaded=False)``) reading

  - "messages": ``consume()``, one ``Message`` each,
  - "payloads": ``receive_payloads()`` with ``Client(raw_fanout="payloads")``,
  - "numbered": the same with ``(stream number, payload)`` pairs;
  - with ``--batched``, "payloads, push_many": the producer pushes ``push_many`` batches
    (``bench_broker.BATCH`` a batch), so the broker's cost per message is not a whole
    receive per push (what a raw PUB never pays).

The rate is the producer's messages per second until every consumer has them all (or
was told of a gap); beside it the CPU per delivery of the consumers (their process CPU,
libzmq's I/O thread included; the raw SUBs' too) and of the broker.  A client without
``raw_fanout`` (an older tree) runs the "messages" row only.

``--calls``: then each zerohub row once more with ONE consumer run under cProfile: the
Python function calls per delivery on its receive path (a count, not a time: it moves
only with the code and with how many deliveries one read finds, which the table gives
as deliveries per published message, the broker's ``fanout_published / fanout_sends``).

Usage: ``python bench/bench_fanout.py [--consumers 50] [--messages 4000] [--rounds 2]
[--calls]``.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import (
    SIZE,
    _client,
    _close,
    _cpu_seconds,
    free_port,
    raw_broadcast,
    serve_broker,
    zh_batch_producer,
    zh_producer,
)
from call_count import python_calls


def zh_fan_consumer(
    endpoint: str, channel: str, count: int, mode: str, ready: Any, out: Any, calls: bool = False
) -> None:
    """Reads ``count`` deliveries (received or reported missed) in ``mode``; ``calls``:
    under cProfile, the Python calls it made added to what it reports."""
    read = mode.split(",")[0]
    kw: dict[str, Any] = {} if read == "messages" else {"raw_fanout": read}
    client = _client(endpoint, max_inbox=50_000, threaded=False, fanout=True, **kw)
    client.join(channel)
    ready.set()
    profile = cProfile.Profile() if calls else None
    if profile is not None:
        profile.enable()
    cpu0 = time.process_time()
    seen = missed = 0
    last = time.perf_counter()
    clock = time.perf_counter
    deadline = time.monotonic() + 120
    while seen + missed < count and time.monotonic() < deadline:
        if read == "messages":
            for _message in client.consume(timeout=1.0):
                seen += 1
                last = clock()
                if seen + missed >= count:
                    break
        else:
            got = client.receive_payloads(timeout=1.0)
            if got:
                seen += len(got)
                last = clock()
        missed = sum(gap.count for gap in client.fanout_gaps)
    used = time.process_time() - cpu0
    made = 0
    if profile is not None:
        profile.disable()
        made = python_calls(profile)
    out.put(("consumer", last, seen, used, made))
    _close(client)


def bench_zerohub(
    ctx: Any,
    endpoint: str,
    pid: int,
    count: int,
    consumers: int,
    mode: str,
    round_: int,
    stats: Callable[[], dict[str, int]],
    calls: bool = False,
) -> dict[str, float]:
    setup = _client(endpoint)
    channel = f"bench-fanout-{mode.replace(', ', '-')}-{round_}"
    setup.create_queue(channel, 1, {"Status": 0})
    _close(setup)
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    go = ctx.Event()
    procs = [
        ctx.Process(target=zh_fan_consumer, args=(endpoint, channel, count, mode, r, out, calls))
        for r in readies
    ]
    producer = zh_batch_producer if mode.endswith("push_many") else zh_producer
    procs.append(ctx.Process(target=producer, args=(endpoint, channel, count, False, go, out)))
    for p in procs:
        p.start()
    for r in readies:
        r.wait(120)
    time.sleep(0.5)
    before = stats()
    cpu0 = _cpu_seconds(pid)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    used = _cpu_seconds(pid) - cpu0
    after = stats()
    for p in procs:
        p.join(30)
    start = min(r[1] for r in results if r[0] == "producer")
    end = max(r[1] for r in results if r[0] == "consumer")
    seen = sum(r[2] for r in results if r[0] == "consumer")
    return {
        "rate": count / (end - start),
        "consumers_us": sum(r[3] for r in results if r[0] == "consumer") / max(1, seen) * 1e6,
        "sender_us": used / max(1, seen) * 1e6,
        "missed": count * consumers - seen,
        "calls": sum(r[4] for r in results if r[0] == "consumer") / max(1, seen),
        "run": _per_send(before, after),
    }


def _server_counters(endpoint: str) -> dict[str, int]:
    """The broker's transport counters (``Client.stats``)."""
    client = _client(endpoint)
    try:
        counters: dict[str, int] = client.stats()["server"]
        return counters
    finally:
        _close(client)


def _per_send(before: dict[str, int], after: dict[str, int]) -> float:
    """Deliveries per published fan-out message between two counter readings (0: none)."""
    sends = after.get("fanout_sends", 0) - before.get("fanout_sends", 0)
    published = after.get("fanout_published", 0) - before.get("fanout_published", 0)
    if "fanout_sends" not in after:  # (an older broker: one delivery each)
        return 1.0 if published else 0.0
    return published / sends if sends else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--messages", type=int, default=4000, help="messages (each to all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--calls", action="store_true", help="then Python calls per delivery (1 consumer)"
    )
    parser.add_argument(
        "--batched", action="store_true", help="a row with a push_many producer (raw payloads)"
    )
    args = parser.parse_args(argv)
    from broker.client.blocking import Client

    modes = ["messages"]
    if "raw_fanout" in inspect.signature(Client).parameters:
        modes += ["payloads", "numbered"]
        if args.batched:
            modes.append("payloads, push_many")
    ctx = mp.get_context("spawn")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    broker = ctx.Process(
        target=serve_broker, args=(endpoint, "broker.engine.engine:Engine", ready, stop)
    )
    broker.start()
    rows: list[tuple[str, int, dict[str, float]]] = []
    calls: list[tuple[str, dict[str, float]]] = []

    def stats() -> dict[str, int]:
        return _server_counters(endpoint)

    try:
        if not ready.wait(30):
            raise SystemExit("broker did not start")
        assert broker.pid is not None
        for round_ in range(1, args.rounds + 1):
            rows.append(("raw pyzmq PUB->SUB", round_, raw_broadcast(ctx, args.messages,
                                                                     args.consumers)))  # fmt: skip
            for mode in modes:
                result = bench_zerohub(ctx, endpoint, broker.pid, args.messages, args.consumers,
                                       mode, round_, stats)  # fmt: skip
                rows.append((f"zerohub fan-out ({mode})", round_, result))
        if args.calls:
            for mode in modes:
                result = bench_zerohub(ctx, endpoint, broker.pid, args.messages, 1, mode, 0,
                                       stats, calls=True)  # fmt: skip
                calls.append((mode, result))
    finally:
        stop.set()
        broker.join(30)
    n = args.consumers
    print(f"\nbroadcast of {args.messages} x {SIZE}-byte messages to {n} consumer processes")
    head = f"{'row':<38} {'round':>5} {'msgs/s':>9} {'x raw':>6} {'cons us/dlv':>11}"
    print(f"{head} {'x raw':>6} {'sender us/dlv':>13} {'dlv/send':>8} {'missed':>7}")
    print("-" * 109)
    raw: dict[int, dict[str, float]] = {r: res for name, r, res in rows if name.startswith("raw")}
    for name, round_, res in rows:
        base = raw[round_]
        print(
            f"{name:<38} {round_:>5} {res['rate']:>9,.0f} {res['rate'] / base['rate']:>5.2f}x"
            f" {res['consumers_us']:>11.2f} {res['consumers_us'] / base['consumers_us']:>5.2f}x"
            f" {res['sender_us']:>13.2f} {res.get('run', 1.0):>8.1f} {int(res['missed']):>7}"
        )
    print("(sender: the raw PUB process / the broker process, CPU per delivery; dlv/send:")
    print(" deliveries per published fan-out message, the broker's runs)")
    if calls:
        print("\nPython calls per delivery, one consumer under cProfile:")
        for mode, res in calls:
            print(f"  {mode:<10} {res['calls']:>7.2f}  ({res['run']:.1f} deliveries per send)")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores, shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
