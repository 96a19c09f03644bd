"""One acknowledged producer's whole cost per push, as ``bench_broker.py``'s acked producer
pushes (``push_async``, 64 in flight, a done-callback each, ``result()`` on the oldest),
against a broker in its own process: the producer process's CPU (user, system) and each
of its threads' (the caller, the client's I/O thread, pyzmq's zero-copy collector, libzmq's
I/O thread: ``/proc/self/task``), and its minor page faults (``getrusage``), all per push;
for this checkout and, with ``--base PATH``, another checkout in turns (same run, the same
broker).

``bench_client_acked.py`` counts the client's two Python threads with the broker in the
same process; this one sees what the system charges the producer: faults, the allocator's
returns, libzmq's thread.  The broker is this checkout's (``--persistent``: a persistent
queue with fsync durability in a temporary directory; default a pull queue nobody reads).

Usage: ``python bench/bench_producer.py [--pushes N] [--turns T] [--size OCTETS]
[--persistent] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_client_push import HERE, measure
from turn_table import Column, from_checkout, print_turns

#: Run in a fresh interpreter with the checkout under test first on the path
#: (arguments: pushes, the broker's endpoint, the payload octets).
_PRODUCE = """
import collections, json, os, resource, sys, threading, time
import zmq
import broker
from broker.client.blocking import Client

pushes, endpoint, size = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
IN_FLIGHT = 64
payload = b"x" * size
TICK = os.sysconf("SC_CLK_TCK")
KIND = {"MainThread": "caller_us", "broker-client": "io_us", "ZMQbg/IO/0": "zmq_io_us"}


def threads_cpu():
    names = {t.native_id: t.name for t in threading.enumerate()}
    cpu = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # (a thread that ended)
            continue
        name = names.get(int(tid), comm)
        cpu[tid] = (KIND.get(name, "other_us"), (int(fields[11]) + int(fields[12])) / TICK)
    return cpu


def produce(client, n):
    latencies = []
    inflight = collections.deque()
    clock = time.perf_counter
    for _ in range(n):
        if len(inflight) >= IN_FLIGHT:
            inflight.popleft().result(60)
        sent = clock()
        future = client.push_async("produced", 1, payload, timeout=60)
        future.add_done_callback(lambda _f, t=sent: latencies.append(clock() - t))
        inflight.append(future)
    for future in inflight:
        future.result(60)


ctx = zmq.Context()
client = Client(endpoint, context=ctx, timeout=60, linger=30, max_outbox=50_000).connect()
produce(client, 2_000)  # warm
usage0, cpu0 = resource.getrusage(resource.RUSAGE_SELF), threads_cpu()
produce(client, pushes)
cpu1, usage1 = threads_cpu(), resource.getrusage(resource.RUSAGE_SELF)
client.close()
ctx.term()
out = {"broker": broker.__file__}
out["process_us"] = (usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime)
out["system_us"] = usage1.ru_stime - usage0.ru_stime
out["faults"] = (usage1.ru_minflt - usage0.ru_minflt) * 1e-6
for kind in KIND.values():
    out[kind] = 0.0
out["other_us"] = 0.0
for tid, (kind, seconds) in cpu1.items():
    out[kind] += seconds - cpu0.get(tid, (kind, 0.0))[1]
for key in out:
    if key != "broker":
        out[key] = out[key] / pushes * 1e6
print(json.dumps(out))
"""

#: The table's figures, per push.
COLUMNS = (
    Column("process us", "process_us", width=10),
    Column("system us", "system_us", width=9),
    Column("caller us", "caller_us", width=9),
    Column("I/O us", "io_us"),
    Column("libzmq us", "zmq_io_us", width=9),
    Column("other us", "other_us"),
    Column("faults", "faults", spec=".2f"),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=50_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--size", type=int, default=4096, help="payload octets (default 4 KiB)")
    parser.add_argument("--persistent", action="store_true", help="a persistent queue (fsync)")
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args(argv)
    if args.pushes < 1 or args.turns < 1 or args.size < 0:
        print("--pushes and --turns must be at least 1, --size at least 0", file=sys.stderr)
        return 2
    if args.base is not None and not (args.base / "broker" / "client").is_dir():
        print(f"--base {args.base}: not a checkout (no broker/client)", file=sys.stderr)
        return 2
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(HERE))
    cli = [sys.executable, "-m", "broker", "-q"]
    with tempfile.TemporaryDirectory(prefix="bench-producer-") as data:
        serve = [*cli, "serve", "--bind", endpoint, "--data", data]
        broker = subprocess.Popen(serve, cwd=HERE, env=env, stderr=subprocess.DEVNULL)
        try:
            options = (
                '{"MessageDeliveryHandler": "persistent"}'
                if args.persistent
                else (
                    '{"Status": 3}'  # a pull queue nobody reads: it holds every push
                )
            )
            create = [*cli, "admin", "--connect", endpoint, "--timeout", "30"]
            create += ["--options", options]
            subprocess.run([*create, "create", "produced", "1"], cwd=HERE, env=env,
                           check=True, capture_output=True, timeout=60)  # fmt: skip

            def figures(root: Path) -> dict[str, float]:
                return from_checkout(root, measure(root, args.pushes, _PRODUCE, endpoint,
                                                   str(args.size)))  # fmt: skip

            print_turns(COLUMNS, args.base, args.turns, figures)
        finally:
            broker.terminate()
            broker.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
