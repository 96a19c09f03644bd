"""The ``per-message`` handler's per-consumer rules on the sans-IO engine: selectors (a
message nobody with room selects is looked past, not a block), first sequences, and
credit windows (count and size; given back by acknowledges or at once)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.engine.per_message import Credit, PerMessageRules
from broker.engine.queue import dispatch
from tests.broker.engine_kit import Kit, per_message_queue, queue_messages


def setup(consumers: int = 2) -> tuple[Kit, PerMessageRules, str, list[str]]:
    return per_message_queue(consumers)


def kind_is(kind: str) -> object:
    def selects(headers: Sequence[tuple[str, str]]) -> bool:
        return dict(headers).get("kind") == kind

    return selects


def test_each_consumer_gets_what_it_selects_and_the_rest_waits_without_blocking() -> None:
    kit, rules, producer, (a, b) = setup()
    rules.set_selector("ch", a, kind_is("a"))  # type: ignore[arg-type]
    rules.set_selector("ch", b, kind_is("b"))  # type: ignore[arg-type]
    for kind in ("z", "a", "b", "z", "a", "b"):
        kit.push(producer, "ch", 1, kind.encode(), headers=(("kind", kind),))
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"a", b"a"]
    assert [m.payload for m in queue_messages(kit.take(b))] == [b"b", b"b"]
    assert kit.info(producer, "ch", 1)["Messages"] == 2  # the two "z" wait, in order
    rules.set_selector("ch", a, None)
    kit.push(producer, "ch", 1, b"a", headers=(("kind", "a"),))  # a drain: a selects all now
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"z", b"z", b"a"]


def test_a_drain_looks_past_at_most_the_limit_of_what_a_full_consumer_selects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages a consumer selects but may not take (here: out of credit) are set aside
    as waiting for room and offered to it first in each drain; the looks at those it
    still may not take count against ``LOOK_PAST_LIMIT`` per drain, so a message behind
    more of them waits until that consumer takes some (messages nobody selects at all
    cost nothing once set aside: ``tests/broker/test_selector_starvation.py``)."""
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    kit, rules, producer, (a, b) = setup()
    rules.set_selector("ch", a, kind_is("a"))  # type: ignore[arg-type]
    rules.set_credit("ch", a, Credit(1, 0))
    rules.set_selector("ch", b, kind_is("b"))  # type: ignore[arg-type]
    kit.push(producer, "ch", 1, b"a0", headers=(("kind", "a"),))
    (a0,) = queue_messages(kit.take(a))  # a has no credit left
    for i in (1, 2, 3):
        kit.push(producer, "ch", 1, b"a%d" % i, headers=(("kind", "a"),))
    kit.push(producer, "ch", 1, b"b1", headers=(("kind", "b"),))  # 3 ahead: still reached
    assert [m.payload for m in queue_messages(kit.take(b))] == [b"b1"]
    kit.push(producer, "ch", 1, b"a4", headers=(("kind", "a"),))
    kit.push(producer, "ch", 1, b"b2", headers=(("kind", "b"),))  # 4 ahead: past the limit
    assert queue_messages(kit.take(b)) == []
    kit.ack(a, a0)  # a takes a1: 3 ahead of b2 now
    (a1,) = queue_messages(kit.take(a))
    assert a1.payload == b"a1"
    assert [m.payload for m in queue_messages(kit.take(b))] == [b"b2"]
    assert kit.info(producer, "ch", 1)["Messages"] == 3  # a2, a3, a4 wait for a's credit


def test_without_selectors_a_message_nobody_may_take_still_waits_at_the_head() -> None:
    """Other rules (here the credit) refuse without looking past: the order is kept."""
    kit, rules, producer, (a,) = setup(1)
    rules.set_credit("ch", a, Credit(1, 0))
    kit.push(producer, "ch", 1, b"m1")
    kit.push(producer, "ch", 1, b"m2")
    (first,) = queue_messages(kit.take(a))
    assert first.payload == b"m1"
    kit.ack(a, first)
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"m2"]


def test_from_seq_offers_only_later_messages() -> None:
    kit, rules, producer, (a, b) = setup()
    rules.set_from_seq("ch", a, 3)
    rules.set_selector("ch", b, kind_is("none"))  # type: ignore[arg-type]  # b takes nothing
    for i in range(1, 5):
        kit.push(producer, "ch", 1, str(i).encode())
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"3", b"4"]
    assert kit.info(producer, "ch", 1)["Messages"] == 2


def test_the_size_window_and_credit_given_back_once() -> None:
    kit, rules, producer, (a,) = setup(1)
    rules.set_credit("ch", a, Credit(0, 250))
    for i in range(6):
        kit.push(producer, "ch", 1, b"%d" % i + b"x" * 99)
    got = queue_messages(kit.take(a))
    assert [m.payload[:1] for m in got] == [b"0", b"1", b"2"]  # 300 octets: crossed 250
    kit.ack(a, got[0])  # 100 back: 50 left
    more = queue_messages(kit.take(a))
    assert [m.payload[:1] for m in more] == [b"3"]
    assert rules.return_credit("ch", a, got[1].message_id)  # at once (a transactional ACK)
    assert not rules.return_credit("ch", a, got[1].message_id)  # once only
    out: list[object] = []  # the front door drains the queue after giving credit back
    kit.engine.channels["ch"].queues[1].drain(kit.now, out)  # type: ignore[arg-type]
    kit.route(out)  # type: ignore[arg-type]
    assert [m.payload[:1] for m in queue_messages(kit.take(a))] == [b"4"]
    kit.ack(a, got[1])  # its credit was given already: nothing more goes
    assert queue_messages(kit.take(a)) == []
