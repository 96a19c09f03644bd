"""Codec throughput: generated encode+decode vs hand-written struct code, same run.

    python bench/bench_codec.py [--quick]

For each message the baseline packs and unpacks the same fields with struct and
slicing only (no validation, no objects), which is the floor a Python codec can
approach. Prints msgs/s for both and the ratio.
"""

from __future__ import annotations

import argparse
import struct
import time
from collections.abc import Callable

from broker import tmqp
from filemq import fmq_msg

_NOM = struct.Struct(">BBBQQ")
_CHEEZ_HEAD = struct.Struct(">BBBQBB")
_CHEEZ_MID = struct.Struct(">QB")
_U32 = struct.Struct(">I")
_U8 = struct.Struct(">B")
_TMQP = struct.Struct("<BBBBBHB")


def _rate(fn: Callable[[], object], seconds: float) -> float:
    """Calls per second of fn, best of three timed rounds."""
    n = 1
    while True:  # calibrate
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start > seconds / 10:
            break
        n *= 2
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short timing rounds")
    args = parser.parse_args()
    seconds = 0.05 if args.quick else 0.5

    nom = fmq_msg.Nom(credit=1 << 20, sequence=42)

    def gen_nom() -> object:
        return fmq_msg.decode(fmq_msg.encode(nom))

    def raw_nom() -> object:
        raw = _NOM.pack(0xAA, 0xA3, 7, 1 << 20, 42)
        return _NOM.unpack_from(raw, 0)

    chunk = bytes(65536)
    name = "photos/2026/cat.jpg"
    cheez = fmq_msg.Cheezburger(
        sequence=9, operation=1, filename=name, offset=1 << 20, eof=0, headers={}, chunk=chunk
    )

    def gen_cheez() -> object:
        return fmq_msg.decode(fmq_msg.encode(cheez))

    def raw_cheez() -> object:
        fname = name.encode()
        raw = b"".join(
            (
                _CHEEZ_HEAD.pack(0xAA, 0xA3, 8, 9, 1, len(fname)),
                fname,
                _CHEEZ_MID.pack(1 << 20, 0),
                _U32.pack(0),
                _U32.pack(len(chunk)),
                chunk,
            )
        )
        seq, op, n = _CHEEZ_HEAD.unpack_from(raw, 0)[3:]
        pos = 13 + n
        fn = raw[13:pos].decode()
        off, eof = _CHEEZ_MID.unpack_from(raw, pos)
        pos += 13
        (size,) = _U32.unpack_from(raw, pos)
        return seq, op, fn, off, eof, raw[pos + 4 : pos + 4 + size]

    frame = tmqp.Frame(
        message_type=0x11,
        pending_ack=True,
        content_type=1,
        message_id="m-000042",
        source="producer-1",
        target="orders",
        payload=b"x" * 100,
    )

    def gen_tmqp() -> object:
        return tmqp.decode(tmqp.encode(frame))

    def raw_tmqp() -> object:
        mid, src, tgt, payload = b"m-000042", b"producer-1", b"orders", b"x" * 100
        raw = b"".join(
            (
                _TMQP.pack(0x11, 0x40 | 16, len(mid), len(src), len(tgt), 1, len(payload)),
                mid,
                src,
                tgt,
                payload,
            )
        )
        b0, b1, a, b, c, ct, plen = _TMQP.unpack_from(raw, 0)
        pos = 8
        out = []
        for n in (a, b, c):
            out.append(raw[pos : pos + n].decode())
            pos += n
        return b0 & 63, b1 & 31, ct, out, raw[pos : pos + plen]

    rows = [
        ("FILEMQ NOM (19 B)", gen_nom, raw_nom),
        ("FILEMQ CHEEZBURGER 64 KiB", gen_cheez, raw_cheez),
        ("TMQP frame, 100 B payload", gen_tmqp, raw_tmqp),
    ]
    print(
        f"{'message (encode+decode)':<28} {'zproto msgs/s':>14} {'struct msgs/s':>14} {'ratio':>7}"
    )
    for label, gen, raw in rows:
        assert gen() is not None and raw() is not None
        g, r = _rate(gen, seconds), _rate(raw, seconds)
        print(f"{label:<28} {g:>14,.0f} {r:>14,.0f} {g / r:>7.2f}")


if __name__ == "__main__":
    main()
