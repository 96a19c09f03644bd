"""The server loop's wait (``broker.server.wait``) against clients that never let it rest.

The loop asks the ROUTER for ZMQ_EVENTS, then makes one ``poll()`` over descriptors: the
ROUTER's, the stop wake-up, the monitor's, other readers'.  A socket that always has input
must not hide the others: ``stop()`` ends the loop while a client floods it, a reader added
as a descriptor or as a ZeroMQ socket is served meanwhile, and a client killed -9 in the
middle of its requests is noticed through the monitor (its id is free again long before
any keep-alive could end its session), with every push it was told was taken kept.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import ClientError, UnconfirmedSends
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from tests.broker.held_server import inproc_pair
from tests.polling import WAIT, wait_until

Ctx = zmq.Context[zmq.Socket[bytes]]
ROOT = Path(__file__).resolve().parents[2]
#: A deadline for what depends on the broker's own timers (orphan grace 2 s, scans every
#: second) on a machine at load 50.
LOADED = 60.0


class Flood:
    """A poll-on-call client pushing without pause on its own thread until told to stop
    or its session ends (``reconnect=False``: a stopped server ends it)."""

    def __init__(self, endpoint: str, zctx: Ctx, channel: str) -> None:
        self.client = Client(endpoint, context=zctx, threaded=False, reconnect=False).connect()
        self.client.create_queue(channel, 1, {"Status": 1})
        self.pushed = 0
        self.ended: BaseException | None = None
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(channel,), name="flood")
        self.thread.start()

    def _run(self, channel: str) -> None:
        try:
            while not self.halt.is_set():
                self.client.push(channel, 1, b"x" * 100)
                self.pushed += 1
        except ClientError as exc:
            self.ended = exc

    def close(self) -> None:
        """Stop flooding and close; what the stopped server never confirmed is reported
        (``UnconfirmedSends``), as ``close`` does after a lost session: expected here."""
        self.halt.set()
        self.thread.join(WAIT)
        with contextlib.suppress(UnconfirmedSends):
            self.client.close()


@pytest.fixture
def served(zctx: Ctx) -> Iterator[Server]:
    server = Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
    yield server
    server.stop(timeout=LOADED)


def test_stop_ends_the_loop_while_a_client_floods_it(served: Server, zctx: Ctx) -> None:
    endpoint = served.start()
    flood = Flood(endpoint, zctx, "flood")
    try:
        assert wait_until(lambda: flood.pushed >= 20_000, LOADED), "the flood never got going"
        assert flood.thread.is_alive()
        served.stop(timeout=LOADED)  # raises ServerError if the loop did not end
        assert not served.serving
        # the loop's last act told the client: its session ends, its pushes fail
        assert wait_until(lambda: not flood.thread.is_alive(), LOADED)
        assert isinstance(flood.ended, ClientError)
    finally:
        flood.close()


class Readers:
    """Two readers added to the loop: a pipe (a plain descriptor, as the STOMP door's)
    and a ZeroMQ PULL socket (as a test's hold); each counts the wakes it was served."""

    def __init__(self, server: Server, zctx: Ctx) -> None:
        self.rfd, self.wfd = os.pipe()
        self.pull, self.push = inproc_pair(zctx, f"inproc://loop-reader-{id(self)}")
        self.fd_notes = 0
        self.zmq_notes = 0
        server.add_reader(self.rfd, self._on_fd)
        server.add_reader(self.pull, self._on_zmq)

    def _on_fd(self, now: float) -> list[object]:
        self.fd_notes += len(os.read(self.rfd, 4096))
        return []

    def _on_zmq(self, now: float) -> list[object]:
        # one message per call: the loop must call again while more wait (EVENTS asked)
        self.pull.recv(zmq.NOBLOCK)
        self.zmq_notes += 1
        return []

    def close(self) -> None:
        os.close(self.rfd)
        os.close(self.wfd)
        self.pull.close()
        self.push.close()


def test_other_readers_are_served_while_the_router_is_never_empty(
    served: Server, zctx: Ctx
) -> None:
    readers = Readers(served, zctx)
    endpoint = served.start()
    flood = Flood(endpoint, zctx, "busy")
    try:
        assert wait_until(lambda: flood.pushed >= 20_000, LOADED), "the flood never got going"
        for round_ in range(1, 6):
            os.write(readers.wfd, b"n")
            readers.push.send(b"a")
            readers.push.send(b"b")  # two waiting: the reader takes one per call
            assert wait_until(lambda r=round_: readers.fd_notes >= r, LOADED), "pipe reader"
            assert wait_until(lambda r=round_: readers.zmq_notes >= 2 * r, LOADED), "zmq reader"
        assert flood.thread.is_alive(), "the flood was meant to run throughout"
    finally:
        flood.close()
        served.stop(timeout=LOADED)
        readers.close()


# Connects as RESTARTER, pushes acknowledged messages into "kept" without waiting for
# each acknowledge (several in flight), prints the id of each acknowledged one as it
# comes (flushed: the test reads what was promised), and is killed -9 by the test while
# requests are in flight.
RESTARTER = """
import sys
from broker.client.blocking import Client
client = Client(sys.argv[1], client_id="restarter", timeout=30, reconnect=False).connect()
print("ready", flush=True)
n = 0
pending = []
while True:
    pending.append((f"k{n}", client.push_async("kept", 1, b"x", message_id=f"k{n}")))
    n += 1
    if len(pending) >= 8:
        mid, future = pending.pop(0)
        future.result(30)
        print(mid, flush=True)
"""


def test_a_client_killed_mid_request_frees_its_id_and_loses_no_acknowledged_push(
    zctx: Ctx,
) -> None:
    # a keep-alive far longer than the wait below: only the monitor (the connection's end)
    # can end the killed client's session in time
    options = ServerOptions(endpoint="tcp://127.0.0.1:*", peer_timeout=600.0)
    server = Server(Engine(), options, context=zctx)
    endpoint = server.start()
    proc: subprocess.Popen[str] | None = None
    try:
        with Client(endpoint, context=zctx, timeout=30).connect() as admin:
            admin.create_queue("kept", 1, {"Status": 1})
        proc = subprocess.Popen(
            [sys.executable, "-c", RESTARTER, endpoint],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        acked = [proc.stdout.readline().strip() for _ in range(200)]
        proc.send_signal(signal.SIGKILL)  # requests in flight, more acknowledges coming
        proc.wait(WAIT)
        acked += [line.strip() for line in proc.stdout.read().splitlines() if line.strip()]
        proc.stdout.close()
        assert all(a.startswith("k") for a in acked), acked[:5]

        again: list[Client] = []

        def restarted() -> bool:
            try:
                again.append(Client(endpoint, context=zctx, client_id="restarter", timeout=5,
                                    reconnect=False).connect())  # fmt: skip
            except ClientError:
                return False  # "in use" until the broker ends the killed one's session
            return True

        assert wait_until(restarted, LOADED, step=0.2), "the killed client's id was never freed"
        with again[0] as client:
            client.push("kept", 1, b"after", message_id="after", ack=True)
            client.join("kept")
            got: set[str] = set()
            while "after" not in got:
                message = client.receive(timeout=LOADED)
                assert message is not None, f"{len(set(acked) - got)} acknowledged pushes lost"
                got.add(message.id)
        assert set(acked) <= got, sorted(set(acked) - got)[:5]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        server.stop(timeout=LOADED)
