"""``Engine.publish_many`` serves consecutive pushes into one queue as a run (the queue,
the authorizer, the durable subscriptions and the event subscribers looked up once):
differential against ``Engine.publish`` of each message in turn, on two engines built
alike, with hostile messages in the middle of runs (a forbidden channel, a body over the
queue's limit, a full queue, headers the typed path acts on, an acknowledge wish)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from broker.engine.auth import Action, Authorizer
from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.engine import Engine
from broker.engine.options import BrokerConfig, ChannelQueueOptions
from broker.engine.per_message import PER_MESSAGE
from broker.message import Message
from broker.protocol import (
    ConnectionInfo,
    Header,
    MessageType,
    QueueStatus,
    header,
)
from broker.tmqp import Frame

STAMP = (("Stomp-User", "p"), ("Stomp-Timestamp", "1700000000000"))


class Forbids(Authorizer):
    """Allows everything but pushes into channel ``forbidden``; counts its push checks."""

    def __init__(self) -> None:
        self.push_checks = 0

    def allows(
        self,
        client: Any,
        action: Action,
        channel: str | None = None,
        queue: int | None = None,
        target: str | None = None,
    ) -> bool:
        if action is Action.PUSH:
            self.push_checks += 1
            return channel != "forbidden"
        return True


def _engine() -> tuple[Engine, Forbids, str, str]:
    ids = itertools.count(1)
    policy = Forbids()
    engine = Engine(
        authorizer=policy,
        new_id=lambda: f"id{next(ids)}",
        config=BrokerConfig(wall_clock=lambda: 1_700_000_000.0),
        handlers={PER_MESSAGE: PerMessageDeliveryHandler(lambda: 1_700_000_000.0)},
    )
    acked = ChannelQueueOptions(
        status=QueueStatus.ROUND_ROBIN,
        request_acknowledge=True,
        message_delivery_handler=PER_MESSAGE,
    )
    for name, options in (
        ("a", acked),
        ("b", acked),
        ("small", ChannelQueueOptions(message_size_limit=10)),
        ("two", ChannelQueueOptions(message_limit=2)),
        ("forbidden", acked),
    ):
        engine.create_channel(name)
        engine.create_queue(name, 0, options)
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), 0.0)
    consumer, _ = engine.connect(ConnectionInfo(client_id="c"), 0.0)
    for name in ("a", "b"):
        engine.subscribe(consumer, name, 0.0)
    return engine, policy, producer, consumer


def _m(i: int, target: str, body: bytes = b"", **kw: Any) -> Message:
    headers = kw.pop("headers", ()) + STAMP
    return Message(f"m{i}", "p", target, 0, headers=headers, payload=body or b"%d" % i, **kw)


def _one_by_one(engine: Engine, producer: str, messages: list[Message]) -> tuple:  # type: ignore[type-arg]
    """``publish`` of each in turn, stopping at the first refused (as the door did)."""
    out: list[Any] = []
    for taken, m in enumerate(messages):
        sent = engine.publish(producer, m, 0.0, wants_response=True)
        answer = [
            o
            for o in sent
            if isinstance(o[1], Frame)
            and o[0] == producer
            and o[1].message_type == MessageType.RESPONSE
            and o[1].message_id == m.message_id
            and o[1].content_type
        ]
        if answer:
            sent.remove(answer[0])
            out += sent
            return out, taken, header(answer[0][1], Header.REASON)
        out += sent
    return out, len(messages), None


def _state(engine: Engine) -> dict[str, tuple[int, int, int]]:
    return {
        name: (q.received, q.message_count, q.sequence)
        for name, channel in engine.channels.items()
        for q in channel.queues.values()
    }


_REFUSED = "push refused by the queue"
_FORBIDDEN = "push not allowed"
#: case -> (its messages, (taken, why the next one was refused))
CASES: dict[str, tuple[list[Message], tuple[int, str | None]]] = {
    "plain run": ([_m(i, "a") for i in range(6)], (6, None)),
    "too large in the middle": (
        [_m(0, "small"), _m(1, "small"), _m(2, "small", b"x" * 11), _m(3, "small")],
        (2, _REFUSED),
    ),
    "queue full in the middle": ([_m(i, "two") for i in range(4)], (2, _REFUSED)),
    "forbidden after a run": (
        [_m(0, "a"), _m(1, "a"), _m(2, "forbidden"), _m(3, "a")],
        (2, _FORBIDDEN),
    ),
    "forbidden run": ([_m(0, "forbidden"), _m(1, "forbidden")], (0, _FORBIDDEN)),
    "alternating queues": ([_m(i, "ab"[i % 2]) for i in range(7)], (7, None)),
    "typed-path headers amid a run": (
        [
            _m(0, "a"),
            _m(1, "a", headers=(("CC", "b"),)),
            _m(2, "a", headers=(("Receipt", "ONE"),)),
            _m(3, "a", wants_ack=True),
            _m(4, "a", headers=(("Receipt-Timeout", "bad"),)),
            _m(5, "a"),
        ],
        (4, "bad Receipt-Timeout 'bad'"),
    ),
    "per-message rules": (
        [
            _m(0, "a", headers=(("message_group", "g"),)),
            _m(1, "a", headers=(("expires", "1"),)),  # 1970: dropped when reached
            _m(2, "a", headers=(("expires", "\u00b2"),)),
            _m(3, "a", headers=(("persistent", "true"),)),
        ],
        (4, None),
    ),
    "a queue made on the fly": ([_m(0, "a"), _m(1, "new"), _m(2, "new")], (3, None)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_gives_what_each_push_in_turn_gives(case: str) -> None:
    messages, outcome = CASES[case]
    run_engine, run_policy, producer, _ = _engine()
    each_engine, each_policy, _, _ = _engine()
    got = run_engine.publish_many(producer, messages, 0.0)
    expected = _one_by_one(each_engine, producer, messages)
    assert got[1:] == expected[1:] == outcome  # taken, why the next one was refused
    assert got[0] == expected[0]  # the output: deliveries, receipts, answers, in order
    assert _state(run_engine) == _state(each_engine)
    assert run_engine.errors == each_engine.errors
    assert run_policy.push_checks <= each_policy.push_checks


def test_the_authorizer_is_asked_once_per_run() -> None:
    engine, policy, producer, _ = _engine()
    messages = [_m(i, "a") for i in range(50)] + [_m(50 + i, "b") for i in range(50)]
    _, taken, refused = engine.publish_many(producer, messages, 0.0)
    assert (taken, refused) == (100, None)
    assert policy.push_checks == 2
    assert _state(engine)["a"][0] == _state(engine)["b"][0] == 50


@pytest.mark.parametrize("case", sorted(CASES))
def test_unique_ids_change_nothing_but_the_duplicate_window(case: str) -> None:
    """``unique_ids`` (the STOMP door's own ids): the same output, counts and refusals as
    without; only the duplicate window of an acknowledged queue's run stays as it was."""
    messages, outcome = CASES[case]
    plain_engine, _, producer, _ = _engine()
    unique_engine, _, _, _ = _engine()
    expected = plain_engine.publish_many(producer, messages, 0.0)
    got = unique_engine.publish_many(producer, messages, 0.0, unique_ids=True)
    assert got == expected
    assert got[1:] == outcome
    assert _state(unique_engine) == _state(plain_engine)
    assert unique_engine.errors == plain_engine.errors


def test_a_run_of_unique_ids_is_not_remembered_as_a_producers() -> None:
    """A run with ``unique_ids`` leaves the queue's duplicate window empty, so a later push
    that happens to carry one of those ids is a new message, not a duplicate dropped."""
    engine, _, producer, _ = _engine()
    queue = engine.channels["a"].queues[0]
    _, taken, refused = engine.publish_many(
        producer, [_m(i, "a") for i in range(5)], 0.0, unique_ids=True
    )
    assert (taken, refused) == (5, None)
    assert len(queue.recent) == 0
    engine.publish(producer, _m(2, "a"), 0.0)
    assert (queue.received, queue.duplicates) == (6, 0)
    # without it the run's ids are remembered, and the same push is a duplicate
    engine, _, producer, _ = _engine()
    queue = engine.channels["a"].queues[0]
    engine.publish_many(producer, [_m(i, "a") for i in range(5)], 0.0)
    assert len(queue.recent) == 5
    engine.publish(producer, _m(2, "a"), 0.0)
    assert (queue.received, queue.duplicates) == (5, 1)


class _Counting(PerMessageDeliveryHandler):
    """The per-message rules, counting ``received_from_producer`` calls; it says again
    that it answers from the header block (``received_by_headers``)."""

    received_by_headers = True

    def __init__(self) -> None:
        super().__init__(lambda: 1_700_000_000.0)
        self.asked = 0

    def received_from_producer(self, queue: Any, message: Any, sender: Any) -> Any:
        self.asked += 1
        return super().received_from_producer(queue, message, sender)


class _CountingUnsaid(_Counting):
    """The same hook overridden again without saying it: asked for every push."""

    def received_from_producer(self, queue: Any, message: Any, sender: Any) -> Any:
        return super().received_from_producer(queue, message, sender)


@pytest.mark.parametrize(("handler_class", "asked"), [(_Counting, 2), (_CountingUnsaid, 6)])
def test_a_handler_answering_from_the_header_block_is_asked_once_per_block_in_a_run(
    handler_class: type[_Counting], asked: int
) -> None:
    """``Queue.accept_many`` asks a handler whose ``received_from_producer`` answers from
    the header block once per block (a run of SENDs shares the door's); a subclass that
    overrides the hook without declaring it again is asked for each push."""
    handler = handler_class()
    engine = Engine(handlers={PER_MESSAGE: handler})
    engine.create_channel("a")
    engine.create_queue(
        "a",
        0,
        ChannelQueueOptions(
            status=QueueStatus.ROUND_ROBIN,
            request_acknowledge=True,
            message_delivery_handler=PER_MESSAGE,
        ),
    )
    producer, _ = engine.connect(ConnectionInfo(client_id="p"), 0.0)
    other = (("persistent", "false"),)
    messages = [_m(i, "a") for i in range(3)] + [_m(3 + i, "a", headers=other) for i in range(3)]
    messages[3:] = [m._replace(headers=messages[3].headers) for m in messages[3:]]  # one block
    assert engine.publish_many(producer, messages, 0.0, unique_ids=True)[1:] == (6, None)
    assert handler.asked == asked
    assert engine.channels["a"].queues[0].received == 6
