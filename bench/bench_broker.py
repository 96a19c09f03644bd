"""Broker throughput and latency, against raw pyzmq (and RabbitMQ) measured in the same run.

Every party runs in its own process (spawned), on loopback TCP, 100-byte messages:

* raw pyzmq DEALER -> ROUTER: the ceiling for one Python sender and one receiver;
* raw pyzmq forwarder: source DEALER -> ROUTER -> sink DEALER, the ROUTER process doing
  nothing but 2 receives and 2 sends per message: the ceiling of any one-process Python
  broker that moves one ZeroMQ message per TMQP frame (zerohub rows give the broker's CPU);
* raw pyzmq round trip (DEALER -> ROUTER echo -> DEALER), one message at a time,
  measured in blocks alternating with the zerohub round trips (same conditions);
* zerohub 1 producer -> broker -> 1 consumer on a push queue (non-persistent,
  fire-and-forget pushes; the producer's last push waits for the broker's ack);
* zerohub 4 producers / 4 consumers: four channels, one push queue each;
* "batched" rows: the same with ``push_many`` (``BATCH`` pushes per TMQP batch,
  ``broker.batch``) and consumers reading batched deliveries; in the acknowledged rows,
  8 producers with ``push_many_async`` (``PERSIST_BATCH`` per batch, the same
  ``PERSIST_WINDOW`` in flight);
* broadcast (``--broadcast N``, default 50): raw pyzmq PUB -> N SUB processes against a
  zerohub broadcast queue (Status 0) -> N consumer processes, messages/50 per consumer,
  once sent one by one by the broker and once published on its fan-out socket
  (``serve --fanout``, ``broker.engine.fanout``: libzmq copies to the N SUBs), the
  latter read as messages and raw (``Client(raw_fanout="payloads")``);
  the rate is the producer's messages per second until every consumer has them all;
* zerohub round trip: a client pushes into a queue of a channel it joined and waits
  for the delivery, one message at a time;
* zerohub rows use poll-on-call clients (``Client(threaded=False)``, no I/O thread);
  the "(threaded)" rows use the default client with its background I/O thread;
* the broker is ``broker.server.Server`` + ``broker.engine.Engine`` in one process;
* with ``--rabbitmq``: RabbitMQ over STOMP (auto-ack) and over AMQP with pika
  (no confirms, auto-ack), installed with apt-get/pip and started in a temp dir.

* acknowledged pushes (``--persistent-only`` runs just these): each producer process
  keeps ``PERSIST_WINDOW`` pushes in flight, 100 B and 4 KiB, 1 and 8 producers, to the
  same broker without a store ("memory", the non-persistent baseline) and with ``--data``
  in fsync mode ("persistent"): msgs/s, p50/p99 ack latency, the broker's CPU per message
  and messages per fsync; beside them the disk's fsyncs/s and fsync'd sequential MB/s,
  and with ``--rabbitmq`` a durable queue with publisher confirms (pika, persistent
  messages, best of 1/4/8 producer processes; pika's blocking channel waits for each
  confirm, so one publish in flight per process).  The 8-producer 100 B rows also run
  "batched" (``push_many_async``, TMQP batches) and "singles" (each push sent alone,
  client ``batch=0``: the broker gathers a drain's into runs, ``Engine.receive_pushes``).

Usage: ``python bench/bench_broker.py [--quick] [--messages N] [--rabbitmq]
[--persistent-only]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing as mp
import os
import queue
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

SIZE = 100
PAYLOAD = b"x" * SIZE


@dataclass
class Row:
    name: str
    rate: float | None = None  # messages per second
    p50: float | None = None  # microseconds
    p99: float | None = None
    note: str = ""
    cpu: float | None = None  # the broker's CPU microseconds per message
    per_sync: float | None = None  # messages per fsync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return p50 * 1e6, p99 * 1e6


# -- raw pyzmq -------------------------------------------------------------------------


def raw_sink(endpoint: str, count: int, ready: Any, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.rcvhwm = 100_000
    sock.bind(endpoint)
    ready.set()
    recv = sock.recv_multipart
    for _ in range(count):
        recv()
    out.put(time.perf_counter())
    sock.close(linger=0)
    ctx.term()


def raw_source(endpoint: str, count: int, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.sndhwm = 100_000
    sock.connect(endpoint)
    time.sleep(0.2)  # bench only: let the TCP connection come up before timing
    t0 = time.perf_counter()
    send = sock.send
    for _ in range(count):
        send(PAYLOAD)
    out.put(t0)
    sock.close(linger=5000)
    ctx.term()


def raw_echo(endpoint: str, ready: Any, stop: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    ready.set()
    while not stop.is_set():
        if sock.poll(100):
            sock.send_multipart(sock.recv_multipart())
    sock.close(linger=0)
    ctx.term()


def raw_forwarder(endpoint: str, count: int, ready: Any, cpu: Any) -> None:
    """A ROUTER that forwards every message to the one DEALER that said hello first:
    what a broker costs with no work at all (2 receives and 2 sends per message)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.sndhwm = sock.rcvhwm = 100_000
    sock.bind(endpoint)
    ready.set()
    sink = sock.recv_multipart()[0]
    cpu0 = time.process_time()
    forward(sock, sink, count)
    cpu.put(time.process_time() - cpu0)
    sock.close(linger=5000)
    ctx.term()


def forward(sock: Any, sink: bytes, count: int) -> None:
    """The raw forwarder's loop: ``count`` messages from ``sock`` (a ROUTER) to the peer
    ``sink``, 2 receives and 2 sends each (``profile_broker.py`` counts its calls)."""
    import zmq

    recv, send = sock.recv, sock.send
    for _ in range(count):
        recv()
        data = recv()
        send(sink, zmq.SNDMORE)
        send(data)


def raw_forwarded_sink(endpoint: str, count: int, ready: Any, out: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.rcvhwm = 100_000
    sock.connect(endpoint)
    sock.send(b"hello")
    ready.set()
    recv = sock.recv
    for _ in range(count):
        recv()
    out.put(time.perf_counter())
    sock.close(linger=0)
    ctx.term()


def bench_raw_forwarder(ctx: Any, count: int) -> Row:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, sink_ready, out, cpu = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    forwarder = ctx.Process(target=raw_forwarder, args=(endpoint, count, ready, cpu))
    forwarder.start()
    ready.wait(10)
    sink = ctx.Process(target=raw_forwarded_sink, args=(endpoint, count, sink_ready, out))
    sink.start()
    sink_ready.wait(10)
    time.sleep(0.2)  # bench only: the hello reaches the forwarder before the source starts
    source = ctx.Process(target=raw_source, args=(endpoint, count, out))
    source.start()
    a, b = out.get(timeout=120), out.get(timeout=120)
    used = cpu.get(timeout=120)
    for p in (source, sink, forwarder):
        p.join(10)
    rate = count / (max(a, b) - min(a, b))
    note = f"forwarder CPU {used:.2f} s, {used / count * 1e6:.1f} us/msg"
    return Row("raw pyzmq forwarder 1p/1c (no work)", rate=rate, note=note)


def raw_subscriber(endpoint: str, count: int, ready: Any, out: Any) -> None:
    """A raw SUB: ``recv()`` and a length check per message (the broadcast ceiling)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.rcvhwm = 0
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    recv = sock.recv
    while recv() != WARM_UP:
        pass
    ready.set()
    cpu0 = time.process_time()  # (this process, libzmq's I/O thread included)
    seen = 0
    while seen < count:
        if len(recv()) == SIZE:
            seen += 1
    out.put(("consumer", time.perf_counter(), seen, time.process_time() - cpu0))
    sock.close(linger=0)
    ctx.term()


#: What the raw publisher sends until every subscriber is connected (PUB drops before).
WARM_UP = b"w"


def raw_broadcast(ctx: Any, count: int, consumers: int) -> dict[str, float]:
    """Raw pyzmq PUB -> ``consumers`` SUB processes, ``count`` messages: the rate (until
    every SUB has them all), the CPU per delivery of the SUBs (``consumers_us``) and of
    the PUB (``sender_us``), deliveries missed.  (One home: ``bench_fanout.py`` too.)"""
    import zmq

    zctx = zmq.Context()
    pub = zctx.socket(zmq.PUB)
    pub.sndhwm = 0
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    subs = [
        ctx.Process(target=raw_subscriber, args=(f"tcp://127.0.0.1:{port}", count, r, out))
        for r in readies
    ]
    for p in subs:
        p.start()
    deadline = time.monotonic() + 120
    while not all(r.is_set() for r in readies) and time.monotonic() < deadline:
        pub.send(WARM_UP)
        time.sleep(0.01)
    time.sleep(0.2)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    send = pub.send
    for _ in range(count):
        send(PAYLOAD)
    results = [out.get(timeout=300) for _ in subs]
    publisher = time.process_time() - cpu0
    for p in subs:
        p.join(10)
    pub.close(linger=0)
    zctx.term()
    seen = sum(r[2] for r in results)
    return {
        "rate": count / (max(r[1] for r in results) - t0),
        "consumers_us": sum(r[3] for r in results) / max(1, seen) * 1e6,
        "sender_us": publisher / max(1, seen) * 1e6,
        "missed": count * consumers - seen,
    }


def bench_raw_broadcast(ctx: Any, count: int, consumers: int) -> Row:
    res = raw_broadcast(ctx, count, consumers)
    note = f"consumers {res['consumers_us']:.1f} us/delivery, PUB {res['sender_us']:.2f}"
    return Row(f"raw pyzmq PUB->SUB x{consumers}", rate=res["rate"], note=note)


def bench_zerohub_broadcast(
    ctx: Any,
    endpoint: str,
    count: int,
    consumers: int,
    broker_pid: int,
    raw: Row,
    fanout: bool = False,
    raw_read: str = "",
) -> Row:
    setup = _client(endpoint)
    channel = f"bench-broadcast-{consumers}-{'fanout' if fanout else 'direct'}{raw_read}"
    setup.create_queue(channel, 1, {"Status": 0})
    _close(setup)
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(consumers)]
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=zh_consumer, args=(endpoint, channel, count, False, r, out, fanout, raw_read)
        )
        for r in readies
    ]
    procs.append(ctx.Process(target=zh_producer, args=(endpoint, channel, count, False, go, out)))
    for p in procs:
        p.start()
    for r in readies:
        r.wait(120)
    time.sleep(0.5)
    cpu0 = _cpu_seconds(broker_pid)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    used = _cpu_seconds(broker_pid) - cpu0
    for p in procs:
        p.join(30)
    start = min(r[1] for r in results if r[0] == "producer")
    end = max(r[1] for r in results if r[0] == "consumer")
    seen = sum(r[2] for r in results if r[0] == "consumer")
    rate = count / (end - start)
    note = (
        f"{seen} delivered, broker CPU {used:.2f} s, {used / max(1, seen) * 1e6:.1f} us/delivery"
    )
    consumers_cpu = sum(r[3] for r in results if r[0] == "consumer")
    note = f"{note}, consumers {consumers_cpu / max(1, seen) * 1e6:.1f} us/delivery"
    if fanout:
        note = f"{note}, {count * consumers - seen} missed (reported gaps)"
    if raw.rate:
        note = f"{rate / raw.rate:.2f}x raw PUB/SUB  {note}"
    how = ("fan-out, raw payloads" if raw_read else "fan-out") if fanout else "one by one"
    return Row(f"zerohub broadcast x{consumers} ({how})", rate=rate, note=note)


def bench_raw(ctx: Any, count: int) -> Row:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, out = ctx.Event(), ctx.Queue()
    sink = ctx.Process(target=raw_sink, args=(endpoint, count, ready, out))
    sink.start()
    ready.wait(10)
    source = ctx.Process(target=raw_source, args=(endpoint, count, out))
    source.start()
    a, b = out.get(timeout=120), out.get(timeout=120)
    source.join(10)
    sink.join(10)
    return Row("raw pyzmq DEALER->ROUTER", rate=count / (max(a, b) - min(a, b)))


# -- zerohub ---------------------------------------------------------------------------


def serve_broker(
    endpoint: str,
    engine_spec: str,
    ready: Any,
    stop: Any,
    unacked_batch: int | None = None,
    unacked_octets: int | None = None,
) -> None:
    import zmq

    from broker.server.server import Server, ServerOptions

    module, _, name = engine_spec.partition(":")
    factory: Callable[[], Any] = getattr(importlib.import_module(module), name)
    ctx = zmq.Context()
    # a fan-out socket for the broadcast rows (consumers that do not ask never use it)
    options = ServerOptions(endpoint=endpoint, fanout="tcp://127.0.0.1:*")
    if unacked_batch is not None:  # (a keyword only this option's brokers know)
        options = replace(options, unacked_batch=unacked_batch)
    if unacked_octets is not None:  # (likewise)
        options = replace(options, unacked_batch_octets=unacked_octets)
    server = Server(factory(), options, context=ctx)
    server.start()
    ready.set()
    stop.wait()
    server.stop()
    ctx.term()


def serve_durable_broker(
    endpoint: str, data: str | None, ready: Any, stop: Any, stats: Any = None, names: Any = None
) -> None:
    """A broker as ``broker serve --data DIR`` builds it (fsync durability); ``data``
    None: memory only (the same engine and handlers, no store).  ``stats`` (a pipe end):
    each message received is answered with the store's fsync count so far.  ``names`` (a
    queue): given {native thread id: Python thread name} once serving
    (``bench_broker_threads.py``)."""
    with contextlib.suppress(ImportError):  # (a checkout before broker.heap)
        from broker.heap import one_arena

        one_arena()  # as ``broker serve`` does: before any thread allocates
    import zmq

    from broker.engine.delivery import PersistentDeliveryHandler
    from broker.engine.engine import Engine
    from broker.server.server import Server, ServerOptions
    from broker.store.durable import DurableStore
    from broker.store.log import LogStore

    store = DurableStore(LogStore(data)) if data is not None else None
    engine = Engine(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    ctx = zmq.Context()
    server = Server(engine, ServerOptions(endpoint=endpoint), context=ctx, durable=store)
    server.start()
    if names is not None:
        names.put({t.native_id: t.name for t in threading.enumerate()})
    ready.set()
    while not stop.is_set():
        if stats is not None and stats.poll(0.05):
            stats.recv()
            stats.send(store.log.stats().syncs if store is not None else 0)
        elif stats is None:
            stop.wait(0.2)
    server.stop()
    ctx.term()
    if store is not None:
        store.close()


def _client(endpoint: str, **kw: Any) -> Any:
    import zmq

    from broker.client.blocking import Client

    return Client(endpoint, context=zmq.Context(), **kw).connect()


def _close(client: Any) -> None:
    client.close()
    client.context.term()


def zh_consumer(
    endpoint: str,
    channel: str,
    count: int,
    threaded: bool,
    ready: Any,
    out: Any,
    fanout: bool = False,
    raw: str = "",
) -> None:
    """Reads ``count`` messages; with ``fanout``, received or reported missed (its time:
    when the last one came, not the idle wait for a gap's marker); ``raw``: read raw
    (``Client(raw_fanout=raw)``, ``receive_payloads``: no message objects)."""
    kw = {"raw_fanout": raw} if raw else {}
    client = _client(endpoint, max_inbox=50_000, threaded=threaded, fanout=fanout, **kw)
    client.join(channel)
    ready.set()
    cpu0 = time.process_time()  # (this process, libzmq's I/O thread included)
    seen = 0
    if not fanout:
        for _message in client.consume(timeout=60):
            seen += 1
            if seen >= count:
                break
        out.put(("consumer", time.perf_counter(), seen, time.process_time() - cpu0))
        _close(client)
        return
    missed = 0
    last = time.perf_counter()
    clock = time.perf_counter
    deadline = time.monotonic() + 120
    while seen + missed < count and time.monotonic() < deadline:
        if raw:
            got = client.receive_payloads(timeout=1.0)
            if got:
                seen += len(got)
                last = clock()
            missed = sum(gap.count for gap in client.fanout_gaps)
            continue
        for _message in client.consume(timeout=1.0):
            seen += 1
            last = clock()
            if seen + missed >= count:
                break
        missed = sum(gap.count for gap in client.fanout_gaps)
    out.put(("consumer", last, seen, time.process_time() - cpu0))
    _close(client)


def zh_producer(
    endpoint: str, channel: str, count: int, threaded: bool, go: Any, out: Any
) -> None:
    client = _client(endpoint, max_outbox=50_000, threaded=threaded)
    go.wait(30)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    push = client.push
    for _ in range(count - 1):
        push(channel, 1, PAYLOAD)
    push(channel, 1, PAYLOAD, ack=True, timeout=60)
    out.put(("producer", t0, count, time.process_time() - cpu0))
    _close(client)


#: pushes per ``push_many`` call in the batched rows (one TMQP batch each: ``broker.batch``)
BATCH = 256


def zh_batch_producer(
    endpoint: str, channel: str, count: int, threaded: bool, go: Any, out: Any
) -> None:
    """``zh_producer`` with ``push_many``: BATCH fire-and-forget pushes per batch."""
    client = _client(endpoint, max_outbox=50_000, threaded=threaded)
    go.wait(30)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    left = count - 1
    chunk = [PAYLOAD] * BATCH
    while left > 0:
        n = min(BATCH, left)
        client.push_many(channel, 1, chunk if n == BATCH else chunk[:n], ack=False)
        left -= n
    client.push(channel, 1, PAYLOAD, ack=True, timeout=60)
    out.put(("producer", t0, count, time.process_time() - cpu0))
    _close(client)


def bench_zerohub(
    ctx: Any,
    endpoint: str,
    count: int,
    pairs: int,
    threaded: bool,
    broker_pid: int | None = None,
    batched: bool = False,
) -> Row:
    setup = _client(endpoint)
    channels = [f"bench-{pairs}-{threaded:d}-{batched:d}-{i}" for i in range(pairs)]
    for channel in channels:
        setup.create_queue(channel, 1, {"Status": 1})
    _close(setup)
    out = ctx.Queue()
    readies = [ctx.Event() for _ in channels]
    go = ctx.Event()
    procs = [
        ctx.Process(target=zh_consumer, args=(endpoint, ch, count, threaded, r, out))
        for ch, r in zip(channels, readies, strict=True)
    ]
    producer = zh_batch_producer if batched else zh_producer
    procs += [
        ctx.Process(target=producer, args=(endpoint, ch, count, threaded, go, out))
        for ch in channels
    ]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(30)
    time.sleep(0.5)  # let the producers connect
    cpu0 = _cpu_seconds(broker_pid) if broker_pid else 0.0
    go.set()
    name = "zerohub push queue 1p/1c" if pairs == 1 else f"zerohub push queues {pairs}p/{pairs}c"
    name += " (threaded)" if threaded else ""
    name += " batched" if batched else ""
    try:
        results = [out.get(timeout=300) for _ in procs]
    except queue.Empty:  # a client failed (its traceback is on stderr): the row, not the run
        for p in procs:
            p.kill()
            p.join(10)
        return Row(name, note="FAILED: a client gave no result in 300 s (see stderr)")
    used = _cpu_seconds(broker_pid) - cpu0 if broker_pid else 0.0
    for p in procs:
        p.join(30)
    start = min(r[1] for r in results if r[0] == "producer")
    end = max(r[1] for r in results if r[0] == "consumer")
    seen = sum(r[2] for r in results if r[0] == "consumer")
    note = f"{seen} delivered"
    if broker_pid:
        note += f", broker CPU {used:.2f} s, {used / max(1, seen) * 1e6:.1f} us/msg"
    # the clients' CPU per message (libzmq's I/O threads included): on 2 cores the
    # processes share the CPU, so the rate is bounded by everyone's work, not the broker's
    per = max(1, seen)
    produced = sum(r[3] for r in results if r[0] == "producer") / per * 1e6
    consumed = sum(r[3] for r in results if r[0] == "consumer") / per * 1e6
    note += f"; producers {produced:.1f}, consumers {consumed:.1f} us/msg"
    return Row(name, rate=seen / (end - start), note=note)


#: acknowledged pushes one persistent-queue producer keeps in flight
PERSIST_WINDOW = 64


#: pushes per batch in the batched acknowledged rows (PERSIST_WINDOW / this in flight)
PERSIST_BATCH = 32


def zh_acked_producer(
    endpoint: str,
    channel: str,
    count: int,
    size: int,
    ready: Any,
    go: Any,
    out: Any,
    batched: bool = False,
    singles: bool = False,
) -> None:
    """Push ``count`` messages, each acknowledged; ack latencies from submit to done.
    ``batched``: PERSIST_BATCH at a time with ``push_many_async`` (one batch each);
    ``singles``: the client sends every push alone (``batch=0``: no TMQP batches, what a
    client without them sends; the broker gathers a drain's into runs)."""
    from collections import deque

    client = _client(endpoint, max_outbox=50_000, **({"batch": 0} if singles else {}))
    payload = b"x" * size
    ready.set()
    go.wait(30)
    latencies: list[float] = []
    inflight: deque[Any] = deque()
    clock = time.perf_counter
    t0 = clock()
    cpu0 = time.process_time()  # (this producer's threads: the caller and the client's I/O)
    if batched:
        chunk = [payload] * PERSIST_BATCH
        for start in range(0, count, PERSIST_BATCH):
            while len(inflight) >= PERSIST_WINDOW:
                inflight.popleft().result(60)
            sent = clock()
            for future in client.push_many_async(
                channel, 1, chunk[: min(PERSIST_BATCH, count - start)], timeout=60
            ):
                future.add_done_callback(lambda _f, t=sent: latencies.append(clock() - t))
                inflight.append(future)
        for future in inflight:
            future.result(60)
        out.put((t0, clock(), count, latencies, time.process_time() - cpu0))
        _close(client)
        return
    for _ in range(count):
        if len(inflight) >= PERSIST_WINDOW:
            inflight.popleft().result(60)
        sent = clock()
        future = client.push_async(channel, 1, payload, timeout=60)
        future.add_done_callback(lambda _f, t=sent: latencies.append(clock() - t))
        inflight.append(future)
    for future in inflight:
        future.result(60)
    end = clock()
    out.put((t0, end, count, latencies, time.process_time() - cpu0))
    _close(client)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_acked(
    ctx: Any,
    endpoint: str,
    count: int,
    producers: int,
    size: int,
    persistent: bool,
    broker_pid: int,
    stats: Any,
    batched: bool = False,
    singles: bool = False,
) -> Row:
    """``producers`` processes push ``count`` messages of ``size`` octets with acks
    (``batched``, ``singles``: see ``zh_acked_producer``)."""
    setup = _client(endpoint)
    channel = f"{'persist' if persistent else 'mem'}-{producers}-{size}-{batched:d}{singles:d}"
    options = {"MessageDeliveryHandler": "persistent"} if persistent else {}
    setup.create_queue(channel, 1, options)
    _close(setup)
    out = ctx.Queue()
    go = ctx.Event()
    per = max(1, count // producers)
    readies = [ctx.Event() for _ in range(producers)]
    procs = [
        ctx.Process(
            target=zh_acked_producer,
            args=(endpoint, channel, per, size, r, go, out, batched, singles),
        )
        for r in readies
    ]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)  # every producer connected
    stats.send(None)
    syncs0, cpu0 = stats.recv(), _cpu_seconds(broker_pid)
    go.set()
    results = [out.get(timeout=600) for _ in procs]
    stats.send(None)
    syncs, cpu = stats.recv() - syncs0, _cpu_seconds(broker_pid) - cpu0
    for p in procs:
        p.join(30)
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    total = sum(r[2] for r in results)
    p50, p99 = percentiles([lat for r in results for lat in r[3]])
    kind = "persistent (fsync)" if persistent else "memory"
    note = f"broker CPU {cpu / total * 1e6:.0f} us/msg"
    note += f", producers {sum(r[4] for r in results) / total * 1e6:.0f}"
    if persistent:
        note += f", {total / max(1, syncs):.0f} msgs/fsync"
    name = f"zerohub {kind} {_size_name(size)} {producers}p" + (" batched" if batched else "")
    name += " singles" if singles else ""
    return Row(
        name, rate=total / (end - start), p50=p50, p99=p99, note=note, cpu=cpu / total * 1e6,
        per_sync=total / max(1, syncs) if persistent else None,
    )  # fmt: skip


def _size_name(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def persistent_rows(ctx: Any, count: int, sizes: tuple[int, ...] = (SIZE, 4096)) -> list[Row]:
    """Producer-acknowledged pushes, persistent (fsync) beside the same broker without a
    store, and the disk's own limits, all in the same run."""
    from bench_store import disk_fsync_rate, disk_write_mbps

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-broker-data-") as data:
        fsyncs = disk_fsync_rate(Path(data), 1.0)
        rows.append(Row("disk: write 100 B + fsync", rate=fsyncs, note="fsyncs/s"))
        mbps = disk_write_mbps(Path(data), 1.0)
        rows.append(Row("disk: write 1 MiB + fsync", note=f"{mbps:,.0f} MB/s sequential"))
        for persistent in (False, True):
            endpoint = f"tcp://127.0.0.1:{free_port()}"
            ready, stop = ctx.Event(), ctx.Event()
            mine, theirs = ctx.Pipe()
            where = str(Path(data) / "broker") if persistent else None
            broker = ctx.Process(
                target=serve_durable_broker, args=(endpoint, where, ready, stop, theirs)
            )
            broker.start()
            try:
                if not ready.wait(30):
                    raise SystemExit("broker did not start")
                for size in sizes:
                    for producers in (1, 8):
                        n = count if size <= SIZE else max(1, count // 4)
                        rows.append(
                            bench_acked(ctx, endpoint, n, producers, size, persistent,
                                        broker.pid, mine)
                        )  # fmt: skip
                # the same pushes in batches (broker.batch): one batch, one store wait
                rows.append(
                    bench_acked(ctx, endpoint, count, 8, SIZE, persistent, broker.pid, mine,
                                batched=True)
                )  # fmt: skip
                # and each sent alone (no TMQP batches): the broker's drain runs
                rows.append(
                    bench_acked(ctx, endpoint, count, 8, SIZE, persistent, broker.pid, mine,
                                singles=True)
                )  # fmt: skip
            finally:
                stop.set()
                broker.join(60)
    by_name = {r.name: r for r in rows}
    for size in sizes:
        mem = by_name.get(f"zerohub memory {_size_name(size)} 8p")
        disk = by_name.get(f"zerohub persistent (fsync) {_size_name(size)} 8p")
        if mem and disk and mem.rate and disk.rate:
            disk.note += f", {disk.rate / mem.rate:.0%} of memory 8p"
    return rows


def bench_round_trips(ctx: Any, endpoint: str, rounds: int) -> list[Row]:
    """Raw pyzmq echo and zerohub round trips, measured in alternating blocks.

    Wake-up latency on a shared VM drifts by a factor of 3 within minutes, so the raw
    baseline and the zerohub rows take turns (blocks of 100 round trips) to see the
    same conditions.  zerohub: a client pushes into a queue of a channel it joined and
    waits for the delivery, one message at a time.
    """
    import zmq

    echo_endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    echo = ctx.Process(target=raw_echo, args=(echo_endpoint, ready, stop))
    echo.start()
    ready.wait(10)
    zctx = zmq.Context()
    sock = zctx.socket(zmq.DEALER)
    sock.connect(echo_endpoint)

    def raw_trip() -> None:
        sock.send(PAYLOAD)
        sock.recv()

    clients = []
    trips: list[tuple[str, Callable[[], None]]] = [("raw pyzmq round trip", raw_trip)]
    for threaded in (False, True):
        client = _client(endpoint, threaded=threaded)
        clients.append(client)
        channel = f"bench-rtt-{threaded:d}"
        client.create_queue(channel, 1, {"Status": 1})
        client.join(channel)

        def zh_trip(client: Any = client, channel: str = channel) -> None:
            client.push(channel, 1, PAYLOAD)
            assert client.receive(timeout=10) is not None, "round trip message lost"

        name = "zerohub round trip (push->deliver)" + (" (threaded)" if threaded else "")
        trips.append((name, zh_trip))
    samples: dict[str, list[float]] = {name: [] for name, _ in trips}
    try:
        for _name, trip in trips:  # warm up
            for _ in range(50):
                trip()
        for _ in range(max(1, rounds // 100)):
            for name, trip in trips:
                got = samples[name]
                for _ in range(100):
                    t = time.perf_counter()
                    trip()
                    got.append(time.perf_counter() - t)
    finally:
        for client in clients:
            _close(client)
        sock.close(linger=0)
        zctx.term()
        stop.set()
        echo.join(10)
    rows = []
    for name, got in samples.items():
        p50, p99 = percentiles(got)
        rows.append(Row(name, p50=p50, p99=p99))
    return rows


# -- RabbitMQ --------------------------------------------------------------------------


class RabbitMQ:
    """rabbitmq-server with the STOMP plugin, started without systemd in a temp dir."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="zerohub-rabbit-"))
        self.amqp_port = free_port()
        self.stomp_port = free_port()
        self.env = dict(os.environ)
        self.env.update(
            HOME=str(self.dir),
            RABBITMQ_NODENAME=f"zhbench{os.getpid()}@localhost",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.amqp_port),
            RABBITMQ_DIST_PORT=str(free_port()),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_PID_FILE=str(self.dir / "rabbit.pid"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbitmq"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            f"stomp.listeners.tcp.1 = 127.0.0.1:{self.stomp_port}\n"
            "loopback_users = none\n"
        )
        # Debian's /usr/sbin wrappers re-run the tools through `su rabbitmq`, which drops
        # this environment; the scripts behind them work as any user.
        self.pid: int | None = None
        libexec = Path("/usr/lib/rabbitmq/bin")
        self.bin = libexec if libexec.is_dir() else None

    def _tool(self, name: str) -> str:
        return str(self.bin / name) if self.bin is not None else name

    @staticmethod
    def install() -> None:
        if shutil.which("rabbitmq-server") is None:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(
                ["apt-get", "install", "-y", "-qq", "rabbitmq-server"],
                check=True,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
        for module, package in (("stomp", "stomp.py"), ("pika", "pika")):
            try:
                importlib.import_module(module)
            except ImportError:
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

    def _ctl(self, *args: str, timeout: float = 60) -> None:
        cmd = [self._tool(args[0]), *args[1:]]
        subprocess.run(cmd, env=self.env, check=True, timeout=timeout, capture_output=True)

    def _open(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def start(self, timeout: float = 120) -> None:
        self._ctl("rabbitmq-plugins", "enable", "--offline", "rabbitmq_stomp")
        self._ctl("rabbitmq-server", "-detached")
        deadline = time.monotonic() + timeout
        while not (self._open(self.amqp_port) and self._open(self.stomp_port)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ did not open its ports (logs: {self.dir}/log)")
            time.sleep(0.25)
        with contextlib.suppress(OSError, ValueError):
            self.pid = int((self.dir / "rabbit.pid").read_text().strip())

    def _alive(self) -> bool:
        """Is the node's Erlang VM (pid read at start; the node deletes the file) running?"""
        if self.pid is None:
            return False
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        try:
            self._ctl("rabbitmqctl", "stop", timeout=60)
        except (subprocess.SubprocessError, OSError) as exc:
            print(f"warning: rabbitmq stop: {exc}", file=sys.stderr)
        deadline = time.monotonic() + 30
        while (self._open(self.amqp_port) or self._alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        # epmd refuses to die while the node is still registered: retry for a while
        deadline = time.monotonic() + 15
        while True:
            done = subprocess.run(
                ["epmd", "-kill"], env=self.env, capture_output=True, text=True, check=False
            )
            if "not allowed" not in done.stdout + done.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)


def stomp_consumer(port: int, count: int, ready: Any, out: Any) -> None:
    import threading

    stomp: Any = importlib.import_module("stomp")  # installed by --rabbitmq

    done = threading.Event()
    state = {"n": 0}

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            state["n"] += 1
            if state["n"] >= count:
                out.put(("consumer", time.perf_counter(), state["n"]))
                done.set()

    conn = stomp.Connection([("127.0.0.1", port)], vhost="/")
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/bench", id="1", ack="auto")
    ready.set()
    done.wait(300)
    conn.disconnect()


def stomp_producer(port: int, count: int, go: Any, out: Any) -> None:
    stomp: Any = importlib.import_module("stomp")  # installed by --rabbitmq

    conn = stomp.Connection([("127.0.0.1", port)], vhost="/")
    conn.connect("guest", "guest", wait=True)
    go.wait(30)
    t0 = time.perf_counter()
    body = PAYLOAD.decode()
    for _ in range(count):
        conn.send("/queue/bench", body)
    out.put(("producer", t0, count))
    conn.disconnect(receipt="bye")


def pika_consumer(port: int, count: int, ready: Any, out: Any) -> None:
    pika: Any = importlib.import_module("pika")  # installed by --rabbitmq

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = conn.channel()
    channel.queue_declare("bench-pika")
    state = {"n": 0}

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        state["n"] += 1
        if state["n"] >= count:
            out.put(("consumer", time.perf_counter(), state["n"]))
            ch.stop_consuming()

    channel.basic_consume("bench-pika", on_message, auto_ack=True)
    ready.set()
    channel.start_consuming()
    conn.close()


def pika_producer(port: int, count: int, go: Any, out: Any) -> None:
    pika: Any = importlib.import_module("pika")  # installed by --rabbitmq

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = conn.channel()
    channel.queue_declare("bench-pika")
    go.wait(30)
    t0 = time.perf_counter()
    for _ in range(count):
        channel.basic_publish("", "bench-pika", PAYLOAD)
    out.put(("producer", t0, count))
    conn.close()


def pika_confirmed_producer(
    port: int, count: int, size: int, ready: Any, go: Any, out: Any
) -> None:
    """Persistent messages (delivery mode 2) to a durable queue, each publish confirmed
    (pika's BlockingConnection waits for the confirm of each publish)."""
    pika: Any = importlib.import_module("pika")  # installed by --rabbitmq

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    channel = conn.channel()
    channel.queue_declare("bench-durable", durable=True)
    channel.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    body = b"x" * size
    ready.set()
    go.wait(60)
    latencies = []
    clock = time.perf_counter
    t0 = clock()
    for _ in range(count):
        sent = clock()
        channel.basic_publish("", "bench-durable", body, props, mandatory=True)
        latencies.append(clock() - sent)
    out.put((t0, clock(), count, latencies))
    conn.close()


def bench_rabbit_confirms(ctx: Any, port: int, count: int, size: int) -> Row:
    """Best of 1, 4 and 8 confirmed-publisher processes (the queue purged between)."""
    best: Row | None = None
    for producers in (1, 4, 8):
        out, go = ctx.Queue(), ctx.Event()
        readies = [ctx.Event() for _ in range(producers)]
        per = max(1, count // producers)
        procs = [
            ctx.Process(target=pika_confirmed_producer, args=(port, per, size, r, go, out))
            for r in readies
        ]
        for p in procs:
            p.start()
        for r in readies:
            r.wait(60)
        go.set()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(30)
        start, end = min(r[0] for r in results), max(r[1] for r in results)
        total = sum(r[2] for r in results)
        p50, p99 = percentiles([lat for r in results for lat in r[3]])
        row = Row(f"RabbitMQ durable+confirms {_size_name(size)}", rate=total / (end - start),
                  p50=p50, p99=p99, note=f"best of 1/4/8 producers: {producers}p")  # fmt: skip
        if best is None or (row.rate or 0) > (best.rate or 0):
            best = row
        _purge_rabbit(port)
    assert best is not None
    return best


def _purge_rabbit(port: int) -> None:
    pika: Any = importlib.import_module("pika")
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    conn.channel().queue_purge("bench-durable")
    conn.close()


def bench_pair(ctx: Any, name: str, consumer: Any, producer: Any, port: int, count: int) -> Row:
    out, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    c = ctx.Process(target=consumer, args=(port, count, ready, out))
    c.start()
    ready.wait(60)
    p = ctx.Process(target=producer, args=(port, count, go, out))
    p.start()
    time.sleep(0.5)
    go.set()
    results = [out.get(timeout=600) for _ in range(2)]
    p.join(30)
    c.join(30)
    start = next(t for role, t, _ in results if role == "producer")
    end = next(t for role, t, _ in results if role == "consumer")
    return Row(name, rate=count / (end - start))


# -- main ------------------------------------------------------------------------------


def print_table(rows: list[Row], raw: Row, raw_rtt: Row) -> None:
    print(
        f"\n{'benchmark (100-byte messages)':<40} {'msgs/s':>10} {'p50 us':>8} {'p99 us':>8}  note"
    )
    print("-" * 90)
    for row in rows:
        rate = f"{row.rate:,.0f}" if row.rate else ""
        p50 = f"{row.p50:.0f}" if row.p50 is not None else ""
        p99 = f"{row.p99:.0f}" if row.p99 is not None else ""
        note = row.note
        if (
            row.rate
            and raw.rate
            and row is not raw
            and "broadcast" not in row.name
            and "SUB" not in row.name
        ):
            note = f"{row.rate / raw.rate:.2f}x raw pyzmq  {note}"
        if row.p50 is not None and raw_rtt.p50 and row is not raw_rtt:
            note = f"{row.p50 / raw_rtt.p50:.2f}x raw RTT  {note}"
        print(f"{row.name:<40} {rate:>10} {p50:>8} {p99:>8}  {note}")
    print_targets(rows, raw, raw_rtt)
    zh = next((r for r in rows if r.name == "zerohub push queue 1p/1c"), None)
    stomp_row = next((r for r in rows if r.name.startswith("RabbitMQ STOMP")), None)
    if zh and stomp_row and zh.rate and stomp_row.rate:
        print(f"\nzerohub 1p/1c vs RabbitMQ STOMP: {zh.rate / stomp_row.rate:.1f}x")


#: issue 15's broker targets: (row, the least x raw pyzmq msgs/s) and the round trip's
#: most x raw RTT
TARGETS = (
    ("zerohub push queue 1p/1c", 0.6),
    ("zerohub push queue 1p/1c batched", 0.6),
    ("zerohub push queues 4p/4c", 0.5),
    ("zerohub push queues 4p/4c batched", 0.5),
)
RTT_TARGET = 1.3


def print_targets(rows: list[Row], raw: Row, raw_rtt: Row) -> None:
    """Each target beside what this run measured and beside the floor: the raw forwarder,
    a ROUTER that relays each message and does nothing else (2 receives, 2 sends), what
    any one-process Python broker moving one ZeroMQ message per frame pays at least."""
    by_name = {r.name: r for r in rows}
    floor = next((r for r in rows if r.name.startswith("raw pyzmq forwarder")), None)
    if not raw.rate:
        return
    print(f"\n{'issue 15 target':<40} {'wanted':>8} {'this run':>9}  met")
    print("-" * 64)
    if floor is not None and floor.rate:
        print(f"{'(floor) raw pyzmq forwarder':<40} {'':>8} {floor.rate / raw.rate:>8.2f}x")
    for name, least in TARGETS:
        row = by_name.get(name)
        if row is not None and row.rate:
            ratio = row.rate / raw.rate
            print(f"{name:<40} {least:>7.2f}x {ratio:>8.2f}x  {'yes' if ratio >= least else 'no'}")
    rtt = by_name.get("zerohub round trip (push->deliver)")
    if rtt is not None and rtt.p50 and raw_rtt.p50:
        ratio = rtt.p50 / raw_rtt.p50
        met = "yes" if ratio <= RTT_TARGET else "no"
        print(f"{'round trip p50 x raw RTT':<40} {RTT_TARGET:>7.2f}x {ratio:>8.2f}x  {met}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny run (a smoke test)")
    parser.add_argument("--messages", type=int, help="messages per producer")
    parser.add_argument("--rounds", type=int, help="round trips for the latency rows")
    parser.add_argument("--rabbitmq", action="store_true", help="add RabbitMQ STOMP and pika rows")
    parser.add_argument("--engine", default="broker.engine.engine:Engine", help=argparse.SUPPRESS)
    parser.add_argument("--no-persistent", action="store_true", help="skip the persistent rows")
    parser.add_argument(
        "--unacked-batch",
        type=int,
        default=None,
        metavar="N",
        help="serve with ServerOptions.unacked_batch N (deliveries without acknowledge "
        "batched to consumers that read batches, at most N per message and 2 KiB; "
        "default: the server's default, 64; 0: one per message)",
    )
    parser.add_argument(
        "--unacked-octets",
        type=int,
        default=None,
        metavar="N",
        help="serve with ServerOptions.unacked_batch_octets N (the octets such a batch "
        "holds at most; default: the server's default)",
    )
    parser.add_argument(
        "--broadcast",
        type=int,
        default=50,
        metavar="N",
        help="broadcast rows to N consumer processes, messages/50 each (0: none; default 50)",
    )
    parser.add_argument(
        "--persistent-only",
        action="store_true",
        help="only the acknowledged-push rows (memory, persistent, the disk, RabbitMQ)",
    )
    args = parser.parse_args(argv)
    count = args.messages or (2_000 if args.quick else 200_000)
    rounds = args.rounds or (200 if args.quick else 5_000)
    ctx = mp.get_context("spawn")
    code = Path(str(importlib.import_module("broker").__file__)).parent.parent
    print(f"broker and client code: {code}", flush=True)  # (PYTHONPATH=BASE: a base's)

    raw = Row("raw pyzmq DEALER->ROUTER")
    raw_rtt = Row("raw pyzmq round trip")
    rows: list[Row] = []
    if not args.persistent_only:
        raw = bench_raw(ctx, count)
        rows.append(raw)
        rows.append(bench_raw_forwarder(ctx, count))
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        ready, stop = ctx.Event(), ctx.Event()
        broker = ctx.Process(
            target=serve_broker,
            args=(endpoint, args.engine, ready, stop, args.unacked_batch, args.unacked_octets),
        )
        broker.start()
        try:
            if not ready.wait(30):
                raise SystemExit("broker did not start")
            pid = broker.pid
            rows.append(bench_zerohub(ctx, endpoint, count, 1, False, pid))
            rows.append(bench_zerohub(ctx, endpoint, count, 1, True, pid))
            rows.append(bench_zerohub(ctx, endpoint, max(1, count // 4), 4, False, pid))
            rows.append(bench_zerohub(ctx, endpoint, count, 1, False, pid, batched=True))
            rows.append(
                bench_zerohub(ctx, endpoint, max(1, count // 4), 4, False, pid, batched=True)
            )
            raw_rtt, *zh_rtt = bench_round_trips(ctx, endpoint, rounds)
            rows.insert(1, raw_rtt)
            rows.extend(zh_rtt)
            if args.broadcast:
                n = max(1, count // 50)
                raw_pub = bench_raw_broadcast(ctx, n, args.broadcast)
                rows.append(raw_pub)
                for fanout in (False, True):
                    rows.append(
                        bench_zerohub_broadcast(ctx, endpoint, n, args.broadcast, pid, raw_pub,
                                                fanout)
                    )  # fmt: skip
                # the consumers reading raw (``Client.receive_payloads``; bench_fanout.py
                # has the consumers' CPU beside raw SUBs')
                rows.append(
                    bench_zerohub_broadcast(ctx, endpoint, n, args.broadcast, pid, raw_pub,
                                            True, "payloads")
                )  # fmt: skip
        finally:
            stop.set()
            broker.join(30)
    persistent = []
    if not args.no_persistent:
        persistent = persistent_rows(ctx, max(1, count // 10))
    if args.rabbitmq:
        RabbitMQ.install()
        rabbit = RabbitMQ()
        try:
            rabbit.start()
            stomp_count = max(1, count // 4) if not args.quick else count
            if not args.persistent_only:
                rows.append(
                    bench_pair(ctx, "RabbitMQ STOMP 1p/1c auto-ack", stomp_consumer,
                               stomp_producer, rabbit.stomp_port, stomp_count)
                )  # fmt: skip
                rows.append(
                    bench_pair(ctx, "RabbitMQ AMQP (pika) 1p/1c", pika_consumer,
                               pika_producer, rabbit.amqp_port, stomp_count)
                )  # fmt: skip
            if not args.no_persistent:
                confirmed = max(1, count // 40)
                for size in (SIZE, 4096):
                    row = bench_rabbit_confirms(ctx, rabbit.amqp_port, confirmed, size)
                    persistent.append(row)
        finally:
            rabbit.stop()
    if rows:
        print_table(rows, raw, raw_rtt)
    if persistent:
        print_persistent(persistent)
        print_persistent_targets(persistent)
    return 0


def print_persistent(rows: list[Row]) -> None:
    """The acknowledged-push table: rates, ack latency (ms), and how they compare."""
    title = "acknowledged pushes (fsync mode)"
    print(f"\n{title:<42} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8}  note")
    print("-" * 110)
    by_name = {r.name: r for r in rows}
    for row in rows:
        note = row.note
        if row.name.startswith("zerohub persistent") and row.rate:
            size = re.split(r" \d+p", row.name.split(" (fsync) ")[1])[0]
            rabbit = by_name.get(f"RabbitMQ durable+confirms {size}")
            if rabbit is not None and rabbit.rate:
                note += f", {row.rate / rabbit.rate:.1f}x RabbitMQ"
        rate = f"{row.rate:,.0f}" if row.rate else ""
        p50 = f"{row.p50 / 1000:.1f}" if row.p50 is not None else ""
        p99 = f"{row.p99 / 1000:.1f}" if row.p99 is not None else ""
        print(f"{row.name:<42} {rate:>9} {p50:>8} {p99:>8}  {note}")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores, shared)")


#: issue 10's targets for persistent pushes with acks, fsync mode, 8 producers
TARGET_X_RABBIT = 10.0  # x RabbitMQ durable queue + publisher confirms (best of 1/4/8)
TARGET_OF_MEMORY = 0.5  # of the same broker's non-persistent rate, same producers


def print_persistent_targets(rows: list[Row]) -> None:
    """The two target ratios of each 8-producer persistent row side by side, with the
    disk's own fsync rate and the broker's CPU per message (persistent / memory)."""
    by_name = {r.name: r for r in rows}
    disk = by_name.get("disk: write 100 B + fsync")
    fsyncs = f"{disk.rate:,.0f}" if disk is not None and disk.rate else "?"
    title = "targets: 8 producers, fsync"
    print(f"\n{title:<34} {'msgs/s':>8} {'p99 ms':>7} {'x Rabbit':>9} {'of mem':>7} "
          f"{'disk fsync/s':>12} {'msgs/fsync':>10} {'CPU us/msg (mem)':>17}")  # fmt: skip
    print("-" * 112)
    for row in rows:
        if not (row.name.startswith("zerohub persistent") and " 8p" in row.name and row.rate):
            continue
        size = row.name.split(" (fsync) ")[1].split(" 8p")[0]
        rabbit = by_name.get(f"RabbitMQ durable+confirms {size}")
        memory = by_name.get(row.name.replace("persistent (fsync)", "memory"))
        x_rabbit = f"{row.rate / rabbit.rate:.1f}x" if rabbit and rabbit.rate else "--"
        of_memory = f"{row.rate / memory.rate:.0%}" if memory and memory.rate else "--"
        if rabbit and rabbit.rate:
            x_rabbit += "+" if row.rate >= TARGET_X_RABBIT * rabbit.rate else "-"
        if memory and memory.rate:
            of_memory += "+" if row.rate >= TARGET_OF_MEMORY * memory.rate else "-"
        p99 = f"{row.p99 / 1000:.1f}" if row.p99 is not None else ""
        per_sync = f"{row.per_sync:.0f}" if row.per_sync is not None else ""
        cpu = f"{row.cpu:.0f}" if row.cpu is not None else ""
        if memory is not None and memory.cpu is not None:
            cpu += f" ({memory.cpu:.0f})"
        name = row.name.replace("zerohub ", "").replace(" (fsync)", "")
        print(f"{name:<34} {row.rate:>8,.0f} {p99:>7} {x_rabbit:>9} {of_memory:>7} "
              f"{fsyncs:>12} {per_sync:>10} {cpu:>17}")  # fmt: skip
    print(
        f"(+ met, - not: >= {TARGET_X_RABBIT:.0f}x RabbitMQ, >= {TARGET_OF_MEMORY:.0%} of the "
        "memory row with the same producers; RabbitMQ: best of 1/4/8 confirmed publishers)"
    )


if __name__ == "__main__":
    sys.exit(main())
