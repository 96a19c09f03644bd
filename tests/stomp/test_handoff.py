"""``broker.stomp.handoff``: calls from another thread reach a real asyncio loop in
order, those posted while the loop is busy ride on one wake-up and are followed by one
``after`` call, a failing call does not stop the next ones, and a closed loop is
reported to the poster."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from broker.stomp.handoff import Handoff
from tests.polling import WAIT, wait_until


class LoopThread:
    """An asyncio loop running in its own thread; counts the wake-ups it was sent."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.wakeups = 0
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call_soon_threadsafe(self, fn: Callable[[], None]) -> object:
        self.wakeups += 1
        return self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    if not lt.loop.is_closed():
        lt.stop()


def test_calls_posted_while_the_loop_is_busy_run_in_order_on_one_wakeup(
    loop_thread: LoopThread,
) -> None:
    ran: list[tuple[int, str]] = []
    handoff = Handoff(loop_thread.call_soon_threadsafe, lambda: ran.append((-1, "after")))
    busy, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:  # keeps the loop busy until the test has posted the rest
        busy.set()
        release.wait(WAIT)

    loop_thread.loop.call_soon_threadsafe(hold)
    assert busy.wait(WAIT)
    for i in range(100):
        handoff.post(lambda i=i: ran.append((i, threading.current_thread().name)))
    handoff.post(done.set)
    release.set()
    assert done.wait(WAIT)
    assert wait_until(lambda: len(ran) == 101)
    assert [i for i, _ in ran] == [*range(100), -1]  # in order, then ``after`` once
    assert {name for _, name in ran[:-1]} == {loop_thread.thread.name}  # on the loop
    assert loop_thread.wakeups == 1

    again = threading.Event()  # the loop took them all: the next post wakes it again
    handoff.post(again.set)
    assert again.wait(WAIT)
    assert wait_until(lambda: len(ran) == 102) and ran[-1] == (-1, "after")
    assert loop_thread.wakeups == 2


def test_a_failing_call_is_logged_and_the_next_ones_still_run(
    loop_thread: LoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    handoff = Handoff(loop_thread.call_soon_threadsafe)
    done = threading.Event()
    ran: list[int] = []

    def fail() -> None:
        raise ValueError("boom")

    busy, release = threading.Event(), threading.Event()
    loop_thread.loop.call_soon_threadsafe(lambda: (busy.set(), release.wait(WAIT)))
    assert busy.wait(WAIT)
    handoff.post(lambda: ran.append(1))
    handoff.post(fail)
    handoff.post(lambda: ran.append(2))
    handoff.post(done.set)
    release.set()
    assert done.wait(WAIT)
    assert ran == [1, 2]
    assert "STOMP listener call failed" in caplog.text and "boom" in caplog.text


def test_posting_to_a_closed_loop_raises_and_keeps_nothing(loop_thread: LoopThread) -> None:
    handoff = Handoff(loop_thread.call_soon_threadsafe)
    loop_thread.stop()
    with pytest.raises(RuntimeError):
        handoff.post(lambda: None)
    with pytest.raises(RuntimeError):  # nothing queued behind a wake-up that never came
        handoff.post(lambda: None)
