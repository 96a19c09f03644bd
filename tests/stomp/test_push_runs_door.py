"""A TMQP producer's plain pushes read in one server drain go to the engine as one run
(``Engine.receive_pushes``): behind the STOMP door (``EngineDoor``) their deliveries to a
STOMP consumer must reach it, as those of every other engine call the server makes.

Real sockets: the server's loop is held (``tests.broker.held_server.Hold``) while a
raw TMQP peer sends, so that one drain reads every push: a run, deterministically."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.protocol import MessageType
from broker.stomp.engine_mapping import QUEUE_ID
from tests.broker.test_batch import Raw
from tests.broker.test_push_runs import LOADED
from tests.polling import wait_until
from tests.stomp.two_doors import Broker, stomp_connections, subscribed

Ctx = zmq.Context[zmq.Socket[bytes]]


@pytest.fixture
def held(zctx: Ctx) -> Iterator[Broker]:
    """A TMQP server and a STOMP listener on one engine, the server's loop holdable."""
    b = Broker(zctx, held=True)
    yield b
    b.stop()


@pytest.mark.parametrize("stamped", [False, True])
@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_tmqp_run_of_single_pushes_reaches_a_stomp_consumer(
    held: Broker, zctx: Ctx, ack: str, stamped: bool
) -> None:
    """``stamped``: the producer's own client id as the source, as the client library
    sends it (a push the octets path could carry, ``Engine.receive_push_octets``, but its
    one consumer is a STOMP connection: it must get messages, never TMQP octets)."""
    hold = held.hold
    assert hold is not None
    producer = Raw(zctx, held.endpoint)
    try:
        with stomp_connections(held.listener.port) as connect:
            conn, rec = connect()
            if stamped:  # (a plain push queue made by a TMQP client: its fast path is open)
                admin = Client(held.endpoint, context=zctx, timeout=10).connect()
                try:
                    admin.create_queue("runs", QUEUE_ID, {"Status": 1})
                finally:
                    admin.close()
            conn.subscribe("/queue/runs", id="s", ack=ack)
            assert wait_until(lambda: subscribed(held, "runs", 1), LOADED)
            hold.hold()
            for i in range(40):
                producer.send(
                    tmqp.encode_frame(message_type=MessageType.QUEUE, message_id=f"m{i}",
                                      source=producer.client_id if stamped else "",
                                      target="runs", content_type=QUEUE_ID, payload=b"b%d" % i)[0]
                )  # fmt: skip
            hold.release()
            assert wait_until(lambda: len(rec.messages) == 40, LOADED), len(rec.messages)
            assert rec.bodies() == [f"b{i}" for i in range(40)]
            if ack != "auto":
                for frame in rec.messages:
                    conn.ack(frame.headers["ack"])
            # served as runs through the door (how the 40 split into drains depends on when
            # they reach the broker's socket: each drain's first goes alone; CI saw 37)
            assert held.server.counters["run_pushes"] >= 2
            assert held.server.counters["octets_pushes"] == 0
            assert rec.errors == []
    finally:
        producer.close()
