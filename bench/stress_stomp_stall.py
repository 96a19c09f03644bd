"""Stress the STOMP ``ack:auto`` path for stalls: stomp.py producer -> queue -> stomp.py
consumer, ``--messages`` per run (100-byte bodies, as ``bench_stomp.py``), ``--runs``
runs per server, this checkout and ``--baseline CHECKOUT`` taking turns.

A run stalls when the consumer sees no message for ``--idle`` seconds before it has them
all (the producer done): the run is counted, the server's figures are printed (``broker
stats``, ``broker admin info`` of the run's queue) and the server is restarted.  A slow
consumer (stomp.py) keeps the listener's outbound buffer full most of a run: many
pause/resume cycles per run, which the stall of ``max_outbound`` reached to the byte
needed (docs/stomp.md "STOMP on the engine", tests/stomp/test_outbound_edge.py).

Usage: ``python bench/stress_stomp_stall.py [--runs 30] [--messages 100000]
[--baseline CHECKOUT] [--idle 20]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stomp import PAYLOAD, free_port, serve_args, zerohub


def consumer(port: int, queue: str, count: int, ready: Any, seen: Any) -> None:
    import stomp

    done = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            seen.value += 1
            if seen.value >= count:
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe(queue, id="1", ack="auto")
    ready.set()
    done.wait(600)
    conn.disconnect()


def producer(port: int, queue: str, count: int, go: Any) -> None:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.connect("guest", "guest", wait=True)
    go.wait(60)
    for _ in range(count):
        conn.send(queue, PAYLOAD)
    conn.disconnect()


def status(tmqp: str, channel: str, source: str | None) -> str:
    """``broker stats`` and ``broker admin info CHANNEL 0`` of the server (the queue's
    figures; the listener's held deliveries where the server's stats have them)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = source
    out = []
    for argv in (["stats"], ["admin", "info", channel, "0"]):
        try:
            done = subprocess.run(
                [sys.executable, "-m", "broker", *argv, "--connect", tmqp],
                capture_output=True,
                text=True,
                timeout=20,
                env=env,
                cwd=source,
            )
        except subprocess.TimeoutExpired:
            out.append(f"(broker {' '.join(argv)} timed out)")
            continue
        out.append((done.stdout + done.stderr).strip())
    return "\n".join(out)


def one_run(port: int, queue: str, count: int, idle: float) -> tuple[bool, int, float]:
    """(finished, messages seen, seconds) of one producer/consumer pair."""
    ctx = mp.get_context("spawn")
    ready, go = ctx.Event(), ctx.Event()
    seen = ctx.Value("q", 0, lock=False)
    cons = ctx.Process(target=consumer, args=(port, queue, count, ready, seen))
    prod = ctx.Process(target=producer, args=(port, queue, count, go))
    cons.start()
    prod.start()
    try:
        ready.wait(60)
        start = time.monotonic()
        go.set()
        last, last_change = -1, time.monotonic()
        while cons.is_alive():
            cons.join(0.5)
            now = time.monotonic()
            if seen.value != last:
                last, last_change = seen.value, now
            elif now - last_change > idle and not prod.is_alive():
                return False, int(seen.value), now - start
        return int(seen.value) >= count, int(seen.value), time.monotonic() - start
    finally:
        for proc in (cons, prod):
            if proc.is_alive():
                proc.kill()
            proc.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--baseline", default=None, help="another checkout, in turns")
    parser.add_argument("--idle", type=float, default=20.0)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    sources: list[tuple[str, str | None]] = [("this", None)]
    if args.baseline:
        sources.append(("base", str(Path(args.baseline).resolve())))
    print(f"this: {here}; base: {args.baseline}; load {os.getloadavg()[0]:.1f}", flush=True)
    stalls = {name: 0 for name, _ in sources}
    done = {name: 0 for name, _ in sources}
    with ExitStack() as stack:
        servers: dict[str, tuple[int, str, Any]] = {}

        def start(name: str, source: str | None) -> None:
            port = free_port()
            argv = serve_args(port, "none")
            tmqp = argv[argv.index("--bind") + 1]
            proc = stack.enter_context(zerohub(argv, b"broker serving on", source))
            servers[name] = (port, tmqp, proc)

        for name, source in sources:
            start(name, source)
        for run in range(args.runs):
            order = sources if run % 2 == 0 else sources[::-1]
            for name, source in order:
                port, tmqp, proc = servers[name]
                ok, seen, took = one_run(port, f"/queue/stall{run}", args.messages, args.idle)
                done[name] += 1
                load = os.getloadavg()[0]
                line = (
                    f"run {run + 1} {name}: {seen}/{args.messages} in {took:.1f}s, load {load:.1f}"
                )
                if ok:
                    print(line, flush=True)
                    continue
                stalls[name] += 1
                print(f"{line}: STALLED", flush=True)
                print(status(tmqp, f"stall{run}", source), flush=True)
                proc.terminate()
                start(name, source)
    for name, _ in sources:
        print(f"{name}: {stalls[name]} stalled of {done[name]} runs", flush=True)


if __name__ == "__main__":
    main()
