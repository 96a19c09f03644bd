"""Change latency of the FILEMQ publisher: file complete -> change event emitted.

Writes N files of 4 KiB, one every ``--interval`` seconds, and times each from the moment
the file is complete (closed; or, for a writer that keeps it open, its last write) to the
publisher's FileChanged for it. Rows:

* zerohub, inotify, close-after-write (the common case);
* zerohub, inotify, writer keeps the file open (published after ``settle`` quiet);
* zerohub, polling observer (portable fallback), close-after-write;
* baseline measured in the same run: the reference C FILEMQ's behaviour, simulated -- a
  directory poll every second publishing files whose mtime is older than 5 s.

    python bench/bench_publisher_latency.py            # 200 changes (about 10 s)
    python bench/bench_publisher_latency.py --quick    # 20 changes, reference scaled 1/10
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from watchdog.observers.polling import PollingObserver

from filemq.changes import ChangeEvent, FileChanged
from filemq.publisher import Publisher
from filemq.walk import scan_tree

SIZE = 4096


class Arrivals:
    """Records when each relpath was first announced."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.cond = threading.Condition()

    def __call__(self, ev: ChangeEvent) -> None:
        now = time.perf_counter()
        if isinstance(ev, FileChanged):
            with self.cond:
                self.at.setdefault(ev.relpath, now)
                self.cond.notify_all()

    def wait_all(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.at for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [n for n in names if n not in self.at]
                    raise RuntimeError(f"{len(missing)} changes never arrived")
                self.cond.wait(left)


class ReferencePoller:
    """The reference server's detection: poll every ``period``; a file is published once
    its mtime is older than ``stable_age`` (czmq's zsys file-stable age, 5 s)."""

    def __init__(self, root: Path, sink: Arrivals, period: float, stable_age: float) -> None:
        self.root, self.sink = root, sink
        self.period, self.stable_age = period, stable_age
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="reference-poller")
        self.seen: dict[str, int] = {}

    def _run(self) -> None:
        while not self.stopped.wait(self.period):
            now_ns = time.time_ns()
            for rel, st in scan_tree(self.root):
                if self.seen.get(rel) == st.st_mtime_ns:
                    continue
                if now_ns - st.st_mtime_ns > self.stable_age * 1e9:
                    self.seen[rel] = st.st_mtime_ns
                    self.sink(FileChanged("m", rel))

    def __enter__(self) -> ReferencePoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()


def run(
    make_watcher: Callable[[Path, Arrivals], AbstractContextManager[object]],
    n: int,
    interval: float,
    keep_open: bool,
    timeout: float,
) -> list[float]:
    payload = os.urandom(SIZE)
    with tempfile.TemporaryDirectory(prefix="bench-pub-") as tmp:
        root = Path(tmp)
        arrivals = Arrivals()
        done: dict[str, float] = {}
        open_files = []
        for d in range(10):  # files in brand-new folders may miss their close (settle path)
            (root / f"d{d}").mkdir()
        with make_watcher(root, arrivals):
            for i in range(n):
                name = f"d{i % 10}/f{i:05d}.bin"
                path = root / name
                f = open(path, "wb")  # noqa: SIM115 - closed below, or kept open on purpose
                f.write(payload)
                f.flush()
                if keep_open:
                    open_files.append(f)
                else:
                    f.close()
                done[name] = time.perf_counter()
                time.sleep(interval)
            arrivals.wait_all(list(done), timeout)
            for f in open_files:
                f.close()
        return [arrivals.at[name] - t for name, t in done.items()]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, round(p / 100 * len(ordered)))  # nearest rank
    return ordered[rank - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="changes per row (default 200)")
    parser.add_argument("--interval", type=float, default=0.005, help="seconds between changes")
    parser.add_argument("--settle", type=float, default=0.05, help="publisher settle time")
    parser.add_argument("--quick", action="store_true", help="20 changes, reference scaled")
    args = parser.parse_args()
    n = 20 if args.quick else args.n
    scale = 0.1 if args.quick else 1.0
    ref_period, ref_age = 1.0 * scale, 5.0 * scale

    def zerohub(
        factory: Callable[[], object] | None = None,
    ) -> Callable[[Path, Arrivals], AbstractContextManager[object]]:
        def make(root: Path, sink: Arrivals) -> AbstractContextManager[object]:
            return Publisher(
                {"m": root},
                sink,
                settle=args.settle,
                observer_factory=factory,  # type: ignore[arg-type]
            )

        return make

    def reference(root: Path, sink: Arrivals) -> AbstractContextManager[object]:
        return ReferencePoller(root, sink, ref_period, ref_age)

    rows: list[tuple[str, Callable[[Path, Arrivals], AbstractContextManager[object]], bool]] = [
        ("zerohub inotify, close-after-write", zerohub(), False),
        (f"zerohub inotify, open writer (settle {args.settle * 1e3:.0f} ms)", zerohub(), True),
        (
            "zerohub polling 100 ms, close-after-write",
            zerohub(lambda: PollingObserver(timeout=0.1)),
            False,
        ),
        (
            f"reference sim: {ref_period:g} s poll + {ref_age:g} s stable age",
            reference,
            False,
        ),
    ]
    print(
        f"publisher latency, {n} changes of {SIZE} B files, one every {args.interval * 1e3:g} ms"
    )
    print(f"{'scenario':<48} {'n':>4} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    results = {}
    for label, make, keep_open in rows:
        lat = run(make, n, args.interval, keep_open, timeout=30 + ref_age * 2)
        results[label] = lat
        print(
            f"{label:<48} {len(lat):>4} {percentile(lat, 50) * 1e3:>9.2f} "
            f"{percentile(lat, 99) * 1e3:>9.2f} {max(lat) * 1e3:>9.2f}",
            flush=True,
        )
    base = percentile(results[rows[-1][0]], 50)
    fast = percentile(results[rows[0][0]], 50)
    print(f"p50 speed-up, inotify close-after-write vs reference: {base / fast:,.0f}x")
    if args.quick:
        print("(--quick: reference timings scaled by 1/10; the real one waits 5-6 s)")


if __name__ == "__main__":
    main()
