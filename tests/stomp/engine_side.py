"""A real STOMP listener on the engine door whose engine thread is the test itself
(:meth:`Engineside.pump` runs the door's operations), and raw-frame clients over real
sockets: what the listener does before the engine ran can be looked at, deterministically."""

from __future__ import annotations

import dataclasses
import select
import socket
import time
from collections.abc import Callable

from broker.engine.engine import Engine
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.server import ListenerOptions, StompListener
from broker.stomp.session import SessionConfig, SessionState
from tests.polling import WAIT, wait_until

FAST = SessionConfig(die_delay=0.1, heartbeat=(0, 0))


class Engineside:
    """The engine thread, run by the test: the door's operations run only in :meth:`pump`."""

    def __init__(self, max_outbound: int | None = None) -> None:
        self.engine = Engine()
        self.door = EngineDoor(self.engine)
        options = ListenerOptions(port=0, session=FAST)
        if max_outbound is not None:
            options = dataclasses.replace(options, max_outbound=max_outbound)
        self.listener: StompListener = listen(self.door, lambda fd, fn: None, options)
        self.listener.start()

    def pump(self, done: Callable[[], bool]) -> bool:
        """Run the door's operations until ``done()`` (bounded, polled)."""

        def step() -> bool:
            self.door.run_ops(time.monotonic())
            return done()

        return wait_until(step)

    def session_state(self, conn_id: int) -> SessionState | None:
        """The state of connection ``conn_id``'s session (None: the connection is gone)."""

        def read() -> SessionState | None:
            conn = self.listener.connections.get(conn_id)
            return None if conn is None or conn.session is None else conn.session.state

        return self.listener.call(read)

    def stop(self) -> None:
        self.listener.stop()
        self.door.close()


class RawClient:
    """A STOMP 1.2 client writing frames by hand and reading whole frames back."""

    def __init__(self, side: Engineside, rcvbuf: int | None = None) -> None:
        before = side.listener.call(lambda: set(side.listener.connections))
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # (before the connect: the window is set then)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", side.listener.port))
        self.buffer = b""
        self.side = side
        self.send(b"CONNECT\naccept-version:1.2\nhost:localhost\n\n\x00")
        assert self.next_frame().startswith(b"CONNECTED\n")  # (login is an engine call)
        self.id = next(iter(side.listener.call(lambda: set(side.listener.connections)) - before))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readable(self) -> bool:
        """Octets wait to be read now (or the connection was closed): no waiting."""
        return bool(self.buffer) or bool(select.select([self.sock], [], [], 0)[0])

    def next_frame(self) -> bytes:
        """The next frame, the engine thread run meanwhile (bounded)."""

        def whole() -> bool:
            if b"\x00" in self.buffer:
                return True
            if select.select([self.sock], [], [], 0)[0]:
                chunk = self.sock.recv(65536)
                assert chunk, f"connection closed; read so far {self.buffer!r}"
                self.buffer += chunk
            return b"\x00" in self.buffer

        assert self.side.pump(whole), f"no whole frame in time; read {self.buffer!r}"
        frame, _, self.buffer = self.buffer.partition(b"\x00")
        return frame.lstrip(b"\n")

    def close(self) -> None:
        self.sock.close()


def header(frame: bytes, name: bytes) -> bytes:
    for line in frame.split(b"\n\n", 1)[0].split(b"\n")[1:]:
        key, _, value = line.partition(b":")
        if key == name:
            return value
    raise AssertionError(f"no {name!r} header in {frame!r}")


def send_orders(producer: RawClient, bodies: list[bytes]) -> None:
    for i, body in enumerate(bodies):
        receipt = b"receipt:sent\n" if i == len(bodies) - 1 else b""
        producer.send(b"SEND\ndestination:/queue/orders\n" + receipt + b"\n" + body + b"\x00")
    assert producer.next_frame().startswith(b"RECEIPT\nreceipt-id:sent")


def subscribe(consumer: RawClient) -> None:
    consumer.send(
        b"SUBSCRIBE\nid:s\ndestination:/queue/orders\nack:client-individual\n"
        b"receipt:subscribed\n\n\x00"
    )
    assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:subscribed")
