"""Reading a batch of deliveries (``broker.batch``, content type 261): split with
``batch.unpack`` and each entry decoded with ``tmqp.decode`` (before session 9) against
``tmqp.decode_entries`` (each entry decoded where it lies), in one process, taking turns.

Per delivery: CPU microseconds (best of ``--repeat``) and Python-level calls (cProfile,
a count: it does not depend on the load).  Entries: 100-octet QUEUE deliveries as the
broker sends them (message id, source, target), ``--entries`` per batch (15: what a
2 KiB bound gives them); ``--size``: other payloads (4096: a 4 KiB push, its length in
the three-octet form), and the row ``decode_message_records`` (the server's run of
single pushes, ``broker.server.server``).  Against another checkout: the same command
with ``PYTHONPATH=THAT_TREE``, taking turns.

Usage: ``python bench/bench_entries.py [--entries N] [--size N] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections.abc import Callable
from typing import Any

from call_count import python_calls

from broker import batch, tmqp
from broker.engine.tmqp_door import WIRE
from broker.message import Message


def frames_of(entries: int, size: int = 100) -> list[bytes]:
    return [
        tmqp.encode_frame(message_type=2, content_type=1, message_id=f"m-{i:020d}",
                          source="producer-1", target="bench", payload=b"x" * size)[0]
        for i in range(entries)
    ]  # fmt: skip


def payload_of(entries: int, size: int = 100) -> bytes:
    return batch.pack(frames_of(entries, size))


def records(payload: bytes) -> list[Any]:
    """``decode_message_records`` of the entries (split outside the loop: ``_SPLIT``)."""
    return tmqp.decode_message_records(_SPLIT[payload], Message, WIRE)[0]


#: each payload's entries, split once (the server gets its single pushes apart)
_SPLIT: dict[bytes, list[bytes]] = {}


def split_then_decode(payload: bytes) -> list[Any]:
    decode = tmqp.decode
    return [decode((data,)) for data in batch.unpack(payload, batch.DEFAULT_MAX_FRAMES)]


def in_place(payload: bytes) -> list[Any]:
    return tmqp.decode_entries(payload, batch.DEFAULT_MAX_FRAMES)


def cpu_us(fn: Callable[[bytes], list[Any]], payload: bytes, entries: int, loops: int) -> float:
    t0 = time.process_time()
    for _ in range(loops):
        fn(payload)
    return (time.process_time() - t0) / (loops * entries) * 1e6


def calls(fn: Callable[[bytes], list[Any]], payload: bytes, entries: int) -> float:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        fn(payload)
    prof.disable()
    total = python_calls(prof, lambda _file, name: "disable" in name)
    return total / (100 * entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=15)
    parser.add_argument("--size", type=int, default=100, help="payload octets")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    payload = payload_of(args.entries, args.size)
    _SPLIT[payload] = batch.unpack(payload, batch.DEFAULT_MAX_FRAMES)
    assert [f.payload for f in in_place(payload)] == [
        f.payload for f in split_then_decode(payload)
    ]
    loops = max(1, 200_000 // args.entries)
    rows = (
        ("batch.unpack + tmqp.decode each", split_then_decode),
        ("tmqp.decode_entries", in_place),
        ("tmqp.decode_message_records", records),
    )
    best = {name: float("inf") for name, _ in rows}
    for _ in range(args.repeat):  # taking turns
        for name, fn in rows:
            best[name] = min(best[name], cpu_us(fn, payload, args.entries, loops))
    title = f"{args.entries} deliveries of {args.size} B per batch"
    print(f"\n{title:<35} {'CPU us/delivery':>16} {'calls/delivery':>15}")
    for name, fn in rows:
        print(f"{name:<35} {best[name]:>16.3f} {calls(fn, payload, args.entries):>15.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
