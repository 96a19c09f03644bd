"""The messages waiting in a queue, in the order they are consumed.

Messages wait in two deques (high priority first).  Removal from the middle (message
timeout, a message finished while it waited) is lazy: the message's state is no longer
QUEUED and it is skipped when reached, while the counts stay exact.  Messages put back
"at the start" wait in a short list until the next pass takes them, so that several put
back one after another keep their order.

:class:`MessageOrder` knows nothing of consumers, acknowledges or the store: it is the
queue's ordering part, owned by :class:`broker.engine.queue.queue.Queue`.

Paging.  A queue whose store keeps its messages outside the process (``Store.pages``)
holds at most :attr:`MessageOrder.window` waiting messages per priority in its deque;
behind them, messages wait as bare sequence numbers in a :class:`PagedTail` (8 octets
each; the store's own index holds the rest), and are read back from the store, a batch
of :data:`PAGE_IN_BATCH` at a time, when the deque runs dry (:attr:`MessageOrder.page_in`,
given by the queue).  Only a message the store holds as it stands is paged out: saved,
never sent, no producer waiting for it; a deadline (MessageTimeout) is kept beside its
number (:class:`PagedTail`, "Deadlines") and a paged message whose time comes expires
from the tail's front (:meth:`MessageOrder.paged_due`).  Any other message that
must queue behind paged ones waits in the tail's ``held`` map under its number, so that
the order stays as it was.  A paged message that cannot be read back is reported by the
loader and leaves the counts; the rest come in order.

Set aside.  A drain that looks past a message no consumer of the queue selects at all
(``Dispatcher.drain``) moves it to :attr:`MessageOrder.aside_priority` /
:attr:`~MessageOrder.aside_regular`: still waiting and counted, logically ahead of its
deque (they are the oldest), skipped by the next drains (:meth:`MessageOrder.next_fresh`)
so that each one goes on where the last one stopped instead of looking at the same
messages again.  Every other reader sees the queue as if nothing were set aside:
:meth:`~MessageOrder.next_first`, :meth:`~MessageOrder.next_last`,
:meth:`~MessageOrder.latest`, :meth:`~MessageOrder.take` first put them back at the
front of their deques (:meth:`~MessageOrder.restore_aside`, C-speed ``extendleft``), as
does the dispatcher when the consumers or what they select change.  A message put back
"at the start" while others are set aside waits behind them (before every message the
drains have not looked past yet).  In a queue that pages, at most :attr:`window`
messages per priority are set aside (the rest of the memory bound).

Waiting for room.  A message looked past that some consumer selects, but none with room
may take now (the one that selects it is full, out of credit, or its group is held
elsewhere), is set aside too, marked as *waiting* (:class:`Aside`): the next drains
offer the waiting ones to the consumers with room first (``Dispatcher.drain``), each
consumer from its own *cursor*: the point before which every waiting message is one it
does not select (taken, or for others).  A consumer's cursor only moves past what it
does not select, so a message it may take later is never skipped; since what a consumer
selects changes only with :meth:`HandlerHooks.selection`, the cursors stay right until
the consumers or the selection change (then everything set aside is restored).  So a
full consumer that takes the head one slot at a time costs each drain the messages it
takes, not a look at the same waiting ones again (the quadratic pass-over sel6 found).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator

from broker.engine.delivery import PutBack
from broker.engine.message import QUEUED, QueueMessage

#: Paged messages read back from the store at once when a deque runs dry.
PAGE_IN_BATCH = 256
_TRIM_AT = 4096  # numbers taken from a tail's front before its array is cut
_NEVER = float("inf")


def pageable(m: QueueMessage) -> bool:
    """Does the store hold ``m`` as it stands (may it wait as its number alone)?  A
    deadline is no bar: the store keeps it, and the tail keeps it beside the number
    (:class:`PagedTail`), as long as it is no earlier than the one paged before it."""
    life = m.life  # (its fields read directly: no property call each; None: not saved)
    return (
        life is not None
        and life.saved
        and m.state == QUEUED
        and not (life.delivered or life.put_backs or life.out is not None)
        and (life.acked or not life.producer_waits)
    )


class PagedTail:
    """Sequence numbers of messages waiting behind a deque, oldest first (paging: see
    the module docstring); ``held`` keeps those that could not be paged out.  ``seqs``
    is empty exactly when the tail is (the hot paths test it: no Python call).

    Deadlines.  Once a message with a deadline (MessageTimeout) is paged out the tail
    keeps ``deadlines`` beside ``seqs`` (8 octets more per number; engine clock, +inf
    for none): never decreasing from the front, so the messages due are always at the
    front (:meth:`MessageOrder.paged_due`) and expire without a timer object per
    message.  A message whose deadline is earlier than the last one kept is held
    instead (a per-message TTL shorter than the one before it); a held one's entry
    repeats the last value, so the column stays in order."""

    __slots__ = ("deadlines", "head", "held", "seqs")

    def __init__(self) -> None:
        self.seqs = array("Q")
        self.head = 0
        self.held: dict[int, QueueMessage] = {}
        #: Deadlines by the numbers' positions (None until a deadline is paged out).
        self.deadlines: array[float] | None = None

    def __len__(self) -> int:
        return len(self.seqs) - self.head

    def __iter__(self) -> Iterator[int]:
        seqs = self.seqs
        for i in range(self.head, len(seqs)):
            yield seqs[i]

    def last_deadline(self) -> float:
        """The deadline kept at the end (0.0: none kept; +inf: the last has none)."""
        dl = self.deadlines
        return dl[-1] if dl is not None and len(self.seqs) > self.head else 0.0

    def add(self, m: QueueMessage, deadline_ok: bool = True) -> bool:
        """``m`` waits at the end: as its number if it may (True), else held.  With
        ``deadline_ok`` False a message with a deadline is held (its timer is kept)."""
        life = m.life  # (its deadline read directly: no property call per message)
        deadline = 0.0 if life is None else life.deadline
        dl = self.deadlines
        if deadline or dl is not None:
            last = self.last_deadline()
            paged = pageable(m) and (not deadline or (deadline_ok and deadline >= last))
            if dl is None:
                dl = self.deadlines = array("d", [_NEVER]) * len(self.seqs)
            dl.append((deadline or _NEVER) if paged else last)
        else:
            paged = pageable(m)
        if not paged:
            self.held[m.seq] = m
        self.seqs.append(m.seq)
        return paged

    def hold(self, m: QueueMessage) -> None:
        """``m`` waits at the end, held (not paged out)."""
        self.slot(m.seq)
        self.held[m.seq] = m

    def slot(self, seq: int) -> None:
        """A number at the end for a message the caller holds (puts in ``held``)."""
        if self.deadlines is not None:
            self.deadlines.append(self.last_deadline())
        self.seqs.append(seq)

    def append(self, seq: int, deadline: float = 0.0) -> bool:
        """Page out number ``seq`` with ``deadline`` (0.0: none); False (nothing done)
        when that is earlier than the last deadline kept: the caller holds it."""
        dl = self.deadlines
        if deadline or dl is not None:
            last = self.last_deadline()
            if deadline and deadline < last:
                return False
            if dl is None:
                dl = self.deadlines = array("d", [_NEVER]) * len(self.seqs)
            dl.append(deadline or _NEVER)
        self.seqs.append(seq)
        return True

    def extend(self, seqs: array[int] | list[int], deadlines: list[float] | None = None) -> None:
        """Numbers paged out at the end (``deadlines``: theirs, in order, none earlier
        than the last one kept; None: they have none)."""
        dl = self.deadlines
        if deadlines is not None and dl is None:
            dl = self.deadlines = array("d", [_NEVER]) * len(self.seqs)
        self.seqs.extend(seqs)
        if dl is not None:
            dl.extend(deadlines if deadlines is not None else [_NEVER] * len(seqs))

    def due(self) -> float | None:
        """The deadline at the front (None: no deadline kept)."""
        dl = self.deadlines
        if dl is None or len(self.seqs) == self.head:
            return None
        return dl[self.head]

    def _cut(self, head: int) -> None:
        seqs = self.seqs
        dl = self.deadlines
        if head >= _TRIM_AT and head * 2 >= len(seqs):
            del seqs[:head]
            if dl is not None:
                del dl[:head]
            head = 0
        if head == len(seqs):
            del seqs[:]
            if dl is not None:
                del dl[:]
            head = 0
        self.head = head

    def take(self, limit: int) -> list[int]:
        """Up to ``limit`` numbers from the front."""
        head = self.head
        taken = self.seqs[head : head + limit].tolist()
        self._cut(head + len(taken))
        return taken

    def pop(self) -> int:
        """The number at the end (the tail is not empty)."""
        seq = self.seqs.pop()
        if self.deadlines is not None:
            self.deadlines.pop()
        if self.head == len(self.seqs):
            del self.seqs[:]
            if self.deadlines is not None:
                del self.deadlines[:]
            self.head = 0
        return seq

    def last(self) -> Iterator[int]:
        """The numbers from the end backwards."""
        seqs = self.seqs
        for i in range(len(seqs) - 1, self.head - 1, -1):
            yield seqs[i]

    def keep(self, wanted: Callable[[int], bool]) -> list[int]:
        """Drop every number ``wanted`` does not want; returns the dropped ones."""
        kept = array("Q")
        dropped: list[int] = []
        dl = self.deadlines
        kept_dl: array[float] | None = None if dl is None else array("d")
        for i in range(self.head, len(self.seqs)):
            seq = self.seqs[i]
            if wanted(seq):
                kept.append(seq)
                if kept_dl is not None and dl is not None:
                    kept_dl.append(dl[i])  # (a part of an ordered column is in order)
            else:
                dropped.append(seq)
        self.seqs = kept
        self.deadlines = kept_dl
        self.head = 0
        return dropped


class Aside:
    """The messages of one priority set aside by drains, oldest first (see the module
    docstring).  Slots of messages taken out are None until the front is trimmed;
    positions are absolute (``base`` is the position of ``items[0]``), so the consumers'
    cursors stay valid across a trim.  ``waits[i]`` is 1 for a message some consumer
    selects (waiting for room), 0 for one nobody selects."""

    __slots__ = ("base", "cursors", "head", "items", "live", "waiting", "waits")

    def __init__(self) -> None:
        self.items: list[QueueMessage | None] = []
        self.waits = bytearray()
        self.base = 0
        self.head = 0  # items[:head] are all None
        self.live = 0
        self.waiting = 0  # live ones marked waiting
        #: consumer id -> position before which nothing waits that it selects
        self.cursors: dict[str, int] = {}

    def __len__(self) -> int:
        return self.live

    def __iter__(self) -> Iterator[QueueMessage]:
        items = self.items
        for i in range(self.head, len(items)):
            m = items[i]
            if m is not None:
                yield m

    @property
    def start(self) -> int:
        """The position of the first slot that may hold a message."""
        return self.base + self.head

    @property
    def end(self) -> int:
        """The position after the last slot."""
        return self.base + len(self.items)

    def add(self, m: QueueMessage, waits: bool) -> None:
        self.items.append(m)
        self.waits.append(1 if waits else 0)
        self.live += 1
        if waits:
            self.waiting += 1

    def at(self, pos: int) -> tuple[QueueMessage | None, bool]:
        """The message at ``pos`` (None: taken) and whether it waits for room."""
        i = pos - self.base
        return self.items[i], bool(self.waits[i])

    def take(self, pos: int) -> QueueMessage | None:
        """Empty the slot at ``pos``; returns what it held."""
        i = pos - self.base
        m = self.items[i]
        if m is not None:
            self.items[i] = None
            self.live -= 1
            if self.waits[i]:
                self.waiting -= 1
        return m

    def put(self, pos: int, m: QueueMessage) -> None:
        """Undo :meth:`take` (the slot is still empty)."""
        i = pos - self.base
        self.items[i] = m
        self.live += 1
        if self.waits[i]:
            self.waiting += 1

    def trim(self) -> None:
        """Forget the empty slots at the front (cut the list once they are many)."""
        items = self.items
        head = self.head
        while head < len(items) and items[head] is None:
            head += 1
        if head == len(items):
            self.base += head
            items.clear()
            self.waits.clear()
            head = 0
        elif head >= _TRIM_AT and head * 2 >= len(items):
            del items[:head]
            del self.waits[:head]
            self.base += head
            head = 0
        self.head = head

    def clear(self) -> list[QueueMessage]:
        """Empty it; returns its messages, oldest first."""
        taken = list(self)
        self.items.clear()
        self.waits.clear()
        self.cursors.clear()
        self.base = self.head = self.live = self.waiting = 0
        return taken


#: The loader a paging queue gives its order: numbers, and whether the timers of those
#: read back start (not for a look that leaves them paged) -> the messages read back
#: (one that cannot be read is left out, reported by the loader).
PageIn = Callable[[list[int], bool], dict[int, QueueMessage]]


class MessageOrder:
    """The waiting messages of one queue (see the module docstring)."""

    __slots__ = (
        "aside_priority",
        "aside_regular",
        "front",
        "n_priority",
        "n_regular",
        "page_in",
        "paged_priority",
        "paged_regular",
        "priority",
        "regular",
        "window",
    )

    def __init__(self) -> None:
        self.priority: deque[QueueMessage] = deque()
        self.regular: deque[QueueMessage] = deque()
        #: Waiting behind the deques (paging, see the module docstring).
        self.paged_priority = PagedTail()
        self.paged_regular = PagedTail()
        #: Messages a deque holds before new ones are paged out (0: none are).
        self.window = 0
        self.page_in: PageIn | None = None
        #: Messages waiting, per priority (the deques may also hold finished ones).
        self.n_priority = 0
        self.n_regular = 0
        #: Put back at the start, not yet in a deque (oldest first).
        self.front: list[QueueMessage] = []
        #: Set aside by drains, ahead of their deques (see the module docstring); an
        #: empty tuple until a drain sets one aside (queues without selectors pay nothing).
        self.aside_priority: Aside | tuple[()] = ()
        self.aside_regular: Aside | tuple[()] = ()

    @property
    def count(self) -> int:
        return self.n_priority + self.n_regular

    def waiting(self) -> bool:
        """Messages wait (a new one would queue behind them)."""
        return bool(self.n_priority or self.n_regular or self.front)

    def enqueue(self, m: QueueMessage, deadline_ok: bool = True) -> bool:
        """Append a new message to the end of its deque (or its paged tail); True when
        it was paged out (its number alone kept; ``deadline_ok``: see
        :meth:`PagedTail.add`)."""
        paged = False
        if m.high_priority:
            if self.paged_priority.seqs or (self.window and len(self.priority) >= self.window):
                paged = self.paged_priority.add(m, deadline_ok)
            else:
                self.priority.append(m)
            self.n_priority += 1
        else:
            if self.paged_regular.seqs or (self.window and len(self.regular) >= self.window):
                paged = self.paged_regular.add(m, deadline_ok)
            else:
                self.regular.append(m)
            self.n_regular += 1
        return paged

    def paged_deadline(self) -> float | None:
        """The earliest deadline of a message paged out (None: none kept)."""
        when = None
        for tail in (self.paged_priority, self.paged_regular):
            due = tail.due()
            if due is not None and (when is None or due < when):
                when = due
        return None if when == _NEVER else when

    def paged_due(self, now: float) -> list[int]:
        """Take the paged-out messages whose deadline came by ``now`` out of the tails
        (uncounted; their numbers, oldest first per priority, high priority first).  A
        held one met at a tail's front goes on to the end of its deque (its own timer
        runs; it is next in order anyway)."""
        due: list[int] = []
        for tail, high in ((self.paged_priority, True), (self.paged_regular, False)):
            dl = tail.deadlines
            if dl is None:
                continue
            dq = self.priority if high else self.regular
            lost = 0
            while len(tail.seqs) > tail.head and dl[tail.head] <= now:
                (seq,) = tail.take(1)
                dl = tail.deadlines
                assert dl is not None
                m = tail.held.pop(seq, None)
                if m is None:
                    due.append(seq)
                    lost += 1
                else:
                    dq.append(m)
            self._uncount(high, lost)
        return due

    def _uncount(self, high: bool, n: int) -> None:
        """``n`` messages of one priority left the counts (taken from a paged tail)."""
        if high:
            self.n_priority -= n
        else:
            self.n_regular -= n

    @property
    def paging(self) -> bool:
        """Do messages wait paged (or may new ones be)?"""
        return bool(self.window or self.paged_priority.seqs or self.paged_regular.seqs)

    def _refill(self, high: bool) -> None:
        """Read the next batch of the tail back into the (empty) deque."""
        tail = self.paged_priority if high else self.paged_regular
        dq = self.priority if high else self.regular
        seqs = tail.take(PAGE_IN_BATCH)
        held = tail.held
        wanted = [seq for seq in seqs if seq not in held]
        loaded = self.page_in(wanted, True) if wanted and self.page_in is not None else {}
        lost = 0
        for seq in seqs:
            m = held.pop(seq, None) or loaded.get(seq)
            if m is None:
                lost += 1
            else:
                dq.append(m)
        self._uncount(high, lost)

    def paged(self) -> Iterator[tuple[int, QueueMessage | None]]:
        """Every number waiting in a tail, with its message when held (None: paged)."""
        for tail in (self.paged_priority, self.paged_regular):
            held = tail.held
            for seq in tail:
                yield seq, held.get(seq)

    def take_paged(
        self,
        *,
        priority: bool = True,
        regular: bool = True,
        wanted: Callable[[int], bool] | None = None,
    ) -> tuple[list[QueueMessage], list[int]]:
        """Take the chosen tails' waiting messages (those ``wanted`` says, or all): the
        held ones still QUEUED, and the numbers of the paged ones; counts follow."""
        held_out: list[QueueMessage] = []
        paged_out: list[int] = []
        for tail, high in ((self.paged_priority, True), (self.paged_regular, False)):
            if not tail or not (priority if high else regular):
                continue
            dropped = tail.keep((lambda seq: not wanted(seq)) if wanted else (lambda seq: False))
            lost = 0
            for seq in dropped:
                m = tail.held.pop(seq, None)
                if m is None:
                    paged_out.append(seq)
                    lost += 1
                elif m.state == QUEUED:
                    held_out.append(m)
                    lost += 1
            self._uncount(high, lost)
        return held_out, paged_out

    def uncount(self, m: QueueMessage) -> None:
        """``m`` left the queue from the middle (it stays in its deque, not QUEUED)."""
        if m.high_priority:
            self.n_priority -= 1
        else:
            self.n_regular -= 1

    def next_first(self) -> QueueMessage | None:
        """Take the oldest waiting message (high priority first)."""
        if self.aside_priority or self.aside_regular:
            self.restore_aside()
        return self.next_fresh()

    def next_fresh(self) -> QueueMessage | None:
        """:meth:`next_first` leaving the messages set aside where they are (a drain)."""
        dq = self.priority
        while True:
            while dq:
                m = dq.popleft()
                if m.state == QUEUED:
                    self.n_priority -= 1
                    return m
            if not self.paged_priority.seqs:
                break
            self._refill(True)
        dq = self.regular
        while True:
            while dq:
                m = dq.popleft()
                if m.state == QUEUED:
                    self.n_regular -= 1
                    return m
            if not self.paged_regular.seqs:
                return None
            self._refill(False)

    def take_fresh(self, high: bool, limit: int) -> list[QueueMessage]:
        """Up to ``limit`` waiting messages of one priority (``high``), oldest first:
        what :meth:`next_fresh` gives one call at a time while it gives that priority
        (read back from the paged tail as it would), none of the other taken.  For
        the regular ones, call it only when no high-priority message waits (as
        :meth:`next_fresh` has just shown by giving a regular one)."""
        dq = self.priority if high else self.regular
        tail = self.paged_priority if high else self.paged_regular
        taken: list[QueueMessage] = []
        add = taken.append
        pop = dq.popleft
        left = limit
        while left:
            if not dq:
                if not tail.seqs:
                    break
                self._refill(high)
                continue
            m = pop()
            if m.state == QUEUED:
                add(m)
                left -= 1
        if high:
            self.n_priority -= len(taken)
        else:
            self.n_regular -= len(taken)
        return taken

    def unpop_many(self, ms: list[QueueMessage]) -> None:
        """Undo :meth:`take_fresh` for ``ms`` (its last ones, still QUEUED), in order."""
        if not ms:
            return
        high = ms[0].high_priority
        (self.priority if high else self.regular).extendleft(reversed(ms))
        if high:
            self.n_priority += len(ms)
        else:
            self.n_regular += len(ms)

    def _load_one(self, tail: PagedTail, seq: int, timers: bool) -> QueueMessage | None:
        m = tail.held.get(seq)
        if m is None and self.page_in is not None:
            m = self.page_in([seq], timers).get(seq)
        return m

    def next_last(self) -> QueueMessage | None:
        """Take the newest waiting message (high priority first)."""
        self.restore_aside()
        for dq, high in ((self.priority, True), (self.regular, False)):
            tail = self.paged_priority if high else self.paged_regular
            while tail.seqs:
                seq = tail.pop()
                m = self._load_one(tail, seq, True)
                tail.held.pop(seq, None)
                if m is None or m.state == QUEUED:
                    if high:
                        self.n_priority -= 1
                    else:
                        self.n_regular -= 1
                    if m is not None:
                        return m
            while dq:
                m = dq.pop()
                if m.state == QUEUED:
                    if high:
                        self.n_priority -= 1
                    else:
                        self.n_regular -= 1
                    return m
        return None

    def latest(self) -> QueueMessage | None:
        """The newest waiting message, left where it is (high priority first)."""
        self.flush_front()
        self.restore_aside()
        for dq, tail in ((self.priority, self.paged_priority), (self.regular, self.paged_regular)):
            for seq in tail.last():
                m = self._load_one(tail, seq, False)  # (a look: it stays paged)
                if m is not None and m.state == QUEUED:
                    return m
            for m in reversed(dq):
                if m.state == QUEUED:
                    return m
        return None

    def unpop(self, m: QueueMessage, last: bool = False) -> None:
        """Undo :meth:`next_first` (or, with ``last``, :meth:`next_last`)."""
        m.state = QUEUED
        dq = self.priority if m.high_priority else self.regular
        tail = self.paged_priority if m.high_priority else self.paged_regular
        if last and tail.seqs:
            tail.hold(m)
        elif last:
            dq.append(m)
        else:
            dq.appendleft(m)
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1

    def may_set_aside(self, m: QueueMessage) -> bool:
        """Is there room to set ``m`` aside (a paging queue sets at most its window
        aside per priority)?"""
        if not self.window:
            return True
        return len(self.aside_priority if m.high_priority else self.aside_regular) < self.window

    def set_aside(self, m: QueueMessage, waits: bool = False) -> None:
        """``m``, just taken by :meth:`next_fresh`, waits set aside (still QUEUED);
        ``waits``: some consumer selects it (it waits for room)."""
        if m.high_priority:
            if not isinstance(self.aside_priority, Aside):
                self.aside_priority = Aside()
            self.aside_priority.add(m, waits)
            self.n_priority += 1
        else:
            if not isinstance(self.aside_regular, Aside):
                self.aside_regular = Aside()
            self.aside_regular.add(m, waits)
            self.n_regular += 1

    def take_aside(self, aside: Aside, pos: int) -> QueueMessage | None:
        """Take the message set aside at ``pos`` out of the queue (as :meth:`next_fresh`
        would); None if the slot is empty."""
        m = aside.take(pos)
        if m is not None:
            self.uncount(m)
        return m

    def return_aside(self, aside: Aside, pos: int, m: QueueMessage) -> None:
        """Undo :meth:`take_aside` after a send that put ``m`` back at the front of its
        deque (``Dispatcher.send`` found nobody to take it)."""
        dq = self.priority if m.high_priority else self.regular
        if not dq or dq[0] is not m:
            return  # (not put back at the front: it stays wherever it went)
        dq.popleft()
        self.uncount(m)
        aside.put(pos, m)
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1

    def restore_aside(self) -> None:
        """Put the messages set aside back at the front of their deques, in order."""
        for aside, dq in (
            (self.aside_priority, self.priority),
            (self.aside_regular, self.regular),
        ):
            if isinstance(aside, Aside) and aside.items:
                taken = aside.clear()
                taken.reverse()
                dq.extendleft(taken)

    def flush_front(self) -> None:
        """Move the messages put back at the start into their deques."""
        front = self.front
        if not front:
            return
        self.front = []
        for m in reversed(front):
            (self.priority if m.high_priority else self.regular).appendleft(m)

    def requeue(self, m: QueueMessage, where: PutBack) -> None:
        """A message returns: at the start (before every waiting one) or the end."""
        m.state = QUEUED
        m.out = None  # the next send may carry a Delivery-Count
        if m.high_priority:
            self.n_priority += 1
        else:
            self.n_regular += 1
        tail = self.paged_priority if m.high_priority else self.paged_regular
        if where is PutBack.START:
            self.front.append(m)
        elif tail.seqs:
            tail.hold(m)
        else:
            (self.priority if m.high_priority else self.regular).append(m)

    def take(self, *, priority: bool, regular: bool) -> list[QueueMessage]:
        """Empty the chosen deques; returns their waiting messages (still QUEUED).  The
        paged tails behind them are the caller's to take first (:meth:`take_paged`)."""
        self.flush_front()
        self.restore_aside()
        taken: list[QueueMessage] = []
        if priority:
            taken.extend(m for m in self.priority if m.state == QUEUED)
            self.priority.clear()
            self.n_priority = 0
        if regular:
            taken.extend(m for m in self.regular if m.state == QUEUED)
            self.regular.clear()
            self.n_regular = 0
        return taken
