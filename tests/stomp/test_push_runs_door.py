"""A TMQP producer's plain pushes read in one server drain go to the engine as one run
(``Engine.receive_pushes``): behind the STOMP door (``EngineDoor``) their deliveries to a
STOMP consumer must reach it, as those of every other engine call the server makes.

Real sockets: the server's loop is held (``tests.broker.test_push_runs.Hold``) while a
raw TMQP peer sends, so that one drain reads every push: a run, deterministically."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import stomp
import zmq

from broker import tmqp
from broker.client.blocking import Client
from broker.engine.engine import Engine
from broker.protocol import MessageType
from broker.server.server import Server, ServerOptions
from broker.stomp.engine_backend import EngineDoor, listen
from broker.stomp.engine_mapping import QUEUE_ID
from broker.stomp.server import ListenerOptions
from tests.broker.held_server import Hold
from tests.broker.test_batch import Raw
from tests.broker.test_push_runs import LOADED
from tests.polling import wait_until
from tests.stomp.two_doors import FAST, Recorder

Ctx = zmq.Context[zmq.Socket[bytes]]


class HeldBroker:
    """A TMQP server and a STOMP listener on one engine, the server's loop holdable."""

    def __init__(self, zctx: Ctx) -> None:
        self.engine = Engine()
        self.door = EngineDoor(self.engine)
        self.server = Server(self.door, ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx)
        self.hold = Hold(zctx, self.server)
        options = ListenerOptions(port=0, session=FAST)
        self.listener = listen(self.door, self.server.add_reader, options)
        self.endpoint = self.server.start()
        self.listener.start()

    def stop(self) -> None:
        self.hold.release()
        self.listener.stop()
        self.server.stop()
        self.door.close()
        self.hold.close()


@pytest.fixture
def held(zctx: Ctx) -> Iterator[HeldBroker]:
    b = HeldBroker(zctx)
    yield b
    b.stop()


@pytest.mark.parametrize("stamped", [False, True])
@pytest.mark.parametrize("ack", ["auto", "client-individual"])
def test_a_tmqp_run_of_single_pushes_reaches_a_stomp_consumer(
    held: HeldBroker, zctx: Ctx, ack: str, stamped: bool
) -> None:
    """``stamped``: the producer's own client id as the source, as the client library
    sends it (a push the octets path could carry, ``Engine.receive_push_octets``, but its
    one consumer is a STOMP connection: it must get messages, never TMQP octets)."""
    conn = stomp.Connection12([("127.0.0.1", held.listener.port)])
    rec = Recorder()
    conn.set_listener("rec", rec)
    conn.connect("user", "pw", wait=True)
    producer = Raw(zctx, held.endpoint)
    try:
        if stamped:  # (a plain push queue made by a TMQP client: its fast path is open)
            admin = Client(held.endpoint, context=zctx, timeout=10).connect()
            try:
                admin.create_queue("runs", QUEUE_ID, {"Status": 1})
            finally:
                admin.close()
        conn.subscribe("/queue/runs", id="s", ack=ack)

        def subscribed() -> bool:
            channel = held.engine.channels.get("runs")
            return channel is not None and len(channel.consumers) == 1

        assert wait_until(subscribed, LOADED)
        held.hold.hold()
        for i in range(40):
            producer.send(
                tmqp.encode_frame(message_type=MessageType.QUEUE, message_id=f"m{i}",
                                  source=producer.client_id if stamped else "",
                                  target="runs", content_type=QUEUE_ID, payload=b"b%d" % i)[0]
            )  # fmt: skip
        held.hold.release()
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
        conn.disconnect()
