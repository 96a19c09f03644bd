"""STOMP throughput: stomp.py producer -> one queue -> stomp.py consumer, 100-byte bodies.

Every party runs in its own (spawned) process on loopback TCP:

* zerohub: ``broker serve --stomp`` (the STOMP listener on the broker engine, the
  ``/queue/bench`` channel shared with TMQP clients; ``--data DIR`` to run it with the
  durable store), and with ``--memory`` also the standalone listener on the in-memory
  backend (``python -m broker.stomp``);
* with ``--baseline CHECKOUT``: the same server from another checkout (e.g. main), its
  rows and a last table of this checkout / that one (msg/s and CPU per message);
* with ``--rabbitmq``: RabbitMQ's STOMP plugin, same clients, same run (the server is
  installed and started by ``bench_broker.RabbitMQ``).

Rows: auto-ack with fire-and-forget SENDs (the producer's clock stops at the consumer's
last message), and the same with a ``receipt`` on every SEND (the producer's clock stops
when every RECEIPT is in).  stomp.py itself is usually the limit: the "send loop" column
is the rate of the producer's ``send`` calls alone, and the "stomp.py ceiling" rows run
the same clients through a trivial relay (:func:`relay`: no queue, no checks), so the
table says how close a broker comes to the client's own limit.

With ``--raw`` every broker is also driven by minimal raw-socket clients (SEND frames
built once and written in batches; the consumer counts NULs): the client costs next to
nothing, so those rows show the broker's own rate.  The last column is the broker
process's CPU time per message (``/proc``; for RabbitMQ its Erlang VM): on a machine
shared with other work it varies far less than msg/s; "clients CPU" is the producer's
and the consumer's together (stomp.py's own cost, the ceiling's other side).  With
``--rabbitmq`` a last table gives zerohub / RabbitMQ for each case of the same run.

``--turns N`` measures every server N times, this checkout and the baseline taking
turns (the baseline first in odd turns, last in even ones), with ratio tables per turn.

Usage: ``python bench/bench_stomp.py [--messages 10000 100000] [--rabbitmq] [--memory]
[--raw] [--data DIR] [--baseline CHECKOUT] [--turns N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAYLOAD = "x" * 100


@dataclass
class Row:
    name: str
    count: int
    rates: tuple[float, float]  # end to end; the producer's send loop alone
    cpu_us: float | None = None  # the broker process's CPU time per message (µs)
    clients_us: float | None = None  # the producer's and consumer's CPU per message (µs)
    turn: int = 1  # the round (``--turns``) it was measured in


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of process ``pid`` so far (Linux /proc), None if unknown.
    Unlike msg/s, it hardly depends on what else the machine runs."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_args(stomp_port: int, data: str) -> list[str]:
    """``python -m`` arguments of ``broker serve`` with its STOMP listener on
    ``stomp_port`` (TMQP on a free port), ``--data DATA``."""
    return [
        "broker",
        "serve",
        "--bind",
        f"tcp://127.0.0.1:{free_port()}",
        "--stomp",
        f"tcp://127.0.0.1:{stomp_port}",
        "--data",
        data,
    ]


@contextlib.contextmanager
def zerohub(args: list[str], ready: bytes, source: str | None = None, module: bool = True) -> Any:
    """A zerohub server process (``python -m ...``; ``module=False``: ``python ARGS``),
    stopped with SIGTERM afterwards; ``source``: run the code of that checkout instead
    (PYTHONPATH)."""
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, *(["-m"] if module else []), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=source,
    )
    seen = b""
    deadline = time.monotonic() + 60
    streams = [proc.stdout, proc.stderr]
    while ready not in seen and time.monotonic() < deadline:
        readable, _, _ = select.select(streams, [], [], 0.5)
        for stream in readable:
            chunk = os.read(stream.fileno(), 4096)
            seen += chunk
        if proc.poll() is not None:
            break
    if ready not in seen:
        proc.kill()
        raise SystemExit(f"{' '.join(args)} did not start: {seen.decode(errors='replace')}")
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def consumer(port: int, vhost: str, count: int, ready: Any, out: Any) -> None:
    import stomp

    done = threading.Event()
    seen = [0]

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            seen[0] += 1
            if seen[0] >= count:
                out.put(("consumer", time.perf_counter()))
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/bench", id="1", ack="auto")
    ready.set()
    done.wait(600)
    conn.disconnect()


def producer(port: int, vhost: str, count: int, receipts: bool, go: Any, out: Any) -> None:
    import stomp

    got = [0]
    all_in = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            got[0] += 1
            if got[0] >= count:
                all_in.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    go.wait(60)
    start = time.perf_counter()
    for i in range(count):
        if receipts:
            conn.send("/queue/bench", PAYLOAD, receipt=str(i))
        else:
            conn.send("/queue/bench", PAYLOAD)
    out.put(("sent", time.perf_counter()))
    if receipts:
        all_in.wait(600)
        out.put(("receipts", time.perf_counter()))
    out.put(("producer", start))
    conn.disconnect()


def _raw_connect(port: int, vhost: str) -> socket.socket:
    """A raw STOMP 1.2 connection (login guest/guest), CONNECTED read."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=600)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(
        b"CONNECT\naccept-version:1.2\nhost:%s\nlogin:guest\npasscode:guest\n"
        b"heart-beat:0,0\n\n\0" % vhost.encode()
    )
    got = b""
    while b"\0" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            raise SystemExit(f"raw client: connection closed before CONNECTED: {got!r}")
        got += chunk
    if not got.startswith(b"CONNECTED"):
        raise SystemExit(f"raw client: not connected: {got[:200]!r}")
    return sock


def raw_consumer(port: int, vhost: str, count: int, ready: Any, out: Any) -> None:
    """A minimal raw-socket consumer (auto ack): counts the frames (NULs) it reads, so
    the client costs next to nothing and the broker's own rate shows."""
    sock = _raw_connect(port, vhost)
    sock.sendall(b"SUBSCRIBE\nid:1\ndestination:/queue/bench\nack:auto\nreceipt:sub\n\n\0")
    got = b""
    while b"\0" not in got:  # the RECEIPT of the SUBSCRIBE
        got += sock.recv(65536)
    seen = got.count(b"\0") - 1
    ready.set()
    while seen < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        seen += chunk.count(b"\0")
    out.put(("consumer", time.perf_counter()))
    sock.sendall(b"DISCONNECT\n\n\0")
    sock.close()


def raw_producer(port: int, vhost: str, count: int, receipts: bool, go: Any, out: Any) -> None:
    """A minimal raw-socket producer: SEND frames built once, written in batches of 500
    (a thread counts the RECEIPTs when asked for one per SEND)."""
    sock = _raw_connect(port, vhost)
    body = PAYLOAD.encode()
    plain = b"SEND\ndestination:/queue/bench\ncontent-length:%d\n\n%s\0" % (len(body), body)
    done = threading.Event()

    def count_receipts() -> None:
        seen = 0
        while seen < count:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            seen += chunk.count(b"\0")
        done.set()

    reader = threading.Thread(target=count_receipts, daemon=True)
    if receipts:
        reader.start()
    go.wait(60)
    start = time.perf_counter()
    batch: list[bytes] = []
    for i in range(count):
        if receipts:
            batch.append(
                b"SEND\ndestination:/queue/bench\nreceipt:%d\ncontent-length:%d\n\n%s\0"
                % (i, len(body), body)
            )
        else:
            batch.append(plain)
        if len(batch) == 500:
            sock.sendall(b"".join(batch))
            batch.clear()
    if batch:
        sock.sendall(b"".join(batch))
    out.put(("sent", time.perf_counter()))
    if receipts:
        done.wait(600)
        out.put(("receipts", time.perf_counter()))
    out.put(("producer", start))
    sock.close()


def relay(port: int, ready: Any) -> None:
    """The client's ceiling: a trivial STOMP relay (no queue, no acknowledgements, no
    checks): CONNECTED, a RECEIPT when asked, each SEND forwarded at once as a MESSAGE
    to the first subscriber.  Frames are cut at NUL (the bench's bodies hold none)."""
    import asyncio

    async def main() -> None:
        subscribers: list[tuple[asyncio.StreamWriter, bytes]] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            buf, seq = b"", 0
            while data := await reader.read(65536):
                *frames, buf = (buf + data).split(b"\0")
                out: list[bytes] = []
                forward: list[bytes] = []
                close = False
                for raw in frames:
                    raw = raw.lstrip(b"\r\n")
                    if not raw:
                        continue
                    head, _, body = raw.partition(b"\n\n")
                    command, *lines = head.split(b"\n")
                    headers = dict(line.split(b":", 1) for line in lines if b":" in line)
                    if command in (b"CONNECT", b"STOMP"):
                        out.append(b"CONNECTED\nversion:1.2\n\n\0")
                    elif command == b"SUBSCRIBE":
                        subscribers.append((writer, headers.get(b"id", b"0")))
                    elif command == b"SEND" and subscribers:
                        seq += 1
                        forward.append(
                            b"MESSAGE\nsubscription:%s\nmessage-id:%d\ndestination:%s\n"
                            b"content-length:%d\n\n%s\0"
                            % (subscribers[0][1], seq, headers[b"destination"], len(body), body)
                        )
                    elif command == b"DISCONNECT":
                        close = True
                    if b"receipt" in headers:
                        out.append(b"RECEIPT\nreceipt-id:%s\n\n\0" % headers[b"receipt"])
                if forward:
                    subscribers[0][0].write(b"".join(forward))
                if out:
                    writer.write(b"".join(out))
                await writer.drain()
                if close:
                    break
            subscribers[:] = [s for s in subscribers if s[0] is not writer]
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", port)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def run_pair(
    ctx: Any, port: int, vhost: str, count: int, receipts: bool, raw: bool = False
) -> tuple[float, float]:
    out, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    take, give = (raw_consumer, raw_producer) if raw else (consumer, producer)
    c = ctx.Process(target=take, args=(port, vhost, count, ready, out))
    c.start()
    ready.wait(60)
    p = ctx.Process(target=give, args=(port, vhost, count, receipts, go, out))
    p.start()
    time.sleep(0.5)
    go.set()
    results = dict(out.get(timeout=900) for _ in range(4 if receipts else 3))
    p.join(60)
    c.join(60)
    end = max(results["consumer"], results.get("receipts", 0.0))
    start = results["producer"]
    return count / (end - start), count / (results["sent"] - start)


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended and were
    waited for: :func:`run_pair` joins its producer and consumer, never a server."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(
    ctx: Any,
    name: str,
    port: int,
    vhost: str,
    counts: list[int],
    raw: bool = False,
    pid: int | None = None,
) -> list[Row]:
    """The cases for one broker; ``pid``: its process, for the CPU column."""
    cases = [("auto-ack", False, False), ("receipt per SEND", True, False)]
    if raw:
        cases += [("raw client", False, True), ("raw client, receipts", True, True)]
    rows = []
    for count in counts:
        for label, receipts, raw_client in cases:
            before = cpu_seconds(pid)
            clients = _children_cpu()
            rates = run_pair(ctx, port, vhost, count, receipts, raw_client)
            clients = (_children_cpu() - clients) / count * 1e6
            after = cpu_seconds(pid)
            cpu = None
            if before is not None and after is not None:
                cpu = (after - before) / count * 1e6
            rows.append(Row(f"{name} {label}", count, rates, cpu, clients))
    return rows


def _turn(ctx: Any, args: Any, serve: list[str], turn: int, rabbit: Any) -> list[Row]:
    """One round: this checkout and the baseline (if any) in turns -- the baseline first
    in odd rounds, last in even ones, so a drift in the machine's load falls on both --
    then RabbitMQ (if any); each server on fresh ports."""
    rows: list[Row] = []
    turns: list[tuple[str, str | None]] = [("zerohub serve --stomp", None)]
    if args.baseline:
        turns.insert(0, ("zerohub serve --stomp (baseline)", args.baseline))
        if turn % 2 == 0:
            turns.reverse()
    for name, source in turns:
        port = free_port()
        serve[serve.index("--stomp") + 1] = f"tcp://127.0.0.1:{port}"
        serve[serve.index("--bind") + 1] = f"tcp://127.0.0.1:{free_port()}"
        with zerohub(serve, b"broker serving on", source) as proc:
            rows += measure(ctx, name, port, "localhost", args.messages, args.raw, proc.pid)
    if rabbit is not None:
        rows += measure(
            ctx, "RabbitMQ STOMP", rabbit.stomp_port, "/", args.messages, args.raw, rabbit.pid
        )
    for row in rows:
        row.turn = turn
    return rows


def _table(rows: list[Row]) -> None:
    print(
        f"{'case':52} {'turn':>4} {'messages':>9} {'msg/s':>9} {'send loop msg/s':>16} "
        f"{'broker CPU us/msg':>18} {'clients CPU us/msg':>19}"
    )
    for row in rows:
        rate, loop = row.rates
        cpu = "" if row.cpu_us is None else f"{row.cpu_us:.1f}"
        clients = "" if row.clients_us is None else f"{row.clients_us:.1f}"
        print(
            f"{row.name:52} {row.turn:>4} {row.count:>9} {rate:>9.0f} {loop:>16.0f} {cpu:>18} "
            f"{clients:>19}"
        )


def _ratio_rows(title: str, mine: dict[tuple[str, int], Row], other: list[Row], cut: str) -> None:
    """``title``, then for each row of ``other``: this checkout's row of the same case
    over it (msg/s and CPU per message)."""
    lines = []
    for theirs in other:
        key = (theirs.name.removeprefix(cut), theirs.count)
        ours = mine.get(key)
        if ours is None:
            continue
        ratio = ours.rates[0] / theirs.rates[0]
        cpu = f"{ours.cpu_us / theirs.cpu_us:.2f}" if ours.cpu_us and theirs.cpu_us else ""
        lines.append(f"{key[0].strip():52} {key[1]:>9} {ratio:>12.2f} {cpu:>14}")
    if lines:
        print(f"\n{title:52} {'messages':>9} {'msg/s ratio':>12} {'CPU/msg ratio':>14}")
        print("\n".join(lines))


def _ratios(rows: list[Row], turn: str) -> None:
    """zerohub / RabbitMQ and zerohub / baseline, for the rows of one turn."""
    prefix = "zerohub serve --stomp"
    mine = {
        (r.name.removeprefix(prefix), r.count): r
        for r in rows
        if r.name.startswith(prefix + " ") and "(baseline)" not in r.name
    }
    rabbit = "RabbitMQ STOMP"
    _ratio_rows(
        f"zerohub / RabbitMQ (same run){turn}",
        mine,
        [r for r in rows if r.name.startswith(rabbit)],
        rabbit,
    )
    base = prefix + " (baseline)"
    _ratio_rows(
        f"zerohub / baseline checkout (same run){turn}",
        mine,
        [r for r in rows if r.name.startswith(base)],
        base,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--rabbitmq", action="store_true", help="also measure RabbitMQ STOMP")
    parser.add_argument(
        "--memory", action="store_true", help="also the standalone in-memory listener"
    )
    parser.add_argument("--data", default="none", help="broker serve --data (default none)")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="also with minimal raw-socket clients (the broker's own rate, not stomp.py's)",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="also serve the code of another checkout (e.g. a worktree of main), same run",
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=1,
        help="rounds of every server (baseline and this checkout in alternating order)",
    )
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    ctx = mp.get_context("spawn")
    rows: list[Row] = []
    serve = serve_args(free_port(), args.data)
    port = free_port()
    ready = ctx.Event()
    echo = ctx.Process(target=relay, args=(port, ready), daemon=True)
    echo.start()
    ready.wait(60)
    try:
        rows += measure(
            ctx, "stomp.py ceiling (trivial relay)", port, "/", args.messages, args.raw
        )
    finally:
        echo.kill()
        echo.join(30)
    rabbit = None
    if args.rabbitmq:
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_broker import RabbitMQ

        RabbitMQ.install()
        rabbit = RabbitMQ()
        rabbit.start()
    try:
        for turn in range(1, args.turns + 1):
            rows += _turn(ctx, args, serve, turn, rabbit)
    finally:
        if rabbit is not None:
            rabbit.stop()
    if args.memory:
        port = free_port()
        with zerohub(["broker.stomp", "--bind", f"tcp://127.0.0.1:{port}"], b"listening on"):
            rows += measure(ctx, "zerohub in-memory", port, "localhost", args.messages)
    _table(rows)
    for turn in range(1, args.turns + 1):
        _ratios([r for r in rows if r.turn == turn], f" (turn {turn})" if args.turns > 1 else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
