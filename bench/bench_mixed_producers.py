"""A STOMP ``/queue/`` fed by both doors at once, its ``ack:auto`` consumer lagging: the
engine's CPU and Python calls per message, several checkouts in turns (session 22,
mixed22).

One engine in this process, driven as its thread is (no sockets: the figures are the
engine's alone): per round a run of ``--run`` SENDs of the STOMP producer (the door's
own ids ``<id_prefix>1-<n>``, one header block: ``publish_many(..., unique_ids=True)``,
as the door hands them over), then ``--tmqp`` pushes of a TMQP producer (its own ids),
then the consumer's transport takes what it was sent but the last ``--lag`` deliveries
(``Engine.transmitted``: a reader always that far behind).  While AUTO deliveries
(``broker.engine.flow``) are in flight each TMQP message reaches ``Dispatcher.send``;
e8c0749 made them all tracked first there (a pass over the consumer's in-flight
deliveries, a ``pending`` entry each), mixed22 only for an id that begins with a door's
prefix.

Each checkout runs in its own process (``PYTHONPATH``), in alternating turns: CPU per
message (``time.process_time``, best of ``--repeat``), Python calls per message
(cProfile, deterministic), and the STOMP producer's messages tracked in flight
(``pending`` entries of the door's ids, counted after each round's pushes: 0 while
they all go as AUTO deliveries).  ``--window`` below lag + a round: messages wait in
the queue, and those the drain sends later are tracked on every checkout (a TMQP push
ends the queue's stretch of unique ids: ``Dispatcher.taking_for``).

Usage: ``python bench/bench_mixed_producers.py --tree NAME=DIR ... [--turns 2]
[--rounds 2000] [--run 8] [--tmqp 2] [--lag 64] [--window W]``; no ``--tree``: this checkout alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHANNEL = "mixed"


def _child(
    rounds: int, run: int, tmqp: int, lag: int, window: int, repeat: int
) -> dict[str, float]:
    """One checkout's figures (run in a process whose ``PYTHONPATH`` names it)."""
    import cProfile

    from call_count import python_calls

    from broker.engine.engine import Engine
    from broker.engine.flow import unsent_deliveries
    from broker.message import Message
    from broker.protocol import ConnectionInfo
    from broker.stomp.engine_door import EngineDoor
    from broker.stomp.engine_mapping import QUEUE_OPTIONS

    def once(profile: cProfile.Profile | None) -> tuple[float, int, int]:
        engine = Engine()
        door = EngineDoor(engine)  # (the per-message handler; mixed22: its prefix)
        prefix = getattr(door, "id_prefix", "s000000-")
        engine.create_channel(CHANNEL)
        engine.create_queue(CHANNEL, 0, QUEUE_OPTIONS)
        stomp, _ = engine.connect(ConnectionInfo(client_id="stomp-producer"), 0.0)
        client = engine.clients[stomp]
        if hasattr(client, "own_ids"):
            client.own_ids = True  # (as the door marks its connections)
        tmqp_producer, _ = engine.connect(ConnectionInfo(client_id="tmqp-producer"), 0.0)
        consumer, _ = engine.connect(ConnectionInfo(client_id="consumer"), 0.0)
        engine.subscribe(consumer, CHANNEL, 0.0, prefetch=window or 2 * lag + run + tmqp)
        assert engine.acknowledge_taken(consumer, CHANNEL, runs=True)
        reader = engine.clients[consumer]
        queue = engine.channels[CHANNEL].queues[0]
        headers = (("Stomp-User", "p"),)
        n = 0
        door_tracked = 0
        start = time.process_time()
        if profile is not None:
            profile.enable()
        for r in range(rounds):
            sends = []
            for _ in range(run):
                n += 1
                sends.append(
                    Message(f"{prefix}1-{n}", "p", CHANNEL, 0, headers=headers, payload=b"x" * 100)
                )
            engine.publish_many(stomp, sends, 0.0, unique_ids=True)
            for k in range(tmqp):
                m = Message(f"tmqp-{r}-{k}", "t", CHANNEL, 0, payload=b"y" * 100)
                engine.publish_many(tmqp_producer, [m], 0.0)
            door_tracked += sum(1 for _, mid in queue.pending if mid.startswith(prefix))
            behind = unsent_deliveries(reader) - lag
            if behind > 0:
                engine.transmitted({consumer: behind}, 0.0)
        if profile is not None:
            profile.disable()
        cpu = time.process_time() - start
        while unsent_deliveries(reader):  # (each take lets the queue send more)
            engine.transmitted({consumer: unsent_deliveries(reader)}, 0.0)
        assert queue.message_count == 0 and not queue.pending, "the bench lost messages"
        assert engine.errors == 0
        door.close()
        return cpu, door_tracked, n + rounds * tmqp

    best = min(once(None)[0] for _ in range(repeat))
    prof = cProfile.Profile()
    _, door_tracked, messages = once(prof)
    calls = python_calls(prof)
    return {
        "cpu_us": best / messages * 1e6,
        "calls": calls / messages,
        "door_tracked_per_round": door_tracked / rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--run", type=int, default=8, help="STOMP SENDs per round")
    parser.add_argument("--tmqp", type=int, default=2, help="TMQP pushes per round")
    parser.add_argument("--lag", type=int, default=64, help="deliveries the reader lags")
    parser.add_argument(
        "--window", type=int, default=0, help="the consumer's (0: room for a round past the lag)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="CPU: best of this many")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.repeat, args.turns = 200, 1, 1
    if args.child:
        figures = _child(args.rounds, args.run, args.tmqp, args.lag, args.window, args.repeat)
        print(json.dumps(figures))
        return 0
    trees = []
    for spec in args.tree or [f"this={HERE.parent}"]:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path, "broker").is_dir():
            print(f"bench_mixed_producers: --tree wants NAME=CHECKOUT, got {spec!r}")
            return 2
        trees.append((name, str(Path(path).resolve())))
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at start")
    print(
        f"{args.rounds} rounds of {args.run} STOMP SENDs + {args.tmqp} TMQP pushes, "
        f"reader {args.lag} deliveries behind, window {args.window or 'a round past that'}"
    )
    rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for turn in range(args.turns):
        for name, path in trees:
            env = dict(os.environ, PYTHONPATH=f"{path}{os.pathsep}{HERE}")
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
            cmd += ["--rounds", str(args.rounds), "--run", str(args.run)]
            cmd += ["--tmqp", str(args.tmqp), "--lag", str(args.lag)]
            cmd += ["--window", str(args.window), "--repeat", str(args.repeat)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"bench_mixed_producers: {name} failed: {done.stderr.strip()[-300:]}")
                return 1
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            rows[name].append(figures)
            print(
                f"turn {turn + 1} {name:<10} CPU {figures['cpu_us']:7.2f} us/msg  "
                f"calls {figures['calls']:7.1f}/msg  "
                f"door tracked {figures['door_tracked_per_round']:7.1f}/round"
            )
    print(f"load: {os.getloadavg()[0]:.2f} (1 min) at end")
    print()
    print("| tree | CPU us/msg (best turn) | Python calls/msg | door ids pending/round |")
    print("|---|---:|---:|---:|")
    for name, figures in rows.items():
        print(
            f"| {name} | {min(f['cpu_us'] for f in figures):.2f} | "
            f"{figures[0]['calls']:.1f} | {figures[0]['door_tracked_per_round']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
