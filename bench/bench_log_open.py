"""The log's open scan alone (``LogStore`` opening a data directory), over two shapes.

    python bench/bench_log_open.py [--records N] [--runs R] [--dir DIR]

``backlog``: N PUTs of 180 B in one queue, nothing acknowledged (what a restart with
a long queue scans).  ``acknowledged``: N PUTs each followed, 50 records later, by the
REMOVE an acknowledge writes (a log a live consumer leaves: 2N records).  Each is
written once (durability ``os``, clean close); then each run opens it in a fresh
process and prints the CPU seconds of the open (recovery scan: checksums, index) and
per million records.  To compare two checkouts, run each one's copy with its own tree
on ``PYTHONPATH``, in turns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from broker.store.log import Durability, LogOptions, LogStore

QUEUE = ("orders", 1)
BLOB = b"x" * 180
LAG = 50  # records between a PUT and its REMOVE in the acknowledged shape


def fill(path: Path, shape: str, count: int) -> None:
    with LogStore(path, LogOptions(durability=Durability.OS)) as store:
        for i in range(1, count + 1):
            store.append(QUEUE, BLOB)
            if shape == "acknowledged" and i > LAG:
                store.remove(QUEUE, i - LAG)


def open_once(path: str) -> None:
    """In a fresh process: one open; its CPU seconds and the records it replayed."""
    cpu = time.process_time()
    store = LogStore(path, LogOptions(durability=Durability.OS))
    spent = time.process_time() - cpu
    records = store.stats().recovered_records
    store.close()
    print(spent, records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--open", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.open:
        open_once(args.open)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-log-open-", dir=args.dir))
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"{'shape':>13} {'records':>10} {'run':>3} {'open CPU s':>10} {'per 1M s':>8}")
        for shape in ("backlog", "acknowledged"):
            path = root / shape
            fill(path, shape, args.records)
            for run in range(1, args.runs + 1):
                out = subprocess.run(
                    [sys.executable, __file__, "--open", str(path)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.split()
                spent, records = float(out[0]), int(out[1])
                print(
                    f"{shape:>13} {records:>10,} {run:>3} {spent:>10.2f} "
                    f"{spent * 1_000_000 / records:>8.2f}"
                )
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
