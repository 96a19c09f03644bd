"""The durable log store (broker/store/log) against the disk's own limits and sqlite3.

    python bench/bench_store.py [--quick] [--dir DIR] [--seconds S] [--records N]
    python bench/bench_store.py --zeros-ahead [--dir DIR] [--seconds S]

Everything in one run, on the file system of ``--dir`` (default: a temp folder in the
system temp directory):

1. the disk: fsyncs per second (write 100 B + fsync, in a loop) and sequential write
   MB/s with an fsync after every 1 MiB;
2. appends of 100 B and 4 KiB records.  "sync" rows: each appender thread appends one
   record and waits for its completion before the next (a producer waiting for its ack),
   with 1 and 8 threads.  "pipelined" rows: one thread keeps up to 1,000 appends in flight
   and learns of completions through the store's callback (how the single-threaded broker
   server would use it).  msgs/s, p99 completion latency, records per fsync.  Modes
   ``fsync``, ``batch`` (10 ms) and ``os``;
3. sqlite3 (stdlib) in WAL mode with synchronous=FULL, same workload: "commit each" (every
   append its own transaction, one connection per thread) and "group commit" (a writer
   thread commits everything queued in one transaction: the same batching the log does);
4. recovery: a store of N records (default 1,000,000 of 100 B) is reopened in a fresh
   process: recovery time (wall and CPU), RSS per live record, and the RSS extrapolated
   to 10 million records; plus reads by sequence number (pread + checksum) per second.

``--zeros-ahead`` runs only a comparison of the log with and without zeros written ahead
of the head (``LogOptions.preallocate`` 0 against 4 MiB), ``fsync`` and ``batch`` modes,
the two taking turns within each row; "sync ms" is the mean duration of the head's
syncs (``stats().sync_seconds / syncs``).

The machine may be shared: the load average is printed with the table; latencies are
wall-clock, recovery is given in CPU seconds too.  Row 4 is the log alone: a whole broker
restart (log open, blob decode, queues restored) is ``bench/bench_restart.py``.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from broker.store.log import Durability, LogOptions, LogStore

Q = ("orders", 1)
WINDOW = 1000  # appends in flight in the pipelined rows
SLICES = 4  # turns each subject gets in a comparison


@dataclass
class Row:
    engine: str
    mode: str
    size: int
    appenders: str
    rate: float
    p99_ms: float
    per_sync: float | None = None


def _p99(latencies: list[float]) -> float:
    if not latencies:
        return float("nan")
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


# -- the disk ---------------------------------------------------------------------------


def disk_fsync_rate(directory: Path, seconds: float) -> float:
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        count = 0
        end = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < end:
            os.write(fd, b"x" * 100)
            os.fsync(fd)
            count += 1
        return count / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()


def disk_write_mbps(directory: Path, seconds: float) -> float:
    path = directory / "write-probe"
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        end = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < end or written < 8 << 20:
            os.write(fd, chunk)
            os.fsync(fd)
            written += len(chunk)
        return written / (time.perf_counter() - started) / 1e6
    finally:
        os.close(fd)
        path.unlink()


# -- workloads --------------------------------------------------------------------------

#: append(blob) -> ticket; wait(ticket)
Append = Callable[[bytes], int]
Wait = Callable[[int], None]


def run_sync(
    append: Append, wait: Wait, threads: int, size: int, seconds: float
) -> tuple[int, float, list[float]]:
    """Each thread: append, wait for completion, again.  (count, seconds, latencies)."""
    blob = b"m" * size
    latencies: list[list[float]] = [[] for _ in range(threads)]
    end = time.perf_counter() + seconds

    def producer(k: int) -> None:
        mine = latencies[k]
        while time.perf_counter() < end:
            started = time.perf_counter()
            wait(append(blob))
            mine.append(time.perf_counter() - started)

    workers = [threading.Thread(target=producer, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    every = [x for chunk in latencies for x in chunk]
    return len(every), elapsed, every


class Tracker:
    """Completion times of tickets, from a completion callback (in ticket order)."""

    def __init__(self) -> None:
        self.sent: dict[int, float] = {}
        self.latencies: list[float] = []
        self.done = 0
        self.cond = threading.Condition()

    def on_complete(self, done: int) -> None:
        now = time.perf_counter()
        with self.cond:
            for ticket in range(self.done + 1, done + 1):
                sent = self.sent.pop(ticket, None)
                if sent is not None:
                    self.latencies.append(now - sent)
            self.done = max(self.done, done)
            self.cond.notify_all()


def run_pipelined(
    append: Append, tracker: Tracker, size: int, seconds: float
) -> tuple[int, float, list[float]]:
    """One thread, up to WINDOW appends in flight.  (count, seconds, latencies)."""
    blob = b"m" * size
    count = 0
    started = time.perf_counter()
    end = started + seconds
    last = tracker.done
    while time.perf_counter() < end:
        with tracker.cond:
            while last - tracker.done >= WINDOW:
                tracker.cond.wait()
            tracker.sent[last + 1] = time.perf_counter()  # one appender: tickets go +1
        ticket = append(blob)
        assert ticket == last + 1, (ticket, last)
        last = ticket
        count += 1
    with tracker.cond:
        while tracker.done < last:
            tracker.cond.wait()
        latencies, tracker.latencies = tracker.latencies, []
    return count, time.perf_counter() - started, latencies


@dataclass
class Subject:
    """A store under test, kept open while the workload alternates between subjects."""

    engine: str
    mode: str
    append: Append
    wait: Wait
    tracker: Tracker
    close: Callable[[], float | None]  # closes; records per fsync (or per commit)
    count: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def run(self, size: int, appenders: str, seconds: float) -> None:
        if appenders == "pipelined":
            count, elapsed, latencies = run_pipelined(self.append, self.tracker, size, seconds)
        else:
            count, elapsed, latencies = run_sync(
                self.append, self.wait, int(appenders), size, seconds
            )
        self.count += count
        self.elapsed += elapsed
        self.latencies += latencies


def _ignore(_value: object) -> None:
    return None


def open_log(
    path: Path,
    mode: Durability,
    preallocate: int | None = None,
    sync_ms: list[float] | None = None,
) -> Subject:
    """The log store; ``preallocate`` None: its default.  ``sync_ms`` gets the mean sync
    duration appended when the subject closes."""
    tracker = Tracker()
    options = LogOptions(durability=mode)
    if preallocate is not None:
        options = LogOptions(durability=mode, preallocate=preallocate)
    store = LogStore(path, options, tracker.on_complete)

    def close() -> float | None:
        stats = store.stats()
        count = store.bounds(Q).count
        store.close()
        if sync_ms is not None:
            sync_ms.append(stats.sync_seconds / stats.syncs * 1000 if stats.syncs else 0.0)
        return _per(count, stats.syncs)

    return Subject(
        "log",
        str(mode) if preallocate is None else f"{mode} z={preallocate >> 20}M",
        lambda blob: store.append(Q, blob).ticket,
        lambda ticket: _ignore(store.wait(ticket)),
        tracker,
        close,
    )


def open_sqlite_group(path: Path) -> Subject:
    tracker = Tracker()
    group = SqliteGroup(path, tracker.on_complete)

    def close() -> float | None:
        group.close()
        return group.ticket / group.commits if group.commits else None

    return Subject("sqlite", "group commit", group.append, group.wait, tracker, close)


def open_sqlite_each(path: Path) -> Subject:
    each = SqliteEach(path)

    def close() -> float | None:
        each.close()
        return 1.0

    return Subject("sqlite", "commit each", each.append, lambda _t: None, Tracker(), close)


def compare(subjects: list[Subject], size: int, appenders: str, seconds: float) -> list[Row]:
    """Run the subjects in turn, SLICES times each, so that a disk whose speed changes
    from one second to the next treats them alike; one row per subject."""
    for _ in range(SLICES):
        for subject in subjects:
            subject.run(size, appenders, seconds / SLICES)
    label = appenders if appenders == "pipelined" else f"{appenders} sync"
    rows = []
    for subject in subjects:
        per = subject.close()
        rate = subject.count / subject.elapsed if subject.elapsed else 0.0
        rows.append(
            Row(subject.engine, subject.mode, size, label, rate, _p99(subject.latencies), per)
        )
    return rows


def _per(count: int, syncs: int) -> float | None:
    return count / syncs if syncs else None


# -- sqlite3 ----------------------------------------------------------------------------


def _sqlite(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS messages (channel TEXT, queue INTEGER, seq INTEGER,"
        " blob BLOB, PRIMARY KEY (channel, queue, seq))"
    )
    return db


class SqliteGroup:
    """A writer thread commits every queued insert in one transaction (group commit)."""

    def __init__(self, path: Path, on_complete: Callable[[int], None] | None = None) -> None:
        self.db = _sqlite(path)
        self.pending: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.ticket = 0
        self.done = 0
        self.cond = threading.Condition()
        self.on_complete = on_complete
        self.commits = 0
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def append(self, blob: bytes) -> int:
        with self.lock:
            self.ticket += 1
            self.pending.put((self.ticket, blob))
            return self.ticket

    def wait(self, ticket: int) -> None:
        with self.cond:
            while self.done < ticket:
                self.cond.wait()

    def run(self) -> None:
        stop = False
        while not stop:
            batch = [self.pending.get()]
            while True:
                try:
                    batch.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            items = [b for b in batch if b is not None]
            stop = len(items) < len(batch)
            if not items:
                continue
            self.db.execute("BEGIN")
            self.db.executemany(
                "INSERT INTO messages VALUES ('orders', 1, ?, ?)", [(t, b) for t, b in items]
            )
            self.db.execute("COMMIT")
            self.commits += 1
            with self.cond:
                self.done = items[-1][0]
                self.cond.notify_all()
            if self.on_complete is not None:
                self.on_complete(self.done)

    def close(self) -> None:
        self.pending.put(None)
        self.thread.join()
        self.db.close()


class SqliteEach:
    """Every append its own transaction, one connection per thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _sqlite(path).close()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.seq = 0
        self.made: list[sqlite3.Connection] = []

    def append(self, blob: bytes) -> int:
        db = getattr(self.local, "db", None)
        if db is None:
            db = self.local.db = _sqlite(self.path)
            with self.lock:
                self.made.append(db)
        with self.lock:
            self.seq += 1
            seq = self.seq
        db.execute("INSERT INTO messages VALUES ('orders', 1, ?, ?)", (seq, blob))
        return seq

    def close(self) -> None:
        for db in self.made:
            db.close()


def durable_table(root: Path, seconds: float) -> None:
    """fsync mode beside sqlite3, workload by workload, each group after a fresh probe of
    the disk's fsync rate (on a shared machine it changes from minute to minute)."""
    print(f"{'engine':7} {'mode':13} {'size':>5} {'appenders':>10} {'msgs/s':>10} "
          f"{'p99 ms':>8} {'per fsync':>9}")  # fmt: skip
    for size in (100, 4096):
        for appenders in ("1", "8", "pipelined"):
            probe = disk_fsync_rate(root, min(seconds, 0.5))
            print(f"-- disk before this group: {probe:,.0f} fsyncs/s")
            where = root / f"{size}-{appenders}"
            where.mkdir()
            subjects = [
                open_log(where / "log", Durability.FSYNC),
                open_sqlite_group(where / "group.db"),
            ]
            if appenders != "pipelined":
                subjects.append(open_sqlite_each(where / "each.db"))
            for row in compare(subjects, size, appenders, seconds):
                _print(row)
            shutil.rmtree(where)
    print()
    print("log store without waiting for fsync (batch: fsync every 10 ms; os: never)")
    for mode in (Durability.BATCH, Durability.OS):
        for size in (100, 4096):
            for appenders in ("1", "8"):
                where = root / f"{mode}-{size}-{appenders}"
                (row,) = compare([open_log(where, mode)], size, appenders, seconds)
                _print(row)
                shutil.rmtree(where)


def zeros_ahead_table(root: Path, seconds: float) -> None:
    """The log with zeros ahead of the head (4 MiB) and without, taking turns per row."""
    print(f"{'engine':7} {'mode':13} {'size':>5} {'appenders':>10} {'msgs/s':>10} "
          f"{'p99 ms':>8} {'per fsync':>9} {'sync ms':>8}")  # fmt: skip
    for mode in (Durability.FSYNC, Durability.BATCH):
        for size in (100, 4096):
            for appenders in ("1", "8", "pipelined"):
                where = root / f"zeros-{mode}-{size}-{appenders}"
                where.mkdir()
                sync_ms: list[float] = []
                subjects = [
                    open_log(where / "off", mode, 0, sync_ms),
                    open_log(where / "on", mode, 4 << 20, sync_ms),
                ]
                rows = compare(subjects, size, appenders, seconds)
                for row, ms in zip(rows, sync_ms, strict=True):
                    per = "" if row.per_sync is None else f"{row.per_sync:,.1f}"
                    print(f"{row.engine:7} {row.mode:13} {row.size:>5} {row.appenders:>10} "
                          f"{row.rate:>10,.0f} {row.p99_ms:>8.2f} {per:>9} "
                          f"{ms:>8.2f}")  # fmt: skip
                shutil.rmtree(where)


def _print(row: Row) -> None:
    per = "" if row.per_sync is None else f"{row.per_sync:,.1f}"
    print(f"{row.engine:7} {row.mode:13} {row.size:>5} {row.appenders:>10} "
          f"{row.rate:>10,.0f} {row.p99_ms:>8.2f} {per:>9}")  # fmt: skip


# -- recovery and memory ----------------------------------------------------------------


def _rss_kib(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def measure_open(directory: str, records: int) -> None:
    """In a fresh process: open the store, print recovery and memory figures."""
    import gc

    gc.collect()
    before = _rss_kib()
    cpu = time.process_time()
    wall = time.perf_counter()
    store = LogStore(directory, LogOptions(durability=Durability.OS))
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    gc.collect()
    after = _rss_kib()
    stats = store.stats()
    assert stats.live_records == records, (stats.live_records, records)
    reads = 20_000
    started = time.perf_counter()
    step = max(1, records // reads)
    for seq in range(1, records + 1, step):
        store.read(Q, seq)
    read_rate = len(range(1, records + 1, step)) / (time.perf_counter() - started)
    store.close()
    print(
        wall,
        cpu,
        stats.recovery_seconds,
        before,
        after,
        _rss_kib("VmHWM"),
        stats.index_bytes,
        read_rate,
    )


def recovery_rows(directory: Path, records: int) -> list[str]:
    path = directory / "recovery"
    blob = b"r" * 100
    started = time.perf_counter()
    with LogStore(path, LogOptions(durability=Durability.OS)) as store:
        for _ in range(records):
            store.append(Q, blob)
        store.flush()
        disk = store.stats().disk_bytes
    filled = time.perf_counter() - started
    out = subprocess.run(
        [sys.executable, __file__, "--measure-open", str(path), str(records)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    wall, cpu, scan, before, after, peak, index_bytes, read_rate = map(float, out)
    per_record = (after - before) * 1024 / records
    ten_million = (before * 1024 + per_record * 10_000_000) / (1 << 20)
    shutil.rmtree(path)
    return [
        f"filled {records:,} x 100 B records (os mode, 1 thread, no waits): "
        f"{records / filled:,.0f} appends/s, {disk / 1e6:.0f} MB on disk",
        f"open (recovery scan) of {records:,} records: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"(scan {scan:.2f} s)   target < 5 s",
        f"RSS: {before / 1024:.0f} MiB before open, {after / 1024:.0f} MiB after, "
        f"peak {peak / 1024:.0f} MiB (a 64 MiB segment is read whole while scanned)",
        f"RSS per live record: {per_record:.1f} B (index columns: "
        f"{index_bytes / records:.1f} B)  ->  10 million records: ~{ten_million:,.0f} MiB "
        f"(extrapolated)",
        f"reads by sequence number (pread + checksum): {read_rate:,.0f}/s",
    ]


# -- main -------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short rows (a smoke run)")
    parser.add_argument("--dir", help="where to write (its file system is measured)")
    parser.add_argument("--seconds", type=float, help="seconds per row (default 2)")
    parser.add_argument("--records", type=int, help="records for the recovery row")
    parser.add_argument(
        "--zeros-ahead", action="store_true", help="only: preallocate 0 against 4 MiB"
    )
    parser.add_argument("--measure-open", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_open:
        measure_open(args.measure_open[0], int(args.measure_open[1]))
        return
    seconds = args.seconds or (0.3 if args.quick else 2.0)
    if args.zeros_ahead:
        root = Path(tempfile.mkdtemp(prefix="bench-zeros-", dir=args.dir))
        try:
            print(f"directory {root}; load average {os.getloadavg()[0]:.1f}")
            print(f"disk: {disk_fsync_rate(root, seconds):,.0f} fsyncs/s (100 B + fsync)")
            zeros_ahead_table(root, seconds)
            print(f"load average now {os.getloadavg()[0]:.1f}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    records = args.records or (20_000 if args.quick else 1_000_000)
    root = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.dir))
    try:
        print(f"directory {root}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        fsyncs = disk_fsync_rate(root, seconds)
        mbps = disk_write_mbps(root, seconds)
        print(f"disk: {fsyncs:,.0f} fsyncs/s (100 B + fsync); "
              f"{mbps:,.0f} MB/s sequential with fsync")  # fmt: skip
        print()
        durable_table(root, seconds)
        print(f"load average now {os.getloadavg()[0]:.1f}")
        print()
        for line in recovery_rows(root, records):
            print(line)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
