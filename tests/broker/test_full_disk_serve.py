"""Issue 10, hostile: the data disk fills under acknowledged persistent pushes.

A real ``broker serve --data DIR`` on a small tmpfs (a real file system that runs out of
room: ENOSPC in the log's writer).  One producer pushes 64 KiB persistent messages one at
a time, each waiting for its acknowledge: the push that no longer fits gets a refusal (a
negative acknowledge), never a positive one and never silence; every later persistent
push is refused too; the broker goes on serving everything that needs no disk (a memory
queue, an admin call) and stops cleanly on SIGTERM; restarted with room, every message
that was acknowledged is back, once, in order.

Mounting needs root (CAP_SYS_ADMIN): elsewhere the test skips, saying why.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from tests.broker.test_durable_serve import PERSISTENT, consume
from tests.broker.test_full_disk_runs import _serve
from tests.filemq.test_full_disk import _grow, small_disk  # noqa: F401 (the fixture)
from tests.ports import free_port

PAYLOAD = 64 << 10  # 16 of them fill the 1 MiB tmpfs
MOST = 64  # pushes tried at most: four times what fits


def _fill(client: Client) -> tuple[list[str], RemoteError]:
    """Push until the first refusal: (ids acknowledged before it, the refusal)."""
    acked: list[str] = []
    for i in range(MOST):
        mid = f"m{i:03d}"
        try:
            client.push("orders", 1, bytes([i]) * PAYLOAD, ack=True, message_id=mid, timeout=30)
        except RemoteError as refusal:
            return acked, refusal
        acked.append(mid)
    pytest.fail(f"{MOST} pushes of {PAYLOAD} octets all acknowledged on a 1 MiB disk")


def test_a_full_disk_refuses_persistent_pushes_and_the_broker_serves_on(
    small_disk: Path,  # noqa: F811
    tmp_path: Path,
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = _serve(endpoint, small_disk / "data", tmp_path / "first.log")
    try:
        with Client(endpoint, context=zctx, timeout=30, batch=0).connect() as client:
            client.create_queue("orders", 1, PERSISTENT)
            client.create_queue("memory", 1)  # (acknowledged on receipt)
            acked, refusal = _fill(client)
            assert acked, "the disk had room for none: nothing was tested"
            assert refusal.code != 0
            # the disk stays full: a later persistent push is refused as well, at once
            with pytest.raises(RemoteError):
                client.push("orders", 1, b"late", ack=True, message_id="late", timeout=30)
            # what needs no disk is still served
            client.push("memory", 1, b"in memory", ack=True, message_id="mem", timeout=30)
            info = client.queue_info("orders", 1)
            assert info["Tag"] == "kept"
        with Client(endpoint, context=zctx, timeout=30).connect() as consumer:
            consumer.join("memory")
            m = consumer.receive(timeout=30)
            assert m is not None and m.id == "mem" and bytes(m.payload) == b"in memory"
            consumer.ack(m)
        proc.send_signal(signal.SIGTERM)  # and it stops cleanly, the disk still full
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
    _grow(small_disk)  # (its own log file: _serve waits for that file's ready line)
    proc = _serve(endpoint, small_disk / "data", tmp_path / "second.log")
    try:
        got = consume(endpoint, zctx)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # every acknowledged message is back, in order, whole; a refused one may or may not
    # be (it was never promised), nothing else is
    ids = [mid for mid, _ in got]
    assert ids[: len(acked)] == acked
    assert set(ids[len(acked) :]) <= {f"m{len(acked):03d}", "late"}
    for mid, payload in got[: len(acked)]:
        assert payload == chr(int(mid[1:])) * PAYLOAD
