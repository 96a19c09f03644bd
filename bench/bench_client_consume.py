"""The consumer client's own cost per delivery from a push queue: CPU (us/delivery,
poll-on-call and threaded clients) and Python calls per delivery (cProfile,
deterministic), for this checkout and, with ``--base PATH``, another checkout in turns
(same run, the same measuring script on both).

The broker is a ``Server`` process of the same checkout (memory only; in the measuring
process it would take the consumer's interpreter lock in turns with it; ``--octets N``:
its ``unacked_batch_octets``, how many octets of deliveries share a batch); a
producer fills a push queue first (``push_many``, then one acknowledged push: every
message is in the queue), then the consumer joins and reads them all with ``consume()``
(deliveries as the broker batches them).  Counted: the consuming thread's CPU
(``time.thread_time``), and for the threaded client its I/O thread's too (where the
deliveries are read and decoded); the broker's and the producer's work are not, so the
machine's load moves the figures less than wall time would.

Usage: ``python bench/bench_client_consume.py [--messages N] [--turns T] [--base PATH]
[--octets N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client_push import in_turns, measure

_MEASURE = """
import cProfile, json, socket, subprocess, sys, time
from call_count import python_calls
import zmq
from broker.client.blocking import Client

count = int(sys.argv[1])
octets = int(sys.argv[2])  # the broker's unacked_batch_octets (0: its default)
payload = b"x" * 100
SERVE = '''
import signal, sys, zmq
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
options = ServerOptions(endpoint=sys.argv[1])
if int(sys.argv[2]):
    options = ServerOptions(endpoint=sys.argv[1], unacked_batch_octets=int(sys.argv[2]))
server = Server(Engine(), options, context=zmq.Context())
server.start()
signal.sigwait({signal.SIGTERM})
server.stop()
'''
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    endpoint = "tcp://127.0.0.1:%d" % s.getsockname()[1]
broker = subprocess.Popen(
    [sys.executable, "-c", SERVE, endpoint, str(octets)],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
ctx = zmq.Context()
try:
    admin = Client(endpoint, context=ctx, timeout=120).connect()  # (waits for it to listen)
except BaseException:
    broker.kill()
    raise


def fill(queue):
    admin.create_queue(queue, 1, {"Status": 1})
    producer = Client(endpoint, context=ctx, timeout=60, linger=60, max_outbox=100_000)
    producer.connect()
    chunk = [payload] * 256
    for start in range(0, count, 256):
        producer.push_many(queue, 1, chunk[: min(256, count - start)], ack=False)
    producer.push(queue, 1, payload, ack=True, timeout=60)  # all of them are in the queue
    producer.close()


def io_cpu(client):
    thread = getattr(client, "_thread", None)  # (the threaded client's I/O thread)
    if thread is None or thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def consume(queue, threaded, profile=None):
    fill(queue)
    consumer = Client(endpoint, context=ctx, threaded=threaded, timeout=60, max_inbox=50_000)
    consumer.connect()
    seen = 0
    io0 = io_cpu(consumer)
    started = time.thread_time()
    if profile is not None:
        profile.enable()
    consumer.join(queue)
    for _message in consumer.consume(timeout=60):
        seen += 1
        if seen > count:
            break
    if profile is not None:
        profile.disable()
    used = time.thread_time() - started + io_cpu(consumer) - io0
    consumer.close()
    assert seen == count + 1, seen
    return used / seen * 1e6


out = {}
try:
    out["poll-on-call"] = consume("poll", False)
    out["threaded"] = consume("threaded", True)
    profile = cProfile.Profile()
    consume("profiled", False, profile)
    out["calls"] = python_calls(profile) / (count + 1)
    admin.close()
finally:
    broker.terminate()
    if broker.wait(60) is None:
        broker.kill()
ctx.term()
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    parser.add_argument(
        "--octets", type=int, default=0,
        help="the broker's unacked_batch_octets (256 to 262144; default: its own)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.messages < 1 or args.turns < 1:
        print("bench_client_consume: --messages and --turns must be at least 1", file=sys.stderr)
        return 2
    if args.octets and not 256 <= args.octets <= 262_144:
        print("bench_client_consume: --octets must be from 256 to 262144", file=sys.stderr)
        return 2
    print(f"{'turn':<5} {'checkout':<9} {'poll-on-call us':>16} {'threaded us':>12} "
          f"{'calls/delivery':>15} {'load':>6}")  # fmt: skip
    for turn, name, root in in_turns(args.base, args.turns):
        r = measure(root, args.messages, _MEASURE, str(args.octets))
        print(f"{turn:<5} {name:<9} {r['poll-on-call']:>16.2f} {r['threaded']:>12.2f} "
              f"{r['calls']:>15.2f} {os.getloadavg()[0]:>6.1f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
