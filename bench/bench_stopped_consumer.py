"""What a consumer that stops reading costs the broker: its RSS, one push queue with a
message limit, deliveries without acknowledge (100-byte messages, loopback TCP).

The broker (``broker.server.Server`` + ``Engine``, default options but for the row's
``unacked_batch``/``unacked_batch_octets``; the first row all the defaults, the send
high-water mark too) runs in its own process; a raw consumer joins
the queue, announcing ``Batch-Deliveries: 64`` as the Python client does, and reads
nothing; a producer pushes ``--messages`` (the queue takes ``--limit``, refuses the
rest); once the queue's sent count stops moving, the broker's RSS less its RSS before the
pushes is the row.  Rows take turns, ``--rounds`` times.

The reader's own receive pipe holds 1,000 messages (ZeroMQ's default); ``--client-pipe``:
what the Python client sets (10,000 before session 18, 1,428 since), so that the count
of deliveries libzmq took is the whole hold of a stopped Python client.

Usage: ``python bench/bench_stopped_consumer.py [--messages N] [--limit N] [--rounds N]
[--client-pipe] [--defaults-only]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import time
from pathlib import Path
from typing import Any

PAYLOAD = b"x" * 100
ROWS: tuple[tuple[str, int | None, int | None], ...] = (
    ("the server's defaults (unacked_batch, octets, send hwm)", None, None),
    ("one per message (unacked_batch 0: main's default)", 0, 2048),
    ("batched, 2 KiB bound (the default)", 64, 2048),
    ("batched, 8 KiB bound", 64, 8192),
    ("batched, 256 KiB bound (no octet bound)", 64, 256 * 1024),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def options_of(endpoint: str, unacked: int | None, octets: int | None, hwm: int) -> Any:
    """The row's ``ServerOptions`` (None: the server's default for that one)."""
    from broker.server.server import ServerOptions

    more: dict[str, int] = {}
    if unacked is not None:
        more["unacked_batch"] = unacked
    if octets is not None:
        more["unacked_batch_octets"] = octets
    return ServerOptions(endpoint=endpoint, hwm=hwm, **more)  # type: ignore[arg-type]


def send_hwm(options: Any) -> int:
    """The ROUTER's send high-water mark (``pipe_hwm``; a checkout before it: ``hwm``)."""
    return int(getattr(options, "pipe_hwm", options.hwm))


def serve(
    endpoint: str, unacked: int | None, octets: int | None, hwm: int, ready: Any, stop: Any
) -> None:
    import zmq

    from broker.engine.engine import Engine
    from broker.server.server import Server

    ctx = zmq.Context()
    options = options_of(endpoint, unacked, octets, hwm)
    with Server(Engine(), options, context=ctx):
        ready.set()
        stop.wait(600)
    ctx.term()


def client_pipe(hwm: int) -> int:
    """The receive high-water mark the Python client of this checkout sets for ``hwm``
    (``broker.client.sockets.receive_hwm``; a checkout before it: ``hwm``)."""
    from broker.client import sockets

    receive = getattr(sockets, "receive_hwm", None)
    return hwm if receive is None else int(receive(hwm))


def measure(
    ctx: Any,
    unacked: int | None,
    octets: int | None,
    messages: int,
    limit: int,
    hwm: int,
    reader_hwm: int = 1000,
) -> tuple[float, int]:
    import zmq

    from broker import tmqp
    from broker.client.blocking import Client
    from broker.protocol import GREETING, ConnectionInfo, MessageType

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    ready, stop = ctx.Event(), ctx.Event()
    broker = ctx.Process(target=serve, args=(endpoint, unacked, octets, hwm, ready, stop))
    broker.start()
    ready.wait(60)
    zctx = zmq.Context()
    reader = zctx.socket(zmq.DEALER)
    reader.linger = 0
    reader.rcvtimeo = 10_000
    reader.rcvhwm = reader_hwm
    reader.connect(endpoint)
    reader.send(GREETING)
    reader.recv()
    info = ConnectionInfo(client_id="", name="stopped", properties={"Batch-Deliveries": "64"})
    reader.send(tmqp.encode(info.to_frame("hs").replace(pending_response=True))[0])
    reader.recv()
    producer = Client(endpoint, context=zctx, timeout=60).connect()
    producer.create_queue("stop", 1, {"Status": 1, "MessageLimit": limit})
    join = tmqp.Frame(
        message_type=MessageType.SERVER,
        pending_response=True,
        content_type=110,
        message_id="j",
        target="stop",
    )
    reader.send(tmqp.encode(join)[0])
    reader.recv()
    before = rss_mib(broker.pid)
    for i in range(0, messages, 256):  # acknowledged batches: in step with the broker
        producer.push_many("stop", 1, [PAYLOAD] * min(256, messages - i), ack=True)
    reads: list[int] = []
    while len(reads) < 5 or len(set(reads[-5:])) > 1:
        reads.append(int(producer.queue_info("stop", 1)["SentMessages"]))
        time.sleep(0.2)  # bench only: until the count stops moving
    grown = rss_mib(broker.pid) - before
    producer.close()
    reader.close()
    zctx.term()
    stop.set()
    broker.join(30)
    return grown, reads[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--limit", type=int, default=100_000, help="the queue's MessageLimit")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hwm", type=int, default=10_000, help="ServerOptions.hwm")
    parser.add_argument(
        "--client-pipe",
        action="store_true",
        help="the reader's receive pipe as the Python client sets it for hwm 10,000 "
        "(default: 1,000 messages, ZeroMQ's default)",
    )
    parser.add_argument(
        "--defaults-only", action="store_true", help="only the row of the server's defaults"
    )
    args = parser.parse_args(argv)
    rows = ROWS[:1] if args.defaults_only else ROWS
    reader = client_pipe(10_000) if args.client_pipe else 1000
    ctx = mp.get_context("spawn")
    results: dict[str, list[tuple[float, int]]] = {name: [] for name, _u, _o in rows}
    for _ in range(args.rounds):
        for name, unacked, octets in rows:
            got = measure(ctx, unacked, octets, args.messages, args.limit, args.hwm, reader)
            results[name].append(got)
    print(
        f"\nstopped consumer, hwm {args.hwm:,}, queue limit {args.limit:,}, "
        f"{args.messages:,} pushes of 100 B, the reader's receive pipe {reader:,} messages"
    )
    import broker

    print(f"broker code: {Path(broker.__file__).resolve().parent.parent}")
    print(
        f"{'row':<56} {'octets':>7} {'send hwm':>9} {'broker RSS grown, MiB':>22} "
        f"{'deliveries libzmq took':>24}"
    )
    print("-" * 122)
    for name, unacked, octets in rows:
        options = options_of("tcp://127.0.0.1:1", unacked, octets, args.hwm)
        runs = results[name]
        grown = " / ".join(f"{g:.1f}" for g, _t in runs)
        taken = " / ".join(f"{t:,}" for _g, t in runs)
        print(
            f"{name:<56} {options.unacked_batch_octets:>7} {send_hwm(options):>9,} "
            f"{grown:>22} {taken:>24}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
