"""The placer thread decision (``filemq.placer``): a cold mirror of 10,000 x 10 KiB with
small files put in place on the placer thread vs on the receiving thread
(``filemq sync --placer thread`` / ``--placer inline``), rsync beside them, in turns.

    python bench/bench_filemq_placer.py [--turns 4] [--count 10000] [--dir DIR]
    taskset -c 0 python bench/bench_filemq_placer.py   # everything on one CPU
    python bench/bench_filemq_placer.py --base /tmp/base  # and another checkout's mirror

One ``filemq serve`` (plain, indexed before the clock starts) serves every turn; each
turn times rsync, the thread and inline, in an order that rotates from turn to turn
(no method always first after the ``sync``), each into a new DEST under the same
conditions as ``bench_filemq.py`` (SRC warm, no dirty pages outstanding).  Per method
and turn: wall ms, the mirror's CPU per file split into user and system (us), the
server's CPU per file meanwhile, and wall x rsync's of the same turn; then the median
of the turns.  CPU per file is the figure the machine's load moves least.

``--base DIR`` (a checkout of another commit: ``git worktree add --detach DIR BASE``)
adds "base thread" and "base inline": the same mirror run from DIR's sources
(``PYTHONPATH``), served by this tree's server, in the same rotating turns.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq import (  # (this folder, made importable above)
    CONDITIONS,
    Server,
    check_same,
    compile_sources,
    ensure_rsync,
    fresh_dest,
    make_small,
    server_ticks,
    sync_cmd,
    timed_usage,
)

METHODS = ("rsync -a", "placer thread", "inline")
BASE_METHODS = ("base thread", "base inline")


def turn_order(turn: int, methods: tuple[str, ...] = METHODS) -> list[str]:
    """The methods of turn ``turn``, rotated by one place per turn."""
    shift = turn % len(methods)
    return [*methods[shift:], *methods[:shift]]


def base_env(base: str) -> dict[str, str]:
    """The environment running ``base``'s sources (byte-compiled first, as this tree's)."""
    import compileall

    for package in ("filemq", "zproto"):
        compileall.compile_dir(os.path.join(base, package), quiet=1)
    return {**os.environ, "PYTHONPATH": base}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--count", type=int, default=10_000, help="files (10 KiB each)")
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    parser.add_argument("--base", help="another checkout's mirror beside this one")
    args = parser.parse_args()
    rsync = ensure_rsync()
    if rsync is None:
        print("rsync is needed for this comparison", file=sys.stderr)
        return 1
    compile_sources()
    work = Path(tempfile.mkdtemp(prefix="bench-placer-", dir=args.dir))
    try:
        src = work / "b-src"
        make_small(src, args.count, 10 << 10)
        return run(work, src, rsync, args.turns, args.count, args.base)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, src: Path, rsync: str, turns: int, count: int, base: str | None) -> int:
    print(CONDITIONS)
    print(f"{count} x 10 KiB, cold; load at start {os.getloadavg()[0]:.0f}")
    methods = METHODS + (BASE_METHODS if base else ())
    env = base_env(base) if base else None
    rows: list[tuple[int, str, float, float, float, float]] = []  # turn, method, wall, u, s, srv
    server = Server(src, [])
    try:
        for turn in range(turns):
            for method in turn_order(turn, methods):
                dest = fresh_dest(work, f"t{turn}-{method.replace(' ', '-')}", src)
                if method == "rsync -a":
                    cmd = [rsync, "-a", f"{src}/", f"{dest}/"]
                else:
                    cmd = sync_cmd(server, dest, work / f"t{turn}.idx", [])
                    cmd += ["--placer", "inline" if method.endswith("inline") else "thread"]
                before = server_ticks(server.proc.pid)
                wall, user, system = timed_usage(cmd, env if method in BASE_METHODS else None)
                srv = server_ticks(server.proc.pid) - before if method != "rsync -a" else 0.0
                check_same(src, dest)
                rows.append((turn, method, wall, user, system, srv))
                print(
                    f"  turn {turn + 1} {method}: {wall:.2f} s, user {user:.2f} s, "
                    f"sys {system:.2f} s, server {srv:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.stop()
    print_rows(rows, count, methods)
    print(f"load at end {os.getloadavg()[0]:.0f}")
    return 0


def print_rows(
    rows: list[tuple[int, str, float, float, float, float]], count: int, methods: tuple[str, ...]
) -> None:
    rsync_wall = {turn: wall for turn, method, wall, *_ in rows if method == "rsync -a"}
    head = f"{'turn':>4} {'method':14} {'wall ms':>8} {'x rsync':>8} {'user us':>8}"
    print(f"\n{head} {'sys us':>8} {'mirror us':>9} {'server us':>9}")
    for turn, method, wall, user, system, srv in rows:
        print(
            f"{turn + 1:>4} {method:14} {wall * 1e3:8.0f} {wall / rsync_wall[turn]:8.2f}"
            f" {user / count * 1e6:8.0f} {system / count * 1e6:8.0f}"
            f" {(user + system) / count * 1e6:9.0f} {srv / count * 1e6:9.0f}"
        )
    print("\nmedian of the turns")
    for method in methods:
        mine = [r for r in rows if r[1] == method]
        ratio = statistics.median(wall / rsync_wall[turn] for turn, _m, wall, *_ in mine)
        print(
            f"{'':>4} {method:14} {statistics.median(r[2] for r in mine) * 1e3:8.0f}"
            f" {ratio:8.2f} {statistics.median(r[3] for r in mine) / count * 1e6:8.0f}"
            f" {statistics.median(r[4] for r in mine) / count * 1e6:8.0f}"
            f" {statistics.median(r[3] + r[4] for r in mine) / count * 1e6:9.0f}"
            f" {statistics.median(r[5] for r in mine) / count * 1e6:9.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
