"""The message API's decode of a fan-out run, in one process: CPU per delivery.

A run as the broker sends it (``broker.fanout.pack_run``: 256 deliveries of 100 B,
``bench_broker.PAYLOAD``, the ids and names a bench push carries) decoded by

* ``decode`` of each delivery (what the reader did up to session 9: the baseline),
* ``tmqp.decode_run`` (zproto ``runs = "1"``: checked, payload sliced, the rest lazy),
  then reading nothing, the payloads, or the payloads and ids of every delivery
  (the ids: every lazy field of the run decoded at the first read), and with
  ``lazy=False`` (what the reader does after it saw the application read fields),
* and, apart, six field reads of each delivery already decoded (the cost of reading a
  ``Frame``'s fields: lazyfix10 took ``__getattr__`` off ``Frame``, which had made every
  such read go through CPython's slow hook, ~4x).

Each row is the best of ``--repeat`` passes of thread CPU (``time.thread_time``), rows
taking turns ``--rounds`` times; beside it the Python calls per delivery (cProfile).

Usage: ``python bench/bench_fanout_decode.py [--runs 200] [--repeat 5] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from call_count import python_calls

from broker import tmqp
from broker.fanout import RUN_MAX, TABLE_AT, head, pack_run, table


def _run() -> tuple[bytes, int, tuple[int, ...]]:
    frame = tmqp.Frame(message_type=2, content_type=1, message_id="0a1b2c3d-17",
                       source="bench-producer-1", target="bench-fanout-messages-1",
                       payload=b"x" * 100)  # fmt: skip
    delivery = tmqp.encode(frame)[0]
    data = pack_run(head(bytes(16), 1), [delivery] * RUN_MAX, [100] * RUN_MAX)
    rows = table(RUN_MAX).unpack_from(data, TABLE_AT)
    return data, TABLE_AT + 8 * RUN_MAX, rows[1::2]


DATA, AT, ENDS = _run()


def each_decoded() -> None:
    decode = tmqp.decode
    at = AT
    for end in ENDS:
        decode((DATA[at:end],)).payload  # noqa: B018
        at = end


def run_nothing_read() -> None:
    tmqp.decode_run(DATA, AT, ENDS)


def run_payloads() -> None:
    for frame in tmqp.decode_run(DATA, AT, ENDS)[0]:
        frame.payload  # noqa: B018


def run_payloads_and_ids() -> None:
    for frame in tmqp.decode_run(DATA, AT, ENDS)[0]:
        frame.payload  # noqa: B018
        frame.message_id  # noqa: B018


def run_eager_payloads_and_ids() -> None:
    for frame in tmqp.decode_run(DATA, AT, ENDS, lazy=False)[0]:
        frame.payload  # noqa: B018
        frame.message_id  # noqa: B018


DECODED = [tmqp.decode((DATA[a:e],)) for a, e in zip((AT, *ENDS[:-1]), ENDS, strict=True)]


def decoded_six_fields_read() -> None:
    for frame in DECODED:
        frame.message_type  # noqa: B018
        frame.pending_ack  # noqa: B018
        frame.content_type  # noqa: B018
        frame.message_id  # noqa: B018
        frame.source  # noqa: B018
        frame.target  # noqa: B018


ROWS: list[tuple[str, Callable[[], None]]] = [
    ("decode each delivery (baseline)", each_decoded),
    ("decode_run, nothing read", run_nothing_read),
    ("decode_run, payloads read", run_payloads),
    ("decode_run, payloads + ids read", run_payloads_and_ids),
    ("decode_run lazy=False, same", run_eager_payloads_and_ids),
    ("decoded: 6 fields read", decoded_six_fields_read),
]


def cpu_per_delivery(fn: Callable[[], None], runs: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(runs):
            fn()
        best = min(best, (time.thread_time() - t0) / runs / RUN_MAX)
    return best * 1e6


def calls_per_delivery(fn: Callable[[], None]) -> float:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        fn()
    profile.disable()
    return python_calls(profile) / (10 * RUN_MAX)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs decoded per pass")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"one run of {RUN_MAX} x 100 B deliveries ({len(DATA)} octets), thread CPU")
    print(f"{'row':<34} {'round':>5} {'us/dlv':>7} {'x base':>6} {'calls/dlv':>9}")
    for round_ in range(1, args.rounds + 1):
        base = 0.0
        for name, fn in ROWS:
            us = cpu_per_delivery(fn, args.runs, args.repeat)
            base = base or us
            calls = calls_per_delivery(fn)
            print(f"{name:<34} {round_:>5} {us:>7.3f} {us / base:>5.2f}x {calls:>9.2f}")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())} (2 cores, shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
