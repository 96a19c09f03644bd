"""Spark benchmark: the broker as a Spark source and sink, FILEMQ manifests on Spark.

    python bench/bench_spark.py            # 500,000 messages, a 256 MiB tree
    python bench/bench_spark.py --quick    # 20,000 messages, a 32 MiB tree

Needs the spark extra and Java 17.  One local[2] SparkSession; the broker runs in its own
process (``broker serve`` on a loopback port), so it does not share the driver's GIL.

  (a) streaming read: N messages of 100 octets already in a queue, read by
      ``readStream.format("zerohub")`` into the ``noop`` sink (micro-batches of
      ``maxRowsPerTrigger`` = 50,000, 100,000, then 250,000; partitions of 25,000).  A row
      is one message with all the source's columns (id, channel, queue, content type,
      headers map, the 100-octet payload, sequence number, timestamp), built as pyarrow
      record batches in the Python tasks and handed to Spark.  Three rates:
      over the query's wall clock (start to the last row processed: query start and
      every micro-batch's planning, scheduling and commit included: what a user sees),
      over the micro-batches' own execution times (Spark's progress reports: the query
      start left out), and the same less Spark's fixed cost per micro-batch (what the
      reading itself runs at).  Target (issue 14): >= 50,000 rows/s.
  (a0) Spark's fixed cost: a query over 6 messages with ``maxRowsPerTrigger`` 1: the
      median execution time of a 1-row micro-batch (offsets, planning, scheduling a task
      in a Python worker, commit: paid by every micro-batch whatever its size) and the time
      from ``start()`` to the first batch's end less that (the query's start).
  (b) writer: a DataFrame of N rows of 100 octets written with ``df.write.format("zerohub")``
      (2 tasks, producer acks, 1,000 in flight per task); rows/s over the job's wall clock.
  (c) manifest: a tree of 256 KiB files in 32 folders hashed (SHA-1 + xxh3) in one
      process (``filemq manifest``'s default) and as a Spark job on local[2]; MB/s.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from broker.client.blocking import Client
from broker.spark import register
from filemq import manifest
from filemq.manifest_spark import build_on_spark
from zerohub.sparkkit import processing, session

#: maxRowsPerTrigger of the streaming read runs (a micro-batch costs Spark a fixed time to
#: plan and schedule whatever its size, shown by (a0): larger ones amortize it)
TRIGGERS = (50_000, 100_000, 250_000)


def _cpu(pid: int) -> tuple[str, float]:
    """A process's name and its CPU seconds (its own, and its waited-for children's)."""
    with open(f"/proc/{pid}/stat") as f:
        name, _, rest = f.read().partition(" (")[2].rpartition(")")
    fields = rest.split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return name, ticks / os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class CpuMeter:
    """CPU seconds of the broker process, Spark's JVM and its Python workers (every
    ``python`` process under the JVM), read from /proc before and after a run."""

    def __init__(self, spark: Any, broker: int) -> None:
        self.broker = broker
        self.jvm = int(spark.sparkContext._gateway.proc.pid)

    def read(self) -> dict[str, float]:
        out = {"broker": 0.0, "jvm": 0.0, "python": 0.0}
        pids = [(self.broker, "broker")] + [(p, "") for p in _tree(self.jvm)]
        for pid, role in pids:
            try:
                name, seconds = _cpu(pid)
            except (OSError, ValueError, IndexError):
                continue  # (gone meanwhile)
            out[role or ("python" if name.startswith("python") else "jvm")] += seconds
        return out

    @staticmethod
    def per_row(before: dict[str, float], after: dict[str, float], rows: int) -> dict[str, float]:
        """Microseconds of CPU per row, by role."""
        return {k: (after[k] - before[k]) / rows * 1e6 for k in before}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broker(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    proc = subprocess.Popen(
        # (its own --data: the default folder is shared with every other broker here)
        [sys.executable, "-m", "broker", "serve", "--bind", endpoint, "--data", str(tmp / "data")],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / "broker.log", "wb"),  # noqa: SIM115
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with Client(endpoint, timeout=2, reconnect=False) as c:
                c.stats()
            return proc, endpoint
        except Exception:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the broker did not start (see broker.log)") from None
            time.sleep(0.2)


def _fill(endpoint: str, channel: str, count: int) -> None:
    payload = b"x" * 100
    with Client(endpoint, timeout=60) as c:
        c.create_queue(channel, 1, {"Status": "Push"})
        for _ in range(count):
            c.push(channel, 1, payload)
        c.push(channel, 1, payload, ack=True)  # (in order: all before it are in)


#: Spark's per-micro-batch phases (``durationMs`` of a progress report) shown by --phases
PHASES = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets")


def _stream(spark: Any, endpoint: str, channel: str, per_trigger: int, tmp: Path) -> Any:
    df = (
        spark.readStream.format("zerohub")
        .option("endpoint", endpoint)
        .option("channel", channel)
        .option("queue", "1")
        .option("maxRowsPerTrigger", str(per_trigger))
        .option("rowsPerPartition", "25000")
        .load()
    )
    return (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp / f"{channel}-checkpoint"))
        .start()
    )


def bench_fixed_cost(spark: Any, endpoint: str, tmp: Path) -> tuple[float, float]:
    """Seconds: Spark's median execution time of a 1-row micro-batch, and the query's start
    (from ``start()`` to the end of its first micro-batch, less one micro-batch)."""
    import statistics

    _fill(endpoint, "fixed", 5)
    started = time.perf_counter()
    query, _ = processing(lambda: _stream(spark, endpoint, "fixed", 1, tmp))
    try:
        wall = time.perf_counter() - started
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert [p["numInputRows"] for p in progress] == [1] * 6, progress
    each = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    fixed = statistics.median(each)
    return fixed, wall - sum(each[1:]) - fixed


def bench_stream_read(
    spark: Any,
    endpoint: str,
    count: int,
    per_trigger: int,
    tmp: Path,
    meter: CpuMeter,
    phases: bool = False,
) -> tuple[float, float, int, dict[str, float]]:
    """Rows/s over the micro-batches' execution times and over the query's wall clock, the
    number of micro-batches, and CPU microseconds per row (broker, JVM, Python workers)."""
    channel = f"read{per_trigger}"
    _fill(endpoint, channel, count - 1)
    cpu = meter.read()
    started = time.perf_counter()
    # (started again if Spark's Python runner connects back too late: counted in the wall)
    query, _ = processing(lambda: _stream(spark, endpoint, channel, per_trigger, tmp))
    try:
        wall = time.perf_counter() - started
        used = CpuMeter.per_row(cpu, meter.read(), count)
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    rows = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    if phases:
        mean = {
            k: sum(p["durationMs"].get(k, 0) for p in progress) / len(progress) for k in PHASES
        }
        shown = ", ".join(f"{k} {v:,.0f}" for k, v in mean.items())
        print(f"  {per_trigger:,} per micro-batch, {len(progress)} batches, mean ms: {shown}")
    assert rows == count, f"read {rows} of {count}"
    return rows / busy, rows / wall, len(progress), used


def bench_write(spark: Any, endpoint: str, count: int) -> float:
    from pyspark.sql import functions as F

    with Client(endpoint, timeout=60) as c:
        c.create_queue("write", 1, {"Status": "Push"})
    df = spark.range(0, count, 1, 2).select(
        F.expr("cast(rpad(cast(id as string), 100, 'x') as binary)").alias("payload")
    )
    started = time.perf_counter()
    df.write.format("zerohub").option("endpoint", endpoint).option("channel", "write").option(
        "queue", "1"
    ).mode("append").save()
    elapsed = time.perf_counter() - started
    with Client(endpoint, timeout=60) as c:
        bounds = c.queue_bounds("write", 1)
    assert bounds.last == count, f"{bounds.last} of {count} written"
    return count / elapsed


def bench_manifest(spark: Any, tmp: Path, octets: int) -> tuple[float, float, int]:
    root = tmp / "tree"
    block = os.urandom(256 * 1024)
    files = octets // len(block)
    for i in range(files):
        folder = root / f"d{i % 32:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:05d}").write_bytes(block[i % 251 :] + block[: i % 251])
    started = time.perf_counter()
    table, stats = manifest.build(root)
    local = time.perf_counter() - started
    started = time.perf_counter()
    on_spark = build_on_spark(spark, root, str(tmp / "manifest"))
    spark_s = time.perf_counter() - started
    assert on_spark == stats and manifest.read(tmp / "manifest").equals(table)
    mb = stats.octets / 1e6
    return mb / local, mb / spark_s, stats.files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--count", type=int, help="messages (default 500,000; quick 20,000)")
    parser.add_argument(
        "--triggers",
        help=f"maxRowsPerTrigger values, comma-separated (default {','.join(map(str, TRIGGERS))})",
    )
    parser.add_argument("--read-only", action="store_true", help="only (a)")
    parser.add_argument("--phases", action="store_true", help="Spark's time per phase of (a)")
    args = parser.parse_args()
    count = args.count or (20_000 if args.quick else 500_000)
    triggers = tuple(int(t) for t in args.triggers.split(",")) if args.triggers else TRIGGERS
    octets = (32 if args.quick else 256) * 1024 * 1024
    spark = session("local[2]", "bench-spark", **{"spark.sql.shuffle.partitions": "2"})
    register(spark)
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as name:
        tmp = Path(name)
        proc, endpoint = _broker(tmp)
        try:
            spark.range(10).count()  # first action's warm-up, not timed
            fixed, start = bench_fixed_cost(spark, endpoint, tmp)
            meter = CpuMeter(spark, proc.pid)
            reads = {
                n: bench_stream_read(spark, endpoint, count, n, tmp, meter, args.phases)
                for n in triggers
            }
            if not args.read_only:
                write = bench_write(spark, endpoint, count)
                local_mb, spark_mb, files = bench_manifest(spark, tmp, octets)
        finally:
            proc.terminate()
            proc.wait(30)
    spark.stop()
    print()
    print(f"{'what':<58} {'result':>16}")
    print(f"{'-' * 58} {'-' * 16}")
    print(f"{'(a0) Spark fixed cost per micro-batch (1 row)':<58} {fixed * 1000:>13,.0f} ms")
    print(f"{'     query start (to its first micro-batch)':<58} {start * 1000:>13,.0f} ms")
    for per_trigger, (busy, wall, batches, used) in reads.items():
        what = f"(a) streaming read, {count:,} x 100 B, maxRowsPerTrigger {per_trigger:,}"
        print(what)
        print(f"{'    over the query wall clock':<58} {wall:>10,.0f} rows/s")
        print(f"{f'    over the {batches} micro-batches execution':<58} {busy:>10,.0f} rows/s")
        reading = count / (count / busy - batches * fixed)
        print(f"{'    the same less the fixed cost per micro-batch':<58} {reading:>10,.0f} rows/s")
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in used.items())
        print(f"{'    CPU us/row (query start included): ' + cpu:<58}")
    print("target (a) >= 50,000 rows/s")
    if args.read_only:
        return
    print(f"{f'(b) writer, {count:,} x 100 B, acked, 2 tasks':<58} {write:>10,.0f} rows/s")
    tree = f"{files:,} x 256 KiB"
    print(f"{f'(c) manifest, one process ({tree})':<58} {local_mb:>12,.0f} MB/s")
    print(f"{'    manifest, Spark local[2]':<58} {spark_mb:>12,.0f} MB/s")


if __name__ == "__main__":
    main()
