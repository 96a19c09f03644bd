"""Duplicate suppression: the message ids a queue saw lately (option ``UseMessageId``).

A producer that retries a push after a lost acknowledge sends the same message id again;
a queue with ``UseMessageId`` remembers the ids producers gave within a window -- the
latest ``DuplicateWindow`` ids (default 10,000), each for ``DuplicateWindowTime``
milliseconds (default 300,000: five minutes; 0: no time bound) -- and takes a push whose
id it remembers as already done: nothing is queued, a producer waiting for an
acknowledge gets a positive one.  Ids the broker made up for pushes without one are
unique and not remembered.  After a restart a persistent queue remembers the ids of the
messages it recovered (waiting, and retained ones); ids of messages consumed before the
restart are forgotten.

Sans-IO: the window is told ``now``; memory is bounded by the count.
"""

from __future__ import annotations

from collections import OrderedDict

#: Producer message ids a queue remembers, and for how long (milliseconds).
DEFAULT_DUPLICATE_WINDOW = 10_000
DEFAULT_DUPLICATE_WINDOW_TIME = 300_000


class RecentIds:
    """The ids seen lately, oldest first (see the module docstring)."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        #: message id -> when it was first seen (monotonic seconds), in that order
        self.ids: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self.ids)

    def seen(self, message_id: str, now: float, lifetime_ms: int) -> bool:
        """Was ``message_id`` seen within the window (forgetting ids past their time)?"""
        ids = self.ids
        if lifetime_ms and ids:
            cutoff = now - lifetime_ms / 1000.0
            while ids and next(iter(ids.values())) <= cutoff:
                ids.popitem(last=False)
        return message_id in ids

    def add(self, message_id: str, now: float, count: int) -> None:
        """Remember the id of a message the queue took (the oldest go past ``count``)."""
        ids = self.ids
        ids[message_id] = now
        while len(ids) > count:
            ids.popitem(last=False)

    def clear(self) -> None:
        self.ids.clear()
