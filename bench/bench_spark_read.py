"""One Spark task's reading cost without Spark: CPU per row of the reader and the broker.

    python bench/bench_spark_read.py                        # this tree, 100,000 rows
    python bench/bench_spark_read.py --tree /work/main .    # two trees alternating

What ``broker.spark.reader.read_range`` (browse pages into Arrow record batches) costs
per 100-octet row, in ranges of 25,000 (as ``bench_spark.py``'s partitions): the reader's
own CPU (its process, imports left out) and the broker's (``broker serve``, /proc), one
reader at a time.  With several ``--tree``, each tree's broker and reader run from that
tree (``PYTHONPATH``), round by round alternating, so a loaded machine weighs on each
alike; the table gives the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_spark import _fill, _free_port  # noqa: E402

from broker.client.blocking import Client  # noqa: E402

_READ = """
import sys, time
from broker.spark.options import ReadOptions
from broker.spark.reader import read_range
endpoint, count, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = ReadOptions.parse({"endpoint": endpoint, "channel": "c", "queue": "1"})
cpu, wall, rows = time.process_time(), time.perf_counter(), 0
for first in range(1, count + 1, per):
    for batch in read_range(options, first, min(first + per - 1, count)):
        rows += batch.num_rows
assert rows == count, rows
print(time.process_time() - cpu, time.perf_counter() - wall)
"""


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve(tree: str, data: str) -> tuple[subprocess.Popen[bytes], str]:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--bind", endpoint, "--data", data],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": tree},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(endpoint, timeout=2, reconnect=False) as c:
                c.stats()
            return proc, endpoint
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"the broker of {tree} did not start") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="rows (default 100,000)")
    parser.add_argument("--per", type=int, default=25_000, help="rows per range (25,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--tree", nargs="+", default=[str(HERE.parent)], help="source trees")
    args = parser.parse_args()
    trees = [str(Path(t).resolve()) for t in args.tree]
    results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="bench-spark-read-") as tmp:
        brokers = {t: _serve(t, f"{tmp}/{i}") for i, t in enumerate(trees)}
        try:
            for _, endpoint in brokers.values():
                _fill(endpoint, "c", args.count)
            for _ in range(args.rounds):
                for tree, (proc, endpoint) in brokers.items():
                    before = _cpu(proc.pid)
                    out = subprocess.run(
                        [sys.executable, "-c", _READ, endpoint, str(args.count), str(args.per)],
                        env={**os.environ, "PYTHONPATH": tree},
                        cwd=tmp,
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout.split()
                    broker = _cpu(proc.pid) - before
                    per_row = 1e6 / args.count
                    row = (float(out[0]) * per_row, broker * per_row, args.count / float(out[1]))
                    results[tree].append(row)
        finally:
            for proc, _ in brokers.values():
                proc.terminate()
                proc.wait(30)
    print(f"{args.count:,} x 100 B rows in ranges of {args.per:,}, medians of {args.rounds}")
    print(f"{'tree':<40} {'reader µs/row':>14} {'broker µs/row':>14} {'rows/s':>10}")
    for tree, rows in results.items():
        reader, broker, rate = (statistics.median(r[i] for r in rows) for i in range(3))
        print(f"{tree:<40} {reader:>14.2f} {broker:>14.2f} {rate:>10,.0f}")


if __name__ == "__main__":
    main()
