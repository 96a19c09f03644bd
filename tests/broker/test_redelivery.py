"""At-least-once on queues that request acknowledges: a delivery its consumer did not
acknowledge (it went away, or its AcknowledgeTimeout passed) is sent again flagged
``Redelivered: true`` with ``Delivery-Count``; on persistent queues also after kill -9."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.client.blocking import Client, Message
from broker.engine.engine import Engine
from broker.protocol import Header
from broker.server.server import Server, ServerOptions
from tests.broker.test_durable_serve import Broker

Ctx = zmq.Context[zmq.Socket[bytes]]
ACKED = {"Status": "Push", "RequestAcknowledge": True}


@pytest.fixture
def endpoint(zctx: Ctx) -> Iterator[str]:
    with Server(Engine(), ServerOptions(endpoint="tcp://127.0.0.1:*"), context=zctx) as srv:
        assert srv.endpoint is not None
        yield srv.endpoint


def receive(c: Client) -> Message:
    m = c.receive(timeout=10)
    assert m is not None
    return m


def flags(m: Message) -> tuple[str | None, str | None]:
    return m.header(Header.REDELIVERED), m.header(Header.DELIVERY_COUNT)


def test_a_consumer_that_goes_away_unacknowledged_means_a_flagged_redelivery(
    endpoint: str, zctx: Ctx
) -> None:
    with Client(endpoint, context=zctx, timeout=10).connect() as producer:
        producer.create_queue("jobs", 1, ACKED)
        first = Client(endpoint, context=zctx, timeout=10).connect()
        first.join("jobs")
        producer.push("jobs", 1, "job")
        m = receive(first)
        assert flags(m) == (None, None)  # a first delivery carries neither
        with Client(endpoint, context=zctx, timeout=10).connect() as second:
            second.join("jobs")
            first.close()  # never acknowledged
            again = receive(second)
            assert again.payload == b"job" and again.id == m.id
            assert flags(again) == ("true", "2")
            second.ack(again)
            assert second.receive(timeout=0.3) is None


def test_an_acknowledge_timeout_means_a_flagged_redelivery(endpoint: str, zctx: Ctx) -> None:
    with Client(endpoint, context=zctx, timeout=10).connect() as c:
        c.create_queue("slow", 1, {**ACKED, "AcknowledgeTimeout": 200})
        c.join("slow")
        c.push("slow", 1, "x", headers={"Redelivered": "forged", "Delivery-Count": "9"})
        m = receive(c)
        assert m.header(Header.DELIVERY_COUNT) == "9"  # the producer's, passed through
        again = receive(c)  # not acknowledged within 200 ms: sent again
        assert flags(again) == ("true", "2")  # the broker's, not the producer's
        assert [k for k, _ in again.headers].count(Header.REDELIVERED) == 1
        third = receive(c)
        assert flags(third) == ("true", "3")
        c.ack(third)
        assert c.receive(timeout=0.5) is None


def test_delivered_before_a_kill_9_is_flagged_after_the_restart(served: Broker, zctx: Ctx) -> None:
    persistent = {**ACKED, "MessageDeliveryHandler": "persistent"}
    with Client(served.endpoint, context=zctx, timeout=10).connect() as c:
        c.create_queue("durable", 1, persistent)
        for i in range(3):
            c.push("durable", 1, f"d{i}", ack=True)
    consumer = Client(served.endpoint, context=zctx, timeout=10).connect()
    consumer.join("durable", prefetch=1)
    m = receive(consumer)
    assert m.payload == b"d0" and flags(m) == (None, None)
    with Client(served.endpoint, context=zctx, timeout=10).connect() as c:
        c.create_channel("barrier")  # acknowledged once durable: so is the note before it
    served.kill()
    consumer.close()
    served.start()
    with Client(served.endpoint, context=zctx, timeout=10).connect() as c:
        c.join("durable")
        got = [receive(c) for _ in range(3)]
        assert [(g.payload, *flags(g)) for g in got] == [
            (b"d0", "true", "2"),
            (b"d1", None, None),  # never sent before the restart
            (b"d2", None, None),
        ]
        for g in got:
            c.ack(g)
