"""Why ``bench_stomp.py``'s 10k "receipt per SEND" runs collapse: the same stomp.py
producer (a ``receipt`` on every SEND, then it waits for every RECEIPT) and ``ack:auto``
consumer, run ``--runs`` times on each server (the bench's relay "ceiling", ``broker serve
--stomp`` of this checkout, RabbitMQ with ``--rabbitmq``; servers take turns run by run),
with a timeline of every run: the time of each ``send`` call, of each RECEIPT and each
MESSAGE, all from the producer's start (``perf_counter``: one clock for all processes).

Per run: the bench's rate, when the send loop ended, the last RECEIPT and last MESSAGE,
the longest gap in each of the three series (where it started, what came before), and the
kernel's TCP counters moved during the run (``/proc/net/netstat`` and ``snmp``: the
whole machine's, so another's traffic shows too; only the ones that moved), each
process's threads' CPU and run-queue time (schedstat: a client that waited long with a
short runq slept, waiting for bytes), the machine's idle and steal ticks, and the late
wake-ups of a 1 ms heartbeat thread (everything stopped at once: the machine did not run
them).  A run whose longest gap exceeds ``--gap`` ms is flagged with the series that
waited.  With ``--sample MS`` the run's sockets are read from /proc/net/tcp every MS and
the samples around the gap printed (each side's send and receive queue, its pending timer:
PERSIST is the zero-window probe).

With ``--relay-maxseg BYTES`` a second relay runs in the turns, its listening socket
(so every connection it accepts) with that ``TCP_MAXSEG``.

Usage: ``python bench/stall_receipts.py [--runs 10] [--messages 10000] [--rabbitmq]
[--gap 50] [--sample MS] [--no-zerohub] [--no-relay] [--relay-maxseg BYTES]``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stomp import PAYLOAD, free_port, relay, serve_args, zerohub


def thread_times(pid: int | str = "self") -> dict[int, tuple[float, float]]:
    """Per thread of process ``pid``: (CPU seconds, seconds runnable but waiting for a
    CPU) so far, from /proc/PID/task/TID/schedstat."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            run, wait, _ = (task / "schedstat").read_text().split()
            found[int(task.name)] = (int(run) / 1e9, int(wait) / 1e9)
    return found


def consumer(port: int, vhost: str, count: int, ready: Any, out: Any) -> None:
    import stomp

    done = threading.Event()
    times: list[float] = []

    marks: list[Any] = []

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_message(self, frame: Any) -> None:
            times.append(time.perf_counter())
            if len(times) >= count:
                marks.append(thread_times())
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/bench", id="1", ack="auto")
    out.put(("consumer-port", conn.transport.socket.getsockname()[1]))
    go_mark = thread_times()
    ready.set()
    done.wait(600)
    out.put(("messages", times))
    out.put(("consumer threads", (os.getpid(), go_mark, marks[0])))
    conn.disconnect()


def producer(port: int, vhost: str, count: int, go: Any, out: Any) -> None:
    import stomp

    receipts: list[float] = []
    all_in = threading.Event()

    class Listener(stomp.ConnectionListener):  # type: ignore[misc]
        def on_receipt(self, frame: Any) -> None:
            receipts.append(time.perf_counter())
            if len(receipts) >= count:
                all_in.set()

    conn = stomp.Connection12([("127.0.0.1", port)], vhost=vhost)
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    out.put(("producer-port", conn.transport.socket.getsockname()[1]))
    go.wait(60)
    sends: list[float] = []
    first = thread_times()
    start = time.perf_counter()
    for i in range(count):
        conn.send("/queue/bench", PAYLOAD, receipt=str(i))
        sends.append(time.perf_counter())
    all_in.wait(600)
    out.put(("producer threads", (os.getpid(), first, thread_times())))
    out.put(("start", start))
    out.put(("sends", sends))
    out.put(("receipts", receipts))
    conn.disconnect()


def tcp_counters() -> dict[str, int]:
    """Every TcpExt / Tcp counter of /proc/net/netstat and /proc/net/snmp."""
    found: dict[str, int] = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = Path(path).read_text().splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            prefix, _, keys = names.partition(":")
            if prefix not in ("TcpExt", "Tcp"):
                continue
            for key, value in zip(keys.split(), values.split(":")[1].split(), strict=False):
                found[key] = int(value)
    return found


WATCHED = (
    "DelayedACKs",
    "DelayedACKLocked",
    "DelayedACKLost",
    "TCPZeroWindowDrop",
    "TCPRcvQDrop",
    "TCPWantZeroWindowAdv",
    "TCPToZeroWindowAdv",
    "TCPFromZeroWindowAdv",
    "PruneCalled",
    "RcvPruned",
    "TCPRcvCollapsed",
    "TCPTimeouts",
    "TCPLossProbes",
    "RetransSegs",
    "TCPBacklogDrop",
    "TCPOFOQueue",
    "TCPOFODrop",
    "TCPRcvCoalesce",
    "TCPBacklogCoalesce",
    "TCPSpuriousRTOs",
    "TCPDSACKRecv",
    "TCPAutoCorking",
)


def cpu_ticks() -> dict[str, int]:
    """The machine's CPU time so far (/proc/stat, all CPUs, in clock ticks)."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    values = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    return dict(zip(names, (int(v) for v in values), strict=True))


class Heartbeat:
    """A thread that sleeps 1 ms at a time and keeps its late wake-ups (over 20 ms):
    when it, the clients and the server all stop at once, the machine did not run them."""

    def __init__(self) -> None:
        self.late: list[tuple[float, float]] = []  # (woke at, ms late)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        before = time.perf_counter()
        while not self.stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            if now - before > 0.021:
                self.late.append((now, (now - before - 0.001) * 1000))
            before = now

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


TIMERS = {0: "-", 1: "rto/tlp", 2: "keepalive", 3: "timewait", 4: "PERSIST"}


class ProcSampler:
    """The run's sockets in /proc/net/tcp every ``every`` seconds, in a thread: queues
    and the timer each one has pending (4: the zero-window probe, "persist")."""

    def __init__(self, port: int, every: float) -> None:
        self.port = f"{port:04X}"
        self.every = every
        self.samples: list[tuple[float, list[tuple[int, int, int, int, str, int]]]] = []
        self.detail: list[tuple[float, str]] = []  # ``ss -tinm`` once the pattern shows
        self.streak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            at = time.perf_counter()
            found = []
            with open("/proc/net/tcp") as table:
                next(table)
                for line in table:
                    f = line.split()
                    local, remote = f[1].rsplit(":", 1)[1], f[2].rsplit(":", 1)[1]
                    if self.port not in (local, remote) or f[3] != "01":
                        continue
                    tx, rx = (int(x, 16) for x in f[4].split(":"))
                    tr, when = f[5].split(":")
                    timer = TIMERS.get(int(tr, 16), tr)
                    found.append((int(local, 16), int(remote, 16), tx, rx, timer, int(when, 16)))
            self.samples.append((at, found))
            if len(self.detail) < 3 and self._empty_behind_persist(found):
                text = subprocess.run(
                    [
                        "ss",
                        "-tinmeHO",
                        f"( sport = :{int(self.port, 16)} or dport = :{int(self.port, 16)} )",
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout
                self.detail.append((at, text))
            self.stop.wait(self.every)

    def _empty_behind_persist(self, found: list[tuple[int, int, int, int, str, int]]) -> bool:
        """A server socket holds bytes in PERSIST toward a client whose queue is empty,
        for the 5th sample in a row (so ``ss`` runs once the stall is under way)."""
        port = int(self.port, 16)
        rx = {f[0]: f[3] for f in found if f[1] == port}
        hit = any(f[0] == port and f[2] and f[4] == "PERSIST" and rx.get(f[1]) == 0 for f in found)
        self.streak = self.streak + 1 if hit else 0
        return self.streak == 5

    def __enter__(self) -> ProcSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@dataclass
class Gap:
    length: float  # seconds
    at: float  # since the producer's start, where it began
    index: int  # the item before it (0-based)


def longest_gap(times: list[float], start: float) -> Gap:
    best = Gap(0.0, 0.0, -1)
    before = start
    for i, t in enumerate(times):
        if t - before > best.length:
            best = Gap(t - before, before - start, i - 1)
        before = t
    return best


def classify(got: dict[str, Any], on: str, gap: Gap, start: float) -> str:
    """What the /proc/net/tcp samples inside a gap say, per sample: the waiting client
    has bytes it does not read; its queue is empty and the server's socket toward it
    holds bytes in the zero-window probe (PERSIST) or in flight; the server has the
    producer's bytes unread (with the producer's socket in PERSIST: its window shut);
    nothing is queued anywhere (a party did not run)."""
    producer = got["producer-port"]
    client = got["consumer-port"] if on == "MESSAGE" else producer
    lo, hi = start + gap.at + 0.01, start + gap.at + gap.length - 0.005
    kinds: dict[str, int] = {}
    for at, found in got["ss"]:
        if not lo <= at <= hi:
            continue
        local = {f[0]: f for f in found}
        remote = {f[1]: f for f in found}
        if client not in local or client not in remote:
            continue
        c_rx = local[client][3]
        s_tx, s_timer = remote[client][2], remote[client][4]
        unread = remote[producer][3] if producer in remote else 0
        if on != "send" and c_rx:
            kind = "client not reading"
        elif on != "send" and s_tx and s_timer == "PERSIST":
            kind = "PERSIST toward the client, its queue empty"
        elif on != "send" and s_tx:
            kind = "in flight to the client"
        elif unread:
            shut = producer in local and local[producer][4] == "PERSIST"
            kind = "server not reading the producer" + (" (PERSIST)" if shut else "")
        else:
            kind = "nothing queued"
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        return "no samples"
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def one_run(
    ctx: Any, port: int, vhost: str, count: int, sample_ms: float | None, server: int | None
) -> dict[str, Any]:
    out, ready, go = ctx.Queue(), ctx.Event(), ctx.Event()
    c = ctx.Process(target=consumer, args=(port, vhost, count, ready, out))
    c.start()
    ready.wait(60)
    p = ctx.Process(target=producer, args=(port, vhost, count, go, out))
    p.start()
    time.sleep(0.5)
    before = tcp_counters()
    ticks = cpu_ticks()
    heart = Heartbeat()
    server_before = thread_times(server) if server else {}
    sampler: Any = None
    if sample_ms:
        sampler = ProcSampler(port, sample_ms / 1000)
    with heart, sampler if sampler is not None else contextlib.nullcontext():
        go.set()
        got = dict(out.get(timeout=900) for _ in range(8))
    after = tcp_counters()
    got["ticks"] = {k: v - ticks[k] for k, v in cpu_ticks().items()}
    got["late"] = heart.late
    server_after = thread_times(server) if server else {}
    got["server threads"] = (server or 0, server_before, server_after)
    p.join(60)
    c.join(60)
    moved = {k: after.get(k, 0) - before.get(k, 0) for k in WATCHED}
    got["counters"] = {k: v for k, v in moved.items() if v}
    got["ss"] = sampler.samples if sampler is not None else []
    got["detail"] = sampler.detail if sampler is not None else []
    return got


def report(name: str, run: int, got: dict[str, Any], count: int, gap_ms: float) -> dict[str, Any]:
    start = got["start"]
    sends, receipts, messages = got["sends"], got["receipts"], got["messages"]
    end = max(receipts[-1], messages[-1])
    rate = count / (end - start)
    gaps = {
        "send": longest_gap(sends, start),
        "RECEIPT": longest_gap(receipts, start),
        "MESSAGE": longest_gap(messages, start),
    }
    worst = max(gaps, key=lambda k: gaps[k].length)
    flag = ""
    if gaps[worst].length * 1000 > gap_ms:
        g = gaps[worst]
        flag = f"STALL {worst} {g.length * 1000:.0f} ms after #{g.index} at {g.at * 1000:.0f} ms"
        if got["ss"]:
            flag += f" [{classify(got, worst, g, start)}]"
    row = {
        "server": name,
        "run": run,
        "rate": rate,
        "sent": (sends[-1] - start) * 1000,
        "last receipt": (receipts[-1] - start) * 1000,
        "last message": (messages[-1] - start) * 1000,
        "gaps": {k: (g.length * 1000, g.at * 1000, g.index) for k, g in gaps.items()},
        "counters": got["counters"],
        "flag": flag,
    }
    tail = (end - sends[-1]) * 1000
    row["tail"] = tail
    print(
        f"{name:8} run {run:>2} @{start:.3f}: {rate:>7.0f} msg/s  tail {tail:4.0f} ms  "
        f"sent {row['sent']:6.0f} ms  "
        f"last RECEIPT {row['last receipt']:6.0f}  last MESSAGE {row['last message']:6.0f}  "
        + "  ".join(
            f"max gap {k} {g.length * 1000:5.1f} ms @{g.at * 1000:.0f}#{g.index}"
            for k, g in gaps.items()
        )
        + f"  {flag}  ports p{got['producer-port']} c{got['consumer-port']}",
        flush=True,
    )
    parts = []
    for who in ("producer", "consumer", "server"):
        pid, first, last = got[f"{who} threads"]
        for tid in sorted(last):
            if tid not in first:
                continue
            cpu = (last[tid][0] - first[tid][0]) * 1000
            wait = (last[tid][1] - first[tid][1]) * 1000
            if cpu < 1 and wait < 1:
                continue
            name = "main" if tid == pid else f"t{tid}"
            parts.append(f"{who} {name} cpu {cpu:.0f} runq {wait:.0f}")
        row[f"{who} cpu"] = sum(last[t][0] - first[t][0] for t in last if t in first) * 1000
        row[f"{who} runq"] = sum(last[t][1] - first[t][1] for t in last if t in first) * 1000
    print("          ms: " + "; ".join(parts))
    ticks = got["ticks"]
    late = [(at - start, ms) for at, ms in got["late"] if start <= at <= end + 0.01]
    row["late"] = max((ms for _, ms in late), default=0.0)
    row["steal"] = ticks["steal"]
    print(
        f"          machine: idle {ticks['idle']} steal {ticks['steal']} ticks; heartbeat late "
        + (" ".join(f"{ms:.0f} ms @{at * 1000:.0f}" for at, ms in late) or "never")
    )
    if got["counters"]:
        print("          tcp: " + " ".join(f"{k}+{v}" for k, v in got["counters"].items()))
    for at, text in got.get("detail", []):
        print(
            f"          ss -tinme @{(at - start) * 1000:.0f} ms (PERSIST toward an empty queue):"
        )
        for line in text.splitlines():
            print("            " + " ".join(line.split()))
    if flag and got["ss"]:
        g = gaps[worst]
        lo, hi = start + g.at - 0.03, start + g.at + g.length + 0.01
        names = {got["producer-port"]: "producer", got["consumer-port"]: "consumer"}
        for at, found in got["ss"]:
            if lo <= at <= hi:
                cells = []
                for local, remote, tx, rx, timer, when in sorted(found):
                    side = names.get(local, f"server>{names.get(remote, remote)}")
                    cells.append(f"{side} tx {tx} rx {rx} {timer} {when}")
                print(f"          @{(at - start) * 1000:4.0f} ms  " + " | ".join(cells))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rabbitmq", action="store_true")
    parser.add_argument("--no-zerohub", action="store_true")
    parser.add_argument("--no-relay", action="store_true")
    parser.add_argument(
        "--relay-maxseg",
        type=int,
        default=None,
        help="also a relay whose listening socket has this TCP_MAXSEG (bytes)",
    )
    parser.add_argument("--gap", type=float, default=50.0, help="flag gaps above this (ms)")
    parser.add_argument("--sample", type=float, default=None, help="sample /proc/net/tcp every MS")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    servers: list[tuple[str, int, str]] = []
    with contextlib.ExitStack() as stack:
        if not args.no_relay:
            port = free_port()
            ready = ctx.Event()
            echo = ctx.Process(target=relay, args=(port, ready), daemon=True)
            echo.start()
            stack.callback(echo.join, 30)
            stack.callback(echo.kill)
            ready.wait(60)
            servers.append(("relay", port, "/", echo.pid))
        if args.relay_maxseg:
            port = free_port()
            ready = ctx.Event()
            mss = ctx.Process(target=relay, args=(port, ready, args.relay_maxseg), daemon=True)
            mss.start()
            stack.callback(mss.join, 30)
            stack.callback(mss.kill)
            ready.wait(60)
            servers.append((f"relay{args.relay_maxseg // 1024}k", port, "/", mss.pid))
        if not args.no_zerohub:
            serve = serve_args(free_port(), "none")
            port = int(serve[serve.index("--stomp") + 1].rsplit(":", 1)[1])
            proc = stack.enter_context(zerohub(serve, b"broker serving on"))
            servers.append(("zerohub", port, "localhost", proc.pid))
        if args.rabbitmq:
            from bench_broker import RabbitMQ

            RabbitMQ.install()
            rabbit = RabbitMQ()
            rabbit.start()
            stack.callback(rabbit.stop)
            servers.append(("RabbitMQ", rabbit.stomp_port, "/", rabbit.pid))
        rows = []
        for run in range(1, args.runs + 1):
            order = servers if run % 2 else servers[::-1]
            for name, port, vhost, pid in order:
                got = one_run(ctx, port, vhost, args.messages, args.sample, pid)
                rows.append(report(name, run, got, args.messages, args.gap))
    print()
    for name, *_ in servers:
        mine = [r for r in rows if r["server"] == name]
        stalled = [r for r in mine if r["flag"]]
        print(
            f"{name:8} runs {len(mine)}  stalled {len(stalled)}  rates "
            + " ".join(f"{r['rate'] / 1000:.1f}k" for r in mine)
        )
        for r in stalled:
            print(f"         run {r['run']}: {r['flag']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
