"""Receipts and durable subscriptions on the sans-IO engine, clock under test control
(``tests.broker.engine_kit``): expected values worked out by hand."""

from __future__ import annotations

from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.protocol import (
    RECEIPT_CONTENT_TYPE,
    Header,
    MessageType,
    Operation,
    QueueStatus,
    ResultCode,
    RouterOperation,
    header,
)
from tests.broker.engine_kit import Frame, Kit


def receipts(kit: Kit, client_id: str) -> list[Frame]:
    return [
        f
        for f in kit.take(client_id)
        if f.message_type == MessageType.DIRECT and f.content_type == RECEIPT_CONTENT_TYPE
    ]


def acked_queue(kit: Kit, owner: str) -> None:
    kit.queue(owner, "work", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True)


def test_receipt_one_after_the_acknowledge_and_none_before() -> None:
    kit = Kit()
    producer, consumer = kit.connect("p"), kit.connect("c")
    acked_queue(kit, producer)
    kit.join(consumer, "work")
    kit.push(producer, "work", 1, mid="j1", headers=(("Receipt", "one"),))
    (delivered,) = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
    assert receipts(kit, producer) == []
    kit.ack(consumer, delivered)
    (r,) = receipts(kit, producer)
    assert r.source == "@receipts" and r.target == producer
    assert header(r, "Receipt-For") == "j1" and header(r, "Delivered") == "1/1"
    assert header(r, "Receipt-Status") == "complete" and header(r, "Receipt") == "ONE"
    assert len(kit.engine.receipts) == 0  # nothing left to time


def test_receipt_timeout_gives_x_of_y_once() -> None:
    kit = Kit()
    producer, consumer = kit.connect("p"), kit.connect("c")
    acked_queue(kit, producer)
    kit.join(consumer, "work")
    headers = (("Receipt", "ALL"), ("Receipt-Timeout", "1000"))
    kit.push(producer, "work", 1, mid="j1", headers=headers)
    assert kit.engine.next_deadline() == kit.now + 1.0
    kit.advance(0.999)
    assert receipts(kit, producer) == []
    kit.advance(0.001)
    (r,) = receipts(kit, producer)
    assert header(r, "Delivered") == "0/1" and header(r, "Receipt-Status") == "incomplete"
    delivered = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
    kit.ack(consumer, delivered[0])
    assert receipts(kit, producer) == []  # one receipt per message, never two


def test_the_queue_timeout_is_the_default_and_expiry_ends_it_early() -> None:
    kit = Kit()
    producer = kit.connect("p")
    kit.queue(producer, "q", 1, status=QueueStatus.ROUND_ROBIN, message_timeout=500)
    kit.push(producer, "q", 1, mid="e1", headers=(("Receipt", "ONE"),))
    kit.advance(0.5)  # the message expires: its fate is known, the receipt goes
    (r,) = receipts(kit, producer)
    assert header(r, "Receipt-For") == "e1" and header(r, "Delivered") == "0/0"


def test_a_producer_that_leaves_is_forgotten_and_a_forged_receipt_shows_its_sender() -> None:
    kit = Kit()
    producer, forger = kit.connect("p"), kit.connect("f")
    acked_queue(kit, producer)
    kit.push(producer, "work", 1, headers=(("Receipt", "ONE"),))
    assert len(kit.engine.receipts) == 1
    kit.disconnect(producer)
    assert len(kit.engine.receipts) == 0
    victim = kit.connect("v")
    kit.send(
        forger,
        Frame(
            message_type=MessageType.DIRECT,
            content_type=RECEIPT_CONTENT_TYPE,
            message_id="x",
            source="@receipts",  # an impostor: the broker puts the real sender there
            target=victim,
            headers=(("Receipt-Status", "complete"),),
        ),
    )
    (forged,) = receipts(kit, victim)
    assert forged.source == forger


def test_bad_receipt_headers_are_refused_with_400() -> None:
    kit = Kit()
    producer = kit.connect("p")
    kit.queue(producer, "q", 1, status=QueueStatus.ROUND_ROBIN)
    for bad in (("Receipt", "twice"), ("Receipt-Timeout", "0"), ("Receipt-Timeout", "9" * 12)):
        kit.push(producer, "q", 1, ack=True, mid="b", headers=(("Receipt", "ONE"), bad))
        (nack,) = [f for f in kit.take(producer) if f.message_type == MessageType.ACK]
        assert header(nack, Header.NACK_REASON) is not None
    assert kit.info(producer, "q", 1)["Messages"] == 0


def test_durable_subscription_collects_and_refuses_when_full() -> None:
    limits = Limits(max_durable_subscription_messages=2, max_durable_subscriptions=1)
    kit = Kit(config=BrokerConfig(limits=limits, wall_clock=lambda: 1_700_000_000.0))
    admin = kit.connect("a")
    kit.ok(admin, Operation.DSUB_CREATE, "d1", payload={"Topics": ["t"]})
    reply = kit.op(admin, Operation.DSUB_CREATE, "d2", payload={"Topics": ["t"]})
    assert reply.content_type == ResultCode.LIMIT_EXCEEDED
    kit.queue(admin, "t", 0, status=QueueStatus.BROADCAST)
    for i in range(2):
        kit.push(admin, "t", 0, mid=f"m{i}")
    kit.push(admin, "t", 0, ack=True, mid="m2")  # full: refused before any copy
    (nack,) = [f for f in kit.take(admin) if f.message_type == MessageType.ACK]
    assert nack.message_id == "m2" and header(nack, Header.NACK_REASON) is not None
    listed = kit.json(admin, Operation.DSUB_LIST)
    assert listed == [{"Id": "d1", "Topics": ["t"], "Messages": 2, "Consumers": 0}]
    reader = kit.connect("r")
    kit.join(reader, "/dsub/d1")
    assert kit.payloads(reader) == [b"x", b"x"]
    kit.ok(admin, Operation.DSUB_DESTROY, "d1")
    assert "/dsub/d1" not in kit.engine.channels
    assert kit.op(admin, Operation.DSUB_DESTROY, "d1").content_type == ResultCode.NOT_FOUND
    for target, payload in [
        ("d3", b"not json"),
        ("d3", {"Topics": "t"}),
        ("d3", {"Topics": ["/dsub/d3"]}),
        ("bad id", {"Topics": ["t"]}),
    ]:
        bad = kit.op(admin, Operation.DSUB_CREATE, target, payload=payload)
        assert bad.content_type == ResultCode.BAD_REQUEST, (target, payload)


def test_a_router_publishing_into_a_topic_feeds_its_durable_subscriptions() -> None:
    kit = Kit()
    admin = kit.connect("a")
    kit.queue(admin, "t", 0, status=QueueStatus.BROADCAST)
    kit.ok(admin, Operation.DSUB_CREATE, "d", payload={"Topics": ["t"]})
    kit.ok(admin, RouterOperation.ROUTER_CREATE, "r")
    binding = {"Name": "b", "Type": "Queue", "Target": "t", "Queue": 0}
    kit.ok(admin, RouterOperation.BINDING_ADD, "r", payload=binding)
    kit.send(
        admin,
        Frame(message_type=MessageType.ROUTER, target="r", message_id="x1", payload=b"via"),
    )
    reader = kit.connect("r")
    kit.join(reader, "/dsub/d")
    assert kit.payloads(reader) == [b"via"]
