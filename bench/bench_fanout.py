"""Broadcast fan-out to N consumer processes against raw pyzmq PUB/SUB, in one run.

Every party runs in its own (spawned) process on loopback TCP, 100-byte messages; the
rows take turns, ``--rounds`` times (default 2):

* raw pyzmq PUB -> N SUB: each SUB ``recv()``s and checks the length (the ceiling);
* zerohub broadcast queue (Status 0) published on the broker's fan-out socket
  (``serve --fanout``, ``broker.engine.fanout``), a producer pushing fire-and-forget,
  N poll-on-call consumers (``Client(threaded=False)``) reading

  - "messages": ``consume()``, one ``Message`` each,
  - "payloads": ``receive_payloads()`` with ``Client(raw_fanout="payloads")``,
  - "numbered": the same with ``(stream number, payload)`` pairs.

The rate is the producer's messages per second until every consumer has them all (or
was told of a gap); beside it the CPU per delivery of the consumers (their process CPU,
libzmq's I/O thread included; the raw SUBs' too) and of the broker.  A client without
``raw_fanout`` (an older tree) runs the "messages" row only.

Usage: ``python bench/bench_fanout.py [--consumers 50] [--messages 4000] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import inspect
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import (
    PAYLOAD,
    SIZE,
    WARM_UP,
    _client,
    _close,
    _cpu_seconds,
    free_port,
    serve_broker,
    zh_producer,
)


def raw_sub(endpoint: str, count: int, ready: Any, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    recv = sock.recv
    while recv() != WARM_UP:
        pass
    ready.set()
    cpu0 = time.process_time()
    seen = 0
    while seen < count:
        if len(recv()) == SIZE:
            seen += 1
    out.put(("consumer", time.perf_counter(), seen, time.process_time() - cpu0))
    sock.close(linger=0)
    ctx.term()


def bench_raw(ctx: Any, count: int, consumers: int) -> dict[str, float]:
    import zmq

    zctx = zmq.Context()
    pub = zctx.socket(zmq.PUB)
    pub.sndhwm = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    subs = [
        ctx.Process(target=raw_sub, args=(f"tcp://127.0.0.1:{port}", count, r, out))
        for r in readies
    ]
    for p in subs:
        p.start()
    deadline = time.monotonic() + 120
    while not all(r.is_set() for r in readies) and time.monotonic() < deadline:
        pub.send(WARM_UP)
        time.sleep(0.01)
    time.sleep(0.2)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    send = pub.send
    for _ in range(count):
        send(PAYLOAD)
    results = [out.get(timeout=300) for _ in subs]
    publisher = time.process_time() - cpu0
    for p in subs:
        p.join(10)
    pub.close(linger=0)
    zctx.term()
    seen = sum(r[2] for r in results)
    return {
        "rate": count / (max(r[1] for r in results) - t0),
        "consumers_us": sum(r[3] for r in results) / max(1, seen) * 1e6,
        "sender_us": publisher / max(1, seen) * 1e6,
        "missed": count * consumers - seen,
    }


def zh_fan_consumer(
    endpoint: str, channel: str, count: int, mode: str, ready: Any, out: Any
) -> None:
    """Reads ``count`` deliveries (received or reported missed) in ``mode``."""
    kw: dict[str, Any] = {} if mode == "messages" else {"raw_fanout": mode}
    client = _client(endpoint, max_inbox=50_000, threaded=False, fanout=True, **kw)
    client.join(channel)
    ready.set()
    cpu0 = time.process_time()
    seen = missed = 0
    last = time.perf_counter()
    clock = time.perf_counter
    deadline = time.monotonic() + 120
    while seen + missed < count and time.monotonic() < deadline:
        if mode == "messages":
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
    out.put(("consumer", last, seen, time.process_time() - cpu0))
    _close(client)


def bench_zerohub(
    ctx: Any, endpoint: str, pid: int, count: int, consumers: int, mode: str, round_: int
) -> dict[str, float]:
    setup = _client(endpoint)
    channel = f"bench-fanout-{mode}-{round_}"
    setup.create_queue(channel, 1, {"Status": 0})
    _close(setup)
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    go = ctx.Event()
    procs = [
        ctx.Process(target=zh_fan_consumer, args=(endpoint, channel, count, mode, r, out))
        for r in readies
    ]
    procs.append(ctx.Process(target=zh_producer, args=(endpoint, channel, count, False, go, out)))
    for p in procs:
        p.start()
    for r in readies:
        r.wait(120)
    time.sleep(0.5)
    cpu0 = _cpu_seconds(pid)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    used = _cpu_seconds(pid) - cpu0
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
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--messages", type=int, default=4000, help="messages (each to all)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    from broker.client.blocking import Client

    modes = ["messages"]
    if "raw_fanout" in inspect.signature(Client).parameters:
        modes += ["payloads", "numbered"]
    ctx = mp.get_context("spawn")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    broker = ctx.Process(
        target=serve_broker, args=(endpoint, "broker.engine.engine:Engine", ready, stop)
    )
    broker.start()
    rows: list[tuple[str, int, dict[str, float]]] = []
    try:
        if not ready.wait(30):
            raise SystemExit("broker did not start")
        assert broker.pid is not None
        for round_ in range(1, args.rounds + 1):
            rows.append(("raw pyzmq PUB->SUB", round_, bench_raw(ctx, args.messages,
                                                                 args.consumers)))  # fmt: skip
            for mode in modes:
                result = bench_zerohub(ctx, endpoint, broker.pid, args.messages, args.consumers,
                                       mode, round_)  # fmt: skip
                rows.append((f"zerohub fan-out ({mode})", round_, result))
    finally:
        stop.set()
        broker.join(30)
    n = args.consumers
    print(f"\nbroadcast of {args.messages} x {SIZE}-byte messages to {n} consumer processes")
    head = f"{'row':<28} {'round':>5} {'msgs/s':>9} {'x raw':>6} {'cons us/dlv':>11}"
    print(f"{head} {'x raw':>6} {'sender us/dlv':>13} {'missed':>7}")
    print("-" * 94)
    raw: dict[int, dict[str, float]] = {r: res for name, r, res in rows if name.startswith("raw")}
    for name, round_, res in rows:
        base = raw[round_]
        print(
            f"{name:<28} {round_:>5} {res['rate']:>9,.0f} {res['rate'] / base['rate']:>5.2f}x"
            f" {res['consumers_us']:>11.2f} {res['consumers_us'] / base['consumers_us']:>5.2f}x"
            f" {res['sender_us']:>13.2f} {int(res['missed']):>7}"
        )
    print("(sender: the raw PUB process / the broker process, CPU per delivery)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
