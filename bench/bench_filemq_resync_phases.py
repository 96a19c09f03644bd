"""Where a no-change ``filemq sync --once`` spends its time, step by step, beside rsync.

    python bench/bench_filemq_resync_phases.py                      # 10,000 files, 5 turns
    python bench/bench_filemq_resync_phases.py --files 100000 --turns 3 --base /work/wt/base

One ``filemq serve`` (this tree's) publishes N files of 1 KiB (``bench_filemq_resync``'s
tree); each checkout (this one, and ``--base DIR``'s sources through ``PYTHONPATH``) has
its own DEST, made complete and indexed first.  Then, in turns (base, this, rsync), a
child process runs ``filemq sync ENDPOINT DEST --once`` through ``filemq.cli.main`` with
timestamps (wall and CPU of the process so far, from the child's first line: the
interpreter's own start is not in them) taken where these steps end:

  imports        ``filemq.cli`` and ``filemq.client`` imported (pyzmq among them)
  set-up         parser, logging, the client made (the wire codec imported), DEST locked
  icanhaz        connect, OHAI / OHAI-OK, the ICANHAZ made from the saved index and sent
  index load     the saved index loaded
  DEST re-stat   ``FileIndex.refresh`` (scandir + ``lstat`` of every name)
  end            the answer's end marker taken, lock released, ``context.term()``

and beside them the floors, each its own process: ``python -c pass``, ``python -c
"import zmq"``, and ``rsync -a SRC/ DEST/`` (wall and CPU of the whole process).
Medians of the turns; the load beside them.  The filemq and zproto sources are
byte-compiled first, as an installed package is.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_filemq_resync import FILEMQ, Server, _env, compile_sources, make_tree

PY = sys.executable
HERE = Path(__file__).resolve().parent.parent

# The child: marks (name, wall s, CPU s) at the end of each step, printed as JSON on stderr.
_CHILD = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
marks = []
def mark(name):
    marks.append((name, time.perf_counter() - t0, time.process_time() - c0))
import filemq.cli, filemq.client
from filemq.index import FileIndex
mark("imports")
def after(owner, attr, name, before=None):
    inner = getattr(owner, attr)
    def step(*args, **kwargs):
        if before:
            mark(before)
        result = inner(*args, **kwargs)
        mark(name)
        return result
    setattr(owner, attr, step)
after(filemq.client.SyncClient, "_tell_saved", "icanhaz", before="set-up")
after(filemq.client.SyncClient, "_load_index", "index load")
after(FileIndex, "refresh", "DEST re-stat")
sys.argv = ["filemq", "-q", "sync", *sys.argv[1:]]
code = filemq.cli.main()
mark("end")
print("FROM", filemq.cli.__file__, file=sys.stderr)
print("MARKS", json.dumps(marks), file=sys.stderr)
sys.exit(code)
"""

STEPS = ["imports", "set-up", "icanhaz", "index load", "DEST re-stat", "end"]


def run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None
) -> tuple[float, float, str]:
    """(wall s, CPU s, stderr) of one child that must exit 0."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {err[-2000:]}")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, err


def steps_of(err: str) -> dict[str, tuple[float, float]]:
    """Each step's own (wall, CPU) seconds from the child's marks."""
    marks = json.loads(err.rsplit("MARKS", 1)[1])
    out, wall0, cpu0 = {}, 0.0, 0.0
    for name, wall, cpu in marks:
        if name in out:  # (a second session's steps: not in a no-change run)
            continue
        out[name] = (wall - wall0, cpu - cpu0)
        wall0, cpu0 = wall, cpu
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--base", help="also run another checkout's sources")
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    args = parser.parse_args()
    rsync = shutil.which("rsync")
    if not rsync:
        print("rsync missing", file=sys.stderr)
        return 1
    compile_sources()
    if args.base:
        import compileall

        compileall.compile_dir(args.base, quiet=1)
    work = Path(tempfile.mkdtemp(prefix="bench-phases-", dir=args.dir))
    kinds = {"this": None, **({"base": args.base} if args.base else {})}
    steps: dict[str, dict[str, list[tuple[float, float]]]] = {k: {} for k in kinds}
    whole: dict[str, list[tuple[float, float]]] = {}
    loads: list[float] = []
    server = None
    try:
        src = work / "src"
        print(f"preparing {args.files:,} files in {work} ...", file=sys.stderr)
        make_tree(src, args.files)
        server = Server(src, work / "state")
        syncs = {}
        for kind, code in kinds.items():
            dest = work / f"d-{kind}"
            base_cmd = [server.endpoint, str(dest), "--once", "--index", f"{dest}.idx"]
            run([*FILEMQ, "sync", *base_cmd], _env(code))  # complete and indexed
            syncs[kind] = ([PY, "-c", _CHILD, *base_cmd], _env(code))
        run([rsync, "-a", f"{src}/", f"{work / 'd-rsync'}/"])
        floors = {
            "python -c pass": [PY, "-c", "pass"],
            "python -c 'import zmq'": [PY, "-c", "import zmq"],
            "rsync -a (whole)": [rsync, "-a", f"{src}/", f"{work / 'd-rsync'}/"],
        }
        for _ in range(args.turns):
            for kind in reversed(list(kinds)):  # (base first when there is one)
                cmd, env = syncs[kind]
                wall, cpu, err = run(cmd, env, cwd=work)  # (not a checkout: sys.path[0])
                source = err.rsplit("FROM ", 1)[1].split("\n", 1)[0]
                if not source.startswith(str(kinds[kind] or HERE)):
                    raise SystemExit(f"{kind} measured {source}")
                whole.setdefault(f"{kind}: sync (whole)", []).append((wall, cpu))
                for name, values in steps_of(err).items():
                    steps[kind].setdefault(name, []).append(values)
            for name, cmd in floors.items():
                wall, cpu, _err = run(cmd)
                whole.setdefault(name, []).append((wall, cpu))
            loads.append(os.getloadavg()[0])
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)

    def med(values: list[tuple[float, float]], i: int) -> str:
        return f"{statistics.median(v[i] for v in values) * 1000:8.1f}"

    print(f"\n{args.files:,} files, {args.turns} turns, load {min(loads):.1f}-{max(loads):.1f}")
    print(
        f"{'step (ms, medians)':<32}"
        + "".join(f"{k + ' wall':>12}{k + ' CPU':>12}" for k in kinds)
    )
    for name in STEPS:
        cells = "".join(
            f"{med(steps[k][name], 0):>12}{med(steps[k][name], 1):>12}" if name in steps[k]
            else f"{'-':>12}{'-':>12}"
            for k in kinds
        )  # fmt: skip
        print(f"{name:<32}{cells}")
    print(f"\n{'process, start to exit (ms)':<32}{'wall':>12}{'CPU':>12}")
    for name, values in whole.items():
        print(f"{name:<32}{med(values, 0):>12}{med(values, 1):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
