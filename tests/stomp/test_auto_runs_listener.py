"""A run of ``ack:auto`` deliveries the engine hands over as ONE item
(``broker.protocol.AutoRun``, ``broker.engine.flow.AUTO_RUN``) on a real listener and
engine, cut by a connection that fills: the listener's plain sink takes part of the run
(``EngineBackend._plain_run``), the rest waits in ``held``.  Then the consumer vanishes
(kill -9: a reset), after reading nothing or part of what it was handed.

What must hold: what the engine counts acknowledged is exactly what the listener handed
to the connection's output, never one it still holds (the invariant acknowledged + held
= sent to the listener, checked before the reset); nothing else is lost -- every message
not acknowledged comes back to the next consumer, in order, counted once sent (a
delivery that never reached a socket is not counted sent)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from broker.engine.flow import AUTO_RUN
from broker.protocol import PlainSends
from tests.stomp.engine_side import Engineside, RawClient, header
from tests.stomp.test_held_unsubscribe import (
    _held,
    _idle,
    _names,
    _nothing_more,
    _queue,
    _small_consumer,
    _subscribe,
)

MAX_OUTBOUND = 16 * 1024
BODY = 2000  # octets of each message: several fill the connection
COUNT = 60  # one run: more than the connection and the kernel hold


class RunSide(Engineside):
    """``Engineside`` counting the AUTO runs the engine made (entries of ``unsent``)."""

    def __init__(self) -> None:
        super().__init__(max_outbound=MAX_OUTBOUND)
        self.runs = 0
        #: Runs the door handed over as ``PlainSends`` (no message made per SEND), and
        #: every message id the engine was given, by body (read here, on the side).
        self.sends = 0
        self.ids: dict[bytes, str] = {}
        publish_many = self.engine.publish_many

        def publish(*args: Any, **kw: Any) -> Any:
            messages = args[1]
            self.sends += messages.__class__ is PlainSends
            self.ids.update((bytes(m.payload), m.message_id) for m in messages)
            result = publish_many(*args, **kw)
            for client in self.engine.clients.values():
                self.runs += sum(1 for t in client.unsent if t[0] == AUTO_RUN)
            return result

        self.engine.publish_many = publish  # type: ignore[method-assign]


@pytest.fixture
def side() -> Iterator[RunSide]:
    made = RunSide()
    yield made
    made.stop()
    assert made.runs > 0, "no run of AUTO deliveries was made"


def _send_run(producer: RawClient, queue: str) -> list[bytes]:
    """``COUNT`` plain SENDs in one write (the listener reads them as one run; the
    engine sends them as one), then a receipted BEGIN: all taken when it answers."""
    bodies = [f"{queue}-{i:04d}-".encode().ljust(BODY, b".") for i in range(COUNT)]
    frames = [
        b"SEND\ndestination:/queue/" + queue.encode() + b"\n\n" + b + b"\x00" for b in bodies
    ]
    frames.append(b"BEGIN\ntransaction:t\nreceipt:sent\n\n\x00")
    producer.send(b"".join(frames))
    assert producer.next_frame().startswith(b"RECEIPT\nreceipt-id:sent")
    return bodies


def _read_some(client: RawClient, n: int) -> list[bytes]:
    bodies = []
    for _ in range(n):
        frame = client.next_frame()
        assert frame.startswith(b"MESSAGE\n"), frame[:200]
        bodies.append(frame.split(b"\n\n", 1)[1])
    return bodies


@pytest.mark.parametrize("read", [0, 2])
def test_a_reset_mid_run_loses_nothing_not_taken(side: RunSide, read: int) -> None:
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "runs", "auto")
        bodies = _send_run(producer, "runs")
        queue = _queue(side, "runs")
        # the listener took part of the run and holds the rest: the engine counts
        # acknowledged exactly what was handed to the connection's output
        assert side.pump(lambda: _held(side) > 0 and queue.acks + _held(side) == COUNT), (
            f"acknowledged {queue.acks}, held {_held(side)}"
        )
        taken = queue.acks
        assert 0 < taken < COUNT
        got = _read_some(consumer, read)
        assert got == bodies[:read]
        # kill -9: a reset
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        consumer.close()
        assert side.pump(lambda: side.session_state(consumer.id) is None)
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        assert (queue.acks, queue.sent, queue.deliveries) == (taken, taken, taken)
        assert queue.nacks == COUNT - taken  # (each returned once, not counted sent)
        _subscribe(other, "o", "runs", "client-individual")
        frames = []
        for _ in range(COUNT - taken):
            frame = other.next_frame()
            assert frame.startswith(b"MESSAGE\n"), frame[:200]
            frames.append(frame)
            other.send(b"ACK\nid:" + header(frame, b"ack") + b"\n\n\x00")
        returned = [f.split(b"\n\n", 1)[1] for f in frames]
        assert _names(returned) == _names(bodies[taken:])
        _nothing_more(side, other)
        assert side.pump(lambda: _idle(queue) and queue.acks == COUNT)
    finally:
        consumer.close()
        producer.close()
        other.close()


def test_a_reset_mid_run_of_plain_sends_loses_nothing_taken(side: RunSide) -> None:
    """The door's run reaches the engine as ``PlainSends`` and leaves as a run whose
    MESSAGE frames the listener writes from its ids and bodies: each frame read, before
    the reset and after it (the rest, made into messages to go back), carries the id the
    engine gave that body; nothing acknowledged is lost, nothing comes twice."""
    consumer = _small_consumer(side)
    producer = RawClient(side)
    other = RawClient(side)
    try:
        _subscribe(consumer, "s", "sends", "auto")
        bodies = _send_run(producer, "sends")
        assert side.sends > 0
        queue = _queue(side, "sends")
        assert side.pump(lambda: _held(side) > 0 and queue.acks + _held(side) == COUNT)
        taken = queue.acks
        assert 3 <= taken < COUNT
        before = [consumer.next_frame() for _ in range(3)]
        consumer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        consumer.close()
        assert side.pump(lambda: side.session_state(consumer.id) is None)
        assert side.pump(lambda: _idle(queue) and _held(side) == 0)
        assert (queue.acks, queue.nacks) == (taken, COUNT - taken)
        _subscribe(other, "o", "sends", "client-individual")
        after = []
        for _ in range(COUNT - taken):
            frame = other.next_frame()
            assert frame.startswith(b"MESSAGE\n"), frame[:200]
            after.append(frame)
            other.send(b"ACK\nid:" + header(frame, b"ack") + b"\n\n\x00")
        read = [*before, *after]
        got = [f.split(b"\n\n", 1)[1].rstrip(b"\x00") for f in read]
        assert got == bodies[:3] + bodies[taken:]
        ids = [header(f, b"message-id").decode() for f in read]
        assert ids == [side.ids[b] for b in got]
        assert len(set(side.ids.values())) == COUNT
        _nothing_more(side, other)
        assert side.pump(lambda: _idle(queue) and queue.acks == COUNT)
    finally:
        consumer.close()
        producer.close()
        other.close()
