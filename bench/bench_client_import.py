"""What importing the client costs a process that starts: the CPU of the import inside a
fresh Python process (``time.process_time`` around it: the interpreter's own start left
out), the CPU of the whole process (user + system, ``resource.getrusage`` of the child),
the cumulative import time ``python -X importtime`` reports for the client module and
for ``broker.client.future``, and the Python calls the import makes (cProfile,
deterministic); this checkout and, with ``--base PATH``, another checkout in
turns (same run, the same interpreter: ``sys.executable``).

Every CLI that imports the client pays this at each start (``broker``, ``filemq``).

Usage: ``python bench/bench_client_import.py [--turns N] [--module NAME] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def _child_cpu(args: list[str], tree: Path) -> tuple[float, str]:
    """CPU seconds of one child process running ``args`` with ``tree`` first on the
    path, and its stderr."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, done.stderr


def _importtime(stderr: str, name: str) -> int:
    """The cumulative microseconds ``-X importtime`` reports for module ``name``."""
    for line in stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[2].strip() == name:
            return int(parts[1])
    return 0


def _turn(tree: Path, module: str) -> tuple[float, float, int, int, int]:
    """(import CPU ms in the process, whole process CPU ms, importtime us of ``module``,
    of the future module, Python calls of the import) for one start."""
    code = f"import time; t = time.process_time(); import {module}; "
    code += "print(time.process_time() - t)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    inside = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree,
                            capture_output=True, text=True, check=True)  # fmt: skip
    cpu, _ = _child_cpu([sys.executable, "-c", f"import {module}"], tree)
    _, err = _child_cpu([sys.executable, "-X", "importtime", "-c", f"import {module}"], tree)
    # (``call_count`` from this checkout's bench/, imported after the measured import)
    code = "import cProfile; p = cProfile.Profile(); p.enable(); "
    code += f"import {module}; p.disable(); "
    code += "from call_count import python_calls; print(python_calls(p))"
    counted = {**env, "PYTHONPATH": os.pathsep.join((str(tree), str(HERE / "bench")))}
    calls = subprocess.run([sys.executable, "-c", code], env=counted, cwd=tree,
                           capture_output=True, text=True, check=True)  # fmt: skip
    return (
        float(inside.stdout) * 1e3,
        cpu * 1e3,
        _importtime(err, module),
        _importtime(err, "broker.client.future"),
        int(calls.stdout),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--module", default="broker.client.blocking")
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args()
    trees = {"this": HERE}
    if args.base is not None:
        trees["base"] = args.base.resolve()
    rows: dict[str, list[tuple[float, float, int, int, int]]] = {name: [] for name in trees}
    for _ in range(args.turns):
        for name, tree in trees.items():
            rows[name].append(_turn(tree, args.module))
    print(f"import {args.module}, {args.turns} turns, load {os.getloadavg()[0]:.1f}")
    print(f"{'tree':<6} {'import CPU ms med':>17} {'min':>6} {'process CPU ms med':>18} "
          f"{'importtime us med':>17} {'future us med':>13} {'calls':>6}")  # fmt: skip
    for name, got in rows.items():
        inside = [row[0] for row in got]
        whole, total, future, calls = (
            statistics.median(row[i] for row in got) for i in (1, 2, 3, 4)
        )
        print(f"{name:<6} {statistics.median(inside):>17.1f} {min(inside):>6.1f} "
              f"{whole:>18.1f} {total:>17.0f} {future:>13.0f} {calls:>6.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
