"""Acknowledges, ack timeouts, put-backs, message timeouts and delivery handlers (fake clock)."""

from __future__ import annotations

import pytest

from broker.engine.delivery import (
    ALLOW,
    DENY,
    AckWhen,
    Decision,
    DefaultDeliveryHandler,
    DeliveryHandler,
    PersistentDeliveryHandler,
    PutBack,
)
from broker.protocol import Header, NackReason, QueueStatus, header
from broker.store import MemoryStore
from tests.broker.engine_kit import Kit, acks, queue_messages


def acked_queue(
    kit: Kit, status: QueueStatus = QueueStatus.PUSH, consumers: int = 1, **options: object
) -> tuple[str, list[str]]:
    producer = kit.connect("producer")
    options.setdefault("request_acknowledge", True)
    options.setdefault("acknowledge_timeout", 1000)
    kit.queue(producer, "ch", 1, status=status, **options)
    names = [kit.connect(f"c{i}") for i in range(consumers)]
    for name in names:
        kit.join(name, "ch")
    return producer, names


def test_consumer_ack_is_relayed_to_the_producer() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit)
    mid = kit.push(producer, "ch", 1, b"job", ack=True)
    (delivered,) = queue_messages(kit.take(c))
    assert delivered.pending_ack
    assert acks(kit.take(producer)) == []  # not yet: the consumer must ack first
    kit.ack(c, delivered)
    (ack,) = acks(kit.take(producer))
    assert (ack.message_id, ack.source, ack.target, ack.content_type) == (mid, c, "ch", 1)
    assert header(ack, Header.NACK_REASON) is None
    info = kit.info(producer, "ch", 1)
    assert (info["Acks"], info["PendingAcknowledges"]) == (1, 0)


def test_producer_without_consumer_acks_is_acknowledged_on_receipt() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    mid = kit.push(producer, "ch", 1, b"x", ack=True)
    (ack,) = acks(kit.take(producer))
    assert ack.message_id == mid and ack.source == ""


def test_nack_puts_the_message_back_at_the_end_and_it_is_redelivered() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit, wait_for_acknowledge=True)
    kit.push(producer, "ch", 1, b"a", ack=True)
    kit.push(producer, "ch", 1, b"b", ack=True)
    (first,) = queue_messages(kit.take(c))  # wait-for-ack: one at a time
    assert first.payload == b"a"
    kit.ack(c, first, nack="busy")
    assert acks(kit.take(producer)) == []  # default handler retries instead of nacking
    (second,) = queue_messages(kit.take(c))
    assert second.payload == b"b"
    kit.ack(c, second)
    (again,) = queue_messages(kit.take(c))
    assert again.payload == b"a"
    kit.ack(c, again)
    assert len(acks(kit.take(producer))) == 2
    assert kit.info(producer, "ch", 1)["NegativeAcks"] == 1


def test_ack_timeout_puts_back_at_the_start_in_order() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit, status=QueueStatus.PULL)
    for n in range(3):
        kit.push(producer, "ch", 1, b"%d" % n)
    frames = kit.pull(c, "ch", 1, headers=((Header.COUNT, "2"),))
    assert [f.payload for f in queue_messages(frames) if f.payload] == [b"0", b"1"]
    assert kit.engine.next_deadline() == pytest.approx(kit.now + 1.0)
    kit.advance(0.999)
    assert kit.info(producer, "ch", 1)["Messages"] == 1
    kit.advance(0.002)
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["PendingAcknowledges"], info["NegativeAcks"]) == (3, 0, 2)
    frames = kit.pull(c, "ch", 1, headers=((Header.COUNT, "3"),))
    assert [f.payload for f in frames if f.payload] == [b"0", b"1", b"2"]


def test_late_ack_after_timeout_is_ignored() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit)
    kit.push(producer, "ch", 1, b"x", ack=True)
    (delivered,) = queue_messages(kit.take(c))
    kit.advance(1.5)  # timeout: put back and redelivered to the same consumer
    (redelivered,) = queue_messages(kit.take(c))
    kit.ack(c, delivered)  # matches the redelivery (same id): fine, exactly one ack
    kit.ack(c, redelivered)  # nothing pending any more
    assert len(acks(kit.take(producer))) == 1
    assert kit.engine.stats()["unmatched_acks"] == 1


def test_consumer_disconnect_returns_its_unacked_messages_at_once() -> None:
    kit = Kit()
    producer, (a, b) = acked_queue(kit, status=QueueStatus.ROUND_ROBIN, consumers=2)
    kit.push(producer, "ch", 1, b"0")
    kit.push(producer, "ch", 1, b"1")
    (to_a,) = queue_messages(kit.take(a))
    (to_b,) = queue_messages(kit.take(b))
    kit.disconnect(a)
    (moved,) = queue_messages(kit.take(b))
    assert moved.payload == to_a.payload
    assert to_b.payload != to_a.payload
    kit.ack(b, to_b)
    kit.ack(b, moved)
    assert kit.info(producer, "ch", 1)["PendingAcknowledges"] == 0


def test_put_back_limit_drops_and_nacks_the_producer() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit, put_back_limit=2)
    kit.push(producer, "ch", 1, b"poison", ack=True)
    for _ in range(3):
        (frame,) = queue_messages(kit.take(c))
        kit.ack(c, frame, nack="cannot")
    assert queue_messages(kit.take(c)) == []
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.LIMIT_EXCEEDED
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["RemovedMessages"]) == (0, 1)


def test_put_back_delay_waits_on_the_clock() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit, put_back_delay=500)
    kit.push(producer, "ch", 1, b"retry")
    (frame,) = queue_messages(kit.take(c))
    kit.ack(c, frame, nack="later")
    assert queue_messages(kit.take(c)) == []
    assert kit.engine.next_deadline() == pytest.approx(kit.now + 0.5)
    kit.advance(0.4)
    assert queue_messages(kit.take(c)) == []
    kit.advance(0.2)
    assert [f.payload for f in queue_messages(kit.take(c))] == [b"retry"]


def test_wait_for_acknowledge_sends_one_message_at_a_time() -> None:
    kit = Kit()
    producer, (a, b) = acked_queue(
        kit, status=QueueStatus.ROUND_ROBIN, consumers=2, wait_for_acknowledge=True
    )
    for n in range(3):
        kit.push(producer, "ch", 1, b"%d" % n)
    got = queue_messages(kit.take(a) + kit.take(b))
    assert [f.payload for f in got] == [b"0"]
    kit.advance(1.5)  # timeout releases the gate; the message comes back first
    again = queue_messages(kit.take(a) + kit.take(b))
    assert [f.payload for f in again] == [b"0"]


def test_message_timeout_removes_waiting_messages_and_nacks() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL, message_timeout=2000)
    kit.push(producer, "ch", 1, b"old", ack=True)
    kit.take(producer)
    kit.advance(1.0)
    kit.push(producer, "ch", 1, b"young", ack=True)
    kit.take(producer)
    kit.advance(1.5)
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["TimeoutMessages"]) == (1, 1)
    assert kit.engine.next_deadline() == pytest.approx(kit.now + 0.5)
    kit.advance(1.0)
    assert kit.info(producer, "ch", 1)["Messages"] == 0
    assert kit.engine.next_deadline() is None


def test_message_timeout_nacks_a_waiting_producer() -> None:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(
        producer, "ch", 1, status=QueueStatus.PULL, message_timeout=100, request_acknowledge=True
    )
    kit.push(producer, "ch", 1, b"x", ack=True)
    kit.advance(0.2)
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.TIMEOUT


def test_persistent_handler_saves_and_deletes_only_on_ack() -> None:
    store = MemoryStore()
    kit = Kit(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    producer, (c,) = acked_queue(kit, message_delivery_handler="persistent")
    kit.push(producer, "ch", 1, b"durable", ack=True)
    (ack,) = acks(kit.take(producer))  # confirmed once saved
    assert header(ack, Header.NACK_REASON) is None
    assert len(store) == 1
    (frame,) = queue_messages(kit.take(c))
    kit.advance(2.0)  # ack timeout: still stored, put back
    assert len(store) == 1
    (frame,) = queue_messages(kit.take(c))
    kit.ack(c, frame)
    assert len(store) == 0
    assert kit.info(producer, "ch", 1)["SavedMessages"] == 1


def test_persistent_handler_without_acks_deletes_once_sent() -> None:
    store = MemoryStore()
    kit = Kit(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, message_delivery_handler="persistent")
    kit.push(producer, "ch", 1, b"kept")
    assert len(store) == 1  # no consumer yet: the message waits on "disk"
    c = kit.connect("c")
    kit.join(c, "ch")
    assert kit.payloads(c) == [b"kept"]
    assert len(store) == 0


def test_recover_rebuilds_queues_from_the_store() -> None:
    store = MemoryStore()
    kit = Kit(store=store, handlers={"persistent": PersistentDeliveryHandler()})
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL, message_delivery_handler="persistent")
    for n in range(3):
        kit.push(producer, "ch", 1, b"%d" % n)
    fresh = Kit(store=store)
    assert fresh.engine.recover(fresh.now) == 3
    c = fresh.connect("c")
    fresh.join(c, "ch")  # auto-created queue defaults to push: delivered on join
    assert fresh.payloads(c) == [b"0", b"1", b"2"]
    assert fresh.engine.channels["ch"].queues[1].sequence == 3


class Recorder(DeliveryHandler):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def received_from_producer(self, queue, message, sender):  # type: ignore[no-untyped-def]
        self.calls.append("received")
        if message.payload == b"reject":
            return DENY
        return Decision(send_ack=AckWhen.ALWAYS)

    def begin_send(self, queue, message):  # type: ignore[no-untyped-def]
        self.calls.append("begin")
        return ALLOW

    def can_consumer_receive(self, queue, message, receiver):  # type: ignore[no-untyped-def]
        return receiver.id != "skip-me"

    def consumer_received(self, queue, delivery, receiver):  # type: ignore[no-untyped-def]
        self.calls.append(f"to:{receiver.id}")
        return ALLOW

    def end_send(self, queue, message):  # type: ignore[no-untyped-def]
        self.calls.append("end")
        return ALLOW


def test_custom_handler_sees_every_step_and_filters_consumers() -> None:
    handler = Recorder()
    kit = Kit(handler=handler)
    producer = kit.connect("producer")
    skip = kit.connect("skip-me")
    take = kit.connect("take")
    kit.join(skip, "ch")
    kit.join(take, "ch")
    kit.push(producer, "ch", 1, b"hello", ack=True)
    assert handler.calls == ["received", "begin", "to:take", "end"]
    assert kit.payloads(take) == [b"hello"]
    assert kit.payloads(skip) == []
    assert len(acks(kit.take(producer))) == 1
    kit.push(producer, "ch", 1, b"reject", ack=True)
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.UNACCEPTABLE
    assert kit.payloads(take) == []


class Broken(DefaultDeliveryHandler):
    def begin_send(self, queue, message):  # type: ignore[no-untyped-def]
        raise RuntimeError("handler bug")


def test_a_raising_handler_is_counted_and_the_message_is_kept() -> None:
    kit = Kit(handler=Broken())
    producer = kit.connect("producer")
    c = kit.connect("c")
    kit.join(c, "ch")
    kit.push(producer, "ch", 1, b"x")
    assert kit.payloads(c) == []
    info = kit.info(producer, "ch", 1)
    assert info["Errors"] == 1 and info["Messages"] == 1  # put back at the end, not lost


class PutBackOnReceive(DefaultDeliveryHandler):
    def consumer_received(self, queue, delivery, receiver):  # type: ignore[no-untyped-def]
        return Decision(put_back=PutBack.END)


def test_put_back_from_a_send_step_requeues_without_spinning() -> None:
    kit = Kit(handler=PutBackOnReceive())
    producer = kit.connect("producer")
    c = kit.connect("c")
    kit.join(c, "ch")
    kit.push(producer, "ch", 1, b"again")
    assert kit.payloads(c) == [b"again"]
    assert kit.info(producer, "ch", 1)["Messages"] == 1


def test_timers_stay_few_under_steady_traffic() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit, message_timeout=500)
    for _ in range(200):
        kit.push(producer, "ch", 1, b"x")
        (frame,) = queue_messages(kit.take(c))
        kit.ack(c, frame)
        kit.advance(0.01)
    assert kit.engine.timer_count <= 3
    kit.advance(2.0)
    assert kit.engine.next_deadline() is None


def test_a_departed_consumers_unacknowledged_messages_return_in_order() -> None:
    kit = Kit()
    producer, (c,) = acked_queue(kit)
    for n in range(5):
        kit.push(producer, "ch", 1, b"%d" % n)
    assert [f.payload for f in queue_messages(kit.take(c))] == [b"0", b"1", b"2", b"3", b"4"]
    kit.disconnect(c)
    c2 = kit.connect("c2")
    kit.join(c2, "ch")
    assert [f.payload for f in queue_messages(kit.take(c2))] == [b"0", b"1", b"2", b"3", b"4"]


class RaisesOnDelivery(DefaultDeliveryHandler):
    """``consumer_received`` and, for the first acknowledge only, ``acknowledge_received``
    raise (a handler bug on the acknowledged queue's per-delivery path)."""

    def __init__(self) -> None:
        self.acks_seen = 0

    def consumer_received(self, queue, delivery, receiver):  # type: ignore[no-untyped-def]
        raise RuntimeError("handler bug on send")

    def acknowledge_received(self, queue, ack, delivery, success):  # type: ignore[no-untyped-def]
        self.acks_seen += 1
        if self.acks_seen == 1:
            raise RuntimeError("handler bug on acknowledge")
        return super().acknowledge_received(queue, ack, delivery, success)


@pytest.mark.parametrize("status", [QueueStatus.ROUND_ROBIN, QueueStatus.PUSH])
def test_a_handler_raising_on_an_acknowledged_delivery_is_counted_and_loses_nothing(
    status: QueueStatus,
) -> None:
    kit = Kit(handler=RaisesOnDelivery())
    producer, (c,) = acked_queue(kit, status)
    kit.push(producer, "ch", 1, b"job")
    (first,) = queue_messages(kit.take(c))  # sent although consumer_received raised
    assert kit.info(producer, "ch", 1)["Errors"] == 1
    kit.ack(c, first)  # acknowledge_received raises: exception_thrown retries it
    (again,) = queue_messages(kit.take(c))
    assert (again.message_id, again.payload) == (first.message_id, b"job")
    assert header(again, Header.DELIVERY_COUNT) == "2"
    kit.ack(c, again)  # the handler's second acknowledge goes through: done
    info = kit.info(producer, "ch", 1)
    assert (info["Errors"], info["Messages"], info["PendingAcknowledges"]) == (3, 0, 0)
    assert kit.take(c) == []


class FilterBreaks(DefaultDeliveryHandler):
    def can_consumer_receive(self, queue, message, receiver):  # type: ignore[no-untyped-def]
        if receiver.id == "bad":
            raise RuntimeError("filter bug")
        return True


def test_a_filter_that_raises_refuses_that_consumer_only_and_is_counted() -> None:
    """The dispatcher calls the handler's filter itself (``Dispatcher.choose_one``): a
    filter that raises counts one error and passes that consumer over, as
    ``HandlerHooks.can_consumer_receive`` does; the next consumer takes the message."""
    kit = Kit(handler=FilterBreaks())
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True)
    bad = kit.connect("bad")
    good = kit.connect("good")
    kit.join(bad, "ch")
    kit.join(good, "ch")
    kit.push(producer, "ch", 1, b"x")
    assert kit.payloads(good) == [b"x"]
    assert kit.payloads(bad) == []
    info = kit.info(producer, "ch", 1)
    assert info["Errors"] == 1
