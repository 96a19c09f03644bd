"""Instructions per SEND of the listener's read side and the door (callgrind:
deterministic), this checkout and, with ``--base PATH``, another one.

What ``bench_stomp_paths.session_sends`` runs: a connected 1.2 ``Session`` on the
engine's backend and door (the two threads' turns on one), fed 1000 stomp.py-like SENDs
(100-byte bodies) in 64 KiB reads, each read's operations and answers run after it --
parse, the session's run, the hand-over, the door's messages, ``Engine.publish_many``
into a queue nobody consumes, the RECEIPTs written.  ``alike``: every head the same
(``receipt:12345`` on each, as stomp.py's auto-ack producer repeats its head);
``receipts``: ``receipt:N`` on each; ``read``: the parse and the session's reading of
the run only (``read_send_run`` of what the session's parsing of the reads gave; a
checkout without it as ``bench_stomp_paths.py`` reads it).  Each figure is
(instructions of a run of ``--rounds`` passes - those of the same run with none) /
SENDs, both after one untimed pass, under ``valgrind --tool=callgrind`` with
``PYTHONHASHSEED=0``.  The bench code is this checkout's, the measured code the
checkout's.  Needs valgrind (~3 CPU minutes with ``--base``).

Usage: ``python bench/callgrind_send_run.py [--rounds N] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bench_stomp_paths import FRAMES

BENCH = Path(__file__).resolve().parent

#: Run under callgrind with the checkout under test first on the path.
_RUN = """
import sys
rounds, path, root, bench = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(1, bench)
import broker
if not broker.__file__.startswith(root):
    raise SystemExit(f"measured another checkout: {broker.__file__}")
from bench_stomp_paths import _run_reader, _session_reading, send_chunks, session_sends
from broker.stomp.frames import FrameParser, Version
chunks = send_chunks(path.startswith("receipts"))
if path.endswith("read"):
    read = _session_reading(FrameParser(version=Version.V1_2))
    run_of = _run_reader()
    def run():
        run_of([item for chunk in chunks for item in read(chunk)])
else:
    run = session_sends(chunks, 1)
for _ in range(rounds + 1):
    run()
"""

PATHS = ("alike", "receipts", "alike read", "receipts read")


def instructions(root: Path, path: str, rounds: int) -> int:
    """Instructions callgrind collected running ``_RUN`` for ``path``, ``rounds`` passes."""
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(root))
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-c", _RUN, str(rounds), path, str(root), str(BENCH)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed for {root} {path}: {done.stderr.strip()[-300:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", type=Path, default=None, help="another checkout")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    if shutil.which("valgrind") is None:
        print("valgrind not found", file=sys.stderr)
        return 2
    roots = [("this", BENCH.parent)]
    if args.base is not None:
        roots.append(("base", args.base.resolve()))
    print(f"{'checkout':<9} " + " ".join(f"{p:>13}" for p in PATHS) + "  (instructions per SEND)")
    for name, root in roots:
        cells = []
        for path in PATHS:
            empty = instructions(root, path, 0)
            cells.append((instructions(root, path, args.rounds) - empty) / (args.rounds * FRAMES))
        print(f"{name:<9} " + " ".join(f"{c:>13,.0f}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
