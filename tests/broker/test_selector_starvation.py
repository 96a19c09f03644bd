"""Selector starvation (the adversary of ``Dispatcher.drain``'s look-past): messages no
consumer selects, more than one drain may look past, must not keep a selected message
behind them from its consumer.  The queue sets them aside (``MessageOrder``: "Set
aside") so each drain goes on where the last one stopped; they stay in the queue, in
order, counted, browsable, purgeable, for a later consumer that selects them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from broker.engine.delivery import PerMessageDeliveryHandler
from broker.engine.limits import Limits
from broker.engine.options import BrokerConfig
from broker.engine.per_message import PER_MESSAGE, Credit, PerMessageRules
from broker.engine.queue import dispatch, reading
from broker.protocol import Header, Operation, QueueStatus
from broker.sequence import FROM_FIRST
from broker.store.durable import DurableStore
from broker.store.log import LogStore
from tests.broker.engine_kit import Kit, per_message_queue, queue_messages


class Counting:
    """A selector on the ``kind`` header that counts how often it is asked."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.calls = 0

    def __call__(self, headers: Sequence[tuple[str, str]]) -> bool:
        self.calls += 1
        return dict(headers).get("kind") == self.kind


def setup(
    consumers: int = 1, on: tuple[Kit, PerMessageRules] | None = None
) -> tuple[Kit, PerMessageRules, str, list[str]]:
    return per_message_queue(consumers, on)


def settle(kit: Kit) -> None:
    """Run the ticks the queue asks for to go on behind what it set aside (the server
    loop does this), until it asks for none."""
    for _ in range(1000):
        due = kit.engine.next_deadline()
        if due is None or due > kit.now + dispatch.DRAIN_AGAIN_AFTER:
            return
        kit.advance(dispatch.DRAIN_AGAIN_AFTER)
    raise AssertionError("the queue keeps asking for ticks")


def push(kit: Kit, producer: str, kind: str, payload: bytes, *, high: bool = False) -> None:
    kit.push(producer, "ch", 1, payload, headers=(("kind", kind),), high=high)


def test_a_selected_message_behind_5000_nobody_selects_is_delivered() -> None:
    """5,000 (five times the look-past limit) unselected ahead: the selected one still
    goes, the ones behind it too, in order; the unselected stay, counted."""
    kit, rules, producer, (a,) = setup()
    rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    assert dispatch.LOOK_PAST_LIMIT == 1000
    for i in range(5000):
        push(kit, producer, "z", b"z%d" % i)
    push(kit, producer, "a", b"a1")
    push(kit, producer, "a", b"a2")
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"a1", b"a2"]
    assert kit.info(producer, "ch", 1)["Messages"] == 5000


def test_a_backlog_is_gone_through_a_bounded_step_per_tick() -> None:
    """5,000 unselected then one selected wait before the consumer comes: each drain sets
    aside at most the limit and asks for the next tick; no spinning once done."""
    kit, rules, producer, _ = setup(consumers=0)
    for i in range(5000):
        push(kit, producer, "z", b"z%d" % i)
    push(kit, producer, "a", b"a")
    a = kit.connect("a")
    selector = Counting("a")
    rules.set_selector("ch", a, selector)  # type: ignore[arg-type]
    kit.join(a, "ch")  # the first drain
    assert queue_messages(kit.take(a)) == []
    assert selector.calls <= 2 * dispatch.LOOK_PAST_LIMIT + 2  # (2 per message looked at)
    assert kit.engine.next_deadline() == kit.now + dispatch.DRAIN_AGAIN_AFTER  # asked for more
    ticks = 0
    while not (got := queue_messages(kit.take(a))):
        selector.calls = 0
        kit.advance(dispatch.DRAIN_AGAIN_AFTER)
        ticks += 1
        assert selector.calls <= 2 * dispatch.LOOK_PAST_LIMIT + 2  # (2 per message looked at)
        assert ticks <= 5
    assert [m.payload for m in got] == [b"a"]
    due = kit.engine.next_deadline()  # the acknowledge timeout only: no busy loop
    assert due is None or due > kit.now + 1


def test_a_full_consumer_that_selects_the_head_causes_no_busy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    kit, rules, producer, (a, b) = setup(consumers=2)
    rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    rules.set_credit("ch", a, Credit(1, 0))
    rules.set_selector("ch", b, Counting("b"))  # type: ignore[arg-type]
    for i in range(10):
        push(kit, producer, "a", b"a%d" % i)
    push(kit, producer, "b", b"b")
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"a0"]
    assert queue_messages(kit.take(b)) == []  # behind 9 that a selects: it waits for a
    due = kit.engine.next_deadline()  # the acknowledge timeout only: no busy loop
    assert due is None or due > kit.now + 1


def test_unselected_messages_set_aside_come_back_in_order_with_priorities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    kit, rules, producer, (a,) = setup()
    rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    sent = []
    for i in range(20):
        high = i % 3 == 0
        push(kit, producer, "z", b"z%d" % i, high=high)
        sent.append((high, b"z%d" % i))
        if i % 4 == 3:
            push(kit, producer, "a", b"a%d" % i, high=i % 8 == 3)
    got = [m.payload for m in queue_messages(kit.take(a))]
    assert got == [b"a3", b"a7", b"a11", b"a15", b"a19"]  # each one, in order
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["PriorityMessages"]) == (13, 7)
    q = kit.engine.channels["ch"].queues[1]
    browsed = reading.browse(q, FROM_FIRST, 100)  # in sequence order, in flight too
    assert [s for s, _ in browsed] == list(range(1, 26))
    assert [m.payload for _, m in browsed if m.payload[:1] == b"z"] == [p for _, p in sent]
    assert [m.payload for _, m in reading.browse(q, 20, 3)] == [b"a15", b"z16", b"z17"]
    # a later consumer without a selector takes them all: high priority first, in order
    anyone = kit.connect("anyone")
    kit.join(anyone, "ch")
    expected = [p for h, p in sent if h] + [p for h, p in sent if not h]
    got = []
    while True:
        frames = queue_messages(kit.take(anyone))
        if not frames:
            break
        for f in frames:
            got.append(f.payload)
            kit.ack(anyone, f)
    assert got == expected, repr(got)
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_a_drain_costs_a_bounded_number_of_selector_calls_in_the_steady_state() -> None:
    """20,000 unselected wait; a trickle of selected messages each costs a few selector
    calls, not a look at the thousand at the head (before: ~1,000 per push, and the
    selected ones stuck)."""
    kit, rules, producer, (a,) = setup()
    selector = Counting("a")
    rules.set_selector("ch", a, selector)  # type: ignore[arg-type]
    for i in range(20_000):
        push(kit, producer, "z", b"z%d" % i)
    for i in range(50):
        selector.calls = 0
        push(kit, producer, "a", b"a%d" % i)
        (got,) = queue_messages(kit.take(a))
        assert got.payload == b"a%d" % i
        kit.ack(a, got)
        assert selector.calls <= 4, selector.calls
    assert kit.info(producer, "ch", 1)["Messages"] == 20_000


def test_a_new_selector_or_consumer_sees_what_was_set_aside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    kit, rules, producer, (a, b) = setup(consumers=2)
    rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    rules.set_selector("ch", b, Counting("b"))  # type: ignore[arg-type]
    for i in range(10):
        push(kit, producer, "z" if i % 2 else "y", b"%d" % i)
    settle(kit)
    assert queue_messages(kit.take(a)) == [] and queue_messages(kit.take(b)) == []
    rules.set_selector("ch", b, Counting("y"))  # type: ignore[arg-type]
    push(kit, producer, "a", b"a")  # a drain: b now selects the "y" ones set aside
    settle(kit)
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"a"]
    assert [m.payload for m in queue_messages(kit.take(b))] == [b"0", b"2", b"4", b"6", b"8"]
    c = kit.connect("c")
    rules.set_selector("ch", c, Counting("z"))  # type: ignore[arg-type]
    kit.join(c, "ch")  # a consumer joins: the rest are looked at again
    settle(kit)
    assert [m.payload for m in queue_messages(kit.take(c))] == [b"1", b"3", b"5", b"7", b"9"]


def test_purge_and_release_count_what_was_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    kit, rules, producer, (a,) = setup()
    rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    for i in range(10):
        push(kit, producer, "z", b"z%d" % i)
    settle(kit)
    q = kit.engine.channels["ch"].queues[1]
    assert q.messages.aside_regular  # (the test is about messages set aside)
    out: list[object] = []
    assert reading.release(q, 4, out) == 4  # type: ignore[arg-type]
    assert q.message_count == 6
    assert [s for s, _ in reading.browse(q, FROM_FIRST, 100)] == [5, 6, 7, 8, 9, 10]
    reply = kit.ok(producer, Operation.QUEUE_PURGE, "ch", headers=((Header.QUEUE_ID, "1"),))
    assert reply is not None
    assert q.message_count == 0 and not q.messages.aside_regular
    assert reading.browse(q, FROM_FIRST, 100) == []
    push(kit, producer, "a", b"a")
    assert [m.payload for m in queue_messages(kit.take(a))] == [b"a"]


def test_a_persistent_queue_restarts_with_every_message_set_aside(tmp_path: Path) -> None:
    """Saved messages set aside are in the store as any waiting one: a restart (with a
    small paged window) brings them all back in order; the selected one was delivered.
    (Before the restart the window holds them all: a paging queue sets aside at most its
    window, see ``test_a_paging_queue_sets_aside_at_most_its_window``.)"""

    def kit_on(log: LogStore, window: int = 4) -> tuple[Kit, PerMessageRules]:
        config = BrokerConfig(
            wall_clock=lambda: 1_700_000_000.0, limits=Limits(paged_window=window)
        )
        handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
        kit = Kit(store=DurableStore(log), handlers={PER_MESSAGE: handler}, config=config)
        return kit, handler.rules

    with LogStore(tmp_path) as log:
        kit, rules, producer, (a,) = setup(on=kit_on(log, 5000))
        rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
        for i in range(2500):
            kit.push(
                producer, "ch", 1, b"z%d" % i, headers=(("kind", "z"), ("persistent", "true"))
            )
        kit.push(producer, "ch", 1, b"a", headers=(("kind", "a"), ("persistent", "true")))
        got = queue_messages(kit.take(a))
        assert [f.payload for f in got] == [b"a"]
        kit.ack(a, got[0])
        assert kit.info(producer, "ch", 1)["Messages"] == 2500
    with LogStore(tmp_path) as log:
        kit, rules = kit_on(log)
        assert kit.engine.recover(kit.now) == 2500
        anyone = kit.connect("anyone")
        kit.join(anyone, "ch")
        got_all = []
        while True:
            frames = queue_messages(kit.take(anyone))
            if not frames:
                break
            for f in frames:
                got_all.append(f.payload)
                kit.ack(anyone, f)
        assert got_all == [b"z%d" % i for i in range(2500)]


def test_messages_set_aside_still_time_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MessageTimeout runs for a message set aside as for any waiting one: it leaves
    the counts when its time comes, and a later consumer never gets it."""
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 3)
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
              message_delivery_handler=PER_MESSAGE, message_timeout=5000)  # fmt: skip
    a = kit.connect("a")
    kit.join(a, "ch")
    handler.rules.set_selector("ch", a, Counting("a"))  # type: ignore[arg-type]
    for i in range(10):
        push(kit, producer, "z", b"z%d" % i)
    settle(kit)
    q = kit.engine.channels["ch"].queues[1]
    assert q.messages.aside_regular and q.message_count == 10
    kit.advance(2.5)
    push(kit, producer, "z", b"late")  # pushed 2.5 s later: times out 2.5 s later
    settle(kit)
    kit.advance(2.6)
    assert q.message_count == 1
    anyone = kit.connect("anyone")
    kit.join(anyone, "ch")
    assert [m.payload for m in queue_messages(kit.take(anyone))] == [b"late"]


def full_and_selecting(kit: Kit, rules: PerMessageRules) -> tuple[str, str, str, Counting]:
    """Queue ``ch`` with a window of one delivery per consumer: ``full`` (no selector) and
    ``picky`` (a counted selector taking ``kind = red``).  Returns (producer, full, picky,
    picky's selector)."""
    producer = kit.connect("producer")
    kit.queue(producer, "ch", 1, status=QueueStatus.ROUND_ROBIN, request_acknowledge=True,
              message_delivery_handler=PER_MESSAGE, prefetch=1)  # fmt: skip
    full, picky = kit.connect("full"), kit.connect("picky")
    kit.join(full, "ch")
    kit.join(picky, "ch")
    selector = Counting("red")
    rules.set_selector("ch", picky, selector)  # type: ignore[arg-type]
    return producer, full, picky, selector


def test_a_full_consumer_and_a_selecting_one_with_room_cost_no_pass_over_per_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The quadratic pass-over sel6 found: ``full`` (window full, no selector) takes the
    head, ``picky`` has room and selects none of the waiting messages.  Each slot ``full``
    frees costs a drain; that drain must not look at the waiting messages ``full`` will
    take later again (before: up to ``LOOK_PAST_LIMIT`` selector calls each, O(n^2)
    overall).  Order, counts and the selected ones behind are kept."""
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 50)
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer, full, picky, selector = full_and_selecting(kit, handler.rules)
    for i in range(400):
        push(kit, producer, "blue", b"b%d" % i)
    push(kit, producer, "red", b"r0")
    settle(kit)  # the backlog is gone through a bounded step per tick
    (red,) = queue_messages(kit.take(picky))
    assert red.payload == b"r0"
    kit.ack(picky, red)
    got = queue_messages(kit.take(full))
    assert [m.payload for m in got] == [b"b0"]
    per_drain = []
    for i in range(1, 400):
        selector.calls = 0
        kit.ack(full, got[0])  # one slot free: one drain
        got = queue_messages(kit.take(full))
        assert [m.payload for m in got] == [b"b%d" % i]
        per_drain.append(selector.calls)
        if i % 100 == 0:  # a selected one pushed now goes at once
            push(kit, producer, "red", b"r%d" % i)
            (red,) = queue_messages(kit.take(picky))
            assert red.payload == b"r%d" % i
            kit.ack(picky, red)
    assert max(per_drain) <= 2, per_drain[:20]
    kit.ack(full, got[0])
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_each_slot_a_full_consumer_frees_costs_a_constant_number_of_selector_calls() -> None:
    """Within the look-past limit (so the old drain delivered everything too), the cost:
    200 waiting messages ``full`` takes one slot at a time, a red one every 100 for
    ``picky``; before, every drain asked ``picky``'s selector about those waiting up to
    the next red one again (~50 per drain, ~10,000 in all)."""
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer, full, picky, selector = full_and_selecting(kit, handler.rules)
    for i in range(200):
        push(kit, producer, "red" if i % 100 == 99 else "blue", b"%d" % i)
    settle(kit)
    selector.calls = 0
    to_full: list[bytes] = []
    to_picky: list[bytes] = []
    while True:
        got_full = queue_messages(kit.take(full))
        got_picky = queue_messages(kit.take(picky))
        if not (got_full or got_picky):
            break
        for name, got, into in ((full, got_full, to_full), (picky, got_picky, to_picky)):
            for m in got:
                into.append(m.payload)
                kit.ack(name, m)
    assert to_picky == [b"99", b"199"]
    assert to_full == [b"%d" % i for i in range(200) if i % 100 != 99]
    assert kit.info(producer, "ch", 1)["Messages"] == 0
    assert selector.calls <= 2 * 200, selector.calls  # before: ~10,000


def test_messages_waiting_for_room_keep_order_priorities_counts_and_browse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages set aside as waiting for room (``full`` selects them, has no room) are
    counted, browsable in sequence order and purge-able; a consumer joining restores
    them: a plain consumer then gets them high priority first, each in order."""
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 5)
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer, full, picky, _ = full_and_selecting(kit, handler.rules)
    sent = []
    for i in range(30):
        high = i % 4 == 1
        push(kit, producer, "blue", b"b%d" % i, high=high)
        sent.append((high, b"b%d" % i))
    settle(kit)
    q = kit.engine.channels["ch"].queues[1]
    aside = q.messages.aside_regular
    assert aside and aside.waiting  # (the test is about messages waiting for room)
    (first,) = queue_messages(kit.take(full))
    assert first.payload == b"b0"
    info = kit.info(producer, "ch", 1)
    assert (info["Messages"], info["PriorityMessages"]) == (21, 8)  # (regular, high)
    assert [s for s, _ in reading.browse(q, FROM_FIRST, 100)] == list(range(1, 31))
    kit.ack(full, first)  # full takes the oldest high-priority one next
    (second,) = queue_messages(kit.take(full))
    assert second.payload == b"b1"
    kit.disconnect(full)  # consumers change: everything set aside is looked at again
    kit.disconnect(picky)
    anyone = kit.connect("anyone")
    kit.join(anyone, "ch")
    got = []  # (b1, given back by full's leaving, comes again)
    while frames := queue_messages(kit.take(anyone)):
        for f in frames:
            got.append(f.payload)
            kit.ack(anyone, f)
    rest = sent[2:]
    # b1, put back at the start while others were set aside, waits behind them (the
    # rule of "Set aside": before every message no drain looked past yet)
    expected = [p for h, p in rest if h] + [b"b1"] + [p for h, p in rest if not h]
    assert got == expected, repr(got)
    assert kit.info(producer, "ch", 1)["Messages"] == 0


def test_purge_reaches_messages_waiting_for_room(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "LOOK_PAST_LIMIT", 5)
    handler = PerMessageDeliveryHandler(lambda: 1_700_000_000.0)
    kit = Kit(handlers={PER_MESSAGE: handler})
    producer, _full, picky, _ = full_and_selecting(kit, handler.rules)
    for i in range(20):
        push(kit, producer, "blue", b"b%d" % i)
    settle(kit)
    q = kit.engine.channels["ch"].queues[1]
    assert q.messages.aside_regular and q.message_count == 19
    kit.ok(producer, Operation.QUEUE_PURGE, "ch", headers=((Header.QUEUE_ID, "1"),))
    assert q.message_count == 0 and not q.messages.aside_regular
    push(kit, producer, "red", b"r")
    assert [m.payload for m in queue_messages(kit.take(picky))] == [b"r"]
