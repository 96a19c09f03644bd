"""A STOMP queue fed by both doors (session 22, mixed22): a TMQP producer's message sent
while AUTO deliveries (``broker.engine.flow``) are in flight to an ``ack:auto``
consumer that does not read.

An AUTO delivery carries an id a door of the engine made (``<id_prefix><conn>-<n>``,
the prefix registered with the engine: ``QueueServices.add_door_prefix``).  Only a
message whose id begins with such a prefix can share an id with one, so only such a
message (a forged one) makes them tracked first (``Dispatcher.send``); a TMQP
producer's own ids and ids of an earlier process (another nonce) leave them AUTO.
Either way the consumer going away gives every message it never took back, once.  One
engine behind both doors (``tests.stomp.two_doors``), real sockets on loopback."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.stomp.engine_backend import EngineDoor
from broker.stomp.frames import Command
from tests.polling import wait_until
from tests.stomp.test_adversary_forged_ids import connected
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx

QUEUE = "mixed"
FILL = 20  # SENDs of BODY octets: more than the small listener's connection holds
BODY = 2000
TMQP = 3  # messages the TMQP producer pushes while the door's are in flight
WAIT = 10.0

T = TypeVar("T")


@pytest.fixture
def admin(small: Broker, zctx: Ctx) -> Iterator[Client]:
    client = Client(small.endpoint, context=zctx, timeout=10.0).connect()
    yield client
    client.close()


def _on_engine(b: Broker, fn: Callable[[], T]) -> T:
    """``fn()`` run on the engine thread (the queue's fields are that thread's)."""
    box: list[T] = []
    done = threading.Event()

    def op(now: float) -> list[Any]:
        try:
            box.append(fn())
        finally:
            done.set()
        return []

    b.door.submit(op)
    assert done.wait(WAIT)
    assert box, "the engine's call raised"
    return box[0]


def _in_flight(b: Broker) -> tuple[int, list[str]]:
    """The queue's AUTO deliveries in flight and the ids of its tracked ones."""

    def read() -> tuple[int, list[str]]:
        q = b.engine.channels[QUEUE].queues[0]
        return q.auto_in_flight, sorted(message_id for _, message_id in q.pending)

    return _on_engine(b, read)


def _info(admin: Client) -> dict[str, Any]:
    info = admin.queue_info(QUEUE, 0)
    return {k: info[k] for k in ("Messages", "InFlight", "PendingAcknowledges", "Acks")}


def _prefix(producer: Raw, spy: Raw) -> str:
    """The producer's ids' prefix, as a peer reads it from one MESSAGE (a probe sent to
    another queue, read by ``spy``)."""
    spy.send(b"SUBSCRIBE\nid:p\ndestination:/queue/probe\nreceipt:p\n\n\x00")
    assert spy.next().command is Command.RECEIPT
    producer.send(b"SEND\ndestination:/queue/probe\n\nprobe\x00")
    message_id = spy.next().header("message-id")
    assert message_id is not None
    return message_id.split("-", 1)[0] + "-"


@pytest.mark.parametrize(
    ("kind", "converts"),
    [("own", False), ("earlier-process", False), ("forged-prefix", True)],
)
def test_tmqp_ids_without_a_door_prefix_leave_auto_deliveries_auto(
    small: Broker, admin: Client, kind: str, converts: bool
) -> None:
    """``own``: the TMQP producer's ids; ``earlier-process``: ids of the door's form
    with another nonce (a message a store kept from an earlier process); both leave
    the AUTO deliveries AUTO.  ``forged-prefix``: ids beginning with the live door's
    prefix (numbers its producer never reaches): every AUTO delivery is made tracked
    first.  Then the consumer goes and another takes every message, once."""
    made: list[Raw] = []
    try:
        consumer = connected(made, small, rcvbuf=4096)
        consumer.send(
            f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\nreceipt:s\n\n\x00".encode()
        )
        assert consumer.next().command is Command.RECEIPT
        producer = connected(made, small)
        prefix = _prefix(producer, connected(made, small))
        assert prefix in small.engine.services.door_prefixes
        bodies = [b"d%03d" % i + b"." * (BODY - 4) for i in range(FILL)]
        frames = [f"SEND\ndestination:/queue/{QUEUE}\n\n".encode() + x + b"\x00" for x in bodies]
        frames[-1] = frames[-1].replace(b"\n\n", b"\nreceipt:sent\n\n", 1)
        producer.send(b"".join(frames))
        assert producer.next().command is Command.RECEIPT
        assert wait_until(lambda: small.held_deliveries() > 0)  # (in flight from here on)
        auto, tracked = _in_flight(small)
        assert auto > 0 and tracked == [], (auto, tracked)
        other = "s000000-" if prefix != "s000000-" else "s000001-"
        ids = {
            "own": [f"tmqp-{i}" for i in range(TMQP)],
            "earlier-process": [f"{other}1-{i}" for i in range(1, TMQP + 1)],
            "forged-prefix": [f"{prefix}999-{i}" for i in range(1, TMQP + 1)],
        }[kind]
        for i, message_id in enumerate(ids):
            admin.push(QUEUE, 0, b"tmqp%d" % i, message_id=message_id)

        def pushed() -> bool:
            info = _info(admin)
            return bool(info["Messages"] + info["Acks"] + info["InFlight"] == FILL + TMQP)

        assert wait_until(pushed), str(_info(admin))
        auto_after, tracked_after = _in_flight(small)
        door_tracked = [x for x in tracked_after if x not in ids]
        if converts:
            assert auto_after == 0 and door_tracked, (auto_after, tracked_after)
        else:
            assert auto_after > 0 and door_tracked == [], (auto_after, tracked_after)
        consumer.close()
        assert wait_until(lambda: _info(admin)["InFlight"] == 0), str(_info(admin))
        taken = _info(admin)["Acks"]
        second = connected(made, small)
        second.send(
            f"SUBSCRIBE\nid:t\ndestination:/queue/{QUEUE}\nack:client-individual\n\n\x00".encode()
        )
        got = []
        for _ in range(FILL + TMQP - taken):
            frame = second.next()
            assert frame.command is Command.MESSAGE, frame
            got.append(bytes(frame.body))
            second.send(f"ACK\nid:{frame.header('ack')}\n\n\x00".encode())
        assert len(set(got)) == len(got)  # (each once)
        assert {b"tmqp%d" % i for i in range(TMQP)} <= set(got)
        assert set(got) <= set(bodies) | {b"tmqp%d" % i for i in range(TMQP)}
        assert wait_until(lambda: _info(admin)["PendingAcknowledges"] == 0), str(_info(admin))
        assert _info(admin)["Messages"] == 0
    finally:
        for raw in made:
            raw.close()


def test_every_door_registers_its_prefix_for_the_engines_life() -> None:
    """Two doors on one engine: both prefixes are the engine's; a door closed keeps its
    own (its messages outlive it: queued, in flight to the other door's consumers); a
    door made with a prefix already there adds nothing."""
    engine = Engine()
    doors = [EngineDoor(engine), EngineDoor(engine, id_prefix="sother-")]
    try:
        first = doors[0].id_prefix
        assert engine.services.door_prefixes == (first, "sother-")
        doors[0].close()
        doors.append(EngineDoor(engine, id_prefix="sother-"))
        assert engine.services.door_prefixes == (first, "sother-")
    finally:
        for door in doors:
            door.close()
