"""Duplicate suppression: the message ids a queue saw lately (option ``UseMessageId``).

A producer that retries a push after a lost acknowledge sends the same message id again;
a queue with ``UseMessageId`` remembers the ids producers gave within a window -- the
latest ``DuplicateWindow`` ids (default 10,000), each for ``DuplicateWindowTime``
milliseconds (default 300,000: five minutes; 0: no time bound) -- and takes a push whose
id it remembers as already done: nothing is queued, a producer waiting for an
acknowledge gets a positive one.  A push whose save its store refused is not
remembered (its retry is no duplicate done: ``Queue.accept``, ``Ledger``).  Ids the
broker made up for pushes without one are unique and not remembered.  After a restart
a persistent queue remembers the ids of the messages it recovered (waiting, and
retained ones); ids of messages consumed before the restart are forgotten.

Sans-IO: the window is told ``now``; memory is bounded by the count.
"""

from __future__ import annotations

from collections import OrderedDict

#: Producer message ids a queue remembers, and for how long (milliseconds).
DEFAULT_DUPLICATE_WINDOW = 10_000
DEFAULT_DUPLICATE_WINDOW_TIME = 300_000


class RecentIds:
    """The ids seen lately, oldest first (see the module docstring).

    While the stored times rise in storing order (the usual case: a monotonic clock, each
    id stored once), the first entry is the oldest and ``oldest`` is a lower bound of its
    time: a push compares ``oldest`` with the window time instead of reading the first
    entry (7% of the broker's CPU per push measured with py-spy, 3% with the bound).  An
    id stored again (its time updated in place) or a clock going back ends that order:
    ``oldest`` is then minus infinity and every check reads the first entry, as without
    it, until the window is empty again.
    """

    __slots__ = ("ids", "newest", "oldest")

    def __init__(self) -> None:
        #: message id -> when it was first seen (monotonic seconds), in that order
        self.ids: OrderedDict[str, float] = OrderedDict()
        self.oldest = _NEVER  # at most the first entry's time (see the class docstring)
        self.newest = -_NEVER  # the time stored last

    def __len__(self) -> int:
        return len(self.ids)

    def seen(self, message_id: str, now: float, lifetime_ms: int) -> bool:
        """Was ``message_id`` seen within the window (forgetting ids past their time)?"""
        if lifetime_ms and self.oldest <= now - lifetime_ms / 1000.0:
            self._forget_until(now - lifetime_ms / 1000.0)
        return message_id in self.ids

    def forget_expired(self, now: float, lifetime_ms: int) -> None:
        """Forget the ids past their time at ``now``: what :meth:`seen` does first, once
        for a run of ids checked at the same ``now`` (then ``id in ids`` is :meth:`seen`)."""
        if lifetime_ms and self.oldest <= now - lifetime_ms / 1000.0:
            self._forget_until(now - lifetime_ms / 1000.0)

    def _forget_until(self, cutoff: float) -> None:
        ids = self.ids
        while ids:
            first = next(iter(ids.values()))
            if first > cutoff:
                if self.oldest != -_NEVER:  # (out of order: stays so)
                    self.oldest = first
                return
            ids.popitem(last=False)
        self.oldest = _NEVER
        self.newest = -_NEVER

    def add(self, message_id: str, now: float, count: int) -> None:
        """Remember the id of a message the queue took (the oldest go past ``count``)."""
        ids = self.ids
        size = len(ids)
        ids[message_id] = now
        if len(ids) == size or now < self.newest:
            self.oldest = -_NEVER  # times no longer rise in order: read the first entry
        elif now < self.oldest:
            self.oldest = now
        self.newest = now
        while len(ids) > count:
            ids.popitem(last=False)

    def forget(self, message_id: str) -> None:
        """Forget one id: the push that gave it was not kept as taken (its save refused),
        so a retry of it is no duplicate."""
        self.ids.pop(message_id, None)

    def keep_newest(self, count: int) -> None:
        """Forget all but the newest ``count`` ids: the window was made smaller.  Every
        place that makes it smaller trims here (``Queue.apply_options``; a restart fills a
        new window through :meth:`add`), so the paths that store one id evict at most one
        (:meth:`add_new` and the run paths that inline it: an ``if``, not a loop)."""
        ids = self.ids
        while len(ids) > count:
            ids.popitem(last=False)

    def add_new(self, message_id: str, now: float, count: int) -> None:
        """:meth:`add` of an id not stored (the caller checked), without the order
        bookkeeping: a run of such calls at one ``now`` ends with :meth:`added_at`."""
        ids = self.ids
        ids[message_id] = now
        if len(ids) > count:  # (one in, one out: a smaller window was trimmed at once)
            ids.popitem(last=False)

    def added_at(self, now: float) -> None:
        """The order bookkeeping of :meth:`add` for the ids :meth:`add_new` stored at
        ``now`` (the same for each of them: once is enough)."""
        if now < self.newest:
            self.oldest = -_NEVER
        elif now < self.oldest:
            self.oldest = now
        self.newest = now

    def clear(self) -> None:
        self.ids.clear()
        self.oldest = _NEVER
        self.newest = -_NEVER


_NEVER = float("inf")
