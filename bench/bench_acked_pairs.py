"""One acknowledged-push row against two brokers alive at once, in alternating turns.

On a shared, loaded machine two runs of ``bench_broker.py`` a minute apart see different
neighbours; rows of a fraction of a second each, taken from a base broker and this
tree's in turns (A B B A ...), see nearly the same.  Both brokers run as ``bench_broker.py``
builds them (``serve_durable_broker``: memory or ``--data`` in fsync mode), one with
``PYTHONPATH`` set to ``--base``'s checkout; the producers are ``bench_broker.py``'s
(``PERSIST_WINDOW`` acknowledged pushes in flight each, this tree's client) and each row
pushes ``--messages`` into a fresh queue.  Reported: each broker's rates (median, and
the paired ratio of each turn's two rows), p99, broker CPU per message, messages per
fsync.

Usage: ``python bench/bench_acked_pairs.py --base PATH [--turns N] [--messages N]
[--size OCTETS] [--producers N] [--memory]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import _client, _close, bench_acked, free_port, serve_durable_broker


def _start(ctx: Any, data: str | None, code: str | None) -> tuple[Any, str, Any, Any]:
    """A broker whose children import ``code`` first (None: this tree)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    mine, theirs = ctx.Pipe()
    before = os.environ.get("PYTHONPATH")
    if code is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join([code, *([before] if before else [])])
    try:
        broker = ctx.Process(
            target=serve_durable_broker, args=(endpoint, data, ready, stop, theirs)
        )
        broker.start()
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    if not ready.wait(60):
        raise SystemExit("broker did not start")
    return broker, endpoint, stop, mine


def _drop_queue(endpoint: str, producers: int, size: int, persistent: bool) -> None:
    """Delete the queue ``bench_acked`` made for such a row (the next row makes it anew,
    empty, as each row of ``bench_broker.py`` starts with a new queue)."""
    client = _client(endpoint)
    try:
        client.delete_queue(f"{'persist' if persistent else 'mem'}-{producers}-{size}-00", 1)
    finally:
        _close(client)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the other checkout's root")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--messages", type=int, default=5000, help="pushes per row")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--memory", action="store_true", help="brokers without a store")
    args = parser.parse_args(argv)
    if args.turns < 1 or args.messages < 1 or args.producers < 1 or args.size < 0:
        print("bench_acked_pairs: --turns, --messages, --producers >= 1", file=sys.stderr)
        return 2
    if not (Path(args.base) / "broker").is_dir():
        print(f"bench_acked_pairs: no broker package under {args.base}", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    persistent = not args.memory
    rows: dict[str, list[Any]] = {"base": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="bench-pairs-") as tmp:
        brokers = {}
        try:
            for name, code in (("base", str(Path(args.base).resolve())), ("this", None)):
                data = str(Path(tmp) / name) if persistent else None
                brokers[name] = _start(ctx, data, code)
            for turn in range(args.turns):
                order = ("base", "this") if turn % 2 == 0 else ("this", "base")
                for name in order:
                    broker, endpoint, _stop, stats = brokers[name]
                    row = bench_acked(ctx, endpoint, args.messages, args.producers, args.size,
                                      persistent, broker.pid, stats)  # fmt: skip
                    rows[name].append(row)
                    _drop_queue(endpoint, args.producers, args.size, persistent)
                print(
                    f"turn {turn + 1}: base {rows['base'][-1].rate:,.0f}  "
                    f"this {rows['this'][-1].rate:,.0f} msgs/s  load "
                    f"{os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        finally:
            for broker, _endpoint, stop, _stats in brokers.values():
                stop.set()
                broker.join(60)
    kind = "persistent (fsync)" if persistent else "memory"
    print(f"{kind} {args.size} B {args.producers}p, {args.messages} pushes a row, "
          f"{args.turns} turns")  # fmt: skip
    for name in ("base", "this"):
        got = rows[name]
        rates = [r.rate for r in got]
        note = (
            f"p99 median {statistics.median(r.p99 for r in got) / 1e3:.1f} ms, broker CPU "
            f"{statistics.median(r.cpu for r in got):.1f} us/msg"
        )
        if persistent:
            note += f", {statistics.median(r.per_sync for r in got):.0f} msgs/fsync"
        print(f"  {name:<5} median {statistics.median(rates):>9,.0f} msgs/s "
              f"(min {min(rates):,.0f}, max {max(rates):,.0f}); {note}")  # fmt: skip
    ratios = [t.rate / b.rate for b, t in zip(rows["base"], rows["this"], strict=True)]
    wins = sum(r > 1 for r in ratios)
    print(f"  this / base per turn: median {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)}); this faster in {wins} of "
          f"{len(ratios)}")  # fmt: skip
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
