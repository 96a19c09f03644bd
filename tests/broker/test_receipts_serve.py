"""SMQP receipts over TMQP (``broker.engine.receipts``) on a real ``broker serve``: a push
with ``Receipt: ONE|ALL`` brings its producer one receipt (a direct message, content
type 233): complete when a consumer (ONE) or every consumer sent a copy (ALL) received
it, else ``X/Y`` at the timeout or when the message left its queue; bad headers are 400,
too many pending receipts 482, and a producer that leaves costs nobody anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq

from broker.client.blocking import Client
from broker.client.errors import RemoteError
from broker.client.message import Kind, Message
from broker.protocol import RECEIPT_CONTENT_TYPE
from tests.broker.test_dsub_serve import MakeBroker, make  # noqa: F401 (fixture)
from tests.broker.test_durable_ops import Broker
from tests.polling import WAIT


def receipt_of(client: Client, timeout: float = 10) -> Message:
    """The next direct message, which must be a receipt."""
    m = client.receive(timeout=timeout)
    assert m is not None, "no receipt"
    assert m.kind is Kind.DIRECT and m.content_type == RECEIPT_CONTENT_TYPE, m
    assert m.source == "@receipts"
    return m


@pytest.fixture
def broker(make: MakeBroker) -> Iterator[Broker]:  # noqa: F811
    yield make("[limits]\nmax_pending_receipts = 3\n")


def test_receipt_one_comes_when_a_consumer_acknowledges(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with broker.client(zctx) as producer, broker.client(zctx) as consumer:
        producer.create_queue("work", 1, {"Status": "RoundRobin", "RequestAcknowledge": True})
        consumer.join("work")
        # (no producer ack: on an acknowledged queue it would wait for the consumer's)
        producer.push("work", 1, "job", message_id="j1", headers={"Receipt": "ONE"})
        got = consumer.receive(timeout=10)
        assert got is not None and got.id == "j1"
        assert producer.receive(timeout=0.3) is None  # not before the acknowledge
        consumer.ack(got)
        r = receipt_of(producer)
        assert r.header("Receipt-For") == "j1" and r.header("Receipt") == "ONE"
        assert r.header("Delivered") == "1/1" and r.header("Receipt-Status") == "complete"
        assert r.header("Channel-Name") == "work" and r.header("Queue-Id") == "1"


def test_receipt_all_on_a_broadcast_counts_every_consumer(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with (
        broker.client(zctx) as producer,
        broker.client(zctx) as a,
        broker.client(zctx) as b,
    ):
        producer.create_channel("news", {"Status": "Broadcast"})
        a.join("news")
        b.join("news")
        producer.push("news", 0, "hi", ack=True, message_id="n1", headers={"Receipt": "all"})
        for consumer in (a, b):
            m = consumer.receive(timeout=10)
            assert m is not None and m.id == "n1"
        r = receipt_of(producer)
        assert r.header("Delivered") == "2/2" and r.header("Receipt-Status") == "complete"
        # nobody online: the broadcast is dropped at once, and the receipt says so
        a.leave("news")
        b.leave("news")
        producer.push("news", 0, "void", ack=False, message_id="n2", headers={"Receipt": "ALL"})
        r = receipt_of(producer)
        assert r.header("Receipt-For") == "n2" and r.header("Delivered") == "0/0"
        assert r.header("Receipt-Status") == "incomplete"


def test_at_the_timeout_the_receipt_says_x_of_y(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with broker.client(zctx) as producer, broker.client(zctx) as consumer:
        producer.create_queue("slow", 1, {"Status": "RoundRobin", "RequestAcknowledge": True})
        consumer.join("slow")
        headers = {"Receipt": "ALL", "Receipt-Timeout": "300"}
        producer.push("slow", 1, "x", message_id="s1", headers=headers)
        held = consumer.receive(timeout=10)  # received, never acknowledged
        assert held is not None
        r = receipt_of(producer)
        assert r.header("Receipt-For") == "s1" and r.header("Delivered") == "0/1"
        assert r.header("Receipt-Status") == "incomplete"
        consumer.ack(held)  # late: no second receipt
        assert producer.receive(timeout=0.5) is None


def test_bad_receipt_headers_and_the_limit_refuse_the_push(
    broker: Broker, zctx: zmq.Context[zmq.Socket[bytes]]
) -> None:
    with broker.client(zctx) as producer:
        producer.create_queue("q", 1, {"Status": "RoundRobin"})
        for headers in ({"Receipt": "maybe"}, {"Receipt": "ONE", "Receipt-Timeout": "-5"}):
            with pytest.raises(RemoteError) as err:
                producer.push("q", 1, "x", ack=True, headers=headers)
            assert err.value.code == 400
        for i in range(3):  # no consumer: they wait (limit 3)
            producer.push("q", 1, "x", ack=True, message_id=f"w{i}", headers={"Receipt": "ONE"})
        with pytest.raises(RemoteError) as err:
            producer.push("q", 1, "x", ack=True, headers={"Receipt": "ONE"})
        assert err.value.code == 482
        producer.push("q", 1, "plain", ack=True)  # without a receipt: taken
        assert producer.queue_info("q", 1)["Messages"] == 4
    # the producer left: its pending receipts are forgotten, room for others
    with broker.client(zctx) as other, broker.client(zctx) as consumer:
        other.push("q", 1, "y", ack=True, message_id="y1", headers={"Receipt": "ONE"})
        consumer.join("q")
        taken = []  # (the four left and y1: each waited for, no quiet spell taken as the end)
        for _ in range(5):
            m = consumer.receive(timeout=WAIT)
            assert m is not None, taken
            taken.append(m.id)
        assert "y1" in taken
        r = receipt_of(other)
        assert r.header("Receipt-For") == "y1" and r.header("Receipt-Status") == "complete"
