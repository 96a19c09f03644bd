"""The STOMP door's run of plain SENDs as a :class:`~broker.protocol.PlainSends` (ids,
bodies and one header block; a message made only when the engine reads one): every
outcome is the one of the same messages given as a list.

Differential, as ``tests/broker/test_engine_auto_runs.py`` (whose harness this reuses):
one engine gets every run of messages that are alike but their bodies (one header
block, the door's ids ``m<n>`` in a row) as a ``PlainSends``, its consumers taking runs;
the other gets lists and every delivery tracked (no door ids).  Every output in order,
the queue's counters, the store's log and the handler's calls must be the same, and the
runs the first engine sends whole must write the ids and bodies their frames carry
(``DeliveredRun.ids``/``bodies``, what the listener writes).

The cases: session 20's scenarios (windows 4 and 8, some 1 and 2); a run cut by the window and
by the queue's message limit and size limit; a persistent run among plain ones; a
second consumer joining mid-run; a consumer leaving with a run half taken; unwritten
deliveries inside a run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from broker.message import Message
from broker.protocol import AutoRun, DeliveredRun, PlainSends
from tests.broker.test_engine_auto_runs import RunSteps, second_consumer_joins
from tests.broker.test_engine_auto_transit import OPTIONS, SCENARIOS, Steps

RUN = 6


def _as_sends(messages: list[Message]) -> PlainSends | None:
    """``messages`` as the door's ``PlainSends`` when they are one (else None)."""
    if not messages:
        return None
    first = messages[0]
    mid = first.message_id
    if not mid.startswith("m") or not mid[1:].isdigit():
        return None
    sends = PlainSends(
        "m",
        int(mid[1:]),
        first.source,
        first.target,
        first.content_type,
        first.headers,
        [bytes(m.payload) for m in messages],
    )
    made = list(sends)
    if made != messages or any(m.headers is not first.headers for m in messages):
        return None
    return sends


class SendSteps(RunSteps):
    """:class:`RunSteps` publishing each run that can be one as a ``PlainSends``."""

    def __init__(self, window: int, per_push: bool = False) -> None:
        self.sends = 0  # runs published as PlainSends
        self.whole = 0  # AutoRun items whose messages are a PlainSends (not made)
        super().__init__(window, per_push)

    def record(self, out: list[Any]) -> None:
        for o in out:
            if o.__class__ is AutoRun:
                run = o[1]
                assert isinstance(run, DeliveredRun)
                frames = run.frames()
                assert run.ids() == [f.message_id for f in frames]
                assert run.bodies() == [f.payload for f in frames]
                self.whole += run.messages.__class__ is PlainSends
        super().record(out)

    def publish(self, messages: list[Message]) -> None:
        sends = _as_sends(messages)
        if sends is None:
            super().publish(messages)
            return
        self.sends += 1
        out, taken, why = self.engine.publish_many(self.producer, sends, 0.0, unique_ids=True)
        self.trace.append((taken, why))
        self.record(out)


def _both(
    scenario: Callable[[Any], None], window: int = 8, options: Any = None
) -> tuple[SendSteps, Steps]:
    """The scenario with ``PlainSends`` and with lists all tracked: the same traces."""
    on = SendSteps(window)
    off = Steps(unique_ids=False, window=window)
    for s in (on, off):
        if options is not None:
            s.queue.apply_options(options, 0.0, [])
        scenario(s)
    assert on.trace == off.trace
    assert on.sends > 0 and on.engine.errors == 0
    return on, off


def _settled(s: Steps) -> None:
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
def test_plain_sends_give_what_tracked_lists_give(name: str, window: int) -> None:
    """Session 20's scenarios (written for a window of 4; 8: longer runs; 1 and 2: a
    single consumer with no room or one more)."""
    scenario, _ = SCENARIOS[name]
    on = SendSteps(window)
    scenario(on)
    off = Steps(unique_ids=False, window=window)
    scenario(off)
    assert on.trace == off.trace


def test_a_run_reaching_a_quiet_consumer_is_sent_whole_as_the_sends() -> None:
    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.snapshot()
        s.take(a, 2)
        s.take(a)
        s.snapshot()

    on, _ = _both(scenario)
    assert on.whole == 1 and on.items == 1
    _settled(on)


@pytest.mark.parametrize("window", [1, 3, RUN - 1])
def test_a_run_cut_by_the_window(window: int) -> None:
    """The consumer's room ends inside the run: the part that fits is sent as one run,
    the rest waits in the queue (made there) and is drained as room comes back."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.snapshot()
        for _ in range(RUN):
            s.take(a, 1)
            s.snapshot()
        s.take(a)
        s.snapshot()

    on, _ = _both(scenario, window=window)
    assert on.queue.acks == RUN
    _settled(on)


@pytest.mark.parametrize("limit", [1, 2, 4])
def test_a_run_cut_by_the_queues_message_limit(limit: int) -> None:
    """The window takes 2; the queue holds ``limit`` more; the next one is refused
    (``taken``, ``why`` in the trace) and the run ends there."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN + 2))
        s.snapshot()
        s.take(a)
        s.take(a)
        s.take(a)
        s.snapshot()

    limited = dataclasses.replace(OPTIONS, message_limit=limit)
    on, _ = _both(scenario, window=2, options=limited)
    answers = [t for t in on.trace if isinstance(t, tuple) and len(t) == 2]
    assert [taken for taken, _ in answers] == [2 + limit]  # (the window's, the queue's)
    assert answers[0][1] is not None  # (the next one refused)


@pytest.mark.parametrize("big", [0, 2, RUN - 1])
def test_a_run_cut_by_the_queues_size_limit(big: int) -> None:
    """One body over the queue's size limit inside the run: those before it are sent,
    it is refused, the run ends there."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        block = s.block(RUN)
        block[big] = block[big]._replace(payload=b"x" * 40)
        s.publish(block)
        s.snapshot()
        s.take(a)
        s.snapshot()

    limited = dataclasses.replace(OPTIONS, message_size_limit=20)
    on, _ = _both(scenario, options=limited)
    assert on.queue.received == big


def test_a_persistent_run_among_plain_ones() -> None:
    """A run whose block asks to persist: each message tracked and saved (the store's
    log in the trace), between two runs sent whole."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(3))
        s.publish(s.block(3, ("persistent", "true")))
        s.publish(s.block(3))
        s.snapshot()
        s.take(a, 4)
        s.snapshot()
        s.take(a)
        s.snapshot()

    on, _ = _both(scenario)
    assert on.whole == 2 and len(on.store.log) == 6  # (three saved, three removed)
    _settled(on)


@pytest.mark.parametrize("cut", [0, 2, RUN])
def test_a_second_consumer_joining_mid_run(cut: int) -> None:
    """A second ``ack:auto`` consumer joins with a run in flight to the first: the next
    run takes turns (its messages made one by one), the one in flight settles whole;
    then the first leaves with the rest untaken, which goes to the second in order."""
    on, _ = _both(second_consumer_joins(cut))
    _settled(on)
    # b: its turns of the second run, then what a never took, in send order: the rest
    # of the first run and a's turns of the second (m6 taken when the first was whole)
    rest = [f"m{i}" for i in range(cut + 1, RUN)]
    assert on.order == ["m7", "m9", *rest, *(["m6"] if cut < RUN else []), "m8"]
    assert on.queue.acks == RUN + 4


@pytest.mark.parametrize("positions", [(0,), (3,), (RUN - 1,), (1, 4)])
def test_unwritten_deliveries_inside_a_run(positions: tuple[int, ...]) -> None:
    """The listener reports positions of a run never written: those wait for their
    NACK and come back as first deliveries, made from the sends."""

    def scenario(s: Any) -> None:
        a = s.consumer("a", auto=True)
        s.publish(s.block(RUN))
        s.take(a, RUN, unwritten=positions)
        s.snapshot()
        frames = s.got.pop(a)
        s.settle(a, [frames[p] for p in positions], False)
        s.take(a)
        s.snapshot()
        s.order = [f.message_id for f in s.got.get(a, [])]

    on, _ = _both(scenario)
    assert on.order == [f"m{p}" for p in positions]
    _settled(on)


def test_sends_read_as_the_messages_they_stand_for() -> None:
    """Index, negative index, slice and iteration give the messages the door made
    before (``_run_messages``): id ``<prefix><first + i>``, the block, the body."""
    block = (("a", "1"),)
    bodies = [b"x%d" % i for i in range(5)]
    sends = PlainSends("stomp-7-", 40, "p", "q", 0, block, bodies)
    made = [
        Message(f"stomp-7-{40 + i}", "p", "q", 0, headers=block, payload=b)
        for i, b in enumerate(bodies)
    ]
    assert list(sends) == made and len(sends) == 5
    assert sends[-1] == made[-1] and sends[0] == made[0]
    assert list(sends[2:4]) == made[2:4] and list(sends[3:]) == made[3:]
    assert sends[2:4].ids() == ["stomp-7-42", "stomp-7-43"]
    assert sends[2:4].bodies == bodies[2:4]
    assert sends.ids() == [m.message_id for m in made]
    with pytest.raises(IndexError):
        sends[5]
