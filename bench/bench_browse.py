"""Browse benchmark: reading a queue by sequence number as the queue grows.

    python bench/bench_browse.py            # queues of 10,000 / 100,000 / 300,000
    python bench/bench_browse.py --quick    # 10,000 / 50,000

A broker in its own process (``broker serve`` on a loopback port, memory only); a Pull
queue filled with N messages of 100 octets; then, from one client, the time of
``queue_bounds`` and of browsing 1,000 messages from the middle of the queue (best of 5
of each, milliseconds).  Browse and bounds read the queue's sequence index
(``broker.engine.queue.seqindex``): they should not grow with N.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time

from broker.client.blocking import Client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _best(fn: object, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    args = parser.parse_args()
    sizes = (10_000, 50_000) if args.quick else (10_000, 100_000, 300_000)
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--bind", endpoint, "--data", "none"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with Client(endpoint, timeout=2, reconnect=False) as c:
                    c.stats()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with Client(endpoint, timeout=120) as c:
            for n in sizes:
                channel = f"b{n}"
                c.create_queue(channel, 1, {"Status": "Pull"})
                for i in range(1, n + 1):  # an acknowledged one every 5,000: no flood
                    c.push(channel, 1, b"x" * 100, ack=i % 5000 == 0 or i == n)
                middle = n // 2
                bounds_ms = _best(lambda ch=channel: c.queue_bounds(ch, 1))
                browse_ms = _best(lambda ch=channel, m=middle: c.browse(ch, 1, m, 1000))
                got = c.browse(channel, 1, middle, 1000)
                assert [b.sequence for b in got] == list(range(middle, middle + 1000))
                rows.append((n, bounds_ms, browse_ms))
    finally:
        proc.terminate()
        proc.wait(30)
    print()
    print(f"{'queue length':>12} {'bounds ms':>10} {'browse 1,000 ms':>16}")
    for n, bounds_ms, browse_ms in rows:
        print(f"{n:>12,} {bounds_ms:>10.1f} {browse_ms:>16.1f}")


if __name__ == "__main__":
    main()
