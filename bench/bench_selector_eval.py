"""CPU per selector evaluation over a message's headers, this checkout against another.

What a consumer's selector costs per message offered to it (``broker.selector``; the
module lived in ``broker/stomp/selector.py`` before session 17, and this bench finds it
in either place).  Each selector is evaluated ``--count`` times over one header block of
three lines (headers as a message carries them, read first-wins into a mapping as the
doors do); best of ``--repeat``, CPU time (``time.process_time``).  ``--baseline
CHECKOUT`` measures another checkout in a child process, the two in alternating turns.

Usage: ``python bench/bench_selector_eval.py [--count N] [--repeat R] [--turns K]
[--baseline CHECKOUT]``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from checkout_child import child_result

HEADERS = (("region", "eu"), ("priority", "7"), ("name", "O'Brien"))
SELECTORS = {
    "comparison": "priority > 5",
    "and-of-two": "priority > 5 AND region = 'eu'",
    "or-of-four": "region = 'us' OR region = 'ca' OR region = 'mx' OR region = 'eu'",
    "arithmetic": "priority * 2 - 1 > 10",
    "like": "name LIKE 'O%n'",
}


def measure(count: int, repeat: int) -> dict[str, float]:
    try:
        module = importlib.import_module("broker.selector")
    except ImportError:  # before session 17
        module = importlib.import_module("broker.stomp.selector")
    parse = module.parse_selector
    result = {}
    for name, text in SELECTORS.items():
        selector = parse(text)
        best = float("inf")
        for _ in range(repeat):
            start = time.process_time()
            for _ in range(count):
                env: dict[str, str] = {}
                for key, value in HEADERS:
                    env.setdefault(key, value)
                selector.matches(env)
            best = min(best, time.process_time() - start)
        result[name] = best / count * 1e6
    return result


def _run(checkout: str, count: int, repeat: int) -> dict[str, float]:
    return child_result(__file__, checkout, "--count", str(count), "--repeat", str(repeat))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another checkout (e.g. main)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeat < 1 or args.turns < 1:
        parser.error("--count, --repeat and --turns must be at least 1")
    if args.child:
        print(json.dumps(measure(args.count, args.repeat)))
        return 0
    here = str(Path(__file__).resolve().parent.parent)
    print(f"{'selector (CPU us per evaluation)':34} {'turn':>4} {'this':>7} {'baseline':>9}")
    for turn in range(1, args.turns + 1):
        base: dict[str, float] = {}
        if args.baseline and turn % 2:
            base = _run(args.baseline, args.count, args.repeat)
        mine = _run(here, args.count, args.repeat)
        if args.baseline and not turn % 2:
            base = _run(args.baseline, args.count, args.repeat)
        for name, us in mine.items():
            other = base.get(name)
            shown = f"{other:9.3f}" if other is not None else ""
            print(f"{name:34} {turn:>4} {us:7.3f} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
