"""The broker's CPU per acknowledged push, thread by thread: memory against persistent.

Where does a persistent message's extra CPU go: the serve thread (the engine, the
store's encoding, the gate), the store's writer thread (``write``, ``fdatasync``,
completions) or libzmq's I/O thread?  The broker runs as ``bench_broker.py`` builds it
(``serve_durable_broker``: memory only, then ``--data`` in fsync mode); its producers
are ``bench_broker.py``'s (``PERSIST_WINDOW`` acknowledged pushes in flight each).  Each
thread's user + system CPU is read from ``/proc/PID/task/TID/stat`` before and after the
measured pushes (after a warm-up), divided by the messages: a table per size, one line
per broker, one column per thread (Python threads by name, libzmq's by their own).

Run a base with ``PYTHONPATH=BASE:BASE/bench`` and this tree's venv, in turns with the
branch: CPU per message moves far less with the machine's load than the rates do.

``--calls``: the serving thread also runs under cProfile (slower: read its CPU column
as the profiler's, not the broker's) and a last column gives its Python calls per
acknowledged push, over every push of the row (warm-up included; summed per code object:
deterministic, the same on a loaded machine).

Usage: ``python bench/bench_broker_threads.py [--messages N] [--size OCTETS ...]
[--producers N] [--calls]``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import bench_acked, free_port, serve_durable_broker
from call_count import python_calls

#: messages pushed before the measured ones (connections, queues, first segment)
WARM_UP = 2000


def thread_cpu(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each thread of ``pid`` so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that ended meanwhile)
            continue
        seconds[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def _thread_name(pid: int, tid: int, names: dict[int, str]) -> str:
    if tid in names:
        return names[tid]
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return str(tid)


def serve_counted(
    endpoint: str, data: str | None, ready: Any, stop: Any, stats: Any, names: Any, counted: Any
) -> None:
    """``serve_durable_broker`` with the server's serving thread under cProfile: once it
    stopped, ``counted`` (a queue) gets the Python calls it made (per code object)."""
    from broker.server.server import Server

    serve = Server._serve

    def profiled(self: Any, *args: Any) -> None:
        prof = cProfile.Profile()
        prof.enable()
        try:
            serve(self, *args)
        finally:
            prof.disable()
            counted.put(python_calls(prof))

    Server._serve = profiled  # type: ignore[method-assign,assignment]
    serve_durable_broker(endpoint, data, ready, stop, stats, names)


def measure(
    ctx: Any, data: str | None, size: int, messages: int, producers: int, calls: bool = False
) -> str:
    """One broker (``data`` None: memory), warmed up, then ``messages`` acknowledged pushes
    of ``size`` octets: a line of its rate, CPU per message and each thread's share
    (``calls``: and its serving thread's Python calls per push, see ``--calls``)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    mine, theirs = ctx.Pipe()
    names_queue = ctx.Queue()
    counted = ctx.Queue()
    broker = ctx.Process(
        target=serve_counted if calls else serve_durable_broker,
        args=(endpoint, data, ready, stop, theirs, names_queue, *((counted,) if calls else ())),
    )
    broker.start()
    try:
        if not ready.wait(60):
            raise SystemExit("broker did not start")
        names = names_queue.get(timeout=60)
        persistent = data is not None
        # (another producer count than the measured one: another queue)
        bench_acked(ctx, endpoint, WARM_UP, max(1, producers // 2), size, persistent,
                    broker.pid, mine)  # fmt: skip
        before = thread_cpu(broker.pid)
        row = bench_acked(ctx, endpoint, messages, producers, size, persistent, broker.pid, mine)
        after = thread_cpu(broker.pid)
        named = {tid: _thread_name(broker.pid, tid, names) for tid in after}  # (while alive)
    finally:
        stop.set()
        served = counted.get(timeout=60) if calls else 0
        broker.join(60)
    total = max(1, messages // producers) * producers
    shares: dict[str, float] = {}
    for tid, seconds in after.items():
        name = named[tid]
        shares[name] = shares.get(name, 0.0) + seconds - before.get(tid, 0.0)
    columns = "  ".join(
        f"{name} {seconds / total * 1e6:.1f}"
        for name, seconds in sorted(shares.items())
        if seconds
    )
    kind = "persistent" if persistent else "memory"
    fsyncs = f" {row.per_sync:5.0f}" if row.per_sync else " " * 6
    if calls:
        warm = max(1, producers // 2)
        pushes = total + max(1, WARM_UP // warm) * warm
        columns += f"  | serve calls/msg {served / pushes:.2f}"
    return f"{kind:<11}{size:>6} {row.rate:>9,.0f} {row.cpu or 0:>8.1f}{fsyncs}  {columns}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000, help="measured pushes per row")
    parser.add_argument("--size", type=int, nargs="+", default=[100, 4096], help="payload octets")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument(
        "--calls", action="store_true", help="also the serving thread's Python calls per push"
    )
    args = parser.parse_args(argv)
    if args.messages < 1 or args.producers < 1 or min(args.size) < 0:
        print(
            "bench_broker_threads: --messages and --producers >= 1, --size >= 0", file=sys.stderr
        )
        return 2
    ctx = mp.get_context("spawn")
    code = Path(str(importlib.import_module("broker").__file__)).parent.parent
    print(f"{args.producers} producers, acknowledged pushes; broker code: {code}")
    print(
        f"{'broker':<11}{'octets':>6} {'msgs/s':>9} {'CPU us':>8} {'/sync':>5}"
        "  CPU us/msg by thread"
    )
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        for size in args.size:
            messages = args.messages if size <= 100 else max(1, args.messages // 4)
            for data in (None, str(Path(tmp) / f"data-{size}")):
                print(measure(ctx, data, size, messages, args.producers, args.calls), flush=True)
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
