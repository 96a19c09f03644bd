"""A live ``Server`` + ``Engine`` over inproc whose loop a test can hold (``Hold``), so
that what peers send meanwhile is read in one drain, deterministically; ``held_brokers``
makes such brokers and stops them after the test (the push-run and octets-run tests)."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import zmq

from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions

Ctx = zmq.Context[zmq.Socket[bytes]]
_names = itertools.count(1)


def inproc_pair(ctx: Ctx, address: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    """A PULL socket bound to ``address`` (inproc) and a PUSH socket connected to it,
    neither lingering: a way to wake a loop that reads the PULL end."""
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    pull.bind(address)
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(address)
    return pull, push


class Hold:
    """Holds the server's loop on its thread (a reader handler that waits for
    :meth:`release`), so that what peers send meanwhile waits unread in the pipes."""

    def __init__(self, ctx: Ctx, server: Server) -> None:
        self.rx, self.tx = inproc_pair(ctx, f"inproc://hold-{next(_names)}")
        self.held = threading.Event()
        self.go = threading.Event()
        server.add_reader(self.rx, self._wait)

    def _wait(self, now: float) -> list[object]:
        while self.rx.poll(0):
            self.rx.recv()
        self.held.set()
        self.go.wait(60)
        return []

    def hold(self) -> None:
        self.held.clear()
        self.go.clear()
        self.tx.send(b"hold")
        assert self.held.wait(60), "the server loop did not take the hold"

    def release(self) -> None:
        self.go.set()

    def close(self) -> None:
        self.go.set()
        self.tx.close()
        self.rx.close()


@dataclass
class Broker:
    server: Server
    hold: Hold
    endpoint: str


MakeBroker = Callable[..., Broker]


@contextlib.contextmanager
def held_brokers(zctx: Ctx, name: str) -> Iterator[MakeBroker]:
    """``make(**ServerOptions fields)``: a started broker on ``inproc://NAME-N`` with its
    ``Hold``; every one made is released and stopped at the end."""
    made: list[Broker] = []

    def make(**options: object) -> Broker:
        opts = ServerOptions(endpoint=f"inproc://{name}-{next(_names)}", **options)  # type: ignore[arg-type]
        server = Server(Engine(), opts, context=zctx)
        hold = Hold(zctx, server)
        endpoint = server.start()
        made.append(Broker(server, hold, endpoint))
        return made[-1]

    try:
        yield make
    finally:
        for broker in made:
            broker.hold.release()
            broker.server.stop()
            broker.hold.close()
