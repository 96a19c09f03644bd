"""Per-queue rates (messages published and delivered per second) from the queues' counters.

Nothing is counted on the broker's hot path for this: each time the status is read
(the console polls it), :meth:`QueueRates.update` compares every queue's counters
(``received``: pushed into it, ``sent``: sent out of it) with the previous sample and
adds ``in_rate`` and ``out_rate`` (per second) and a short ``history`` of both to the
queue's entry, which the console draws as a chart.  Prometheus is given the counters
themselves (``rate()`` there does the same arithmetic).

Bounds: a sample is taken at most every ``min_interval`` seconds (default 0.5; readers
in between, several consoles say, get the last rates); ``history`` points (default 60)
per queue, given for the first ``charts`` queues listed (default 100, the deepest);
queues no longer listed are forgotten at the next update (the status lists
``zerohub.status.MAX_LISTED`` queues at most).  A counter that went down (a queue
deleted and created again) restarts that queue's rates at 0.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_CHARTS", "DEFAULT_HISTORY", "DEFAULT_MIN_INTERVAL", "QueueRates"]

#: Points of history kept per queue.
DEFAULT_HISTORY = 60
#: Seconds between two samples at least.
DEFAULT_MIN_INTERVAL = 0.5
#: Queues whose history is given (the first ones listed: the deepest); the others get
#: their rates and an empty history (a status of 1000 queues stays small).
DEFAULT_CHARTS = 100


@dataclass(slots=True)
class _Track:
    at: float
    received: int
    sent: int
    in_rate: float = 0.0
    out_rate: float = 0.0
    #: points as the status gives them (``[in, out]``: shared, never changed)
    history: deque[list[float]] = field(default_factory=deque)


class QueueRates:
    """The rates of the queues listed in successive statuses (thread-safe)."""

    def __init__(
        self,
        *,
        history: int = DEFAULT_HISTORY,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        charts: int = DEFAULT_CHARTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if history < 1 or min_interval <= 0 or charts < 0:
            raise ValueError("history and min_interval must be positive, charts not negative")
        self.history = history
        self.charts = charts
        self.min_interval = min_interval
        self.clock = clock
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._lock = threading.Lock()

    def update(self, queues: Iterable[dict[str, Any]]) -> None:
        """Add ``in_rate``, ``out_rate`` and ``history`` (``[[in, out], ...]``, oldest
        first) to each queue entry (keys ``channel``, ``queue``, ``received``, ``sent``)."""
        with self._lock:
            now = self.clock()
            seen: dict[tuple[str, str], _Track] = {}
            for q in queues:
                key = (str(q["channel"]), str(q["queue"]))
                received, sent = int(q.get("received", 0)), int(q.get("sent", 0))
                track = self._tracks.get(key)
                if track is None or received < track.received or sent < track.sent:
                    track = _Track(now, received, sent, history=deque(maxlen=self.history))
                elif now - track.at >= self.min_interval:
                    span = now - track.at
                    track.in_rate = round((received - track.received) / span, 2)
                    track.out_rate = round((sent - track.sent) / span, 2)
                    track.at, track.received, track.sent = now, received, sent
                    track.history.append([track.in_rate, track.out_rate])
                seen[key] = track
                q["in_rate"] = track.in_rate
                q["out_rate"] = track.out_rate
                charted = len(seen) <= self.charts
                q["history"] = list(track.history) if charted else []
            self._tracks = seen
