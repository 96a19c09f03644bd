"""Python calls per file of a cold FILEMQ mirror of small files, per thread and per side.

    python bench/profile_filemq_cold.py [--files 5000] [--size 10240] [--base DIR] [--turns 2]

One ``filemq serve`` and one ``filemq sync --once`` (DEST on tmpfs when /dev/shm exists:
the kernel's create cost stays out of it) each run under ``cProfile`` in its own process:
the mirror's receiving thread, its placer thread (``Placer._work``) and the server's
loop are counted apart (``bench/call_count.py``), divided by the files.  With ``--base``
the same runs use another checkout's code (``PYTHONPATH``) in alternating turns.  Calls
are the load-proof figure; CPU us per file is printed beside with the load: the mirror's
(its whole process, start-up included, ``resource``) and the server's while it sent
(``/proc``, from its ready line to the mirror's end), and the wall time of the turn
(both processes' start included).  ``--cpu``: the same turns without the profiler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq import make_small, server_ticks  # (this folder, made importable above)

HERE = Path(__file__).resolve().parent.parent

#: Run in the child: the CLI under cProfile, the placer's thread profiled on its own.
_CHILD = r"""
import cProfile, json, resource, sys, threading
sys.path.insert(0, sys.argv[1])
from call_count import python_calls
import filemq
role, out = sys.argv[2], sys.argv[3]
argv = sys.argv[4:]
profs = {}
plain = role.endswith("-plain")  # (no profiler: CPU only)
role = role.removesuffix("-plain")
if role == "sync" and not plain:
    from filemq import placer
    work = placer.Placer._work
    def _profiled(self):
        prof = profs["placer"] = cProfile.Profile()
        prof.enable()
        try:
            work(self)
        finally:
            prof.disable()
    placer.Placer._work = _profiled
if role == "serve" and not plain:
    from filemq import server
    loop = server.FileServer._run
    def _profiled_loop(self):
        prof = profs["loop"] = cProfile.Profile()
        prof.enable()
        try:
            loop(self)
        finally:
            prof.disable()
    server.FileServer._run = _profiled_loop
from filemq.cli import main
import signal
def _stop(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, _stop)
prof = profs["main"] = cProfile.Profile()
if not plain:
    prof.enable()
try:
    code = main(argv)
except (KeyboardInterrupt, SystemExit):
    code = 0
finally:
    prof.disable()
usage = resource.getrusage(resource.RUSAGE_SELF)
with open(out, "w") as f:
    json.dump({
        "code": code, "where": filemq.__file__,
        "calls": {k: python_calls(p) for k, p in profs.items()},
        "cpu": usage.ru_utime + usage.ru_stime,
    }, f)
"""


def run_turn(
    code_dir: Path, src: Path, dest: Path, tmp: Path, plain: bool = False
) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    py = sys.executable
    bench = str(Path(__file__).resolve().parent)
    sout, cout = tmp / "server.json", tmp / "client.json"
    suffix = "-plain" if plain else ""
    serve = [py, "-c", _CHILD, bench, "serve" + suffix, str(sout), "-q", "serve"]
    serve += ["--bind", "tcp://127.0.0.1:*", "--publish", str(src), "--no-state"]
    # (run from ``tmp``: ``-c`` puts the current folder first on the path)
    server = subprocess.Popen(serve, env=env, cwd=tmp, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    endpoint = ""
    for line in server.stderr:
        if " on tcp://" in line:
            endpoint = line.split(" on ", 1)[1].split()[0]
            break
    if not endpoint:
        server.kill()
        server.wait()
        raise RuntimeError("filemq serve did not start")
    try:
        ready = server_ticks(server.pid)  # (indexed: what it uses from here is the sending)
        sync = [py, "-c", _CHILD, bench, "sync" + suffix, str(cout), "-q", "sync", endpoint]
        sync.append(str(dest))
        sync += ["--once", "--no-index", "--placer", "thread"]
        subprocess.run(sync, env=env, cwd=tmp, check=True)
        sending = server_ticks(server.pid) - ready
    finally:
        server.terminate()
        server.wait(60)
        server.stderr.close()
    client = json.loads(cout.read_text())
    served = json.loads(sout.read_text())
    return {"client": client, "server": served, "sending": sending}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--base", help="another checkout's code, in alternating turns")
    parser.add_argument(
        "--cpu", action="store_true", help="no profiler: CPU us per file only (and wall)"
    )
    args = parser.parse_args()
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="prof-cold-", dir=shm if shm.is_dir() else None))
    try:
        src = work / "src"
        make_small(src, args.files, args.size)
        trees = [("this", HERE)] + ([("base", Path(args.base).resolve())] if args.base else [])
        print(f"{args.files} x {args.size} B, DEST in {work}; load {os.getloadavg()[0]:.1f}")
        print(
            f"{'turn':>4} {'tree':5} {'recv calls':>10} {'placer calls':>12} "
            f"{'server calls':>12} {'mirror CPU us':>13} {'sending CPU us':>14} {'wall s':>6}"
        )
        for turn in range(args.turns):
            for label, tree in trees if turn % 2 == 0 else trees[::-1]:
                dest = work / f"dest-{label}-{turn}"
                began = time.monotonic()
                got = run_turn(tree, src, dest, work, plain=args.cpu)
                wall = time.monotonic() - began
                client, server = got["client"], got["server"]
                assert str(client["where"]).startswith(str(tree)), client["where"]
                n = args.files
                calls = client["calls"]
                row = (
                    f"{turn:>4} {label:5} {calls['main'] / n:>10.1f} "
                    f"{calls.get('placer', 0) / n:>12.1f} "
                    f"{server['calls'].get('loop', 0) / n:>12.1f} "
                    f"{client['cpu'] * 1e6 / n:>13.0f} {got['sending'] * 1e6 / n:>14.0f} "
                    f"{wall:>6.2f}"
                )
                print(row, f"(load {os.getloadavg()[0]:.1f})", flush=True)
                _check(src, dest)
                shutil.rmtree(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _check(src: Path, dest: Path) -> None:
    """DEST holds SRC's files, byte for byte."""
    for folder, _dirs, files in os.walk(src):
        for name in files:
            a = Path(folder) / name
            b = dest / a.relative_to(src)
            if a.read_bytes() != b.read_bytes():
                raise SystemExit(f"mirror differs at {b}")


if __name__ == "__main__":
    sys.exit(main())
