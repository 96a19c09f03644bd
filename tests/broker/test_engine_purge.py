"""Purging a queue (the QUEUE_PURGE operation) on the sans-IO engine: expected values
worked out by hand."""

from __future__ import annotations

from broker.engine.auth import Action, TokenAuthorizer
from broker.protocol import Header, MessageType, Operation, ResultCode
from tests.broker.engine_kit import Kit

PULL, PUSH = 3, 1
QID = ((Header.QUEUE_ID, "1"),)


def test_purge_removes_the_waiting_messages_and_the_queue_goes_on() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "orders", 1, status=PULL)
    for i in range(3):
        kit.push(producer, "orders", 1, f"p{i}".encode(), ack=(i == 1))
    kit.take(producer)

    answer = kit.json(producer, Operation.QUEUE_PURGE, "orders", headers=QID)

    assert answer == {"Removed": 3}
    info = kit.info(producer, "orders", 1)
    assert info["Messages"] == 0 and info["RemovedMessages"] == 3
    # the queue still works afterwards
    kit.push(producer, "orders", 1, b"after")
    assert kit.info(producer, "orders", 1)["Messages"] == 1


def test_purge_keeps_deliveries_waiting_for_an_acknowledgement() -> None:
    kit = Kit()
    consumer = kit.connect("consumer")
    kit.queue(consumer, "jobs", 1, status=PUSH, request_acknowledge=True)
    kit.update(consumer, "jobs", 1, Prefetch=1)
    kit.join(consumer, "jobs")
    producer = kit.connect("producer")
    for i in range(3):
        kit.push(producer, "jobs", 1, f"j{i}".encode())
    delivered = [f for f in kit.take(consumer) if f.message_type == MessageType.QUEUE]
    assert [f.payload for f in delivered] == [b"j0"]  # the window holds one

    assert kit.json(producer, Operation.QUEUE_PURGE, "jobs", headers=QID) == {"Removed": 2}
    assert kit.info(producer, "jobs", 1)["PendingAcknowledges"] == 1
    kit.ack(consumer, delivered[0])
    assert kit.info(producer, "jobs", 1)["Acks"] == 1


def test_purge_needs_queue_update_and_an_existing_queue() -> None:
    kit = Kit(
        authorizer=TokenAuthorizer(
            {"admin": set(Action), "viewer": {Action.QUEUE_LIST, Action.PUSH}}
        )
    )
    admin = kit.connect("admin", token="admin")
    viewer = kit.connect("viewer", token="viewer")
    kit.queue(admin, "orders", 1, status=PULL)
    kit.push(viewer, "orders", 1, b"kept")

    refused = kit.op(viewer, Operation.QUEUE_PURGE, "orders", headers=QID, response=True)
    assert refused.content_type == ResultCode.UNAUTHORIZED
    assert kit.info(admin, "orders", 1)["Messages"] == 1
    missing = kit.op(
        admin, Operation.QUEUE_PURGE, "orders", headers=((Header.QUEUE_ID, "9"),), response=True
    )
    assert missing.content_type == ResultCode.NOT_FOUND
