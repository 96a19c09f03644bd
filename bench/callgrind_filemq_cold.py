"""Instructions per file of a cold FILEMQ mirror of small files (callgrind: every thread
of each process, libzmq's included; it does not depend on the machine's load).

    python bench/callgrind_filemq_cold.py [--files 2000] [--small 200] [--base DIR]

Per tree (this checkout, and ``--base``'s through ``PYTHONPATH``), three runs:

* A: ``filemq serve`` and ``filemq sync --once`` (``--placer thread``, no index, DEST
  on tmpfs when /dev/shm exists) both under ``valgrind --tool=callgrind``, ``--files``
  files of 10 KiB;
* B: the same server alone (it indexes the same files, serves nobody, is stopped);
* C: the mirror alone under callgrind (its server not), ``--small`` files.

The mirror's instructions per file are (A's mirror - C's) / (files - small): its start
and end cancel out; the server's are (A's server - B's) / files: its start and indexing
cancel out.  ``PYTHONHASHSEED=0``.  Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq import make_small  # (this folder, made importable above)

HERE = Path(__file__).resolve().parent.parent
_VALGRIND = ["valgrind", "--tool=callgrind", "--dump-instr=no", "--trace-children=no"]


def _total(out: Path) -> int:
    """The instructions a callgrind output file counted (its ``totals:`` or ``summary:``)."""
    for line in out.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def _cmd(out: Path | None, *args: str) -> list[str]:
    base = [sys.executable, "-m", "filemq", "-q", *args]
    return base if out is None else [*_VALGRIND, f"--callgrind-out-file={out}", *base]


def _serve(out: Path | None, src: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    cmd = _cmd(out, "serve", "--bind", "tcp://127.0.0.1:*", "--publish", str(src), "--no-state")
    proc = subprocess.Popen(cmd, env=env, cwd=src.parent, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r" on (tcp://\S+) \(", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    proc.wait()
    raise RuntimeError("filemq serve did not start")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(600)
    if proc.stderr is not None:
        proc.stderr.close()


def _sync(out: Path | None, endpoint: str, dest: Path, env: dict[str, str]) -> None:
    cmd = _cmd(out, "sync", endpoint, str(dest), "--once", "--no-index", "--placer", "thread")
    subprocess.run(cmd, env=env, cwd=dest.parent, check=True, stderr=subprocess.DEVNULL)


def measure(tree: Path, big: Path, small: Path, work: Path, label: str) -> tuple[int, int]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    where = subprocess.run(
        [sys.executable, "-c", "import filemq; print(filemq.__file__)"],
        env=env,
        cwd=work,  # (not this checkout: ``-c`` puts the current folder first)
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not where.startswith(str(tree)):
        raise SystemExit(f"{label}: measured another checkout: {where}")
    outs = {k: work / f"{label}-{k}.out" for k in ("a-server", "a-client", "b-server", "c-client")}
    server, endpoint = _serve(outs["a-server"], big, env)  # A
    try:
        _sync(outs["a-client"], endpoint, work / f"{label}-dest-a", env)
    finally:
        _stop(server)
    server, _endpoint = _serve(outs["b-server"], big, env)  # B
    _stop(server)
    server, endpoint = _serve(None, small, env)  # C
    try:
        _sync(outs["c-client"], endpoint, work / f"{label}-dest-c", env)
    finally:
        _stop(server)
    totals = {k: _total(v) for k, v in outs.items()}
    return totals["a-client"] - totals["c-client"], totals["a-server"] - totals["b-server"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--base", help="another checkout, measured the same way")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed", file=sys.stderr)
        return 2
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="cg-cold-", dir=shm if shm.is_dir() else None))
    try:
        big, small = work / "src-big", work / "src-small"
        make_small(big, args.files, args.size)
        make_small(small, args.small, args.size)
        trees = [("this", HERE)] + ([("base", Path(args.base).resolve())] if args.base else [])
        print(f"{args.files} (minus {args.small}) x {args.size} B; instructions per file")
        print(f"{'tree':5} {'mirror':>10} {'server':>10} {'both':>10}")
        for label, tree in trees:
            client, server = measure(tree, big, small, work, label)
            n_client, n_server = args.files - args.small, args.files
            per_client, per_server = client / n_client, server / n_server
            print(
                f"{label:5} {per_client:>10,.0f} {per_server:>10,.0f} "
                f"{per_client + per_server:>10,.0f}",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
