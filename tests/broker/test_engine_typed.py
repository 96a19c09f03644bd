"""The engine's typed operations: a front door other than TMQP (STOMP, a federation link)
publishes, subscribes, acknowledges and pulls with :class:`broker.message.Message` values
and never builds a TMQP frame.  TMQP clients on the same engine see the same messages.

This module does not import the TMQP codec: the TMQP side of each test is the kit's
(frames in through ``Engine.receive``; deliveries out encoded and decoded as the server
and a client would).
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.engine.errors import OperationError
from broker.engine.options import BrokerConfig
from broker.message import Message
from broker.protocol import (
    ClearOption,
    Header,
    MessageType,
    NackReason,
    NoContent,
    QueueStatus,
    ResultCode,
    Tracked,
    header,
)
from tests.broker.engine_kit import Kit


def typed_kit(*typed: str, **engine: Any) -> Kit:
    kit = Kit(**engine)
    kit.typed.update(typed)
    return kit


def messages(items: list[Any]) -> list[Message]:
    return [m for m in items if isinstance(m, Message)]


def frames_of(items: list[Any], message_type: MessageType) -> list[Any]:
    return [f for f in items if not isinstance(f, Message) and f.message_type == message_type]


def test_a_typed_producer_reaches_a_tmqp_consumer_and_hears_its_acknowledge() -> None:
    kit = typed_kit("typed-p")
    c = kit.connect("c")
    p = kit.connect("typed-p")
    kit.queue(c, "ch", 1, request_acknowledge=True)
    kit.join(c, "ch")
    sent = Message(
        "m1", p, "ch", 1, high_priority=True, wants_ack=True, headers=(("X", "1"),), payload=b"hi"
    )
    kit.route(kit.engine.publish(p, sent, kit.now))
    (got,) = frames_of(kit.take(c), MessageType.QUEUE)
    assert (got.payload, got.message_id, got.source, got.target, got.content_type) == (
        b"hi",
        "m1",
        p,
        "ch",
        1,
    )
    assert got.high_priority and got.pending_ack and header(got, "X") == "1"
    assert kit.take(p) == []  # the producer waits for the consumer's acknowledge
    kit.ack(c, got)
    (ack,) = kit.take(p)
    assert ack.message_type == MessageType.ACK and ack.message_id == "m1"
    assert header(ack, Header.NACK_REASON) is None
    info = kit.info(c, "ch", 1)
    assert (info["ReceivedMessages"], info["Acks"], info["PendingAcknowledges"]) == (1, 1, 0)


def test_a_tmqp_producer_reaches_a_typed_consumer_that_acknowledges() -> None:
    kit = typed_kit("typed-c")
    p = kit.connect("p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, request_acknowledge=True)
    assert kit.route(kit.engine.subscribe(c, "ch", kit.now, prefetch=5)) == []
    mid = kit.push(p, "ch", 1, b"payload", ack=True, headers=(("K", "v"),))
    (m,) = messages(kit.take(c))
    assert m == Message(mid, p, "ch", 1, wants_ack=True, headers=(("K", "v"),), payload=b"payload")
    assert kit.take(p) == []
    kit.route(kit.engine.acknowledge(c, "ch", 1, mid, kit.now))
    (ack,) = kit.take(p)
    assert ack.message_type == MessageType.ACK and ack.message_id == mid
    assert header(ack, Header.NACK_REASON) is None
    assert kit.info(p, "ch", 1)["Acks"] == 1


def test_a_typed_negative_acknowledge_sends_the_message_again() -> None:
    kit = typed_kit("typed-c", "typed-p")
    p = kit.connect("typed-p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, request_acknowledge=True)
    kit.route(kit.engine.subscribe(c, "ch", kit.now))
    kit.route(kit.engine.publish(p, Message("m1", p, "ch", 1, payload=b"again"), kit.now))
    (first,) = messages(kit.take(c))
    assert first.header(Header.DELIVERY_COUNT) is None
    nack = kit.engine.acknowledge(c, "ch", 1, "m1", kit.now, nack_reason=NackReason.TIMEOUT)
    kit.route(nack)
    (second,) = messages(kit.take(c))
    assert second.payload == b"again" and second.header(Header.DELIVERY_COUNT) == "2"
    info = kit.info(p, "ch", 1)
    assert (info["NegativeAcks"], info["Acks"], info["PendingAcknowledges"]) == (1, 0, 1)
    # an acknowledge that matches nothing (twice the same, or an unknown id) changes nothing
    kit.route(kit.engine.acknowledge(c, "ch", 1, "m1", kit.now))
    kit.route(kit.engine.acknowledge(c, "ch", 1, "m1", kit.now))
    kit.route(kit.engine.acknowledge(c, "ch", 1, "nope", kit.now))
    assert kit.engine.unmatched_acks == 2
    assert kit.info(p, "ch", 1)["Acks"] == 1


def test_a_typed_pull_takes_messages_in_order_and_ends_with_a_marker() -> None:
    kit = typed_kit("typed-c", "typed-p")
    p = kit.connect("typed-p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, status=QueueStatus.PULL)
    for i in range(3):
        kit.route(kit.engine.publish(p, Message(f"m{i}", p, "ch", 1, payload=b"%d" % i), kit.now))
    assert kit.take(c) == []  # a pull queue sends nothing on its own
    kit.route(kit.engine.subscribe(c, "ch", kit.now))
    kit.route(kit.engine.pull(c, "ch", 1, "r1", kit.now, count=2, info=True))
    answer = kit.take(c)
    got = messages(answer)
    assert [m.payload for m in got] == [b"0", b"1"]
    assert [m.header(Header.INDEX) for m in got] == ["1", "2"]
    assert {m.header(Header.REQUEST_ID) for m in got} == {"r1"}
    assert got[-1].header(Header.MESSAGES) == "1"
    (end,) = frames_of(answer, MessageType.QUEUE)
    assert header(end, Header.NO_CONTENT) == NoContent.END
    kit.route(kit.engine.pull(c, "ch", 1, "r2", kit.now, lifo=True, clear=ClearOption.ALL))
    assert [m.payload for m in messages(kit.take(c))] == [b"2"]
    assert kit.info(p, "ch", 1)["Messages"] == 0


def test_a_typed_pull_that_is_not_allowed_gets_markers_not_messages() -> None:
    kit = typed_kit("typed-c", "typed-p")
    p = kit.connect("typed-p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, status=QueueStatus.PULL)
    kit.route(kit.engine.publish(p, Message("m", p, "ch", 1, payload=b"kept"), kit.now))
    kit.route(kit.engine.pull(c, "ch", 1, "r1", kit.now))  # not a consumer of the channel
    answer = kit.take(c)
    assert messages(answer) == []
    tokens = [header(f, Header.NO_CONTENT) for f in answer]
    assert tokens == [NoContent.UNAUTHORIZED, NoContent.END]
    kit.route(kit.engine.subscribe(c, "ch", kit.now))
    kit.route(kit.engine.pull(c, "ch", 1, "r2", kit.now, count=0))
    answer = kit.take(c)
    assert messages(answer) == []
    assert [header(f, Header.NO_CONTENT) for f in answer] == [
        NoContent.UNACCEPTABLE,
        NoContent.END,
    ]
    assert kit.info(p, "ch", 1)["Messages"] == 1


def test_a_refused_typed_publish_is_answered_only_to_a_producer_that_waits() -> None:
    kit = typed_kit("typed-p", config=BrokerConfig(auto_create_channel=False))
    p = kit.connect("typed-p")
    lost = Message("m1", p, "nowhere", 1, payload=b"x")
    assert kit.route(kit.engine.publish(p, lost, kit.now)) == []
    kit.route(kit.engine.publish(p, lost.replace(wants_ack=True), kit.now))
    (nack,) = kit.take(p)
    assert nack.message_type == MessageType.ACK and nack.message_id == "m1"
    assert header(nack, Header.NACK_REASON) == NackReason.NO_CHANNEL
    kit.route(kit.engine.publish(p, lost, kit.now, wants_response=True))
    (response,) = kit.take(p)
    assert response.message_type == MessageType.RESPONSE
    assert response.content_type == ResultCode.NOT_FOUND
    assert kit.engine.channels == {}


def test_typed_subscribe_refusals_raise_and_change_nothing() -> None:
    kit = typed_kit("typed-c", config=BrokerConfig(auto_create_channel=False))
    c = kit.connect("typed-c")
    with pytest.raises(OperationError) as missing:
        kit.engine.subscribe(c, "nowhere", kit.now)
    assert missing.value.code == ResultCode.NOT_FOUND
    with pytest.raises(OperationError) as bad:
        kit.engine.subscribe(c, "nowhere", kit.now, prefetch=0)
    assert bad.value.code == ResultCode.BAD_REQUEST
    with pytest.raises(OperationError) as not_member:
        kit.engine.unsubscribe(c, "nowhere", kit.now)
    assert not_member.value.code == ResultCode.NOT_FOUND
    assert kit.engine.channels == {} and kit.engine.clients[c].channels == {}


def test_typed_operations_for_an_unknown_client_do_nothing() -> None:
    kit = Kit()
    engine = kit.engine
    assert engine.publish("ghost", Message("m", "ghost", "ch", 1, wants_ack=True), 1.0) == []
    assert engine.subscribe("ghost", "ch", 1.0) == []
    assert engine.acknowledge("ghost", "ch", 1, "m", 1.0) == []
    assert engine.pull("ghost", "ch", 1, "r", 1.0) == []
    assert engine.channels == {} and engine.errors == 0


def test_typed_deliveries_are_tracked_for_flow_control() -> None:
    kit = typed_kit("typed-c", "typed-p", auto_transmit=False)
    p = kit.connect("typed-p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1)
    kit.route(kit.engine.subscribe(c, "ch", kit.now, prefetch=2))
    outs = []
    for i in range(3):
        outs += kit.engine.publish(p, Message(f"m{i}", p, "ch", 1, payload=b"%d" % i), kit.now)
    delivered = [o for o in outs if isinstance(o, Tracked)]
    assert [o.frame.payload for o in delivered] == [b"0", b"1"]  # the window holds two
    assert all(isinstance(o.frame, Message) for o in delivered)
    more = kit.engine.transmitted({c: 2}, kit.now)
    assert [o.frame.payload for o in more if isinstance(o, Tracked)] == [b"2"]


def test_acknowledge_many_settles_each_in_order_as_separate_calls_would() -> None:
    """The STOMP door's batch of settles: acks and nacks of one client in one call; one
    that matches nothing is counted and does not stop the ones after it."""
    kit = typed_kit("typed-c", "typed-p")
    p = kit.connect("typed-p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, request_acknowledge=True)
    kit.route(kit.engine.subscribe(c, "ch", kit.now))
    for i in (1, 2, 3):
        kit.route(kit.engine.publish(p, Message(f"m{i}", p, "ch", 1, payload=b"%d" % i), kit.now))
    assert [m.message_id for m in messages(kit.take(c))] == ["m1", "m2", "m3"]
    acks = [
        ("ch", 1, "m1", None),
        ("ch", 1, "nope", None),
        ("ch", 1, "m2", NackReason.TIMEOUT),
        ("ch", 1, "m3", None),
    ]
    kit.route(kit.engine.acknowledge_many(c, acks, kit.now))
    (again,) = messages(kit.take(c))
    assert again.message_id == "m2" and again.header(Header.DELIVERY_COUNT) == "2"
    info = kit.info(p, "ch", 1)
    assert (info["Acks"], info["NegativeAcks"], info["PendingAcknowledges"]) == (2, 1, 1)
    assert kit.engine.unmatched_acks == 1
    assert kit.engine.acknowledge_many("ghost", acks, kit.now) == []


def test_a_consumer_that_acknowledges_by_taking_is_acknowledged_once_each_is_sent() -> None:
    """``Engine.acknowledge_taken`` (STOMP's ``ack:auto``): a delivery the queue wants
    acknowledged is acknowledged when the transport reports it taken -- the producer
    hears of it then, the window slot comes back -- and what was never taken goes back
    to the queue when the consumer leaves, as any unacknowledged delivery does."""
    kit = typed_kit("typed-c", "typed-d", auto_transmit=False)
    p = kit.connect("p")
    c = kit.connect("typed-c")
    kit.queue(p, "ch", 1, request_acknowledge=True)
    assert not kit.engine.acknowledge_taken(c, "ch")  # not a consumer of it: nothing set
    kit.route(kit.engine.subscribe(c, "ch", kit.now, prefetch=2))
    assert kit.engine.acknowledge_taken(c, "ch")
    mids = [kit.push(p, "ch", 1, b"%d" % i, ack=True) for i in range(4)]
    assert [m.payload for m in messages(kit.take(c))] == [b"0", b"1"]  # its window
    assert kit.take(p) == []  # handed to the transport, not taken yet: nothing acknowledged
    kit.transmit(c, 1)
    (ack,) = kit.take(p)
    assert ack.message_id == mids[0] and header(ack, Header.NACK_REASON) is None
    assert [m.payload for m in messages(kit.take(c))] == [b"2"]  # the slot came back
    info = kit.info(p, "ch", 1)
    assert (info["Acks"], info["PendingAcknowledges"]) == (1, 2)
    kit.disconnect(c)  # "1" and "2" were never taken: back to the queue, in order
    d = kit.connect("typed-d")
    kit.route(kit.engine.subscribe(d, "ch", kit.now))  # acknowledges each itself
    kit.transmit(d)
    got = messages(kit.take(d))
    assert [m.payload for m in got] == [b"1", b"2", b"3"]
    assert kit.take(p) == []  # taken, but d acknowledges by ACK only
    for m in got:
        kit.route(kit.engine.acknowledge(d, "ch", 1, m.message_id, kit.now))
    assert sorted(a.message_id for a in kit.take(p)) == sorted(mids[1:])
    # leaving the channel ends it: joined again, deliveries wait for an acknowledge
    assert kit.engine.acknowledge_taken(d, "ch")
    kit.route(kit.engine.unsubscribe(d, "ch", kit.now))
    kit.route(kit.engine.subscribe(d, "ch", kit.now))
    kit.push(p, "ch", 1, b"4", ack=True)
    kit.transmit(d)
    assert [m.payload for m in messages(kit.take(d))] == [b"4"]
    assert kit.take(p) == [] and kit.info(p, "ch", 1)["PendingAcknowledges"] == 1
