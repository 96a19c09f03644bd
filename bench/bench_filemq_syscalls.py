"""System calls per small file of a FILEMQ cold mirror, server and client (``strace -c``).

    python bench/bench_filemq_syscalls.py               # 2,000 x 10 KiB in 20 folders
    python bench/bench_filemq_syscalls.py --files 500

A count, not a time: what the machine's load does not move (wall and CPU figures on a
loaded machine mostly say who got the cores).  A ``filemq serve`` process publishes
the files and has indexed them; ``strace -c`` is attached to every one of its
threads for the duration of one ``filemq sync --once --no-index`` into an empty DEST,
which runs under ``strace -f -c`` itself (its start-up included: a fixed ~150 opens
of Python modules, shown in the "all" column, not per file).  Needs ``strace``.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_filemq import FILEMQ, Server, check_same

#: The calls of the file path, in the order a small file meets them.
SHOWN = ("openat", "newfstatat", "fstat", "pread64", "write", "fchmod", "utimensat")
SHOWN += ("renameat", "renameat2", "rename", "close", "mkdirat")
#: Then libzmq's I/O threads (a wake-up per message sent or received) and thread hand-offs.
SHOWN += ("sendto", "recvfrom", "epoll_wait", "epoll_ctl", "poll", "getpid", "read", "futex")


def make_files(root: Path, count: int, size: int, folders: int) -> None:
    for i in range(count):
        folder = root / f"dir{i % folders:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"file{i:05d}.dat").write_bytes(os.urandom(size))


def parse(path: Path) -> dict[str, int]:
    """``strace -c`` output: syscall -> calls."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and re.fullmatch(r"[\d.]+", fields[0]) and fields[-1] != "total":
            counts[fields[-1]] = int(fields[3])
    return counts


def measure(work: Path, src: Path) -> tuple[dict[str, int], dict[str, int]]:
    server = Server(src, [])
    try:
        tids = os.listdir(f"/proc/{server.proc.pid}/task")
        server_out = work / "server.strace"
        tracer = subprocess.Popen(
            ["strace", "-c", "-o", str(server_out), *[a for t in tids for a in ("-p", t)]],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # (attached: strace prints nothing to wait for)
        client_out = work / "client.strace"
        dest = work / "dest"
        cmd = [*FILEMQ, "sync", server.endpoint, str(dest), "--once", "--no-index"]
        subprocess.run(["strace", "-f", "-c", "-o", str(client_out), *cmd], check=True)
        tracer.send_signal(signal.SIGINT)
        tracer.wait(60)
        check_same(src, dest)
    finally:
        server.stop()
    return parse(server_out), parse(client_out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size", type=int, default=10 << 10)
    parser.add_argument("--folders", type=int, default=20)
    args = parser.parse_args()
    if not shutil.which("strace"):
        print("strace missing (apt-get install -y strace)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-fmq-syscalls-"))
    try:
        src = work / "src"
        make_files(src, args.files, args.size, args.folders)
        server, client = measure(work, src)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = args.files
    print(f"\n{n} files x {args.size} B in {args.folders} folders: system calls per file")
    print(f"{'call':12} {'server':>8} {'client':>8} {'server all':>11} {'client all':>11}")
    for name in SHOWN:
        s, c = server.get(name, 0), client.get(name, 0)
        if s or c:
            print(f"{name:12} {s / n:8.2f} {c / n:8.2f} {s:11} {c:11}")
    s, c = sum(server.values()), sum(client.values())
    print(f"{'every call':12} {s / n:8.2f} {c / n:8.2f} {s:11} {c:11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
