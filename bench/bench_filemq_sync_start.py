"""The start-up of a no-change ``filemq sync --once``, exec to exit, split in steps.

    python bench/bench_filemq_sync_start.py --base /work/wt/base19        # 10,000 files
    python bench/bench_filemq_sync_start.py --base DIR --files 100000 --turns 3 --list

At 10,000 files most of a no-change resync is the process starting: this shows where.
One ``filemq serve`` (this tree's) publishes N files of 1 KiB (``bench_filemq_resync``'s
tree); each checkout (this one, and ``--base DIR``'s sources through ``PYTHONPATH``) has
its own DEST, complete and indexed first.  Then, in turns (base, this), a child runs
``filemq sync ENDPOINT DEST --once`` as the installed command does (``filemq.cli.main``)
and notes, as wall time since this script launched it and as the process's CPU time
(``time.process_time``: from exec, the interpreter's own start included):

  python start    its first line (the interpreter and ``site`` started)
  imports         ``filemq.cli`` and ``filemq.client`` imported (pyzmq among them):
                  the step's CPU, and how many modules ``sys.modules`` then holds
  first ICANHAZ   the ICANHAZ handed to the socket (parser, logging, the client made,
                  DEST locked, connect, OHAI / OHAI-OK, the ICANHAZ made from the saved
                  index file, DEST's default one: its cache and ATTRS): the time since exec
  main returned   the saved index loaded, DEST re-stat (while the server answers), the
                  answer's end marker, the index kept, the context ended
  total           the process's exit: wall from launch to ``wait4``, CPU from its rusage

beside the modules it holds at the end.  Then the import alone, in many short
processes in turns (``--import-runs``, default 30): the whole process CPU of ``python -c
"import filemq.cli, filemq.client"`` minus that of ``python -c pass`` (medians), the
number to compare on a loaded machine.  ``--list`` prints the modules one tree's sync
loads that the other's does not.  Medians; the load beside them.
"""

from __future__ import annotations

import argparse
import ast
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

# The child: the installed ``filemq`` command's steps, with marks (wall since launch,
# process CPU since exec, modules held) printed as JSON on stderr at its end.
_CHILD = """
import os, sys, time
launched = float(os.environ["BENCH_LAUNCHED"])
def mark():
    return (time.perf_counter() - launched, time.process_time(), len(sys.modules))
marks = {"python start": mark()}
import filemq.cli, filemq.client
marks["imports"] = mark()
tell = filemq.client.SyncClient._tell_saved
def told(*args, **kwargs):
    result = tell(*args, **kwargs)
    marks.setdefault("first ICANHAZ", mark())
    return result
filemq.client.SyncClient._tell_saved = told
sys.argv = ["filemq", "-q", "sync", *sys.argv[1:]]
code = filemq.cli.main()
marks["main returned"] = mark()
print("FROM", filemq.cli.__file__, file=sys.stderr)
print("MODULES", repr(sorted(sys.modules)), file=sys.stderr)
print("MARKS", repr(marks), file=sys.stderr)
sys.exit(code)
"""

_IMPORT = "import filemq.cli, filemq.client"
#: The children's working folder: not a checkout (``python -c`` puts it first on the path)
_NEUTRAL = tempfile.gettempdir()


def _launch(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stderr) of one child that must exit 0 (``BENCH_LAUNCHED``: the
    perf_counter when it was started, a clock every process of this machine shares)."""
    env = {**env, "BENCH_LAUNCHED": repr(time.perf_counter())}
    start = float(env["BENCH_LAUNCHED"])
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=_NEUTRAL
    )
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:4]} failed: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, err


def _tree_env(tree: Path) -> dict[str, str]:
    return _env(str(tree))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--import-runs", type=int, default=30)
    parser.add_argument("--base", type=Path, help="another checkout's sources, in turns")
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    parser.add_argument("--list", action="store_true", help="modules only one tree loads")
    args = parser.parse_args()
    compile_sources()
    trees = {**({"base": args.base.resolve()} if args.base else {}), "this": HERE}
    if args.base:
        import compileall

        compileall.compile_dir(str(args.base), quiet=1)
    work = Path(tempfile.mkdtemp(prefix="bench-sync-start-", dir=args.dir))
    os.environ["XDG_CACHE_HOME"] = str(work / "cache")  # (the mirrors' index files: in work)
    marks: dict[str, list[dict[str, tuple[float, float, int]]]] = {k: [] for k in trees}
    totals: dict[str, list[tuple[float, float]]] = {k: [] for k in trees}
    modules: dict[str, set[str]] = {}
    loads: list[float] = []
    server = None
    try:
        src = work / "src"
        print(f"preparing {args.files:,} files in {work} ...", file=sys.stderr)
        make_tree(src, args.files)
        server = Server(src, work / "state")
        syncs = {}
        for kind, tree in trees.items():
            dest = work / f"d-{kind}"
            sync_args = [server.endpoint, str(dest), "--once"]  # (the default index path)
            done = subprocess.run(
                [*FILEMQ, "sync", *sync_args], env=_tree_env(tree), capture_output=True
            )
            if done.returncode:
                raise SystemExit(f"{kind}: first sync failed: {done.stderr[-500:]!r}")
            syncs[kind] = [PY, "-c", _CHILD, *sync_args]
        for _ in range(args.turns):
            loads.append(os.getloadavg()[0])
            for kind, tree in trees.items():
                wall, cpu, err = _launch(syncs[kind], _tree_env(tree))
                source = err.rsplit("FROM ", 1)[1].split("\n", 1)[0]
                if not source.startswith(str(tree)):
                    raise SystemExit(f"{kind} ran {source}, not {tree}'s code")
                totals[kind].append((wall, cpu))
                marks[kind].append(ast.literal_eval(err.rsplit("MARKS ", 1)[1]))
                names = err.rsplit("MODULES ", 1)[1].split("\n", 1)[0]
                modules[kind] = set(ast.literal_eval(names))
        imports = _import_runs(trees, args.import_runs, loads)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    _report(args, trees, marks, totals, imports, loads)
    if args.list and len(modules) == 2:
        for kind, other in (("base", "this"), ("this", "base")):
            only = sorted(modules[kind] - modules[other])
            print(f"\nmodules only {kind}'s sync loads ({len(only)}): {' '.join(only)}")
    return 0


def _import_runs(
    trees: dict[str, Path], runs: int, loads: list[float]
) -> dict[str, tuple[float, int]]:
    """Per tree: (median whole-process CPU ms of the import minus that of ``python -c
    pass``, modules the import leaves in ``sys.modules``)."""
    cpu: dict[str, list[float]] = {k: [] for k in ["pass", *trees]}
    for _ in range(runs):
        cpu["pass"].append(_launch([PY, "-c", "pass"], dict(os.environ))[1])
        for kind, tree in trees.items():
            cpu[kind].append(_launch([PY, "-c", _IMPORT], _tree_env(tree))[1])
    loads.append(os.getloadavg()[0])
    floor = statistics.median(cpu["pass"])
    out = {}
    for kind, tree in trees.items():
        code = f"{_IMPORT}; import sys; print(len(sys.modules))"
        count = subprocess.run(
            [PY, "-c", code], env=_tree_env(tree), cwd=_NEUTRAL, capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        out[kind] = ((statistics.median(cpu[kind]) - floor) * 1e3, int(count.stdout))
    out["python -c pass"] = (floor * 1e3, 0)
    return out


def _report(
    args: argparse.Namespace,
    trees: dict[str, Path],
    marks: dict[str, list[dict[str, tuple[float, float, int]]]],
    totals: dict[str, list[tuple[float, float]]],
    imports: dict[str, tuple[float, int]],
    loads: list[float],
) -> None:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values) * 1e3:7.1f}"

    kinds = list(trees)
    print(
        f"\nno-change `filemq sync --once` of {args.files:,} files, {args.turns} turns "
        f"(load {min(loads):.1f}-{max(loads):.1f}); ms since exec, medians"
    )
    print(f"{'step':<34}" + "".join(f"{k + ' wall':>12}{k + ' CPU':>11}" for k in kinds))
    steps = ["python start", "imports", "first ICANHAZ", "main returned"]
    for step in steps:
        cells = ""
        for k in kinds:
            walls = [m[step][0] for m in marks[k]]
            cpus = [m[step][1] for m in marks[k]]
            cells += f"{med(walls):>12}{med(cpus):>11}"
        print(f"{'at ' + step:<34}{cells}")
    cells = "".join(
        f"{med([t[0] for t in totals[k]]):>12}{med([t[1] for t in totals[k]]):>11}" for k in kinds
    )
    print(f"{'at exit (total)':<34}{cells}")
    cells = ""
    for k in kinds:  # the imports step alone, CPU
        step = [m["imports"][1] - m["python start"][1] for m in marks[k]]
        cells += f"{'':>12}{med(step):>11}"
    print(f"{'imports step alone':<34}{cells}")
    counts = "".join(
        f"{statistics.median(m['imports'][2] for m in marks[k]):>12.0f}"
        f"{statistics.median(m['main returned'][2] for m in marks[k]):>11.0f}"
        for k in kinds
    )
    print(f"{'modules: after imports / at end':<34}{counts}")
    print(
        f"\n`python -c '{_IMPORT}'`, {args.import_runs} runs in turns: whole process CPU "
        f"minus `python -c pass` ({imports['python -c pass'][0]:.1f} ms), median"
    )
    for k in kinds:
        ms, count = imports[k]
        print(f"  {k:<6} {ms:6.1f} ms CPU, {count} modules")


if __name__ == "__main__":
    sys.exit(main())
