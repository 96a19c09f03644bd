"""What the hub's metrics cost the broker: the 1 producer / 1 consumer push rate with no
metrics endpoint, then with one scraped every second and every 100 ms, same run.

The broker (``broker.server.Server`` + ``Engine``) runs in its own process, with the
metrics HTTP server (``zerohub.metrics``) beside it when the row asks for one; a scraper
process fetches ``/metrics`` at the row's interval while the producer pushes.  Rows
alternate over ``--repeat`` rounds (each goes first in turn); the table shows each
configuration's median rate and its cost against the no-metrics median (the issue's
target: under 3% at a normal scrape interval; Prometheus' default is 15 s, far rarer
than both rows here).
The producer/consumer pair is ``bench_broker``'s (poll-on-call clients, 100-byte
messages, non-persistent push queue).

Usage: ``python bench/bench_hub_metrics.py [--quick] [--messages N] [--repeat R]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import bench_zerohub, free_port


def serve(endpoint: str, metrics_port: int, ready: Any, stop: Any) -> None:
    import zmq

    from broker.engine.engine import Engine
    from broker.server.server import Server, ServerOptions
    from zerohub.metrics import metrics_server, registry

    ctx = zmq.Context()
    server = Server(Engine(), ServerOptions(endpoint=endpoint), context=ctx)
    server.start()
    http = None
    if metrics_port:
        http = metrics_server(("127.0.0.1", metrics_port), registry(None, server))
        http.start()
    ready.set()
    stop.wait()
    if http is not None:
        http.stop()
    server.stop()
    ctx.term()


def scraper(url: str, interval: float, stop: Any, out: Any) -> None:
    count = 0
    while not stop.wait(interval):
        with urllib.request.urlopen(url, timeout=10) as answer:
            answer.read()
        count += 1
    out.put(count)


def one_row(ctx: Any, count: int, interval: float | None) -> tuple[float, int]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    port = free_port() if interval is not None else 0
    ready, stop = ctx.Event(), ctx.Event()
    broker = ctx.Process(target=serve, args=(endpoint, port, ready, stop))
    broker.start()
    scrapes = 0
    try:
        if not ready.wait(30):
            raise SystemExit("broker did not start")
        halt, out = ctx.Event(), ctx.Queue()
        scraping = None
        if interval is not None:
            url = f"http://127.0.0.1:{port}/metrics"
            scraping = ctx.Process(target=scraper, args=(url, interval, halt, out))
            scraping.start()
        row = bench_zerohub(ctx, endpoint, count, 1, False)
        if scraping is not None:
            halt.set()
            scrapes = out.get(timeout=30)
            scraping.join(30)
    finally:
        stop.set()
        broker.join(30)
    assert row.rate is not None
    return row.rate, scrapes


def scrape_cost(queues: int, scrapes: int) -> float:
    """Milliseconds one scrape holds the interpreter (so the broker's thread) with
    ``queues`` queues in the broker: what a scrape costs, whatever the noise."""
    import zmq
    from prometheus_client.exposition import generate_latest

    from broker.client.blocking import Client
    from broker.engine.engine import Engine
    from broker.server.server import Server, ServerOptions
    from zerohub.metrics import registry

    ctx = zmq.Context()
    server = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=ctx)
    endpoint = server.start()
    try:
        with Client(endpoint, context=ctx, timeout=30).connect() as client:
            for i in range(queues):
                client.push_async(f"ch{i // 10}", 1 + i % 10, b"x")
            client.push("ch0", 1, b"x", ack=True)
        metrics = registry(None, server)
        generate_latest(metrics)
        t0 = time.perf_counter()
        for _ in range(scrapes):
            generate_latest(metrics)
        return (time.perf_counter() - t0) / scrapes * 1000
    finally:
        server.stop()
        ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (a smoke test)")
    parser.add_argument("--messages", type=int, help="messages per round")
    parser.add_argument("--repeat", type=int, help="rounds of each configuration")
    args = parser.parse_args(argv)
    count = args.messages or (2_000 if args.quick else 100_000)
    repeat = args.repeat or (1 if args.quick else 5)
    ctx = mp.get_context("spawn")
    configs: list[tuple[str, float | None]] = [
        ("no metrics endpoint", None),
        ("scraped every 1 s", 1.0),
        ("scraped every 0.1 s", 0.1),
    ]
    rates: dict[str, list[float]] = {name: [] for name, _ in configs}
    scrapes: dict[str, int] = dict.fromkeys(rates, 0)
    for round_ in range(repeat):
        shift = round_ % len(configs)  # each configuration goes first in turn
        for name, interval in configs[shift:] + configs[:shift]:
            rate, n = one_row(ctx, count, interval)
            rates[name].append(rate)
            scrapes[name] += n
    base = statistics.median(rates[configs[0][0]])
    print(f"broker 1p/1c push rate, {count} messages x {repeat} rounds (median)")
    print(f"{'configuration':<24} {'msg/s':>10} {'cost':>8} {'scrapes':>8}")
    for name, _ in configs:
        median = statistics.median(rates[name])
        cost = (base - median) / base * 100
        print(f"{name:<24} {median:>10,.0f} {cost:>7.1f}% {scrapes[name]:>8}")
    print()
    print(f"{'one scrape, broker with':<24} {'ms':>10} {'at 15 s':>8} {'at 1 s':>8}")
    for queues in (10, 1000):
        ms = scrape_cost(queues, 20 if args.quick else 200)
        print(f"{f'{queues} queues':<24} {ms:>10.2f} {ms / 150:>7.3f}% {ms / 10:>7.2f}%")
    return 0


if __name__ == "__main__":
    start = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - start:.0f} s)")
    sys.exit(code)
