"""FILEMQ bulk: CPU seconds per GiB of the server and of the client, two source trees
(a base and this one) and the raw pyzmq stream taking turns in the same run.

    python bench/bench_filemq_bulk.py --base /tmp/base-main          # 1 GiB, 3 rounds
    python bench/bench_filemq_bulk.py --base /tmp/base-main --quick  # 64 MiB, 2 rounds
    python bench/bench_filemq_bulk.py --base /tmp/base-main --curve  # CURVE, raw CURVE beside

``--base`` is a checkout of another commit (``git worktree add /tmp/base-main main``):
its ``filemq`` and ``zproto`` run with ``PYTHONPATH`` pointing at it, this tree's
without; both with this interpreter.  Each round runs base, branch, branch with
``--direct-io`` ("dio") and raw in turn (the order rotates), each after a ``sync``
with the source in the page cache, into a new DEST (deleted afterwards).  A ``filemq
serve --no-state`` process is started and has indexed the file before the clock
starts; the client is ``filemq sync --once --no-index``.  With ``--base-dio`` the base
runs with ``--direct-io`` too ("base dio"; a base that has it).  ``--threads`` samples
the client's threads (``/proc/PID/task/*/stat`` every 10 ms; a thread's last sample
before it ends) and prints each one's CPU s per GiB: the main thread, libzmq's I/O
thread and the writer's two workers (unnamed: listed in the order they started).
Columns: wall seconds of the client (launch to exit: noise on a loaded machine), CPU
seconds per GiB of the server (``/proc`` ticks while the client ran: its I/O thread
included) and of the client (``wait4``: all its threads), their sum, and the raw
stream's (sender + receiver, ``bench_filemq.time_raw``: no protocol, no SHA-1; it
writes around the page cache, as "dio") beside it.  CPU per GiB is the figure the
load of other processes barely moves.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_filemq  # (the raw stream and the data maker)

HERE = Path(__file__).resolve().parents[1]
PY = sys.executable


class _Threads:
    """Samples process ``pid``'s threads' CPU ticks every 10 ms until ``stop``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, tuple[str, int]] = {}  # tid -> (name, ticks)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        task = f"/proc/{self.pid}/task"
        while not self._done.wait(0.01):
            try:
                tids = os.listdir(task)
            except OSError:
                return
            for tid in tids:
                try:
                    with open(f"{task}/{tid}/stat") as f:
                        text = f.read()
                except OSError:
                    continue
                name = text[text.index("(") + 1 : text.rindex(")")]
                fields = text.rsplit(")", 1)[1].split()
                self.seen[int(tid)] = (name, int(fields[11]) + int(fields[12]))

    def stop(self) -> list[tuple[str, float]]:
        """(name, CPU s) of each thread seen, in the order they started (tid order)."""
        self._done.set()
        self._thread.join()
        tick = os.sysconf("SC_CLK_TCK")
        return [(name, ticks / tick) for _tid, (name, ticks) in sorted(self.seen.items())]


def _run(
    tree: Path | None,
    src: Path,
    dest: Path,
    port: int,
    curve: list[list[str]],
    extra: list[str],
    threads: list[tuple[str, float]] | None = None,
) -> tuple[float, float, float]:
    """(client wall s, server CPU s, client CPU s) of one transfer with ``tree``'s code
    (``curve``: the server's and the client's CURVE options, or empty: plain; ``extra``:
    more options of the client)."""
    env, cwd = _env(tree)
    serve = [PY, "-m", "filemq", "-q", "serve", "--bind", f"tcp://127.0.0.1:{port}"]
    serve += ["--publish", str(src), "--no-state", "--no-watch", *(curve[0] if curve else [])]
    server = subprocess.Popen(
        serve, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, cwd=cwd
    )
    try:
        assert server.stderr is not None
        while b"tcp://" not in (line := server.stderr.readline()):
            if not line:
                raise RuntimeError("filemq serve did not start")
        before = bench_filemq.server_ticks(server.pid)
        start = time.perf_counter()
        sync = [PY, "-m", "filemq", "-q", "sync", f"tcp://127.0.0.1:{port}", str(dest)]
        sync += ["--once", "--no-index", *(curve[1] if curve else []), *extra]
        client = subprocess.Popen(sync, env=env, cwd=cwd)
        sampler = _Threads(client.pid) if threads is not None else None
        _pid, status, usage = os.wait4(client.pid, 0)
        if sampler is not None and threads is not None:
            threads.extend(sampler.stop())
        wall = time.perf_counter() - start
        server_cpu = bench_filemq.server_ticks(server.pid) - before
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"filemq sync failed ({tree or 'branch'})")
    finally:
        server.terminate()
        server.wait(30)
        if server.stderr is not None:
            server.stderr.close()
    bench_filemq.check_same(src, dest)
    return wall, server_cpu, usage.ru_utime + usage.ru_stime


def _env(tree: Path | None) -> tuple[dict[str, str], Path]:
    """(environment, working folder) that make ``python -m filemq`` run ``tree``'s code
    (None: this tree's).  The working folder matters: ``-m`` puts it first on the path,
    before ``PYTHONPATH`` (from this tree's folder the base ran this tree's code)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env, tree if tree is not None else HERE


def _code_of(tree: Path | None) -> str:
    """The folder whose ``filemq`` package ``_run`` runs for ``tree``."""
    env, cwd = _env(tree)
    probe = "import filemq, os; print(os.path.dirname(os.path.dirname(filemq.__file__)))"
    done = subprocess.run(
        [PY, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _curve_options(work: Path) -> list[list[str]]:
    """Keys made in ``work``: [the server's CURVE options, the client's]."""
    keys, allow = work / "keys", work / "allow"
    for who in ("server", "client"):
        new = [*bench_filemq.FILEMQ, "keys", "new", who, "--dir", str(keys)]
        subprocess.run(new, check=True, capture_output=True)
    allow.mkdir()
    shutil.copy(keys / "client.key", allow / "client.key")
    server = ["--curve-secret", str(keys / "server.key_secret"), "--allow", str(allow)]
    client = ["--server-key", str(keys / "server.key")]
    return [server, [*client, "--curve-secret", str(keys / "client.key_secret")]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="checkout of the base commit")
    parser.add_argument("--quick", action="store_true", help="64 MiB, 2 rounds")
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", help="work folder (default: a temp folder)")
    parser.add_argument("--curve", action="store_true", help="over CURVE (and the raw CURVE)")
    parser.add_argument("--base-dio", action="store_true", help="the base with --direct-io too")
    parser.add_argument("--threads", action="store_true", help="the client's CPU per thread")
    parser.add_argument("--no-raw", action="store_true", help="without the raw stream")
    args = parser.parse_args()
    if not (args.base / "filemq" / "server.py").exists():
        print(f"bench_filemq_bulk: {args.base} holds no filemq/", file=sys.stderr)
        return 2
    size = (64 if args.quick else args.size_mib) << 20
    rounds = 2 if args.quick else args.rounds
    work = Path(tempfile.mkdtemp(prefix="bench-bulk-", dir=args.dir))
    try:
        src = work / "big-src"  # (fresh_dest keeps what is named *-src)
        bench_filemq.make_big(src, size)
        curve = _curve_options(work) if args.curve else []
        gib = size / (1 << 30)
        port = 48000 + os.getpid() % 1000
        security = "CURVE" if args.curve else "plain"
        print(f"1 x {size >> 20} MiB, {security}; base {args.base}, branch {HERE}")
        print(f"filemq code: base {_code_of(args.base)}, branch {_code_of(None)}")
        print(bench_filemq.CONDITIONS)
        print(
            f"{'round':>5} {'code':8} {'wall s':>7} {'server CPU/GiB':>14} "
            f"{'client CPU/GiB':>14} {'sum':>6} {'x raw CPU':>9}  load"
        )
        # "dio": this tree with --direct-io (big files written around the page cache)
        order = [("base", args.base), ("branch", None), ("dio", None), ("raw", None)]
        if args.base_dio:
            order.insert(1, ("base dio", args.base))
        if args.no_raw:
            order.remove(("raw", None))
        for rnd in range(1, rounds + 1):
            results: dict[str, tuple[float, float, float]] = {}
            split: dict[str, list[tuple[str, float]]] = {}
            for name, tree in order:
                dest = bench_filemq.fresh_dest(work, f"dest-{name}", src)
                port += 1
                if name == "raw":
                    dest.mkdir()
                    wall, cpu = bench_filemq.time_raw(src, dest, port, args.curve)
                    results[name] = (wall, 0.0, cpu)
                else:
                    extra = ["--direct-io"] if name.endswith("dio") else []
                    split[name] = []
                    threads = split[name] if args.threads else None
                    results[name] = _run(tree, src, dest, port, curve, extra, threads)
                shutil.rmtree(dest)
            raw_cpu = results["raw"][2] if "raw" in results else float("nan")
            for name, _tree in order:  # (in the order they ran)
                wall, server_cpu, client_cpu = results[name]
                total = server_cpu + client_cpu
                server = f"{server_cpu / gib:14.2f}" if name != "raw" else f"{'-':>14}"
                client = f"{client_cpu / gib:14.2f}" if name != "raw" else f"{'-':>14}"
                print(
                    f"{rnd:>5} {name:8} {wall:7.2f} {server} {client} {total / gib:6.2f}"
                    f" {total / raw_cpu:9.2f}  {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                if split.get(name):
                    parts = [f"{n} {cpu / gib:.2f}" for n, cpu in split[name] if cpu > 0]
                    print(f"{'':>5} {'':8} threads, CPU s/GiB: {', '.join(parts)}", flush=True)
            order = order[1:] + order[:1]  # (who goes first rotates)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
