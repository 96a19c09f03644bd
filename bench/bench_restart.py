"""A whole broker restart over its data directory, split into its parts.

    python bench/bench_restart.py [--messages N ...] [--runs R] [--dir DIR] [--profile]
    python bench/bench_restart.py --log-only [--messages N ...] [--runs R] [--dir DIR]

For each N (default 100,000 and 200,000): a data directory is filled in-process (one
persistent queue with acknowledge requests, N messages of 100 B, durability ``os``, then a
clean close), and a fresh process times what ``broker serve --data DIR`` does before it
serves: open the log (recovery scan: checksums, index), then ``Engine.recover`` (decode
every blob, re-create the queue, restore every message).  Printed per run: seconds for
the log open, for the engine's recovery, in total, messages per second, and the total
extrapolated linearly to 1,000,000 messages.  ``--profile`` prints the top of a cProfile
of one restart instead.

``--log-only`` times the log's open alone (CPU seconds, and per million records) over two
logs written with ``LogStore`` directly: ``backlog``, N PUTs of 180 B in one queue, and
``acknowledged``, N PUTs each followed, 50 records later, by the REMOVE its acknowledge
writes (what a live consumer leaves: 2N records).

The machine may be shared: the load average is printed with the table; figures are
wall clock and CPU (process time) seconds.
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

from broker.engine.delivery import PersistentDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import ChannelQueueOptions
from broker.message import Message
from broker.protocol import ConnectionInfo
from broker.store.durable import DurableStore
from broker.store.log import Durability, LogOptions, LogStore

CHANNEL, QUEUE = "orders", 1
PAYLOAD = b"x" * 100
LOG_QUEUE, LOG_BLOB = ("orders", 1), b"x" * 180  # --log-only
ACK_LAG = 50  # records between a PUT and its REMOVE in the ``acknowledged`` log


def _handlers() -> dict[str, PersistentDeliveryHandler]:
    return {"persistent": PersistentDeliveryHandler()}


def fill(path: Path, count: int) -> None:
    """A data directory holding ``count`` persistent messages, as a broker leaves it."""
    options = ChannelQueueOptions(message_delivery_handler="persistent", request_acknowledge=True)
    with LogStore(path, LogOptions(durability=Durability.OS)) as log:
        engine = Engine(store=DurableStore(log), handlers=_handlers())
        engine.create_channel(CHANNEL)
        engine.create_queue(CHANNEL, QUEUE, options)
        producer, _ = engine.connect(ConnectionInfo(client_id="producer"), now=0.0)
        for i in range(count):
            m = Message(target=CHANNEL, content_type=QUEUE, message_id=f"m{i}", payload=PAYLOAD)
            engine.publish(producer, m, now=0.0)


def fill_log(path: Path, shape: str, count: int) -> None:
    """A log of ``count`` PUTs (``backlog``), each removed ACK_LAG later (``acknowledged``)."""
    with LogStore(path, LogOptions(durability=Durability.OS)) as store:
        for i in range(1, count + 1):
            store.append(LOG_QUEUE, LOG_BLOB)
            if shape == "acknowledged" and i > ACK_LAG:
                store.remove(LOG_QUEUE, i - ACK_LAG)


def open_log(path: str) -> None:
    """In a fresh process: the log's open alone; its CPU seconds and records replayed."""
    cpu = time.process_time()
    log = LogStore(path, LogOptions(durability=Durability.OS))
    spent = time.process_time() - cpu
    print(spent, log.stats().recovered_records)
    log.close()


def restart(path: str) -> None:
    """In a fresh process: what ``broker serve`` does before serving; one line of figures."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    log = LogStore(path, LogOptions(durability=Durability.OS))
    wall1, cpu1 = time.perf_counter(), time.process_time()
    engine = Engine(store=DurableStore(log), handlers=_handlers())
    count = engine.recover(time.monotonic())
    wall2, cpu2 = time.perf_counter(), time.process_time()
    queue = engine.channels[CHANNEL].queues[QUEUE]
    assert queue.message_count == count, (queue.message_count, count)
    log.close()
    print(count, wall1 - wall0, wall2 - wall1, cpu1 - cpu0, cpu2 - cpu1)


def profile(path: str) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    log = LogStore(path, LogOptions(durability=Durability.OS))
    engine = Engine(store=DurableStore(log), handlers=_handlers())
    engine.recover(time.monotonic())
    profiler.disable()
    log.close()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def _child(mode: str, path: Path) -> str:
    out = subprocess.run(
        [sys.executable, __file__, f"--{mode}", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[100_000, 200_000])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--log-only", action="store_true")
    parser.add_argument("--restart", help=argparse.SUPPRESS)
    parser.add_argument("--profile-child", help=argparse.SUPPRESS)
    parser.add_argument("--open-log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.restart:
        restart(args.restart)
        return
    if args.profile_child:
        profile(args.profile_child)
        return
    if args.open_log:
        open_log(args.open_log)
        return
    root = Path(tempfile.mkdtemp(prefix="bench-restart-", dir=args.dir))
    try:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if args.log_only:
            _log_only(root, args.messages, args.runs)
            return
        if not args.profile:
            print(
                f"{'messages':>10} {'run':>3} {'log open s':>10} {'engine s':>9} "
                f"{'total s':>8} {'CPU s':>6} {'log CPU':>7} {'eng CPU':>7} {'msgs/s':>9} "
                f"{'1M est s':>8} {'1M CPU s':>8}"
            )
        for count in args.messages:
            path = root / str(count)
            fill(path, count)
            if args.profile:
                print(_child("profile-child", path))
                continue
            for run in range(1, args.runs + 1):
                fields = _child("restart", path).split()
                got = int(fields[0])
                log_s, engine_s, log_cpu, engine_cpu = map(float, fields[1:])
                total = log_s + engine_s
                print(
                    f"{got:>10,} {run:>3} {log_s:>10.2f} {engine_s:>9.2f} {total:>8.2f} "
                    f"{log_cpu + engine_cpu:>6.2f} {log_cpu:>7.2f} {engine_cpu:>7.2f} "
                    f"{got / total:>9,.0f} {total * 1_000_000 / got:>8.1f} "
                    f"{(log_cpu + engine_cpu) * 1_000_000 / got:>8.1f}"
                )
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _log_only(root: Path, counts: list[int], runs: int) -> None:
    print(f"{'log':>13} {'records':>10} {'run':>3} {'open CPU s':>10} {'per 1M s':>8}")
    for count in counts:
        for shape in ("backlog", "acknowledged"):
            path = root / f"{shape}-{count}"
            fill_log(path, shape, count)
            for run in range(1, runs + 1):
                fields = _child("open-log", path).split()
                spent, records = float(fields[0]), int(fields[1])
                per_million = spent * 1_000_000 / records
                print(f"{shape:>13} {records:>10,} {run:>3} {spent:>10.2f} {per_million:>8.2f}")
            shutil.rmtree(path)


if __name__ == "__main__":
    main()
