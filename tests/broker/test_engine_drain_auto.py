"""A backlog's ``ack:auto`` deliveries as AUTO ones (``Dispatcher.drain``): a queue that
drains what waits in it to a consumer acknowledging by taking sends AUTO deliveries (runs
of them to a round-robin queue's only consumer whose transport takes runs) instead of
tracked ones, with the outcome of the tracked path.

Differential, as ``tests/broker/test_engine_auto_runs.py``: the same steps on an engine
whose consumers take runs (``Engine.acknowledge_taken(..., runs=True)``, the STOMP door's
way; pushes with the door's own ids), on one whose consumers do not (AUTO
deliveries one by one, ``Tracked`` frames), and on one pushing without the door's ids
(every delivery tracked, as before AUTO transits).  ``AutoRun`` items are read as the
frames they stand for; every output in order, the queue's counters, the store's log and
the handler's calls must be the same, and the first two must have drained AUTO
deliveries (transits holding the queue message: only the drain makes those).

Each scenario keeps a backlog (windows fill, messages wait) and drains it in steps: room
freed by takes of every size, a message delivered before (its ``Delivery-Count``), one
put back unwritten, priorities, persistent (saved) messages, ``expires`` and a
``MessageTimeout`` set while it waits, a consumer leaving with runs half taken, others
joining, options changed while deliveries are in flight, a push of another kind among
the door's (its message stays tracked), a transport reporting positions unwritten."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from broker.engine.flow import AUTO, AUTO_RUN, unsent_deliveries
from broker.engine.message import QueueMessage
from broker.message import Message
from broker.protocol import ConnectionInfo
from tests.broker.test_engine_auto_runs import RunSteps
from tests.broker.test_engine_auto_transit import CHANNEL, OTHER, Steps

#: A header block the per-message handler acts on (not quiet): sent tracked.
PERSISTENT = ("persistent", "true")


def _drained(client: Any) -> tuple[int, int]:
    """(single AUTO entries, AUTO_RUN entries) of ``client.unsent`` that a drain made
    (they hold the queue message: ``accept_many``'s hold the message as pushed)."""
    singles = runs = 0
    for t in client.unsent:
        if t[0] == AUTO and isinstance(t[3], QueueMessage):
            singles += 1
        elif t[0] == AUTO_RUN and isinstance(t[3][0], QueueMessage):
            runs += 1
    return singles, runs


class Drain(RunSteps):
    """:class:`RunSteps` (its ``ack:auto`` consumers take runs, from ``publish_many``
    and from drains); counts what the drains made AUTO."""

    def __init__(self, window: int, per_push: bool = False) -> None:
        self.drained_singles = 0
        self.drained_runs = 0
        super().__init__(window, per_push)

    def record(self, out: list[Any]) -> None:
        super().record(out)
        for client in self.engine.clients.values():
            singles, runs = _drained(client)
            self.drained_singles += singles
            self.drained_runs += runs

    def foreign(self, messages: list[Message]) -> None:
        """A push of another kind (ids not the door's own: a TMQP producer's)."""
        out, taken, why = self.engine.publish_many(self.producer, messages, 0.0)
        self.trace.append((taken, why))
        self.record(out)


class DrainSingles(Drain):
    """:class:`Drain` whose consumers take no runs: drains make AUTO deliveries one by
    one (``Tracked`` frames)."""

    takes_runs = False


class Tracked(Steps):
    """The reference: every delivery tracked (no door ids, so no AUTO transit)."""

    def __init__(self, window: int, per_push: bool = False) -> None:
        super().__init__(False, window, per_push)

    foreign = Steps.publish


def _three(
    scenario: Callable[[Any], None], window: int = 4, per_push: bool = False
) -> tuple[Drain, DrainSingles, Tracked]:
    """The scenario on the three engines: the same traces."""
    runs = Drain(window, per_push)
    scenario(runs)
    singles = DrainSingles(window, per_push)
    scenario(singles)
    tracked = Tracked(window, per_push)
    scenario(tracked)
    assert tracked.autos == 0
    assert singles.trace == tracked.trace
    assert runs.trace == tracked.trace
    assert runs.engine.errors == 0
    return runs, singles, tracked


def _take(s: Any, cid: str, count: int) -> None:
    """The transport takes ``count`` of ``cid``'s deliveries, or what is left."""
    s.take(cid, min(count, unsent_deliveries(s.engine.clients[cid])))


def _take_each(s: Any, cids: tuple[str, ...], count: int) -> None:
    """One report: the transport took ``count`` (or what is left) of each's deliveries
    (room for all of them before the drain)."""
    clients = s.engine.clients
    counts = {cid: min(count, unsent_deliveries(clients[cid])) for cid in cids}
    s.record(s.engine.transmitted(counts, 1.0))


def _all(s: Any, cid: str) -> None:
    """The transport takes everything, until nothing more is sent."""
    for _ in range(100):
        if not s.engine.clients[cid].unsent:
            return
        s.take(cid)
    raise AssertionError(f"{cid}: deliveries left after 100 takes")


def _empty(s: Any) -> None:
    """Nothing left anywhere (every delivery settled, nothing waits)."""
    q = s.queue
    assert q.message_count == 0 and not q.pending and not q.used and not q.auto_in_flight
    for client in s.engine.clients.values():
        assert not client.unsent and unsent_deliveries(client) == 0


# -- the scenarios ----------------------------------------------------------------------


def _room_each_step(s: Any) -> None:
    """A backlog drained by room freed a delivery at a time, then by takes of every size
    (the transport cutting runs anywhere), with pushes arriving while it waits."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(30))  # the window's worth at once, the rest waits
    s.snapshot()
    for count in (1, 1, 2, 3, 1, 4, 2, 5, 1):
        _take(s, a, count)
        s.snapshot()
    s.publish(s.block(7))  # (behind the backlog: queued, drained in turn)
    s.publish(s.block(3, ("k", "v")))  # (another block: a run ends there)
    for count in (3, 6, 1, 2):
        _take(s, a, count)
        s.snapshot()
    _all(s, a)
    s.snapshot()


def _redelivered_in_backlog(s: Any, turns: bool = False) -> None:
    """A client-acknowledging consumer takes the first messages and NACKs some (they come
    back at the front, delivered once: ``Delivery-Count``), then leaves holding others
    (delivered: back too); the ``ack:auto`` consumer that drains the backlog gets
    those tracked, with the header, and the rest AUTO.  ``turns``: two ``ack:auto``
    consumers, there (windows full) when the others come back, drain it in turns (one
    delivery at a time, each decided by ``send``)."""
    c = s.consumer("c", auto=False)
    s.publish(s.block(40 if turns else 24))
    s.take(c)
    frames = s.got.pop(c)
    delivered = [f.message_id for f in frames[1:]]  # (the first acknowledged)
    s.settle(c, frames[:1], True)
    s.settle(c, frames[1:3], False)  # back at the front, redelivered to c at once
    s.take(c)
    again = s.got.pop(c)
    s.snapshot()
    if turns:
        a = s.consumer("a", auto=True)
        b = s.consumer("b", auto=True)
        s.record(s.engine.disconnect(c, 1.0))  # (back at the front: both are full)
        for count in (2, 1, 3):
            _take_each(s, (a, b), count)
            s.snapshot()
        s.record(s.engine.disconnect(b, 1.0))  # (what it held back: a alone again)
        _take(s, a, 2)
        e = s.consumer("e", auto=True)  # (whose turn first: where a's left the position)
        _take_each(s, (a, e), 1)
        _take_each(s, (a, e), 2)
        s.record(s.engine.disconnect(e, 1.0))
    else:
        s.record(s.engine.disconnect(c, 1.0))  # the rest of its window back, delivered
        s.snapshot()
        a = s.consumer("a", auto=True)
        s.record(s.engine.transmitted({}, 1.0))
    s.snapshot()
    for count in (2, 1, 3, 8):
        _take(s, a, count)
        s.snapshot()
    _all(s, a)
    s.snapshot()
    s.order = sorted({*delivered, *(f.message_id for f in again)})  # (delivered to c)


def _put_back_unwritten(s: Any) -> None:
    """Deliveries of a backlog that never reached the socket (the listener's
    unsubscribed meanwhile) come back without counting as delivered: drained again as
    AUTO ones to the next consumer."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(20))
    _take(s, a, 1)
    _take(s, a, 1)  # (a drain's delivery among them now)
    s.record(s.engine.unsubscribe(a, CHANNEL, 0.0))
    frames = s.got.pop(a)[2:]
    s.take(a, len(frames), unwritten=tuple(range(len(frames))))
    s.settle(a, frames, False)
    s.snapshot()
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 0.0))
    for count in (1, 3, 2):
        _take(s, b, count)
        s.snapshot()
    s.record(s.engine.disconnect(b, 1.0))  # (holding drained ones: put back once more)
    s.snapshot()
    c = s.consumer("c", auto=True)
    s.record(s.engine.transmitted({}, 1.0))
    for count in (2, 9):
        _take(s, c, count)
        s.snapshot()
    _all(s, c)
    s.order = [f.message_id for f in s.got[b] + s.got[c]]


def _priorities(s: Any) -> None:
    """High-priority messages among regular ones in the backlog: the drain sends them
    first; a run never spans the two."""
    a = s.consumer("a", auto=True)
    regular = s.block(6)
    high = [m._replace(high_priority=True) for m in s.block(5)]
    s.publish([*regular[:3], *high[:2], *regular[3:], *high[2:]])
    s.snapshot()
    for count in (1, 2, 4, 1):
        _take(s, a, count)
        s.snapshot()
    s.publish([m._replace(high_priority=True) for m in s.block(2)])  # behind a backlog
    s.take(a)
    s.take(a)
    s.take(a)
    s.snapshot()


def _persistent_in_backlog(s: Any) -> None:
    """Persistent messages wait among plain ones: saved, sent tracked (the store's
    removal when taken), the plain ones around them AUTO."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(4))
    s.publish([*s.block(3), *s.block(2, PERSISTENT), *s.block(3), *s.block(1, PERSISTENT)])
    s.snapshot()
    for count in (2, 3, 1, 4):
        _take(s, a, count)
        s.snapshot()
    s.take(a)
    s.take(a)
    s.snapshot()


def _expiry_in_backlog(s: Any) -> None:
    """``expires`` headers in the backlog (one past, one to come: not quiet, tracked; the
    past one dropped when reached), then a ``MessageTimeout`` set while messages wait
    and deliveries are in flight: what arrives after it waits with its clock, expires
    at a tick, and the drain sends the rest tracked."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(6))
    future = str(int((1_700_000_000.0 + 3600) * 1000))
    s.publish([*s.block(1, ("expires", "1")), *s.block(2), *s.block(1, ("expires", future))])
    _take(s, a, 3)
    s.snapshot()
    q = s.queue
    out: list[Any] = []
    q.apply_options(dataclasses.replace(q.options, message_timeout=500), 0.0, out)
    s.record(out)
    s.publish(s.block(3))  # (their clocks run)
    s.record(s.engine.tick(0.4))
    _take(s, a, 2)
    s.snapshot()
    s.record(s.engine.tick(0.6))  # (the three expire if still waiting)
    s.snapshot()
    out = []
    q.apply_options(dataclasses.replace(q.options, message_timeout=0), 0.6, out)
    s.record(out)
    s.publish(s.block(6))
    for count in (1, 4, 2):
        _take(s, a, count)
        s.snapshot()
    _all(s, a)
    s.snapshot()


def _gone_mid_drain(s: Any) -> None:
    """The consumer leaves with a drain's runs half taken (disconnect): what it took is
    acknowledged, the rest comes back in order to the next consumer, as first
    deliveries."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(14))
    _take(s, a, 2)  # (two drained behind the window's first ones)
    _take(s, a, 3)
    s.publish([*s.block(2), *s.block(1, PERSISTENT), *s.block(2)])
    _take(s, a, 1)
    s.snapshot()
    s.record(s.engine.disconnect(a, 1.0))
    s.snapshot()
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 1.0))
    for count in (2, 5, 1, 30):
        _take(s, b, count)
        s.snapshot()
    _all(s, b)
    s.order = [f.message_id for f in s.got[a] + s.got[b]]


def _second_consumer_joins(s: Any) -> None:
    """A second ``ack:auto`` consumer joins while a backlog drains as runs to the first:
    the drain now takes turns (one AUTO delivery each); a client-acknowledging one joins
    (tracked in its turn); the first leaves; the last ``ack:auto`` one alone again
    (runs); then another joins (whose turn comes first: the round-robin position the
    single consumer's deliveries left)."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(40))
    _take(s, a, 3)
    b = s.consumer("b", auto=True)
    s.record(s.engine.transmitted({}, 0.0))
    _take(s, a, 2)
    _take(s, b, 1)
    s.snapshot()
    from broker.engine.per_message import Credit

    other = s.consumer("o", auto=False, channel=OTHER)
    s.rules.set_credit(OTHER, other, Credit(5, 0))  # not quiet: the turns go tracked
    _take(s, a, 2)
    _take(s, b, 1)
    s.snapshot()
    s.rules.set_credit(OTHER, other, None)
    c = s.consumer("c", auto=False)
    _take(s, a, 2)
    _take(s, b, 2)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.snapshot()
    s.record(s.engine.disconnect(a, 1.0))
    s.take(b)
    s.take(c)
    s.settle(c, s.got.pop(c, []), True)
    s.record(s.engine.disconnect(c, 1.0))
    s.snapshot()
    for count in (1, 3, 2):
        _take(s, b, count)
    s.snapshot()
    d = s.consumer("d", auto=True)
    for count in (1, 2, 3):
        _take_each(s, (b, d), count)
        s.snapshot()
    s.record(s.engine.disconnect(d, 1.0))
    _all(s, b)
    s.snapshot()


def _turn_after_alone(s: Any) -> None:
    """Two ``ack:auto`` consumers take turns, an odd number (the position past the
    first), the second leaves, the first drains alone (runs),
    a third joins: whose turn comes first is where the lone consumer's deliveries left
    the round-robin position, as the tracked path's ``choose_one`` leaves it."""
    a = s.consumer("a", auto=True)
    b = s.consumer("b", auto=True)
    s.publish(s.block(4 * s.window))
    _take_each(s, (a, b), 1)
    _take(s, a, 1)
    s.record(s.engine.disconnect(b, 1.0))  # (what it had comes back: never delivered)
    s.snapshot()
    for count in (2, 3):
        _take(s, a, count)
        s.snapshot()
    e = s.consumer("e", auto=True)
    for count in (1, 2):
        _take_each(s, (a, e), count)
        s.snapshot()
    s.record(s.engine.disconnect(e, 1.0))
    _all(s, a)
    s.snapshot()


def _options_mid_flight(s: Any) -> None:
    """Options changed while a backlog drains and AUTO deliveries are in flight:
    ``WaitForAcknowledge`` on (the drain waits until what is in flight is taken, as it
    waits for tracked deliveries), then off; ``HideClientNames`` on (the frames made
    after it name no source); an ``AcknowledgeTimeout`` (the drain's deliveries tracked,
    with deadlines; those in flight keep none)."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(20))
    _take(s, a, 2)
    q = s.queue

    def change(now: float, **changes: Any) -> None:
        out: list[Any] = []
        q.apply_options(dataclasses.replace(q.options, **changes), now, out)
        s.record(out)

    change(0.0, wait_for_acknowledge=True)
    s.snapshot()
    _take(s, a, 1)  # (three still in flight: nothing drained)
    s.snapshot()
    s.take(a)  # (all taken: one more goes)
    s.take(a)
    s.snapshot()
    change(0.0, wait_for_acknowledge=False)
    _take(s, a, 2)
    change(0.0, hide_client_names=True)
    _take(s, a, 3)
    s.snapshot()
    change(0.0, acknowledge_timeout=60_000)
    _take(s, a, 2)
    s.record(s.engine.tick(30.0))
    s.snapshot()
    change(30.0, acknowledge_timeout=0, hide_client_names=False)
    _all(s, a)
    s.snapshot()


def _foreign_push_among(s: Any) -> None:
    """A push of another kind (a TMQP producer's ids) into the backlog breaks the
    stretch of unique ids: its message, and the door's messages before it that still
    wait, go tracked; the door's messages after it AUTO again."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(8))
    _take(s, a, 1)
    s.foreign([Message("t1", "p", CHANNEL, 0, payload=b"t"), *s.block(2)])
    s.publish(s.block(5))
    # a high-priority push repeating the id of a message still waiting (``m9``): sent
    # first, tracked; m9 waits until it is taken (same id in flight to the consumer)
    s.foreign([Message("m9", "p", CHANNEL, 0, high_priority=True, payload=b"twin")])
    s.snapshot()
    for count in (2, 2, 3, 1, 4):
        _take(s, a, count)
        s.snapshot()
    _all(s, a)
    s.snapshot()


def _unwritten_in_drained_runs(s: Any) -> None:
    """The transport reports positions of a drain's run unwritten (held for a
    subscription that went, then NACKed): back, not counted sent, sent again."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(12))
    _take(s, a, 4)  # the window's first four taken: four drained behind them
    s.take(a, 4, unwritten=(1, 2))
    frames = s.got.pop(a)
    s.settle(a, [frames[5], frames[6]], False)
    s.snapshot()
    _all(s, a)
    s.snapshot()


def _quiet_turns_while_drained(s: Any) -> None:
    """The handler's quiet answer turns False (a credit elsewhere) while a drain's run is
    in flight, and back: the part taken then is asked as tracked deliveries are; the
    next drain tracked, then AUTO again."""
    from broker.engine.per_message import Credit

    a = s.consumer("a", auto=True)
    other = s.consumer("o", auto=False, channel=OTHER)
    s.publish(s.block(16))
    _take(s, a, 2)
    s.rules.set_credit(OTHER, other, Credit(5, 0))
    _take(s, a, 3)
    s.snapshot()
    s.rules.set_credit(OTHER, other, None)
    _take(s, a, 2)
    s.snapshot()
    _all(s, a)
    s.snapshot()


def _twin_ids(s: Any, fresh_stretch: bool = False) -> None:
    """A push of another kind repeats the id of a message of the door's that waits
    (a producer's own id, or a message restored after a restart whose id a new
    connection makes again): high priority, it is drained first, tracked; the door's
    message with that id waits until it is taken, as the tracked path's ``choose_one``
    makes it (one delivery per consumer and id in flight), the next drain's go on.
    ``fresh_stretch``: a run of the door's after it starts a new stretch of unique
    ids (the twin, and the door's messages before it, out of it: tracked)."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(s.window))  # (the window full)
    waiting = s.block(6)
    s.publish(waiting)
    twin = Message(waiting[0].message_id, "p", CHANNEL, 0, high_priority=True, payload=b"t")
    s.foreign([twin])
    if fresh_stretch:
        s.publish(s.block(2))
    s.snapshot()
    s.take(a)  # room: the twin goes, tracked; its namesake waits for it
    s.snapshot()
    _take(s, a, 1)  # the twin taken: the namesake and those behind it go
    s.snapshot()
    _all(s, a)
    s.snapshot()


def _two_producers(s: Any) -> None:
    """Two producers' pushes share one header block object in the backlog: a run
    names one source, so it ends where the source changes."""
    a = s.consumer("a", auto=True)
    second, _ = s.engine.connect(ConnectionInfo(client_id="p2"), 0.0)
    shared = s.block(1)[0].headers
    for producer, k in ((s.producer, 6), (second, 3), (s.producer, 2), (second, 4)):
        made = [m._replace(headers=shared, source=producer) for m in s.messages(k)]
        out, taken, why = s.engine.publish_many(producer, made, 0.0, unique_ids=s.unique_ids)
        s.trace.append((taken, why))
        s.record(out)
    s.snapshot()
    for count in (2, 5, 3, 1, 4):
        _take(s, a, count)
        s.snapshot()
    _all(s, a)
    s.snapshot()


def _single_sends(s: Any) -> None:
    """The door's SENDs one at a time (a read holding one SEND: a run of one), with a
    backlog: its drains send AUTO deliveries as for longer runs (a push of one with the
    door's id keeps the stretch of unique ids)."""
    a = s.consumer("a", auto=True)
    for _ in range(3 * s.window):
        s.publish(s.block(1))
    s.snapshot()
    for count in (1, 3, 2):
        _take(s, a, count)
        s.publish(s.block(1))
        s.snapshot()
    _all(s, a)
    s.snapshot()


SCENARIOS: dict[str, Callable[[Any], None]] = {
    "room-each-step": _room_each_step,
    "redelivered": _redelivered_in_backlog,
    "redelivered-turns": lambda s: _redelivered_in_backlog(s, turns=True),
    "put-back-unwritten": _put_back_unwritten,
    "priorities": _priorities,
    "persistent": _persistent_in_backlog,
    "expiry": _expiry_in_backlog,
    "gone-mid-drain": _gone_mid_drain,
    "second-consumer": _second_consumer_joins,
    "options": _options_mid_flight,
    "foreign-push": _foreign_push_among,
    "unwritten": _unwritten_in_drained_runs,
    "quiet-turns": _quiet_turns_while_drained,
    "two-producers": _two_producers,
    "twin-ids": _twin_ids,
    "single-sends": _single_sends,
    "turn-after-alone": _turn_after_alone,
    "twin-ids-stretch": lambda s: _twin_ids(s, fresh_stretch=True),
}


@pytest.mark.parametrize("window", [4, 8])
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_drained_auto_deliveries_give_what_tracked_ones_give(name: str, window: int) -> None:
    runs, singles, _ = _three(SCENARIOS[name], window)
    assert runs.drained_runs > 0  # (the drain made runs of AUTO deliveries...)
    assert singles.drained_singles > 0  # (...and single ones where runs are not taken)
    assert singles.drained_runs == 0


def test_the_drain_makes_runs_as_long_as_the_room() -> None:
    """Room for five freed at once: the next five waiting go as ONE item."""
    s = Drain(8)
    a = s.consumer("a", auto=True)
    s.publish(s.block(20))
    s.take(a, 5)
    entries = list(s.engine.clients[a].unsent)
    assert [(t[0], len(t[3])) for t in entries] == [(AUTO_RUN, 3), (AUTO_RUN, 5)]
    assert [qm.seq for qm in entries[1][3]] == [9, 10, 11, 12, 13]
    assert s.queue.auto_in_flight == 8 and not s.queue.pending


def test_what_the_next_consumer_gets_back_comes_in_order() -> None:
    for scenario in (_gone_mid_drain, _put_back_unwritten):
        runs, singles, tracked = _three(scenario)
        assert runs.order == singles.order == tracked.order
        _empty(runs)


def test_a_redelivered_message_carries_its_delivery_count() -> None:
    """What the client-acknowledging consumer had reaches the ``ack:auto`` one with its
    ``Delivery-Count``; nothing else carries one."""
    runs, _, _ = _three(_redelivered_in_backlog)
    before = set(runs.order)
    counted = {f.message_id for f in runs.got["a"] if "Delivery-Count" in dict(f.headers)}
    assert counted == before and len(before) >= 4
    assert len(runs.got["a"]) == 24 - 1  # (one acknowledged by the first consumer)


def test_everything_settles() -> None:
    for name in ("room-each-step", "priorities", "persistent", "options", "foreign-push"):
        runs, singles, tracked = _three(SCENARIOS[name])
        for s in (runs, singles, tracked):
            _empty(s)
        assert len(runs.store) == 0  # (the persistent ones removed once taken)


def _order(seed: int) -> Any:
    """A ``MessageOrder`` that pages (window 4) holding both priorities: plain messages,
    saved ones (paged out behind the window), ones finished while they waited (skipped),
    and plain ones held in a paged tail; its ``page_in`` reads the saved ones back."""
    import random

    from broker.engine.message import DONE
    from broker.engine.queue.messages import MessageOrder

    rng = random.Random(seed)
    order = MessageOrder()
    order.window = 4
    saved: dict[int, Message] = {}

    def page_in(seqs: list[int], timers: bool = True) -> dict[int, QueueMessage]:
        found = {}
        for seq in seqs:
            m = found[seq] = QueueMessage(seq, saved[seq], None, False)
            m.lived().saved = True
        return found

    order.page_in = page_in
    gone = []
    for seq in range(1, 80):
        message = Message(f"m{seq}", "p", CHANNEL, 0, high_priority=rng.random() < 0.3)
        m = QueueMessage(seq, message, None, False)
        if rng.random() < 0.5:
            m.lived().saved = True
            saved[seq] = message
        order.enqueue(m)
        if rng.random() < 0.1 and not order.paged_priority.seqs and not order.paged_regular.seqs:
            gone.append(m)
    for m in gone:  # (finished while waiting: skipped when reached, uncounted now)
        m.state = DONE
        order.uncount(m)
    return order


@pytest.mark.parametrize("seed", range(6))
def test_take_fresh_gives_what_next_fresh_gives(seed: int) -> None:
    """``MessageOrder.take_fresh`` in batches (and ``unpop_many`` of the last of each)
    gives the messages ``next_fresh`` gives one at a time, priority by priority, with
    the same counts, paged ones read back in order."""
    one, many = _order(seed), _order(seed)
    expected: list[tuple[int, bool]] = []
    while (m := one.next_fresh()) is not None:
        expected.append((m.seq, m.high_priority))
    got: list[tuple[int, bool]] = []
    for high in (True, False):
        size = 1
        while True:
            batch = many.take_fresh(high, size)
            if not batch:
                break
            assert all(m.high_priority is high for m in batch)
            kept = (len(batch) + 1) // 2
            many.unpop_many(batch[kept:])  # (given back: taken again next, in order)
            got += [(m.seq, m.high_priority) for m in batch[:kept]]
            size += 1
    assert got == expected
    assert (many.n_priority, many.n_regular) == (one.n_priority, one.n_regular) == (0, 0)
