"""What callers' threads hand to the thread that drives a client session.

The session core (``broker.client.session``) keeps the requests waiting for an answer and
the batches waiting for an acknowledge in two dicts that only the *driving* thread reads
or writes: the blocking client's I/O thread (or, poll-on-call and asyncio, the one thread
there is), the one that feeds frames, runs the timers and sweeps requests for their
time-outs.  A caller's thread that starts a request, forgets one or sends a batch does not
touch those dicts: it appends a registration here, and the driving thread moves every
registration into them, in the order they came, before it looks at them
(:meth:`Handover.take`).

The hand-over is a ``collections.deque``: appends from any thread and pops from another
are atomic (documented: no lock needed).  A registration is always appended before its
frame is queued for sending, so it is taken before any answer to that frame can be read.
(Before: callers wrote the dicts while the I/O thread swept them, and a sweep that copied
them item by item could see them change size: the garbage collector runs Python code in
the middle, and a thread switch with it -- ``tests/broker/test_client_handover.py``.)
"""

from __future__ import annotations

from collections import deque
from enum import IntEnum
from typing import Any, Generic, TypeVar

__all__ = ["Handover", "Kind"]

W = TypeVar("W")


class Kind(IntEnum):
    """What a registration asks of the driving thread."""

    WAIT = 0  # a request waits for its answer: (message id, its waiting record)
    FORGET = 1  # a request is no longer waited for: (message id, None)
    BATCH = 2  # a batch waits for its acknowledge: (batch id, its acknowledged pushes)


# (module constants: reading a member through the Enum class is a Python call in 3.11)
_WAIT, _FORGET, _BATCH = Kind.WAIT, Kind.FORGET, Kind.BATCH


class Handover(Generic[W]):
    """Registrations from any thread, taken in order by the driving thread.

    ``W`` is the session's record of a waiting request.  A registration stays here only
    until the driving thread's next step (every feed, timer or wake-up computation takes
    them all); what it registers is bounded where it is made (the client's outbox)."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        #: The registrations not yet taken, oldest first (tested for emptiness on the hot
        #: path without a call).
        self.queue: deque[tuple[Kind, str, Any]] = deque()

    def wait(self, message_id: str, record: W) -> None:
        """(Any thread) a request now waits for its answer."""
        self.queue.append((_WAIT, message_id, record))

    def forget(self, message_id: str) -> None:
        """(Any thread) the request ``message_id`` is no longer waited for."""
        self.queue.append((_FORGET, message_id, None))

    def batch(self, batch_id: str, pushes: list[tuple[int, str]]) -> None:
        """(Any thread) a batch waits for its acknowledge: (index, message id) of each push
        in it that waits for an acknowledge."""
        self.queue.append((_BATCH, batch_id, pushes))

    def take(self, waiting: dict[str, W], batches: dict[str, list[tuple[int, str]]]) -> None:
        """(The driving thread) move every registration, in order, into ``waiting`` (by
        message id) and ``batches`` (by batch id)."""
        queue = self.queue
        pop = queue.popleft
        while queue:
            kind, key, value = pop()
            if kind is _WAIT:
                waiting[key] = value
            elif kind is _FORGET:
                waiting.pop(key, None)
            else:
                batches[key] = value
