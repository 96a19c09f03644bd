"""Pull requests: Count / Clear / Order / Info and the No-Content markers."""

from __future__ import annotations

from broker import tmqp
from broker.protocol import Header, MessageType, NoContent, QueueStatus, header
from tests.broker.engine_kit import Kit


def pull_queue(**options: object) -> tuple[Kit, str, str]:
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.PULL, **options)
    consumer = kit.connect("consumer")
    kit.join(consumer, "ch")
    return kit, producer, consumer


def fill(kit: Kit, producer: str, n: int, high: tuple[int, ...] = ()) -> None:
    for i in range(n):
        kit.push(producer, "ch", 1, b"%d" % i, high=i in high)


def messages(frames: list[tmqp.Frame]) -> list[tmqp.Frame]:
    return [f for f in frames if header(f, Header.NO_CONTENT) is None]


def markers(frames: list[tmqp.Frame]) -> list[str | None]:
    return [header(f, Header.NO_CONTENT) for f in frames if header(f, Header.NO_CONTENT)]


def test_count_index_and_end_marker() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 5)
    frames = kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "3"),), mid="req-1")
    got = messages(frames)
    assert [f.payload for f in got] == [b"0", b"1", b"2"]
    assert [header(f, Header.INDEX) for f in got] == ["1", "2", "3"]
    assert {header(f, Header.COUNT) for f in got} == {"3"}
    assert {header(f, Header.REQUEST_ID) for f in got} == {"req-1"}
    assert all(f.message_type == MessageType.QUEUE and f.content_type == 1 for f in got)
    assert frames[-1].message_type == MessageType.QUEUE
    assert markers(frames) == [NoContent.END]
    assert kit.info(producer, "ch", 1)["Messages"] == 2


def test_asking_for_more_than_there_is_sends_what_there_is() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 2)
    got = messages(kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "10"),)))
    assert [header(f, Header.COUNT) for f in got] == ["2", "2"]


def test_empty_queue_answers_empty_then_end() -> None:
    kit, _, consumer = pull_queue()
    assert markers(kit.pull(consumer, "ch", 1)) == [NoContent.EMPTY, NoContent.END]


def test_lifo_order_and_high_priority_first() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 5, high=(3,))
    got = messages(
        kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "5"), (Header.ORDER, "LIFO")))
    )
    assert [f.payload for f in got] == [b"3", b"4", b"2", b"1", b"0"]


def test_info_reports_what_is_left() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 4, high=(0, 1))
    frames = kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "1"), (Header.INFO, "yes")))
    (first,) = messages(frames)
    assert header(first, Header.PRIORITY_MESSAGES) == "1"
    assert header(first, Header.MESSAGES) == "2"


def test_clear_options() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 4, high=(0, 1))
    kit.pull(consumer, "ch", 1, headers=((Header.CLEAR, "High-Priority"),))
    info = kit.info(producer, "ch", 1)
    assert (info["PriorityMessages"], info["Messages"]) == (0, 2)
    fill(kit, producer, 2, high=(0,))
    kit.pull(consumer, "ch", 1, headers=((Header.CLEAR, "Default-Priority"),))
    info = kit.info(producer, "ch", 1)
    assert (info["PriorityMessages"], info["Messages"]) == (0, 0)  # the pull took the high one
    fill(kit, producer, 3)
    got = messages(kit.pull(consumer, "ch", 1, headers=((Header.CLEAR, "All"),)))
    assert [f.payload for f in got] == [b"0"]
    assert kit.info(producer, "ch", 1)["Messages"] == 0
    assert kit.info(producer, "ch", 1)["RemovedMessages"] == 1 + 3 + 2


def test_bad_requests_get_markers_not_exceptions() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 1)
    bad = [
        ({"headers": ((Header.COUNT, "zero"),)}, NoContent.UNACCEPTABLE),
        ({"headers": ((Header.COUNT, "0"),)}, NoContent.UNACCEPTABLE),
        ({"headers": ((Header.CLEAR, "everything"),)}, NoContent.UNACCEPTABLE),
        ({"mid": ""}, NoContent.ID_REQUIRED),
    ]
    for kwargs, token in bad:
        frames = kit.pull(consumer, "ch", 1, **kwargs)  # type: ignore[arg-type]
        assert markers(frames) == [token, NoContent.END], kwargs
    assert markers(kit.pull(consumer, "nope", 1)) == [NoContent.NO_CHANNEL, NoContent.END]
    assert markers(kit.pull(consumer, "ch", 9)) == [NoContent.NO_QUEUE, NoContent.END]
    outsider = kit.connect("outsider")  # not joined
    assert markers(kit.pull(outsider, "ch", 1)) == [NoContent.UNAUTHORIZED, NoContent.END]
    assert kit.info(producer, "ch", 1)["Messages"] == 1


def test_pull_from_a_push_queue_is_unacceptable() -> None:
    kit = Kit()
    consumer = kit.connect("consumer")
    kit.join(consumer, "ch")
    kit.queue(consumer, "ch", 1, status=QueueStatus.PUSH)
    assert markers(kit.pull(consumer, "ch", 1)) == [NoContent.UNACCEPTABLE, NoContent.END]


def test_pulled_messages_with_acks_do_not_overconsume() -> None:
    kit, producer, consumer = pull_queue(request_acknowledge=True, acknowledge_timeout=1000)
    fill(kit, producer, 3)
    got = messages(kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "2"),)))
    assert all(f.pending_ack for f in got)
    other = kit.connect("other")
    kit.join(other, "ch")
    rest = messages(kit.pull(other, "ch", 1, headers=((Header.COUNT, "5"),)))
    assert [f.payload for f in rest] == [b"2"]  # in-flight ones are not handed out twice
    kit.ack(consumer, got[0])
    kit.ack(other, rest[0])
    kit.advance(1.1)  # the unacked one comes back
    again = messages(kit.pull(other, "ch", 1, headers=((Header.COUNT, "5"),)))
    assert [f.payload for f in again] == [b"1"]


def test_many_pulls_never_freeze_the_queue() -> None:
    kit, producer, consumer = pull_queue()
    fill(kit, producer, 50)
    seen: list[bytes] = []
    while True:
        got = messages(kit.pull(consumer, "ch", 1, headers=((Header.COUNT, "7"),)))
        if not got:
            break
        seen += [f.payload for f in got]
    assert seen == [b"%d" % i for i in range(50)]


def test_hidden_producer_names_in_pulled_messages() -> None:
    kit, producer, consumer = pull_queue(hide_client_names=True)
    fill(kit, producer, 1)
    (got,) = messages(kit.pull(consumer, "ch", 1))
    assert got.source == ""
