"""Python calls per push through the engine's receive paths (cProfile: deterministic),
this checkout and, with ``--base PATH``, another one in turns (same run).

The happy path's cost of what an acknowledged batch's refusals ask of the engine
(session 15): one engine, a queue nobody reads, 100-octet pushes, nothing refused.
Columns (calls per push):

* ``pushes plain`` / ``pushes acked``: ``Engine.receive_pushes`` in runs of ``RUN`` (the
  server's drain runs; plain ones, ones waiting for an acknowledge);
* ``batch plain``: the same plain runs as an acknowledged batch of plain pushes is served
  (``receive_pushes`` with its ``refused`` list where the checkout has one);
* ``frames plain`` / ``frames acked``: ``Engine.receive_batch`` in runs of ``RUN``;
* ``one plain`` / ``one acked``: ``Engine.receive``, one push at a time;
* ``dsub plain`` / ``dsub acked``: the same into a channel with a durable subscription
  (each push copied into its queue: the general push path, session 16).

Usage: ``python bench/count_receive_paths.py [--pushes N] [--turns T] [--base PATH]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench_client_push import measure
from turn_table import Column, from_checkout, print_turns

#: Run in a fresh interpreter with the checkout under test first on the path.
_MEASURE = """
import cProfile, inspect, json, sys
from call_count import python_calls
import broker
from broker import tmqp
from broker.engine.engine import Engine
from broker.engine.tmqp_door import message_of
from broker.protocol import ConnectionInfo, MessageType

N = int(sys.argv[1])
RUN = 16
refusals = "refused" in inspect.signature(Engine.receive_pushes).parameters


def engine():
    e = Engine()
    cid, _ = e.connect(ConnectionInfo(client_id="p", name="p"), 1.0)
    first = tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, target="c",
                       message_id="first", payload=b"w")
    e.receive(cid, first, 1.0)  # (the queue made on the way, outside the count)
    return e, cid


def frames(ack, tag):
    return [tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, target="c",
                       pending_ack=ack, message_id=f"{tag}{k}", payload=b"x" * 100)
            for k in range(N)]


def calls(work):
    profile = cProfile.Profile()
    profile.enable()
    work()
    profile.disable()
    return python_calls(profile) / N


def chunks(xs):
    return [xs[i:i + RUN] for i in range(0, len(xs), RUN)]


out = {"broker": broker.__file__}
for ack, kind in ((False, "plain"), (True, "acked")):
    e, cid = engine()
    runs = chunks([message_of(f, tmqp.encode(f)[0]) for f in frames(ack, "r")])
    out[f"pushes {kind}"] = calls(lambda: [e.receive_pushes(cid, r, 1.0) for r in runs])
    if not ack:
        e, cid = engine()
        runs = chunks([message_of(f, tmqp.encode(f)[0]) for f in frames(ack, "b")])
        if refusals:
            work = lambda: [e.receive_pushes(cid, r, 1.0, []) for r in runs]
        else:
            work = lambda: [e.receive_pushes(cid, r, 1.0) for r in runs]
        out["batch plain"] = calls(work)
    e, cid = engine()
    items = chunks([(k, f, tmqp.encode(f)[0]) for k, f in enumerate(frames(ack, "f"))])
    out[f"frames {kind}"] = calls(lambda: [e.receive_batch(cid, r, 1.0) for r in items])
    e, cid = engine()
    singles = frames(ack, "o")
    out[f"one {kind}"] = calls(lambda: [e.receive(cid, f, 1.0) for f in singles])
    e, cid = engine()
    e.durable.create("d", ["c"], [])  # (every push copied into /dsub/d)
    singles = frames(ack, "d")
    out[f"dsub {kind}"] = calls(lambda: [e.receive(cid, f, 1.0) for f in singles])
print(json.dumps(out))
"""

_NAMES = ("pushes plain", "pushes acked", "batch plain", "frames plain", "frames acked",
          "one plain", "one acked", "dsub plain", "dsub acked")  # fmt: skip
COLUMNS = tuple(Column(name, name, ".2f", width=13) for name in _NAMES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=8_000)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--base", type=Path, default=None, help="another checkout, in turns")
    args = parser.parse_args(argv)
    if args.pushes < 1 or args.turns < 1:
        print("--pushes and --turns must be at least 1", file=sys.stderr)
        return 2

    def figures(root: Path) -> dict[str, float]:
        return from_checkout(root, measure(root, args.pushes, _MEASURE))

    print_turns(COLUMNS, args.base, args.turns, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
