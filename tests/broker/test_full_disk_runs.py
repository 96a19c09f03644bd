"""A broker whose data disk fills while producers push acknowledged single pushes that
it takes as drain runs (``Engine.receive_pushes``): no positive acknowledge for a message
the store does not hold.  Real processes: ``broker serve --data DIR`` on a small tmpfs
(a real file system that runs out of room: ENOSPC in the log's writer), producers
without TMQP batches (``batch=0``), the broker killed -9 once they stop hearing back,
restarted with room: every message acknowledged positively is there.

Mounting needs root (CAP_SYS_ADMIN): elsewhere this test skips, saying why.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from tests.broker.test_durable_serve import PERSISTENT, consume
from tests.filemq.test_full_disk import _grow, small_disk  # noqa: F401 (the fixture)
from tests.polling import wait_until
from tests.ports import free_port

# (``small_disk``: a tmpfs of 1 MiB, FILEMQ's: room for about 900 of the 8,000 1 KiB pushes)
PRODUCERS = 4
PUSHES = 2_000  # per producer, 1 KiB each
START = 60.0  # deadline (s) for a Python process to start at load 50 (test_cli's)


def _serve(endpoint: str, data: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``broker serve`` (``extra``: more options) with its log lines in a file (a full disk
    makes many); ready once the file holds one more ready line than before (a restart
    appends to the same file)."""
    ready = b"broker serving on"
    before = log.read_bytes().count(ready) if log.exists() else 0
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve", "--bind", endpoint, "--data", str(data),
             *extra],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    if not wait_until(lambda: log.read_bytes().count(ready) > before, timeout=START):
        proc.kill()
        proc.wait(10)
        pytest.fail(f"broker serve did not start: {log.read_bytes()[-2000:]!r}")
    return proc


def _produce(endpoint: str, zctx: zmq.Context[zmq.Socket[bytes]], p: int,
             yes: list[str], no: list[str]) -> None:  # fmt: skip
    """Push until the broker stops answering; each answer sorted into ``yes``/``no``."""
    client = Client(endpoint, context=zctx, timeout=5, reconnect=False, batch=0).connect()
    try:
        inflight = []
        for i in range(PUSHES):
            mid = f"p{p}-{i:05d}"
            inflight.append((mid, client.push_async("orders", 1, b"x" * 1024, message_id=mid)))
            if len(inflight) < 16:
                continue
            mid, future = inflight.pop(0)
            try:
                future.result(5)
                yes.append(mid)
            except RemoteError:
                no.append(mid)
    except Exception:
        pass  # no answer within 5 s: the broker holds its answers for good, or is gone
    finally:
        client.close(timeout=1)


@pytest.mark.slow  # (~15 s: two broker starts, a disk filled; the engine-level twin is
# test_acked_runs.py::test_a_disk_that_fills_mid_run_acknowledges_only_what_it_stored)
def test_a_disk_that_fills_under_single_pushes_acknowledges_only_what_it_stored(
    small_disk: Path,  # noqa: F811
    tmp_path: Path,
    zctx: zmq.Context[zmq.Socket[bytes]],
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    log = tmp_path / "broker.log"
    proc = _serve(endpoint, small_disk / "data", log)
    try:
        with Client(endpoint, context=zctx, timeout=10).connect() as admin:
            admin.create_queue("orders", 1, PERSISTENT)
        yes: list[str] = []
        no: list[str] = []
        threads = [threading.Thread(target=_produce, args=(endpoint, zctx, p, yes, no))
                   for p in range(PRODUCERS)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert yes  # some were stored and acknowledged before the disk filled...
        assert len(yes) < PRODUCERS * PUSHES  # ...and not all: the disk did fill
        with Client(endpoint, context=zctx, timeout=10).connect() as admin:
            assert int(admin.stats()["server"]["run_pushes"]) > 0  # (served as drain runs)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    _grow(small_disk)  # (64 MiB)
    proc = _serve(endpoint, small_disk / "data", log)
    try:
        got = {mid for mid, _ in consume(endpoint, zctx)}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert set(yes) <= got  # every positive acknowledge is a message the store held
