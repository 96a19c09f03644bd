"""Queue statuses: broadcast, push, round-robin, pull, cache, paused, stopped."""

from __future__ import annotations

from broker.protocol import Header, MessageType, NackReason, NoContent, QueueStatus, header
from tests.broker.engine_kit import Kit, acks, queue_messages


def setup(
    status: QueueStatus, consumers: int = 2, **options: object
) -> tuple[Kit, str, list[str]]:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=status, **options)
    names = [kit.connect(f"c{i}") for i in range(consumers)]
    for name in names:
        kit.join(name, "ch")
    return kit, producer, names


def test_broadcast_sends_to_every_consumer_and_keeps_nothing() -> None:
    kit, producer, (a, b) = setup(QueueStatus.BROADCAST)
    kit.push(producer, "ch", 1, b"live")
    assert kit.payloads(a) == [b"live"]
    assert kit.payloads(b) == [b"live"]
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_broadcast_without_consumers_loses_the_message_and_nacks_a_waiting_producer() -> None:
    kit, producer, _ = setup(QueueStatus.BROADCAST, consumers=0, request_acknowledge=True)
    kit.push(producer, "ch", 1, b"nobody", ack=True)
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.NO_CONSUMERS
    late = kit.connect("late")
    kit.join(late, "ch")
    assert kit.payloads(late) == []


def test_push_delivers_to_all_consumers() -> None:
    kit, producer, (a, b) = setup(QueueStatus.PUSH)
    kit.push(producer, "ch", 1, b"one")
    kit.push(producer, "ch", 1, b"two")
    assert kit.payloads(a) == [b"one", b"two"]
    assert kit.payloads(b) == [b"one", b"two"]


def test_push_stores_until_a_consumer_joins() -> None:
    kit, producer, _ = setup(QueueStatus.PUSH, consumers=0)
    for n in range(3):
        kit.push(producer, "ch", 1, b"%d" % n)
    assert kit.info(producer, "ch", 1)["Messages"] == 3
    consumer = kit.connect("c")
    kit.join(consumer, "ch")
    assert kit.payloads(consumer) == [b"0", b"1", b"2"]
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_join_is_acknowledged_before_the_released_messages() -> None:
    kit, producer, _ = setup(QueueStatus.PUSH, consumers=0)
    kit.push(producer, "ch", 1, b"waiting")
    consumer = kit.connect("c")
    mid = "join-1"
    from broker import tmqp
    from broker.protocol import Operation

    kit.send(
        consumer,
        tmqp.Frame(
            message_type=MessageType.SERVER,
            content_type=Operation.JOIN,
            target="ch",
            message_id=mid,
            pending_ack=True,
        ),
    )
    first, second = kit.take(consumer)
    assert first.message_type == MessageType.ACK and first.message_id == mid
    assert second.payload == b"waiting"


def test_round_robin_gives_each_message_to_one_consumer_in_turn() -> None:
    kit, producer, (a, b) = setup(QueueStatus.ROUND_ROBIN)
    for n in range(6):
        kit.push(producer, "ch", 1, b"%d" % n)
    got_a, got_b = kit.payloads(a), kit.payloads(b)
    assert got_a == [b"0", b"2", b"4"]
    assert got_b == [b"1", b"3", b"5"]


def test_round_robin_survives_consumers_leaving_and_joining() -> None:
    kit, producer, (a, b) = setup(QueueStatus.ROUND_ROBIN)
    kit.push(producer, "ch", 1, b"0")
    kit.disconnect(a)
    for n in range(1, 4):
        kit.push(producer, "ch", 1, b"%d" % n)
    c = kit.connect("c2")
    kit.join(c, "ch")
    for n in range(4, 8):
        kit.push(producer, "ch", 1, b"%d" % n)
    everything = kit.payloads(b) + kit.payloads(c) + kit.payloads(a)
    assert sorted(everything) == [b"%d" % n for n in range(8)]  # each exactly once


def test_pull_status_never_pushes() -> None:
    kit, producer, (a, _) = setup(QueueStatus.PULL)
    kit.push(producer, "ch", 1, b"stay")
    assert kit.payloads(a) == []
    frames = kit.pull(a, "ch", 1)
    assert [f.payload for f in frames if header(f, Header.NO_CONTENT) is None] == [b"stay"]


def test_cache_keeps_only_the_latest_and_pull_does_not_remove_it() -> None:
    kit, producer, (a, _) = setup(QueueStatus.CACHE)
    kit.push(producer, "ch", 1, b"old")
    kit.push(producer, "ch", 1, b"new")
    assert kit.payloads(a) == []
    for _ in range(2):
        (reply,) = kit.pull(a, "ch", 1)
        assert reply.message_type == MessageType.RESPONSE
        assert reply.content_type == 0
        assert reply.payload == b"new"
    assert kit.info(producer, "ch", 1)["Messages"] == 1


def test_cache_pull_of_an_empty_queue_is_404() -> None:
    kit, _, (a, _) = setup(QueueStatus.CACHE)
    (reply,) = kit.pull(a, "ch", 1)
    assert reply.message_type == MessageType.RESPONSE
    assert reply.content_type == 404
    assert header(reply, Header.NO_CONTENT) == NoContent.EMPTY


def test_paused_stores_and_refuses_pulls_then_resumes_without_loss() -> None:
    kit, producer, (a, b) = setup(QueueStatus.PAUSED)
    for n in range(3):
        kit.push(producer, "ch", 1, b"%d" % n)
    assert kit.payloads(a) == []
    markers = [header(f, Header.NO_CONTENT) for f in kit.pull(a, "ch", 1)]
    assert markers == [NoContent.UNACCEPTABLE, NoContent.END]
    assert kit.update(producer, "ch", 1, Status=QueueStatus.PUSH).content_type == 0
    assert kit.payloads(a) == [b"0", b"1", b"2"]
    assert kit.payloads(b) == [b"0", b"1", b"2"]


def test_switching_statuses_keeps_messages() -> None:
    kit, producer, _ = setup(QueueStatus.PULL)
    for n in range(4):
        kit.push(producer, "ch", 1, b"%d" % n)
    kit.update(producer, "ch", 1, Status="Paused")
    kit.update(producer, "ch", 1, Status="Cache")
    kit.update(producer, "ch", 1, Status="Pull")
    assert kit.info(producer, "ch", 1)["Messages"] == 4
    kit.update(producer, "ch", 1, Status="RoundRobin")
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_stop_clears_and_refuses_pushes_until_restarted() -> None:
    kit, producer, (a, _) = setup(QueueStatus.PULL)
    kit.push(producer, "ch", 1, b"gone", ack=False)
    kit.update(producer, "ch", 1, Status="Stopped")
    assert kit.info(producer, "ch", 1)["Messages"] == 0
    kit.push(producer, "ch", 1, b"refused", ack=True)
    (nack,) = acks(kit.take(producer))
    assert header(nack, Header.NACK_REASON) == NackReason.UNACCEPTABLE
    assert nack.content_type == 1 and nack.target == "ch"
    markers = [header(f, Header.NO_CONTENT) for f in kit.pull(a, "ch", 1)]
    assert markers == [NoContent.UNACCEPTABLE, NoContent.END]
    kit.update(producer, "ch", 1, Status="Push")
    kit.push(producer, "ch", 1, b"again")
    assert kit.payloads(a) == [b"again"]


def test_high_priority_messages_go_first() -> None:
    kit, producer, _ = setup(QueueStatus.PUSH, consumers=0)
    kit.push(producer, "ch", 1, b"low1")
    kit.push(producer, "ch", 1, b"high1", high=True)
    kit.push(producer, "ch", 1, b"low2")
    kit.push(producer, "ch", 1, b"high2", high=True)
    info = kit.info(producer, "ch", 1)
    assert (info["PriorityMessages"], info["Messages"]) == (2, 2)
    consumer = kit.connect("c")
    kit.join(consumer, "ch")
    assert kit.payloads(consumer) == [b"high1", b"high2", b"low1", b"low2"]


def test_every_message_gets_a_growing_sequence_number() -> None:
    kit, producer, _ = setup(QueueStatus.PULL, consumers=0)
    for n in range(5):
        kit.push(producer, "ch", 1, b"%d" % n)
    queue = kit.engine.channels["ch"].queues[1]
    seqs = [m.seq for m in queue.messages.regular]
    assert seqs == [1, 2, 3, 4, 5]
    assert kit.info(producer, "ch", 1)["Sequence"] == 5


def test_delivered_frame_carries_channel_queue_and_producer() -> None:
    kit, producer, (a, _) = setup(QueueStatus.PUSH)
    mid = kit.push(producer, "ch", 1, b"p")
    (frame,) = queue_messages(kit.take(a))
    assert (frame.target, frame.content_type, frame.message_id) == ("ch", 1, mid)
    assert frame.source == producer
    assert not frame.pending_ack
