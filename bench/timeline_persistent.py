"""A timeline of the persistent acknowledged-push pipeline in a real broker.

Where does a persistent row lose against its memory twin?  The broker runs as
``bench_broker.py`` builds it (``serve_durable_broker``, fsync mode), with its producers
(``PERSIST_WINDOW`` acknowledged pushes in flight each); this script wraps a few methods
in the broker process only (the product code is not changed) and records, with
``monotonic_ns``, on the serving thread: each wait of the loop, each drain of the ROUTER
(frames read), each group the drain's end gives the log, each release of held outputs
(outputs sent); on the store's writer thread: each write (octets; in fsync mode durable
by the same call) and each completion.  After a warm-up, one measured row; the events of
its span are summed into one report:

* the writer's busy share (inside a write) and its idle gaps,
* the serving thread's share waiting in the loop's poll, draining, and releasing,
* per write: octets, duration, the frames drained while it ran,
* from a write's end (its completion) to the release that sent its acknowledges.

The serving thread's sends of held outputs are counted from the loop's release, a
drain's end and (where the checkout has it) ``OutputGate.send_durable`` mid-drain.
``--dump FILE``: every event of the persistent row, one a line (kind, start ns, end ns,
value), for a look at single cycles.  ``--switch``, ``--preallocate``: the broker's
interpreter switch interval and the log's zeros ahead, for experiments; ``--profile N``:
cProfile of the first N drains that read more than one frame.

Usage: ``python bench/timeline_persistent.py [--messages N] [--size OCTETS]
[--producers N] [--memory] [--rounds N] [--dump FILE]`` (another checkout's broker:
``PYTHONPATH=BASE`` and this script).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_broker import bench_acked, free_port, serve_durable_broker

#: pushes before the measured ones (connections, the queue, the first segment)
WARM_UP = 2000


def _wrap(cls: Any, name: str, events: list[Any], kind: str, value: Any = None) -> None:
    """Record ``kind`` (start, end, ``value(self, args, result)``) around ``cls.name``."""
    inner = getattr(cls, name)
    clock = time.monotonic_ns

    def wrapped(self: Any, *args: Any) -> Any:
        began = clock()
        result = inner(self, *args)
        events.append((kind, began, clock(), value(self, args, result) if value else 0))
        return result

    setattr(cls, name, wrapped)


def serve_timed(
    endpoint: str,
    data: str | None,
    ready: Any,
    stop: Any,
    stats: Any,
    marks: Any,
    out: Any,
    tweaks: dict[str, Any],
) -> None:
    """``serve_durable_broker`` with the timeline's wrappers; ``marks`` (a pipe end) gets
    "start"/"stop" around the measured row; ``out`` (a queue) the events between."""
    from broker.server.gate import OutputGate
    from broker.server.server import Server
    from broker.server.wait import LoopWait
    from broker.store.durable import DurableStore
    from broker.store.log.store import LogStore

    if tweaks.get("switch"):
        sys.setswitchinterval(tweaks["switch"])
    if tweaks.get("preallocate"):
        from broker.store.log.options import LogOptions

        init = LogStore.__init__

        def preallocating(self: Any, directory: Any, options: Any = None, *rest: Any) -> None:
            init(self, directory, options or LogOptions(preallocate=tweaks["preallocate"]), *rest)

        LogStore.__init__ = preallocating  # type: ignore[method-assign]
    events: list[Any] = []
    frames = [0]

    def drained(server: Any, _args: Any, _result: Any) -> int:
        now = server.counters["frames_in"]
        count, frames[0] = now - frames[0], now
        return count

    def held(gate: Any, _args: Any, _result: Any) -> int:
        return gate.held

    _wrap(LoopWait, "wait", events, "wait")
    _wrap(Server, "_drain", events, "drain", drained)
    _wrap(OutputGate, "release", events, "release", held)
    _wrap(OutputGate, "end", events, "end", held)
    if hasattr(OutputGate, "send_durable"):  # (a drain's own release; not in every checkout)
        _wrap(OutputGate, "send_durable", events, "durable", lambda _s, _a, sent: int(sent))
    _wrap(DurableStore, "_write_held", events, "group")
    _wrap(LogStore, "_put", events, "write", lambda _s, args, _r: sum(map(len, args[0])))
    from broker.store.log.completion import Completions

    _wrap(Completions, "complete", events, "complete", lambda _s, args, _r: args[0])
    _wrap(LogStore, "_compact_step", events, "compact")
    _wrap(LogStore, "_next_batch", events, "next", lambda _s, _a, r: len(r[0]))
    import threading

    profile = None
    if tweaks.get("profile"):
        import cProfile

        profile = cProfile.Profile()
        inner = Server._drain
        profiled = [0]

        def drain_profiled(self: Any, *args: Any) -> Any:
            if not watching or profiled[0] >= tweaks["profile"]:
                return inner(self, *args)
            before = self.counters["frames_in"]
            profile.enable()
            try:
                return inner(self, *args)
            finally:
                profile.disable()
                profiled[0] += self.counters["frames_in"] - before > 1

        Server._drain = drain_profiled  # type: ignore[method-assign]
    watching = False

    def watch() -> None:
        nonlocal watching
        marks.recv()  # start
        events.clear()
        watching = True
        marks.recv()  # stop
        if profile is not None:
            import io
            import pstats

            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(20)
            print(text.getvalue(), flush=True)
        out.put(list(events))

    threading.Thread(target=watch, daemon=True).start()
    serve_durable_broker(endpoint, data, ready, stop, stats)


def _gaps(spans: list[tuple[int, int]], start: int, end: int) -> list[int]:
    gaps = []
    at = start
    for began, ended in spans:
        if began > at:
            gaps.append(began - at)
        at = max(at, ended)
    if end > at:
        gaps.append(end - at)
    return gaps


def report(events: list[Any], messages: int) -> list[str]:
    """The summary lines of one measured row's events."""
    # the span in which the row's frames were read (1% to 99% of them: not the
    # connections' and the queue's set-up before, nor the last acknowledges' tail)
    drains = sorted((e for e in events if e[0] == "drain" and e[3]), key=lambda e: e[1])
    if not drains:
        return ["no events"]
    total = sum(e[3] for e in drains)
    seen = 0
    start = end = drains[0][1]
    for e in drains:
        if seen <= total // 100:
            start = e[1]
        seen += e[3]
        if seen <= total * 99 // 100:
            end = e[2]
    events = [e for e in events if e[2] > start and e[1] < end]
    span = end - start
    by: dict[str, list[Any]] = {}
    for event in events:
        by.setdefault(event[0], []).append(event)
    lines = [f"span {span / 1e6:.1f} ms (1-99% of the frames read), {messages} msgs"]

    def busy(kind: str) -> float:
        return sum(e[2] - e[1] for e in by.get(kind, [])) / span

    writes = by.get("write", [])
    lines.append(
        f"serving thread: wait {busy('wait'):.0%}, drain {busy('drain'):.0%} "
        f"(of it writes' groups {busy('group'):.0%}), release {busy('release'):.0%}, "
        f"end {busy('end'):.0%}; writer: in writes {busy('write'):.0%}"
    )
    if writes:
        sizes = [e[3] for e in writes]
        times = [(e[2] - e[1]) / 1e6 for e in writes]
        gaps = [g / 1e6 for g in _gaps([(e[1], e[2]) for e in writes], start, end)]
        lines.append(
            f"writes {len(writes)}: octets median {statistics.median(sizes):,.0f} "
            f"(max {max(sizes):,}); ms median {statistics.median(times):.2f} "
            f"p90 {sorted(times)[len(times) * 9 // 10]:.2f}; MB/s inside writes "
            f"{sum(sizes) / max(1, sum(e[2] - e[1] for e in writes)) * 1e3:.0f}; writer idle "
            f"gaps {len(gaps)}, median {statistics.median(gaps) if gaps else 0:.2f} ms"
        )
        drains = by.get("drain", [])
        during = []
        for w in writes:
            during.append(sum(d[3] for d in drains if w[1] <= d[1] < w[2]))
        lines.append(
            f"frames drained during a write: median {statistics.median(during):.0f}, "
            f"max {max(during)}"
        )
        # what sends held outputs: the loop's release, a drain's end, a drain's check
        releases = (
            by.get("release", []) + by.get("end", []) + [e for e in by.get("durable", []) if e[3]]
        )
        delays = []
        for w in writes:
            after = [r[1] for r in releases if r[1] >= w[2]]
            if after:
                delays.append((min(after) - w[2]) / 1e6)
        if delays:
            p90 = sorted(delays)[len(delays) * 9 // 10]
            lines.append(
                "write end -> next release (loop, drain end or mid-drain): median "
                f"{statistics.median(delays):.2f} ms, p90 {p90:.2f}"
            )
    drains = by.get("drain", [])
    if drains:
        counts = [d[3] for d in drains]
        times = [(d[2] - d[1]) / 1e6 for d in drains]
        lines.append(
            f"drains {len(drains)}: frames median {statistics.median(counts):.0f} "
            f"(max {max(counts)}), ms median {statistics.median(times):.2f} "
            f"(max {max(times):.2f})"
        )
    waits = by.get("wait", [])
    if waits:
        times = [(w[2] - w[1]) / 1e6 for w in waits]
        lines.append(
            f"waits {len(waits)}: ms median {statistics.median(times):.3f}, "
            f"p90 {sorted(times)[len(times) * 9 // 10]:.2f}, sum {sum(times):.1f}"
        )
    return lines


def measure(
    ctx: Any,
    data: str | None,
    size: int,
    messages: int,
    producers: int,
    dump: str = "",
    tweaks: dict[str, Any] | None = None,
) -> list[str]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    mine, theirs = ctx.Pipe()
    mark, marks = ctx.Pipe()
    out = ctx.Queue()
    broker = ctx.Process(
        target=serve_timed, args=(endpoint, data, ready, stop, theirs, marks, out, tweaks or {})
    )
    broker.start()
    try:
        if not ready.wait(60):
            raise SystemExit("broker did not start")
        bench_acked(ctx, endpoint, WARM_UP, max(1, producers // 2), size, data is not None,
                    broker.pid, mine)  # fmt: skip
        mark.send("start")
        row = bench_acked(ctx, endpoint, messages, producers, size, data is not None,
                          broker.pid, mine)  # fmt: skip
        mark.send("stop")
        events = out.get(timeout=60)
    finally:
        stop.set()
        broker.join(60)
    kind = "persistent" if data is not None else "memory"
    head = f"{kind} {size} B {producers}p: {row.rate:,.0f} msgs/s, {row.note}"
    if dump:
        Path(dump).write_text("\n".join(" ".join(map(str, e)) for e in sorted(events, key=_began)))
    return [head, *("  " + line for line in report(events, row_total(messages, producers)))]


def _began(event: Any) -> int:
    return int(event[1])


def row_total(messages: int, producers: int) -> int:
    return max(1, messages // producers) * producers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--memory", action="store_true", help="also the memory twin")
    parser.add_argument("--dump", default="", help="write the persistent row's events here")
    parser.add_argument("--switch", type=float, default=0.0, help="the broker's switch interval")
    parser.add_argument("--preallocate", type=int, default=0, help="the log's zeros ahead")
    parser.add_argument("--profile", type=int, default=0, help="cProfile the first N drains")
    parser.add_argument("--rounds", type=int, default=1, help="rows of each kind, in turns")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="bench-timeline-") as tmp:
        tweaks = {"switch": args.switch, "preallocate": args.preallocate, "profile": args.profile}
        for turn in range(args.rounds):
            wheres = [None] if args.memory else []
            for data in [*wheres, str(Path(tmp) / f"data{turn}")]:
                dump = args.dump if data is not None else ""
                lines = measure(ctx, data, args.size, args.messages, args.producers, dump, tweaks)
                print("\n".join(lines), flush=True)
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
