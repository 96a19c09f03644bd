"""The threaded client's own cost per acknowledged push, as ``bench_broker.py``'s acked
producer pushes (``push_async``, 64 in flight, a done-callback each, ``result()`` on the
oldest): CPU of the caller's thread and of the client's I/O thread (us/push, thread CPU
clocks) and Python calls per push on each (cProfile: deterministic), for this checkout
and, with ``--base PATH``, another checkout in turns (same run).

The broker runs in the measuring process (a real ``Server`` and ``Engine`` on their own
threads, a pull queue nobody reads); only the client's two threads are counted, so the
broker's work and the machine's load move the figures less than wall time would.  The
I/O thread's calls are those of its whole life in two runs of different lengths, and
the difference is divided by the difference in pushes (its connect and close cancel out).

Usage: ``python bench/bench_client_acked.py [--pushes N] [--turns T] [--size OCTETS]
[--base PATH]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_client_push import measure
from turn_table import Column, from_checkout, print_turns

#: Run in a fresh interpreter with the checkout under test first on the path.
_MEASURE = """
import cProfile, collections, json, sys, threading, time
from call_count import python_calls
import zmq
import broker
from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions

pushes = int(sys.argv[1])
IN_FLIGHT = 64
payload = b"x" * int(sys.argv[2])
ctx = zmq.Context()
srv = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=ctx)
endpoint = srv.start()
io_profiles = []


def profile_io_thread(frame, event, arg):
    sys.setprofile(None)
    if threading.current_thread().name == "broker-client":
        profile = cProfile.Profile()
        io_profiles.append(profile)
        profile.enable()


def connected_with_its_thread():
    before = set(threading.enumerate())
    client = Client(endpoint, context=ctx, timeout=60, linger=30, max_outbox=50_000)
    client.connect()
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "broker-client"]
    return client, thread


def produce(client, n, caller_profile=None):
    latencies = []
    inflight = collections.deque()
    clock = time.perf_counter
    if caller_profile is not None:
        caller_profile.enable()
    for _ in range(n):
        if len(inflight) >= IN_FLIGHT:
            inflight.popleft().result(60)
        sent = clock()
        future = client.push_async("acked", 1, payload, timeout=60)
        future.add_done_callback(lambda _f, t=sent: latencies.append(clock() - t))
        inflight.append(future)
    for future in inflight:
        future.result(60)
    if caller_profile is not None:
        caller_profile.disable()


out = {"broker": broker.__file__}
with Client(endpoint, context=ctx, timeout=30) as admin:
    admin.create_queue("acked", 1, {"Status": 3})
    client, thread = connected_with_its_thread()
    produce(client, 2_000)  # warm
    clock = time.pthread_getcpuclockid(thread.ident)
    caller0, io0 = time.thread_time(), time.clock_gettime(clock)
    produce(client, pushes)
    out["caller_us"] = (time.thread_time() - caller0) / pushes * 1e6
    out["io_us"] = (time.clock_gettime(clock) - io0) / pushes * 1e6
    client.close()
    calls = {}
    for n in (5_000, 15_000):
        threading.setprofile(profile_io_thread)
        client, _thread = connected_with_its_thread()
        threading.setprofile(None)
        caller = cProfile.Profile()
        produce(client, n, caller)
        client.close()
        calls[n] = (python_calls(caller), python_calls(io_profiles[-1]))
    out["caller_calls"] = (calls[15_000][0] - calls[5_000][0]) / 10_000
    out["io_calls"] = (calls[15_000][1] - calls[5_000][1]) / 10_000
srv.stop()
ctx.term()
print(json.dumps(out))
"""


#: The table's figures: CPU us per push (caller's thread, I/O thread, both), calls per push.
COLUMNS = (
    Column("caller us", "caller_us", width=10),
    Column("I/O us", "io_us"),
    Column("client us", "client_us", width=10),
    Column("caller calls", "caller_calls", width=13),
    Column("I/O calls", "io_calls", width=10),
)


def measure_acked(root: Path, pushes: int, size: int = 100) -> dict[str, float]:
    return from_checkout(root, measure(root, pushes, _MEASURE, str(size)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=50_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--size", type=int, default=100, help="payload octets (4096: 4 KiB)")
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args(argv)
    if args.pushes < 1 or args.turns < 1 or args.size < 0:
        print("--pushes and --turns must be at least 1, --size at least 0", file=sys.stderr)
        return 2

    def figures(root: Path) -> dict[str, float]:
        r = measure_acked(root, args.pushes, args.size)
        return {**r, "client_us": r["caller_us"] + r["io_us"]}

    print_turns(COLUMNS, args.base, args.turns, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
