"""Paging for queues whose messages have a deadline (MessageTimeout) or whose delivery
handler looks at every message (the ``per-message`` handler: selectors): their saved
waiting messages wait as numbers too (``engine.queue.messages``: "Paging", the tail's
deadline column), expire from the tail into the trash in order, reach the consumers
that select them, and come back after a restart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from broker.engine.delivery import PerMessageDeliveryHandler, PersistentDeliveryHandler
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.engine.per_message import PER_MESSAGE
from broker.engine.queue.queue import Queue
from broker.protocol import Header, MessageType, Operation, QueueStatus
from broker.store.durable import DurableStore
from broker.store.log import LogStore

from ..engine_kit import Kit, queue_messages

WINDOW = 4
TIMEOUT_MS = 5000


def _kit(log: LogStore, window: int = WINDOW) -> Kit:
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=Limits(paged_window=window))
    handlers = {"persistent": PersistentDeliveryHandler()}
    return Kit(store=DurableStore(log), handlers=handlers, config=config)  # type: ignore[arg-type]


def _timeout_queue(kit: Kit, timeout_ms: int = TIMEOUT_MS) -> str:
    producer = kit.connect("producer")
    kit.queue(producer, "orders", 1, message_delivery_handler="persistent",
              request_acknowledge=True, message_timeout=timeout_ms)  # fmt: skip
    return producer


def _push(kit: Kit, producer: str, first: int, last: int) -> None:
    for i in range(first, last + 1):
        kit.push(producer, "orders", 1, b"p%d" % i, ack=True, mid=f"m{i}")
    acked = [f for f in kit.take(producer) if f.message_type == MessageType.ACK]
    assert len(acked) == last - first + 1


def _queue(kit: Kit) -> Queue:
    return kit.engine.channels["orders"].queues[1]


def _in_memory(q: Queue) -> int:
    """Message objects the queue keeps for waiting messages (deques, held, timers)."""
    order = q.messages
    held = len(order.paged_priority.held) + len(order.paged_regular.held)
    return len(order.priority) + len(order.regular) + held + len(q.tracker.expiry)


def _consume_all(kit: Kit) -> list[bytes]:
    consumer = kit.connect("consumer")
    kit.join(consumer, "orders")
    got: list[bytes] = []
    while frames := queue_messages(kit.take(consumer)):
        for f in frames:
            got.append(f.payload)
            kit.ack(consumer, f)
    return got


def test_messages_with_a_timeout_page_out_and_expire_into_the_trash_in_order(
    tmp_path: Path,
) -> None:
    """40 messages with a MessageTimeout wait as numbers beyond the window (before: all
    held in memory with a timer each); their time comes: all 40 in the trash, in order,
    counted, the store emptied of them; 20 pushed later still wait and go in order."""
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        producer = _timeout_queue(kit)
        _push(kit, producer, 1, 40)
        q = _queue(kit)
        assert q.message_count == 40
        assert _in_memory(q) <= 2 * WINDOW + 2, _in_memory(q)  # the rest: numbers
        kit.advance(2.5)
        _push(kit, producer, 41, 60)  # their clock runs 2.5 s behind
        kit.advance(2.6)  # the first 40 are past their 5 s
        assert q.message_count == 20 and q.timeouts == 40
        assert list(q.trash.entries) == list(range(1, 41))  # in order
        assert all(t.reason == "expired" for t in q.trash.entries.values())
        assert [t.message.payload for t in q.trash.entries.values()][:2] == [b"p1", b"p2"]
        assert log.bounds(("orders", 1)).count == 20  # the live records of the rest
        assert _consume_all(kit) == [b"p%d" % i for i in range(41, 61)]


def _restarted(tmp_path: Path) -> tuple[Kit, Queue, LogStore]:
    """30 messages with a 60 s MessageTimeout saved, then a restart (the test's wall
    clock stands still: 60 s left on each)."""
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        producer = _timeout_queue(kit, 60_000)
        _push(kit, producer, 1, 30)
    log = LogStore(tmp_path)
    try:
        kit = _kit(log)
        assert kit.engine.recover(kit.now) == 30
        q = _queue(kit)
        assert q.message_count == 30
        # beyond the window they wait as numbers (before: each read back and held)
        assert _in_memory(q) <= 2 * WINDOW + 2, _in_memory(q)
    except BaseException:
        log.close()
        raise
    return kit, q, log


def test_paged_messages_with_deadlines_restart_as_numbers_in_order(tmp_path: Path) -> None:
    kit, q, log = _restarted(tmp_path)
    try:
        kit.advance(30.0)
        assert _consume_all(kit) == [b"p%d" % i for i in range(1, 31)]
        assert q.message_count == 0 and q.timeouts == 0
    finally:
        log.close()


def test_paged_messages_with_deadlines_restart_and_expire_at_their_time(tmp_path: Path) -> None:
    kit, q, log = _restarted(tmp_path)
    try:
        kit.advance(59.0)
        assert q.message_count == 30
        kit.advance(2.0)
        assert q.message_count == 0 and q.timeouts == 30
        assert list(q.trash.entries) == list(range(1, 31))
    finally:
        log.close()


def _selector_kit(log: LogStore, window: int = WINDOW) -> tuple[Kit, PerMessageDeliveryHandler]:
    config = BrokerConfig(wall_clock=lambda: 1_700_000_000.0, limits=Limits(paged_window=window))
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(store=DurableStore(log), handlers={PER_MESSAGE: handler}, config=config)
    return kit, handler


def _kind(kind: str) -> object:
    def selects(headers: Sequence[tuple[str, str]]) -> bool:
        return dict(headers).get("kind") == kind

    return selects


def test_a_per_message_queue_pages_and_a_selecting_consumer_gets_paged_messages(
    tmp_path: Path,
) -> None:
    """The per-message handler (selectors) no longer keeps a persistent queue whole in
    memory: 60 messages, a consumer selecting every third one gets those in order (read
    back from the log), the rest wait; a restart brings those back in order."""
    with LogStore(tmp_path) as log:
        kit, handler = _selector_kit(log)
        producer = kit.connect("producer")
        kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
                  message_delivery_handler=PER_MESSAGE)  # fmt: skip
        for i in range(60):
            kind = "a" if i % 3 == 0 else "z"
            headers = (("kind", kind), ("persistent", "true"))
            kit.push(producer, "ch", 1, b"%s%d" % (kind.encode(), i), headers=headers)
        q = kit.engine.channels["ch"].queues[1]
        assert q.messages.window == WINDOW
        assert len(q.messages.paged_regular) > 40  # paged out (before: none)
        a = kit.connect("a")
        handler.rules.set_selector("ch", a, _kind("a"))  # type: ignore[arg-type]
        kit.join(a, "ch")
        got: list[bytes] = []
        for _ in range(100):
            frames = queue_messages(kit.take(a))
            kit.advance(0.002)  # (the ticks the queue asks for to go on behind)
            for f in frames:
                got.append(f.payload)
                kit.ack(a, f)
            if len(got) == 20:
                break
        assert got == [b"a%d" % i for i in range(0, 60, 3)]
        assert q.message_count == 40
    with LogStore(tmp_path) as log:
        kit, _ = _selector_kit(log)
        assert kit.engine.recover(kit.now) == 40
        anyone = kit.connect("anyone")
        kit.join(anyone, "ch")
        rest: list[bytes] = []
        while frames := queue_messages(kit.take(anyone)):
            for f in frames:
                rest.append(f.payload)
                kit.ack(anyone, f)
        assert rest == [b"z%d" % i for i in range(60) if i % 3]


def test_a_shorter_timeout_behind_paged_ones_is_held_and_still_expires_first(
    tmp_path: Path,
) -> None:
    """The adversary of the ordered deadline column: the MessageTimeout shortened while
    messages are paged out.  Those pushed after it would be due before the ones paged
    ahead of them: they are held in memory (with their timer) and expire at their own
    time, the paged ones at theirs; the trash gets each once."""
    with LogStore(tmp_path) as log:
        kit = _kit(log)
        producer = _timeout_queue(kit, 10_000)
        _push(kit, producer, 1, 20)
        reply = kit.update(producer, "orders", 1, MessageTimeout=1000)
        assert reply.message_type == MessageType.ACK or reply is not None
        _push(kit, producer, 21, 30)
        q = _queue(kit)
        assert len(q.messages.paged_regular.held) == 10  # 21-30: held, not paged
        kit.advance(1.5)
        assert q.message_count == 20 and q.timeouts == 10
        assert list(q.trash.entries) == list(range(21, 31))
        kit.advance(9.0)
        assert q.message_count == 0 and q.timeouts == 30
        assert sorted(q.trash.entries) == list(range(1, 31))


def test_purge_and_release_reach_paged_messages_with_deadlines(tmp_path: Path) -> None:
    """Numbers taken from the middle keep the deadline column beside them: a release of
    the oldest 15 and then a purge leave nothing to expire later; new ones still page
    and expire."""
    from broker.engine.queue import reading

    with LogStore(tmp_path) as log:
        kit = _kit(log)
        producer = _timeout_queue(kit)
        _push(kit, producer, 1, 30)
        q = _queue(kit)
        out: list[object] = []
        assert reading.release(q, 15, out) == 15  # type: ignore[arg-type]
        assert q.message_count == 15
        tail = q.messages.paged_regular
        assert tail.deadlines is not None and len(tail.deadlines) == len(tail.seqs)
        kit.ok(producer, Operation.QUEUE_PURGE, "orders", headers=((Header.QUEUE_ID, "1"),))
        assert q.message_count == 0
        kit.advance(6.0)
        assert q.message_count == 0 and q.timeouts == 0 and len(q.trash) == 0
        _push(kit, producer, 31, 40)
        assert q.message_count == 10
        kit.advance(6.0)
        assert q.message_count == 0 and q.timeouts == 10
        assert list(q.trash.entries) == list(range(31, 41))


def test_a_shortened_timeout_expires_at_its_time_in_memory_too() -> None:
    """(Found by the test above, without paging.)  The timers were kept in push order
    and the wake-up only armed when none was: messages pushed after MessageTimeout was
    shortened waited for the older, later deadlines before expiring."""
    kit = Kit()
    producer = kit.connect("producer")
    kit.queue(producer, "orders", 1, message_timeout=10_000)
    for i in range(5):
        kit.push(producer, "orders", 1, b"long%d" % i)
    kit.update(producer, "orders", 1, MessageTimeout=1000)
    for i in range(5):
        kit.push(producer, "orders", 1, b"short%d" % i)
    q = _queue(kit)
    kit.advance(1.5)
    assert q.message_count == 5 and q.timeouts == 5
    assert [t.message.payload for t in q.trash.entries.values()] == [
        b"short%d" % i for i in range(5)
    ]
    kit.advance(9.0)
    assert q.message_count == 0 and q.timeouts == 10
