"""Per-consumer windows and transport settlement (``broker.flow``), on the fake clock.

The kit's transport is held back (``auto_transmit=False``): tracked deliveries wait until
the test reports them sent with ``kit.transmit``, as a consumer's full socket would.
"""

from __future__ import annotations

from typing import Any

import pytest

from broker.engine.delivery import DefaultDeliveryHandler, PersistentDeliveryHandler
from broker.engine.options import BrokerConfig, OptionsError
from broker.protocol import Header, NoContent, Operation, QueueStatus, ResultCode, header
from broker.store import MemoryStore
from tests.broker.engine_kit import Kit, queue_messages

WALL = 1_700_000_000.0


def held_kit(engine: dict[str, Any] | None = None, **config: Any) -> Kit:
    return Kit(
        auto_transmit=False,
        config=BrokerConfig(wall_clock=lambda: WALL, **config),
        **(engine or {}),
    )


def setup(
    kit: Kit, status: QueueStatus = QueueStatus.PUSH, consumers: int = 1, **options: object
) -> tuple[str, list[str]]:
    producer = kit.connect("p")
    kit.queue(producer, "ch", 1, status=status, **options)
    names = [kit.connect(f"c{i}") for i in range(consumers)]
    for name in names:
        kit.join(name, "ch")
    return producer, names


def fill(kit: Kit, producer: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        kit.push(producer, "ch", 1, b"%d" % i)


def payloads(kit: Kit, client: str) -> list[int]:
    return [int(f.payload) for f in queue_messages(kit.take(client))]


def counters(kit: Kit) -> tuple[int, int, int, int]:
    info = kit.info("p", "ch", 1)
    return info["Messages"], info["InFlight"], info["SentMessages"], info["Deliveries"]


# ---------------------------------------------------------------- queues without acks


def test_a_consumer_gets_its_window_and_more_only_as_the_transport_takes_them() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=3)
    fill(kit, producer, 10)
    assert payloads(kit, c) == [0, 1, 2]
    assert counters(kit) == (7, 3, 0, 0)  # handed out is not sent
    kit.transmit(c, 2)
    assert payloads(kit, c) == [3, 4]
    assert counters(kit) == (5, 3, 2, 2)
    kit.transmit(c)
    kit.transmit(c)
    kit.transmit(c)
    assert payloads(kit, c) == [5, 6, 7, 8, 9]
    kit.transmit(c)
    assert counters(kit) == (0, 0, 10, 10)


def test_what_never_reached_a_departed_consumer_goes_back_in_order() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=4)
    fill(kit, producer, 10)
    assert payloads(kit, c) == [0, 1, 2, 3]
    kit.transmit(c, 1)  # 0 reached its socket, 1..4 did not
    assert payloads(kit, c) == [4]
    kit.disconnect(c)
    assert counters(kit) == (9, 0, 1, 1)
    c2 = kit.connect("c2")
    kit.join(c2, "ch")
    for _ in range(3):
        kit.transmit(c2)
    frames = queue_messages(kit.take(c2))
    assert [int(f.payload) for f in frames] == list(range(1, 10))
    assert all(header(f, Header.DELIVERY_COUNT) is None for f in frames)  # never delivered
    kit.transmit(c2)
    assert counters(kit) == (0, 0, 10, 10)


def test_fast_path_pushes_go_back_too() -> None:
    """Pushes to a queue with a consumer waiting take the plain fast path."""
    kit = held_kit()
    producer, (c,) = setup(kit)
    fill(kit, producer, 5)
    assert payloads(kit, c) == [0, 1, 2, 3, 4]
    kit.transmit(c, 2)
    kit.disconnect(c)
    assert counters(kit) == (3, 0, 2, 2)
    c2 = kit.connect("c2")
    kit.join(c2, "ch")
    assert payloads(kit, c2) == [2, 3, 4]
    info = kit.info(producer, "ch", 1)
    assert info["ReceivedMessages"] == 5 and info["Sequence"] == 5


def test_a_full_consumer_stays_a_consumer_and_resumes() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=2)
    fill(kit, producer, 1000)
    assert payloads(kit, c) == [0, 1]
    assert "c0" in kit.engine.clients  # nothing is dropped for being slow
    got: list[int] = []
    while kit.unsent[c]:
        kit.transmit(c, 1)
        got += payloads(kit, c)
    assert got == list(range(2, 1000))
    assert counters(kit) == (0, 0, 1000, 1000)


def test_round_robin_skips_a_full_consumer() -> None:
    kit = held_kit()
    producer, (c0, c1) = setup(kit, QueueStatus.ROUND_ROBIN, consumers=2, prefetch=2)
    fill(kit, producer, 6)
    assert payloads(kit, c0) == [0, 2]
    assert payloads(kit, c1) == [1, 3]
    kit.transmit(c1)
    assert payloads(kit, c1) == [4, 5]  # c0 is full: c1 takes its turns
    assert payloads(kit, c0) == []


def test_push_goes_to_the_consumers_with_room() -> None:
    kit = held_kit()
    producer, (c0, c1) = setup(kit, consumers=2, prefetch=2)
    fill(kit, producer, 2)
    assert payloads(kit, c0) == payloads(kit, c1) == [0, 1]
    kit.transmit(c1)
    fill(kit, producer, 2, start=2)
    assert payloads(kit, c1) == [2, 3]
    assert payloads(kit, c0) == []
    fill(kit, producer, 1, start=4)  # both full: it waits in the queue
    assert counters(kit)[0] == 1
    kit.transmit(c0)
    assert payloads(kit, c0) == [4]


def test_a_push_copy_that_never_left_does_not_bring_the_message_back() -> None:
    kit = held_kit()
    producer, (c0, c1) = setup(kit, consumers=2)
    fill(kit, producer, 1)
    kit.transmit(c0)
    kit.disconnect(c1)  # its copy never left, c0's did: the message is done
    assert counters(kit) == (0, 0, 1, 1)


def test_broadcast_drops_and_counts_the_copies_of_a_full_consumer() -> None:
    kit = held_kit()
    producer, (c0, c1) = setup(kit, QueueStatus.BROADCAST, consumers=2, prefetch=2)
    fill(kit, producer, 5)
    assert payloads(kit, c0) == payloads(kit, c1) == [0, 1]
    kit.transmit(c0)
    fill(kit, producer, 1, start=5)
    assert payloads(kit, c0) == [5]
    assert payloads(kit, c1) == []
    info = kit.info(producer, "ch", 1)
    assert info["DroppedDeliveries"] == 3 + 4  # 2..4 for both, then 5 for c1
    kit.disconnect(c1)  # its two copies never left: dropped and counted too
    info = kit.info(producer, "ch", 1)
    assert info["DroppedDeliveries"] == 9 and info["Messages"] == 0
    assert kit.engine.stats()["dropped_deliveries"] == 9


def test_a_stopped_queue_does_not_take_back_what_was_never_sent() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=2)
    fill(kit, producer, 4)
    kit.update(producer, "ch", 1, Status=QueueStatus.STOPPED)
    kit.disconnect(c)
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["InFlight"], info["RemovedMessages"]) == (0, 0, 4)


def test_a_queue_removed_with_deliveries_in_transit_settles_cleanly() -> None:
    store = MemoryStore()
    kit = held_kit({"store": store, "handlers": {"persistent": PersistentDeliveryHandler()}})
    producer, (c,) = setup(kit, prefetch=2, message_delivery_handler="persistent")
    fill(kit, producer, 4)
    assert len(store) == 4 and payloads(kit, c) == [0, 1]
    kit.ok(producer, Operation.QUEUE_DELETE, "ch", headers=((Header.QUEUE_ID, "1"),))
    assert len(store) == 0
    kit.transmit(c, 1)
    kit.disconnect(c)
    assert kit.engine.errors == 0 and len(store) == 0
    assert "ch" in kit.engine.channels and not kit.engine.channels["ch"].queues


def test_a_persistent_message_leaves_the_store_once_sent_not_before() -> None:
    store = MemoryStore()
    kit = held_kit({"store": store, "handlers": {"persistent": PersistentDeliveryHandler()}})
    producer, (c,) = setup(kit, message_delivery_handler="persistent")
    fill(kit, producer, 3)
    assert len(store) == 3  # handed to the transport, not yet sent
    kit.transmit(c, 2)
    assert len(store) == 1
    kit.disconnect(c)  # the third never left: still stored, back in the queue
    assert len(store) == 1 and kit.info(producer, "ch", 1)["Messages"] == 1


def test_report_for_an_unknown_client_or_too_many_frames_is_harmless() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit)
    fill(kit, producer, 2)
    assert kit.engine.transmitted({"nobody": 3}, kit.now) == []
    kit.unsent[c] = 0
    kit.engine.transmitted({c: 5}, kit.now)
    assert kit.engine.errors == 1
    assert counters(kit) == (0, 0, 2, 2)


# ---------------------------------------------------------------- acknowledged queues


def test_with_acks_the_window_counts_unacknowledged_deliveries() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=2, request_acknowledge=True)
    fill(kit, producer, 5)
    kit.transmit(c)
    first = queue_messages(kit.take(c))
    assert [f.payload for f in first] == [b"0", b"1"]
    assert counters(kit) == (3, 2, 2, 2)  # sent, still unacknowledged
    kit.ack(c, first[0])
    assert payloads(kit, c) == [2]
    info = kit.info(producer, "ch", 1)
    assert (info["Acks"], info["InFlight"], info["PendingAcknowledges"]) == (1, 2, 2)


def test_unacknowledged_deliveries_return_in_order_and_marked() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=4, request_acknowledge=True)
    fill(kit, producer, 6)
    kit.transmit(c, 2)  # 0 and 1 reached it; 2 and 3 are still in the transport
    assert payloads(kit, c) == [0, 1, 2, 3]
    kit.disconnect(c)
    c2 = kit.connect("c2")
    kit.join(c2, "ch")
    frames = queue_messages(kit.take(c2))
    assert [int(f.payload) for f in frames] == [0, 1, 2, 3]
    assert [header(f, Header.DELIVERY_COUNT) for f in frames] == ["2", "2", None, None]
    assert kit.info(producer, "ch", 1)["InFlight"] == 4


def test_redelivery_after_a_nack_counts_up() -> None:
    kit = Kit()
    producer, (c,) = setup(kit, request_acknowledge=True)
    fill(kit, producer, 1)
    for count in (None, "2", "3"):
        (frame,) = queue_messages(kit.take(c))
        assert header(frame, Header.DELIVERY_COUNT) == count
        kit.ack(c, frame, nack="busy")


def test_an_ack_timeout_frees_the_window() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=1, request_acknowledge=True, acknowledge_timeout=500)
    fill(kit, producer, 2)
    kit.transmit(c)
    assert payloads(kit, c) == [0]
    kit.advance(1.0)  # 0 timed out: back at the front, sent again
    kit.transmit(c)
    frames = queue_messages(kit.take(c))
    assert [(f.payload, header(f, Header.DELIVERY_COUNT)) for f in frames] == [(b"0", "2")]


class RetryOnReceive(DefaultDeliveryHandler):
    def consumer_received(self, queue, delivery, receiver):  # type: ignore[no-untyped-def]
        from broker.engine.delivery import RETRY_LAST

        return RETRY_LAST


def test_a_handler_putting_back_on_receive_does_not_spin_on_transmissions() -> None:
    kit = held_kit()
    kit.engine.handler = RetryOnReceive()
    producer, (c,) = setup(kit)
    kit.queue(producer, "ch", 2)  # a queue made after the handler change
    kit.push(producer, "ch", 2, b"again")
    assert [f.payload for f in queue_messages(kit.take(c))] == [b"again"]
    kit.transmit(c)
    assert queue_messages(kit.take(c)) == []  # waits for the next event, as before


# ---------------------------------------------------------------- pull and cache


def test_a_pull_gets_at_most_the_room_left() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, QueueStatus.PULL, prefetch=3, request_acknowledge=True)
    fill(kit, producer, 5)
    frames = kit.pull(c, "ch", 1, headers=((Header.COUNT, "10"),))
    got = [f for f in frames if header(f, Header.NO_CONTENT) is None]
    assert [f.payload for f in got] == [b"0", b"1", b"2"]
    assert {header(f, Header.COUNT) for f in got} == {"3"}
    frames = kit.pull(c, "ch", 1)
    assert [header(f, Header.NO_CONTENT) for f in frames] == [
        NoContent.LIMIT_EXCEEDED,
        NoContent.END,
    ]
    kit.transmit(c)
    kit.ack(c, got[0])
    frames = kit.pull(c, "ch", 1, headers=((Header.COUNT, "10"),))
    assert [f.payload for f in frames if header(f, Header.NO_CONTENT) is None] == [b"3"]


def test_pulled_messages_never_sent_go_back() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, QueueStatus.PULL)
    fill(kit, producer, 3)
    kit.pull(c, "ch", 1, headers=((Header.COUNT, "3"),))
    assert kit.unsent[c] == 3  # the messages are tracked, the End marker is not
    kit.transmit(c, 1)
    kit.disconnect(c)
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["SentMessages"]) == (2, 1)


def test_a_cache_answer_is_counted_once_sent_and_the_message_stays() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, QueueStatus.CACHE, prefetch=1)
    fill(kit, producer, 1)
    for _ in range(3):  # the window does not apply: nothing leaves the queue
        (answer,) = kit.pull(c, "ch", 1)
        assert answer.content_type == ResultCode.OK and answer.payload == b"0"
    assert kit.info(producer, "ch", 1)["SentMessages"] == 0
    kit.transmit(c)
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["SentMessages"], info["InFlight"]) == (1, 3, 0)


# ---------------------------------------------------------------- window sizes


def test_the_broker_default_and_its_cap() -> None:
    kit = held_kit(prefetch=2, max_prefetch=5)
    producer, (c,) = setup(kit)
    kit.queue(producer, "ch", 2, prefetch=50)
    for queue in (1, 2):
        for i in range(10):
            kit.push(producer, "ch", queue, b"%d" % i)
    frames = queue_messages(kit.take(c))
    assert [f.content_type for f in frames] == [1, 1] + [2] * 5
    assert kit.info(producer, "ch", 2)["Prefetch"] == 5
    with pytest.raises(OptionsError):
        BrokerConfig(prefetch=0)
    with pytest.raises(OptionsError):
        BrokerConfig(prefetch=10, max_prefetch=5)


def test_a_client_chooses_its_window_when_it_joins() -> None:
    kit = held_kit(prefetch=10, max_prefetch=50)
    producer, _ = setup(kit, consumers=0, prefetch=2)
    c = kit.connect("c")
    kit.ok(c, Operation.JOIN, "ch", headers=((Header.PREFETCH, "4"),))
    fill(kit, producer, 10)
    assert payloads(kit, c) == [0, 1, 2, 3]
    kit.ok(c, Operation.JOIN, "ch", headers=((Header.PREFETCH, "6"),))  # again: a new size
    assert payloads(kit, c) == [4, 5]
    kit.ok(c, Operation.LEAVE, "ch")
    kit.ok(c, Operation.JOIN, "ch", headers=((Header.PREFETCH, "1000"),))  # capped: 50
    assert payloads(kit, c) == [6, 7, 8, 9]
    kit.transmit(c)
    fill(kit, producer, 100, start=10)
    assert len(payloads(kit, c)) == 50


@pytest.mark.parametrize("value", ["0", "-3", "lots", ""])
def test_a_bad_prefetch_header_is_refused(value: str) -> None:
    kit = held_kit()
    c = kit.connect("c")
    reply = kit.op(c, Operation.JOIN, "ch", headers=((Header.PREFETCH, value),))
    assert reply.content_type == ResultCode.BAD_REQUEST
    assert "ch" not in kit.engine.channels  # nothing was created


def test_changing_the_queue_option_applies_to_the_next_deliveries() -> None:
    kit = held_kit()
    producer, (c,) = setup(kit, prefetch=1)
    fill(kit, producer, 5)
    assert payloads(kit, c) == [0]
    assert kit.update(producer, "ch", 1, Prefetch=3).content_type == ResultCode.OK
    assert payloads(kit, c) == [1, 2]
    assert kit.info(producer, "ch", 1)["Prefetch"] == 3


def test_a_recreated_channel_forgets_the_window_asked_for_the_old_one() -> None:
    kit = held_kit()
    producer, _ = setup(kit, consumers=0, prefetch=2)
    c = kit.connect("c")
    kit.ok(c, Operation.JOIN, "ch", headers=((Header.PREFETCH, "5"),))
    kit.ok(producer, Operation.CHANNEL_DELETE, "ch")
    kit.join(c, "ch")  # auto-created again, joined without a Prefetch header
    kit.queue(producer, "ch", 1, prefetch=2)
    fill(kit, producer, 4)
    assert payloads(kit, c) == [0, 1]
