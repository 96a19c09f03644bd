"""What a held acknowledged push costs the broker and its producers, per message: CPU
(user + system, ``/proc/PID/stat``), minor page faults and the broker's voluntary context
switches, for this checkout and, with ``--base PATH``, another one in turns (same run).

The shape of ``bench_broker.py``'s "memory" rows: a broker without a store
(``bench_broker.serve_durable_broker`` of the checkout under test, in its own process),
``--producers`` processes each keeping 64 ``push_async`` in flight into one queue nobody
reads, so the broker holds every payload.  ``--warm`` first pushes the rows
``bench_broker.py`` runs before its memory 4 KiB 8p row into other queues of the same
broker (100 B 1p and 8p, 4 KiB 1p): the heap the row meets there.  Counts, not rates:
faults and context switches hardly move with the machine's load, CPU per message less
than wall time.

Usage: ``python bench/bench_held_pushes.py [--messages N] [--size OCTETS] [--producers P]
[--turns T] [--warm] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from turn_table import Column, from_checkout, print_turns

_IN_FLIGHT = 64  # pushes each producer keeps waiting for their acknowledge
#: bench_broker.py's rows before its memory 4 KiB 8p one: (queue, messages, size, producers)
_WARM_ROWS = (
    ("warm-1", 100_000, 100, 1),
    ("warm-8", 100_000, 100, 8),
    ("warm-4k", 25_000, 4096, 1),
)

TICK = os.sysconf("SC_CLK_TCK")


def usage(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, minor faults, voluntary context switches of all threads) of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    switches = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    switches += int(line.split()[1])
        except OSError:
            pass  # (a thread that ended)
    return (int(fields[11]) + int(fields[12])) / TICK, int(fields[7]), switches


def producer(endpoint: str, queue: str, n: int, size: int, ready: Any, go: Any, out: Any) -> None:
    """Push ``n`` acknowledged messages of ``size`` octets, 64 in flight; put (CPU s,
    faults) of this process while it pushed."""
    import zmq

    from broker.client.blocking import Client

    client = Client(endpoint, context=zmq.Context(), max_outbox=50_000).connect()
    payload = b"x" * size
    ready.set()
    go.wait(60)
    before = usage(os.getpid())
    inflight: collections.deque[Any] = collections.deque()
    for _ in range(n):
        if len(inflight) >= _IN_FLIGHT:
            inflight.popleft().result(60)
        future = client.push_async(queue, 1, payload, timeout=60)
        future.add_done_callback(lambda _f: None)
        inflight.append(future)
    for future in inflight:
        future.result(60)
    after = usage(os.getpid())
    out.put((after[0] - before[0], after[1] - before[1]))
    client.close()
    client.context.term()


def push(ctx: Any, endpoint: str, queue: str, n: int, size: int, processes: int,
         broker_pid: int) -> dict[str, float]:  # fmt: skip
    """``processes`` producers push ``n`` messages into a new queue: per message figures."""
    import zmq

    from broker.client.blocking import Client

    context = zmq.Context()
    with Client(endpoint, context=context) as setup:
        setup.create_queue(queue, 1, {})
    context.term()
    go, out = ctx.Event(), ctx.Queue()
    readies = [ctx.Event() for _ in range(processes)]
    each = n // processes
    procs = [ctx.Process(target=producer, args=(endpoint, queue, each, size, r, go, out))
             for r in readies]  # fmt: skip
    for p in procs:
        p.start()
    for r in readies:
        if not r.wait(60):
            raise SystemExit("a producer did not connect")
    before = usage(broker_pid)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    after = usage(broker_pid)
    for p in procs:
        p.join(60)
    total = each * processes
    return {
        "broker_us": (after[0] - before[0]) / total * 1e6,
        "broker_faults": (after[1] - before[1]) / total,
        "broker_switches": (after[2] - before[2]) / total,
        "producers_us": sum(r[0] for r in results) / total * 1e6,
        "producers_faults": sum(r[1] for r in results) / total,
    }


def child(count: int, size: int, producers: int, warm: bool) -> dict[str, Any]:
    """(In the checkout's own interpreter) the broker of ``bench_broker`` as that
    checkout builds it, the warm-up rows if asked, then the measured row."""
    from bench_broker import free_port, serve_durable_broker

    import broker

    ctx = mp.get_context("spawn")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    server = ctx.Process(target=serve_durable_broker, args=(endpoint, None, ready, stop))
    server.start()
    assert server.pid is not None
    try:
        if not ready.wait(60):
            raise SystemExit("the broker did not start")
        for queue, n, payload, processes in _WARM_ROWS if warm else ():
            push(ctx, endpoint, queue, n, payload, processes, server.pid)
        result: dict[str, Any] = push(ctx, endpoint, "held", count, size, producers, server.pid)
    finally:
        stop.set()
        server.join(60)
    result["broker"] = broker.__file__
    return result


#: The table's figures per message: the broker's CPU us, faults and context switches, the
#: producers' CPU us and faults.
COLUMNS = (
    Column("broker us", "broker_us", width=10),
    Column("faults", "broker_faults", ".2f", width=7),
    Column("switches", "broker_switches", ".3f", width=9),
    Column("producers us", "producers_us", width=13),
    Column("faults", "producers_faults", ".2f", width=7),
)


def run_in(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``child`` run by a fresh interpreter with ``root`` (its broker and its bench/)
    first on the path; its answer."""
    env = dict(os.environ, PYTHONPATH=str(root))
    command = [sys.executable, __file__, "--child", str(root), "--messages", str(args.messages),
               "--size", str(args.size), "--producers", str(args.producers)]  # fmt: skip
    done = subprocess.run(command + (["--warm"] if args.warm else []), cwd=root, env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=4096, help="payload octets")
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="bench_broker's earlier rows first")
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:  # (run_in: the checkout's bench/ before this one's)
        sys.path.insert(0, str(args.child / "bench"))
        print(json.dumps(child(args.messages, args.size, args.producers, args.warm)))
        return 0
    if min(args.messages, args.producers, args.turns) < 1 or args.size < 0:
        print("--messages, --producers, --turns must be at least 1, --size at least 0",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.messages < args.producers:
        print("--messages must be at least --producers", file=sys.stderr)
        return 2

    print_turns(
        COLUMNS, args.base, args.turns, lambda root: from_checkout(root, run_in(root, args))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
