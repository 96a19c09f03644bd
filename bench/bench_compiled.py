"""Does compiling the broker's hot modules with mypyc pay?  The same commit pure and
compiled, same run, in turns: the broker's CPU per message.

Two trees of this checkout's HEAD, exported to temp dirs (``git archive``): one left pure,
one where mypyc compiles :data:`COMPILED` in place (mypy from the dev extra, its mypyc, gcc
and the Python headers; ~4 CPU minutes, 5-14 min here under load; ``--compiled TREE``
reuses a tree built before, ``--keep`` keeps the one built and prints where).  Each turn
runs, for each tree (the pure one first in odd turns, last in even ones), the tree's own
scripts with ``PYTHONPATH`` set to it:

* ``profile_broker.py --cpu 1``: the broker process's CPU per message (no profiler):
  ``push``/``push_many`` with ``unacked_batch`` 0 and the default, ``acked push``, and
  the round trip (broker CPU per trip);
* ``bench_stomp.py --raw``: the STOMP listener's CPU per message (``broker serve
  --stomp``; stomp.py clients and the raw-socket ones).

CPU per message, not rates: the machine is shared.  The ratio columns are compiled /
pure per turn (below 1: the compiled build spends less).  What is not compiled, and why,
is beside :data:`COMPILED` (docs/performance.md, "Compiled build (mypyc): measured, not kept").

Usage: ``python bench/bench_compiled.py [--turns N] [--messages N] [--stomp-messages N]
[--compiled TREE] [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: The modules compiled: the broker's serving loop, engine and queue parts.  Left pure:
#: ``broker/tmqp.py`` and ``broker/engine/message.py`` (mypyc refuses their class tricks:
#: ``__class__`` assignment, ``__slots__`` read through the class, a class defined under
#: ``if TYPE_CHECKING``), ``zproto/runtime.py`` (tmqp's interpreted classes subclass its
#: ``MessageBase``: a compiled class cannot be subclassed by an interpreted one),
#: ``broker/engine/fanout.py`` (subclasses a NamedTuple), ``broker/engine/queue/queue.py``
#: (binds its parts' methods as instance attributes: read-only on a compiled class),
#: ``broker/engine/delivery.py`` and ``auth.py`` (classes that users and tests subclass),
#: ``broker/engine/limits.py`` and the two ``options.py`` (a mistyped config value must
#: reach their own validation: compiled, the typed field raises TypeError first).
COMPILED = (
    "broker/batch.py",
    "broker/message.py",
    "broker/server/fanout.py",
    "broker/server/gate.py",
    "broker/server/links.py",
    "broker/server/peers.py",
    "broker/server/send.py",
    "broker/server/server.py",
    "broker/server/wait.py",
    "broker/engine/channel.py",
    "broker/engine/channels.py",
    "broker/engine/clients.py",
    "broker/engine/definitions.py",
    "broker/engine/dsubs.py",
    "broker/engine/engine.py",
    "broker/engine/errors.py",
    "broker/engine/events.py",
    "broker/engine/federated.py",
    "broker/engine/flow.py",
    "broker/engine/frames.py",
    "broker/engine/host.py",
    "broker/engine/models.py",
    "broker/engine/operations.py",
    "broker/engine/parts.py",
    "broker/engine/per_message.py",
    "broker/engine/queue_view.py",
    "broker/engine/receipts.py",
    "broker/engine/replies.py",
    "broker/engine/router.py",
    "broker/engine/routing.py",
    "broker/engine/tmqp_door.py",
    "broker/engine/queue/acks.py",
    "broker/engine/queue/broadcast_run.py",
    "broker/engine/queue/dedupe.py",
    "broker/engine/queue/dispatch.py",
    "broker/engine/queue/hooks.py",
    "broker/engine/queue/ledger.py",
    "broker/engine/queue/messages.py",
    "broker/engine/queue/plain_prefix.py",
    "broker/engine/queue/protocols.py",
    "broker/engine/queue/pull.py",
    "broker/engine/queue/reading.py",
    "broker/engine/queue/retained.py",
    "broker/engine/queue/saved_run.py",
    "broker/engine/queue/seqindex.py",
    "broker/engine/queue/statuses.py",
    "broker/engine/queue/trash.py",
)
#: Run by this Python in the tree: mypyc compiles the modules named on its command line in
#: place (``packages=[]``: setuptools only drives gcc here, it must not go looking for the
#: project's packages).
_COMPILE = """
import sys
from setuptools import setup
from mypyc.build import mypycify

temp = sys.argv[1]
setup(
    name="zerohub-compiled",
    packages=[],
    py_modules=[],
    ext_modules=mypycify(sys.argv[2:], target_dir=temp + "/c", opt_level="3"),
    script_args=["build_ext", "--inplace", "--build-temp", temp + "/o"],
)
"""
#: Where profile_broker.py prints its CPU rows, and where bench_stomp.py's table starts.
_CPU_TITLE = "broker CPU us/msg (no profiler)"
_STOMP_PREFIX = "zerohub serve --stomp"


def is_compiled(tree: Path) -> bool:
    return any((tree / "broker" / "engine").glob("engine.*.so"))


def export_head(checkout: Path, into: Path) -> Path:
    """``checkout``'s HEAD as plain files in ``into``/tree (no build products)."""
    archive = into / "head.tar"
    subprocess.run(["git", "-C", str(checkout), "archive", "-o", str(archive), "HEAD"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()
    return into / "tree"


def build(tree: Path) -> None:
    """mypyc over :data:`COMPILED` in ``tree``, in place (its work files in a temp dir)."""
    with tempfile.TemporaryDirectory(prefix="zerohub-mypyc-") as temp:
        done = subprocess.run(
            [sys.executable, "-c", _COMPILE, temp, *COMPILED],
            cwd=tree,
            env={**os.environ, "MYPY_CACHE_DIR": temp + "/cache"},
            capture_output=True,
            text=True,
        )
    if done.returncode != 0 or not is_compiled(tree):
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise SystemExit(f"the mypyc build failed: {tail}")


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
    parser.add_argument("--compiled", type=Path, help="a compiled tree built before (--keep)")
    parser.add_argument("--keep", action="store_true", help="keep the compiled tree built")
    args = parser.parse_args(argv)
    if args.turns < 1:
        parser.error("--turns must be at least 1")
    if args.compiled is not None and not is_compiled(args.compiled):
        print(f"{args.compiled}: no compiled build in it", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="zerohub-pure-") as temp:
        pure = export_head(HERE, Path(temp))
        compiled = args.compiled
        made = None if compiled is not None else Path(tempfile.mkdtemp(prefix="zerohub-mypyc-"))
        try:
            if made is not None:
                compiled = export_head(HERE, made)
                print(f"building {len(COMPILED)} modules with mypyc in {compiled}", flush=True)
                build(compiled)
            assert compiled is not None
            compiled = compiled.resolve()
            print(f"pure: {pure}\ncompiled: {compiled}", flush=True)
            turns = []
            for turn in range(1, args.turns + 1):
                order = [pure, compiled] if turn % 2 else [compiled, pure]
                got = {t: measure(t, args.messages, args.stomp_messages) for t in order}
                turns.append((got[pure], got[compiled]))
                print(f"turn {turn} done", flush=True)
        finally:
            if made is not None and not args.keep:
                shutil.rmtree(made)
    table(turns)
    if made is not None and args.keep:
        print(f"\ncompiled tree kept: {compiled} (--compiled {compiled})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
