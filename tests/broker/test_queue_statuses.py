"""Each queue status strategy alone (``broker.engine.queue.statuses``), without the engine.

A real :class:`Queue` is built on a minimal host (memory store, default delivery
handler); the strategy under test is called directly and the expected frames, counters
and window slots were worked out by hand from the status's rules.
"""

from __future__ import annotations

import itertools

import pytest

from broker.engine.channel import Channel, Client
from broker.engine.delivery import DefaultDeliveryHandler, DeliveryHandler, PutBack
from broker.engine.message import DONE, INFLIGHT, QUEUED, Message, QueueMessage
from broker.engine.options import BrokerConfig, ChannelOptions, ChannelQueueOptions
from broker.engine.queue.queue import Queue
from broker.engine.queue.statuses import (
    STATUSES,
    Broadcast,
    Cache,
    Paused,
    Pull,
    Push,
    RoundRobin,
    Stopped,
    strategy_for,
)
from broker.engine.receipts import Receipts
from broker.protocol import (
    ConnectionInfo,
    Header,
    MessageType,
    NoContent,
    Outgoing,
    QueueStatus,
    ResultCode,
    Tracked,
    header,
)
from broker.store import MemoryStore

NOW = 100.0


class Host:
    """The engine's side of a queue, reduced to what a queue asks for."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.config = BrokerConfig()
        self.clients: dict[str, Client] = {}
        self.ids = itertools.count(1)
        self.wakes: list[float] = []
        self.errors: list[str] = []
        self.handler = DefaultDeliveryHandler()
        self.receipts = Receipts(self.new_id, limit=1000)

    def client(self, client_id: str) -> Client | None:
        return self.clients.get(client_id)

    def new_id(self) -> str:
        return f"id{next(self.ids)}"

    def wake(self, queue: Queue, when: float) -> None:
        self.wakes.append(when)

    def handler_for(self, key: str | None) -> DeliveryHandler:
        return self.handler

    def count_error(self, where: str, error: Exception) -> None:
        self.errors.append(where)


def make(status: QueueStatus, consumers: int = 0, **options: object) -> tuple[Queue, list[Client]]:
    host = Host()
    channel = Channel("ch", ChannelOptions())
    q = Queue(channel, 1, ChannelQueueOptions(status=status, **options), host)  # type: ignore[arg-type]
    channel.queues[1] = q
    clients = []
    for i in range(consumers):
        c = Client(f"c{i}", ConnectionInfo(), 0.0)
        host.clients[c.id] = c
        channel.consumers[c.id] = c
        channel.consumer_list.append(c)
        clients.append(c)
    return q, clients


def message(q: Queue, payload: bytes, *, high: bool = False, mid: str = "") -> QueueMessage:
    q.sequence += 1
    m = Message(
        content_type=q.id,
        target=q.channel.name,
        message_id=mid or f"m{q.sequence}",
        high_priority=high,
        payload=payload,
    )
    return QueueMessage(q.sequence, m, None, False, NOW)


def sent_to(out: list[Outgoing]) -> list[tuple[str, bytes]]:
    return [(o.client_id, o.frame.payload) for o in out if isinstance(o, Tracked)]


def test_the_table_has_one_strategy_per_status_and_their_fixed_answers() -> None:
    assert set(STATUSES) == set(QueueStatus)
    kinds = {s: type(strategy_for(s)) for s in QueueStatus}
    assert kinds == {
        QueueStatus.BROADCAST: Broadcast,
        QueueStatus.PUSH: Push,
        QueueStatus.ROUND_ROBIN: RoundRobin,
        QueueStatus.PULL: Pull,
        QueueStatus.CACHE: Cache,
        QueueStatus.PAUSED: Paused,
        QueueStatus.STOPPED: Stopped,
    }
    answers = {
        s: (st.accepts_pushes, st.limits_count, st.delivers, st.takes_plain, st.keeps_returns)
        for s, st in STATUSES.items()
    }
    assert answers == {
        QueueStatus.BROADCAST: (True, False, True, False, True),
        QueueStatus.PUSH: (True, True, True, True, True),
        QueueStatus.ROUND_ROBIN: (True, True, True, True, True),
        QueueStatus.PULL: (True, True, False, False, True),
        QueueStatus.CACHE: (True, True, False, False, True),
        QueueStatus.PAUSED: (True, True, False, False, True),
        QueueStatus.STOPPED: (False, True, False, False, False),
    }


def test_push_sends_to_every_consumer_with_room_then_waits() -> None:
    q, (a, b) = make(QueueStatus.PUSH, 2, prefetch=1)
    out: list[Outgoing] = []
    m1 = message(q, b"one")
    Push().admit(q, m1, NOW, out)
    # window 1 each: both take m1 and are then full
    assert sent_to(out) == [("c0", b"one"), ("c1", b"one")]
    assert q.used == {"c0": 1, "c1": 1} and m1.state == INFLIGHT and m1.unsent == 2
    out.clear()
    m2 = message(q, b"two")
    Push().admit(q, m2, NOW, out)
    assert out == [] and q.n_regular == 1 and m2.state == QUEUED and q.stalled
    # the first acquirer flag narrows it to the first consumer with room
    q.used.clear()
    first = message(q, b"first")
    first.message = first.message.replace(first_acquirer=True)
    assert list(Push().targets(q, first, [a, b], False, True)) == [a]


def test_round_robin_rotates_over_consumers_with_room() -> None:
    q, (a, b, c) = make(QueueStatus.ROUND_ROBIN, 3, prefetch=1)
    rr = RoundRobin()
    out: list[Outgoing] = []
    for p in (b"1", b"2", b"3", b"4"):
        rr.admit(q, message(q, p), NOW, out)
    # one each in turn; the 4th finds every window (1) full and waits
    assert sent_to(out) == [("c0", b"1"), ("c1", b"2"), ("c2", b"3")]
    assert q.n_regular == 1 and q.rr == 0
    # plain fast path: b freed its slot -> b is next with room, position moves past it
    q.used.pop("c1")
    assert rr.plain_target(q, [a, b, c]) is b and q.rr == 2
    q.used["c1"] = 1  # (push_plain takes the slot of the consumer chosen)
    assert rr.plain_target(q, [a, b, c]) is None  # nobody has room
    # a single consumer with room resets the position (as choose_one leaves it)
    q.rr = 5
    q.used.pop("c0")
    assert rr.plain_target(q, [a]) is a and q.rr == 0


def test_broadcast_drops_what_nobody_takes_and_counts_full_windows() -> None:
    q, _ = make(QueueStatus.BROADCAST, 0)
    out: list[Outgoing] = []
    lonely = message(q, b"lonely")
    Broadcast().admit(q, lonely, NOW, out)
    # no consumer: dropped without counting as removed, never queued
    assert lonely.state == DONE and q.removed == 0 and q.n_regular == 0 and out == []

    q, (a, b) = make(QueueStatus.BROADCAST, 2, prefetch=1)
    q.used["c1"] = 1  # b's window is full
    m = message(q, b"news")
    Broadcast().admit(q, m, NOW, out)
    assert sent_to(out) == [("c0", b"news")] and q.dropped == 1 and q.n_regular == 0
    assert Broadcast().plain_target(q, [a, b]) is None


def test_pull_keeps_pushes_until_pulled() -> None:
    q, (a,) = make(QueueStatus.PULL, 1)
    out: list[Outgoing] = []
    for p in (b"x", b"y", b"z"):
        Pull().admit(q, message(q, p), NOW, out)
    assert out == [] and q.n_regular == 3
    assert list(Pull().targets(q, message(q, b"w"), [a], False, True)) == []
    req = Message(message_id="r1", headers=((Header.COUNT, "2"),))
    Pull().pull(q, a, req, NOW, out, 100)
    # two messages FIFO, indexed 1 and 2 of 2, then the End marker; one stays
    assert sent_to(out) == [("c0", b"x"), ("c0", b"y")]
    assert [header(o.frame, Header.INDEX) for o in out[:2]] == ["1", "2"]
    assert header(out[-1].frame, Header.NO_CONTENT) == NoContent.END
    assert q.n_regular == 1


def test_cache_keeps_only_the_latest_and_a_pull_reads_it_without_removing() -> None:
    q, (a,) = make(QueueStatus.CACHE, 1)
    out: list[Outgoing] = []
    old = message(q, b"old")
    Cache().admit(q, old, NOW, out)
    new = message(q, b"new")
    Cache().admit(q, new, NOW, out)
    assert old.state == DONE and new.state == QUEUED and q.n_regular == 1 and out == []
    req = Message(message_id="r9")
    Cache().pull(q, a, req, NOW, out, 100)
    (answer,) = out
    assert answer.frame.message_type == int(MessageType.RESPONSE)
    assert answer.frame.content_type == ResultCode.OK and answer.frame.payload == b"new"
    assert q.n_regular == 1  # still there


def test_paused_keeps_and_sends_nothing_and_refuses_pulls() -> None:
    q, (a,) = make(QueueStatus.PAUSED, 1)
    out: list[Outgoing] = []
    Paused().admit(q, message(q, b"p"), NOW, out)
    q.drain(NOW, out)
    assert out == [] and q.n_regular == 1
    Paused().pull(q, a, Message(message_id="r"), NOW, out, 100)
    assert [header(o.frame, Header.NO_CONTENT) for o in out] == [
        NoContent.UNACCEPTABLE,
        NoContent.END,
    ]
    assert q.n_regular == 1


def test_stopped_refuses_pushes_clears_on_entry_and_drops_returns() -> None:
    q, _ = make(QueueStatus.PUSH, 1, prefetch=1, request_acknowledge=True)
    out: list[Outgoing] = []
    inflight = message(q, b"a")
    q.accept(inflight.message, None, NOW, out, False)
    waiting = message(q, b"b")
    q.accept(waiting.message, None, NOW, out, False)
    assert len(q.pending) == 1 and q.n_regular == 1
    out.clear()
    stopped = Stopped()
    q.strategy = stopped
    stopped.entered(q, QueueStatus.PUSH, out)
    # waiting and in-flight messages both removed; the window slot freed
    assert q.n_regular == 0 and not q.pending and q.used == {} and q.removed == 2
    assert q.check_push(1) == ResultCode.UNACCEPTABLE
    # entering from Stopped itself clears nothing (the queue stays as it is)
    kept = message(q, b"c")
    q.enqueue(kept)
    stopped.entered(q, QueueStatus.STOPPED, out)
    assert q.n_regular == 1 and kept.state == QUEUED
    # a message coming back to a stopped queue is dropped, not requeued
    back = message(q, b"d")
    back.state = INFLIGHT
    q.put_back(back, PutBack.START, NOW, out)
    assert back.state == DONE and q.n_regular == 1


@pytest.mark.parametrize("status", [s for s in QueueStatus if s is not QueueStatus.STOPPED])
def test_switching_to_any_other_status_keeps_the_messages(status: QueueStatus) -> None:
    q, _ = make(QueueStatus.PAUSED, 0)
    out: list[Outgoing] = []
    for p in (b"1", b"2"):
        q.enqueue(message(q, p))
    strategy_for(status).entered(q, QueueStatus.PAUSED, out)
    assert q.n_regular == 2 and out == []
