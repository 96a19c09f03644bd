"""The broker's round trip, this checkout against another one in the same run.

    python bench/bench_round_trip.py --baseline /tmp/base [--turns 2] [--trips 5000]
    python bench/bench_round_trip.py --no-counts          # latency and CPU only

A round trip is ``bench_broker.py``'s: a client pushes 100 bytes into a queue of a
channel it joined and waits for the delivery, one message at a time.  Every party is its
own process on loopback TCP, the code of each checkout taken from ``PYTHONPATH``:

* latency: raw pyzmq (a DEALER and a ROUTER echo: ``bench_broker.raw_echo``) and each
  checkout's poll-on-call and threaded clients take turns in blocks of 100 trips, so all
  rows see the same load; p50 and p99 per row, its ratio to raw, and CPU per trip of the
  broker process (libzmq threads included) and of the client process;
* counts (unless ``--no-counts``), which the load does not move: system calls per trip
  (``strace -c`` attached during 2,000 trips) of the broker's serving thread, of the
  whole broker process and of the whole client process; Python calls per trip of the
  client, every thread (a ``threading.setprofile`` hook counting call events, C
  functions included).  ``bench/profile_broker.py --round-trip-only`` has the broker's
  Python calls (cProfile).

``--turns N``: everything N times, the baseline first in odd turns and last in even ones.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 100
#: Round trips per block: the rows take turns block by block.
BLOCK = 100
#: Round trips counted under strace and under the profile hook.
COUNTED = 2_000
CHANNEL = "bench-rtt"
HERE = Path(__file__).resolve()


# -- the parties (each runs as ``python bench_round_trip.py --role ROLE ...``) ----------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu(pid: int) -> float:
    """CPU seconds of a process's threads so far (``/proc/PID/task/*/schedstat``:
    nanoseconds, where ``/proc/PID/stat`` counts clock ticks of 10 ms)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def role_broker(endpoint: str) -> None:
    """A broker as ``bench_broker.serve_broker`` builds it (a fan-out XPUB beside the
    ROUTER), served on its own thread until a line comes on stdin."""
    import zmq

    from broker.engine.engine import Engine
    from broker.server.server import Server, ServerOptions

    ctx = zmq.Context()
    server = Server(Engine(), ServerOptions(endpoint=endpoint, fanout="tcp://127.0.0.1:*"),
                    context=ctx)  # fmt: skip
    server.start()
    thread = server._thread  # (bench: the serving thread's id, for strace)
    assert thread is not None
    print(f"ready {thread.native_id}", flush=True)
    sys.stdin.readline()
    server.stop()
    ctx.term()


def role_echo(endpoint: str) -> None:
    """``bench_broker.raw_echo``'s loop (poll, recv_multipart, send_multipart)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    print(f"ready {threading.get_native_id()}", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    while not stop.is_set():
        if sock.poll(100):
            sock.send_multipart(sock.recv_multipart())
    sock.close(linger=0)
    ctx.term()


class _CallCounter:
    """Python and C call events of every thread (``sys``/``threading.setprofile``)."""

    def __init__(self) -> None:
        self.calls = 0

    def hook(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            self.calls += 1

    def __enter__(self) -> _CallCounter:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def role_client(endpoint: str, kind: str, hooked: bool) -> None:
    """A round-trip client (``raw``, ``poll``: poll-on-call, ``threaded``) that answers
    commands on stdin: ``trips N`` (N trips, one line of their times in seconds),
    ``count N`` (``hooked`` only: N trips, the call events they made), ``quit``.
    ``hooked``: every thread runs under the counting hook (slow: never timed)."""
    import zmq

    counter = _CallCounter()
    if hooked:
        threading.setprofile(counter.hook)  # the I/O thread starts with it
    if kind == "raw":
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.connect(endpoint)

        def trip() -> None:
            sock.send(PAYLOAD)
            sock.recv()

        def close() -> None:
            sock.close(linger=0)
            ctx.term()

        def idle() -> None:
            pass

    else:
        from broker.client.blocking import Client

        client = Client(endpoint, context=zmq.Context(), threaded=kind == "threaded")
        client.connect()
        channel = f"{CHANNEL}-{kind}{'-hooked' if hooked else ''}"
        client.create_queue(channel, 1, {"Status": 1})
        client.join(channel)

        def trip() -> None:
            client.push(channel, 1, PAYLOAD)
            if client.receive(timeout=30) is None:
                raise SystemExit("round trip message lost")

        def close() -> None:
            client.close()
            client.context.term()

        def idle() -> None:
            client.poll()  # (poll-on-call) the broker's PINGs answered between commands

    for _ in range(50):  # warm up
        trip()
    print(f"ready {threading.get_native_id()}", flush=True)
    clock = time.perf_counter
    while True:
        if not select.select([sys.stdin], [], [], 0.5)[0]:
            idle()
            continue
        command, _, arg = sys.stdin.readline().strip().partition(" ")
        if command == "trips":
            times = []
            for _ in range(int(arg)):
                t = clock()
                trip()
                times.append(clock() - t)
            print(" ".join(f"{t:.7f}" for t in times), flush=True)
        elif command == "count" and hooked:
            counter.calls = 0
            with counter:
                for _ in range(int(arg)):
                    trip()
            print(counter.calls, flush=True)
        else:
            break
    close()


# -- the coordinator -----------------------------------------------------------------


@dataclass
class Party:
    """A party's process, its code's checkout, and what the coordinator learnt."""

    name: str
    proc: subprocess.Popen[str]
    args: tuple[str, ...] = ()
    source: str | None = None
    tid: int = 0
    times: list[float] = field(default_factory=list)
    cpu: float = 0.0  # CPU seconds of its process over its blocks
    broker_cpu: float = 0.0  # CPU seconds of the broker process over its blocks
    broker: Party | None = None

    @classmethod
    def start(cls, name: str, source: str | None, *args: str) -> Party:
        env = dict(os.environ)
        if source is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [source, env.get("PYTHONPATH")]))
        proc = subprocess.Popen(
            [sys.executable, str(HERE), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),  # not a checkout: PYTHONPATH decides
        )
        party = cls(name, proc, args, source)
        line = party.read()
        if not line.startswith("ready"):
            raise SystemExit(f"{name} did not start: {line!r}")
        party.tid = int(line.split()[1])
        return party

    def read(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _percentile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(len(sorted_times) * q))]


def _strace(pids: list[int]) -> tuple[subprocess.Popen[bytes], Path]:
    out = Path(tempfile.mkstemp(prefix="rtt-strace-")[1])
    args = [a for pid in pids for a in ("-p", str(pid))]
    tracer = subprocess.Popen(["strace", "-c", "-o", str(out), *args], stderr=subprocess.DEVNULL)
    return tracer, out


def _strace_total(tracer: subprocess.Popen[bytes], out: Path) -> int:
    tracer.send_signal(signal.SIGINT)
    tracer.wait(30)
    total = 0
    for line in out.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] == "total" and re.fullmatch(r"[\d.]+", fields[0]):
            total = int(fields[3])
    out.unlink()
    return total


def _tasks(pid: int) -> list[int]:
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def _attached(tracer: subprocess.Popen[bytes], tids: list[int]) -> None:
    """Wait until strace has attached to every thread (its TracerPid shows)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(_tracer_of(tid) == tracer.pid for tid in tids):
            return
        time.sleep(0.05)
    raise SystemExit("strace did not attach")


def _tracer_of(tid: int) -> int:
    with open(f"/proc/{tid}/status") as f:
        for line in f:
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    return 0


def counts(client: Party, broker: Party) -> dict[str, float]:
    """System calls per trip (serving thread, broker, client) and the client's Python
    calls per trip."""
    got: dict[str, float] = {}
    for name, pids in (
        ("sys: broker loop", [broker.tid]),
        ("sys: broker process", _tasks(broker.proc.pid)),
        ("sys: client process", _tasks(client.proc.pid)),
    ):
        tracer, out = _strace(pids)
        _attached(tracer, pids)
        client.ask(f"trips {COUNTED}")
        got[name] = _strace_total(tracer, out) / COUNTED
    if "raw" not in client.args:
        hooked = Party.start(client.name, client.source, *client.args, "--hooked")
        try:
            got["py: client calls"] = int(hooked.ask(f"count {COUNTED}")) / COUNTED
        finally:
            hooked.stop()
    return got


def run_turn(sources: list[tuple[str, str | None]], trips: int, with_counts: bool) -> list[Any]:
    """One turn: brokers and clients of every checkout and raw, blocks in turns."""
    parties: list[Party] = []
    try:
        echo_at = f"tcp://127.0.0.1:{_free_port()}"
        echo = Party.start("raw echo", None, "--role", "echo", "--endpoint", echo_at)
        parties.append(echo)
        raw = Party.start("raw pyzmq", None, "--role", "client", "--kind", "raw",
                          "--endpoint", echo_at)  # fmt: skip
        raw.broker = echo
        parties.append(raw)
        clients = [raw]
        for label, source in sources:
            at = f"tcp://127.0.0.1:{_free_port()}"
            broker = Party.start(f"{label} broker", source, "--role", "broker", "--endpoint", at)
            parties.append(broker)
            for kind in ("poll", "threaded"):
                client = Party.start(f"{label} {kind}", source, "--role", "client",
                                     "--kind", kind, "--endpoint", at)  # fmt: skip
                client.broker = broker
                parties.append(client)
                clients.append(client)
        for _ in range(max(1, trips // BLOCK)):
            for client in clients:
                assert client.broker is not None
                b0, c0 = _cpu(client.broker.proc.pid), _cpu(client.proc.pid)
                line = client.ask(f"trips {BLOCK}")
                client.cpu += _cpu(client.proc.pid) - c0
                client.broker_cpu += _cpu(client.broker.proc.pid) - b0
                client.times.extend(float(t) for t in line.split())
        rows = []
        for client in clients:
            assert client.broker is not None
            got = counts(client, client.broker) if with_counts else {}
            rows.append((client, got))
        return rows
    finally:
        for party in reversed(parties):
            party.stop()


def report(turn: int, rows: list[Any]) -> None:
    raw_p50 = statistics.median(rows[0][0].times)
    print(f"\nturn {turn}, load {os.getloadavg()[0]:.1f}")
    keys = sorted({k for _c, got in rows for k in got})
    head = f"{'row':<22} {'p50 us':>7} {'p99 us':>7} {'x raw':>6}"
    head += f" {'broker CPU':>10} {'client CPU':>10}"
    print(head + "".join(f" {k:>20}" for k in keys))
    for client, got in rows:
        n = len(client.times)
        ordered = sorted(client.times)
        p50, p99 = _percentile(ordered, 0.5), _percentile(ordered, 0.99)
        cells = "".join(f" {got[k]:>20.2f}" if k in got else f" {'-':>20}" for k in keys)
        print(
            f"{client.name:<22} {p50 * 1e6:>7.1f} {p99 * 1e6:>7.1f} {p50 / raw_p50:>6.2f}"
            f" {client.broker_cpu / n * 1e6:>10.1f} {client.cpu / n * 1e6:>10.1f}{cells}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another checkout to compare")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--trips", type=int, default=5_000, help="round trips per row and turn")
    parser.add_argument("--no-counts", action="store_true", help="no strace, no call counts")
    parser.add_argument("--role", choices=("broker", "echo", "client"), help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="poll", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--hooked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "broker":
        role_broker(args.endpoint)
        return 0
    if args.role == "echo":
        role_echo(args.endpoint)
        return 0
    if args.role == "client":
        role_client(args.endpoint, args.kind, args.hooked)
        return 0
    if args.turns < 1 or args.trips < BLOCK:
        parser.error(f"--turns must be at least 1 and --trips at least {BLOCK}")
    with_counts = not args.no_counts
    if with_counts and subprocess.run(["which", "strace"], capture_output=True).returncode:
        parser.error("strace is not installed (or use --no-counts)")
    this = str(HERE.parent.parent)
    sources: list[tuple[str, str | None]] = [("this", this)]
    if args.baseline:
        sources.insert(0, ("base", str(Path(args.baseline).resolve())))
    for turn in range(1, args.turns + 1):
        order = sources if turn % 2 else sources[::-1]
        report(turn, run_turn(order, args.trips, with_counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
