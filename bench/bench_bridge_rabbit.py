"""Messages/s through the STOMP bridge to a real RabbitMQ, beside the same traffic sent
straight to RabbitMQ over STOMP (same run, same node).

100-byte messages, one RabbitMQ node (Debian's ``rabbitmq-server``, ``rabbitmq_stomp``)
started on loopback like the tests do, a ``broker serve`` and a ``broker bridge stomp``
process.  The consumer is a stomp.py client on RabbitMQ (``ack:client-individual``, ACKs
every message).  Time: from the first publish to the last message at the consumer.

* direct, not persistent: stomp.py SENDs without ``persistent`` and without receipts;
* direct, persistent: ``persistent:true`` with a ``receipt`` per SEND, ``WINDOW``
  receipts outstanding (what the bridge does: the RECEIPT is RabbitMQ's confirm);
* via bridge, not persistent: pushes into a zerohub in-memory queue (acknowledged by the
  bridge once RabbitMQ's RECEIPT came), the bridge SENDs them to RabbitMQ;
* via bridge, persistent: the zerohub queue is persistent (``--data``), each push
  acknowledged, ``WINDOW`` in flight.

The bridge always SENDs ``persistent:true`` with a receipt (ack after accept): the
non-persistent rows show what that costs against fire-and-forget.

Usage: ``python bench/bench_bridge_rabbit.py [--messages N] [--window W]``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import stomp
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.client.blocking import Client
from tests.bridge.peers import RabbitMQ
from tests.broker.test_cli import start_serve
from tests.polling import wait_until
from tests.ports import free_port

PAYLOAD = b"x" * 100
PERSISTENT = {"Status": "Push", "MessageDeliveryHandler": "persistent", "RequestAcknowledge": True}
MEMORY = {"Status": "Push", "RequestAcknowledge": True}


class Consumer:
    """A stomp.py subscriber on RabbitMQ counting (and ACKing) what arrives."""

    def __init__(self, port: int, destination: str, n: int) -> None:
        self.n = n
        self.count = 0
        self.done = threading.Event()
        self.conn = stomp.Connection12([("127.0.0.1", port)], vhost="/", auto_decode=False)
        self.conn.set_listener("c", self)
        self.conn.connect("guest", "guest", wait=True)
        self.conn.subscribe(destination, id="c", ack="client-individual",
                            headers={"prefetch-count": "1000"})  # fmt: skip

    def on_message(self, frame: Any) -> None:
        self.conn.ack(frame.headers["ack"])
        self.count += 1
        if self.count >= self.n:
            self.done.set()

    def close(self) -> None:
        self.conn.disconnect()


class Receipts:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.outstanding = 0

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.outstanding -= 1
            self.cond.notify_all()


def direct(rabbit: RabbitMQ, destination: str, n: int, persistent: bool, window: int) -> float:
    consumer = Consumer(rabbit.stomp_port, destination, n)
    conn = stomp.Connection12([("127.0.0.1", rabbit.stomp_port)], vhost="/", auto_decode=False)
    receipts = Receipts()
    conn.set_listener("r", receipts)
    conn.connect("guest", "guest", wait=True)
    start = time.perf_counter()
    for i in range(n):
        if persistent:
            with receipts.cond:
                receipts.cond.wait_for(lambda: receipts.outstanding < window, 60)
                receipts.outstanding += 1
            conn.send(destination, PAYLOAD, headers={"persistent": "true", "receipt": f"r{i}"})
        else:  # (RabbitMQ 3.10 takes a "persistent:false" header as a queue property)
            conn.send(destination, PAYLOAD)
    ok = consumer.done.wait(120)
    elapsed = time.perf_counter() - start
    if not ok:
        print(f"  {destination}: only {consumer.count} of {n}", file=sys.stderr)
    conn.disconnect()
    consumer.close()
    return consumer.count / elapsed


def bridged(
    ctx: zmq.Context[zmq.Socket[bytes]], rabbit: RabbitMQ, data: Path | None, channel: str,
    n: int, window: int,
) -> float:  # fmt: skip
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    serve = start_serve("--bind", endpoint, *(("--data", str(data)) if data else ()))
    destination = f"/queue/bench.{channel}"
    bridge = None
    try:
        with Client(endpoint, context=ctx, timeout=30) as pub:
            pub.create_queue(channel, 1, PERSISTENT if data else MEMORY)
            consumer = Consumer(rabbit.stomp_port, destination, n)
            bridge = subprocess.Popen(
                [sys.executable, "-m", "broker", "bridge", "stomp", "--url", rabbit.stomp_url,
                 "--connect", endpoint, "--map", f"{channel}/1={destination}",
                 "--window", str(window)],
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            wait_until(lambda: int(pub.channel_info(channel)["ActiveClients"]) >= 1, 60)
            start = time.perf_counter()
            inflight = []
            for _ in range(n):
                inflight.append(pub.push_async(channel, 1, PAYLOAD))
                if len(inflight) >= window:
                    inflight.pop(0).result(60)
            for f in inflight:
                f.result(60)
            ok = consumer.done.wait(120)
            elapsed = time.perf_counter() - start
            if not ok:
                print(f"  {channel}: only {consumer.count} of {n}", file=sys.stderr)
            consumer.close()
            return consumer.count / elapsed
    finally:
        if bridge is not None:
            bridge.send_signal(signal.SIGTERM)
            bridge.wait(20)
        serve.send_signal(signal.SIGTERM)
        serve.wait(20)
        if serve.stderr is not None:
            serve.stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=256)
    args = parser.parse_args()
    n, window = args.messages, args.window
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "rabbit").mkdir()
        rabbit = RabbitMQ(Path(tmp) / "rabbit")
        rabbit.start()
        try:
            for label, persistent in (("not persistent", False), ("persistent", True)):
                tag = "p" if persistent else "m"
                straight = direct(rabbit, f"/queue/bench.direct.{tag}", n, persistent, window)
                data = Path(tmp) / f"zh-{tag}" if persistent else None
                via = bridged(ctx, rabbit, data, f"bridged{tag}", n, window)
                rows.append((label, straight, via))
        finally:
            rabbit.close()
    ctx.destroy(linger=0)
    print(f"{'messages':<16} {n:>7} (100 octets, window {window})")
    print(f"{'':<16} {'direct msg/s':>13} {'via bridge msg/s':>17} {'ratio':>6}")
    for label, straight, via in rows:
        print(f"{label:<16} {straight:>13,.0f} {via:>17,.0f} {via / straight:>6.2f}")


if __name__ == "__main__":
    main()
