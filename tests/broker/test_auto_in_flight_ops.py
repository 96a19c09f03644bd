"""Deliveries sent without their tracked bookkeeping, met by the operations that look at
deliveries in flight: a browse (and the bounds), a purge of deliveries in flight
(``Queue.clear(in_flight=True)``: a switch to Stopped, a queue removed) and an options
change.  Each must give what the tracked deliveries they stand for give.

AUTO deliveries (``ack:auto``; single ``flow.AUTO`` entries and ``flow.AUTO_RUN`` runs):
differential as ``tests/broker/test_engine_auto_transit.py`` and
``test_engine_auto_runs.py`` (whose harness this reuses): the same steps on three
engines -- AUTO deliveries one by one, runs, and every delivery tracked -- every output
in order, the queue's counters, the store's log, the handler's calls and what the
operations read (the browse, the bounds, what a purge removed, what ``Retain`` kept) must
be the same.  Runs are cut by the transport part way (``cut`` of them taken) before the
operation.

TMQP's plain pushes (``flow.PLAIN``): against the general path as
``tests/broker/test_engine_fastpath.py`` does (a handler that keeps every push on it),
the pushes given as frames and as the octets they came in (``octets_run``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from broker import tmqp
from broker.engine.flow import unsent_deliveries
from broker.engine.queue import reading
from broker.protocol import MessageType, QueueStatus
from broker.sequence import FROM_FIRST
from tests.broker.engine_kit import Frame, Kit
from tests.broker.test_engine_auto_runs import RunSteps
from tests.broker.test_engine_auto_transit import Steps
from tests.broker.test_engine_fastpath import GeneralPathHandler

RUN = 6  # messages of the first run
WINDOW = 12  # the consumers' window: the run, a persistent one and a second run fit
PERSISTENT = ("persistent", "true")
CUTS = [0, 1, 3, RUN - 1]


def _three(scenario: Callable[[Any], None], runs: bool = True) -> Steps:
    """The scenario with AUTO deliveries one by one, as runs, and all tracked: the same
    traces (the operations' readings included); returns the first."""
    auto = Steps(unique_ids=True, window=WINDOW)
    scenario(auto)
    run = RunSteps(WINDOW)
    scenario(run)
    tracked = Steps(unique_ids=False, window=WINDOW)
    scenario(tracked)
    assert tracked.autos == 0
    assert auto.autos > 0  # (AUTO deliveries were made ...)
    assert auto.trace == tracked.trace
    if runs:
        assert run.runs > 0  # (... and runs)
    assert run.trace == tracked.trace
    assert auto.engine.errors == 0
    return auto


def _read(s: Steps) -> None:
    """What a browse from the first held message and the bounds give now."""
    q = s.queue
    s.trace.append(("browse", reading.browse(q, FROM_FIRST, 100), reading.bounds(q)))


def _browses(s: Steps) -> list[Any]:
    """The browses ``_read`` recorded, in order."""
    return [t[1] for t in s.trace if isinstance(t, tuple) and t and t[0] == "browse"]


def _figures(s: Steps) -> None:
    """What the state tuple leaves out: removed, retained, empty, deliveries unsent."""
    q = s.queue
    unsent = {cid: unsent_deliveries(c) for cid, c in s.engine.clients.items()}
    s.trace.append(("figures", q.removed, sorted(q.retained.messages), q.is_empty(), unsent))


def _options(s: Steps, **changes: Any) -> None:
    q = s.queue
    out: list[Any] = []
    q.apply_options(dataclasses.replace(q.options, **changes), 0.0, out)
    s.record(out)


def _in_flight(s: Steps, cut: int) -> str:
    """A consumer ``a`` (``ack:auto``) with a run, a persistent (tracked) delivery and a
    second run in flight, ``cut`` of the first taken by the transport."""
    a = s.consumer("a", auto=True)
    s.publish(s.block(RUN))
    s.publish(s.block(1, PERSISTENT))
    s.publish(s.block(3))
    s.take(a, cut)
    s.snapshot()
    return a


def _to_another(s: Steps, a: str) -> None:
    """``a`` disconnects with deliveries unsent: they come back to ``b`` (``ack:client``),
    which takes and acknowledges them (the frames show their order)."""
    b = s.consumer("b", auto=False)
    s.record(s.engine.disconnect(a, 1.0))
    s.take(b)
    s.snapshot()
    s.settle(b, s.got.pop(b, []), True)
    s.snapshot()


# ---------------------------------------------------------------------- browse


@pytest.mark.parametrize("cut", CUTS)
def test_a_browse_lists_auto_deliveries_in_flight_as_tracked(cut: int) -> None:
    """Listed until taken (acknowledged by taking), as tracked ones; the index then made
    keeps them; a later take, a later push and a consumer leaving read the same."""

    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        _read(s)
        s.take(a, 2)
        _read(s)
        s.snapshot()
        s.publish(s.block(2))  # (the index exists: tracked on every engine)
        _read(s)
        _to_another(s, a)  # (what was unsent comes back in send order)
        _read(s)
        _figures(s)

    on = _three(scenario)
    listed = _browses(on)[0]
    assert [seq for seq, _ in listed] == list(range(cut + 1, RUN + 5))  # (all unsent)


@pytest.mark.parametrize("cut", CUTS)
def test_a_browse_then_the_rest_taken(cut: int) -> None:
    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        _read(s)
        s.take(a)
        _read(s)
        _figures(s)
        s.publish(s.block(3))
        s.take(a, 1)
        _read(s)
        s.take(a)
        _read(s)
        s.snapshot()
        _figures(s)

    _three(scenario)


def test_a_browse_with_two_auto_consumers_taking_turns() -> None:
    """Round robin over two ``ack:auto`` consumers: single AUTO deliveries, each
    consumer's interleaved with a tracked one; the browse, then one consumer leaves."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        b = s.consumer("b", auto=True)
        s.publish(s.block(4))
        s.publish(s.block(1, PERSISTENT))
        s.publish(s.block(4))
        s.take(a, 1)
        _read(s)
        s.snapshot()
        c = s.consumer("c", auto=False)
        s.record(s.engine.disconnect(a, 1.0))
        s.take(b, 2)
        s.take(c)
        _read(s)
        s.snapshot()
        s.settle(c, s.got.pop(c, []), True)
        s.take(b)
        _read(s)
        s.snapshot()
        _figures(s)

    _three(scenario, runs=False)


# ---------------------------------------------------------------------- purge


@pytest.mark.parametrize("cut", CUTS)
def test_a_switch_to_stopped_drops_auto_deliveries_in_flight_as_tracked(cut: int) -> None:
    """Stopped clears what waits and what is in flight: the AUTO deliveries are dropped
    (counted removed, window freed, nothing pending) as tracked ones; taken afterwards
    they count as sent, not acknowledged.  Back to round robin, the queue goes on."""

    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        _options(s, status=QueueStatus.STOPPED)
        s.snapshot()
        _figures(s)
        s.take(a, 1)
        s.snapshot()
        s.take(a)
        s.snapshot()
        _figures(s)
        _options(s, status=QueueStatus.ROUND_ROBIN)
        s.publish(s.block(3))
        s.take(a)
        s.snapshot()
        _figures(s)

    on = _three(scenario)
    assert on.queue.removed == RUN + 4 - cut


@pytest.mark.parametrize("cut", CUTS)
def test_a_purge_of_deliveries_in_flight(cut: int) -> None:
    """``Queue.clear(in_flight=True)`` itself (what a queue's removal does) with messages
    waiting too (the window full), then the consumer leaves."""

    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        s.publish(s.block(4))  # (2 more fit the window, 2 wait)
        q = s.queue
        out: list[Any] = []
        s.trace.append(("cleared", q.clear(out, priority=True, regular=True, in_flight=True)))
        s.record(out)
        s.snapshot()
        _figures(s)
        s.take(a, 2)
        s.publish(s.block(2))
        s.snapshot()
        _to_another(s, a)
        _figures(s)

    _three(scenario)


# ---------------------------------------------------------------------- options


OPTION_CHANGES: dict[str, dict[str, Any]] = {
    "retain": {"retain": True},
    "retain, no acknowledges": {"retain": True, "request_acknowledge": False},
    "no acknowledges": {"request_acknowledge": False},
    "smaller window": {"prefetch": 2},
    "paused": {"status": QueueStatus.PAUSED},
}


@pytest.mark.parametrize("cut", CUTS)
@pytest.mark.parametrize("change", sorted(OPTION_CHANGES))
def test_an_options_change_meets_auto_deliveries_as_tracked(change: str, cut: int) -> None:
    """The new options apply to the AUTO deliveries in flight as to tracked ones
    (``Retain`` keeps each once taken and acknowledged; a browse then lists them)."""

    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        _options(s, **OPTION_CHANGES[change])
        s.snapshot()
        s.take(a, 1)
        _read(s)
        s.take(a)
        _read(s)
        s.snapshot()
        _figures(s)
        s.publish(s.block(2))
        s.take(a)
        _read(s)
        s.snapshot()
        _figures(s)

    _three(scenario)


@pytest.mark.parametrize("cut", CUTS)
def test_an_options_change_then_the_consumer_leaves(cut: int) -> None:
    """``Retain`` turned on: the delivery taken next is kept; what the change made
    tracked and was not taken comes back in send order (each consumer's entries in
    ``pending`` in the order it was sent them), and is kept once acknowledged."""

    def scenario(s: Any) -> None:
        a = _in_flight(s, cut)
        _options(s, retain=True)
        s.take(a, 1)
        s.snapshot()
        _figures(s)
        _to_another(s, a)
        _figures(s)

    on = _three(scenario)
    assert len(on.queue.retained) == RUN + 4 - cut


# ---------------------------------------------------------------------- plain pushes

PLAIN_CLIENTS = ("p", "c1")


def _kits() -> tuple[Kit, Kit]:
    """A kit whose pushes take the fast path and one that keeps them on the general
    path; one consumer (``c1``) whose transport holds everything back."""
    fast = Kit(auto_transmit=False)
    general = Kit(handler=GeneralPathHandler(), auto_transmit=False)
    for kit in (fast, general):
        for client in PLAIN_CLIENTS:
            kit.connect(client)
        kit.join("c1", "ch")
        kit.queue("p", "ch", 1, status=1)
    assert fast.engine.channels["ch"].queues[1].plain
    assert not general.engine.channels["ch"].queues[1].plain
    return fast, general


def _push(mid: str, body: bytes) -> Frame:
    return Frame(
        message_type=MessageType.QUEUE,
        content_type=1,
        message_id=mid,
        source="p",
        target="ch",
        payload=body,
    )


def _plain_reading(kit: Kit) -> tuple[Any, ...]:
    q = kit.engine.channels["ch"].queues[1]
    listed = [(seq, m.message_id, m.payload) for seq, m in reading.browse(q, FROM_FIRST, 100)]
    return (
        listed,
        reading.bounds(q),
        q.message_count,
        q.sent,
        q.deliveries,
        q.removed,
        sorted(q.retained.messages),
        dict(q.used),
    )


def _plain_steps(kit: Kit, octets: bool, steps: list[Any]) -> list[Any]:
    """``steps`` on ``kit``: the queue's reading after each, then what ``c1`` got."""
    trace: list[Any] = []
    n = 0
    for step in steps:
        if step == "push":  # three plain pushes (as octets: one run)
            pushes = [_push(f"m{n + i}", b"%d" % (n + i)) for i in range(3)]
            n += 3
            if octets:
                datas = [tmqp.encode(f)[0] for f in pushes]
                taken, out = kit.engine.receive_push_octets("p", datas, kit.now, {"c1"})
                assert taken == len(datas)  # (all went as their octets)
                for o in out:  # (what a TMQP consumer reads of them)
                    kit.inbox[o.client_id].append(tmqp.decode([o.frame]))
                    kit.unsent[o.client_id] += 1
            else:
                for f in pushes:
                    kit.send("p", f)
        elif step == "leave":
            kit.disconnect("c1")
        elif step == "back":  # c1 again, its transport taking everything
            kit.connect("c1")
            kit.join("c1", "ch")
            kit.transmit("c1")
        elif isinstance(step, int):  # the transport takes that many
            kit.transmit("c1", step)
        else:  # an options change
            kit.update("p", "ch", 1, **step)
        trace.append(_plain_reading(kit))
    trace.append([f.message_id for f in kit.inbox["c1"] if f.message_type == MessageType.QUEUE])
    return trace


PLAIN_SCRIPTS: dict[str, list[Any]] = {
    "retain on, then taken": ["push", {"Retain": True}, 1, 2],
    "retain on, then the consumer leaves": ["push", {"Retain": True}, 1, "leave", "back"],
    "in flight, then the consumer leaves": ["push", "leave", "back"],
}
#: Options changes that never made a difference (the old code passes them): guards of
#: the plain pushes an options change now makes tracked copies (``materialize_plain``).
PLAIN_GUARDS: dict[str, list[Any]] = {
    "acknowledges on, then taken": ["push", {"RequestAcknowledge": True}, 3],
    "stopped": ["push", {"Status": int(QueueStatus.STOPPED)}, 3],
}


@pytest.mark.parametrize("octets", [False, True])
@pytest.mark.parametrize("script", sorted(PLAIN_SCRIPTS))
def test_plain_pushes_in_flight_read_as_tracked_copies(script: str, octets: bool) -> None:
    """A plain push in flight is not held (as a tracked copy awaiting no acknowledge is
    not); one that comes back is listed; ``Retain`` turned on keeps it once taken; the
    same frames and figures as on the general path (the pushes as frames)."""
    fast, general = _kits()
    steps = PLAIN_SCRIPTS[script]
    assert _plain_steps(fast, octets, steps) == _plain_steps(general, False, steps)
    q = fast.engine.channels["ch"].queues[1]
    assert q.received == 3


@pytest.mark.parametrize("octets", [False, True])
@pytest.mark.parametrize("script", sorted(PLAIN_GUARDS))
def test_plain_pushes_made_copies_by_an_options_change_count_as_before(
    script: str, octets: bool
) -> None:
    """Acknowledges turned on, or Stopped, while plain pushes are in flight: taken, they
    count as sent and finish (nothing listed, nothing removed), as tracked copies do."""
    fast, general = _kits()
    steps = PLAIN_GUARDS[script]
    assert _plain_steps(fast, octets, steps) == _plain_steps(general, False, steps)
