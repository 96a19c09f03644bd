"""Python calls per file of a cold FILEMQ mirror of small files, per thread and per side.

    python bench/profile_filemq_cold.py [--files 5000] [--size 10240] [--base DIR] [--turns 2]

One ``filemq serve`` and one ``filemq sync --once`` (DEST on tmpfs when /dev/shm exists:
the kernel's create cost stays out of it) each run under ``cProfile`` in its own process:
the mirror's receiving thread, its placer thread (``Placer._work``) and the server's
loop are counted apart (``bench/call_count.py``), divided by the files.  With ``--base``
the same runs use another checkout's code (``PYTHONPATH``) in alternating turns.  Calls
are the load-proof figure; CPU us per file (the process's, from ``resource``) is printed
beside with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq import make_small  # (this folder, made importable above)

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
if role == "sync":
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
if role == "serve":
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


def run_turn(code_dir: Path, src: Path, dest: Path, tmp: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    py = sys.executable
    bench = str(Path(__file__).resolve().parent)
    sout, cout = tmp / "server.json", tmp / "client.json"
    serve = [py, "-c", _CHILD, bench, "serve", str(sout), "-q", "serve"]
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
        sync = [py, "-c", _CHILD, bench, "sync", str(cout), "-q", "sync", endpoint, str(dest)]
        sync += ["--once", "--no-index", "--placer", "thread"]
        subprocess.run(sync, env=env, cwd=tmp, check=True)
    finally:
        server.terminate()
        server.wait(60)
        server.stderr.close()
    client = json.loads(cout.read_text())
    served = json.loads(sout.read_text())
    return {"client": client, "server": served}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--base", help="another checkout's code, in alternating turns")
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
            f"{'server calls':>12} {'client CPU us':>13} {'server CPU us':>13}"
        )
        for turn in range(args.turns):
            for label, tree in trees if turn % 2 == 0 else trees[::-1]:
                dest = work / f"dest-{label}-{turn}"
                got = run_turn(tree, src, dest, work)
                client, server = got["client"], got["server"]
                assert str(client["where"]).startswith(str(tree)), client["where"]
                n = args.files
                calls = client["calls"]
                row = (
                    f"{turn:>4} {label:5} {calls['main'] / n:>10.1f} "
                    f"{calls.get('placer', 0) / n:>12.1f} {server['calls']['loop'] / n:>12.1f} "
                    f"{client['cpu'] * 1e6 / n:>13.0f} {server['cpu'] * 1e6 / n:>13.0f}"
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
