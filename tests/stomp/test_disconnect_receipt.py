"""A RECEIPT promises that every frame before it was applied (STOMP 1.2, "DISCONNECT":
the client may close once the receipt came).  On the engine the listener hands ACKs to
the engine thread without waiting for them, so these tests hold that thread still:
the test *is* the engine thread (it runs the door's operations itself, ``pump``) and
the clients speak raw frames over real sockets to a real listener."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from broker.engine.engine import Engine
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.server import ListenerOptions, StompListener
from broker.stomp.session import SessionConfig, SessionState
from tests.polling import WAIT, wait_until

FAST = SessionConfig(die_delay=0.1, heartbeat=(0, 0))
COUNT = 5


class Engineside:
    """The engine thread, run by the test: the door's operations run only in :meth:`pump`."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.door = EngineDoor(self.engine)
        self.listener: StompListener = listen(
            self.door, lambda fd, fn: None, ListenerOptions(port=0, session=FAST)
        )
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

    def __init__(self, side: Engineside) -> None:
        before = side.listener.call(lambda: set(side.listener.connections))
        self.sock = socket.create_connection(("127.0.0.1", side.listener.port), timeout=WAIT)
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


@pytest.fixture
def side() -> Iterator[Engineside]:
    engine_side = Engineside()
    yield engine_side
    engine_side.stop()


@pytest.fixture
def client(side: Engineside) -> Iterator[Callable[[], RawClient]]:
    made: list[RawClient] = []

    def make() -> RawClient:
        made.append(RawClient(side))
        return made[-1]

    yield make
    for raw in made:
        raw.close()


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


@pytest.mark.parametrize("frames", ["one write", "frame by frame"])
def test_the_disconnect_receipt_waits_until_the_acks_before_it_were_applied(
    side: Engineside, client: Callable[[], RawClient], frames: str
) -> None:
    """Regression: the RECEIPT of a DISCONNECT left as soon as the listener read it,
    while the ACKs before it still waited for the engine thread: a kill in between
    redelivered acknowledged messages to the next subscriber after the client was told
    its work was done.  Here the engine thread stands still until the listener has
    handled the DISCONNECT: no RECEIPT may be readable then; once the ACKs ran it comes,
    and the next subscriber gets none of the acknowledged messages."""
    producer, consumer = client(), client()
    bodies = [f"order-{i}".encode() for i in range(COUNT)]
    send_orders(producer, bodies)
    subscribe(consumer)
    messages = [consumer.next_frame() for _ in bodies]
    assert [m.split(b"\n\n", 1)[1] for m in messages] == bodies
    acks = [b"ACK\nid:" + header(m, b"ack") + b"\n\n\x00" for m in messages]
    goodbye = b"DISCONNECT\nreceipt:bye\n\n\x00"
    if frames == "one write":
        consumer.send(b"".join(acks) + goodbye)
    else:
        for data in [*acks, goodbye]:
            consumer.send(data)
    # the engine thread stands still: wait until the listener handled the DISCONNECT
    assert wait_until(lambda: side.session_state(consumer.id) is not SessionState.CONNECTED)
    assert side.door.pending_ops > 0  # the ACKs wait for the engine thread
    assert not consumer.readable(), "RECEIPT before the ACKs were applied"
    receipt = consumer.next_frame()  # the engine thread runs: the ACKs, then the RECEIPT
    assert receipt.startswith(b"RECEIPT\nreceipt-id:bye")
    queue = side.engine.channels["orders"].queues[0]
    assert not queue.pending  # nothing left unacknowledged on the broker
    # the next subscriber: the first message it gets is one sent after the goodbye
    successor = client()
    subscribe(successor)
    send_orders(producer, [b"after"])
    first = successor.next_frame()
    assert first.startswith(b"MESSAGE\n") and first.endswith(b"\n\nafter"), first


def test_an_ack_receipt_waits_until_the_ack_was_applied(
    side: Engineside, client: Callable[[], RawClient]
) -> None:
    """Any RECEIPT, not only DISCONNECT's: an ACK asking for one hears it once applied."""
    producer, consumer = client(), client()
    send_orders(producer, [b"one"])
    subscribe(consumer)
    message = consumer.next_frame()
    consumer.send(b"ACK\nid:" + header(message, b"ack") + b"\nreceipt:acked\n\n\x00")
    backend = side.listener.backend
    # the engine thread stands still: wait until the listener handled the ACK
    assert wait_until(lambda: side.listener.call(lambda: not backend.conns[consumer.id].pending))
    assert side.door.pending_ops > 0  # the ACK waits for the engine thread
    assert not consumer.readable(), "RECEIPT before the ACK was applied"
    assert consumer.next_frame().startswith(b"RECEIPT\nreceipt-id:acked")
    assert not side.engine.channels["orders"].queues[0].pending
