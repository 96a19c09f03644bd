"""The client's own cost per fire-and-forget push: CPU of the pushing thread (us/push,
poll-on-call and threaded clients) and Python calls per push (cProfile, deterministic),
for this checkout and, with ``--base PATH``, another checkout in turns (same run).

The broker runs in the measuring process on its own thread (a real ``Server`` and
``Engine``, a pull queue); only the pushing thread's CPU is counted (``time.thread_time``),
so the broker's work and the machine's load move the figures less than wall time would.

Usage: ``python bench/bench_client_push.py [--pushes N] [--turns T] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_MEASURE = """
import cProfile, json, sys, time
from call_count import python_calls
import zmq
from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions

pushes = int(sys.argv[1])
payload = b"x" * 100
ctx = zmq.Context()
srv = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=ctx)
endpoint = srv.start()
out = {}
with Client(endpoint, context=ctx, timeout=30) as admin:
    admin.create_queue("bench", 1, {"Status": 3})
    for name, threaded in (("poll-on-call", False), ("threaded", True)):
        producer = Client(endpoint, context=ctx, threaded=threaded, timeout=30, linger=30)
        producer.connect()
        started = time.thread_time()
        for _ in range(pushes):
            producer.push("bench", 1, payload)
        out[name] = (time.thread_time() - started) / pushes * 1e6
        producer.close()
    producer = Client(endpoint, context=ctx, threaded=False, timeout=30, linger=30)
    producer.connect()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20_000):
        producer.push("bench", 1, payload)
    profile.disable()
    producer.close()
    out["calls"] = python_calls(profile) / 20_000
srv.stop()
ctx.term()
print(json.dumps(out))
"""


def measure(root: Path, pushes: int, script: str = _MEASURE, *more: str) -> dict[str, float]:
    """Run ``script`` (``_MEASURE`` or another bench's) in a fresh interpreter with the
    checkout ``root`` first on the path (then this checkout's ``bench/``: the call
    counting of ``call_count``; arguments: ``pushes`` then ``more``); its last line of
    output, a JSON object."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(root), str(HERE / "bench"))))
    done = subprocess.run(
        [sys.executable, "-c", script, str(pushes), *more],
        cwd=root, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args(argv)
    print(f"{'turn':<5} {'checkout':<9} {'poll-on-call us':>16} {'threaded us':>12} "
          f"{'calls/push':>11} {'load':>6}")  # fmt: skip
    for turn, name, root in in_turns(args.base, args.turns):
        r = measure(root, args.pushes)
        load = os.getloadavg()[0]
        print(f"{turn:<5} {name:<9} {r['poll-on-call']:>16.2f} {r['threaded']:>12.2f} "
              f"{r['calls']:>11.2f} {load:>6.1f}", flush=True)  # fmt: skip
    return 0


def in_turns(base: Path | None, turns: int) -> Iterator[tuple[int, str, Path]]:
    """(turn, "this" or "base", checkout) for ``turns`` turns, this checkout first in odd
    turns and the base (if any) first in even ones."""
    sides = [("this", HERE)] + ([("base", base.resolve())] if base else [])
    for turn in range(1, turns + 1):
        for name, root in sides if turn % 2 else sides[::-1]:
            yield turn, name, root


if __name__ == "__main__":
    raise SystemExit(main())
