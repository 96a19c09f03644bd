"""CPU per delivery of the server's send path: ``SendPath.send_now`` + ``flush_out`` for
runs of 256 plain deliveries of 100 octets to one consumer that reads delivery batches
(the server's defaults: ``unacked_batch`` 64, ``unacked_batch_octets`` 2 KiB, so ~13 per
batch), as a drain's run leaves the engine.  No socket: libzmq's send is replaced by a
counter, so this is the Python work per delivery (grouping, the batch's encoding, the
count of what was sent), what ``bench_broker.py``'s push rows pay beside the receive,
the decode and the engine.

``--base DIR``: the same measurement of another checkout (its ``broker`` package), in a
child process, taking turns with this tree.  For deterministic counts run one turn under
callgrind (``valgrind --tool=callgrind python bench/bench_send_path.py --turns 1``) with
two ``--runs`` values and divide the difference.

``--octets``: the deliveries as the octets they came in (``Tracked(consumer, bytes)``, what
the session-18 octets path outputs: ``broker.engine.octets_run``), this tree only.

Usage: ``python bench/bench_send_path.py [--runs N] [--turns K] [--base DIR] [--octets]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

RUN = 256
PAYLOAD = b"x" * 100


def measure(runs: int, as_octets: bool = False) -> float:
    """CPU us per delivery of ``runs`` runs through one SendPath (this process's
    ``broker``; ``as_octets``: deliveries as bytes, not messages)."""
    from broker import tmqp
    from broker.engine.tmqp_door import WIRE
    from broker.message import Message
    from broker.protocol import MessageType, Tracked
    from broker.server.options import ServerOptions
    from broker.server.send import Peer, PeerState, SendPath

    sends = [0]

    def send(data: bytes, flags: int = 0) -> None:
        sends[0] += 1

    path = SendPath(ServerOptions())
    path.fast_send = send
    peer = Peer(b"\x00rid1", 0.0)
    peer.client_id = "consumer"
    peer.state = PeerState.READY
    peer.batch = 1024  # (what the client announces: Batch-Deliveries)
    path.by_client[peer.client_id] = peer
    path.batching = 1
    octets = [
        tmqp.encode_frame(message_type=MessageType.QUEUE, content_type=1, message_id=f"m{i}",
                          source="producer", target="bench", payload=PAYLOAD)[0]
        for i in range(RUN)
    ]  # fmt: skip
    messages, bad = tmqp.decode_message_records(octets, Message, WIRE)
    assert not bad
    outs = [
        Tracked(peer.client_id, d if as_octets else m)
        for d, m in zip(octets, messages, strict=True)
    ]
    cpu = time.process_time()
    for _ in range(runs):
        path.send_now(outs)
        path.flush_out()
        path.take_transmitted()
    used = time.process_time() - cpu
    assert sends[0] > 0
    return used / max(1, runs * RUN) * 1e6


def _child(base: str, runs: int, as_octets: bool = False) -> float:
    env = dict(os.environ, PYTHONPATH=base)
    octets = ["--octets"] if as_octets else []
    out = subprocess.run(
        [sys.executable, __file__, "--runs", str(runs), "--one", *octets],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return float(out.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs of 256 deliveries per turn")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--base", metavar="DIR", help="another checkout, measured in turns")
    parser.add_argument("--octets", action="store_true", help="also: deliveries as octets")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.turns < 1:
        print("bench_send_path: --runs and --turns must be at least 1", file=sys.stderr)
        return 2
    if args.one:  # (a child: this tree's or the base's broker, by PYTHONPATH)
        print(f"{measure(args.runs, args.octets):.4f}")
        return 0
    if args.base is not None and not (Path(args.base) / "broker").is_dir():
        print(f"bench_send_path: no broker package in {args.base}", file=sys.stderr)
        return 2
    here = str(Path(__file__).resolve().parent.parent)
    rows: dict[str, list[float]] = {"this tree": []}
    if args.octets:
        rows["this tree, deliveries as octets"] = []
    if args.base:
        rows["base"] = []
    for _ in range(args.turns):
        rows["this tree"].append(_child(here, args.runs))
        if args.octets:
            rows["this tree, deliveries as octets"].append(_child(here, args.runs, True))
        if args.base:
            rows["base"].append(_child(args.base, args.runs))
    print(f"{'send_now + flush_out, CPU us per delivery':<44} turns")
    for name, values in rows.items():
        print(f"{name:<44} {' / '.join(f'{v:.3f}' for v in values)}")
    print(f"load average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
