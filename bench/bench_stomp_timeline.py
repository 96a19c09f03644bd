"""Where ``bench_stomp.py``'s clock goes: one ``broker serve --stomp``, the same stomp.py
producer and ``ack:auto`` consumer, and for each run the times (from the producer's
start, as that bench's clock) at which the producer had sent and the consumer had
received every ``--step``-th message.

The bench's rate is messages / (the consumer's last message - the producer's start).
While stomp.py's send loop runs it takes a core of its own (it is not throttled while
the loopback socket buffers take its frames: all of a 10k run fits), so the broker and
the consumer share the other one; the rest of the clock is the broker draining what it
was sent.  The columns say how long each phase took and the rate within it.

Runs, in order, on one server: ``--messages`` (default 10000 10000 100000).  With
``--baseline CHECKOUT`` the same runs are made on a server of that checkout afterwards.

Usage: ``python bench/bench_stomp_timeline.py [--messages N ...] [--step K]
[--baseline CHECKOUT]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stomp import PAYLOAD, cpu_seconds, free_port, serve_args, zerohub


def consumer(port: int, count: int, step: int, ready: Any, out: Any) -> None:
    import stomp

    done = threading.Event()
    seen = [0]
    marks: list[tuple[int, float]] = []

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            seen[0] += 1
            if seen[0] % step == 0 or seen[0] == 1:
                marks.append((seen[0], time.perf_counter()))
            if seen[0] >= count:
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost="localhost")
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/bench", id="1", ack="auto")
    ready.set()
    done.wait(600)
    out.put(("consumer", marks))
    conn.disconnect()


def producer(port: int, count: int, step: int, go: Any, out: Any) -> None:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", port)], vhost="localhost")
    conn.connect("guest", "guest", wait=True)
    go.wait(60)
    marks: list[tuple[int, float]] = []
    start = time.perf_counter()
    for i in range(1, count + 1):
        conn.send("/queue/bench", PAYLOAD)
        if i % step == 0:
            marks.append((i, time.perf_counter()))
    out.put(("producer", (start, marks)))
    conn.disconnect()


def one_run(ctx: Any, port: int, pid: int, count: int, step: int) -> str:
    """One run's line: the rate, the producer's phase and the drain after it."""
    out, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    c = ctx.Process(target=consumer, args=(port, count, step, ready, out))
    c.start()
    ready.wait(60)
    p = ctx.Process(target=producer, args=(port, count, step, go, out))
    p.start()
    time.sleep(0.5)  # (as bench_stomp.run_pair: the producer connects meanwhile)
    before = cpu_seconds(pid)
    go.set()
    results = dict(out.get(timeout=900) for _ in range(2))
    p.join(60)
    c.join(60)
    after = cpu_seconds(pid)
    start, sent = results["producer"]
    received: list[tuple[int, float]] = results["consumer"]
    end = received[-1][1] - start
    sent_at = sent[-1][1] - start if sent else 0.0
    by_then = max((n for n, t in received if t - start <= sent_at), default=0)
    first = received[0][1] - start
    cpu = "" if before is None or after is None else f"{(after - before) / count * 1e6:.1f}"
    during = by_then / sent_at if sent_at else 0.0
    drain = (count - by_then) / (end - sent_at) if end > sent_at else 0.0
    return (
        f"{count:>9} {count / end:>9.0f} {1000 * first:>9.1f} {1000 * sent_at:>11.1f} "
        f"{by_then:>12} {during:>12.0f} {1000 * end:>9.1f} {drain:>12.0f} {cpu:>10}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[10_000, 10_000, 100_000])
    parser.add_argument("--step", type=int, default=100, help="mark every K-th message")
    parser.add_argument("--baseline", metavar="CHECKOUT")
    args = parser.parse_args(argv)
    if args.step < 1 or any(n < args.step for n in args.messages):
        parser.error("--step must be at least 1 and at most each --messages count")
    ctx = mp.get_context("spawn")
    print(
        f"{'server':9} {'messages':>9} {'msg/s':>9} {'first ms':>9} {'sent at ms':>11} "
        f"{'recv by then':>12} {'msg/s then':>12} {'last ms':>9} {'drain msg/s':>12} "
        f"{'CPU us/msg':>10}"
    )
    servers: list[tuple[str, str | None]] = [("this", None)]
    if args.baseline:
        servers.append(("baseline", args.baseline))
    for name, source in servers:
        port = free_port()
        with zerohub(serve_args(port, "none"), b"broker serving on", source) as proc:
            for count in args.messages:
                print(f"{name:9} {one_run(ctx, port, proc.pid, count, args.step)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
