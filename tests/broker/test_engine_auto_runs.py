"""Runs of AUTO transits as ONE item (``broker.engine.flow.AUTO_RUN``): a single
consumer's run of AUTO deliveries leaves ``Engine.publish_many`` as one ``AutoRun`` when
the consumer's transport takes runs (``acknowledge_taken(..., runs=True)``) and waits
in its ``unsent`` as one entry standing for its deliveries.

Differential, as ``tests/broker/test_engine_auto_transit.py`` (whose steps and
scenarios this reuses): one engine's consumers take runs, the other publishes without the
door's own ids (every delivery tracked, as before AUTO transits existed).  The first's
``AutoRun`` items are read as the ``Tracked`` frames they stand for
(``DeliveredRun.frames``); every output in order, the queue's counters, the store's log
and the handler's calls must be the same, and the first engine must have made runs.

The cases beyond that file's scenarios: a run cut by the transport at every position
(and a take spanning two runs), an unwritten delivery inside a run (first, middle, last,
several), a consumer leaving with a run half taken, the channel no longer acknowledged
by taking or the quiet answer turning False while a run is in flight, and a second
consumer joining while a run is in flight."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from broker.engine.flow import AUTO_RUN, unsent_deliveries
from broker.engine.per_message import Credit
from broker.protocol import AutoRun, DeliveredRun, Tracked
from broker.stomp.backend import ConnectionInfo as StompInfo
from broker.stomp.engine_door import EngineDoor
from tests.broker.test_engine_auto_transit import CHANNEL, OPTIONS, OTHER, SCENARIOS, Steps

RUN = 6  # messages of the runs below
WINDOW = 8  # the consumers' window: a run of RUN fits


class RunSteps(Steps):
    """:class:`Steps` whose ``ack:auto`` consumers take runs (the STOMP door's); its
    ``AutoRun`` items recorded as the tracked frames they stand for."""

    takes_runs = True

    def __init__(self, window: int, per_push: bool = False) -> None:
        self.items = 0  # AutoRun items seen
        self.runs = 0  # AUTO_RUN entries seen in the consumers' unsent queues
        super().__init__(True, window, per_push)

    def record(self, out: list[Any]) -> None:
        expanded: list[Any] = []
        for o in out:
            if o.__class__ is AutoRun:
                run = o[1]
                assert isinstance(run, DeliveredRun) and len(run.messages) >= 1
                self.items += 1
                expanded += [Tracked(o[0], frame) for frame in run.frames()]
            else:
                assert not isinstance(o[1], DeliveredRun)
                expanded.append(o)
        super().record(expanded)
        for client in self.engine.clients.values():
            self.runs += sum(1 for t in client.unsent if t[0] == AUTO_RUN)

    def publish(self, messages: list[Any]) -> None:
        out, taken, why = self.engine.publish_many(self.producer, messages, 0.0, unique_ids=True)
        self.trace.append((taken, why))
        self.record(out)

    def take(self, cid: str, count: int | None = None, unwritten: tuple[int, ...] = ()) -> None:
        client = self.engine.clients[cid]
        n = unsent_deliveries(client) if count is None else count
        left = {cid: unwritten} if unwritten else None
        self.record(self.engine.transmitted({cid: n}, 0.0, left))


def _both(scenario: Callable[[Any], None], window: int = WINDOW) -> RunSteps:
    """The scenario with runs and fully tracked: the same traces; returns the first."""
    on = RunSteps(window)
    scenario(on)
    off = Steps(unique_ids=False, window=window)
    scenario(off)
    assert off.autos == 0
    assert on.trace == off.trace
    assert on.items > 0 and on.runs > 0  # (runs were made and waited in unsent)
    assert on.engine.errors == 0
    return on


def _settled(s: RunSteps) -> None:
    q = s.queue
    assert q.message_count == 0 and not q.pending and not q.used and not q.auto_in_flight
    for client in s.engine.clients.values():
        assert not client.unsent


@pytest.mark.parametrize(
    ("name", "window"),
    [(name, 4) for name in sorted(SCENARIOS)]
    + [(name, 8) for name in sorted(SCENARIOS)]
    + [("shared-block", 1), ("shared-block", 2), ("window", 1), ("window", 2)],
)
def test_runs_give_what_tracked_deliveries_give(name: str, window: int) -> None:
    """That file's scenarios (written for a window of 4; 8: longer runs; 1 and 2: a
    single consumer's loop with no room or one more)."""
    scenario, _ = SCENARIOS[name]
    on = RunSteps(window)
    scenario(on)
    off = Steps(unique_ids=False, window=window)
    scenario(off)
    assert on.trace == off.trace  # (the engines' errors too: a small window makes some
    # scenarios report more taken than was sent)
    if window > 1 and name in ("shared-block", "window"):
        assert on.items > 0


@pytest.mark.parametrize("cut", range(RUN + 1))
def test_a_run_cut_by_the_transport_at_every_position(cut: int) -> None:
    """The transport takes ``cut`` deliveries of a run, then one, then the rest; a take
    that spans two runs and a tracked delivery between them."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.snapshot()
        s.take(a, cut)
        s.snapshot()
        if cut < RUN:
            s.take(a, 1)
            s.snapshot()
        s.take(a)
        s.snapshot()
        s.publish(s.block(3))
        s.publish(s.block(1, ("persistent", "true")))  # tracked, saved
        s.publish(s.block(3))
        s.take(a, min(cut + 1, 7))  # (across the first run into the next ones)
        s.snapshot()
        s.take(a)
        s.snapshot()

    _settled(_both(scenario))


@pytest.mark.parametrize("positions", [(0,), (2,), (RUN - 1,), (0, RUN - 1), (1, 2), (3, 4, 5)])
def test_an_unwritten_delivery_inside_a_run(positions: tuple[int, ...]) -> None:
    """The listener reports deliveries of a run done with but never written (a
    subscription gone meanwhile): they are not counted sent and wait for their NACK;
    the others of the run are settled taken around them."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.take(a, RUN, unwritten=positions)
        s.snapshot()
        frames = s.got.pop(a)
        s.settle(a, [frames[p] for p in positions], False)  # back, and sent again
        s.snapshot()
        s.take(a)
        s.snapshot()
        s.order = [f.message_id for f in s.got.get(a, [])]

    on = _both(scenario)
    assert on.order == [f"m{p}" for p in positions]
    assert on.queue.nacks == len(positions)
    _settled(on)


@pytest.mark.parametrize("taken", [0, 1, 3, RUN - 1])
@pytest.mark.parametrize("how", ["disconnect", "unsubscribe"])
def test_a_consumer_leaving_with_a_run_half_taken(taken: int, how: str) -> None:
    """What the transport took is acknowledged; the rest of the run (and a tracked
    delivery and a second run behind it) comes back to the next consumer in order,
    as first deliveries."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.publish(s.block(1, ("persistent", "true")))
        s.publish(s.block(1))
        s.take(a, taken)
        s.snapshot()
        if how == "disconnect":
            s.record(s.engine.disconnect(a, 1.0))
        else:  # (the listener: the rest reached a subscription gone, NACKed)
            frames = s.got.pop(a)[taken:]
            s.engine.acknowledge_taken(a, CHANNEL, on=False)
            s.record(s.engine.unsubscribe(a, CHANNEL, 0.0))
            s.take(a, len(frames), unwritten=tuple(range(len(frames))))
            s.settle(a, frames, False)
        s.snapshot()
        b = s.consumer("b", auto=False)
        s.record(s.engine.transmitted({}, 1.0))
        s.take(b)
        s.order = [f.message_id for f in s.got[b]]
        s.settle(b, s.got.pop(b, []), True)
        s.snapshot()

    on = _both(scenario)
    assert on.order == [f"m{i}" for i in range(taken, RUN + 2)]
    assert on.queue.acks == RUN + 2
    _settled(on)


@pytest.mark.parametrize("cut", [0, 2, RUN])
def test_no_longer_acknowledged_by_taking_while_a_run_is_in_flight(cut: int) -> None:
    """A second subscription shares the consumer: the listener acknowledges from then
    on; the run's deliveries taken after that wait for their acknowledge."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.take(a, cut)
        s.engine.acknowledge_taken(a, CHANNEL, on=False)
        if cut < RUN:
            s.take(a, 1)
        s.take(a)
        s.snapshot()
        frames = s.got.pop(a)[cut:]
        s.settle(a, frames[:1], True)
        s.settle(a, frames[1:], False)  # redelivered, tracked
        s.take(a)
        s.settle(a, s.got.pop(a, []), True)
        s.snapshot()

    on = _both(scenario)
    _settled(on)


@pytest.mark.parametrize("cut", [0, 1, 3])
@pytest.mark.parametrize("turn", ["credit elsewhere", "own credit"])
def test_the_quiet_answer_turning_while_a_run_is_in_flight(cut: int, turn: str) -> None:
    """The handler's quiet test says False by the time the transport takes (part of) a
    run: the deliveries taken then are asked as tracked ones would be."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        other = s.consumer("o", auto=False, channel=OTHER)
        s.publish(s.block(RUN))
        s.take(a, cut)
        if turn == "credit elsewhere":
            s.rules.set_credit(OTHER, other, Credit(5, 0))
        else:
            s.rules.set_credit(CHANNEL, a, Credit(2, 0))
        s.take(a, 2)
        s.snapshot()
        s.rules.set_credit(OTHER, other, None)
        s.rules.set_credit(CHANNEL, a, None)
        s.take(a)
        s.snapshot()
        s.publish(s.block(3))
        s.take(a)
        s.snapshot()

    _settled(_both(scenario))


def second_consumer_joins(cut: int) -> Callable[[Any], None]:
    """The scenario: a second consumer ``b`` joins after the first, ``a``, took ``cut``
    of a run of ``RUN``; four more pushes; ``a`` takes one, then leaves with the rest
    untaken; ``b`` takes all.  ``s.order``: the ids ``b`` got, in order."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.take(a, cut)
        b = s.consumer("b", auto=True)
        s.publish(s.block(4))
        s.snapshot()
        s.take(b)
        s.take(a, 1)
        s.snapshot()
        s.record(s.engine.disconnect(a, 1.0))
        s.record(s.engine.transmitted({}, 1.0))
        s.take(b)
        s.take(b)
        s.snapshot()
        s.order = [f.message_id for f in s.got[b]]

    return scenario


@pytest.mark.parametrize("cut", [0, 2])
def test_a_second_consumer_joining_while_a_run_is_in_flight(cut: int) -> None:
    """A second consumer joins with a run in flight to the first: the next pushes take
    turns (no runs), the run in flight settles as before; then the first leaves with
    some of it untaken."""
    _settled(_both(second_consumer_joins(cut)))


def test_unsent_counts_deliveries() -> None:
    """A run entry stands for its deliveries in the client's figures (``Unsent``)."""
    s = RunSteps(WINDOW)
    a = s.consumer("a", auto=True)
    s.publish(s.block(RUN))
    client = s.engine.clients[a]

    def unsent() -> int:
        rows = s.engine.stats()["client_list"]
        (row,) = [r for r in rows if r["Id"] == a]
        assert unsent_deliveries(client) == row["Unsent"]
        return int(row["Unsent"])

    assert len(client.unsent) == 1 and unsent() == RUN
    s.take(a, 2)
    assert unsent() == RUN - 2
    s.take(a, 1, unwritten=(0,))
    assert unsent() == RUN - 3
    s.take(a)
    assert unsent() == 0 and not client.unsent
    s.publish(s.block(RUN))
    s.take(a, 1)
    s.record(s.engine.disconnect(a, 1.0))
    assert unsent_deliveries(client) == 0


def test_a_run_of_a_queue_hiding_client_names_names_no_source() -> None:
    """``HideClientNames``: each delivery a run stands for names no source, as the
    tracked frame does; the rest of each frame alike too."""
    hidden = dataclasses.replace(OPTIONS, hide_client_names=True)
    frames = []
    for runs in (True, False):
        s = RunSteps(WINDOW) if runs else Steps(unique_ids=False, window=WINDOW)
        s.engine.create_channel("hidden")
        s.engine.create_queue("hidden", 0, hidden)
        a = s.consumer("a", auto=True, channel="hidden")
        block = [m._replace(target="hidden") for m in s.block(RUN)]
        s.publish(block)
        s.take(a)
        frames.append([f for cid, f in s.trace[-2] if cid == a])
        if runs:
            assert s.items == 1  # (one AutoRun)
    with_runs, tracked = frames
    assert with_runs == tracked and len(tracked) == RUN
    assert all(f.source == "" and f.wants_ack for f in tracked)


def test_a_run_for_a_client_without_a_stomp_connection_leaves_the_door_as_frames() -> None:
    """The STOMP door's output for TMQP peers never holds an ``AutoRun``: a run to a
    client that is not one of its connections leaves as the ``Tracked`` frames it
    stands for (no TMQP consumer acknowledges by taking today; the door must not pass
    one on if one did)."""
    s = RunSteps(WINDOW)
    door = EngineDoor(s.engine)
    try:
        door.op_connect(1, StompInfo(1, "p", "/", "1.2"), 0.0)  # (a STOMP connection)
        a = s.consumer("a", auto=True)  # (an engine client, not the door's)
        block = s.block(RUN)

        def publish(now: float) -> list[Any]:
            out, taken, _ = s.engine.publish_many(s.producer, block, now, unique_ids=True)
            assert taken == RUN and [o.__class__ for o in out] == [AutoRun]
            return out

        door.submit(publish)
        kept = door.run_ops(0.0)
        assert [o.__class__ for o in kept] == [Tracked] * RUN
        assert all(o[0] == a for o in kept)
        # (the frames the tracked path sends: the acknowledge wished)
        assert [o[1] for o in kept] == [m._replace(wants_ack=True) for m in block]
    finally:
        door.close()
