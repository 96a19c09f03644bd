"""Deterministic counts per STOMP message in ``broker serve --stomp``: the Python calls
of each of the broker's threads (cProfile on every thread), stomp.py producer -> one
``/queue/`` -> stomp.py consumer (``ack:auto``, optionally a receipt per SEND), 100-byte
bodies, as ``bench_stomp.py`` drives it.

Counts, not times: they hardly depend on the machine's load (the reads a loaded machine
splits differently move them a little: compare within a run).  With ``--baseline
CHECKOUT`` the same server from another checkout runs in turns with this one.

Usage: ``python bench/profile_stomp.py [--messages N] [--receipts] [--raw] [--top K]
[--baseline CHECKOUT] [--turns N]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stomp import cpu_seconds, free_port, run_pair, serve_args, zerohub

#: The serving process's wrapper: every thread's ``run`` (and the main thread) under its
#: own cProfile; each dumps its stats to ``PROFILE_DIR`` when the process ends.  With
#: ``PROFILE_CPU`` set, no profiler: each thread writes its native id and name there
#: (for its CPU time in ``/proc``).
SERVE_UNDER_PROFILE = """
import atexit, cProfile, os, sys, threading
out = os.environ["PROFILE_DIR"]
profiles = []
if os.environ.get("PROFILE_CPU"):
    class _Off:
        def enable(self): pass
        def disable(self): pass
        def dump_stats(self, path): pass
        def getstats(self): return []
    def _new():
        tid, name = threading.get_native_id(), threading.current_thread().name
        with open(os.path.join(out, "threads"), "a") as f:
            f.write(f"{tid} {name}\\n")
        return _Off()
else:
    _new = cProfile.Profile
def _dump():
    for name, prof in profiles:
        prof.disable()
        prof.dump_stats(os.path.join(out, name + ".prof"))
        # the count per code object (bench/call_count.py: pstats folds same-named rows)
        with open(os.path.join(out, name + ".calls"), "w") as f:
            f.write(str(sum(entry.callcount for entry in prof.getstats())))
atexit.register(_dump)
run = threading.Thread.run
def _run(self):
    prof = _new()
    profiles.append((f"thread-{len(profiles)}-{self.name}", prof))
    prof.enable()
    try:
        run(self)
    finally:
        prof.disable()
threading.Thread.run = _run
main = _new()
profiles.append(("main", main))
sys.argv = ["broker"] + sys.argv[1:]
import runpy
main.enable()
try:
    runpy.run_module("broker", run_name="__main__")
except SystemExit:
    pass
"""


def profile_once(
    ctx: object,
    source: str | None,
    count: int,
    receipts: bool,
    raw: bool,
    top: int,
    save: str | None = None,
) -> dict[str, float]:
    """Python calls per message of each thread of one serving process."""
    with tempfile.TemporaryDirectory(prefix="profile-stomp-") as out:
        port = free_port()
        args = ["-c", SERVE_UNDER_PROFILE, *serve_args(port, "none")[1:]]
        os.environ["PROFILE_DIR"] = out
        with zerohub(args, b"broker serving on", source, module=False) as proc:
            run_pair(ctx, port, "localhost", 200, receipts, raw)  # warm up
            before = cpu_seconds(proc.pid)
            run_pair(ctx, port, "localhost", count, receipts, raw)
            after = cpu_seconds(proc.pid)
        result: dict[str, float] = {}
        if before is not None and after is not None:
            result["CPU us/msg (incl. profiling)"] = (after - before) / count * 1e6
        total = 0
        for path in sorted(Path(out).glob("*.prof")):
            stats = pstats.Stats(str(path))
            calls = int(path.with_suffix(".calls").read_text())
            total += calls
            if calls < count:  # an idle thread
                continue
            result[path.stem] = calls / (count + 200)
            if save:
                Path(save).mkdir(parents=True, exist_ok=True)
                stats.dump_stats(
                    str(Path(save) / f"{'baseline' if source else 'this'}-{path.name}")
                )
            if top:
                print(f"--- {source or 'this'}: {path.stem}")
                stats.sort_stats(os.environ.get("PROFILE_SORT", "calls")).print_stats(top)
        result["all threads"] = total / (count + 200)
    return result


def _thread_cpu(pid: int, out: str) -> dict[str, float]:
    """CPU seconds so far of each named thread of process ``pid``: the time it ran, in
    nanoseconds (``/proc/PID/task/TID/schedstat``), not 10 ms ticks -- a 10k run's
    figures per thread are exact to a few ns per message."""
    result = {}
    for line in Path(out, "threads").read_text().splitlines():
        tid, name = line.split(" ", 1)
        ran = _ran(f"/proc/{pid}/task/{tid}")
        if ran is not None:
            result[name] = ran
    return result


def _process_cpu(pid: int) -> float | None:
    """CPU seconds so far of every thread process ``pid`` has now (schedstat)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    return sum(filter(None, (_ran(f"/proc/{pid}/task/{tid}") for tid in tids)))


def _ran(task: str) -> float | None:
    try:
        return int(Path(task, "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def cpu_once(
    ctx: object, source: str | None, count: int, receipts: bool, raw: bool
) -> dict[str, float]:
    """CPU µs per message of each thread of one serving process (no profiler)."""
    with tempfile.TemporaryDirectory(prefix="profile-stomp-") as out:
        port = free_port()
        args = ["-c", SERVE_UNDER_PROFILE, *serve_args(port, "none")[1:]]
        os.environ["PROFILE_DIR"] = out
        os.environ["PROFILE_CPU"] = "1"
        try:
            with zerohub(args, b"broker serving on", source, module=False) as proc:
                run_pair(ctx, port, "localhost", 200, receipts, raw)  # warm up
                before, whole = _thread_cpu(proc.pid, out), _process_cpu(proc.pid)
                run_pair(ctx, port, "localhost", count, receipts, raw)
                after, done = _thread_cpu(proc.pid, out), _process_cpu(proc.pid)
        finally:
            del os.environ["PROFILE_CPU"]
    result = {
        f"CPU us/msg {name}": (after[name] - before.get(name, 0.0)) / count * 1e6 for name in after
    }
    if whole is not None and done is not None:
        result["CPU us/msg process"] = (done - whole) / count * 1e6
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--receipts", action="store_true", help="a receipt per SEND")
    parser.add_argument("--raw", action="store_true", help="the raw-socket clients")
    parser.add_argument("--top", type=int, default=0, help="print the K most called")
    parser.add_argument("--baseline", metavar="CHECKOUT")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--cpu", action="store_true", help="thread CPU, no profiler")
    parser.add_argument("--save", metavar="DIR", help="keep each thread's pstats file here")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    sources: list[tuple[str, str | None]] = [("this", None)]
    if args.baseline:
        sources.insert(0, ("baseline", args.baseline))
    for turn in range(1, args.turns + 1):
        order = sources if turn % 2 else list(reversed(sources))
        for name, source in order:
            if args.cpu:
                counts = cpu_once(ctx, source, args.messages, args.receipts, args.raw)
            else:
                counts = profile_once(
                    ctx, source, args.messages, args.receipts, args.raw, args.top, args.save
                )
            for key, value in counts.items():
                print(f"turn {turn} {name:9} {key:40} {value:9.{2 if args.cpu else 1}f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
