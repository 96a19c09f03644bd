"""Pattern joins: what they cost the push path, channel creation and a hostile regex.

Three tables, each tree (this one, and ``--baseline CHECKOUT``) measured in its own
process in alternating turns (``PYTHONPATH``; this bench's ``call_count`` is used for
both):

1. Python calls per push on the sans-IO engine (``cProfile``, summed per code object):
   a plain push to an existing queue, one with a ``Trace`` header, and a push that
   creates its channel -- unchanged or fewer is the goal (no pattern join registered).
2. Python calls per channel created while 0 / 16 / 160 pattern joins (none matching)
   are registered (this tree only: the base has no pattern joins).
3. CPU seconds (``time.process_time``) of the worst ``{regex}`` forms against a
   255-character name segment that nearly matches: this tree refuses the catastrophic
   ones at parse time; the base's STOMP parser compiled them (run with small sizes so
   it ends).

    python bench/bench_patterns.py [--baseline /work/wt/base17] [--turns 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

_PROBE = r"""
import cProfile, json, sys, time
sys.path.insert(0, sys.argv[1])
from call_count import python_calls
from broker import tmqp
from broker.engine.engine import Engine
from broker.protocol import ConnectionInfo, MessageType, Operation, Header

N = 2000
results = {}

def frame(target, mid, headers=()):
    return tmqp.Frame(message_type=MessageType.QUEUE, content_type=1, message_id=mid,
                      target=target, headers=headers, payload=b"x" * 100)

def per_push(name, make):
    engine = Engine()
    cid, _ = engine.connect(ConnectionInfo(), 1.0)
    consumer, _ = engine.connect(ConnectionInfo(), 1.0)
    engine.receive(cid, frame("warm", "w0"), 1.0)
    frames = [make(i) for i in range(N)]
    prof = cProfile.Profile()
    prof.enable()
    for f in frames:
        engine.receive(cid, f, 1.0)
    prof.disable()
    results[name] = python_calls(prof) / N

per_push("plain push, existing queue", lambda i: frame("warm", f"p{i}"))
per_push("push with a Trace header", lambda i: frame("warm", f"h{i}", (("Trace", "t"),)))
per_push("push creating its channel", lambda i: frame(f"new.{i}", f"c{i}"))

try:
    from broker.engine.patterns import PatternJoin, parse
except ImportError:
    parse = None
def creations(name):
    engine = Engine()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(N):
        engine.create_channel(f"made.{i}")
    prof.disable()
    results[name] = python_calls(prof) / N

creations("channel created, no pattern join")
if parse is not None:
    for joins in (16, 160):
        engine = Engine()
        cid, _ = engine.connect(ConnectionInfo(), 1.0)
        patterns = engine.channel_registry.patterns
        for k in range(joins):
            patterns.add(f"c{k // 16}", PatternJoin(parse(f"other{k}.*.{{[0-9]+}}"), None))
        prof = cProfile.Profile()
        prof.enable()
        for i in range(N):
            engine.create_channel(f"made.{i}")
        prof.disable()
        results[f"channel created, {joins} pattern joins"] = python_calls(prof) / N

if parse is not None:
    from broker.engine.errors import PatternError
    worst = {}
    name = "a" * 254 + "b"
    for text in ("{a*a*}", "{(?:a|aa)(?:a|aa)(?:a|aa)(?:a|aa)a*a*}", "**.{a*a*}", "{(a+)+c}"):
        try:
            p = parse(text)
        except PatternError:
            worst[text] = "refused"
            continue
        started = time.process_time()
        for _ in range(10):
            p.matches(name)
        worst[text] = round((time.process_time() - started) / 10, 4)
    results["regex"] = worst
else:
    import re
    from broker.stomp.destinations import compile_pattern
    worst = {}
    for n in (18, 21, 24):
        p = compile_pattern("{(a+)+c}")
        started = time.process_time()
        p.matches("a" * n + "b")
        worst[f"{{(a+)+c}} vs {n} a's"] = round(time.process_time() - started, 4)
    results["regex"] = worst
print(json.dumps(results))
"""


def probe(tree: Path) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(HERE)],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--turns", type=int, default=2)
    args = parser.parse_args()
    mine = HERE.parent
    print(f"load: {os.getloadavg()[0]:.2f}")
    for turn in range(args.turns):
        trees = [("yours", mine)]
        if args.baseline is not None:
            trees.insert(turn % 2, ("base", args.baseline))
        for label, tree in trees:
            print(f"turn {turn + 1} {label}: {json.dumps(probe(tree))}", flush=True)
    print(f"load: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
