"""The adversary's review (session 22, adv22): a TMQP producer that pushes, into a STOMP
queue, a message whose id is one the STOMP door gives a SEND (the door's ids are
``<id_prefix><conn>-<n>``: anyone who reads one MESSAGE can tell the next ones), while
an ``ack:auto`` consumer that does not read holds deliveries in flight.

The door's SENDs leave as AUTO deliveries (``broker.engine.flow``), which the engine
does not look up by id; the TMQP message is a tracked delivery (a ``pending`` entry per
consumer and id).  Two deliveries of one id in flight to one consumer: when it goes
away, the AUTO one becomes tracked under the same entry and one of the two messages
stayed in flight for ever (a window slot gone with it).  Both orders are tried; the
consumer going away must give every message it never took back, once.  One engine
behind both doors (``tests.stomp.two_doors``), real sockets on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from broker.client.blocking import Client
from broker.stomp.frames import Command
from tests.polling import wait_until
from tests.stomp.test_listener import Raw
from tests.stomp.two_doors import Broker, Ctx, shrink_send_buffers

QUEUE = "forged"
FILL = 20  # SENDs of BODY octets: more than the small listener's connection holds
BODY = 2000


@pytest.fixture
def admin(small: Broker, zctx: Ctx) -> Iterator[Client]:
    client = Client(small.endpoint, context=zctx, timeout=10.0).connect()
    yield client
    client.close()


def _info(admin: Client) -> dict[str, Any]:
    info = admin.queue_info(QUEUE, 0)
    return {
        k: info[k]
        for k in ("Messages", "InFlight", "PendingAcknowledges", "Acks", "DuplicateMessages")
    }


def connected(made: list[Raw], b: Broker, rcvbuf: int | None = None) -> Raw:
    """A raw client of ``b``'s listener, connected, kept in ``made`` (closed by the
    caller); ``rcvbuf``: its receive buffer and the listener's send buffer to it."""
    listener = b.listener
    before = listener.call(lambda: set(listener.connections))
    raw = Raw(listener, rcvbuf=rcvbuf)
    made.append(raw)
    raw.connect()
    if rcvbuf is not None:  # (the listener's send buffer to it shrunk alike)
        (cid,) = listener.call(lambda: set(listener.connections)) - before
        shrink_send_buffers(listener, lambda c, _: c == cid, rcvbuf)
    return raw


def _send(producer: Raw, bodies: list[bytes]) -> None:
    """SENDs to the queue, the last one with a receipt (read here)."""
    frames = [f"SEND\ndestination:/queue/{QUEUE}\n\n".encode() + b + b"\x00" for b in bodies]
    frames[-1] = (
        f"SEND\ndestination:/queue/{QUEUE}\nreceipt:sent\n\n".encode() + bodies[-1] + b"\x00"
    )
    producer.send(b"".join(frames))
    frame = producer.next()
    assert frame.command is Command.RECEIPT, frame


def _next_id(producer: Raw, spy: Raw) -> tuple[str, int]:
    """What a peer learns from one MESSAGE of the producer's: its ids' prefix and the
    number its next SEND takes (a probe sent to another queue, read by ``spy``)."""
    spy.send(b"SUBSCRIBE\nid:p\ndestination:/queue/probe\nreceipt:p\n\n\x00")
    assert spy.next().command is Command.RECEIPT
    producer.send(b"SEND\ndestination:/queue/probe\n\nprobe\x00")
    message_id = spy.next().header("message-id")
    assert message_id is not None
    prefix, _, n = message_id.rpartition("-")
    return prefix + "-", int(n) + 1


@pytest.mark.parametrize(
    ("tmqp_first", "run", "at"),
    [(True, 1, 0), (False, 1, 0), (True, 5, 2)],
    ids=["tmqp-first", "door-first", "tmqp-first-mid-run"],
)
def test_a_forged_id_leaves_nothing_stuck_when_the_consumer_goes(
    small: Broker, admin: Client, tmqp_first: bool, run: int, at: int
) -> None:
    """The door's next ``run`` SENDs go as one run; the forged id is the one of its SEND
    ``at`` (mid-run: a follower the engine reads past the run's first, session 22's
    ``PlainSends`` way when no delivery is pending)."""
    made: list[Raw] = []
    try:
        consumer = connected(made, small, rcvbuf=4096)
        consumer.send(
            f"SUBSCRIBE\nid:s\ndestination:/queue/{QUEUE}\nack:auto\nreceipt:s\n\n\x00".encode()
        )
        assert consumer.next().command is Command.RECEIPT
        producer = connected(made, small)
        prefix, n = _next_id(producer, connected(made, small))
        _send(producer, [b"f%03d" % i + b"." * (BODY - 4) for i in range(FILL)])
        assert wait_until(lambda: small.held_deliveries() > 0)  # (in flight from here on)
        forged = f"{prefix}{n + FILL + at}"  # the id of one of the producer's next SENDs
        door = [b"door%d" % i for i in range(run)]
        if tmqp_first:
            admin.push(QUEUE, 0, b"tmqp", message_id=forged)

            def handed() -> bool:
                info = _info(admin)
                return bool(info["Acks"] + info["InFlight"] == FILL + 1)

            assert wait_until(handed), str(_info(admin))
            _send(producer, door)
        else:
            _send(producer, door)
            admin.push(QUEUE, 0, b"tmqp", message_id=forged)

        def both_in() -> bool:  # (the second one waits: one delivery of an id at a time)
            info = _info(admin)
            return bool(info["Messages"] + info["Acks"] + info["InFlight"] == FILL + 1 + run)

        assert wait_until(both_in), str(_info(admin))
        assert _info(admin)["Messages"] >= 1  # (the later of the two, at least)
        consumer.close()
        assert wait_until(lambda: _info(admin)["InFlight"] == 0), str(_info(admin))
        taken = _info(admin)["Acks"]
        second = connected(made, small)
        second.send(
            f"SUBSCRIBE\nid:t\ndestination:/queue/{QUEUE}\nack:client-individual\n\n\x00".encode()
        )
        bodies = []
        for _ in range(FILL + 1 + run - taken):
            frame = second.next()
            assert frame.command is Command.MESSAGE, frame
            bodies.append(bytes(frame.body))
            second.send(f"ACK\nid:{frame.header('ack')}\n\n\x00".encode())
        assert b"tmqp" in bodies and set(door) <= set(bodies)
        assert wait_until(lambda: _info(admin)["PendingAcknowledges"] == 0), str(_info(admin))
    finally:
        for raw in made:
            raw.close()
