"""Two doors on one engine for tests: a TMQP ``Server`` and a STOMP listener sharing one
``Engine`` (``Broker``; ``held``: the server's loop holdable, ``tests.broker.held_server``),
a stomp.py listener that records what it gets (``Recorder``), connected stomp.py 1.2
connections (``stomp_connections``), and the fixtures ``broker``, ``tmqp`` (connected
``broker.Client`` s) and ``stomp_client`` (``stomp_connections``), all closed after the test.

Loaded as a pytest plugin by ``tests/conftest.py``: a module or conftest with fixtures
of these names of its own keeps them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import stomp
import zmq

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.server.server import Server, ServerOptions
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.server import ListenerOptions, StompListener
from broker.stomp.session import SessionConfig
from tests.broker.held_server import Hold

Ctx = zmq.Context[zmq.Socket[bytes]]
FAST = SessionConfig(die_delay=0.1, heartbeat=(0, 0))


class Broker:
    """A TMQP server and a STOMP listener on one engine (``held``: the server's loop
    holdable by ``hold``)."""

    def __init__(
        self,
        zctx: Ctx,
        engine: Engine | None = None,
        options: ListenerOptions | None = None,
        *,
        held: bool = False,
    ) -> None:
        self.engine = engine if engine is not None else Engine()
        self.door = EngineDoor(self.engine)
        self.server = Server(self.door, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
        self.hold = Hold(zctx, self.server) if held else None
        self.listener: StompListener = listen(
            self.door, self.server.add_reader, options or ListenerOptions(port=0, session=FAST)
        )
        self.endpoint = self.server.start()
        self.listener.start()
        self.zctx = zctx

    def held_deliveries(self) -> int:
        """Deliveries the listener holds for full connections, read on the listener's
        thread (``door.stats()`` walks engine state the engine thread changes: from
        another thread it raced it)."""
        figures = self.door.listener_figures
        assert figures is not None
        return int(self.listener.call(figures)["held_deliveries"])

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.release()
        self.listener.stop()
        self.server.stop()
        self.door.close()
        if self.hold is not None:
            self.hold.close()


#: The small listener's bound on a connection's unsent output (:func:`small`): a few
#: 100-byte MESSAGEs fill it.
SMALL_OUTBOUND = 4096


#: A small kernel buffer (no autotuning): a few 100-byte MESSAGEs fill it.
SMALL_BUFFER = 4096


def shrink_send_buffers(
    listener: StompListener,
    which: Callable[[int, Any], bool] | None = None,
    size: int = SMALL_BUFFER,
) -> None:
    """Give the kernel send buffer of the listener's connections that ``which`` picks
    (called with the connection's id and the connection; None: all of them) ``size``
    bytes, on the listener's thread: what a consumer does not read then waits in the
    listener, not in the kernel (which would take megabytes)."""

    def shrink() -> None:
        for cid, conn in listener.connections.items():
            transport = conn.transport
            if transport is not None and (which is None or which(cid, conn)):
                transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, size
                )

    listener.call(shrink)


def numbered(i: int, size: int = 100) -> bytes:
    """A ``size``-byte body starting with ``i`` in six digits (order checks read it)."""
    return b"%06d" % i + b"." * (size - 6)


@pytest.fixture
def broker(zctx: Ctx) -> Iterator[Broker]:
    b = Broker(zctx)
    yield b
    b.stop()


@pytest.fixture
def tmqp(broker: Broker) -> Iterator[Callable[[], Client]]:
    made: list[Client] = []

    def make() -> Client:
        client = Client(broker.endpoint, context=broker.zctx, timeout=10.0).connect()
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


class Recorder(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.receipts: list[str] = []
        self.errors: list[Any] = []
        self.heartbeats = 0
        self.lock = threading.Lock()

    def on_message(self, frame: Any) -> None:
        with self.lock:
            self.messages.append(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.append(frame.headers["receipt-id"])

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_heartbeat(self) -> None:
        self.heartbeats += 1

    def bodies(self) -> list[str]:
        with self.lock:
            return [m.body for m in self.messages]


#: Makes a connected stomp.py 1.2 connection (login, passcode) and its ``Recorder``.
Connect = Callable[..., tuple[Any, Recorder]]


@contextmanager
def stomp_connections(port: int) -> Iterator[Connect]:
    """Connected stomp.py 1.2 connections to ``port`` (as ``user``/``pw`` unless told),
    each with a ``Recorder``; those still connected are disconnected at the end."""
    made: list[Any] = []

    def make(login: str = "user", passcode: str = "pw") -> tuple[Any, Recorder]:
        conn = stomp.Connection12([("127.0.0.1", port)])
        rec = Recorder()
        conn.set_listener("rec", rec)
        conn.connect(login, passcode, wait=True)
        made.append(conn)
        return conn, rec

    try:
        yield make
    finally:
        for conn in made:
            if conn.is_connected():
                conn.disconnect()


@pytest.fixture
def stomp_client(broker: Broker) -> Iterator[Connect]:
    with stomp_connections(broker.listener.port) as make:
        yield make


def subscribed(broker: Broker, channel: str, count: int) -> bool:
    ch = broker.engine.channels.get(channel)
    return ch is not None and len(ch.consumers) == count
