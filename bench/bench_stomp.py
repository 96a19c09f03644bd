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
the same clients through a trivial relay (:func:`relay`: no queue, no checks, one
``selectors`` loop), the fastest server these clients can have, so the table says how
close a broker comes to the client's own limit.

With ``--raw`` every broker is also driven by minimal raw-socket clients (SEND frames
built once and written in batches; the consumer counts NULs): the client costs next to
nothing, so those rows show the broker's own rate.  The "broker CPU" column is the
server process's CPU time per message (``/proc``; for RabbitMQ its Erlang VM, for the
ceiling the relay): on a machine shared with other work it varies far less than msg/s;
"clients CPU" is the producer's and the consumer's together (stomp.py's own cost, the
ceiling's other side).

``--turns N`` measures every server N times.  In a turn all servers are up at once and
each case runs on them back to back (the ceiling, the baseline, this checkout, RabbitMQ;
reversed in even turns), so the machine's drift falls on a case's servers alike.  Per
turn: ratio tables (zerohub / RabbitMQ, zerohub / baseline) and, with ``--rabbitmq``,
issue 11's verdict per case (zerohub >= 2x RabbitMQ's msg/s? is 2x RabbitMQ within the
ceiling, i.e. reachable by any server with these clients?), then a summary over turns.

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
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAYLOAD = "x" * 100

#: A stomp.py client that waits this long (ms) for its next frame (or one ``send`` call
#: that blocks this long) marks its run "stalled": an undisturbed 10k run takes 150-180
#: ms in all, its frames come 0-30 ms apart even on a loaded machine (docs/stomp.md,
#: "Session 22: the 10k receipt row's collapses").
STALL_MS = 100.0


@dataclass(frozen=True)
class Wait:
    """The longest a stomp.py client of one run waited: for its next MESSAGE (the
    consumer's io thread), RECEIPT (the producer's io thread) or for a ``send`` call to
    return (the producer's loop), when it began (ms after the producer's start), and how
    much of it that thread was runnable without a CPU (``runq``, /proc schedstat, see
    :class:`Gaps`): a long wait with a short runq is a thread asleep, waiting for bytes
    (or the GIL), not for a CPU."""

    on: str  # "MESSAGE", "RECEIPT" or "send"
    ms: float
    at_ms: float
    runq_ms: float | None  # read for waits over 50 ms only

    @property
    def stalled(self) -> bool:
        return self.ms >= STALL_MS

    def __str__(self) -> str:
        runq = "" if self.runq_ms is None else f" (runq {self.runq_ms:.0f})"
        return f"{self.ms:.0f} ms {self.on} @{self.at_ms:.0f}{runq}"


@dataclass
class Row:
    name: str
    count: int
    rates: tuple[float, float]  # end to end; the producer's send loop alone
    cpu_us: float | None = None  # the broker process's CPU time per message (µs)
    clients_us: float | None = None  # the producer's and consumer's CPU per message (µs)
    turn: int = 1  # the round (``--turns``) it was measured in
    wait: Wait | None = None  # stomp.py clients only
    repeat: bool = False  # ``--repeat-stalled``: the second run of a stalled row


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


def thread_runq() -> float:
    """Seconds the calling thread has spent runnable but not running (Linux
    /proc/thread-self/schedstat), 0.0 where that is not available."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class Gaps:
    """The frames (or ``send`` returns) one client thread sees: how many, the longest
    interval between two, when it began, and for an interval over 50 ms how much of it
    the thread was runnable without a CPU (its schedstat, read every 10 ms and at the end
    of such an interval, so the figure covers it and at most 10 ms before it).  About
    0.13 µs a call, against stomp.py's 12-16 µs a frame."""

    def __init__(self) -> None:
        self.ticks = 0
        self.last = self.read_at = time.perf_counter()
        self.runq = thread_runq()  # the thread's runq at ``read_at``
        self.longest: tuple[float, float, float | None] = (0.0, 0.0, None)

    def tick(self) -> None:
        now = time.perf_counter()
        gap = now - self.last
        self.ticks += 1
        if gap > self.longest[0] and self.ticks > 1:
            runq = None
            if gap >= 0.05:
                runq = thread_runq() - self.runq
            self.longest = (gap, self.last, runq)
        self.last = now
        if now - self.read_at >= 0.01:
            self.read_at, self.runq = now, thread_runq()


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
    gaps = Gaps()  # between MESSAGEs (the io thread)

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            gaps.tick()
            if gaps.ticks >= count:
                out.put(("consumer", gaps.last))
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/bench", id="1", ack="auto")
    ready.set()
    done.wait(600)
    out.put(("consumer wait", gaps.longest))
    conn.disconnect()


def producer(port: int, vhost: str, count: int, receipts: bool, go: Any, out: Any) -> None:
    import stomp

    got = Gaps()  # between RECEIPTs (the io thread)
    all_in = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            got.tick()
            if got.ticks >= count:
                all_in.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    go.wait(60)
    sent = Gaps()  # between send calls' returns (this thread), from the start
    start = sent.last
    for i in range(count):
        if receipts:
            conn.send("/queue/bench", PAYLOAD, receipt=str(i))
        else:
            conn.send("/queue/bench", PAYLOAD)
        sent.tick()
    out.put(("sent", sent.last))  # the last send's return
    if receipts:
        all_in.wait(600)
        out.put(("receipts", time.perf_counter()))
    out.put(("producer", start))
    out.put(("send wait", sent.longest))
    out.put(("receipt wait", got.longest))
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


_RELAY_READ = 1 << 18  # bytes per recv: all a loop pass finds waiting, in one call


class _RelayPeer:
    """One client of the relay: its socket, the unfinished frame it sent last, and the
    bytes it is owed (frames queued this loop pass, then what the socket did not take)."""

    __slots__ = ("partial", "queued", "sock", "subscription", "unsent")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.partial = b""
        self.queued: list[bytes] = []
        self.unsent = b""
        self.subscription = b""


def _relay_frames(peer: _RelayPeer, data: bytes, state: dict[str, Any]) -> None:
    """Answer the complete frames of ``data`` (after what ``peer`` left unfinished):
    a SEND is a MESSAGE queued for the subscriber, a receipt header a RECEIPT queued for
    the sender; nothing is checked.  Frames end at NUL (the bench's bodies hold none)."""
    *frames, peer.partial = (peer.partial + data).split(b"\0")
    answers = peer.queued
    for frame in frames:
        if frame[:1] in (b"\n", b"\r"):  # heart-beats / EOLs after the previous NUL
            frame = frame.lstrip(b"\r\n")
            if not frame:
                continue
        head, _, body = frame.partition(b"\n\n")
        receipt = _header(head, b"\nreceipt:")
        if receipt is not None:  # not forwarded in a MESSAGE
            head = head.replace(b"\nreceipt:" + receipt, b"", 1)
        if head[:5] == b"SEND\n":
            target = state["subscriber"]
            if target is not None:
                state["seq"] += 1
                target.queued.append(
                    b"MESSAGE\nsubscription:%s\nmessage-id:%d\n%s\n\n%s\0"
                    % (target.subscription, state["seq"], head[5:], body)
                )
        elif head.startswith((b"CONNECT\n", b"STOMP\n")):
            answers.append(b"CONNECTED\nversion:1.2\n\n\0")
        elif head.startswith(b"SUBSCRIBE\n"):
            peer.subscription = _header(head, b"\nid:") or b"0"
            state["subscriber"] = peer
        if receipt is not None:
            answers.append(b"RECEIPT\nreceipt-id:%s\n\n\0" % receipt)


def _header(head: bytes, marker: bytes) -> bytes | None:
    """The value of the header line starting with ``marker`` (LF + name + colon)."""
    at = head.find(marker)
    if at < 0:
        return None
    stop = head.find(b"\n", at + len(marker))
    return head[at + len(marker) :] if stop < 0 else head[at + len(marker) : stop]


def relay(port: int, ready: Any, maxseg: int | None = None) -> None:
    """The client's ceiling: the least a STOMP server can do for these clients.  No
    queue, no acknowledgements, no checks: CONNECTED, a RECEIPT when asked, each SEND
    forwarded as a MESSAGE to the last subscriber.  One ``selectors`` loop (no asyncio):
    every readable socket is read once per pass (up to 256 KiB), and each peer's
    frames of that pass leave in one ``send``; ``TCP_NODELAY`` as the broker's listener
    has it.  Not ``TCP_QUICKACK`` after each read (so that stomp.py's producer, Nagle
    on, never waits on a delayed ACK): at 10k auto-ack that relay ran at 64-77k msg/s
    against 57-88k without it (8 turns side by side, load ~2.5; session 18 saw the
    broker make 2-5x the reads with it).  RECEIPTs leave at once
    (held 2-20 ms to batch them: no consistent gain)."""
    import selectors

    selector = selectors.DefaultSelector()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if maxseg is not None:  # the accepted sockets' MSS (bench/stall_receipts.py)
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, maxseg)
    server.bind(("127.0.0.1", port))
    server.listen(16)
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ)
    peers: dict[socket.socket, _RelayPeer] = {}
    state: dict[str, Any] = {"subscriber": None, "seq": 0}
    ready.set()
    while True:
        for key, mask in selector.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is server:
                conn, _ = server.accept()
                conn.setblocking(False)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peers[conn] = _RelayPeer(conn)
                selector.register(conn, selectors.EVENT_READ)
                continue
            peer = peers.get(sock)
            if peer is None or not mask & selectors.EVENT_READ:
                continue
            try:
                data = sock.recv(_RELAY_READ)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                del peers[sock]
                if state["subscriber"] is peer:
                    state["subscriber"] = None
                continue
            _relay_frames(peer, data, state)
        for peer in peers.values():
            if not (peer.queued or peer.unsent):
                continue
            had_unsent = bool(peer.unsent)
            out = peer.unsent + b"".join(peer.queued)
            peer.queued.clear()
            try:
                sent = peer.sock.send(out)
            except BlockingIOError:
                sent = 0
            except OSError:
                sent = len(out)  # gone: its EOF comes next pass
            peer.unsent = out[sent:]
            if bool(peer.unsent) != had_unsent:
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.unsent else 0)
                selector.modify(peer.sock, events)


def run_pair(
    ctx: Any, port: int, vhost: str, count: int, receipts: bool, raw: bool = False
) -> tuple[float, float]:
    """One run: (msg/s end to end, msg/s of the producer's send loop)."""
    return run_pair_waits(ctx, port, vhost, count, receipts, raw)[0]


def run_pair_waits(
    ctx: Any, port: int, vhost: str, count: int, receipts: bool, raw: bool = False
) -> tuple[tuple[float, float], Wait | None]:
    """:func:`run_pair`, and with stomp.py clients the run's longest :class:`Wait`."""
    out, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    take, give = (raw_consumer, raw_producer) if raw else (consumer, producer)
    c = ctx.Process(target=take, args=(port, vhost, count, ready, out))
    c.start()
    ready.wait(60)
    p = ctx.Process(target=give, args=(port, vhost, count, receipts, go, out))
    p.start()
    time.sleep(0.5)
    go.set()
    results = dict(out.get(timeout=900) for _ in range((4 if receipts else 3) + (0 if raw else 3)))
    p.join(60)
    c.join(60)
    end = max(results["consumer"], results.get("receipts", 0.0))
    start = results["producer"]
    rates = count / (end - start), count / (results["sent"] - start)
    sides = {"MESSAGE": "consumer wait", "send": "send wait"}
    if receipts:
        sides["RECEIPT"] = "receipt wait"
    waits = []
    for on, key in sides.items():
        if key in results:
            gap, began, runq = results[key]
            runq_ms = None if runq is None else runq * 1000
            waits.append(Wait(on, gap * 1000, (began - start) * 1000, runq_ms))
    return rates, max(waits, key=lambda w: w.ms, default=None)


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended and were
    waited for: :func:`run_pair` joins its producer and consumer, never a server."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Server:
    """A STOMP server being measured: its rows' name prefix, where it listens, and its
    process (for the CPU column; None: not known)."""

    name: str
    port: int
    vhost: str
    pid: int | None


def cases(raw: bool) -> list[tuple[str, bool, bool]]:
    """(label, a receipt per SEND, raw-socket clients) of every case measured."""
    found = [("auto-ack", False, False), ("receipt per SEND", True, False)]
    if raw:
        found += [("raw client", False, True), ("raw client, receipts", True, True)]
    return found


def measure_case(
    ctx: Any, server: Server, count: int, label: str, receipts: bool, raw_client: bool
) -> Row:
    """One run of one case on ``server``, with its CPU and the clients' per message."""
    before = cpu_seconds(server.pid)
    clients = _children_cpu()
    rates, wait = run_pair_waits(ctx, server.port, server.vhost, count, receipts, raw_client)
    clients = (_children_cpu() - clients) / count * 1e6
    after = cpu_seconds(server.pid)
    cpu = None
    if before is not None and after is not None:
        cpu = (after - before) / count * 1e6
    return Row(f"{server.name} {label}", count, rates, cpu, clients, wait=wait)


def measure(ctx: Any, server: Server, counts: list[int], raw: bool = False) -> list[Row]:
    """Every case on one server."""
    return [measure_case(ctx, server, count, *case) for count in counts for case in cases(raw)]


CEILING = "stomp.py ceiling (trivial relay)"
ZEROHUB = "zerohub serve --stomp"
RABBITMQ = "RabbitMQ STOMP"


def _turn(
    ctx: Any, args: Any, serve: list[str], turn: int, rabbit: Any, ceiling: Server
) -> list[Row]:
    """One round: every server up at once (zerohub's on fresh ports), and each case run
    on all of them back to back -- the ceiling (the relay), the baseline (if any), this
    checkout, RabbitMQ (if any) -- in that order in odd rounds and the reverse in even
    ones, so the machine's drift (other work on the 2 cores) falls on a case's servers
    alike and the ceiling is measured next to the rates it bounds."""
    checkouts = [(ZEROHUB, None)]
    if args.baseline:
        checkouts.insert(0, (f"{ZEROHUB} (baseline)", args.baseline))
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        servers = [ceiling]
        for name, source in checkouts:
            port = free_port()
            serve[serve.index("--stomp") + 1] = f"tcp://127.0.0.1:{port}"
            serve[serve.index("--bind") + 1] = f"tcp://127.0.0.1:{free_port()}"
            proc = stack.enter_context(zerohub(serve, b"broker serving on", source))
            servers.append(Server(name, port, "localhost", proc.pid))
        if rabbit is not None:
            servers.append(Server(RABBITMQ, rabbit.stomp_port, "/", rabbit.pid))
        if turn % 2 == 0:
            servers.reverse()
        for count in args.messages:
            for case in cases(args.raw):
                found = [measure_case(ctx, server, count, *case) for server in servers]
                rows += found
                if args.repeat_stalled:
                    for server, row in zip(servers, found, strict=True):
                        if row.wait is not None and row.wait.stalled:
                            again = measure_case(ctx, server, count, *case)
                            again.repeat = True
                            rows.append(again)
    for row in rows:
        row.turn = turn
    return rows


def _table(rows: list[Row]) -> None:
    print(
        f"{'case':61} {'turn':>4} {'messages':>9} {'msg/s':>9} {'send loop msg/s':>16} "
        f"{'broker CPU us/msg':>18} {'clients CPU us/msg':>19}  longest client wait"
    )
    for row in rows:
        rate, loop = row.rates
        cpu = "" if row.cpu_us is None else f"{row.cpu_us:.1f}"
        clients = "" if row.clients_us is None else f"{row.clients_us:.1f}"
        wait = "" if row.wait is None else str(row.wait)
        if row.wait is not None and row.wait.stalled:
            wait += "  STALLED"
        name = row.name + (" (repeat)" if row.repeat else "")
        print(
            f"{name:61} {row.turn:>4} {row.count:>9} {rate:>9.0f} {loop:>16.0f} {cpu:>18} "
            f"{clients:>19}  {wait}"
        )
    if any(row.wait is not None and row.wait.stalled for row in rows):
        print(
            f"STALLED: a stomp.py client waited >= {STALL_MS:.0f} ms for one frame (or one send "
            "call); runq: how much of that wait its thread was runnable without a CPU (short: "
            "it slept, waiting for bytes). docs/stomp.md, \"Session 22: the 10k receipt row's "
            'collapses".'
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
    rows = [r for r in rows if not r.repeat]  # the first run of each case decides
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


@dataclass(frozen=True)
class Verdict:
    """Issue 11's target for one case of one turn: zerohub >= 2x RabbitMQ's msg/s with
    the same clients, against the ceiling (the relay, same turn) that bounds any server.
    The figures are the first runs'; ``stalled`` names the servers whose run stalled
    (:data:`STALL_MS`) and ``again`` holds their repeats' msg/s (``--repeat-stalled``)."""

    case: str
    count: int
    ours: float
    rabbit: float
    ceiling: float
    stalled: tuple[str, ...] = ()
    again: tuple[tuple[str, float], ...] = ()

    @property
    def ratio(self) -> float:
        return self.ours / self.rabbit

    @property
    def reachable(self) -> bool:
        """2x RabbitMQ is at or below the ceiling: some server could do it with these
        clients on this machine in this turn."""
        return 2 * self.rabbit <= self.ceiling

    @property
    def met(self) -> bool:
        return self.ours >= 2 * self.rabbit

    @property
    def ratio_again(self) -> float:
        """The ratio with each stalled run replaced by its repeat (if it has one)."""
        again = dict(self.again)
        return again.get("zerohub", self.ours) / again.get("RabbitMQ", self.rabbit)


SHORT = {CEILING: "ceiling", ZEROHUB: "zerohub", RABBITMQ: "RabbitMQ"}


def verdicts(rows: list[Row]) -> list[Verdict]:
    """One :class:`Verdict` per case and count of ``rows`` (one turn) that has a
    zerohub, a RabbitMQ and a ceiling row."""
    first = {(r.name, r.count): r for r in rows if not r.repeat}
    repeats = {(r.name, r.count): r for r in rows if r.repeat}
    found = []
    for (name, count), row in first.items():
        if not name.startswith(ZEROHUB + " ") or "(baseline)" in name:
            continue
        case = name.removeprefix(ZEROHUB + " ")
        rabbit = first.get((f"{RABBITMQ} {case}", count))
        ceiling = first.get((f"{CEILING} {case}", count))
        if rabbit is None or ceiling is None:
            continue
        stalled, again = [], []
        for server, short in SHORT.items():
            mine = first[(f"{server} {case}", count)]
            if mine.wait is not None and mine.wait.stalled:
                stalled.append(short)
                repeat = repeats.get((mine.name, count))
                if repeat is not None:
                    again.append((short, repeat.rates[0]))
        found.append(
            Verdict(
                case,
                count,
                row.rates[0],
                rabbit.rates[0],
                ceiling.rates[0],
                tuple(stalled),
                tuple(again),
            )
        )
    return found


def _verdict_table(found: list[Verdict], turn: str) -> None:
    if not found:
        return
    print(
        f"\nIssue 11 verdict{turn:10} {'messages':>9} {'zerohub':>8} {'RabbitMQ':>9} "
        f"{'ratio':>6} {'ceiling':>8} {'2x RabbitMQ':>12} {'2x <= ceiling':>14} "
        f"{'zerohub % of ceiling':>21} {'met':>4}  stalled (repeat msg/s; ratio with repeats)"
    )
    for v in found:
        stalled = ", ".join(
            f"{who} ({dict(v.again)[who]:.0f})" if who in dict(v.again) else who
            for who in v.stalled
        )
        if v.again:
            stalled += f"; {v.ratio_again:.2f}"
        print(
            f"{v.case:26} {v.count:>9} {v.ours:>8.0f} {v.rabbit:>9.0f} {v.ratio:>6.2f} "
            f"{v.ceiling:>8.0f} {2 * v.rabbit:>12.0f} {'yes' if v.reachable else 'no':>14} "
            f"{100 * v.ours / v.ceiling:>20.0f}% {'yes' if v.met else 'no':>4}  {stalled}"
        )


def _verdict_summary(per_turn: list[list[Verdict]]) -> None:
    """Across turns, per case: in how many turns the target was met, 2x RabbitMQ was
    within the ceiling, and the ceiling was at least zerohub's rate (a ceiling below a
    real server's rate in the same turn is noise or a slow relay, not a bound), and in
    how many a run of the case stalled (any server's)."""
    cases: dict[tuple[str, int], list[Verdict]] = {}
    for found in per_turn:
        for v in found:
            cases.setdefault((v.case, v.count), []).append(v)
    if not cases:
        return
    print(
        f"\n{'Issue 11 verdict, all turns':30} {'messages':>9} {'met':>6} "
        f"{'2x <= ceiling':>14} {'ceiling >= zerohub':>19} {'ratio min-max':>14} "
        f"{'median ratio':>13} {'median % of ceiling':>20} {'stalled':>8} "
        f"{'median ratio, repeats':>22}"
    )
    for (case, count), found in cases.items():
        n = len(found)
        ratios = [v.ratio for v in found]
        shares = [100 * v.ours / v.ceiling for v in found]
        again = ""
        if any(v.again for v in found):
            again = f"{statistics.median(v.ratio_again for v in found):.2f}"
        print(
            f"{case:30} {count:>9} {sum(v.met for v in found):>3}/{n:<2} "
            f"{sum(v.reachable for v in found):>11}/{n:<2} "
            f"{sum(v.ceiling >= v.ours for v in found):>16}/{n:<2} "
            f"{min(ratios):>7.2f}-{max(ratios):<6.2f} {statistics.median(ratios):>13.2f} "
            f"{statistics.median(shares):>19.0f}% {sum(bool(v.stalled) for v in found):>5}/{n:<2} "
            f"{again:>22}"
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
    parser.add_argument(
        "--repeat-stalled",
        action="store_true",
        help=f"run a case once more on a server whose run stalled (a client waited >= "
        f"{STALL_MS:.0f} ms for one frame): both rows are shown, the first one decides",
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
    rabbit = None
    try:
        if not ready.wait(60) or echo.pid is None:
            raise SystemExit("the relay (stomp.py ceiling) did not start")
        if args.rabbitmq:
            sys.path.insert(0, str(Path(__file__).parent))
            from bench_broker import RabbitMQ

            RabbitMQ.install()
            rabbit = RabbitMQ()
            rabbit.start()
        for turn in range(1, args.turns + 1):
            ceiling = Server(CEILING, port, "/", echo.pid)
            rows += _turn(ctx, args, serve, turn, rabbit, ceiling)
    finally:
        if rabbit is not None:
            rabbit.stop()
        echo.kill()
        echo.join(30)
    if args.memory:
        port = free_port()
        with zerohub(["broker.stomp", "--bind", f"tcp://127.0.0.1:{port}"], b"listening on"):
            memory = Server("zerohub in-memory", port, "localhost", None)
            rows += measure(ctx, memory, args.messages)
    _table(rows)
    per_turn = []
    for turn in range(1, args.turns + 1):
        label = f" (turn {turn})" if args.turns > 1 else ""
        _ratios([r for r in rows if r.turn == turn], label)
        per_turn.append(verdicts([r for r in rows if r.turn == turn]))
    for turn, found in enumerate(per_turn, 1):
        _verdict_table(found, f" (turn {turn})" if args.turns > 1 else "")
    _verdict_summary(per_turn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
