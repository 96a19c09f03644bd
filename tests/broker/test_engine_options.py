"""Options, limits and channel/queue operations (JSON models with PascalCase names)."""

from __future__ import annotations

import json

import pytest

from broker.engine.options import BrokerConfig, ChannelOptions, ChannelQueueOptions, OptionsError
from broker.protocol import Header, MessageType, NackReason, Operation, QueueStatus, header
from tests.broker.engine_kit import Kit, acks, queue_messages

QID = ((Header.QUEUE_ID, "1"),)


def test_queue_options_round_trip_with_document_names() -> None:
    opts = ChannelQueueOptions(
        request_acknowledge=True, status=QueueStatus.ROUND_ROBIN, message_limit=5, tag="t"
    )
    data = opts.to_json()
    assert data["RequestAcknowledge"] is True and data["Status"] == 2 and data["MessageLimit"] == 5
    assert ChannelQueueOptions.from_json(json.dumps(data)) == opts
    camel = ChannelQueueOptions.from_json(b'{"requestAcknowledge": true, "status": "Pull"}')
    assert camel.request_acknowledge and camel.status is QueueStatus.PULL


def test_missing_keys_take_the_base_and_bad_ones_are_refused() -> None:
    base = ChannelQueueOptions(acknowledge_timeout=42)
    assert ChannelQueueOptions.from_json("{}", base=base).acknowledge_timeout == 42
    for bad in (
        '{"Nope": 1}',
        '{"MessageLimit": -1}',
        '{"Status": 9}',
        '{"UseMessageId": 1}',
        "[1]",
        "not json",
    ):
        with pytest.raises(OptionsError):
            ChannelQueueOptions.from_json(bad)


def test_channel_options_include_queue_defaults() -> None:
    opts = ChannelOptions.from_json('{"ClientLimit": 3, "Status": "Pull", "AllowedQueues": [1]}')
    assert opts.client_limit == 3 and opts.queue.status is QueueStatus.PULL
    assert opts.allowed_queues == (1,)
    assert ChannelOptions.from_json(json.dumps(opts.to_json())) == opts


def test_channel_operations() -> None:
    kit = Kit()
    a = kit.connect("a")
    kit.ok(a, Operation.CHANNEL_CREATE, "orders", payload={"QueueLimit": 2, "Status": 3})
    assert kit.op(a, Operation.CHANNEL_CREATE, "orders").content_type == 481
    bad = kit.op(a, Operation.CHANNEL_CREATE, "bad name")
    assert bad.content_type == 400 and header(bad, Header.REASON)
    assert kit.op(a, Operation.CHANNEL_CREATE, "x", payload=b"{oops").content_type == 400
    kit.ok(a, Operation.CHANNEL_CREATE, "other")
    names = [c["Name"] for c in kit.json(a, Operation.CHANNEL_LIST, "ord*")]
    assert names == ["orders"]
    assert len(kit.json(a, Operation.CHANNEL_LIST)) == 2
    info = kit.json(a, Operation.CHANNEL_INFO, "orders")
    assert info["QueueLimit"] == 2 and info["Queues"] == []
    kit.ok(a, Operation.CHANNEL_UPDATE, "orders", payload={"ClientLimit": 7})
    assert kit.json(a, Operation.CHANNEL_INFO, "orders")["ClientLimit"] == 7
    kit.ok(a, Operation.QUEUE_CREATE, "orders", headers=QID)
    assert kit.info(a, "orders", 1)["Status"] == "Pull"  # channel's queue defaults
    kit.ok(a, Operation.CHANNEL_DELETE, "orders")
    assert kit.op(a, Operation.CHANNEL_INFO, "orders", response=True).content_type == 404


def test_queue_operations_and_errors() -> None:
    kit = Kit()
    a = kit.connect("a")
    assert kit.op(a, Operation.QUEUE_CREATE, "ch").content_type == 400  # no Queue-Id
    bad_id = kit.op(a, Operation.QUEUE_CREATE, "ch", headers=((Header.QUEUE_ID, "x"),))
    assert bad_id.content_type == 400
    kit.ok(a, Operation.QUEUE_CREATE, "ch", headers=QID, payload={"Status": "Pull"})
    assert kit.op(a, Operation.QUEUE_CREATE, "ch", headers=QID).content_type == 481
    assert kit.op(a, Operation.QUEUE_UPDATE, "ch", headers=QID).content_type == 400  # no body
    upd = kit.op(a, Operation.QUEUE_UPDATE, "ch", headers=QID, payload={"Bogus": True})
    assert upd.content_type == 400
    other = ((Header.QUEUE_ID, "2"),)
    missing = kit.op(a, Operation.QUEUE_DELETE, "ch", headers=other)
    assert missing.content_type == 404 and header(missing, Header.NACK_REASON) == "no-queue"
    listing = kit.json(a, Operation.QUEUE_LIST, "ch")
    assert listing == [
        {
            "Channel": "ch",
            "Id": 1,
            "Tag": None,
            "Status": "Pull",
            "PriorityMessages": 0,
            "Messages": 0,
        }
    ]
    info = kit.info(a, "ch", 1)
    for key in (
        "ReceivedMessages",
        "SentMessages",
        "Deliveries",
        "NegativeAcks",
        "Acks",
        "TimeoutMessages",
        "SavedMessages",
        "RemovedMessages",
        "Errors",
        "LastMessageReceived",
        "LastMessageSent",
        "MessageLimit",
        "MessageSizeLimit",
    ):
        assert key in info
    kit.ok(a, Operation.QUEUE_DELETE, "ch", headers=QID)
    assert kit.json(a, Operation.QUEUE_LIST, "ch") == []


def test_unknown_operation_is_a_bad_request() -> None:
    kit = Kit()
    a = kit.connect("a")
    assert kit.op(a, 999, "x").content_type == 400


def test_message_limit_and_size_limit_are_482() -> None:
    kit = Kit()
    p = kit.connect("p")
    kit.queue(p, "ch", 1, status=QueueStatus.PULL, message_limit=2, message_size_limit=10)
    kit.push(p, "ch", 1, b"1", ack=True)
    kit.push(p, "ch", 1, b"2", ack=True)
    kit.push(p, "ch", 1, b"3", ack=True)
    kit.push(p, "ch", 1, b"x" * 11, ack=True)
    results = [header(a, Header.NACK_REASON) for a in acks(kit.take(p))]
    assert results == [None, None, NackReason.LIMIT_EXCEEDED, NackReason.LIMIT_EXCEEDED]
    assert kit.info(p, "ch", 1)["Messages"] == 2


def test_rejected_push_waiting_for_a_response_gets_the_code() -> None:
    from broker import tmqp

    kit = Kit()
    p = kit.connect("p")
    kit.queue(p, "ch", 1, status=QueueStatus.STOPPED)
    kit.send(
        p,
        tmqp.Frame(
            message_type=MessageType.QUEUE,
            content_type=1,
            target="ch",
            message_id="r",
            pending_response=True,
        ),
    )
    (reply,) = kit.take(p)
    assert reply.message_type == MessageType.RESPONSE and reply.content_type == 406


def test_use_message_id_assigns_ids_and_hide_client_names() -> None:
    kit = Kit()
    p, c = kit.connect("p"), kit.connect("c")
    kit.queue(p, "ch", 1, use_message_id=True, hide_client_names=True)
    kit.join(c, "ch")
    kit.push(p, "ch", 1, b"x", mid="")
    (got,) = queue_messages(kit.take(c))
    assert got.message_id and got.source == ""
    kit.queue(p, "ch", 2, use_message_id=False)
    kit.push(p, "ch", 2, b"y", mid="")
    (got,) = queue_messages(kit.take(c))
    assert got.message_id == "" and got.source == p


def test_send_only_first_acquirer_and_one_delivery_flag() -> None:
    kit = Kit()
    p = kit.connect("p")
    first, second = kit.connect("first"), kit.connect("second")
    kit.queue(p, "ch", 1, send_only_first_acquirer=True)
    kit.queue(p, "ch", 2)
    kit.join(first, "ch")
    kit.join(second, "ch")
    kit.push(p, "ch", 1, b"a")
    kit.push(p, "ch", 2, b"b", first=True)
    kit.push(p, "ch", 2, b"c")
    assert kit.payloads(first) == [b"a", b"b", b"c"]
    assert kit.payloads(second) == [b"c"]


def test_cc_copies_into_other_queues_all_or_nothing() -> None:
    kit = Kit()
    p = kit.connect("p")
    for channel, qid in (("main", 1), ("copy", 1), ("copy", 5)):
        kit.queue(p, channel, qid, status=QueueStatus.PULL)
    kit.push(
        p,
        "main",
        1,
        b"m",
        ack=True,
        mid="orig",
        headers=(("cc", "copy"), ("CC", "copy;5;given-id"), ("X", "kept")),
    )
    (ack,) = acks(kit.take(p))
    assert ack.message_id == "orig" and header(ack, Header.NACK_REASON) is None
    queues = kit.engine.channels
    (m5,) = queues["copy"].queues[5].messages.regular
    assert m5.message_id == "given-id" and m5.message.header("X") == "kept"
    assert m5.message.header("cc") is None
    (m1,) = queues["copy"].queues[1].messages.regular
    assert m1.message_id not in ("orig", "given-id", "")
    kit.update(p, "copy", 5, MessageLimit=1)
    kit.push(p, "main", 1, b"n", ack=True, headers=(("CC", "copy;5"),))
    (nack,) = acks(kit.take(p))
    assert header(nack, Header.NACK_REASON) == NackReason.LIMIT_EXCEEDED
    assert queues["main"].queues[1].message_count == 1  # nothing pushed anywhere
    kit.push(p, "main", 1, b"o", ack=True, headers=(("CC", "copy;notanumber"),))
    assert header(acks(kit.take(p))[0], Header.NACK_REASON) == NackReason.BAD_REQUEST


def test_client_limit_queue_limit_and_allowed_queues() -> None:
    kit = Kit()
    a, b = kit.connect("a"), kit.connect("b")
    payload = {"ClientLimit": 1, "QueueLimit": 2, "AllowedQueues": [1, 2, 3]}
    kit.ok(a, Operation.CHANNEL_CREATE, "ch", payload=payload)
    kit.join(a, "ch")
    assert kit.op(b, Operation.JOIN, "ch").content_type == 482
    kit.ok(a, Operation.QUEUE_CREATE, "ch", headers=QID)
    assert (
        kit.op(a, Operation.QUEUE_CREATE, "ch", headers=((Header.QUEUE_ID, "9"),)).content_type
        == 406
    )
    kit.ok(a, Operation.QUEUE_CREATE, "ch", headers=((Header.QUEUE_ID, "2"),))
    assert (
        kit.op(a, Operation.QUEUE_CREATE, "ch", headers=((Header.QUEUE_ID, "3"),)).content_type
        == 482
    )
    kit.push(a, "ch", 9, ack=True)  # auto-create obeys the same rules
    assert header(acks(kit.take(a))[0], Header.NACK_REASON) == NackReason.UNACCEPTABLE


def test_single_queue_channel() -> None:
    kit = Kit()
    a = kit.connect("a")
    kit.ok(a, Operation.CHANNEL_CREATE, "one", payload={"AllowMultipleQueues": False})
    kit.ok(a, Operation.QUEUE_CREATE, "one", headers=QID)
    assert (
        kit.op(a, Operation.QUEUE_CREATE, "one", headers=((Header.QUEUE_ID, "2"),)).content_type
        == 406
    )


def test_destroy_when_empty() -> None:
    kit = Kit()
    a, c = kit.connect("a"), kit.connect("c")
    kit.ok(
        a,
        Operation.CHANNEL_CREATE,
        "tmp",
        payload={"DestroyWhenEmpty": True, "Status": "Pull", "MessageTimeout": 1000},
    )
    kit.join(c, "tmp")
    kit.push(a, "tmp", 1, b"x")
    kit.ok(c, Operation.LEAVE, "tmp")
    assert "tmp" in kit.engine.channels  # a message is still waiting
    kit.advance(1.5)  # ... until it times out
    assert "tmp" not in kit.engine.channels
    kit.ok(a, Operation.CHANNEL_CREATE, "tmp2", payload={"DestroyWhenEmpty": True})
    kit.join(c, "tmp2")
    kit.disconnect(c)
    assert "tmp2" not in kit.engine.channels


def test_auto_create_can_be_turned_off() -> None:
    kit = Kit(config=BrokerConfig(auto_create_channel=False, auto_create_queue=False))
    a = kit.connect("a")
    kit.push(a, "nowhere", 1, ack=True)
    assert header(acks(kit.take(a))[0], Header.NACK_REASON) == NackReason.NO_CHANNEL
    assert kit.op(a, Operation.JOIN, "nowhere").content_type == 404
    kit.ok(a, Operation.CHANNEL_CREATE, "ch")
    kit.push(a, "ch", 1, ack=True)
    assert header(acks(kit.take(a))[0], Header.NACK_REASON) == NackReason.NO_QUEUE


def test_client_and_node_lists() -> None:
    kit = Kit()
    a = kit.connect("a", name="A", type="web", token="t")
    kit.connect("b", type="worker")
    kit.now += 2.0
    workers = kit.json(a, Operation.CLIENT_LIST, "worker")
    assert workers == [
        {"Id": "b", "Name": None, "Type": "worker", "Online": 2000, "IsAuthenticated": False}
    ]
    assert len(kit.json(a, Operation.CLIENT_LIST)) == 2
    assert kit.json(a, Operation.NODE_LIST) == []


def test_unknown_delivery_handler_key_is_refused() -> None:
    kit = Kit()
    a = kit.connect("a")
    reply = kit.op(
        a, Operation.QUEUE_CREATE, "ch", headers=QID, payload={"MessageDeliveryHandler": "nope"}
    )
    assert reply.content_type == 400
    kit.ok(a, Operation.QUEUE_CREATE, "ch", headers=QID)
    assert kit.update(a, "ch", 1, MessageDeliveryHandler="nope").content_type == 400
