"""Memory per queued message and recovery time, in-memory and persistent queues.

    python bench/bench_memory.py [--messages N]

Each measurement runs in a fresh process (RSS is per process), the engine in-process
(``Engine.receive`` with frames and their octets, as the server hands them over), one
producer, no consumer, 100-byte payloads, ids as the Python client makes them:

1. in-memory queue: RSS growth per queued message (and per message minus its payload);
2. persistent queue (``persistent`` handler, the durable log in ``os`` mode so that the
   disk does not set the pace): RSS growth per queued message, extrapolated to 10 million;
3. recovery: a fresh process opens that store and ``Engine.recover`` rebuilds the queue:
   wall and CPU seconds and RSS per message, extrapolated to 1 million messages.

``--message-timeout MS`` gives the persistent queue a MessageTimeout (that long: nothing
expires while measured): its messages page out with their deadlines kept beside their
numbers (8 octets more each) instead of being held in memory with a timer each.

``--only persistent --messages 10000000`` is the issue's 10-million run (about 2 GB of
log; ``--dir`` puts it elsewhere than the temp directory).  ``--serve`` runs it through a
real ``broker serve`` process instead: ``--producers`` client processes fill the queue
with acknowledged pushes (``--window`` in flight each; the log in ``--durability`` mode,
``batch`` by default), the broker's config file raises ``[limits] max_queue_messages``
to the count (the 1M default is left as it is); then the broker is stopped (SIGTERM)
and started again on the same data: its RSS with every message queued and the time
from its start until it answers the queue's bounds with them all.  A persistent queue pages its
payloads out to the log beyond ``Limits.paged_window`` messages (``engine.queue.messages``).

The issue's targets: <= 300 octets of overhead per in-memory message, a persistent queue
of 10 million 100-byte messages in under 1 GiB, recovery of 1 million in under 5 s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZE = 100


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def _engine(data: str | None, count: int) -> tuple[Any, Any]:
    from broker.engine.delivery import PersistentDeliveryHandler
    from broker.engine.engine import Engine
    from broker.engine.limits import Limits
    from broker.engine.options import BrokerConfig
    from broker.store.durable import DurableStore
    from broker.store.log import Durability, LogOptions, LogStore

    store = None
    if data is not None:
        store = DurableStore(LogStore(data, LogOptions(durability=Durability.OS)))
    # (a queue holds at most max_queue_messages: raised to the count measured)
    limits = Limits(max_queue_messages=max(Limits().max_queue_messages, count + 10))
    engine = Engine(
        store=store,
        handlers={"persistent": PersistentDeliveryHandler()},
        config=BrokerConfig(limits=limits),
    )
    return engine, store


def fill(data: str | None, count: int, timeout_ms: int = 0) -> dict[str, float]:
    from broker import tmqp
    from broker.protocol import ConnectionInfo, MessageType

    engine, store = _engine(data, count)
    cid, _ = engine.connect(ConnectionInfo(client_id="producer-0001"), 0.0)
    options: dict[str, Any] = {"MessageDeliveryHandler": "persistent"} if data else {}
    if options and timeout_ms:
        options["MessageTimeout"] = timeout_ms
    payload = b"x" * SIZE
    queue_type = int(MessageType.QUEUE)

    def push(i: int) -> None:
        frame = tmqp.Frame(message_type=queue_type, message_id=f"{cid}-{i:010d}", source=cid,
                           target="orders", content_type=1, payload=payload)  # fmt: skip
        octets = frame.encode()[0]
        engine.receive(cid, tmqp.decode((octets,)), 0.0, octets)

    push(0)  # (the first push creates the channel and its queue)
    queue = engine.channels["orders"].queues[1]
    if options:
        from broker.engine.options import ChannelQueueOptions

        out: list[Any] = []
        queue.apply_options(ChannelQueueOptions.from_json(options), 0.0, out)
    gc.collect()
    before = _rss()
    started = time.perf_counter()
    for i in range(1, count + 1):
        push(i)
    seconds = time.perf_counter() - started
    gc.collect()
    grown = _rss() - before
    if store is not None:
        store.flush()
        store.close()
    return {"per_message": grown / count, "seconds": seconds, "queued": queue.message_count,
            "rss": _rss()}  # fmt: skip


def recover(data: str, count: int) -> dict[str, float]:
    gc.collect()
    before = _rss()
    started, cpu = time.perf_counter(), time.process_time()
    engine, store = _engine(data, count)
    recovered = engine.recover(0.0)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    gc.collect()
    grown = _rss() - before
    store.close()
    return {"per_message": grown / max(1, recovered), "seconds": seconds, "queued": recovered,
            "cpu": cpu}  # fmt: skip


def _serve_producer(endpoint: str, count: int, window: int, start: int, out: Any) -> None:
    """One producer: ``count`` acknowledged pushes, ``window`` in flight."""
    from collections import deque

    import zmq

    from broker.client.blocking import Client

    client = Client(endpoint, context=zmq.Context(), max_outbox=window * 2).connect()
    payload = b"x" * SIZE
    inflight: deque[Any] = deque()
    push = client.push_async
    for i in range(start, start + count):
        if len(inflight) >= window:
            inflight.popleft().result(300)
        inflight.append(push("orders", 1, payload, message_id=f"p-{i:010d}", timeout=300))
    for future in inflight:
        future.result(300)
    client.close()
    client.context.term()
    out.put(count)


def _process_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_broker(data: str, config: str, endpoint: str, durability: str) -> Any:
    return subprocess.Popen(
        [sys.executable, "-m", "broker", "serve", "--data", data, "--config", config,
         "--bind", endpoint, "--durability", durability],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip


def _bounds(endpoint: str, deadline: float) -> Any:
    """The queue's bounds once the broker answers (polled until ``deadline``)."""
    import zmq

    from broker.client.blocking import Client

    while True:
        ctx = zmq.Context()
        try:
            client = Client(endpoint, context=ctx, timeout=5).connect()
            try:
                return client.queue_bounds("orders", 1, timeout=600)
            finally:
                client.close()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            ctx.term()


def serve_run(root: str, count: int, producers: int, window: int, durability: str) -> None:
    """The 10M run through a real broker process: fill, stop, restart, measure."""
    import multiprocessing
    import socket

    import zmq

    from broker.client.blocking import Client

    data = str(Path(root) / "store")
    config = str(Path(root) / "broker.json")
    Path(config).write_text(json.dumps({"limits": {"max_queue_messages": count + 10}}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    broker = _start_broker(data, config, endpoint, durability)
    ctx = zmq.Context()
    deadline = time.monotonic() + 60
    while True:  # until the broker is up
        try:
            setup = Client(endpoint, context=ctx, timeout=5).connect()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    setup.create_queue("orders", 1, {"MessageDeliveryHandler": "persistent"})
    setup.close()
    ctx.term()
    mp = multiprocessing.get_context("spawn")
    out = mp.Queue()
    per = count // producers
    procs = [
        mp.Process(target=_serve_producer,
                   args=(endpoint, per + (count % producers if k == 0 else 0), window,
                         k * per + (0 if k == 0 else count % producers), out))
        for k in range(producers)
    ]  # fmt: skip
    cpu0, started = _cpu(broker.pid), time.perf_counter()
    for p in procs:
        p.start()
    done = sum(out.get(timeout=24 * 3600) for _ in procs)
    fill_s, fill_cpu = time.perf_counter() - started, _cpu(broker.pid) - cpu0
    for p in procs:
        p.join(60)
    fill_rss = _process_rss(broker.pid)
    broker.terminate()
    broker.wait(600)
    log_bytes = sum(f.stat().st_size for f in Path(data).rglob("*") if f.is_file())
    started = time.perf_counter()
    broker = _start_broker(data, config, endpoint, durability)
    try:
        bounds = _bounds(endpoint, time.monotonic() + 3600)
        restart_s = time.perf_counter() - started
        restart_cpu = _cpu(broker.pid)
        time.sleep(1.0)
        rss = _process_rss(broker.pid)
    finally:
        broker.terminate()
        broker.wait(600)
    held = bounds.last - bounds.first + 1
    print(f"\n{'real broker serve, 100-byte messages':<44} {'value':>14}")
    print("-" * 100)
    rows = [
        ("pushed (acknowledged)", f"{done:,}",
         f"{producers} producers x {window} in flight, durability {durability}"),
        ("fill rate", f"{done / fill_s:,.0f} msgs/s",
         f"{fill_s:.0f} s wall, broker CPU {fill_cpu:.0f} s ({fill_cpu / done * 1e6:.0f} us/msg)"),
        ("broker RSS after the fill", f"{fill_rss / 2**30:.2f} GiB", ""),
        ("log on disk", f"{log_bytes / 2**30:.2f} GiB", ""),
        ("restart: until it answers bounds", f"{restart_s:.1f} s", f"CPU {restart_cpu:.1f} s"),
        ("queued after restart", f"{held:,}", f"first {bounds.first:,}, last {bounds.last:,}"),
        ("broker RSS after restart", f"{rss / 2**30:.2f} GiB",
         f"{rss / max(1, held):.0f} B/msg (target: 10M < 1 GiB)"),
    ]  # fmt: skip
    for name, value, note in rows:
        print(f"{name:<44} {value:>14}  {note}")


def _child(kind: str, data: str, count: int, timeout_ms: int = 0) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", kind, "--data", data]
    command += ["--messages", str(count), "--message-timeout", str(timeout_ms)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--child", choices=("memory", "persistent", "recover"))
    parser.add_argument("--data")
    parser.add_argument("--message-timeout", type=int, default=0,
                        help="MessageTimeout (ms) of the persistent queue")  # fmt: skip
    parser.add_argument("--only", choices=("memory", "persistent"),
                        help="only this queue kind (persistent: with its recovery)")  # fmt: skip
    parser.add_argument("--dir", help="where the persistent queue's log goes (default: tmp)")
    parser.add_argument("--serve", action="store_true",
                        help="persistent run through a real broker serve process")  # fmt: skip
    parser.add_argument("--producers", type=int, default=4, help="--serve: producer processes")
    parser.add_argument("--window", type=int, default=1000, help="--serve: acks in flight each")
    parser.add_argument("--durability", choices=("fsync", "batch", "os"), default="batch",
                        help="--serve: the broker's --durability while filling")  # fmt: skip
    args = parser.parse_args()
    if args.serve:
        with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=args.dir) as tmp:
            serve_run(tmp, args.messages, args.producers, args.window, args.durability)
        return
    if args.child:
        data = None if args.child == "memory" else args.data
        if args.child == "recover":
            print(json.dumps(recover(args.data, args.messages)))
        else:
            print(json.dumps(fill(data, args.messages, args.message_timeout)))
        return
    n = args.messages
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=args.dir) as tmp:
        data = str(Path(tmp) / "store")
        mem = _child("memory", data, n) if args.only != "persistent" else None
        timeout = args.message_timeout
        per = _child("persistent", data, n, timeout) if args.only != "memory" else None
        rec = _child("recover", data, n) if per is not None else None
    print(f"\n{'100-byte messages, one queue':<44} {'messages':>10} {'B/msg':>7}  extrapolated")
    print("-" * 100)
    if mem is not None:
        print(f"{'in-memory queue: RSS per queued message':<44} {mem['queued']:>10,.0f} "
              f"{mem['per_message']:>7.0f}  overhead {mem['per_message'] - SIZE:.0f} B "
              f"(target <= 300)")  # fmt: skip
    if per is not None and rec is not None:
        gib = per["per_message"] * 10e6 / 2**30
        print(f"{'persistent queue: RSS per queued message':<44} {per['queued']:>10,.0f} "
              f"{per['per_message']:>7.0f}  10M queued: {gib:.2f} GiB (target < 1); "
              f"process RSS {per['rss'] / 2**30:.2f} GiB")  # fmt: skip
        print(f"{'recovery (open + Engine.recover)':<44} {rec['queued']:>10,.0f} "
              f"{rec['per_message']:>7.0f}  {rec['seconds']:.2f} s; 1M: "
              f"{rec['seconds'] * 1e6 / max(1, rec['queued']):.1f} s (target < 5); "
              f"CPU {rec['cpu']:.2f} s, 1M: "
              f"{rec['cpu'] * 1e6 / max(1, rec['queued']):.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
