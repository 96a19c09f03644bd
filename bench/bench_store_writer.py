"""The durable log's writer thread per message: CPU (``/proc/self/task/TID/schedstat``,
nanoseconds), write system calls (``/proc/self/task/TID/io`` ``syscw``) and voluntary
context switches (each a wait for the disk or the interpreter lock), for this checkout
and, with ``--base PATH``, another one in turns (same run).

The shape of the broker's persistent rows without the broker: one thread appends groups
of ``--group`` records of ``--size`` octets (``LogStore.append_many``, as a drain's run of
one producer's pushes) in ``fsync`` mode and keeps ``--in-flight`` groups waiting for
their completion (8 producers' runs), so the writer takes several groups per batch as
in the broker.  Counts, not rates: the writer's calls and switches per batch do not
move with the machine's load; CPU per message less than wall time.

Usage: ``python bench/bench_store_writer.py [--messages N] [--size OCTETS] [--group G]
[--in-flight F] [--turns T] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench_client_push import in_turns, measure


def thread_counts(tid: int) -> tuple[int, int, int]:
    """(CPU ns, write system calls, voluntary context switches) of thread ``tid``."""
    task = Path(f"/proc/self/task/{tid}")
    cpu_ns = int((task / "schedstat").read_text().split()[0])
    io = dict(line.split(": ") for line in (task / "io").read_text().splitlines())
    switches = 0
    for line in (task / "status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            switches = int(line.split()[1])
    return cpu_ns, int(io["syscw"]), switches


def child(count: int, size: int, group: int, in_flight: int) -> dict[str, Any]:
    """Append ``count`` records in groups; the writer's counts per message and batch."""
    from broker.store.log import LogStore
    from broker.store.log.records import NO_META

    queue = ("bench", 1)
    items = [((b"%08d" % k) * (size // 8 + 1))[:size] for k in range(group)]
    with tempfile.TemporaryDirectory(prefix="bench-store-writer-") as data:
        store = LogStore(data)
        writer = next(t for t in threading.enumerate() if t.name == "store-writer")
        assert writer.native_id is not None
        waiting: deque[int] = deque()

        def push(n: int) -> None:
            for start in range(0, n, group):
                if len(waiting) >= in_flight:
                    store.wait(waiting.popleft(), 60)
                chunk = items[: min(group, n - start)]
                waiting.append(store.append_many(queue, [(b, NO_META, 0) for b in chunk])[1])
            while waiting:
                store.wait(waiting.popleft(), 60)

        push(min(count, 4 * group * in_flight))  # warm-up: the head open, the caches made
        stats0 = store.stats()
        before = thread_counts(writer.native_id)
        main0 = time.thread_time_ns()
        wall0 = time.perf_counter()
        push(count)
        wall = time.perf_counter() - wall0
        main_ns = time.thread_time_ns() - main0
        after = thread_counts(writer.native_id)
        stats = store.stats()
        store.close()
    batches = max(1, stats.batches - stats0.batches)
    return {
        "writer_us": (after[0] - before[0]) / count / 1e3,
        "appender_us": main_ns / count / 1e3,
        "writes_per_batch": (after[1] - before[1]) / batches,
        "switches_per_batch": (after[2] - before[2]) / batches,
        "msgs_per_batch": count / batches,
        "rate": count / wall,
        "store": sys.modules["broker.store.log"].__file__,
    }


#: ``child`` in a fresh interpreter (``bench_client_push.measure``: the checkout first on
#: the path); its arguments: messages, size, group, in flight
_CHILD = f"""import json, sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from bench_store_writer import child
print(json.dumps(child(*map(int, sys.argv[1:]))))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=4096, help="payload octets")
    parser.add_argument("--group", type=int, default=64, help="records per append_many")
    parser.add_argument("--in-flight", type=int, default=8, help="groups waiting at most")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args(argv)
    if min(args.messages, args.group, args.in_flight, args.turns) < 1 or args.size < 0:
        print("--messages, --group, --in-flight, --turns must be at least 1, --size at "
              "least 0", file=sys.stderr)  # fmt: skip
        return 2
    print(f"{'turn':<5} {'checkout':<9} {'writer us':>10} {'appender us':>12} "
          f"{'writes/batch':>13} {'switches/batch':>15} {'msgs/batch':>11} {'msgs/s':>8} "
          f"{'load':>6}")  # fmt: skip
    for turn, name, root in in_turns(args.base, args.turns):
        try:
            r: dict[str, Any] = measure(root, args.messages, _CHILD, str(args.size),
                                        str(args.group), str(args.in_flight))  # fmt: skip
        except subprocess.CalledProcessError as exc:
            print(f"the {name} checkout failed: {exc.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)  # fmt: skip
            return 1
        if not str(r.pop("store")).startswith(str(root)):
            print(f"measured another checkout than {root}", file=sys.stderr)
            return 1
        print(f"{turn:<5} {name:<9} {r['writer_us']:>10.2f} {r['appender_us']:>12.2f} "
              f"{r['writes_per_batch']:>13.2f} {r['switches_per_batch']:>15.2f} "
              f"{r['msgs_per_batch']:>11.0f} {r['rate']:>8,.0f} {os.getloadavg()[0]:>6.1f}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
