"""Completions: ordered tickets, waiting, the callback, and the descriptor for a loop."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator

import pytest

from broker.store.log.completion import Completions


@pytest.fixture
def completions() -> Iterator[Completions]:
    made = Completions()
    yield made
    made.close()


def _readable(fd: int, timeout: float = 0.0) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_wait_times_out_then_completes(completions: Completions) -> None:
    assert not completions.wait(1, timeout=0.01)
    completions.complete(3)
    assert completions.wait(1, timeout=0) and completions.wait(3, timeout=0)
    assert not completions.wait(4, timeout=0.01)
    completions.complete(2)  # going back is ignored
    assert completions.done == 3


def test_descriptor_signals_once_until_drained(completions: Completions) -> None:
    fd = completions.fileno()
    assert not _readable(fd)
    completions.complete(1)
    completions.complete(2)
    assert _readable(fd)
    assert completions.drain() == 2
    assert not _readable(fd)
    completions.complete(5)
    assert _readable(fd) and completions.drain() == 5


def test_failure_wakes_a_waiting_thread(completions: Completions) -> None:
    result: list[bool] = []
    waiter = threading.Thread(target=lambda: result.append(completions.wait(7, timeout=30)))
    waiter.start()
    completions.fail(OSError("disk gone"))
    waiter.join(10)
    assert result == [False]
    assert isinstance(completions.failed, OSError)
    assert _readable(completions.fileno())


def test_callback_sees_every_new_high_mark() -> None:
    seen: list[int] = []
    completions = Completions(seen.append)
    try:
        for ticket in (1, 1, 4, 3, 9):
            completions.complete(ticket)
        assert seen == [1, 4, 9]
    finally:
        completions.close()


def test_a_completion_racing_drain_still_signals_the_next_one(
    completions: Completions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer thread completes a ticket while ``drain`` empties the descriptor (here:
    exactly as drain starts reading).  A stuck flag would leave the descriptor silent for
    every later completion: an event loop would hold its replies forever (seen in the
    server with a persistent queue: 64 acknowledges held, all of their tickets complete)."""
    import os
    import types

    import broker.store.log.completion as module

    fd = completions.fileno()
    completions.complete(4)
    raced = []

    def read_racing(rfd: int, size: int) -> bytes:
        if not raced:
            raced.append(True)
            completions.complete(5)  # the writer thread, at the worst moment
        return os.read(rfd, size)

    # only the completion module sees the racing read
    monkeypatch.setattr(module, "os", types.SimpleNamespace(read=read_racing, write=os.write))
    assert completions.drain() == 5
    monkeypatch.setattr(module, "os", os)
    completions.complete(6)
    assert _readable(fd), "a completion after drain must make the descriptor readable"
    assert completions.drain() == 6
