"""Acknowledged 4 KiB pushes, the unlucky cases (session 13, acked13).

* A ``broker serve --data DIR`` process is ``kill -9``ed while producers' acknowledged
  4 KiB pushes (batched and sent alone) are being appended to its log; restarted on the
  same directory, every push the broker acknowledged is in its queue exactly once with
  its bytes intact, and nothing is there that no producer pushed.
* A producer that reuses its buffer: a ``bytearray`` payload changed right after
  ``push_async`` / ``push_many_async`` returned must not change what was pushed (the
  client keeps no view into the caller's buffer).

Every wait is a deadline polled for.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future
from typing import Any

import pytest
import zmq

from broker.client.blocking import Client
from broker.server import Server
from tests.broker.test_durable_serve import PERSISTENT, Broker
from tests.polling import wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
SIZE = 4096
#: acknowledged pushes seen before the kill (the rest of the traffic goes on meanwhile)
BEFORE_KILL = 300
#: pushes each producer keeps in flight
WINDOW = 32


def body(mid: str) -> bytes:
    """A 4 KiB payload that names its message and differs at every position from its
    neighbours' (a torn, shifted or swapped record cannot pass for it)."""
    seed = mid.encode()
    out = bytearray((seed * (SIZE // len(seed) + 1))[:SIZE])
    for i in range(0, SIZE, 97):
        out[i] = (i + len(out) + sum(seed)) & 0xFF
    return bytes(out)


class Producer(threading.Thread):
    """Acknowledged pushes with ids ``<name>-<n>`` until told to stop; ``acked``: the
    ids the broker acknowledged."""

    def __init__(self, name: str, endpoint: str, zctx: Ctx, **client_kw: Any) -> None:
        super().__init__(daemon=True)
        self.name = name
        self.client = Client(endpoint, context=zctx, timeout=10, **client_kw).connect()
        self.acked: list[str] = []
        self.pushed: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        inflight: list[tuple[str, Future[Any]]] = []
        n = 0
        try:
            while not self.stop.is_set():
                while len(inflight) >= WINDOW:
                    mid, future = inflight.pop(0)
                    future.result(20)
                    self.acked.append(mid)
                mid = f"{self.name}-{n}"
                n += 1
                self.pushed.add(mid)
                inflight.append((mid, self.client.push_async("big", 1, body(mid), message_id=mid)))
        except Exception:  # the broker died under it: what was acknowledged is known
            return


def test_kill_9_during_4k_acked_runs_keeps_every_acknowledged_push_once_intact(
    served: Broker, zctx: Ctx
) -> None:
    with Client(served.endpoint, context=zctx, timeout=10).connect() as admin:
        admin.create_queue("big", 1, PERSISTENT)
    producers = [
        Producer("batched", served.endpoint, zctx),
        Producer("single", served.endpoint, zctx, batch=0),
    ]
    for p in producers:
        p.start()
    try:
        assert wait_until(lambda: sum(len(p.acked) for p in producers) >= BEFORE_KILL, 60)
        served.kill()  # (the producers are still pushing: appends cut mid-way)
    finally:
        for p in producers:
            p.stop.set()
            with contextlib.suppress(Exception):
                p.client.close()  # (fails what is still in flight: not acknowledged)
        for p in producers:
            p.join(60)
            assert not p.is_alive()
    acked = [mid for p in producers for mid in p.acked]
    pushed = set().union(*(p.pushed for p in producers))
    served.start()
    got: dict[str, int] = {}
    with Client(served.endpoint, context=zctx, timeout=20).connect() as consumer:
        consumer.join("big")

        def emptied() -> bool:
            """One delivery taken (and acknowledged), or: none queued nor unacknowledged."""
            m = consumer.receive(timeout=0.5)
            if m is None:  # (acknowledges go before this question on the same socket)
                info = consumer.queue_info("big", 1)
                return info["Messages"] == 0 and info["PendingAcknowledges"] == 0
            assert m.id in pushed, f"{m.id!r} was never pushed"
            assert bytes(m.payload) == body(m.id), f"{m.id}: the bytes changed"
            got[m.id] = got.get(m.id, 0) + 1
            consumer.ack(m)
            return False

        assert wait_until(emptied, 120, step=0), f"the queue never emptied ({len(got)} taken)"
    missing = [mid for mid in acked if mid not in got]
    assert not missing, f"{len(missing)} acknowledged pushes lost, e.g. {missing[:3]}"
    twice = [mid for mid in acked if got[mid] != 1]
    assert not twice, f"acknowledged pushes back more than once: {twice[:3]}"


@pytest.mark.parametrize("batch", [None, 0], ids=["batched", "singles"])
def test_a_bytearray_changed_after_push_returns_does_not_change_what_was_pushed(
    server: Server, zctx: Ctx, batch: int | None
) -> None:
    assert server.endpoint is not None
    kw: dict[str, Any] = {} if batch is None else {"batch": batch}
    with (
        Client(server.endpoint, context=zctx, timeout=10, **kw).connect() as producer,
        Client(server.endpoint, context=zctx, timeout=10).connect() as consumer,
    ):
        producer.create_queue("reuse", 1, {"Status": 1})
        consumer.join("reuse")
        buf = bytearray(SIZE)
        reused: Any = buf  # (the client takes any bytes-like payload; typed bytes | str)
        want: list[bytes] = []
        futures: list[Future[Any]] = []
        for i in range(20):  # one buffer, refilled for every push (as a reader's would be)
            buf[:] = body(f"one-{i}")
            want.append(bytes(buf))
            futures.append(producer.push_async("reuse", 1, reused))
            buf[:] = b"\xee" * SIZE  # scribbled over at once
        bufs: list[Any] = [bytearray(body(f"many-{i}")) for i in range(20)]
        want += [bytes(b) for b in bufs]
        futures += producer.push_many_async("reuse", 1, bufs)
        for b in bufs:
            b[:] = b"\xdd" * SIZE
        for future in futures:
            future.result(20)
        got: list[bytes] = []
        while len(got) < len(want):
            m = consumer.receive(timeout=20)
            assert m is not None, f"only {len(got)} of {len(want)} delivered"
            got.append(bytes(m.payload))
        assert got == want
