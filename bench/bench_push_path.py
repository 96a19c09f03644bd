"""CPU per plain push from a run's octets to the engine's output, the two paths in turns.

* ``frames``: each push decoded to a ``tmqp.Frame`` and handed to ``Engine.receive_batch``
  as (index, frame, octets) -- the path of a TMQP batch whose entries are not all plain
  pushes, and of every run before session 11;
* ``records``: ``tmqp.decode_message_records`` straight into the engine's messages, then
  ``Engine.receive_pushes`` -- the server's path for a drain's plain pushes (before
  session 18; still that of a run the octets path does not take);
* ``octets``: the run's octets to ``Engine.receive_push_octets`` (session 18), which
  delivers each push as the octets it came in (``broker.engine.octets_run``) -- the
  server's path for a drain's plain pushes into a queue with one consumer with room.

One engine, one queue, one consumer, 256 pushes of 100 octets per run, its flow report
(``Engine.transmitted``) after each run; CPU time (``time.process_time``) of this process,
the two paths taking turns.  No socket: this is the Python work per push that the broker
adds on top of its receives and sends.  For callgrind (deterministic instruction counts):
``valgrind --tool=callgrind python bench/bench_push_path.py --turns 1 --only records``.

Usage: ``python bench/bench_push_path.py [--runs N] [--turns K] [--only frames|records|octets]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker import tmqp
from broker.engine.engine import Engine
from broker.engine.tmqp_door import WIRE
from broker.message import Message
from broker.protocol import MessageType
from tests.broker.engine_kit import Kit

RUN = 256
PAYLOAD = b"x" * 100


def _engine() -> Engine:
    kit = Kit()
    kit.connect("c")
    kit.connect("p")
    kit.queue("c", "ch", 1)
    kit.join("c", "ch")
    return kit.engine


def _runs(count: int, ids: itertools.count[int]) -> list[list[bytes]]:
    return [
        [
            tmqp.encode_frame(message_type=MessageType.QUEUE, message_id=f"p-{next(ids)}",
                              source="p", target="ch", content_type=1, payload=PAYLOAD)[0]
            for _ in range(RUN)
        ]
        for _ in range(count)
    ]  # fmt: skip


def frames(engine: Engine, runs: list[list[bytes]]) -> float:
    decode = tmqp.decode
    start = time.process_time()
    for datas in runs:
        items = [(0, decode((d,)), d) for d in datas]
        outs = engine.receive_batch("p", items, 1.0)[0]  # type: ignore[arg-type]
        engine.transmitted({"c": len(outs)}, 1.0)
    return time.process_time() - start


def records(engine: Engine, runs: list[list[bytes]]) -> float:
    start = time.process_time()
    for datas in runs:
        messages, _bad = tmqp.decode_message_records(datas, Message, WIRE)
        outs = engine.receive_pushes("p", messages, 1.0)
        engine.transmitted({"c": len(outs)}, 1.0)
    return time.process_time() - start


def octets(engine: Engine, runs: list[list[bytes]]) -> float:
    readers = {"c"}
    start = time.process_time()
    for datas in runs:
        taken, outs = engine.receive_push_octets("p", datas, 1.0, readers)
        assert taken == len(datas)
        engine.transmitted({"c": len(outs)}, 1.0)
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs of 256 pushes per turn")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--only", choices=("frames", "records", "octets"))
    args = parser.parse_args(argv)
    paths = {"frames": frames, "records": records, "octets": octets}
    if args.only:
        paths = {args.only: paths[args.only]}
    ids = itertools.count()
    got: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.turns):
        for name, path in paths.items():
            engine = _engine()
            used = path(engine, _runs(args.runs, ids))
            got[name].append(used / (args.runs * RUN) * 1e6)
    print(f"{'path (CPU us per push)':<24} turns")
    for name, runs in got.items():
        print(f"{name:<24} {' / '.join(f'{v:.2f}' for v in runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
