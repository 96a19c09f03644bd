"""``Queue.accept_many``: a run of typed pushes into an acknowledged queue (the STOMP
door's run of SENDs into a ``/queue/``) gives what ``Engine.publish`` of each push in
turn gives: differential, two engines built alike, the same steps on both, comparing
every output frame in order, the queues' counters and what the consumers hold after
acknowledging, refusing and getting redeliveries.

Hostile and unlucky cases in the middle of runs: an over-size body, a full queue (its
own limit and the broker's), a stopped queue, a duplicate id, high-priority messages,
consumers whose windows fill (the rest queues and is drained later), three consumers
in round robin (one low priority), WaitForAcknowledge, a message timeout, a delivery
handler that raises, a store that refuses a persistent message (the run stops after
it), a NACKed delivery redelivered between runs, and a queue made on the fly."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from broker.engine.delivery import Decision, PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import BrokerConfig, ChannelQueueOptions, Limits
from broker.engine.per_message import PER_MESSAGE
from broker.engine.queue import reading
from broker.message import Message
from broker.protocol import ConnectionInfo, NackReason, QueueStatus
from broker.sequence import FROM_FIRST
from broker.store.memory import MemoryStore
from tests.broker.full_disk import FullDisk
from tests.broker.test_engine_publish_runs import _one_by_one

STAMP = (("Stomp-User", "p"), ("Stomp-Timestamp", "1700000000000"))
WALL = 1_700_000_000.0
RAISER = "raiser"


class RaisesAtFive(PerMessageDeliveryHandler):
    """The per-message rules, but ``received_from_producer`` raises for body ``5``."""

    def received_from_producer(self, queue: Any, message: Any, sender: Any) -> Decision:
        if message.payload == b"5":
            raise RuntimeError("handler broke")
        return super().received_from_producer(queue, message, sender)


def _acked(**kw: Any) -> ChannelQueueOptions:
    kw.setdefault("status", QueueStatus.ROUND_ROBIN)
    kw.setdefault("message_delivery_handler", PER_MESSAGE)
    return ChannelQueueOptions(request_acknowledge=True, **kw)


#: channel -> its queue's options and the prefetch of each of its consumers
QUEUES: dict[str, tuple[ChannelQueueOptions, tuple[int, ...]]] = {
    "a": (_acked(), (1000,)),
    "small": (_acked(message_size_limit=10), (1000,)),
    "four": (_acked(message_limit=4), (2,)),
    "narrow": (_acked(), (2, 3)),
    "three": (_acked(), (2, 2, 2)),
    "push": (_acked(status=QueueStatus.PUSH), (3, 3)),
    "stopped": (_acked(status=QueueStatus.STOPPED), (10,)),
    "waits": (_acked(wait_for_acknowledge=True), (10,)),
    "timed": (_acked(message_timeout=60_000), (2,)),
    "raiser": (_acked(message_delivery_handler=RAISER), (10,)),
    "idle": (_acked(), ()),
}


def _engine(store_room: int | None = None, fail_id: int = 0) -> tuple[Engine, str, list[str]]:
    ids = itertools.count(1)

    def new_id() -> str:
        n = next(ids)
        if n == fail_id:
            raise RuntimeError("no more ids")
        return f"id{n}"

    engine = Engine(
        new_id=new_id,
        store=FullDisk(store_room) if store_room is not None else MemoryStore(),
        config=BrokerConfig(wall_clock=lambda: WALL, limits=Limits(max_queue_messages=50)),
        handlers={
            PER_MESSAGE: PerMessageDeliveryHandler(lambda: WALL),
            RAISER: RaisesAtFive(lambda: WALL),
        },
    )
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), 0.0)
    consumers: list[str] = []
    for name, (options, windows) in QUEUES.items():
        engine.create_channel(name)
        engine.create_queue(name, 0, options)
        for n, window in enumerate(windows):
            cid = f"{name}-c{n}"
            low = {"Consumer-Priority": "low"} if name == "three" and n == 0 else {}
            consumer, _ = engine.connect(ConnectionInfo(client_id=cid, properties=low), 0.0)
            engine.subscribe(consumer, name, 0.0, prefetch=window)
            consumers.append(consumer)
        reading.browse(engine.channels[name].queues[0], FROM_FIRST, 1)  # its index kept
    return engine, producer, consumers


def _m(i: int, target: str, body: bytes = b"", **kw: Any) -> Message:
    headers = kw.pop("headers", ()) + STAMP
    mid = kw.pop("mid", f"m{i}")
    return Message(mid, "p", target, 0, headers=headers, payload=body or b"%d" % i, **kw)


def _state(engine: Engine) -> dict[str, tuple[int, ...]]:
    return {
        name: (
            q.received,
            q.message_count,
            q.sequence,
            q.sent,
            q.deliveries,
            q.duplicates,
            q.timeouts,
            q.unsaved,
            len(q.pending),
            q.rr,
        )
        for name, channel in engine.channels.items()
        for q in channel.queues.values()
    }


def _held(engine: Engine) -> list[Any]:
    """What each queue holds (waiting or in flight), read by sequence."""
    return [reading.browse(c.queues[0], FROM_FIRST, 100) for c in engine.channels.values()]


def _settle(engine: Engine, consumers: list[str], out: list[Any], nack_first: bool) -> list[Any]:
    """Every consumer reports its deliveries taken, then acknowledges them (the first
    one of each consumer negatively when ``nack_first``: put back, redelivered)."""
    more: list[Any] = []
    held: dict[str, list[Message]] = {}
    for cid, frame in out:
        if cid in consumers and isinstance(frame, Message):
            held.setdefault(cid, []).append(frame)
    for cid, frames in held.items():
        more += engine.transmitted({cid: len(frames)}, 0.0)
        for i, f in enumerate(frames):
            reason = NackReason.NONE if nack_first and i == 0 else None
            more += engine.acknowledge(
                cid, f.target, f.content_type, f.message_id, 0.0, nack_reason=reason
            )
    return more


def _runs(
    steps: list[list[Message]], via_run: bool, store_room: int | None = None, fail_id: int = 0
) -> Any:
    engine, producer, consumers = _engine(store_room, fail_id)
    outcome = []
    for n, messages in enumerate(steps):
        if via_run:
            out, taken, why = engine.publish_many(producer, messages, 0.0)
        else:
            out, taken, why = _one_by_one(engine, producer, messages)
        outcome.append((out, taken, why))
        outcome.append(_held(engine))
        outcome.append(_settle(engine, consumers, out, nack_first=n == 0))
    # the ids the runs remembered: a producer that does not wait resends one of each
    for name in QUEUES:
        outcome.append(engine.publish(producer, _m(99, name, mid="m1"), 0.0))
    outcome.append(engine.tick(120.0))  # past every message timeout
    outcome.append(_held(engine))
    return outcome, _state(engine), engine.errors


A = [_m(i, "a") for i in range(8)]
#: case -> the runs published one after the other (settled in between)
CASES: dict[str, list[list[Message]]] = {
    "plain runs": [A[:4], A[4:]],
    "too large in the middle": [
        [_m(0, "small"), _m(1, "small"), _m(2, "small", b"x" * 11), _m(3, "small")]
    ],
    "its own limit in the middle": [[_m(i, "four") for i in range(7)]],
    "the broker's limit": [[_m(i, "idle") for i in range(55)]],
    "stopped": [[_m(0, "stopped"), _m(1, "stopped")]],
    "a duplicate id": [[_m(0, "a"), _m(1, "a"), _m(2, "a", mid="m0"), _m(3, "a")]],
    "no id": [[_m(i, "a", mid="") for i in range(3)]],
    "high priority amid full windows": [
        [_m(i, "narrow", high_priority=i % 3 == 0) for i in range(12)],
        [_m(20 + i, "narrow", high_priority=i == 2) for i in range(4)],
    ],
    "three in round robin, one low": [
        [_m(i, "three") for i in range(9)],
        [_m(20 + i, "three") for i in range(3)],
    ],
    "push to all": [[_m(i, "push") for i in range(8)]],
    "waits for acknowledges": [[_m(i, "waits") for i in range(5)], [_m(9, "waits")]],
    "a message timeout": [[_m(i, "timed") for i in range(6)]],
    "a handler that raises": [[_m(i, "raiser") for i in range(8)]],
    "per-message rules": [
        [
            _m(0, "a", headers=(("message_group", "g"),)),
            _m(1, "a", headers=(("expires", "1"),)),
            _m(2, "a", headers=(("persistent", "true"),)),
            _m(3, "a"),
        ]
    ],
    "typed-path headers amid a run": [
        [
            _m(0, "a"),
            _m(1, "a", headers=(("CC", "three"),)),
            _m(2, "a", wants_ack=True),
            _m(3, "a"),
            _m(4, "a", headers=(("Receipt-Timeout", "bad"),)),
            _m(5, "a"),
        ]
    ],
    "queues alternating, one made on the fly": [
        [_m(0, "a"), _m(1, "new"), _m(2, "new"), _m(3, "a"), _m(4, "a"), _m(5, "narrow")]
    ],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_into_an_acknowledged_queue_gives_what_each_push_gives(case: str) -> None:
    run = _runs(CASES[case], via_run=True)
    each = _runs(CASES[case], via_run=False)
    assert run == each


def test_a_store_that_refuses_a_persistent_message_ends_the_run_after_it() -> None:
    persistent = (("persistent", "true"),)
    steps = [[_m(i, "a", headers=persistent) for i in range(5)]]
    run = _runs(steps, via_run=True, store_room=2)
    each = _runs(steps, via_run=False, store_room=2)
    assert run == each
    (_, taken, why), _ = run[0][:2]
    assert (taken, why) == (2, "not saved: the store failed")


def test_a_push_that_raises_mid_run_is_refused_and_ends_the_run() -> None:
    """The id factory fails for the third push without an id: the two before it taken,
    it refused as an internal error (counted), nothing after it taken."""
    steps = [[_m(i, "a", mid="") for i in range(5)]]
    run = _runs(steps, via_run=True, fail_id=3)
    each = _runs(steps, via_run=False, fail_id=3)
    assert run == each
    (_, taken, why) = run[0][0]
    assert (taken, why) == (2, "internal error")
    assert run[2] == 1  # (the engine counted it)


def test_the_runs_took_the_accept_many_path() -> None:
    """The cases above compare the two paths only if runs go through ``accept_many``."""
    engine, producer, _ = _engine()
    queue = engine.channels["a"].queues[0]
    seen: list[int] = []
    accept_many: Callable[..., Any] = queue.accept_many

    def counted(ms: Any, start: int, end: int, *args: Any, **kwargs: Any) -> Any:
        seen.append(end - start)
        return accept_many(ms, start, end, *args, **kwargs)

    queue.accept_many = counted  # type: ignore[method-assign]
    assert engine.publish_many(producer, A, 0.0)[1:] == (8, None)
    assert seen == [8]
