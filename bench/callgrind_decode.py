"""Instructions per decoded TMQP push (callgrind: deterministic), this checkout and, with
``--base PATH``, another one, for the three generated decoders a broker's receive uses.

* ``records``: ``tmqp.decode_message_records`` over runs of 16 (a server drain's pushes);
* ``decode``: ``tmqp.decode((frame,))`` one by one (a drain's first message, any frame);
* ``entries``: ``tmqp.decode_entries`` of a 16-entry batch payload.

The frames are what ``Client.push`` sends (the client's push encoder: 100-octet payload,
a source, a message id, a channel).  Each figure is (instructions of a run decoding
``--rounds`` x 16 frames - those of the same run decoding none) / frames, under
``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0``: it does not depend on the
machine's load.  Needs valgrind.

Usage: ``python bench/callgrind_decode.py [--rounds N] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: Run under callgrind with the checkout under test first on the path.
_DECODE = """
import sys
rounds, path, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
from broker import tmqp
from broker.client.frames import queue_senders
from broker.engine.tmqp_door import WIRE
from broker.message import Message
if not tmqp.__file__.startswith(root):
    raise SystemExit(f"measured another checkout: {tmqp.__file__}")
push = queue_senders("c-7f3a9e21")[0]
frames = [push(1, f"c-7f3a9e21-{k}", "bench", b"x" * 100)[0] for k in range(16)]
payload = b"".join(len(f).to_bytes(4, "little") + f for f in frames)
if path == "records":
    for _ in range(rounds):
        tmqp.decode_message_records(frames, Message, WIRE)
elif path == "decode":
    for _ in range(rounds):
        for f in frames:
            tmqp.decode((f,))
else:
    for _ in range(rounds):
        tmqp.decode_entries(payload, 1024)
"""

PATHS = ("records", "decode", "entries")


def instructions(root: Path, path: str, rounds: int) -> int:
    """Instructions callgrind collected running ``_DECODE`` for ``path`` ``rounds`` times."""
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=str(root))
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               sys.executable, "-c", _DECODE, str(rounds), path, str(root)]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed for {root} {path}: {done.stderr.strip()[-300:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--base", type=Path, default=None, help="another checkout")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    if shutil.which("valgrind") is None:
        print("valgrind not found", file=sys.stderr)
        return 2
    roots = [("this", Path(__file__).resolve().parent.parent)]
    if args.base is not None:
        roots.append(("base", args.base.resolve()))
    print(f"{'checkout':<9} " + " ".join(f"{p:>9}" for p in PATHS) + "  (instructions per frame)")
    for name, root in roots:
        cells = []
        for path in PATHS:
            empty = instructions(root, path, 0)
            cells.append((instructions(root, path, args.rounds) - empty) / (args.rounds * 16))
        print(f"{name:<9} " + " ".join(f"{c:>9,.0f}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
