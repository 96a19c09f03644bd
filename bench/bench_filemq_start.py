"""FILEMQ server start with a valid saved index: the check of that index against the disk.

    python bench/bench_filemq_start.py --base /tmp/base      # 100,000 files, 3 turns
    python bench/bench_filemq_start.py --files 10000 --turns 5

What ``filemq serve`` does before its first answer when its saved index is valid
(``load_index`` then ``refresh``, ``tree=True``), on a tree of N files of 1 KiB in
N/100 folders (``bench_filemq_resync.make_tree``), page cache warm, indexed and saved
once.  Each turn runs it in a new process per tree (this one, then ``--base DIR``'s
sources first on ``sys.path``, then the other way round): user and system CPU and wall
of load + refresh; then once under cProfile for the Python calls per file, a count the
machine's load does not move.  Beside them, the floor: ``scandir`` and ``lstat`` of every
name with nothing else (C-level loops), in the same process; and that floor split over two
threads (half the folders each: both calls release the GIL), its wall and CPU beside the
one-thread floor's wall -- what a re-stat on two cores could gain in wall, and cost in
CPU.  The whole start (process, imports, bind, the "checked" line) is
``bench_filemq_resync.py``'s "server start" rows.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq_resync import make_tree  # (this folder, made importable above)

HERE = str(Path(__file__).resolve().parent.parent)

# Run in a child: argv = sources, root, saved index, this folder; prints one JSON line.
_CHILD = """
import cProfile, json, os, resource, sys, threading, time
from operator import methodcaller
sys.path.insert(0, sys.argv[1])
sys.path.append(sys.argv[4])  # (this bench's folder: ``call_count``)
from call_count import python_calls
from filemq.state import load_index
root, saved = sys.argv[2], sys.argv[3]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime

def check():
    index = load_index(saved, root, tree=True)
    delta = index.refresh()
    assert index.loaded and not delta.changed and not delta.removed, "not a valid index"

lstat = methodcaller("stat", follow_symlinks=False)

def listed(top, names):
    for name in names:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
        with os.scandir(fd) as entries:
            list(map(lstat, entries))
        os.close(fd)

def floor(ways=1):
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    folders = [entry.name for entry in os.scandir(top)]
    workers = [threading.Thread(target=listed, args=(top, folders[i::ways])) for i in range(ways)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    os.close(top)

out = {}
for name, work in (("check", check), ("floor", floor), ("floor2", lambda: floor(2))):
    (u0, s0), t0 = cpu(), time.perf_counter()
    work()
    (u1, s1), t1 = cpu(), time.perf_counter()
    out[name] = (t1 - t0, u1 - u0, s1 - s0)
profile = cProfile.Profile()
profile.runcall(check)
out["calls"] = python_calls(profile)
print(json.dumps(out))
"""


def measure(sources: str, root: Path, saved: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, sources, str(root), str(saved), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def _end_by_signal(signum: int, _frame: object) -> None:
    """SIGTERM/SIGHUP (``timeout``, a closed terminal) end the run through ``finally``:
    their default action killed the process with its ~98 MB tree (100,000 files) left."""
    raise SystemExit(128 + signum)


def _remove(work: Path) -> None:
    """Remove the work tree; say what could not be removed (never silently left)."""
    failed: list[str] = []
    shutil.rmtree(work, onerror=lambda _f, path, info: failed.append(f"{path}: {info[1]}"))
    if failed:
        print(f"left {work}: {failed[0]} ({len(failed)} errors)", file=sys.stderr)


def main() -> int:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _end_by_signal)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--base", help="another checkout's sources, measured in turns")
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    args = parser.parse_args()
    trees = [("this", HERE)] + ([("base", os.path.abspath(args.base))] if args.base else [])
    work = Path(tempfile.mkdtemp(prefix="bench-fmq-start-", dir=args.dir))
    try:
        root, saved = work / "src", work / "index"
        print(f"preparing {args.files:,} files in {work} ...", file=sys.stderr)
        make_tree(root, args.files)
        sys.path.insert(0, HERE)
        from filemq.index import FileIndex

        made = FileIndex(root, tree=True)
        made.refresh()
        made.save(saved)
        rows: list[tuple[int, str, dict[str, object]]] = []
        for turn in range(args.turns):
            order = trees if turn % 2 == 0 else trees[::-1]
            for label, sources in order:
                rows.append((turn, label, measure(sources, root, saved)))
                print(f"  turn {turn + 1} {label}: {rows[-1][2]}", file=sys.stderr, flush=True)
        print_rows(rows, trees, args.files)
    finally:
        _remove(work)
    return 0


def print_rows(
    rows: list[tuple[int, str, dict[str, object]]], trees: list[tuple[str, str]], files: int
) -> None:
    print(f"\n{files:,} files, saved index valid; load {os.getloadavg()[0]:.0f} at the end")
    head = f"{'turn':>4} {'tree':5} {'wall s':>7} {'user s':>7} {'sys s':>7}"
    print(
        f"{head} {'floor user':>10} {'floor sys':>9} {'floor wall':>10}"
        f" {'2-thr wall':>10} {'2-thr cpu':>9} {'calls/file':>10}"
    )
    for turn, label, out in rows:
        wall, user, system = out["check"]  # type: ignore[misc]
        f_wall, f_user, f_sys = out["floor"]  # type: ignore[misc]
        t_wall, t_user, t_sys = out["floor2"]  # type: ignore[misc]
        calls = int(out["calls"]) / files  # type: ignore[call-overload]
        print(
            f"{turn + 1:>4} {label:5} {wall:7.3f} {user:7.3f} {system:7.3f}"
            f" {f_user:10.3f} {f_sys:9.3f} {f_wall:10.3f} {t_wall:10.3f} {t_user + t_sys:9.3f}"
            f" {calls:10.2f}"
        )
    print("median")
    for label, _sources in trees:
        mine = [out for _t, name, out in rows if name == label]
        cols = [statistics.median(o["check"][i] for o in mine) for i in range(3)]  # type: ignore[index]
        print(f"{'':>4} {label:5} {cols[0]:7.3f} {cols[1]:7.3f} {cols[2]:7.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
