"""Instructions per STOMP message of each thread of ``broker serve --stomp`` (callgrind:
it does not depend on the machine's load), this checkout and another one in turns.

    python bench/callgrind_stomp.py [--messages 10000] [--receipts] [--baseline DIR] [--turns 2]

The server runs under ``valgrind --tool=callgrind --separate-threads=yes``
(``PYTHONHASHSEED=0``); ``bench_stomp.py``'s stomp.py producer and ``ack:auto``
consumer (not under valgrind) send it 500 messages, its counters are zeroed
(``callgrind_control -z``), ``--messages`` more go through, and the counters are dumped
(``callgrind_control -d``).  Rows: the listener thread (the one waiting in
``epoll_wait``: asyncio's), the engine thread (the busiest other one), and the process
(every thread, libzmq's included), in instructions per message.  Under valgrind the
server is ~50x slower, so its reads and hand-overs hold longer runs than at full speed:
compare checkouts within a run.  Needs valgrind.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stomp import free_port, run_pair, serve_args  # (this folder, made importable above)

HERE = Path(__file__).resolve().parent.parent
#: Messages through the server before its counters are zeroed (imports, first frames).
WARM_UP = 500
_READY = b"broker serving on"


def _server(tree: Path, port: int, out: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--separate-threads=yes",
        "--dump-instr=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        *serve_args(port, "none"),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=str(tree)
    )
    assert proc.stdout is not None and proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + 300
    while _READY not in seen and time.monotonic() < deadline and proc.poll() is None:
        readable, _, _ = select.select([proc.stdout, proc.stderr], [], [], 1.0)
        for stream in readable:
            seen += os.read(stream.fileno(), 65536)
    if _READY not in seen:
        _stop(proc)
        raise SystemExit(
            f"the server of {tree} did not start: {seen[-500:].decode(errors='replace')}"
        )
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def _threads(dumps: list[Path]) -> dict[str, int]:
    """Instructions of the listener, the engine and the process from one dump's files
    (one per thread)."""
    counts: list[tuple[int, bool]] = []
    for path in dumps:
        text = path.read_text(errors="replace")
        total = next(
            (int(line.split()[1]) for line in text.splitlines() if line.startswith("totals:")), 0
        )
        counts.append((total, "epoll_wait" in text))
    listener = max((n for n, asyncio_loop in counts if asyncio_loop), default=0)
    engine = max((n for n, asyncio_loop in counts if not asyncio_loop), default=0)
    return {"listener": listener, "engine": engine, "process": sum(n for n, _ in counts)}


def measure(tree: Path, messages: int, receipts: bool, work: Path) -> dict[str, float]:
    port = free_port()
    out = work / "callgrind.out"
    proc = _server(tree, port, out)
    ctx = mp.get_context("spawn")
    try:
        run_pair(ctx, port, "localhost", WARM_UP, receipts)
        pid = str(proc.pid)
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
        run_pair(ctx, port, "localhost", messages, receipts)
        subprocess.run(
            ["callgrind_control", "-d", "measured", pid], check=True, capture_output=True
        )
    finally:
        _stop(proc)
    dumps = [
        path
        for path in sorted(work.glob("callgrind.out*"))
        if "measured" in path.read_text(errors="replace")[:3000]
    ]
    counts = _threads(dumps)
    for path in work.glob("callgrind.out*"):
        path.unlink()
    return {name: n / messages for name, n in counts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--receipts", action="store_true", help="a receipt per SEND")
    parser.add_argument("--baseline", metavar="DIR", help="another checkout, in turns")
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args(argv)
    if args.messages < 1 or args.turns < 1:
        parser.error("--messages and --turns must be at least 1")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind (with callgrind_control) is not installed", file=sys.stderr)
        return 2
    trees: list[tuple[str, Path]] = [("this", HERE)]
    if args.baseline:
        trees.insert(0, ("baseline", Path(args.baseline).resolve()))
    mode = "receipt per SEND" if args.receipts else "auto-ack"
    print(f"instructions per message, {args.messages} messages, {mode} (callgrind)")
    print(f"{'turn':4} {'checkout':9} {'listener':>10} {'engine':>10} {'process':>10}")
    with tempfile.TemporaryDirectory(prefix="callgrind-stomp-") as tmp:
        for turn in range(1, args.turns + 1):
            order = trees if turn % 2 else trees[::-1]
            for name, tree in order:
                row = measure(tree, args.messages, args.receipts, Path(tmp))
                print(
                    f"{turn:4} {name:9} {row['listener']:10.0f} {row['engine']:10.0f} "
                    f"{row['process']:10.0f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
