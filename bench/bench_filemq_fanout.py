"""FILEMQ fan-out: many mirrors fed directly by one server, or through relays.

    python bench/bench_filemq_fanout.py                 # 1,000 mirrors, direct vs 10 relays
    python bench/bench_filemq_fanout.py --mirrors 20 --relays 0   # server-side fan-out only
    python bench/bench_filemq_fanout.py --quick         # 100 mirrors, 4 relays, 10 changes

The mirrors are in-process subscriber engines (``filemq.engine_client.ClientSession``,
one DEALER each, all driven by one thread of this process; a file counts as mirrored
when its last chunk reached the engine: nothing is written to disk).  The origin is a
``filemq serve`` process (inotify) publishing a folder; with relays, R ``filemq
subscribe --serve`` processes mirror the origin and each feeds mirrors/R engines.

This process writes N files of 4 KiB into the origin's folder, one every
``--interval`` s, and times each from its close to the moment the *last* mirror had
it (change-to-all-mirrored; p50/p99 over the changes) and to each mirror
(per delivery).  Server CPU: the origin process's user+system CPU seconds during the
change phase (``/proc``), per change.  Memory per idle subscriber: the origin's RSS
with every mirror connected and idle, minus its RSS before they connected, divided by
the number of its direct clients.  The engines' own cost (one Python thread for all
of them) is part of every figure alike: compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from filemq.engine import load_wire
from filemq.engine_client import ClientSession, FileChunk, ResyncDone, Send

PY = sys.executable
FILEMQ = [PY, "-m", "filemq", "-q"]
SIZE = 4096
_TICK = 1.0  # seconds between heartbeat passes over every engine
_CLK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, round(p / 100 * len(ordered)))  # nearest rank
    return ordered[rank - 1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "wb") as err:
            self.popen = subprocess.Popen(
                [*FILEMQ, *args], stdout=subprocess.DEVNULL, stderr=err, env=env
            )

    def endpoint(self, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"serving .* on (tcp://\S+) \(", self.log.read_text())
            if found:
                return found.group(1)
            if self.popen.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"no serving line: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class Farm:
    """N mirror engines in this process, one DEALER each, one poller for all."""

    def __init__(self, context: zmq.Context[Any], endpoints: list[str], count: int) -> None:
        self.wire = load_wire("spec")
        self.poller = zmq.Poller()
        self.sockets: list[zmq.Socket[Any]] = []
        self.sessions: dict[zmq.Socket[Any], ClientSession] = {}
        self.arrived: dict[str, list[float]] = {}  # name -> arrival times (one per mirror)
        self.synced = 0
        now = time.monotonic()
        for i in range(count):
            sock = context.socket(zmq.DEALER)
            sock.linger = 0
            sock.connect(endpoints[i % len(endpoints)])
            session = ClientSession(self.wire, "/", {}, now, heartbeat=2.0, timeout=60.0)
            self.sockets.append(sock)
            self.sessions[sock] = session
            self.poller.register(sock, zmq.POLLIN)
            self._act(sock, session.start(now))
        self._next_tick = now + _TICK

    def _act(self, sock: zmq.Socket[Any], actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Send):
                sock.send_multipart(action.frames)
            elif isinstance(action, FileChunk) and action.eof:
                self.arrived.setdefault(action.name, []).append(time.time())
            elif isinstance(action, ResyncDone):
                self.synced += 1

    def pump(self, timeout_ms: int) -> None:
        now = time.monotonic()
        for sock, _ in self.poller.poll(timeout_ms):
            session = self.sessions[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._act(sock, session.receive(frames, now))
        if now >= self._next_tick:
            self._next_tick = now + _TICK
            for sock, session in self.sessions.items():
                self._act(sock, session.tick(now))

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)


def scenario(
    work: Path, mirrors: int, relays: int, changes: int, interval: float
) -> dict[str, float]:
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src"
    src.mkdir(parents=True)
    for d in range(10):
        (src / f"d{d}").mkdir()
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state"), "XDG_CACHE_HOME": str(work)}
    procs: list[Proc] = []
    context: zmq.Context[Any] = zmq.Context()
    context.max_sockets = mirrors + 64  # (one DEALER per mirror; the default is 1,023)
    farm: Farm | None = None
    try:
        origin = Proc(
            ["serve", "--bind", "tcp://127.0.0.1:*", "--publish", str(src), "--no-state"],
            work / "origin.log",
            env,
        )
        procs.append(origin)
        endpoints = [origin.endpoint()]
        for r in range(relays):
            relay = Proc(
                [
                    *("subscribe", endpoints[0], str(work / f"relay{r}"), "--no-index"),
                    *("--serve", "tcp://127.0.0.1:*", "--check-interval", "0"),
                ],
                work / f"relay{r}.log",
                env,
            )
            procs.append(relay)
        if relays:
            endpoints = [p.endpoint() for p in procs[1:]]
        time.sleep(0.5)  # (settling: every process is past its start-up before the baseline)
        rss_before = rss_bytes(origin.popen.pid)
        farm = Farm(context, endpoints, mirrors)
        deadline = time.monotonic() + 120
        while farm.synced < mirrors:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {farm.synced} of {mirrors} mirrors synced")
            farm.pump(50)
        settle_until = time.monotonic() + 1.0
        while time.monotonic() < settle_until:
            farm.pump(50)
        rss_idle = rss_bytes(origin.popen.pid)
        payload = os.urandom(SIZE)
        closed: dict[str, float] = {}
        cpu_before = cpu_seconds(origin.popen.pid)
        next_write = time.monotonic()
        for i in range(changes):
            while (left := next_write - time.monotonic()) > 0:
                farm.pump(max(0, int(left * 1000)))
            name = f"d{i % 10}/f{i:05d}.bin"
            with open(src / name, "wb") as f:
                f.write(payload)
            closed[name] = time.time()
            next_write += interval
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(
            len(farm.arrived.get(n, ())) < mirrors for n in closed
        ):
            farm.pump(50)
        cpu = cpu_seconds(origin.popen.pid) - cpu_before
        missing = sum(mirrors - len(farm.arrived.get(n, ())) for n in closed)
        if missing:
            raise RuntimeError(f"{missing} deliveries missing")
        last = [max(farm.arrived[n]) - t for n, t in closed.items()]
        each = [a - t for n, t in closed.items() for a in farm.arrived[n]]
        direct = relays if relays else mirrors
        return {
            "all_p50": percentile(last, 50),
            "all_p99": percentile(last, 99),
            "one_p50": percentile(each, 50),
            "one_p99": percentile(each, 99),
            "cpu_per_change": cpu / changes,
            "rss_per_client": (rss_idle - rss_before) / direct,
        }
    finally:
        if farm is not None:
            farm.close()
        for proc in reversed(procs):
            proc.stop()
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=int, default=1000)
    parser.add_argument("--relays", type=int, default=10, help="relays of the relayed row")
    parser.add_argument("-n", type=int, default=30, help="changes per row")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between changes (the engines, one thread, must keep up: figures per "
        "change, not of a backlog)",
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    mirrors, relays, n = (100, 4, 10) if args.quick else (args.mirrors, args.relays, args.n)
    rows = [("direct", 0)] + ([(f"through {relays} relays", relays)] if relays else [])
    print(
        f"\n{mirrors} mirrors, {n} changes of {SIZE} B one every {args.interval * 1000:g} ms: "
        "change-to-all-mirrored and per delivery (ms); origin CPU per change; "
        "origin RSS per direct client"
    )
    print(
        f"{'feed':<20} {'all p50':>8} {'all p99':>8} {'one p50':>8} {'one p99':>8} "
        f"{'CPU ms/chg':>10} {'KiB/client':>10}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        for label, r in rows:
            m = scenario(Path(tmp) / "run", mirrors, r, n, args.interval)
            print(
                f"{label:<20} {m['all_p50'] * 1e3:>8.1f} {m['all_p99'] * 1e3:>8.1f} "
                f"{m['one_p50'] * 1e3:>8.1f} {m['one_p99'] * 1e3:>8.1f} "
                f"{m['cpu_per_change'] * 1e3:>10.2f} {m['rss_per_client'] / 1024:>10.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
