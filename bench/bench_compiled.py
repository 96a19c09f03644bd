"""The compiled build (mypyc, ``ZEROHUB_COMPILE=1``) against pure Python, same code,
same run, in turns: the broker's CPU per message.

Two trees of the same code: ``--compiled`` (default: this checkout, which must hold the
compiled build: ``ZEROHUB_COMPILE=1 pip install -e .``) and ``--pure`` (default: this
checkout's HEAD exported to a temp dir by ``git archive``, nothing compiled).  Each turn
runs, for each tree (the pure one first in odd turns, last in even ones), the tree's
own scripts with ``PYTHONPATH`` set to it:

* ``profile_broker.py --cpu 1``: the broker process's CPU per message (no profiler):
  ``push``/``push_many`` with ``unacked_batch`` 0 and the default, ``acked push``, and
  the round trip (broker CPU per trip);
* ``bench_stomp.py --raw``: the STOMP listener's CPU per message (``broker serve
  --stomp``; stomp.py clients and the raw-socket ones).

CPU per message, not rates: the machine is shared.  The last columns are compiled /
pure per turn (below 1: the compiled build spends less).

Usage: ``python bench/bench_compiled.py [--turns N] [--messages N] [--stomp-messages N]
[--pure TREE] [--compiled TREE]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: Where profile_broker.py prints its CPU rows, and where bench_stomp.py's table starts.
_CPU_TITLE = "broker CPU us/msg (no profiler)"
_STOMP_PREFIX = "zerohub serve --stomp"


def is_compiled(tree: Path) -> bool:
    return any((tree / "broker" / "engine").glob("engine.*.so"))


@contextmanager
def exported_head(checkout: Path) -> Iterator[Path]:
    """``checkout``'s HEAD as plain files in a temp dir (no build products)."""
    with tempfile.TemporaryDirectory(prefix="zerohub-pure-") as temp:
        archive = Path(temp) / "head.tar"
        subprocess.run(
            ["git", "-C", str(checkout), "archive", "-o", str(archive), "HEAD"], check=True
        )
        with tarfile.open(archive) as tar:
            tar.extractall(Path(temp) / "tree", filter="data")
        yield Path(temp) / "tree"


def run(tree: Path, script: str, *args: str) -> str:
    """The tree's own bench script, the tree first on the path; its output."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} failed in {tree}: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout


def broker_cpu(tree: Path, messages: int) -> dict[str, float]:
    """profile_broker.py's CPU rows: {row: us per message (round trip: per trip)}."""
    out = run(tree, "profile_broker.py", "--cpu", "1", "--messages", str(messages))
    rows: dict[str, float] = {}
    lines = out.split(_CPU_TITLE, 1)[1].splitlines()[1:]
    for line in lines:
        name, _, value = line.rpartition("  ")
        match = re.match(r"\s*([\d.]+)", value)
        if name.strip() and match:
            rows[name.strip()] = float(match.group(1))
        elif line.startswith("round trip"):
            trip = re.search(r"per trip\s+([\d.]+)", line)
            if trip:
                rows["round trip (per trip)"] = float(trip.group(1))
    return rows


def stomp_cpu(tree: Path, messages: int) -> dict[str, float]:
    """bench_stomp.py --raw: {case: the broker's CPU us per message}."""
    out = run(tree, "bench_stomp.py", "--raw", "--messages", str(messages))
    rows: dict[str, float] = {}
    for line in out.splitlines():
        if not line.startswith(_STOMP_PREFIX):
            continue
        fields = line[52:].split()
        if len(fields) >= 5:
            rows[f"STOMP {line[len(_STOMP_PREFIX) : 52].strip()}"] = float(fields[4])
    return rows


def measure(tree: Path, messages: int, stomp_messages: int) -> dict[str, float]:
    rows = broker_cpu(tree, messages)
    if stomp_messages:
        rows.update(stomp_cpu(tree, stomp_messages))
    return rows


def table(turns: list[tuple[dict[str, float], dict[str, float]]]) -> None:
    names = list(turns[0][0])
    head = "".join(f" {'pure':>7} {'mypyc':>7} {'ratio':>6} |" for _ in turns)
    print(f"\n{'CPU us per message (broker process)':<44}|{head}")
    for name in names:
        cells = ""
        for pure, compiled in turns:
            p, c = pure.get(name), compiled.get(name)
            if p is None or c is None:
                cells += f" {'':>7} {'':>7} {'':>6} |"
            else:
                cells += f" {p:>7.1f} {c:>7.1f} {c / p:>6.2f} |"
        print(f"{name:<44}|{cells}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--messages", type=int, default=50_000, help="profile_broker rows")
    parser.add_argument(
        "--stomp-messages", type=int, default=20_000, help="bench_stomp rows (0: none)"
    )
    parser.add_argument("--pure", type=Path, help="a pure tree (default: HEAD exported)")
    parser.add_argument("--compiled", type=Path, default=HERE, help="a compiled tree")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    compiled = args.compiled.resolve()
    if not is_compiled(compiled):
        print(f"{compiled}: no compiled build (ZEROHUB_COMPILE=1 pip install -e .)",
              file=sys.stderr)  # fmt: skip
        return 2
    with exported_head(HERE) if args.pure is None else _given(args.pure) as pure:
        if is_compiled(pure):
            print(f"{pure}: compiled, not pure", file=sys.stderr)
            return 2
        print(f"pure: {pure}\ncompiled: {compiled}", flush=True)
        turns = []
        for turn in range(1, args.turns + 1):
            order = [pure, compiled] if turn % 2 else [compiled, pure]
            got = {tree: measure(tree, args.messages, args.stomp_messages) for tree in order}
            turns.append((got[pure], got[compiled]))
            print(f"turn {turn} done", flush=True)
    table(turns)
    return 0


@contextmanager
def _given(tree: Path) -> Iterator[Path]:
    yield tree.resolve()


if __name__ == "__main__":
    sys.exit(main())
