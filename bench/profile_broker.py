"""Deterministic counts per message on the broker's push path: Python calls and libzmq
calls (cProfile), beside a trivial broker (a raw pyzmq ROUTER relaying each message: 2
receives and 2 sends) that is the floor of any one-process Python broker moving one
ZeroMQ message per frame.

Counts, not times: they do not depend on the machine's load.  Each party runs in its own
process on loopback TCP, 100-byte messages; the broker (or the relay) runs under cProfile
on the thread that serves, the producer and consumer are plain clients (not profiled).

Rows:

* ``relay``: raw pyzmq ROUTER, recv(rid) + recv(data) + send(rid, SNDMORE) + send(data);
* ``push``: ``Client.push`` one by one, a consumer reading (deliveries as the broker
  chooses: ``--unacked-batch``);
* ``push_many``: ``Client.push_many`` (``BATCH`` per TMQP batch);
* ``acked push``: ``Client.push_async`` one by one, each waiting for its acknowledge,
  ``ACK_WINDOW`` in flight, every push sent alone (``batch=0``): the broker gathers a
  drain's into runs of its producer (``Engine.receive_pushes``);
* ``round trip``: one client pushes into a queue of a channel it joined and waits for the
  delivery, one message at a time (as ``bench_broker.py``'s round trip rows): the
  broker's calls per round trip, its idle polls included, and the client's (its own
  process, under cProfile too).

Usage: ``python bench/profile_broker.py [--messages N] [--unacked-batch N] [--top K]
[--round-trip-only] [--cpu ROUNDS]``.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing as mp
import os
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_broker import forward, free_port, raw_forwarded_sink, raw_source
from call_count import python_calls

SIZE = 100
PAYLOAD = b"x" * SIZE
BATCH = 256
#: acknowledged pushes the ``acked push`` row's producer keeps in flight
ACK_WINDOW = 64
#: libzmq calls made through the counting sockets (pyzmq's Cython methods are invisible
#: to cProfile): recv, send, get (getsockopt) per socket, and zmq_poll per Poller.poll
#: (``d[k] += 1`` is no call cProfile sees: the counting adds no Python calls)
ZMQ_CALLS: dict[str, int] = dict.fromkeys(("recv", "send", "get", "poll"), 0)


def _counting_context() -> Any:
    """A zmq.Context whose sockets count the libzmq calls made through them, and
    ``zmqkit.fast_send`` made to go through them too."""
    import zmq

    from zerohub import zmqkit

    def counted(name: str) -> Any:
        method = getattr(zmq.Socket, name)

        def call(self: Any, *args: Any, **kw: Any) -> Any:
            ZMQ_CALLS[name] += 1
            return method(self, *args, **kw)

        return call

    class CountingSocket(zmq.Socket):  # type: ignore[type-arg]
        recv = counted("recv")
        send = counted("send")
        get = counted("get")

    class CountingContext(zmq.Context):  # type: ignore[type-arg]
        _socket_class = CountingSocket

    poll = zmq.Poller.poll

    def counted_poll(self: Any, *args: Any, **kw: Any) -> Any:
        ZMQ_CALLS["poll"] += 1
        return poll(self, *args, **kw)

    zmq.Poller.poll = counted_poll  # type: ignore[method-assign]
    zmqkit.fast_send = lambda sock: sock.send
    return CountingContext()


def _counts(prof: cProfile.Profile, messages: int, top: int) -> dict[str, Any]:
    """Per message: Python calls (counted per code object, ``call_count.python_calls``;
    this file's counting wrappers and pyzmq's Python-level ``Socket.send`` that they call
    left out) and libzmq calls.  The top rows are pstats' (by file, line and name)."""

    def skip(filename: str, name: str) -> bool:
        return (
            filename == __file__
            or filename.endswith("zmq/sugar/socket.py")
            or (filename.endswith("zmq/sugar/poll.py") and name == "poll")
        )

    calls = python_calls(prof, skip)
    raw: dict[Any, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = [
        (tt, nc, f"{filename.rsplit('/', 2)[-1]}:{name}")
        for (filename, _line, name), (_cc, nc, tt, _ct, _callers) in raw.items()
        if not skip(filename, name)
    ]
    rows.sort(reverse=True)
    return {
        "calls": calls / messages,
        "zmq": sum(ZMQ_CALLS.values()) / messages,
        "by_call": {k: v / messages for k, v in sorted(ZMQ_CALLS.items())},
        "top": [(nc / messages, tt / messages * 1e6, where) for tt, nc, where in rows[:top]],
    }


def relay(endpoint: str, count: int, ready: Any, out: Any, top: int) -> None:
    """``bench_broker.raw_forwarder`` over counting sockets, its loop under cProfile."""
    import zmq

    ctx = _counting_context()
    sock = ctx.socket(zmq.ROUTER)
    sock.sndhwm = sock.rcvhwm = 100_000
    sock.bind(endpoint)
    ready.set()
    sink = sock.recv_multipart()[0]
    ZMQ_CALLS.update(dict.fromkeys(ZMQ_CALLS, 0))
    prof = cProfile.Profile()
    prof.runcall(forward, sock, sink, count)
    out.put(_counts(prof, count, top))
    sock.close(linger=5000)
    ctx.term()


def broker(endpoint: str, unacked: int | None, ready: Any, stop: Any, out: Any, top: int) -> None:
    """``top`` < 0: no profiler, no counting sockets (the CPU rows)."""
    import threading

    import zmq

    from broker.engine.engine import Engine
    from broker.server.server import Server, ServerOptions

    options = ServerOptions(endpoint=endpoint)
    if unacked is not None:
        options = replace(options, unacked_batch=unacked)
    ctx = _counting_context() if top >= 0 else zmq.Context()
    server = Server(Engine(), options, context=ctx)
    prof = cProfile.Profile()

    def serve() -> None:
        ZMQ_CALLS.update(dict.fromkeys(ZMQ_CALLS, 0))
        if top >= 0:
            prof.enable()
        try:
            server.run()
        finally:
            prof.disable()

    thread = threading.Thread(target=serve)
    thread.start()
    ready.set()
    messages = stop.get()
    server.stop()
    thread.join(10)
    out.put(_counts(prof, messages, top) if top >= 0 else {})
    ctx.term()


def consumer(endpoint: str, channel: str, count: int, ready: Any, done: Any) -> None:
    import zmq

    from broker.client.blocking import Client

    client = Client(endpoint, context=zmq.Context(), max_inbox=50_000, threaded=False).connect()
    client.join(channel)
    ready.set()
    seen = 0
    for _message in client.consume(timeout=60):
        seen += 1
        if seen >= count:
            break
    done.put(seen)
    client.close()
    client.context.term()


def producer(endpoint: str, channel: str, count: int, many: bool, go: Any, acked: bool) -> None:
    from collections import deque

    import zmq

    from broker.client.blocking import Client

    singles = {"batch": 0} if acked else {}  # (acknowledged pushes: each sent alone)
    client = Client(
        endpoint, context=zmq.Context(), max_outbox=50_000, threaded=False, **singles
    ).connect()
    go.wait(30)
    left = count - 1
    if acked:
        inflight: deque[Any] = deque()
        for _ in range(left):
            if len(inflight) >= ACK_WINDOW:
                inflight.popleft().result(60)
            inflight.append(client.push_async(channel, 1, PAYLOAD, timeout=60))
        for future in inflight:
            future.result(60)
    elif many:
        chunk = [PAYLOAD] * BATCH
        while left > 0:
            n = min(BATCH, left)
            client.push_many(channel, 1, chunk[:n], ack=False)
            left -= n
    else:
        for _ in range(left):
            client.push(channel, 1, PAYLOAD)
    client.push(channel, 1, PAYLOAD, ack=True, timeout=60)
    client.close()
    client.context.term()


def round_trips(
    endpoint: str, channel: str, count: int, go: Any, done: Any, profiled: bool = False
) -> None:
    """One message at a time: push, receive.  Puts (trips, CPU seconds, the client's
    Python calls per trip under cProfile when ``profiled``, else None)."""
    import zmq

    from broker.client.blocking import Client

    client = Client(endpoint, context=zmq.Context(), threaded=False).connect()
    client.join(channel)
    go.wait(30)
    prof = cProfile.Profile() if profiled else None
    cpu = time.process_time()
    if prof is not None:
        prof.enable()
    for _ in range(count):
        client.push(channel, 1, PAYLOAD)
        if client.receive(timeout=60) is None:
            break
    else:
        used = time.process_time() - cpu
        calls = None
        if prof is not None:
            prof.disable()
            calls = python_calls(prof) / count
        done.put((count, used, calls))
    client.close()
    client.context.term()


def raw_round_trips(endpoint: str, count: int, done: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(PAYLOAD)
    sock.recv()
    cpu = time.process_time()
    for _ in range(count):
        sock.send(PAYLOAD)
        sock.recv()
    done.put(time.process_time() - cpu)
    sock.close(linger=0)
    ctx.term()


def raw_echo_cpu(ctx: Any, count: int) -> tuple[float, float]:
    """CPU per round trip (us) of ``bench_broker.raw_echo`` (the bench's raw round trip
    baseline: poll, recv_multipart, send_multipart) and of its DEALER client."""
    from bench_broker import raw_echo

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop, done = ctx.Event(), ctx.Event(), ctx.Queue()
    echo = ctx.Process(target=raw_echo, args=(endpoint, ready, stop))
    echo.start()
    ready.wait(30)
    assert echo.pid is not None
    client = ctx.Process(target=raw_round_trips, args=(endpoint, count, done))
    cpu0 = cpu_seconds(echo.pid)
    client.start()
    client_cpu = done.get(timeout=300)
    used = cpu_seconds(echo.pid) - cpu0
    client.join(30)
    stop.set()
    echo.join(30)
    return used / count * 1e6, client_cpu / count * 1e6


def profile_relay(ctx: Any, count: int, top: int) -> dict[str, Any]:
    """The relay row: ``relay`` fed by ``bench_broker``'s raw source and forwarded sink."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, sink_ready, out, times = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=relay, args=(endpoint, count, ready, out, top))]
    procs[0].start()
    ready.wait(10)
    procs.append(ctx.Process(target=raw_forwarded_sink, args=(endpoint, count, sink_ready, times)))
    procs[1].start()
    sink_ready.wait(10)
    time.sleep(0.3)  # bench only: the sink's hello reaches the relay before the source starts
    procs.append(ctx.Process(target=raw_source, args=(endpoint, count, times)))
    procs[2].start()
    result: dict[str, Any] = out.get(timeout=300)
    for p in procs:
        p.join(30)
    return result


def profile_broker(
    ctx: Any,
    count: int,
    many: bool,
    unacked: int | None,
    top: int,
    rtt: bool = False,
    acked: bool = False,
) -> dict[str, Any]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop, out = ctx.Event(), ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=broker, args=(endpoint, unacked, ready, stop, out, top))
    server.start()
    ready.wait(30)
    import zmq

    from broker.client.blocking import Client

    setup = Client(endpoint, context=zmq.Context(), threaded=False).connect()
    setup.create_queue("profile", 1, {"Status": 1})
    setup.close()
    setup.context.term()
    c_ready, go, done = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=consumer, args=(endpoint, "profile", count, c_ready, done)),
        ctx.Process(target=producer, args=(endpoint, "profile", count, many, go, acked)),
    ]
    if rtt:
        procs = [
            ctx.Process(target=round_trips, args=(endpoint, "profile", count, go, done, top >= 0))
        ]
        c_ready.set()
    for p in procs:
        p.start()
    c_ready.wait(30)
    time.sleep(0.5)  # bench only: the producer connects before it starts
    assert server.pid is not None
    cpu0 = cpu_seconds(server.pid)
    go.set()
    seen = done.get(timeout=300)
    used = cpu_seconds(server.pid) - cpu0
    client_cpu = client_calls = None
    if rtt:
        seen, client_cpu, client_calls = seen
    for p in procs:
        p.join(30)
    stop.put(seen)
    result: dict[str, Any] = out.get(timeout=60)
    result["cpu_us"] = used / max(1, seen) * 1e6
    if client_cpu is not None:  # the round-trip client's own CPU (its process)
        result["client_cpu_us"] = client_cpu / max(1, seen) * 1e6
    if client_calls is not None:  # (profiled: its CPU above is the profiler's too)
        result["client_calls"] = client_calls
    server.join(30)
    return result


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, its libzmq threads included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_rows(ctx: Any, count: int, rounds: int) -> None:
    """Broker CPU per message (no profiler), one per message (``unacked_batch`` 0) and
    the server's default taking turns ``rounds`` times: the batching alone, same code;
    and the ``acked push`` row (the server's default)."""
    cases = [
        (f"{kind}, unacked_batch {name}", many, unacked)
        for kind, many in (("push", False), ("push_many", True))
        for name, unacked in (("0", 0), ("default", None))
    ]
    got: dict[str, list[float]] = {name: [] for name, _m, _u in cases}
    got["acked push"] = []
    trips: list[str] = []
    for _ in range(rounds):
        for name, many, unacked in cases:
            got[name].append(profile_broker(ctx, count, many, unacked, -1)["cpu_us"])
        got["acked push"].append(profile_broker(ctx, count, False, None, -1, acked=True)["cpu_us"])
        r = profile_broker(ctx, min(count, 5_000), False, None, -1, True)
        echo, echo_client = raw_echo_cpu(ctx, min(count, 5_000))
        trips.append(
            f"{r['cpu_us']:.1f} (client {r['client_cpu_us']:.1f}), "
            f"raw echo {echo:.1f} (client {echo_client:.1f})"
        )
    print(f"\n{'broker CPU us/msg (no profiler)':<36} runs")
    for name, runs in got.items():
        print(f"{name:<36} {' / '.join(f'{v:.1f}' for v in runs)}")
    print(f"{'round trip: broker CPU us per trip':<36} {' / '.join(trips)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument(
        "--unacked-batch", type=int, default=None, metavar="N",
        help="ServerOptions.unacked_batch (default: the server's default)",
    )  # fmt: skip
    parser.add_argument("--round-trips", type=int, default=5_000, help="for the round trip row")
    parser.add_argument("--top", type=int, default=12, help="functions listed per row")
    parser.add_argument(
        "--cpu", type=int, default=0, metavar="ROUNDS",
        help="instead: broker CPU per message, unacked_batch 0 vs default, ROUNDS turns",
    )  # fmt: skip
    parser.add_argument(
        "--round-trip-only", action="store_true", help="only the round trip row (counts)"
    )
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    if args.cpu:
        cpu_rows(ctx, args.messages, args.cpu)
        return 0
    rows = []
    if not args.round_trip_only:
        rows = [
            ("relay (raw pyzmq ROUTER, no work)", profile_relay(ctx, args.messages, args.top)),
            ("push", profile_broker(ctx, args.messages, False, args.unacked_batch, args.top)),
            ("push_many", profile_broker(ctx, args.messages, True, args.unacked_batch, args.top)),
            ("acked push", profile_broker(ctx, args.messages, False, args.unacked_batch,
                                          args.top, acked=True)),
        ]  # fmt: skip
    trip = profile_broker(ctx, args.round_trips, False, args.unacked_batch, args.top, True)
    rows.append(("round trip", trip))
    print(f"\n{'per message (broker process)':<36} {'Python calls':>13} {'libzmq calls':>13}")
    print("-" * 64)
    for name, r in rows:
        each = ", ".join(f"{k} {v:.2f}" for k, v in r["by_call"].items())
        print(f"{name:<36} {r['calls']:>13.2f} {r['zmq']:>13.2f}  {each}")
    print(f"{'round trip: the client, Python calls':<36} {trip['client_calls']:>13.2f}")
    for name, r in rows:
        print(f"\n{name}: calls/msg, own us/msg (profiled), function")
        for calls, us, where in r["top"]:
            print(f"  {calls:8.3f} {us:8.2f}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
