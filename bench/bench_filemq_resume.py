"""FILEMQ resume benchmark: bytes sent again after a ``kill -9`` in the middle of a big file.

    python bench/bench_filemq_resume.py            # 1 GiB file, kill at 25%, 50%, 75%
    python bench/bench_filemq_resume.py --quick    # 64 MiB

The server (a ``FileServer`` in this process, so its count of content bytes sent is
exact) publishes one file of random bytes.  A ``filemq sync --once`` process mirrors
it; when its partial file holds the given share of the file, it is killed with
SIGKILL.  A second ``filemq sync --once`` then completes the mirror (proving the
partial file, offering it, the server resuming).  Columns:

  held      bytes the partial file held when the kill landed
  resumed   bytes the second run did not fetch again (proven and offered)
  re-sent   server bytes sent in both runs minus the file's size (what was fetched twice)
  % file    re-sent / file size (issue 13's target: < 5% at 50%)
  run 2     wall time of the second run (proving the partial file included)
  fresh     wall time of a sync of the same file into an empty DEST, for comparison
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from filemq.mirror import PARTIAL_PREFIX
from filemq.partial import PartialStore
from filemq.server import FileServer, Mount

MiB = 1 << 20
FILEMQ = [sys.executable, "-m", "filemq", "-q"]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _sync(endpoint: str, dest: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*FILEMQ, "sync", endpoint, str(dest), "--once"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def one_run(ctx: zmq.Context[Any], work: Path, src: Path, size: int, share: float) -> list[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}
    server = FileServer(ctx, [Mount(src, "/")], endpoint="tcp://127.0.0.1:*")
    server.start()
    dest = work / f"dest-{share}"
    partial = dest / PartialStore(dest, PARTIAL_PREFIX).data_name("big.bin")
    try:
        first = _sync(server.endpoint, dest, env)
        deadline = time.monotonic() + 120
        while _size(partial) < size * share and first.poll() is None:
            if time.monotonic() > deadline:
                raise SystemExit("the first sync made no progress")
            time.sleep(0.001)
        first.send_signal(signal.SIGKILL)
        first.wait()
        if first.returncode != -signal.SIGKILL:
            raise SystemExit("the first sync ended before the kill")
        held = _size(partial)
        started = time.monotonic()
        second = subprocess.run(
            [*FILEMQ[:-1], "sync", server.endpoint, str(dest), "--once"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        run2 = time.monotonic() - started
    finally:
        server.stop()
    resumed = 0
    for line in second.stderr.splitlines():
        if "resumed at byte" in line:
            resumed = int(line.rsplit(" ", 1)[1])
    if (dest / "big.bin").stat().st_size != size:
        raise SystemExit("the mirror is not complete")
    resent = server.sent_bytes - size
    return [
        f"{share:.0%}",
        f"{held / MiB:.1f} MiB",
        f"{resumed / MiB:.1f} MiB",
        f"{resent / MiB:.2f} MiB",
        f"{100 * resent / size:.2f}%",
        f"{run2:.2f} s",
    ]


def fresh_run(ctx: zmq.Context[Any], work: Path, src: Path) -> float:
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache-fresh")}
    with FileServer(ctx, [Mount(src, "/")], endpoint="tcp://127.0.0.1:*") as server:
        started = time.monotonic()
        subprocess.run(
            [*FILEMQ, "sync", server.endpoint, str(work / "fresh"), "--once"], env=env, check=True
        )
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB instead of 1 GiB")
    args = parser.parse_args()
    size = 64 * MiB if args.quick else 1024 * MiB
    ctx: zmq.Context[Any] = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        work = Path(tmp)
        src = work / "src"
        src.mkdir()
        with open(src / "big.bin", "wb") as f:
            for _ in range(size // (64 * MiB) or 1):
                f.write(os.urandom(min(size, 64 * MiB)))
        fresh = fresh_run(ctx, work, src)
        rows = [one_run(ctx, work, src, size, share) for share in (0.25, 0.5, 0.75)]
    ctx.term()
    head = ["killed at", "held", "resumed", "re-sent", "% file", "run 2"]
    print(f"\nresume after kill -9, {size / MiB:.0f} MiB file (fresh sync: {fresh:.2f} s)\n")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
