"""The blocking client's callers and its I/O thread: requests registered by a caller's
thread while the I/O thread sweeps its requests for time-outs (``broker.client.handover``).

The garbage collector runs Python code (finalizers, ``gc.callbacks``) on whichever thread
allocates when a collection is due, and a thread switch can happen there.  Here every
collection on the client's I/O thread hands the turn to a caller's thread that registers
a new request right then, and waits for it: the interleaving a loaded CI machine hit once
by chance ("dictionary changed size during iteration" in the I/O thread, session 9), made
certain.  A sweep of thousands of waiting requests allocates far more objects than the
2-tuple free list holds when it copies them item by item, so collections (gen-0 threshold
1 for the test) come in the middle of such a sweep.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from broker.client.blocking import Client
from broker.client.errors import RequestTimeout
from tests.broker.test_client_session import Ctx, FakeBroker, fake  # noqa: F401 (fixture)
from tests.polling import WAIT, wait_until

#: Requests left waiting (the fake broker answers none): well above CPython's free list
#: of 2-tuples (2,000), so copying them item by item allocates tracked objects.
WAITING = 5_000
#: Seconds the waiting requests may wait: longer than the test, so only the probe times out.
LONG = 600.0
#: Seconds the probe request waits: its RequestTimeout proves a sweep ran after it.
PROBE = 0.3
#: Seconds a collection on the I/O thread waits for the caller's registration.
TURN = 5.0


class CallerOnCollection:
    """While installed: each garbage collection on the client's I/O thread
    (``broker-client``) lets a caller's thread register one request, and waits for it."""

    def __init__(self, register: Callable[[], Future[Any]]) -> None:
        self.register = register
        self.go = threading.Event()
        self.done = threading.Event()
        self.stop = False
        self.turns = 0
        self.failed: Exception | None = None
        self.futures: list[Future[Any]] = []
        self.caller = threading.Thread(target=self._caller, name="caller")

    def _caller(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            if self.stop:
                return
            try:
                self.futures.append(self.register())
                self.turns += 1
            except Exception as exc:  # (the client gave up: the test says so)
                self.failed = exc
            finally:
                self.done.set()

    def _collecting(self, phase: str, info: dict[str, int]) -> None:
        if phase != "start" or threading.current_thread().name != "broker-client":
            return
        self.done.clear()
        self.go.set()
        self.done.wait(TURN)  # (bounded: a caller blocked on the outbox's lock lets go)

    def __enter__(self) -> CallerOnCollection:
        self.caller.start()
        self.threshold = gc.get_threshold()
        gc.callbacks.append(self._collecting)
        # gen 0 at every allocation past one; the older generations (whole-heap walks)
        # almost never, so the test stays quick
        gc.set_threshold(1, 1_000_000, 1_000_000)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.set_threshold(*self.threshold)
        gc.callbacks.remove(self._collecting)
        self.stop = True
        self.go.set()
        self.caller.join(TURN)


@pytest.fixture
def client(zctx: Ctx, fake: FakeBroker) -> Iterator[Client]:  # noqa: F811
    client = Client(fake.endpoint, context=zctx, ping_interval=LONG, peer_timeout=LONG,
                    timeout=LONG, max_outbox=2 * WAITING)  # fmt: skip
    accepting = threading.Thread(target=fake.accept)
    accepting.start()
    client.connect(timeout=WAIT)
    accepting.join(WAIT)
    yield client
    client.close()


def test_requests_registered_during_a_sweep_do_not_stop_the_io_thread(client: Client) -> None:
    waiting = [client.request_async("nobody", b"x", timeout=LONG) for _ in range(WAITING)]
    with CallerOnCollection(lambda: client.request_async("nobody", b"y", timeout=LONG)) as turns:
        probe = client.request_async("nobody", b"probe", timeout=PROBE)
        # only a sweep of the waiting requests fails the probe: it ran, over all of them
        swept = wait_until(probe.done, 3 * WAIT)
    assert swept, "the probe never timed out: the I/O thread stopped sweeping"
    assert isinstance(probe.exception(0), RequestTimeout), probe.exception(0)
    assert turns.turns > 0  # callers did register while the I/O thread collected
    # the I/O thread lives on and took every registration: a new request still times out
    assert isinstance(client.request_async("nobody", timeout=PROBE).exception(WAIT),
                      RequestTimeout)  # fmt: skip
    assert not any(f.done() for f in waiting + turns.futures)
