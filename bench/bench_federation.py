"""Messages/s through one federation link, beside the same traffic without it (same run).

Real ``broker serve`` processes on loopback TCP, 100-byte messages:

* direct: producer and consumer on broker A (no link involved; B runs but nobody on it
  wants the channel);
* link: producer on A, consumer on B, ``A --link B`` (A's federation client takes each
  message, forwards it to B's, which pushes it into B's queue);

for a Broadcast queue (no acknowledges; the producer's pushes fire-and-forget, its last
one acknowledged) and a persistent queue (``--data``, every push acknowledged, the
consumer acknowledges; across the link A's queue lets go of a message only once B
confirmed it).  Time: from the first push to the last delivery at the consumer.

A fire-and-forget broadcast burst larger than the federation's ``max_pending`` (10,000)
is partly dropped by design (counted): the broadcast run stays under it.

Usage: ``python bench/bench_federation.py [--messages N]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client.blocking import Message
from tests.federation.kit import Broker, wait_interest, wait_joined

PAYLOAD = b"x" * 100
BROADCAST = {"Status": "Broadcast"}
PERSISTENT = {"MessageDeliveryHandler": "persistent", "RequestAcknowledge": True}
WINDOW = 256  # acknowledged pushes in flight (persistent rows)


def run(
    ctx: zmq.Context[zmq.Socket[bytes]],
    producer_at: Broker,
    consumer_at: Broker,
    channel: str,
    options: dict[str, object],
    n: int,
    link_from: Broker | None,
) -> float:
    sub = consumer_at.client(ctx)
    pub = producer_at.client(ctx)
    for client in (sub, pub) if consumer_at is not producer_at else (sub,):
        client.create_queue(channel, 0, options)
    count = 0
    done = threading.Event()
    acks = bool(options.get("RequestAcknowledge"))

    def take(m: Message) -> None:
        nonlocal count
        if acks:
            sub.ack(m)
        count += 1
        if count >= n:
            done.set()

    sub.on_message(take)
    sub.join(channel)
    if link_from is not None:
        wait_joined([pub], channel, 1)
        wait_interest(pub, {consumer_at.id}, channel)
    start = time.perf_counter()
    if acks:
        inflight = []
        for _ in range(n):
            inflight.append(pub.push_async(channel, 0, PAYLOAD))
            if len(inflight) >= WINDOW:
                inflight.pop(0).result(60)
        for f in inflight:
            f.result(60)
    else:
        for _ in range(n - 1):
            pub.push(channel, 0, PAYLOAD)
        pub.push(channel, 0, PAYLOAD, ack=True)
    if not done.wait(60):
        print(f"  {channel}: only {count} of {n} arrived", file=sys.stderr)
        from tests.federation.kit import federation_stats

        for c in (pub, sub):
            print("  ", federation_stats(c), file=sys.stderr)
    elapsed = time.perf_counter() - start
    sub.close()
    pub.close()
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    n = args.messages
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        b = Broker("B", data=Path(tmp) / "b")
        a = Broker("A", data=Path(tmp) / "a")
        b.start()
        a.start(a.link(b))
        try:
            rows = []
            for label, options, count in (
                # a fire-and-forget burst beyond the federation's max pending (10,000)
                # is dropped by design: keep the broadcast run under it
                ("broadcast", BROADCAST, min(n, 8_000)),
                ("persistent", PERSISTENT, max(1, n // 4)),
            ):
                direct = run(ctx, a, a, f"direct-{label}", options, count, None)
                linked = run(ctx, a, b, f"linked-{label}", options, count, a)
                rows.append((label, count, direct, linked))
        finally:
            a.stop()
            b.stop()
    ctx.destroy(linger=0)
    print(
        f"{'queue':<12} {'messages':>9} {'direct msg/s':>13} {'via link msg/s':>15} {'ratio':>6}"
    )
    for label, count, direct, linked in rows:
        print(f"{label:<12} {count:>9} {direct:>13,.0f} {linked:>15,.0f} {linked / direct:>6.2f}")


if __name__ == "__main__":
    main()
