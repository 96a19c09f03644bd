"""Calls handed from the engine's thread to the STOMP listener's asyncio loop.

``loop.call_soon_threadsafe`` per call writes to the loop's self-pipe and wakes it every
time (a system call on each side, ~4% of the door's busy time in a run of SENDs with
receipts).  A :class:`Handoff` queues the calls and wakes the loop once while it has not
taken the earlier ones: calls made while the loop is busy ride on the wake-up already
sent.  Order is kept (one queue, run first in, first out, on the loop's thread).  An
``after`` call runs once after each batch (the listener writes what the calls produced
then: one write per connection for the batch, not one per call).

The queue has no limit of its own: the engine thread posts one call per turn
(``EngineDoor.run_ops``; with a durable store, one more per write made durable), what
those calls carry is bounded where it is made (deliveries by the consumers' windows,
answers by each session's window of unanswered SENDs), and the engine runs a turn only
for work the listener handed it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Handoff:
    """``post(fn)`` from any thread; the loop runs the queued calls in order.

    ``call_soon_threadsafe`` is the loop's (it may raise RuntimeError once the loop is
    closed: :meth:`post` passes it on, as a direct call would, and forgets the calls
    still queued -- nobody would run them)."""

    __slots__ = ("_after", "_call_soon_threadsafe", "_calls", "_lock")

    def __init__(
        self,
        call_soon_threadsafe: Callable[[Callable[[], None]], object],
        after: Callable[[], None] = lambda: None,
    ) -> None:
        self._call_soon_threadsafe = call_soon_threadsafe
        self._after = after
        self._calls: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def post(self, fn: Callable[[], None]) -> None:
        with self._lock:
            calls = self._calls
            calls.append(fn)
            if len(calls) > 1:
                return  # a wake-up is on its way: it runs this one too
        try:
            self._call_soon_threadsafe(self._run)
        except BaseException:
            with self._lock:
                self._calls = []
            raise

    def _run(self) -> None:
        """On the loop: every call queued so far (those posted meanwhile: next wake-up),
        then ``after``."""
        with self._lock:
            calls, self._calls = self._calls, []
        for fn in (*calls, self._after):
            try:
                fn()
            except Exception:  # as the loop would: logged, the next ones still run
                log.exception("STOMP listener call failed")
